"""The fusion rules' registry: a rule registered in one place (one function of the shared signature) is accepted by
the fusion settings, fused by the hybrid, fitted, saved and loaded, stated in the MTEB description and offered by the
command line's ``--fusion``, with no other file touched; gone again once unregistered."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hf_cocodr.cli.main import UsageError, build_parser
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.fusion import RULES, FusionConfig, convex, fuse, fusion_rule, unregister_rule
from hf_cocodr.retrieval.fusion_fit import fit_choice
from hf_cocodr.retrieval.hybrid import HybridRetriever

NAME = "minmax_again"
# the hand-made lists of test_hybrid_fit.py: dense ranks rows 0, 1, 2 (scores 3, 2, 1); BM25 ranks rows 2, 3 (10, 5)
D_ROWS, D_SCORES = np.array([0, 1, 2]), np.array([3.0, 2.0, 1.0])
B_ROWS, B_SCORES = np.array([2, 3]), np.array([10.0, 5.0])


@pytest.fixture
def minmax_rule():
    """A new rule, ``"convex"`` with min-max normalisation whatever ``normalize`` says (so it reads only
    ``bm25_zeros``), registered for one test."""

    @fusion_rule(NAME, settings=("bm25_zeros",))
    def minmax_again(dense_scores, bm25_scores, fusion):
        return convex(dense_scores, bm25_scores, replace(fusion, normalize="minmax"))

    try:
        yield NAME
    finally:
        unregister_rule(NAME)


def _parse(rule: str):
    argv = ["evaluate", "model", "data", "--hybrid", "--fusion", rule]
    return build_parser(argv).parse_args(argv)


def test_an_unregistered_rule_is_refused_everywhere():
    assert NAME not in RULES
    with pytest.raises(ConfigError, match="fusion rule must be one of"):
        FusionConfig(rule=NAME)
    with pytest.raises(UsageError, match="invalid choice"):
        _parse(NAME)
    assert _parse("rrf").fusion == "rrf"


def test_a_registered_rule_fuses_as_what_it_computes(minmax_rule):
    for w in (0.0, 0.3, 0.55, 1.0):
        rows, scores = fuse(D_ROWS, D_SCORES, B_ROWS, B_SCORES, FusionConfig(rule=minmax_rule, dense_weight=w), 4)
        want = fuse(D_ROWS, D_SCORES, B_ROWS, B_SCORES, FusionConfig(normalize="minmax", dense_weight=w), 4)
        assert rows.tolist() == want[0].tolist() and np.array_equal(scores, want[1])
    # min-max by hand at w = 0.5: dense (1, 0.5, 0), BM25 (1, 0) with rows 0 and 1 at 0 (BM25 did not return them)
    rows, scores = fuse(D_ROWS, D_SCORES, B_ROWS, B_SCORES, FusionConfig(rule=minmax_rule, dense_weight=0.5), 4)
    assert rows.tolist() == [0, 2, 1, 3]
    np.testing.assert_allclose(scores, [0.5, 0.5, 0.25, 0.0])


def test_a_registered_rule_is_fitted_and_offered_by_the_command_line(minmax_rule):
    assert _parse(minmax_rule).fusion == minmax_rule
    rankings = [(D_ROWS, D_SCORES, B_ROWS, B_SCORES, t) for t in (0, 2, 3)]
    norm, w, curves = fit_choice(rankings, FusionConfig(rule=minmax_rule))
    want_norm, want_w, want_curves = fit_choice(rankings, FusionConfig(normalize="minmax"))
    assert w == want_w and list(curves.values()) == list(want_curves.values())
    assert len(curves) == 1  # it reads no normalisation: only its weight is searched
    assert FusionConfig(rule=minmax_rule, dense_weight=w, normalize=norm).normalize == "z"  # as "rrf" today


def test_a_registered_rule_runs_in_the_hybrid_saved_loaded_and_described(
    minmax_rule, tiny_st_dir, tiny_beir, tmp_path
):
    from hf_cocodr.evaluation.mteb.hybrid import describe_fusion

    hybrid = HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"rule": minmax_rule, "dense_weight": 0.4})
    queries = ["first passage", "a query about the second document"]
    ids, scores = hybrid.search(queries, k=5)
    hybrid.fusion = FusionConfig(normalize="minmax", dense_weight=0.4)
    assert hybrid.search(queries, k=5) == (ids, scores)
    hybrid.fusion = FusionConfig(rule=minmax_rule, dense_weight=0.4)
    hybrid.save(tmp_path / "saved")
    loaded = HybridRetriever.load(tmp_path / "saved")
    assert loaded.fusion.rule == minmax_rule and loaded.search(queries, k=5) == (ids, scores)
    assert describe_fusion(loaded.fusion) == {
        "rule": minmax_rule,
        "depth": 200,
        "bm25_zeros": True,
        "dense_weight": 0.4,
    }


def test_a_rule_is_registered_once_with_settings_that_exist(minmax_rule):
    with pytest.raises(ValueError, match="registered already"):
        fusion_rule(minmax_rule)(lambda dense_scores, bm25_scores, fusion: None)
    with pytest.raises(ValueError, match="no FusionConfig fields"):
        fusion_rule("other", settings=("temperature",))
    assert "other" not in RULES
