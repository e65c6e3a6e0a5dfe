"""MTEB 2.x integration: a local BEIR task, the generated ModelMeta, the leaderboard results layout, the PR snippet.

Everything runs offline on the tiny fixtures; expected scores are never hard-coded: the MTEB main score is compared
with hf_cocodr's own exact-search evaluation of the same model on the same data.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys

import pytest

import hf_cocodr.cli.mteb  # noqa: F401  (registers the mteb / mteb-meta commands)
from hf_cocodr import evaluate_retrieval, load_encoder
from hf_cocodr.cli import main

MODEL_NAME = "test-org/tiny-cocodr"
REVISION = "0123456789abcdef"
TRAINING_INFO = {
    "stages": [
        {"type": "coco", "title": "COCO", "method": "coco", "corpora": ["scifact", "toy"]},
        {"type": "finetune", "method": "idro", "source_data": "squad-v1.1:train"},
    ],
    "methods": ["coco", "idro"],
    "datasets": ["scifact", "toy", "squad-v1.1:train"],
    "base_model": "OpenMatch/cocodr-base",
}


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A tiny sentence-transformers model with the training info an hf_cocodr training run writes.

    Built with a wide initialisation: the default tiny model maps every text to nearly one vector, so its top
    scores tie within float error and two pipelines that batch differently rank the ties differently."""
    import tiny

    out = tmp_path_factory.mktemp("mteb_model") / "model"
    bert = tiny.make_tiny_bert(tmp_path_factory.mktemp("mteb_bert"), seed=4, initializer_range=0.2)
    load_encoder(str(bert)).save(str(out))
    (out / "hf_cocodr_training.json").write_text(json.dumps(TRAINING_INFO))
    return out


@pytest.fixture(scope="module")
def mteb_run(trained_dir, tiny_beir, tmp_path_factory):
    """One ``hf-cocodr mteb`` run on the dev split (the expensive part, shared by the tests below)."""
    out = tmp_path_factory.mktemp("mteb_out")
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        code = main(
            [
                "-q",
                "mteb",
                str(trained_dir),
                str(tiny_beir),
                "--split",
                "dev",
                "--task-name",
                "toy-dev",
                "--model-name",
                MODEL_NAME,
                "--revision",
                REVISION,
                "--output-folder",
                str(out),
                "--batch-size",
                "16",
            ]
        )
    return code, out, stdout.getvalue()


def test_results_layout(mteb_run, tiny_beir):
    from hf_cocodr.evaluation.mteb import beir_revision

    code, out, _ = mteb_run
    assert code == 0
    rev_dir = out / "results" / "test-org__tiny-cocodr" / REVISION
    assert {"model_meta.json", "toy-dev.json"} <= {p.name for p in rev_dir.iterdir()}  # (+ mteb's run_settings.jsonl)
    task = json.loads((rev_dir / "toy-dev.json").read_text())
    assert task["task_name"] == "toy-dev"
    assert list(task["scores"]) == ["dev"]
    assert task["dataset_revision"] == beir_revision(tiny_beir, "dev")  # the content hash of the split


def test_cli_result_line(mteb_run):
    # The last printed line is one JSON object with the main score and the results folder.
    _, out, stdout = mteb_run
    line = json.loads(stdout.strip().splitlines()[-1])
    rev_dir = out / "results" / "test-org__tiny-cocodr" / REVISION
    assert line["results_folder"] == str(rev_dir.resolve())
    assert line["model_meta"] == str((rev_dir / "model_meta.json").resolve())
    assert line["tasks"]["toy-dev"]["file"] == str(rev_dir / "toy-dev.json")
    assert line["model_name"] == MODEL_NAME and line["revision"] == REVISION
    task = json.loads((rev_dir / "toy-dev.json").read_text())
    assert line["tasks"]["toy-dev"]["main_score"] == pytest.approx(task["scores"]["dev"][0]["main_score"])


def test_main_score_equals_evaluate_retrieval(mteb_run, trained_dir, tiny_beir):
    _, out, _ = mteb_run
    task = json.loads((out / "results" / "test-org__tiny-cocodr" / REVISION / "toy-dev.json").read_text())
    entry = task["scores"]["dev"][0]
    assert entry["hf_subset"] == "default"
    ours = evaluate_retrieval(load_encoder(trained_dir), tiny_beir, "dev", show_progress_bar=False, batch_size=16)
    assert entry["main_score"] == pytest.approx(entry["ndcg_at_10"])
    assert entry["main_score"] == pytest.approx(ours["ndcg@10"], abs=1e-4)
    assert entry["recall_at_100"] == pytest.approx(ours["recall@100"], abs=1e-4)
    assert entry["mrr_at_10"] == pytest.approx(ours["mrr@10"], abs=1e-4)


