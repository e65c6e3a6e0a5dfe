"""``hf_cocodr_provenance.json``: written by every output, read by cards and MTEB meta, carried by export, convert and
push (through the stand-in Hub of ``hub_standin.py``), and loaded back from the Hub."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_cocodr.provenance import PROVENANCE_FILE, read_card, read_provenance, resolve_hub_id

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def cached_base(tiny_st_dir, tmp_path_factory) -> Path:
    """The tiny model as the Hugging Face cache holds a download of ``acme/tiny-base``."""
    snap = tmp_path_factory.mktemp("hf_home") / "hub" / "models--acme--tiny-base" / "snapshots" / REVISION
    shutil.copytree(tiny_st_dir, snap)
    for name in (PROVENANCE_FILE, "hf_cocodr_run.json"):  # a download holds no hf_cocodr records of a local run
        (snap / name).unlink(missing_ok=True)
    return snap


@pytest.fixture(scope="module")
def finetuned(cached_base, tiny_beir, tmp_path_factory) -> Path:
    from hf_cocodr.finetuning import IDROTrainingArguments
    from hf_cocodr.training_api import run_finetune

    out = tmp_path_factory.mktemp("prov") / "tiny-ft"
    args = IDROTrainingArguments(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        num_clusters=2,
        num_negatives=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=3,
        dataloader_drop_last=True,
    )
    run_finetune(str(cached_base), tiny_beir, args=args, evals=[f"{tiny_beir}:dev"])
    return out


def test_resolve_hub_id(cached_base, minilm_dir, tiny_bert_dir):
    assert resolve_hub_id(cached_base) == ("acme/tiny-base", REVISION)
    assert resolve_hub_id(minilm_dir) == ("sentence-transformers/all-MiniLM-L6-v2", None)
    assert resolve_hub_id(tiny_bert_dir) == (None, None)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "---\nlicense: mit\nbase_model: acme/b\n---\n# acme/x\nbody\n",
            ({"license": "mit", "base_model": "acme/b"}, "# acme/x\nbody\n"),
        ),
        ("---\r\nlicense: mit\r\n---\r\n# T\r\n", ({"license": "mit"}, "# T\r\n")),  # Windows line ends kept
        ("# no front matter\n", ({}, "# no front matter\n")),
        ("---\nlicense: [mit\n---\n# T\n", ({}, "")),  # malformed YAML: nothing, and no exception
        ("---\n- a list\n---\n# T\n", ({}, "")),  # front matter that is not a mapping
    ],
)
def test_read_card(tmp_path, text, expected):
    """The card is read by huggingface_hub's own parser (ModelCard), never raising on a bad card."""
    (tmp_path / "README.md").write_bytes(text.encode())
    assert read_card(tmp_path) == expected
    assert read_card(tmp_path / "no-such-folder") == ({}, "")


def test_finetune_records_its_provenance(finetuned, cached_base):
    from huggingface_hub import ModelCard

    prov = read_provenance(finetuned)
    assert (finetuned / PROVENANCE_FILE).is_file()
    assert prov["base_model"] == "acme/tiny-base" and prov["base_model_revision"] == REVISION
    assert prov["base_model_source"]["path"] == str(cached_base.resolve())
    assert "model.safetensors" in prov["base_model_source"]["fingerprint"]
    assert [s["type"] for s in prov["stages"]] == ["finetune"] and prov["datasets"] == ["toy:train"]
    run = json.loads((finetuned / "hf_cocodr_run.json").read_text())
    (stage_run,) = prov["stage_runs"]
    assert stage_run["run_id"] == run["run_id"] and stage_run["command"] == "finetune"
    assert stage_run["data_fingerprint"] == run["identity"]["data"] and stage_run["data_fingerprint"]
    assert stage_run["settings"]["max_steps"] == 2
    assert prov["settings"]["pooling"] == "cls" and prov["settings"]["similarity"] == "dot"
    assert {"hf_cocodr", "torch", "transformers", "sentence-transformers"} <= set(prov["versions"])
    card = ModelCard.load(finetuned / "README.md")
    assert card.data.base_model == "acme/tiny-base" and REVISION in card.text


def test_recipe_style_scores_enter_the_provenance(finetuned, tmp_path):
    from hf_cocodr import load_encoder
    from hf_cocodr.model_card import write_model_card

    d = tmp_path / "m"
    shutil.copytree(finetuned, d)
    scores = {
        "toy:dev": {"start": {"ndcg@10": 0.1, "recall@100": 0.5}, "adapted": {"ndcg@10": 0.2, "recall@100": 0.6}}
    }
    write_model_card(d, load_encoder(str(d)), {"start_vs_adapted": scores})
    prov = read_provenance(d)
    assert prov["start_vs_adapted"] == scores
    assert [s["type"] for s in prov["stages"]] == ["finetune"]  # the rest of the record stays
    assert "0.1000 → 0.2000" in (d / "README.md").read_text()


