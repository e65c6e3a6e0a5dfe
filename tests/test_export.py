from __future__ import annotations

import json
import logging

import pytest
import torch

from hf_cocodr import export_sentence_transformer, load_encoder
from hf_cocodr.modeling.loading import pooling_mode

TEXTS = ["Cardiac artery pressure and the pulse.", "a melody on the piano", "orbit of the moon around a planet"]


def raw_cls_vectors(path, texts):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
        return model(**batch).last_hidden_state[:, 0]


def test_raw_checkpoint_loads_with_cls_and_dot(tiny_bert_dir, caplog):
    with caplog.at_level(logging.INFO):
        model = load_encoder(tiny_bert_dir)
    assert pooling_mode(model) == "cls"
    assert model.similarity_fn_name == "dot"
    assert any("CLS pooling and dot similarity" in r.getMessage() for r in caplog.records)
    emb = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(emb, raw_cls_vectors(str(tiny_bert_dir), TEXTS), atol=1e-5, rtol=1e-5)


def test_export_round_trip_equals_automodel_cls(tiny_bert_dir, tmp_path, caplog):
    out = tmp_path / "exported"
    export_sentence_transformer(str(tiny_bert_dir), out, max_seq_length=64)
    from sentence_transformers import SentenceTransformer

    with caplog.at_level(logging.DEBUG):
        model = SentenceTransformer(str(out))
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "No modules.json found" not in messages  # ST's silent mean-pooling fallback did not run
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]  # no Normalize
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    assert json.loads((out / "config_sentence_transformers.json").read_text())["similarity_fn_name"] == "dot"
    assert model.max_seq_length == 64
    emb = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(emb, raw_cls_vectors(str(out), TEXTS), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(emb, raw_cls_vectors(str(tiny_bert_dir), TEXTS), atol=1e-5, rtol=1e-5)
    # The card exists and states pooling and similarity.
    card = (out / "README.md").read_text()
    assert "CLS token" in card and "dot product" in card


def test_export_keeps_lower_casing(tiny_bert_dir, tmp_path):
    out = tmp_path / "exported"
    model = export_sentence_transformer(str(tiny_bert_dir), out)
    a = model.encode(["CARDIAC ARTERY"], convert_to_tensor=True)
    b = model.encode(["cardiac artery"], convert_to_tensor=True)
    torch.testing.assert_close(a, b)


def test_export_of_mean_pooling_st_model_switches_to_cls(minilm_dir, tmp_path):
    out = tmp_path / "minilm_cls"
    model = export_sentence_transformer(minilm_dir, out)
    assert pooling_mode(model) == "cls" and model.similarity_fn_name == "dot"
    emb = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(emb, raw_cls_vectors(minilm_dir, TEXTS), atol=1e-5, rtol=1e-5)


def test_export_mean_cosine_option(tiny_bert_dir, tmp_path):
    model = export_sentence_transformer(str(tiny_bert_dir), tmp_path / "m", pooling="mean", similarity="cosine")
    assert pooling_mode(model) == "mean" and model.similarity_fn_name == "cosine"


def test_legacy_format_loads_identically(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    new = export_sentence_transformer(str(tiny_bert_dir), tmp_path / "new", max_seq_length=64)
    export_sentence_transformer(str(tiny_bert_dir), tmp_path / "old", max_seq_length=64, legacy_format=True)
    modules = json.loads((tmp_path / "old" / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        "sentence_transformers.models.Transformer",
        "sentence_transformers.models.Pooling",
    ]
    pool_cfg = json.loads((tmp_path / "old" / "1_Pooling" / "config.json").read_text())
    assert pool_cfg["pooling_mode_cls_token"] is True and pool_cfg["pooling_mode_mean_tokens"] is False
    assert json.loads((tmp_path / "old" / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    old = SentenceTransformer(str(tmp_path / "old"))
    assert pooling_mode(old) == "cls" and old.similarity_fn_name == "dot"
    torch.testing.assert_close(old.encode(TEXTS, convert_to_tensor=True), new.encode(TEXTS, convert_to_tensor=True))


def test_export_is_atomic_on_failure(tiny_bert_dir, tmp_path, monkeypatch):
    out = tmp_path / "model"
    export_sentence_transformer(str(tiny_bert_dir), out)
    before = sorted(p.name for p in out.iterdir())
    import hf_cocodr.export as export_module

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_module, "write_model_card", boom)  # the card is the last file the export writes
    with pytest.raises(RuntimeError, match="disk full"):
        export_sentence_transformer(str(tiny_bert_dir), out, pooling="mean")
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.tmp")]


def test_export_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        export_sentence_transformer(str(tmp_path / "missing"), tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a sentence-transformers directory"):
        export_sentence_transformer(str(tmp_path / "empty"), tmp_path / "out")
    with pytest.raises(ValueError, match="pooling must be one of"):
        export_sentence_transformer(str(tmp_path / "empty"), tmp_path / "out", pooling="weird")


def test_convert_raw_checkpoint_cli(tiny_bert_dir, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.cli import main

    out = tmp_path / "cocodr-base"
    assert main(["convert", str(tiny_bert_dir), str(out), "--name", "acme/cocodr-tiny"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["pooling"] == "cls" and res["similarity"] == "dot" and res["query_length"] == 64
    model = SentenceTransformer(str(out))
    assert pooling_mode(model) == "cls" and model.similarity_fn_name == "dot"
    # the paper's 256-token documents, at most the tiny model's 128 positions (the limit caps defaults only)
    assert model[0].query_length == 64 and model[0].document_length == 128 and res["document_length"] == 128
    torch.testing.assert_close(
        model.encode_document(TEXTS, convert_to_tensor=True),
        raw_cls_vectors(str(tiny_bert_dir), TEXTS),
        atol=1e-5,
        rtol=1e-5,
    )
    meta = json.loads((out / "mteb_model_meta.json").read_text())
    assert meta["name"] == "acme/cocodr-tiny" and meta["embed_dim"] == 32 and meta["similarity_fn_name"] == "dot"
    card = (out / "README.md").read_text()
    assert "acme/cocodr-tiny" in card and "CLS token" in card


def _digest(folder):
    import hashlib

    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_export_never_deletes_the_users_files(tiny_bert_dir, tmp_path, monkeypatch):
    from hf_cocodr.cli import main
    from hf_cocodr.export import convert_checkpoint, export_sentence_transformer

    home = tmp_path / "work"
    (home / "sub").mkdir(parents=True)
    (home / "notes.txt").write_text("my notes")
    (home / "sub" / "data.csv").write_text("a,b\n1,2\n")
    (home / "photos").mkdir()
    (home / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    before = _digest(home)
    monkeypatch.chdir(home / "sub")
    for target in (".", "..", str(home)):
        with pytest.raises(FileExistsError, match="current folder|did not write"):
            export_sentence_transformer(str(tiny_bert_dir), target)
    with pytest.raises(FileExistsError, match="is a file"):
        export_sentence_transformer(str(tiny_bert_dir), "data.csv")
    with pytest.raises(FileExistsError, match="read from"):
        export_sentence_transformer(str(tiny_bert_dir), str(tiny_bert_dir))
    for convert in (True, False):  # a folder beside the model that holds other files
        with pytest.raises(FileExistsError, match="did not write"):
            (convert_checkpoint if convert else export_sentence_transformer)(str(tiny_bert_dir), str(home / "photos"))
    assert main(["export", str(tiny_bert_dir), "."]) == 2
    assert _digest(home) == before  # byte for byte


def test_export_in_place_keeps_checkpoints_and_other_files(tiny_bert_dir, tmp_path):
    from hf_cocodr.export import export_sentence_transformer

    out = tmp_path / "model"
    export_sentence_transformer(str(tiny_bert_dir), out)
    (out / "checkpoint-5").mkdir()
    (out / "checkpoint-5" / "optimizer.pt").write_bytes(b"\x00\x01")
    (out / "my_notes.md").write_text("keep me")
    kept = {k: v for k, v in _digest(out).items() if k.startswith(("checkpoint-5", "my_notes"))}
    with pytest.raises(FileExistsError, match="did not write"):  # files the export did not write: refused...
        export_sentence_transformer(str(tiny_bert_dir), out, pooling="mean", similarity="cosine")
    # ...unless asked to write beside them: they are carried over untouched
    model = export_sentence_transformer(
        str(tiny_bert_dir), out, pooling="mean", similarity="cosine", overwrite_output_dir=True
    )
    assert {k: v for k, v in _digest(out).items() if k in kept} == kept
    assert model.similarity_fn_name == "cosine"
    with pytest.raises(FileExistsError, match="read from"):  # never in place: the source is what it reads
        export_sentence_transformer(str(out), out)
    assert {k: v for k, v in _digest(out).items() if k in kept} == kept


def test_convert_and_export_refuse_an_asymmetric_model_by_name(tiny_st_dir, tmp_path, capsys):
    """A query-side model (a Router with a query and a document route) would lose a route in a symmetric rebuild:
    both commands say so, and write nothing."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.cli import main
    from hf_cocodr.export import export_sentence_transformer
    from hf_cocodr.modeling.asymmetric import query_side_model

    asym = tmp_path / "asym"
    query_side_model(SentenceTransformer(str(tiny_st_dir))).save(str(asym))
    assert main(["convert", str(asym), str(tmp_path / "converted")]) == 2
    err = capsys.readouterr().err
    assert "asymmetric" in err and "router_config.json" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="the model is asymmetric"):
        export_sentence_transformer(str(asym), tmp_path / "exported")
    assert not (tmp_path / "converted").exists() and not (tmp_path / "exported").exists()