def test_model_meta_json(mteb_run, trained_dir):
    _, out, _ = mteb_run
    meta = json.loads((out / "results" / "test-org__tiny-cocodr" / REVISION / "model_meta.json").read_text())
    model = load_encoder(trained_dir)
    assert meta["name"] == MODEL_NAME
    assert meta["revision"] == REVISION
    assert meta["embed_dim"] == model.get_embedding_dimension()
    assert meta["n_parameters"] == sum(p.numel() for p in model.parameters())
    assert meta["max_tokens"] == model.max_seq_length
    assert meta["similarity_fn_name"] == "dot"
    assert meta["loader"] == "SentenceTransformerEncoderWrapper"
    # COCO corpora and the fine-tuning source, mapped to MTEB names where MTEB has them.
    assert set(meta["training_datasets"]) == {"SciFact", "toy", "squad-v1.1"}
    assert meta["adapted_from"] == "OpenMatch/cocodr-base"
    assert meta["languages"] == ["eng-Latn"]
    assert meta["license"] == "apache-2.0"


def test_beir_task_structure(tiny_beir):
    from mteb.abstasks import AbsTaskRetrieval

    from hf_cocodr.data import load_beir
    from hf_cocodr.evaluation.mteb import beir_task

    task = beir_task(tiny_beir, "dev", "toy-dev-structure")
    assert isinstance(task, AbsTaskRetrieval)
    assert task.metadata.main_score == "ndcg_at_10" and task.metadata.eval_splits == ["dev"]
    task.load_data()
    split = task.dataset["default"]["dev"]
    data = load_beir(tiny_beir, "dev")
    assert set(split["corpus"].column_names) == {"id", "title", "text"}
    assert set(split["queries"].column_names) == {"id", "text"}
    assert split["relevant_docs"] == data.qrels
    assert split["top_ranked"] is None
    assert sorted(split["queries"]["id"]) == sorted(data.qrels)
    # The dataset revision is a content hash: stable for the same data, different for another split.
    assert beir_task(tiny_beir, "dev", "toy-dev-structure").metadata.dataset == task.metadata.dataset
    assert beir_task(tiny_beir, "train", "toy-train").metadata.revision != task.metadata.revision


def test_mteb_meta_prints_valid_python(trained_dir, capsys):
    code, out, _ = _cli(
        capsys, ["-q", "mteb-meta", str(trained_dir), "--model-name", MODEL_NAME, "--revision", REVISION]
    )
    assert code == 0
    lines = out.rstrip("\n").splitlines()
    info = json.loads(lines[-1])
    assert info["results_path"] == f"results/test-org__tiny-cocodr/{REVISION}"
    source = "\n".join(lines[:-1])
    compiled = compile(source, "mteb_model_snippet.py", "exec")
    namespace: dict = {}
    exec(compiled, namespace)
    meta = namespace["tiny_cocodr"]
    model = load_encoder(trained_dir)
    assert meta.name == MODEL_NAME and meta.revision == REVISION
    assert meta.embed_dim == model.get_embedding_dimension()
    assert meta.n_parameters == sum(p.numel() for p in model.parameters())
    assert meta.training_datasets == {"SciFact", "toy", "squad-v1.1"}
    assert meta.loader.__name__ == "SentenceTransformerEncoderWrapper"
    assert "embeddings-benchmark/results" in source
    assert f"results/test-org__tiny-cocodr/{REVISION}" in source


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")  # mteb's own chatter
def test_mteb_meta_raw_checkpoint_loader_is_cls_dot(tiny_bert_dir, capsys):
    from hf_cocodr.modeling.loading import pooling_mode

    code, out, _ = _cli(
        capsys, ["-q", "mteb-meta", str(tiny_bert_dir), "--model-name", "test-org/tiny-raw", "--revision", REVISION]
    )
    assert code == 0
    namespace: dict = {}
    exec(compile("\n".join(out.splitlines()[:-1]), "raw_snippet.py", "exec"), namespace)
    meta = namespace["tiny_raw"]
    assert meta.loader_kwargs == {"pooling_mode": "cls", "similarity_fn_name": "dot"}
    assert meta.training_datasets is None  # no training info: unknown, not "none"
    # The generated loader builds CLS pooling + dot product (here from the local checkpoint instead of the Hub).
    encoder = meta.loader(str(tiny_bert_dir), **meta.loader_kwargs)
    assert pooling_mode(encoder.model) == "cls"
    assert str(getattr(encoder.model.similarity_fn_name, "value", encoder.model.similarity_fn_name)) == "dot"


