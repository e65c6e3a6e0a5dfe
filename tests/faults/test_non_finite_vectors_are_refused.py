"""NaN and inf vectors are refused (issue 52, item 7): a broken model's at encode and at build (before a fusion is
fitted on them), a damaged saved retriever's at load (naming the file, before any model loads), a damaged disk
cache entry's (encoded again), and query vectors handed to a search."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hf_cocodr.data.beir import load_corpus
from hf_cocodr.errors import ConfigError
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval.encoding import build_index, encode_texts
from hf_cocodr.retrieval.hybrid import EMBEDDINGS_FILE, HybridRetriever
from hf_cocodr.retrieval.session import EncodingSession


def _broken(model_dir, value: float):
    """The tiny model with one hidden layer's weights set to ``value`` (a run that diverged)."""
    model = load_encoder(str(model_dir))
    with torch.no_grad():
        model[0].auto_model.encoder.layer[0].attention.output.dense.weight.fill_(value)
    return model


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_broken_models_vectors_are_refused_at_encode(tiny_st_dir, value):
    with pytest.raises(ConfigError, match=r"not finite"):
        encode_texts(_broken(tiny_st_dir, value), ["first passage", "second passage"], kind="document")


def test_a_hybrid_is_not_built_and_fitted_on_nan_vectors(tiny_st_dir, tiny_beir, monkeypatch):
    import hf_cocodr.retrieval.fusion_fit as fusion_fit

    def no_fit(*a, **k):
        raise AssertionError("a fusion was fitted on NaN vectors")

    monkeypatch.setattr(fusion_fit, "fit_choice", no_fit)
    with pytest.raises(ConfigError, match=r"not finite"):
        HybridRetriever.build(_broken(tiny_st_dir, float("nan")), tiny_beir)


def test_a_saved_retriever_with_non_finite_vectors_is_refused_naming_the_file(tiny_st_dir, tiny_beir, tmp_path):
    folder = tmp_path / "damaged-index"
    HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"dense_weight": 0.45}).save(folder)
    vectors = np.load(folder / EMBEDDINGS_FILE)
    vectors[5, 1] = np.inf
    vectors[17] = np.nan
    np.save(folder / EMBEDDINGS_FILE, vectors)
    with pytest.raises(ConfigError, match=r"2 of 80 vectors") as e:
        HybridRetriever.load(folder)
    assert str(folder / EMBEDDINGS_FILE) in str(e.value)


def test_a_cached_encoding_with_nan_is_encoded_again(tiny_st_dir, tiny_beir, caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    fresh = build_index(model, corpus, show_progress_bar=False, session=EncodingSession(cache=True))[
        0
    ].reconstruct_all()
    (cached,) = (tmp_path / "cache").rglob("embeddings.npy")
    bad = np.load(cached)
    bad[3] = np.nan
    np.save(cached, bad)
    run = EncodingSession(cache=True)
    with caplog.at_level(logging.WARNING):
        again = build_index(model, corpus, show_progress_bar=False, session=run)[0].reconstruct_all()
    assert np.isfinite(again).all() and np.array_equal(again, fresh)
    assert [r["source"] for r in run.record] == ["encoded"]
    assert any("not finite" in r.getMessage() for r in caplog.records)


def test_query_vectors_given_to_a_search_must_be_finite(tiny_st_dir, tiny_beir):
    hybrid = HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"dense_weight": 0.7})
    q = hybrid.encode_queries(["protein folding", "ocean currents"])
    q[1, 0] = np.nan
    with pytest.raises(ConfigError, match=r"not finite"):
        hybrid.search(["protein folding", "ocean currents"], k=3, query_embeddings=q)
