"""Leaderboard and Hub files carry no local path (issue 52, item 1): ``mteb --hybrid`` names a local dense model
without the folder it lies in and without the hybrid's revision, and ``push`` reduces local paths in every JSON file
it uploads, the MTEB results included, as it does in the provenance."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import push_capturing

import hf_cocodr.cli.mteb  # noqa: F401  (registers the mteb command)
from hf_cocodr import load_encoder
from hf_cocodr.cli import main

HYBRID_NAME = "lab-x/fused-retriever"
HYBRID_REVISION = "hyb-2031"


def _strings(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


@pytest.fixture(scope="module")
def private_dense(tmp_path_factory):
    """A dense model no hf_cocodr stage trained, saved deep inside a folder whose names are private."""
    import tiny

    root = tmp_path_factory.mktemp("home-of-pat")
    bert = tiny.make_tiny_bert(root / "bert", seed=11, initializer_range=0.2)
    dense = root / "clients" / "northwind-legal" / "retriever-b7"
    load_encoder(str(bert)).save(str(dense))
    return dense


def _hybrid(model, data, out, *extra) -> tuple[int, dict]:
    argv = ["-q", "mteb", str(model), str(data), "--split", "dev", "--task-name", "nw-dev", "--hybrid"]
    argv += ["--model-name", HYBRID_NAME, "--revision", HYBRID_REVISION, "--output-folder", str(out)]
    with contextlib.redirect_stdout(io.StringIO()):
        code = main([*argv, "--batch-size", "16", *extra])
    rev_dir = Path(out) / "results" / HYBRID_NAME.replace("/", "__") / HYBRID_REVISION
    return code, json.loads((rev_dir / "model_meta.json").read_text()) if code == 0 else {}


def test_a_hybrids_model_meta_names_a_local_dense_model_without_its_path_or_the_hybrids_revision(
    private_dense, tiny_beir, tmp_path
):
    code, meta = _hybrid(private_dense, tiny_beir, tmp_path / "board")
    assert code == 0
    for text in _strings(meta):
        assert not os.path.isabs(text) and "northwind-legal" not in text, text
    parts = meta["loader_kwargs"]
    assert parts["dense_model"] == private_dense.name == meta["adapted_from"]  # the folder's last component
    # the hybrid's --revision labels the hybrid; a local folder has no Hub revision of its own to state
    assert parts.get("dense_revision") != HYBRID_REVISION
    assert parts.get("dense_revision") is None
    assert meta["revision"] == HYBRID_REVISION


def test_a_dense_model_name_given_names_the_dense_part(private_dense, tiny_beir, tmp_path):
    code, meta = _hybrid(private_dense, tiny_beir, tmp_path / "board", "--dense-model-name", "northwind/ret-b7")
    assert code == 0
    assert meta["loader_kwargs"]["dense_model"] == "northwind/ret-b7" == meta["adapted_from"]
    assert meta["loader_kwargs"].get("dense_revision") != HYBRID_REVISION
    # a path given as the name is named by its last component, like every local path leaving the machine
    code, meta = _hybrid(private_dense, tiny_beir, tmp_path / "other", "--dense-model-name", str(private_dense))
    assert code == 0
    assert meta["loader_kwargs"]["dense_model"] == private_dense.name == meta["adapted_from"]


def _push_capturing(model: Path, monkeypatch) -> dict[str, bytes]:
    return push_capturing(model, monkeypatch, "lab-x/dense-b7", "hf_" + "q" * 30)


def test_push_reduces_local_paths_in_every_json_it_uploads(tiny_st_dir, tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(tiny_st_dir, model)
    private = tmp_path / "srv" / "northwind-legal"
    # the leaderboard files an earlier version wrote: the dense part named by its absolute folder
    rev_dir = model / "mteb_results" / "results" / "lab-x__fused-retriever" / "r3"
    rev_dir.mkdir(parents=True)
    meta = {
        "name": "lab-x/fused-retriever",
        "revision": "r3",
        "loader_kwargs": {"dense_model": str(private / "retriever-b7"), "lexical_model": "bm25s (lucene BM25)"},
        "adapted_from": str(private / "retriever-b7"),
        "reference": "https://huggingface.co/lab-x/fused-retriever",
    }
    (rev_dir / "model_meta.json").write_text(json.dumps(meta, indent=2))
    (rev_dir / "nw-dev.json").write_text(json.dumps({"task_name": "nw-dev", "scores": {"dev": [{"main_score": 0.4}]}}))
    # a model configuration naming the folder it was loaded from, and a tokenizer whose tokens hold slashes
    config = json.loads((model / "config.json").read_text())
    config["_name_or_path"] = str(private / "base-bert")
    (model / "config.json").write_text(json.dumps(config, indent=2))
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok.update(name_or_path=str(private / "base-bert"), eos_token="</s>", bos_token="<s/>")
    (model / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))

    uploaded = _push_capturing(model, monkeypatch)
    assert "mteb_results/results/lab-x__fused-retriever/r3/model_meta.json" in uploaded
    for rel, data in uploaded.items():
        assert b"northwind-legal" not in data and str(tmp_path).encode() not in data, rel
    up_meta = json.loads(uploaded["mteb_results/results/lab-x__fused-retriever/r3/model_meta.json"])
    assert up_meta["loader_kwargs"]["dense_model"] == "retriever-b7" == up_meta["adapted_from"]
    meta["loader_kwargs"]["dense_model"] = meta["adapted_from"] = "retriever-b7"
    assert up_meta == meta  # otherwise the file as it is
    assert json.loads(uploaded["config.json"])["_name_or_path"] == "base-bert"
    up_tok = json.loads(uploaded["tokenizer_config.json"])
    assert up_tok["name_or_path"] == "base-bert"
    assert up_tok["eos_token"] == "</s>" and up_tok["bos_token"] == "<s/>"  # tokens are not paths
    # a file without a path goes up byte for byte
    rel = "mteb_results/results/lab-x__fused-retriever/r3/nw-dev.json"
    assert uploaded[rel] == (model / rel).read_bytes()
    assert uploaded["tokenizer.json"] == (model / "tokenizer.json").read_bytes()
