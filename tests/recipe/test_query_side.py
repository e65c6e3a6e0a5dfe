"""Query-side distillation (``distill_side: query``): only the queries are encoded and trained, against the starting
model's vectors of the corpus (the cached ones); the loss is the full distillation's with the document side frozen;
the saved model is an asymmetric sentence-transformers model whose document route is the starting model, bit for
bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import QUERY_SIDE_CFG
from safetensors.torch import load_file

from hf_cocodr.data.target_queries import read_target_queries
from hf_cocodr.data.teacher import frozen_candidate_rows, teacher_rows
from hf_cocodr.errors import ConfigError
from hf_cocodr.finetuning.losses.distill import HybridDistillLoss, QuerySideDistillLoss
from hf_cocodr.modeling.asymmetric import query_side_model
from hf_cocodr.modeling.loading import load_encoder, pooling_mode
from hf_cocodr.recipe import RecipeConfig, run_recipe
from hf_cocodr.retrieval.encoding import encode_texts
from hf_cocodr.retrieval.hybrid import _corpus_ids_texts
from hf_cocodr.retrieval.session import EncodingSession
from hf_cocodr.retrieval.teacher import query_side_dataset, teacher_rankings

CFG = {**QUERY_SIDE_CFG, "distill_steps": 3}


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


class _Fixed:
    def __init__(self, ids, scores):
        self.ids, self.scores = ids, scores

    def search(self, queries, k):
        return self.ids[: len(queries)], self.scores[: len(queries)]


def test_the_document_vectors_of_a_step_are_the_cached_starting_ones(tiny_bert_nomlm_dir, tiny_beir):
    start = load_encoder(str(tiny_bert_nomlm_dir))
    spec = f"{tiny_beir}:train"
    run = EncodingSession(cache=True)
    made = query_side_dataset(start, "key", [str(tiny_beir)], [spec], 3, session=run)
    rows, table = made.rows, made.rows.vectors
    assert made.query_side and [s["corpus"] for s in made.sources] == [str(tiny_beir)]
    assert [r["source"] for r in run.record] == ["encoded"]  # the teacher's encoding, kept in the cache
    doc_ids, texts = _corpus_ids_texts(tiny_beir)
    fresh = encode_texts(start, texts, kind="document")
    assert np.allclose(table, fresh, atol=1e-5)
    again = EncodingSession(cache=True)  # another run: the teacher's index from its cache; the vectors the same
    cached_table = query_side_dataset(start, "key", [str(tiny_beir)], [spec], 3, session=again).rows.vectors
    assert np.array_equal(cached_table, table) and again.record == []  # nothing encoded again
    # the candidates a step hands the loss are those rows: the teacher's top-k documents, as the start encodes them
    loss = QuerySideDistillLoss(query_side_model(start), table)
    labels = torch.as_tensor(rows.row_labels([0, 1, 2, 3]))
    picked = loss.candidate_embeddings(labels[:, 1].long(), "cpu")
    ids = teacher_rankings(start, "key", tiny_beir, rows.query_texts[:4], 3)[0]
    row_of = {d: i for i, d in enumerate(doc_ids)}
    for j in range(3):
        want = encode_texts(start, [texts[row_of[q[j]]] for q in ids], kind="document")
        assert np.allclose(picked[j].numpy(), want, atol=1e-5)
    assert np.allclose(labels[:, 0].numpy(), rows.scores[:4])


def test_the_loss_is_the_full_distillations_with_the_document_side_frozen(tiny_bert_nomlm_dir, tiny_beir):
    start = load_encoder(str(tiny_bert_nomlm_dir))
    queries = read_target_queries(f"{tiny_beir}:train").texts[:6]
    doc_ids, texts = _corpus_ids_texts(tiny_beir)
    rng = np.random.default_rng(0)
    ids = [[doc_ids[i] for i in rng.choice(len(doc_ids), 4, replace=False)] for _ in queries]
    scores = rng.standard_normal((len(queries), 4)).tolist()
    full_rows = teacher_rows(_Fixed(ids, scores), queries, dict(zip(doc_ids, texts)), 4)
    frozen_rows = frozen_candidate_rows(_Fixed(ids, scores), queries, {d: i for i, d in enumerate(doc_ids)}, 4)
    table = encode_texts(start, texts, kind="document")
    opts = dict(temperature=0.5, teacher_temperature=1.0, in_batch_weight=1.0)

    full = HybridDistillLoss(start, document_gradients=False, **opts)
    cols = [full_rows["query"]] + [full_rows[f"doc_{j}"] for j in range(1, 5)]
    feats = [start.preprocess(c, task="query" if i == 0 else "document") for i, c in enumerate(cols)]
    start.zero_grad()
    expected = full(feats, torch.tensor(full_rows["label"]))
    expected.backward()
    grads = {n: p.grad.clone() for n, p in start.named_parameters() if p.grad is not None}

    model = query_side_model(start)
    side = QuerySideDistillLoss(model, table, **opts)
    got = side(
        [model.preprocess(frozen_rows.query_texts, task="query")], torch.as_tensor(frozen_rows.row_labels(range(6)))
    )
    got.backward()
    assert torch.allclose(got, expected, atol=1e-5)
    query_route = model[0].sub_modules["query"]
    for name, p in query_route.named_parameters():  # "0.model..." as in the plain model
        if name not in grads:  # (a parameter the loss does not reach, e.g. BERT's unused pooler)
            assert p.grad is None, name
            continue
        assert torch.allclose(p.grad, grads[name], atol=1e-5), name
    assert len(grads) > 10
    assert all(p.grad is None for p in model[0].sub_modules["document"].parameters())


def test_a_query_side_run_saves_an_asymmetric_model_whose_document_route_is_the_start(
    tiny_st_dir, tiny_beir, tmp_path
):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "run"
    # (the guard reads and records only: this tiny random model's adapted query side may read worse, and the test is
    # of the model the stage saves)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "guard": "record"}
    res = run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[f"{tiny_beir}:dev"], config=cfg)
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"] == {"distill": 3}
    adapted, start = SentenceTransformer(str(out / "model")), SentenceTransformer(str(tiny_st_dir))
    texts = ["alpha beta gamma", "a second text about delta"]
    assert np.array_equal(adapted.encode_document(texts), start.encode_document(texts))
    assert np.array_equal(adapted.encode(texts), start.encode(texts))  # the default route: documents
    assert not np.allclose(adapted.encode_query(texts), start.encode_query(texts), atol=1e-6)  # the query side moved
    # the document route's weights are the starting model's, bit for bit
    route = load_file(str(next((out / "model").glob("document_0_*/model.safetensors"))))
    first = load_file(str(next(tiny_st_dir.glob("**/model.safetensors"))))
    assert route.keys() == first.keys() and all(torch.equal(route[k], first[k]) for k in first)
    # the card and the recipe read its pooling from the document route
    assert pooling_mode(adapted) == pooling_mode(start) == "cls"
    # one corpus encoding in the whole run: the adapted model's documents are the start's (served from the cache)
    assert [r["source"] for r in record["corpus_encodings"]].count("encoded") == 1
    assert {"ndcg@10", "hybrid", "start"} <= set(res[f"{tiny_beir}:dev"])
    assert res[f"{tiny_beir}:dev"]["recall@100"] > 0
    # the card says what the model is and what trained it: asymmetric, distilled without labels, the queries read
    card = (out / "model" / "README.md").read_text()
    assert "It is **asymmetric**" in card and "| Architecture | asymmetric" in card and "router_config.json" in card
    assert "### Stage 1: hybrid-teacher distillation (query side)" in card
    assert "| trained | the query encoder only" in card and "| candidates per query | 3 |" in card
    assert (
        f"The hybrid-teacher distillation also read the **queries** (never their relevance labels) of: {tiny_beir.name}:train"
        in card
    )
    assert "Relevance labels came only from" not in card  # the teacher needs none
    # the model-index holds the dense model's scores (the recipe also evaluates the hybrid: a row of its own)
    import yaml

    meta = yaml.safe_load(card.split("---\n", 2)[1])
    ndcg = [m["value"] for r in meta["model-index"][0]["results"] for m in r["metrics"] if m["type"] == "ndcg_at_10"]
    assert ndcg == [pytest.approx(res[f"{tiny_beir}:dev"]["ndcg@10"], abs=1e-6)]
    assert f"| {tiny_beir.name}:dev, hybrid with BM25 | hf-cocodr evaluate |" in card


def test_query_side_distillation_refuses_what_it_cannot_do(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    with pytest.raises(ConfigError, match="distill_side must be one of auto, full, query"):
        RecipeConfig(distill_side="documents").validate()
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "skip_finetune": False, "finetune_steps": 2}
    with pytest.raises(ConfigError, match="source fine-tuning would train the model before it"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "f", config=cfg)
    # refused before any work: no folder claimed, no model loaded
    assert not (tmp_path / "f").exists()


def test_wise_after_a_query_side_distillation_interpolates_the_query_route(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    """``wise_alpha`` after the query side: the exported model is the distillation's asymmetric model with its query
    route interpolated toward the start (what :func:`~hf_cocodr.modeling.wise.wise_ensemble` gives the two), its
    document route still the starting model's, so an index built with the start stays valid."""
    from hf_cocodr.modeling.wise import wise_ensemble

    out = tmp_path / "out"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "wise_alpha": 0.5, "guard": "record"}
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    rec = json.loads((out / "recipe.json").read_text())
    assert rec["steps_trained"]["distill"] == 3 and rec["config"]["wise_alpha"] == 0.5
    start, final = load_encoder(str(tiny_bert_nomlm_dir)), load_encoder(str(out / "model"))
    distilled = load_encoder(str(out / "distill"))
    expected = wise_ensemble(start, load_encoder(str(out / "distill")), 0.5)
    texts = ["alpha beta gamma", "a query about kernels"]
    assert np.allclose(final.encode_query(texts), expected.encode_query(texts), atol=1e-6)
    assert not np.allclose(final.encode_query(texts), distilled.encode_query(texts), atol=1e-4)
    assert np.array_equal(final.encode_document(texts), start.encode_document(texts))
