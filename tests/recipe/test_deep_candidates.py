"""Sampled deeper candidates of the query-side distillation (``distill_deep``): each row keeps the teacher's top k and
adds candidates drawn from its ranks k+1 .. depth, at their teacher scores; the listwise loss then spans them all."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import QUERY_SIDE_CFG as CFG
from helpers import spy_distillation_trainers

from hf_cocodr.data.teacher import deep_ranks, frozen_candidate_rows
from hf_cocodr.errors import ConfigError
from hf_cocodr.finetuning.losses.distill import QuerySideDistillLoss
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.recipe import RecipeConfig, run_recipe

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


class _Ranking:
    """A teacher with a fixed ranking per query (as deep as given), recording the depth it is asked for."""

    def __init__(self, ids, scores):
        self.ids, self.scores, self.asked = ids, scores, []

    def search(self, queries, k):
        self.asked.append(k)
        return [r[:k] for r in self.ids[: len(queries)]], [r[:k] for r in self.scores[: len(queries)]]


def _teacher(n_queries=3, depth=12, short=None):
    ids = [[f"d{(q * 5 + r) % 20}" for r in range(depth)] for q in range(n_queries)]
    scores = [[10.0 - r - 0.1 * q for r in range(depth)] for q in range(n_queries)]
    if short is not None:  # one query the teacher ranks only `short` documents for
        ids[1], scores[1] = ids[1][:short], scores[1][:short]
    return _Ranking(ids, scores)


DOC_ROWS = {f"d{i}": 100 + i for i in range(20)}


def test_deep_rows_keep_the_top_k_and_add_distinct_lower_ranks_at_their_teacher_scores():
    teacher = _teacher()
    rows = frozen_candidate_rows(teacher, ["a", "b", "c"], DOC_ROWS, 3, deep=4, depth=10, seed=7)
    assert teacher.asked == [10]  # searched to the depth the deep candidates are drawn from
    assert rows.candidates.shape == rows.scores.shape == (3, 7)
    assert rows.sampled == {"top": 3, "deep": 4, "depth": 10}
    for q in range(3):
        ranks = deep_ranks(10, 3, 4, 7, q)
        assert len(set(ranks.tolist())) == 4 and ranks.min() >= 3 and ranks.max() < 10
        assert list(ranks) == sorted(ranks)
        expected = [*range(3), *ranks.tolist()]
        # the row's documents and scores are the teacher's at exactly those ranks (score of rank r: 10 - r - 0.1 q)
        assert rows.candidates[q].tolist() == [DOC_ROWS[teacher.ids[q][r]] for r in expected]
        assert rows.scores[q].tolist() == pytest.approx([10.0 - r - 0.1 * q for r in expected])
    # the labels the loss reads: (B, 2, k + deep)
    assert rows.row_labels([0, 2]).shape == (2, 2, 7)


def test_deep_samples_are_fixed_by_the_seed_and_the_row_and_vary_with_them():
    a = frozen_candidate_rows(_teacher(), ["a", "b", "c"], DOC_ROWS, 3, deep=4, depth=12, seed=1)
    b = frozen_candidate_rows(_teacher(), ["a", "b", "c"], DOC_ROWS, 3, deep=4, depth=12, seed=1)
    c = frozen_candidate_rows(_teacher(), ["a", "b", "c"], DOC_ROWS, 3, deep=4, depth=12, seed=2)
    assert np.array_equal(a.candidates, b.candidates)
    assert not np.array_equal(a.candidates[:, 3:], c.candidates[:, 3:])
    # rows differ from each other (each row draws its own ranks), and the top k never moves
    draws = {tuple(deep_ranks(12, 3, 4, 1, r)) for r in range(8)}
    assert len(draws) > 1
    assert np.array_equal(a.candidates[:, :3], c.candidates[:, :3])


def test_no_deep_candidates_are_the_top_k_rows_of_before():
    teacher = _teacher()
    rows = frozen_candidate_rows(teacher, ["a", "b", "c"], DOC_ROWS, 3)
    assert teacher.asked == [3] and rows.sampled is None
    assert rows.candidates.tolist() == [[DOC_ROWS[d] for d in teacher.ids[q][:3]] for q in range(3)]
    assert rows.scores.tolist() == [teacher.scores[q][:3] for q in range(3)]


def test_a_query_ranked_too_shallow_for_its_deep_candidates_is_left_out(caplog):
    rows = frozen_candidate_rows(_teacher(short=5), ["a", "b", "c"], DOC_ROWS, 3, deep=4, depth=10)
    assert rows.query_texts == ["a", "c"]
    assert "1 of 3 queries got fewer than 7 teacher candidates" in caplog.text
    with pytest.raises(ValueError, match="depth must be a whole number >= k \\+ deep = 7"):
        frozen_candidate_rows(_teacher(), ["a"], DOC_ROWS, 3, deep=4, depth=6)
    with pytest.raises(ValueError, match="deep must be a whole number >= 0"):
        frozen_candidate_rows(_teacher(), ["a"], DOC_ROWS, 3, deep=-1)


def test_the_loss_over_deep_candidates_is_the_listwise_kl_over_all_of_them_by_hand(tiny_bert_nomlm_dir):
    """One query, 2 top and 2 deep candidates of a hand-made 4-document table: the loss (no in-batch term) is
    KL(softmax(t / T_t) || softmax(s / T_s)) over the 4, computed here by hand from the query's own vector."""
    model = load_encoder(str(tiny_bert_nomlm_dir))
    model.similarity_fn_name = "dot"
    dim = model.get_embedding_dimension()
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(6, dim, generator=gen)
    ids = [["d0", "d1", "d2", "d3", "d4", "d5"]]
    teacher = _Ranking(ids, [[3.0, 2.5, 1.0, 0.5, 0.0, -1.0]])
    rows = frozen_candidate_rows(teacher, ["a short query"], {f"d{i}": i for i in range(6)}, 2, deep=2, depth=6)
    loss = QuerySideDistillLoss(model, table, temperature=2.0, teacher_temperature=0.5, in_batch_weight=0.0)
    with torch.no_grad():
        got = loss([model.preprocess(rows.query_texts, task="query")], torch.as_tensor(rows.row_labels([0])))
        q = model.encode_query(rows.query_texts, convert_to_tensor=True)[0].float()
    cand = rows.candidates[0].tolist()
    s = torch.stack([table[c] @ q for c in cand]) / 2.0
    t = torch.tensor(rows.scores[0], dtype=torch.float32) / 0.5
    p_t, log_p_s = torch.softmax(t, 0), torch.log_softmax(s, 0)
    expected = (p_t * (torch.log(p_t) - log_p_s)).sum()
    assert len(cand) == 4 and cand[:2] == [0, 1]
    assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)


