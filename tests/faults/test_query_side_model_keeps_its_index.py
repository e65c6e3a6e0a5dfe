"""A query-side model keeps the index of its start (issue 52, item 4): its document route is the starting model, bit
for bit, so a retriever saved with the start loads for it; a saved hybrid records the document encoder and the
folder of a Router model, never ``unknown``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_cocodr.errors import ConfigError
from hf_cocodr.modeling.asymmetric import query_side_model
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval.encoding_cache import document_encoder_key
from hf_cocodr.retrieval.hybrid import HYBRID_FILE, HybridRetriever
from hf_cocodr.rundir.run_record import model_fingerprint

BY_HAND = {"dense_weight": 0.35}  # no fit: these tests are about the model, not the fusion


def _moved(model, route: str):
    """``model`` (a query-side model) with the first weight of one route moved, as training moves it."""
    with torch.no_grad():
        next(model[0].sub_modules[route][0].parameters()).add_(0.03)
    return model


@pytest.fixture(scope="module")
def start_index(tiny_st_dir, tiny_beir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("kept") / "start-index"
    HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion=BY_HAND).save(folder)
    return folder


def test_an_index_of_the_start_loads_for_its_query_side_model(tiny_st_dir, start_index):
    start = load_encoder(str(tiny_st_dir))
    adapted = _moved(query_side_model(start), "query")
    assert model_fingerprint(adapted) != model_fingerprint(start)  # a model of its own, but not for documents
    hybrid = HybridRetriever.load(start_index, model=adapted)
    assert hybrid.model is adapted
    assert np.array_equal(hybrid.embeddings, np.load(start_index / "dense_embeddings.npy"))
    ids, _ = hybrid.search(["gene expression in cells"], k=4)
    assert len(ids[0]) == 4
    # a model whose document route moved would encode documents otherwise: refused as before
    drifted = _moved(query_side_model(start), "document")
    with pytest.raises(ConfigError, match="would not match"):
        HybridRetriever.load(start_index, model=drifted)


def test_an_index_saved_before_the_document_encoder_was_recorded_loads_for_it(tiny_st_dir, start_index, tmp_path):
    import shutil

    old = tmp_path / "older-index"
    shutil.copytree(start_index, old)
    info = json.loads((old / HYBRID_FILE).read_text())
    info.pop("document_encoder", None)  # what an earlier version saved
    (old / HYBRID_FILE).write_text(json.dumps(info))
    adapted = _moved(query_side_model(load_encoder(str(tiny_st_dir))), "query")
    assert HybridRetriever.load(old, model=adapted).model is adapted


def test_a_router_model_from_its_folder_is_recorded_by_that_folder(tiny_st_dir, tiny_beir, tmp_path):
    start = load_encoder(str(tiny_st_dir))
    saved = tmp_path / "runs" / "q-side"
    _moved(query_side_model(start), "query").save(str(saved))
    adapted = load_encoder(str(saved))
    out = tmp_path / "served" / "toy-hybrid"
    HybridRetriever.build(adapted, tiny_beir, fusion=BY_HAND).save(out)
    info = json.loads((out / HYBRID_FILE).read_text())
    assert info["model"] == "../../runs/q-side" and info["model_relative_to_folder"] is True
    assert info["document_encoder"] == document_encoder_key(start)
    again = HybridRetriever.load(out)  # no model= needed: the recorded folder is the model
    assert model_fingerprint(again.model) == model_fingerprint(adapted)
    # and the start, whose document encoder it shares, may rank with the same index
    assert HybridRetriever.load(out, model=start).model is start


def test_a_router_model_held_in_memory_is_not_recorded_as_another_model(tiny_st_dir, tiny_beir, tmp_path):
    """An unsaved query-side model has no folder: it is not recorded as ``unknown``, nor as its start's folder
    (whose query encoder is not its own); loading names the way out."""
    adapted = _moved(query_side_model(load_encoder(str(tiny_st_dir))), "query")
    out = tmp_path / "mem-hybrid"
    HybridRetriever.build(adapted, tiny_beir, fusion=BY_HAND).save(out)
    info = json.loads((out / HYBRID_FILE).read_text())
    assert info["model"] not in ("unknown", str(tiny_st_dir)) and "model_relative_to_folder" not in info
    with pytest.raises(ConfigError, match=r"held in memory.*model="):
        HybridRetriever.load(out)
    assert HybridRetriever.load(out, model=adapted).model is adapted