@pytest.mark.parametrize("command", ["mteb", "mteb-meta"])
def test_model_name_without_org_is_refused(command, tiny_st_dir, tiny_beir, tmp_path, capsys):
    argv = [command, str(tiny_st_dir)] + ([str(tiny_beir)] if command == "mteb" else [])
    argv += ["--model-name", "tiny-cocodr", "--revision", REVISION]
    code, out, err = _cli(capsys, argv + (["--output-folder", str(tmp_path)] if command == "mteb" else []))
    assert code == 2
    assert "ORG/NAME" in err and "tiny-cocodr" in err
    assert not (tmp_path / "results").exists()


def test_missing_folders_are_clear_errors(tiny_st_dir, tmp_path, capsys):
    code, _, err = _cli(
        capsys,
        [
            "mteb",
            str(tiny_st_dir),
            str(tmp_path / "nope"),
            "--model-name",
            MODEL_NAME,
            "--output-folder",
            str(tmp_path / "out"),
        ],
    )
    assert code == 2 and "nope" in err and "not found" in err
    code, _, err = _cli(
        capsys, ["mteb-meta", str(tmp_path / "no_model"), "--model-name", MODEL_NAME, "--revision", REVISION]
    )
    assert code == 2 and "no_model" in err and "not found" in err
    code, _, err = _cli(capsys, ["mteb", str(tiny_st_dir), "--model-name", MODEL_NAME])
    assert code == 2 and "--tasks" in err