def test_export_and_convert_carry_the_provenance(finetuned, tiny_bert_dir, tmp_path):
    from hf_cocodr.export import convert_checkpoint, export_sentence_transformer

    src = read_provenance(finetuned)
    export_sentence_transformer(str(finetuned), tmp_path / "exported")
    out = read_provenance(tmp_path / "exported")
    for key in (
        "base_model",
        "base_model_revision",
        "base_model_source",
        "stages",
        "methods",
        "datasets",
        "stage_runs",
    ):
        assert out[key] == src[key], key
    convert_checkpoint(str(tiny_bert_dir), tmp_path / "conv", name="acme/conv")
    conv = read_provenance(tmp_path / "conv")
    assert conv["model_name"] == "acme/conv" and conv["settings"]["query_length"] == 64
    assert conv["base_model_source"]["path"] == str(Path(tiny_bert_dir).resolve())
    meta = json.loads((tmp_path / "conv" / "mteb_model_meta.json").read_text())
    assert meta["name"] == "acme/conv" and meta["training_datasets"] is None  # an unknown raw checkpoint
    assert not meta["citation"]  # not a COCO-DR model (no COCO stage, no COCO-DR base)


def test_export_from_a_staging_folder_keeps_the_given_record(tiny_st_dir, tmp_path):
    """A pretraining run exports from a hidden staging folder: the folder is not recorded as the base."""
    from huggingface_hub import ModelCard

    from hf_cocodr.export import export_sentence_transformer

    staging = tmp_path / ".coco-export-abc"
    shutil.copytree(tiny_st_dir, staging)
    stages = [{"type": "coco", "method": "coco", "title": "COCO", "corpora": ["toy"]}]
    export_sentence_transformer(
        str(staging),
        tmp_path / "coco-out",
        run_record=False,
        card_data={"stages": stages, "methods": ["coco"], "base_model": "acme/base"},
    )
    prov = read_provenance(tmp_path / "coco-out")
    assert prov["base_model"] == "acme/base" and "base_model_source" not in prov and prov["stages"] == stages
    card = ModelCard.load(tmp_path / "coco-out" / "README.md")
    assert card.text.lstrip().startswith("# coco-out\n") and "yu2022cocodr" in card.text


def test_legacy_training_info_is_read(tiny_st_dir, tmp_path):
    from hf_cocodr import load_encoder
    from hf_cocodr.model_card import write_model_card

    d = tmp_path / "old"
    shutil.copytree(tiny_st_dir, d)
    (d / PROVENANCE_FILE).unlink()
    (d / "hf_cocodr_training.json").write_text(
        json.dumps(
            {"stages": [{"type": "finetune", "method": "idro"}], "methods": ["idro"], "base_model": "acme/old-base"}
        )
    )
    assert read_provenance(d)["base_model"] == "acme/old-base"
    write_model_card(d, load_encoder(str(d)), {})
    assert read_provenance(d)["methods"] == ["idro"] and (d / PROVENANCE_FILE).is_file()


# --------------------------------------------------------------------------------------------------- through the Hub
@pytest.fixture(scope="module")
def hub():
    import hub_standin

    server, state, url = hub_standin.start()
    yield state, url
    server.shutdown()


def test_provenance_survives_export_push_and_load(hub, finetuned, tmp_path):
    from hub_standin import cli, hub_env

    from hf_cocodr.export import export_sentence_transformer

    state, url = hub
    export_sentence_transformer(str(finetuned), tmp_path / "exported")
    local = read_provenance(tmp_path / "exported")
    env = hub_env(url, tmp_path / "home")
    proc = cli(["push", str(tmp_path / "exported"), "acme/prov-tiny"], env)
    assert proc.returncode == 0, proc.stderr
    (commit,) = [c for c in state.commits if c["repo"] == "acme/prov-tiny"]
    assert {PROVENANCE_FILE, "README.md"} <= set(commit["files"])  # model-index + results, one commit
    assert "eval.json" not in commit["files"]  # keyed by local data paths: the card carries its results
    code = (
        "import json, sys; from pathlib import Path; from huggingface_hub import ModelCard, snapshot_download;"
        "from hf_cocodr.export import export_sentence_transformer; from hf_cocodr.provenance import read_provenance;"
        "snap = snapshot_download('acme/prov-tiny'); card = ModelCard.load('acme/prov-tiny');"
        "export_sentence_transformer(snap, sys.argv[1]);"
        "print(json.dumps({'downloaded': read_provenance(snap), 're_exported': read_provenance(sys.argv[1]),"
        " 'base_model': card.data.base_model, 'n_results': len(card.data.eval_results or [])}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "again")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    # the provenance goes up as it is, but for the folders it names on this machine: only their names
    assert res["downloaded"] == _folder_names_only(local) != local
    assert res["base_model"] == "acme/tiny-base" and res["n_results"] > 0
    for key in ("base_model", "base_model_revision", "base_model_source", "stages", "stage_runs", "datasets"):
        assert res["re_exported"][key] == res["downloaded"][key], key


def _folder_names_only(value):
    """``value`` with every absolute path replaced by its last component."""
    if isinstance(value, dict):
        return {k: _folder_names_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_folder_names_only(v) for v in value]
    return Path(value).name if isinstance(value, str) and value.startswith("/") else value
