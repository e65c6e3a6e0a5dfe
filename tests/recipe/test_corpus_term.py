"""The query side's whole-corpus term (``distill_corpus_weight``): by hand, its equivalences, its corpus segments,
and the recipe's option reaching the loss, the identity and the card."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import QUERY_SIDE_CFG as CFG
from helpers import spy_distillation_trainers

from hf_cocodr.data.teacher import FrozenCandidateRows, check_segments
from hf_cocodr.errors import ConfigError
from hf_cocodr.finetuning.losses.distill import QuerySideDistillLoss
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.recipe import RecipeConfig, run_recipe

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)
QUERIES = ["a short query", "another query about cells", "a third one"]


def _model(tiny_bert_nomlm_dir, similarity="dot"):
    model = load_encoder(str(tiny_bert_nomlm_dir))
    model.similarity_fn_name = similarity
    return model


def _loss_of(loss, model, rows, idx):
    features = [model.preprocess([rows.query_texts[i] for i in idx], task="query")]
    with torch.no_grad():
        return loss(features, torch.as_tensor(rows.row_labels(idx))).item()


def test_the_term_at_weight_one_makes_the_kl_over_the_whole_corpus_by_hand(tiny_bert_nomlm_dir):
    """Two corpora in one 7-vector table (rows 0-3 and 4-6): each query's loss with ν = 1 (no in-batch term) is
    KL(teacher over its candidates, 0 elsewhere ‖ the student's softmax over its own corpus), computed here from
    the queries' own vectors; a query's corpus is its candidates' segment, the other corpus never enters."""
    model = _model(tiny_bert_nomlm_dir)
    dim = model.get_embedding_dimension()
    table = torch.randn(7, dim, generator=torch.Generator().manual_seed(0))
    scores = np.array([[2.0, 1.0], [1.5, 0.2], [0.3, -0.4]])
    candidates = np.array([[2, 0], [5, 6], [1, 3]])
    rows = FrozenCandidateRows(QUERIES, scores, candidates, vectors=table.numpy(), segments=[0, 4])
    loss = QuerySideDistillLoss(
        model, table, temperature=2.0, teacher_temperature=0.5, in_batch_weight=0.0, corpus_weight=1.0,
        segments=rows.segments,
    )  # fmt: skip
    got = _loss_of(loss, model, rows, [0, 1, 2])
    with torch.no_grad():
        q = model.encode_query(QUERIES, convert_to_tensor=True).float()
    expected = []
    for i, (lo, hi) in enumerate([(0, 4), (4, 7), (0, 4)]):
        logits = (table[lo:hi] @ q[i]) / 2.0
        log_p_s = torch.log_softmax(logits, 0)[torch.as_tensor(candidates[i]) - lo]
        p_t = torch.softmax(torch.tensor(scores[i], dtype=torch.float32) / 0.5, 0)
        expected.append((p_t * (torch.log(p_t) - log_p_s)).sum())
    assert got == pytest.approx(torch.stack(expected).mean().item(), rel=1e-4, abs=1e-6)


def test_weight_zero_is_the_loss_without_the_term_and_a_corpus_of_the_candidates_adds_nothing(tiny_bert_nomlm_dir):
    model = _model(tiny_bert_nomlm_dir, "cosine")
    dim = model.get_embedding_dimension()
    table = torch.nn.functional.normalize(torch.randn(6, dim, generator=torch.Generator().manual_seed(1)), dim=-1)
    rows = FrozenCandidateRows(QUERIES[:2], [[1.0, 0.5, 0.1]] * 2, [[0, 1, 2], [3, 4, 5]], segments=[0, 3])
    kwargs = dict(temperature=0.05, in_batch_weight=1.0)
    plain = _loss_of(QuerySideDistillLoss(model, table, **kwargs), model, rows, [0, 1])
    off = _loss_of(
        QuerySideDistillLoss(model, table, corpus_weight=0.0, segments=[0, 3], **kwargs), model, rows, [0, 1]
    )
    # each query's corpus (rows 0-2, rows 3-5) is exactly its 3 candidates: the term is 0 at any weight
    whole = QuerySideDistillLoss(model, table, corpus_weight=5.0, segments=[0, 3], **kwargs)
    assert off == plain
    assert _loss_of(whole, model, rows, [0, 1]) == pytest.approx(plain, rel=1e-6)
    # one corpus of all 6: each query now has 3 documents outside its candidates, and the term is positive
    wider = _loss_of(QuerySideDistillLoss(model, table, corpus_weight=1.0, **kwargs), model, rows, [0, 1])
    assert wider > plain + 1e-4


def test_the_term_pushes_a_document_the_teacher_did_not_pick_below_the_candidates(tiny_bert_nomlm_dir):
    """Gradient steps on the term alone (ν = 1, the KL's candidates in the order the student already has them)
    lower the student's score of the corpus's one other document against the candidates'."""
    model = _model(tiny_bert_nomlm_dir)
    dim = model.get_embedding_dimension()
    q = model.encode_query(["a query"], convert_to_tensor=True)[0].float()
    table = torch.randn(3, dim, generator=torch.Generator().manual_seed(2))
    table[2] = 3.0 * q / q.norm()  # the outside document starts on top
    loss = QuerySideDistillLoss(model, table, temperature=1.0, in_batch_weight=0.0, corpus_weight=1.0)
    vec = q.clone().requires_grad_(True)
    opt = torch.optim.SGD([vec], lr=0.05)
    gap = lambda v: float((table[:2] @ v).max() - table[2] @ v)  # noqa: E731
    before = gap(q)
    for _ in range(20):
        opt.zero_grad()
        loss.corpus_term(vec[None], torch.tensor([[0, 1]])).backward()
        opt.step()
    assert gap(vec.detach()) > before + 0.1


def test_segments_are_checked():
    assert check_segments([0, 3, 9], 10) == [0, 3, 9]
    for bad, match in (([], "start at 0"), ([1, 4], "start at 0"), ([0, 4, 4], "ascend"), ([0, 10], "past")):
        with pytest.raises(ValueError, match=match):
            check_segments(bad, 10)
    with pytest.raises(ValueError, match="corpus_weight"):
        QuerySideDistillLoss(None, torch.zeros(2, 3), corpus_weight=-1.0)


def test_the_recipe_trains_with_the_term_and_names_it(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    trainers = spy_distillation_trainers(monkeypatch)
    out = tmp_path / "run"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "guard": "record", "distill_corpus_weight": 0.5}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    loss = trainers[-1].loss
    assert loss.corpus_weight == 0.5 and loss.segment_starts.tolist() == [0]  # one target corpus
    assert len(loss.document_embeddings) == trainers[-1].training_data.vectors.shape[0]
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"] == {"distill": 2}
    assert "| whole-corpus weight | 0.5 |" in (out / "model" / "README.md").read_text()


def test_the_term_is_refused_where_it_cannot_work(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    with pytest.raises(ConfigError, match="distill_corpus_weight"):
        RecipeConfig(distill_corpus_weight=-0.5).validate()
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_side": "full", "distill_corpus_weight": 1.0}
    with pytest.raises(ConfigError, match="distill_corpus_weight 1.0 weighs the query side's term"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "f", config=cfg)
    assert not (tmp_path / "f").exists()  # refused before any work