def test_task_name_and_builtin_task_errors(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    import mteb

    from hf_cocodr.evaluation.mteb import MTEBDataUnavailableError, beir_task, run_mteb

    with pytest.raises(ValueError, match="built-in MTEB task"):
        beir_task(tiny_beir, "dev", "scifact")  # would pass for the official SciFact results
    with pytest.raises(ValueError, match="unknown MTEB task"):
        run_mteb(tiny_st_dir, model_name=MODEL_NAME, output_folder=tmp_path, tasks=["NoSuchTask"])

    # Built-in tasks need the Hub: the offline failure names the task, the dataset and the way out. The dataset
    # loader is stubbed with the error datasets raises offline, so the test never depends on a local cache.
    def offline(self, *args, **kwargs):
        raise ConnectionError("Couldn't reach 'mteb/scifact' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(type(mteb.get_task("SciFact")), "load_data", offline)
    with pytest.raises(MTEBDataUnavailableError, match=r"SciFact.*mteb/scifact.*local BEIR"):
        run_mteb(tiny_st_dir, model_name=MODEL_NAME, revision=REVISION, output_folder=tmp_path, tasks=["SciFact"])


def test_importing_the_mteb_package_does_not_import_mteb():
    """mteb takes about 9 s to import: the package (and the CLI) load it only when an MTEB function runs."""
    code = (
        "import sys, hf_cocodr.cli.mteb, hf_cocodr.evaluation.mteb as m; m.check_model_name('a/b'); "
        "print('mteb' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture(scope="module")
def both_runs(trained_dir, tiny_beir, tmp_path_factory):
    """``hf-cocodr mteb`` and ``mteb.evaluate`` itself on the same model and task, each into its own folder."""
    import mteb
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.evaluation.mteb import beir_task, warnings_quiet

    ours, theirs = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("theirs")
    argv = ["-q", "mteb", str(trained_dir), str(tiny_beir), "--split", "dev", "--task-name", "toy-dev"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--model-name", MODEL_NAME, "--output-folder", str(ours)]) == 0
    with warnings_quiet():
        task = beir_task(tiny_beir, "dev", "toy-dev")
        mteb.evaluate(
            SentenceTransformer(str(trained_dir)), task, cache=mteb.ResultCache(theirs), show_progress_bar=False
        )
    return ours, theirs


def _revision_folder(root):
    (folder,) = [p for p in (root / "results").glob("*/*") if p.is_dir()]
    return folder


def _keys(path):
    if path.suffix == ".jsonl":
        return [sorted(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    data = json.loads(path.read_text())
    scores = data.get("scores") if isinstance(data, dict) else None
    entries = sorted({k for split in (scores or {}).values() for entry in split for k in entry})
    return sorted(data), entries


def test_hf_cocodr_mteb_writes_what_mteb_evaluate_writes(both_runs):
    """The same files, with the same keys (``run_settings.jsonl`` included); beside them only hf_cocodr's owner
    record of the output folder."""
    ours, theirs = both_runs
    mine, its = _revision_folder(ours), _revision_folder(theirs)
    assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in its.iterdir())
    assert {"model_meta.json", "toy-dev.json", "run_settings.jsonl"} == {p.name for p in mine.iterdir()}
    for path in mine.iterdir():
        assert _keys(path) == _keys(its / path.name), path.name
    assert {p.name for p in ours.iterdir()} - {p.name for p in theirs.iterdir()} == {"hf_cocodr_run.json"}


def test_the_results_folder_loads_and_passes_the_results_repository_checks(both_runs):
    """mteb's ``ResultCache`` loads the folder, and it passes what embeddings-benchmark/results checks offline of a
    submission: ``results/<org>__<name>/<revision>/`` named by its ``model_meta.json`` (a name with an org, a 40-digit
    revision), result files named by their task and loaded by mteb's ``TaskResult``, made with mteb >= 2, and every
    split and subset covered by ``run_settings.jsonl`` (read with mteb's own expansion of its entries)."""
    import mteb
    from mteb import TaskResult
    from mteb.results.task_result import _expand_run_settings_entry
    from packaging.version import Version

    ours, _ = both_runs
    folder = _revision_folder(ours)
    meta = json.loads((folder / "model_meta.json").read_text())
    assert "/" in meta["name"] and re.fullmatch(r"[0-9a-f]{40}", meta["revision"])
    assert folder == ours / "results" / meta["name"].replace(" ", "_").replace("/", "__") / meta["revision"]
    covered = set()
    for line in (folder / "run_settings.jsonl").read_text().splitlines():
        covered |= {key for key, _, _ in _expand_run_settings_entry(json.loads(line))}
    for path in folder.glob("*.json"):
        if path.name == "model_meta.json":
            continue
        result = TaskResult.from_disk(path)
        assert path.stem == result.task_name and Version(result.mteb_version) >= Version("2.0.0")
        blocks = {(result.task_name, split, b["hf_subset"]) for split, bs in result.scores.items() for b in bs}
        assert blocks and blocks <= covered
    loaded = mteb.ResultCache(ours).load_results(models=[meta["name"]], require_model_meta=True)
    assert [(r.model_name, r.model_revision) for r in loaded.model_results] == [(meta["name"], meta["revision"])]
    assert [t.task_name for t in loaded.model_results[0].task_results] == ["toy-dev"]


def test_a_query_side_model_is_a_router_whose_query_route_is_active(trained_dir, tmp_path):
    from hf_cocodr.evaluation.mteb import model_meta_for
    from hf_cocodr.modeling.asymmetric import query_modules, query_side_model

    plain = load_encoder(str(trained_dir))
    router = query_side_model(plain)
    router.save(str(tmp_path / "router"))
    meta = model_meta_for(tmp_path / "router", "me/router", "a" * 40)
    one = sum(p.numel() for p in plain.parameters())
    embedding = plain[0].auto_model.get_input_embeddings().weight.numel()
    assert meta.model_type == ["router"] and meta.n_parameters == 2 * one  # both routes
    assert meta.n_embedding_parameters == 2 * embedding
    query = sum(p.numel() for m in query_modules(router) for p in m.parameters())
    assert meta.n_active_parameters == query - embedding == one - embedding  # the query route's
    assert model_meta_for(trained_dir, "me/plain", "b" * 40).model_type == ["dense"]
    assert json.loads(json.dumps(meta.to_dict(), default=str))["model_type"] == ["router"]  # as model_meta.json


def test_training_datasets_list_every_corpus_query_source_and_source_task(trained_dir, tmp_path):
    """The corpora the distillation ranked (its pseudo-queries drawn from them), the target queries it trained on,
    COCO's corpora and the fine-tuning's source task are all training data: MTEB marks no result on them zero-shot."""
    import shutil

    from hf_cocodr.evaluation.mteb import model_meta_for

    folder = tmp_path / "m"
    shutil.copytree(trained_dir, folder)
    info = {
        "stages": [
            {"type": "coco", "method": "coco", "corpora": ["/data/nfcorpus"]},
            {"type": "finetune", "method": "idro", "source_data": "squad-v1.1:train"},
            {
                "type": "distill",
                "method": "distillation",
                "corpora": ["/data/scifact"],
                "target queries": ["fiqa:train"],
            },
        ],
    }
    (folder / "hf_cocodr_training.json").write_text(json.dumps(info))
    meta = model_meta_for(folder, "me/adapted", "c" * 40)
    assert {"NFCorpus", "SciFact", "FiQA2018"} <= set(meta.training_datasets)
    assert any("squad" in d.lower() for d in meta.training_datasets)
