"""One encoding per model per corpus: the disk cache of corpus encodings serves exactly what a fresh encoding builds,
and never when the model, the corpus, the length or the precision changed; a recipe run encodes each corpus once
per model (its record and the encoder's calls say so)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from hf_cocodr.data.beir import load_corpus
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval.encoding import build_index
from hf_cocodr.retrieval.encoding_cache import cache_corpus_encodings, document_encoder_key


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))


def _vectors(model, corpus, **kw):
    index, order = build_index(model, corpus, show_progress_bar=False, **kw)
    return index.reconstruct_all(), order


def test_a_cached_encoding_is_the_fresh_one_and_a_repeated_run_reads_it(tiny_st_dir, tiny_beir):
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    fresh, fresh_order = _vectors(model, corpus)  # no cache outside the block
    with cache_corpus_encodings() as first:
        a, order_a = _vectors(model, corpus)
    with cache_corpus_encodings() as second:  # another run: another block, the same disk cache
        b, order_b = _vectors(load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir))
    assert [r["source"] for r in first] == ["encoded"] and [r["source"] for r in second] == ["disk cache"]
    assert np.array_equal(a, fresh) and np.array_equal(b, fresh)  # bit for bit, in the same index order
    assert np.array_equal(order_a, fresh_order) and np.array_equal(order_b, fresh_order)
    assert first[0]["num_docs"] == len(corpus) and first[0]["seconds"] >= 0


def test_a_changed_model_corpus_length_or_precision_is_never_served_from_the_cache(tiny_st_dir, tiny_beir, tmp_path):
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    with cache_corpus_encodings() as record:
        _vectors(model, corpus)
        other = copy.deepcopy(model)
        with torch.no_grad():
            next(other.parameters()).add_(1e-3)  # one weight moved
        changed = tmp_path / "changed"
        changed.mkdir()
        lines = (tiny_beir / "corpus.jsonl").read_text().splitlines()
        doc = json.loads(lines[5])
        doc["text"] += " one more word"
        (changed / "corpus.jsonl").write_text("\n".join(lines[:5] + [json.dumps(doc)] + lines[6:]) + "\n")
        got = {
            "model": _vectors(other, corpus)[0],
            "corpus": _vectors(model, load_corpus(changed))[0],
            "length": _vectors(model, corpus, max_length=8)[0],
        }
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got["precision"] = _vectors(model, corpus)[0]
        _vectors(model, corpus)  # the unchanged one: read back
    assert [r["source"] for r in record] == ["encoded"] * 5 + ["disk cache"]
    assert len({(r["document_encoder"], r["corpus"], r["max_length"], r["precision"]) for r in record[:5]}) == 5
    assert record[4]["precision"] == "bf16" and record[3]["max_length"] == 8
    # and each is what that model, corpus, length or precision encodes afresh (outside the cache)
    assert np.array_equal(got["model"], _vectors(other, corpus)[0])
    assert np.array_equal(got["length"], _vectors(model, corpus, max_length=8)[0])


def test_the_document_route_of_a_router_model_shares_the_plain_models_encoding(tiny_st_dir, tiny_beir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    start = load_encoder(str(tiny_st_dir))
    query_side = copy.deepcopy(start)
    with torch.no_grad():
        next(query_side.parameters()).add_(1e-2)  # a query encoder that moved
    router = Router.for_query_document(list(query_side.children()), list(copy.deepcopy(start).children()))
    asym = SentenceTransformer(modules=[router], similarity_fn_name=start.similarity_fn_name)
    assert document_encoder_key(asym) == document_encoder_key(start) != document_encoder_key(query_side)
    corpus = load_corpus(tiny_beir)
    with cache_corpus_encodings() as record:
        a = _vectors(start, corpus)[0]
        b = _vectors(asym, corpus)[0]
    assert [r["source"] for r in record] == ["encoded", "disk cache"] and np.array_equal(a, b)
