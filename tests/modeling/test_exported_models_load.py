"""sentence-transformers 6 conventions, checked: every model hf_cocodr exports (a plain one, a WiSE-FT interpolation of
a plain and of a query-side model, a query-side Router model) loads with ``SentenceTransformer(path)`` and
``trust_remote_code=False``; a Router model's ``encode_query`` / ``encode_document`` take their routes, and its
prompts survive the save and the reload."""

from __future__ import annotations

import json

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from hf_cocodr.export import export_sentence_transformer
from hf_cocodr.modeling.asymmetric import is_asymmetric, query_side_model
from hf_cocodr.recipe.outputs import export_final, write_wise

PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = ["alpha beta gamma", "a study of kernels"]


def _perturbed(model, scale: float = 0.05):
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn_like(p))
    return model


def _no_remote_code(folder) -> None:
    """Nothing to run but sentence-transformers' own modules: no Python file, every module type one of its own."""
    assert not list(folder.rglob("*.py"))
    types = [m["type"] for m in json.loads((folder / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types), types


def test_every_exported_model_loads_plainly_and_routes_keep_their_prompts(tiny_bert_dir, tiny_st_dir, tmp_path):
    torch.manual_seed(0)
    start_dir = tmp_path / "start"
    start = SentenceTransformer(str(tiny_st_dir), prompts=PROMPTS)
    start.save(str(start_dir))
    plain_dir = tmp_path / "plain"
    export_sentence_transformer(str(tiny_bert_dir), plain_dir)
    adapted_dir = tmp_path / "adapted"
    _perturbed(SentenceTransformer(str(start_dir))).save(str(adapted_dir))
    router = _perturbed(query_side_model(SentenceTransformer(str(start_dir))))
    router_dir, exported = tmp_path / "router", tmp_path / "router-export"
    router.save(str(router_dir))
    export_final(router_dir, exported)
    write_wise(str(start_dir), str(adapted_dir), tmp_path / "wise-plain", 0.5)
    write_wise(str(start_dir), str(router_dir), tmp_path / "wise-router", 0.5)
    for folder in (plain_dir, exported, tmp_path / "wise-plain", tmp_path / "wise-router"):
        _no_remote_code(folder)
        model = SentenceTransformer(str(folder), trust_remote_code=False)
        assert np.isfinite(model.encode(TEXTS)).all()
    for folder in (exported, tmp_path / "wise-router"):
        model = SentenceTransformer(str(folder), trust_remote_code=False)
        assert is_asymmetric(model) and model.prompts == PROMPTS  # the prompts survive the save and the reload
        queries, documents = model.encode_query(TEXTS), model.encode_document(TEXTS)
        assert not np.allclose(queries, documents, atol=1e-4)  # two routes
        # the document route is the starting model's, bit for bit; the query route is the trained one
        assert np.allclose(documents, start.encode_document(TEXTS), atol=1e-6)
        bare = model.encode(TEXTS, task="query", prompt="")
        assert not np.allclose(queries, bare, atol=1e-6)  # encode_query puts the query prompt in front
        assert np.allclose(queries, model.encode([PROMPTS["query"] + t for t in TEXTS], task="query", prompt=""))
    reloaded = SentenceTransformer(str(exported), trust_remote_code=False)
    assert np.allclose(reloaded.encode_query(TEXTS), router.encode_query(TEXTS), atol=1e-6)