def test_the_recipe_trains_on_deep_rows_with_the_margin_term_and_names_them(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch
):
    trainers = spy_distillation_trainers(monkeypatch)
    out = tmp_path / "run"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "guard": "record", "distill_deep": 2}
    cfg.update(distill_deep_depth=6, distill_margin_weight=0.5)
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    trained = trainers[-1].training_data  # the stage's trainer's rows (a probe's trainer comes first where it plans)
    assert trained.candidates.shape[1] == 5 and trained.sampled == {"top": 3, "deep": 2, "depth": 6}
    assert trainers[-1].loss.margin_weight == 0.5  # the option reached the loss the stage trained
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"] == {"distill": 2}
    card = (out / "model" / "README.md").read_text()
    assert "| candidates per query | 5: the teacher's top 3 and 2 sampled from its ranks 4-6 |" in card
    assert "| Margin-MSE weight | 0.5 |" in card


def test_deep_candidates_are_refused_where_they_cannot_work(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    with pytest.raises(ConfigError, match="distill_deep_depth 5 leaves no room"):
        RecipeConfig(distill_k=3, distill_deep=4, distill_deep_depth=5).validate()
    with pytest.raises(ConfigError, match="distill_deep must be"):
        RecipeConfig(distill_deep=-2).validate()
    with pytest.raises(ConfigError, match="distill_margin_weight"):
        RecipeConfig(distill_margin_weight=-0.5).validate()
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_side": "full", "distill_deep": 2}
    with pytest.raises(ConfigError, match="distill_deep 2 samples deep candidates for the query side"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "f", config=cfg)
    assert not (tmp_path / "f").exists()  # refused before any work
