"""``push`` uploads only the model's own files: never the user's files beside the model, never what a symbolic link
points to, never the records that hold this machine's paths (issue 30, push uploads too much)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import hub_standin
import pytest
from sentence_transformers import SentenceTransformer

from hf_cocodr.model_card import write_model_card

TOKEN = "hf_standinSECRETtoken0123456789abcdefXYZ"
# what `hf-cocodr export` of the tiny BERT writes (a sentence-transformers save, the card and the provenance)
MODEL_FILES = {
    "1_Pooling/config.json",
    "README.md",
    "config.json",
    "config_sentence_transformers.json",
    "hf_cocodr_provenance.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
MTEB_FILE = "mteb_results/results/acme__tiny/1/SciFact.json"


@pytest.fixture(scope="module")
def hub():
    server, state, url = hub_standin.start()
    yield state, url
    server.shutdown()


def push(model_dir, repo_id, url, home):
    env = dict(
        os.environ,
        HF_ENDPOINT=url,
        HF_HUB_OFFLINE="0",
        HF_HOME=str(home),
        HF_TOKEN=TOKEN,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_ETAG_TIMEOUT="5",
    )
    env.pop("HF_DATASETS_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-m", "hf_cocodr", "push", str(model_dir), repo_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_push_uploads_the_model_files_and_nothing_else(hub, tiny_st_dir, tiny_bert_dir, tmp_path):
    state, url = hub
    model = tmp_path / "model"
    shutil.copytree(tiny_st_dir, model)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the user's private text")
    # the user's own files beside the model, and links out of the folder (one named like a model file)
    (model / "notes.txt").write_text("my notes")
    (model / "data.csv").write_text("id,text\n1,private\n")
    (model / "tokenizer.model").symlink_to(outside / "secret.txt")
    (model / "vocab.txt").symlink_to(outside / "secret.txt")
    (model / "linked_folder").symlink_to(outside)
    (model / "1_Pooling" / "extra.json").symlink_to(outside / "secret.txt")
    # records and training state hf_cocodr keeps beside a model
    (model / "eval.json").write_text(json.dumps({f"{tmp_path}/data/toy:dev": {"ndcg@10": 0.5, "recall@100": 0.75}}))
    write_model_card(model, SentenceTransformer(str(model)), {})  # the card shows the evaluation
    (model / "recipe.json").write_text(json.dumps({"out": str(tmp_path)}))
    (model / "trainer_state.json").write_text("{}")
    for folder, name in (("checkpoint-10", "optimizer.pt"), ("runs", "events.out"), ("hybrid", "doc_ids.json")):
        (model / folder).mkdir()
        (model / folder / name).write_text(str(tmp_path))
    (model / MTEB_FILE).parent.mkdir(parents=True)
    (model / MTEB_FILE).write_text(json.dumps({"task_name": "SciFact", "scores": {}}))
    (model / MTEB_FILE).with_name("notes.md").write_text("mine")
    assert str(tiny_bert_dir) in (model / "hf_cocodr_provenance.json").read_text()  # it holds a local path

    proc = push(model, "acme/allow-list", url, tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    uploaded = state.repos["acme/allow-list"]["branches"]["main"]
    # (the card's evaluations in huggingface_hub 2.x's format go up beside it: no path in them, a local data set
    # named by its name)
    assert set(uploaded) == MODEL_FILES | {MTEB_FILE, ".eval_results/toy.yaml"}
    for rel, data in uploaded.items():  # neither a link's target nor this machine's paths went up
        assert b"the user's private text" not in data and str(tmp_path).encode() not in data, rel
        if rel != "hf_cocodr_provenance.json":
            assert data == (model / rel).read_bytes(), rel
    assert "| toy:dev | hf-cocodr evaluate | 0.5000 | 0.7500 |" in uploaded["README.md"].decode()
    provenance = json.loads(uploaded["hf_cocodr_provenance.json"])
    assert provenance["base_model_source"]["path"] == tiny_bert_dir.name  # the folder's name, not where it lay
    local = json.loads((model / "hf_cocodr_provenance.json").read_text())
    local["base_model_source"]["path"] = tiny_bert_dir.name
    assert provenance == local  # otherwise the record as it is
    # every entry left out is named, with the reason
    for name in ("notes.txt", "data.csv", "tokenizer.model", "vocab.txt", "linked_folder", "1_Pooling/extra.json"):
        assert f"not uploading {model / name}" in proc.stderr, name
    assert proc.stderr.count("symbolic link") == 4
    for name in ("eval.json", "recipe.json", "checkpoint-10/", "hybrid/", "runs/", "hf_cocodr_run.json"):
        assert name in proc.stderr, name


def test_the_users_files_the_owner_record_lists_stay_local(hub, tiny_st_dir, tmp_path):
    """A file named like a model file that was in the folder before hf_cocodr wrote it is the user's."""
    state, url = hub
    model = tmp_path / "model"
    shutil.copytree(tiny_st_dir, model)
    (model / "vocab.txt").write_text("my own word list")
    record = json.loads((model / "hf_cocodr_run.json").read_text())
    record["preexisting"] = sorted({*record.get("preexisting", []), "vocab.txt"})
    (model / "hf_cocodr_run.json").write_text(json.dumps(record))
    proc = push(model, "acme/preexisting", url, tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(state.repos["acme/preexisting"]["branches"]["main"]) == MODEL_FILES
    assert f"not uploading {model / 'vocab.txt'}" in proc.stderr


def test_a_model_whose_files_are_links_is_refused_by_name(hub, tiny_st_dir, tmp_path):
    """A folder of links (a Hub cache snapshot): nothing is uploaded through them; one line says what to do."""
    state, url = hub
    model = tmp_path / "snapshot"
    model.mkdir()
    for p in tiny_st_dir.iterdir():
        (model / p.name).symlink_to(p)
    proc = push(model, "acme/links", url, tmp_path / "home")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "modules.json" in errors[0] and "symbolic link" in errors[0], proc.stderr
    assert "acme/links" not in state.repos  # refused before the Hub was asked anything


def test_an_asymmetric_model_is_pushed_whole(hub, tiny_st_dir, tmp_path):
    """A query-side model (a sentence-transformers Router): its routes' module folders and ``router_config.json``
    go up with it (``modules.json`` names only the Router), and what was uploaded loads and encodes as the local
    model does on both routes."""
    import numpy as np
    import torch

    from hf_cocodr.modeling.asymmetric import query_side_model

    state, url = hub
    model = query_side_model(SentenceTransformer(str(tiny_st_dir)))
    with torch.no_grad():  # the query route moved, as after a query-side distillation
        for p in model[0].sub_modules["query"].parameters():
            p.add_(0.01 * torch.randn_like(p))
    folder = tmp_path / "asym"
    model.save(str(folder))
    write_model_card(folder, SentenceTransformer(str(folder)), {})
    local = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert "router_config.json" in local and any(p.startswith("query_0_") for p in local)
    proc = push(folder, "acme/asymmetric", url, tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-3000:]
    uploaded = state.repos["acme/asymmetric"]["branches"]["main"]
    assert set(uploaded) == local  # every file SentenceTransformer.save wrote, the card and the provenance
    clone = tmp_path / "clone"
    for rel, data in uploaded.items():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_bytes(data)
    loaded, texts = SentenceTransformer(str(clone)), ["alpha beta", "gamma delta epsilon"]
    assert np.allclose(loaded.encode_query(texts), model.encode_query(texts), atol=1e-6)
    assert np.allclose(loaded.encode_document(texts), model.encode_document(texts), atol=1e-6)
    assert not np.allclose(loaded.encode_query(texts), loaded.encode_document(texts), atol=1e-4)
