"""The label-free fitted fusion: the normalisation and the weight picked from hand-made rankings, the pseudo-queries
drawn from a corpus, that no judgment is read, and that the fitted fusion travels with a saved retriever and the
evaluation JSON (and a fusion saved by an earlier version still loads)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.fusion import (
    FIT,
    FIT_GRID,
    FusionConfig,
    fit_choice,
    fuse,
    is_fit_of,
    normalized,
    pseudo_queries,
)
from hf_cocodr.retrieval.hybrid import HybridRetriever

# the lists of tests/test_hybrid.py: dense ranks rows 0, 1, 2 (scores 3, 2, 1); BM25 ranks rows 2, 3 (scores 10, 5).
# z-scores: dense (z, 0, -z) with z = sqrt(1.5), row 3 at -z - 1; BM25 (1, -1), rows 0 and 1 at -2. Fused at w:
#   row 0: 3.2247 w - 2    row 1: 2 w - 2    row 2: 1 - 2.2247 w    row 3: -1.2247 w - 1
# so row 0 is first once w > 3 / 5.4495 = 0.5505, second from w > 0.2247 (behind row 2), else third;
# row 3 is second below w = 0.2247, third up to w = 1 / 3.2247 = 0.3101, fourth above.
D_ROWS, D_SCORES = np.array([0, 1, 2]), np.array([3.0, 2.0, 1.0])
B_ROWS, B_SCORES = np.array([2, 3]), np.array([10.0, 5.0])
GAIN = {1: 1.0, 2: 1 / np.log2(3), 3: 0.5, 4: 1 / np.log2(5)}  # nDCG@10 of one relevant document at rank r


def _pseudo(target):
    return (D_ROWS, D_SCORES, B_ROWS, B_SCORES, target)


def test_the_fitted_weight_of_hand_made_rankings_is_the_hand_computed_one():
    cfg = FusionConfig(depth=10, normalize="z")  # the weight alone is fitted
    norm, w, curves = fit_choice([_pseudo(0), _pseudo(3)], cfg)
    assert norm == "z" and list(curves) == ["z"]
    curve = curves["z"]
    # w >= 0.6: row 0 first, row 3 fourth: (1 + 1/log2 5) / 2, the best; of the equal weights 0.6 is nearest 0.5
    assert w == 0.6
    np.testing.assert_allclose(curve[0.6], (GAIN[1] + GAIN[4]) / 2)
    np.testing.assert_allclose(curve[1.0], (GAIN[1] + GAIN[4]) / 2)
    np.testing.assert_allclose(curve[0.1], (GAIN[3] + GAIN[2]) / 2)  # row 0 third, row 3 second
    np.testing.assert_allclose(curve[0.25], (GAIN[2] + GAIN[3]) / 2)  # row 0 second, row 3 third
    np.testing.assert_allclose(curve[0.4], (GAIN[2] + GAIN[4]) / 2)
    # a document only BM25 finds well: weights 0 to 0.2 keep it second; 0.2 is the one nearest 0.5
    _, w, curves = fit_choice([_pseudo(3)], cfg)
    assert w == 0.2 and curves["z"][0.2] == pytest.approx(GAIN[2]) and curves["z"][0.25] == pytest.approx(GAIN[3])


def test_min_max_and_dbsf_normalisations_by_hand():
    # min-max: (s - min) / (max - min); a missing candidate scores 0, as the last one does
    np.testing.assert_allclose(normalized(D_SCORES, "minmax")[0], [1.0, 0.5, 0.0])
    assert normalized(D_SCORES, "minmax")[1] == 0.0
    # dbsf over (3, 2, 1): mean 2, std s = sqrt(2/3); (x - (2 - 3s)) / 6s, clipped to [0, 1]
    s = np.sqrt(2 / 3)
    np.testing.assert_allclose(normalized(D_SCORES, "dbsf")[0], [(1 + 3 * s) / (6 * s), 0.5, (3 * s - 1) / (6 * s)])
    # BM25 (10, 5): mean 7.5, std 2.5: (x - 0) / 15
    np.testing.assert_allclose(normalized(B_SCORES, "dbsf")[0], [2 / 3, 1 / 3])
    # z-scores: the missing value one standard deviation (of the z-scores: 1) below the last
    z, missing = normalized(D_SCORES, "z")
    np.testing.assert_allclose(z, [np.sqrt(1.5), 0.0, -np.sqrt(1.5)])
    assert missing == pytest.approx(-np.sqrt(1.5) - 1)
    # equal scores: 0.5 each for min-max and dbsf (as mteb), 0 for z-scores
    same = np.array([2.0, 2.0])
    assert normalized(same, "minmax")[0].tolist() == [0.5, 0.5] == normalized(same, "dbsf")[0].tolist()
    assert normalized(same, "z")[0].tolist() == [0.0, 0.0]
    # fused by min-max at w: row 0: w, row 1: w / 2, row 2: 1 - w, row 3: 0 (in BM25's list at its minimum)
    rows, scores = fuse(D_ROWS, D_SCORES, B_ROWS, B_SCORES, FusionConfig(dense_weight=0.4, normalize="minmax"), 4)
    assert rows.tolist() == [2, 0, 1, 3]
    np.testing.assert_allclose(scores, [0.6, 0.4, 0.2, 0.0], atol=1e-7)


# A second pseudo-query: dense ranks rows 1, 0, 3 (scores 5, 1, 0), BM25 rows 2, 3 (scores 10, 5); its target is row 0.
# With the first lists' target row 2, by hand (w on the grid 0, 0.05, ..., 1):
# - min-max: first lists: row 0: w, row 1: w/2, row 2: 1 - w, row 3: 0, so row 2 is first for w < 0.5 (at 0.5 it ties
#   row 0, which the dense rank puts first); second lists: row 1: w, row 0: w/5, row 3: 0, row 2: 1 - w, so row 0 is
#   third below w = 5/6 and second above. Best: w <= 0.45, (1 + 1/2) / 2 = 0.75; above 5/6 only (1/2 + 1/log2 3) / 2.
# - z-scores: first lists: row 2 first for w < 0.5505 (see above); second lists (dense mean 2, std sqrt(14/3)):
#   row 1: 3.3887 w - 2, row 0: 1.5371 w - 2, row 3: 0.0742 w - 1, row 2: 1 - 2.9258 w, so row 0 is fourth below
#   w = 0.6722, second from w = 0.6836. Best: w <= 0.55, (1 + 1/log2 5) / 2 = 0.7153.
# - dbsf: first lists: row 0: 0.7041 w, row 1: w/2, row 2: 0.6667 - 0.3708 w, row 3: (1 - w) / 3, so row 2 is first
#   below w = 0.6202; second lists: row 1: 0.7315 w, row 0: 0.4229 w, row 3: 0.3333 + 0.0124 w, row 2: 0.6667 (1 - w),
#   so row 0 is fourth below w = 0.6119. Best: w <= 0.6, 0.7153.
SECOND = (np.array([1, 0, 3]), np.array([5.0, 1.0, 0.0]), B_ROWS, B_SCORES, 0)


def test_the_fitted_normalisation_of_hand_made_rankings_is_the_hand_computed_one():
    norm, w, curves = fit_choice([_pseudo(2), SECOND], FusionConfig(depth=10))
    assert (norm, w) == ("minmax", 0.45)
    assert list(curves) == ["z", "minmax", "dbsf"]
    best = {n: max(c.values()) for n, c in curves.items()}
    np.testing.assert_allclose([best["minmax"], best["z"], best["dbsf"]], [0.75, (1 + GAIN[4]) / 2, (1 + GAIN[4]) / 2])
    assert [w for w, v in curves["minmax"].items() if v == pytest.approx(0.75)] == list(FIT_GRID[:10])  # 0 to 0.45
    np.testing.assert_allclose(curves["minmax"][0.9], (GAIN[3] + GAIN[2]) / 2)
    assert curves["z"][0.55] == best["z"] and curves["z"][0.6] == pytest.approx((GAIN[2] + GAIN[4]) / 2)
    assert curves["dbsf"][0.6] == best["dbsf"] and curves["dbsf"][0.65] < best["dbsf"]
    # equal bests go to the first normalisation: BM25's row 3 is second under z-scores up to w 0.2 and under dbsf up
    # to w 0.3 (row 3: (1 - w) / 3 against row 0: 0.7041 w), never under min-max (it sits at 0, as rows 0 and 1 do at
    # w = 0, and the dense rank puts them first): z-scores, at 0.2
    norm, w, curves = fit_choice([_pseudo(3)], FusionConfig(depth=10))
    assert (norm, w) == ("z", 0.2)
    assert max(curves["dbsf"].values()) == pytest.approx(GAIN[2]) and curves["dbsf"][0.3] == pytest.approx(GAIN[2])
    assert max(curves["minmax"].values()) == pytest.approx(GAIN[4])


def test_a_fusion_saved_by_an_earlier_version_reads_as_z_scores():
    assert FusionConfig(dense_weight=0.4, normalize=True).normalize == "z"
    assert FusionConfig(dense_weight=0.4, normalize=False).normalize == "none"
    # before the normalisation was fitted, a fusion with a weight had no other rule
    assert FusionConfig(dense_weight=0.4).normalize == "z" and FusionConfig().normalize == FIT
    with pytest.raises(ConfigError, match="normalize"):
        FusionConfig(normalize="l2")


def test_a_cached_fit_stands_for_the_fit_asked_only_when_it_fitted_the_same_things():
    asked = FusionConfig(depth=20)
    fitted = FusionConfig(
        depth=20, dense_weight=0.3, normalize="minmax", fit={"fitted": ["normalize", "dense_weight"]}
    )
    assert is_fit_of(fitted, asked)
    assert not is_fit_of(fitted, FusionConfig(depth=30))  # other settings
    assert not is_fit_of(fitted, FusionConfig(depth=20, normalize="z"))  # the rule given: only the weight to fit
    # an earlier version's fit: z-scores, the weight alone
    old = FusionConfig(depth=20, dense_weight=0.3, normalize=True, fit={"method": "..."})
    assert is_fit_of(old, FusionConfig(depth=20, normalize="z")) and not is_fit_of(old, asked)
    assert not is_fit_of(FusionConfig(depth=20, dense_weight=0.3), asked)  # given by hand: nothing was fitted


def test_an_unfitted_weight_cannot_fuse_and_bad_weights_are_refused():
    assert FusionConfig().dense_weight == FIT and FusionConfig().needs_fit
    with pytest.raises(ConfigError, match="not fitted"):
        fuse(D_ROWS, D_SCORES, B_ROWS, B_SCORES, FusionConfig(), 3)
    for bad in ("fitted", -0.1, None):
        with pytest.raises(ConfigError, match="dense_weight"):
            FusionConfig(dense_weight=bad)


def test_pseudo_queries_are_one_sentence_and_the_rest_of_its_document():
    texts = [
        "Only one sentence here with words.",
        "First sentence has five words. Second one is also long enough! Tiny.",
        "Alpha beta gamma delta. Epsilon zeta eta theta?",
    ]
    picks = pseudo_queries(texts, n=10, seed=3)
    assert sorted(p[0] for p in picks) == [1, 2]  # the one-sentence document gives none
    for row, query, rest in picks:
        sentences = {1: ["First sentence has five words.", "Second one is also long enough!", "Tiny."]}.get(
            row, ["Alpha beta gamma delta.", "Epsilon zeta eta theta?"]
        )
        assert query in sentences and query != "Tiny."  # under 4 words: never a query
        assert rest == " ".join(s for s in sentences if s != query)
    assert pseudo_queries(texts, n=10, seed=3) == picks and len(pseudo_queries(texts, n=1, seed=3)) == 1


@pytest.fixture(scope="module")
def no_qrels_beir(tiny_beir, tmp_path_factory):
    """The tiny BEIR folder whose qrels files cannot be read (each is a folder: opening it raises)."""
    folder = tmp_path_factory.mktemp("noqrels") / "beir"
    shutil.copytree(tiny_beir, folder)
    for f in (folder / "qrels").glob("*.tsv"):
        f.unlink()
        f.mkdir()
    return folder


def test_the_fit_reads_no_judgments_and_the_fitted_weight_survives_save_and_load(
    tiny_st_dir, no_qrels_beir, tmp_path, monkeypatch
):
    from hf_cocodr.data import beir

    def refuse(*a, **k):
        raise AssertionError("the fit read qrels")

    monkeypatch.setattr(beir, "_parse_qrels", refuse)
    built = HybridRetriever.build(str(tiny_st_dir), no_qrels_beir, fusion={"depth": 20})
    w, norm = built.fusion.dense_weight, built.fusion.normalize
    assert isinstance(w, float) and 0.0 <= w <= 1.0 and norm in ("z", "minmax", "dbsf")
    fit = built.fusion.fit
    grid = fit["grid_ndcg_at_10"]
    assert fit["pseudo_queries"] >= 8 and fit["fitted"] == ["normalize", "dense_weight"]
    assert list(grid) == ["z", "minmax", "dbsf"]
    assert grid[norm][f"{w:g}"] == max(v for curve in grid.values() for v in curve.values())
    built.save(tmp_path / "h")
    saved = json.loads((tmp_path / "h" / "hybrid.json").read_text())
    assert (
        saved["fusion"]["dense_weight"] == w and saved["fusion"]["normalize"] == norm and saved["fusion"]["fit"] == fit
    )
    again = HybridRetriever.load(tmp_path / "h")
    assert again.fusion == built.fusion
    queries = ["cardiac artery blood pressure", "neuron cortex memory"]
    assert again.search(queries, k=5) == built.search(queries, k=5)
    # a retriever saved by an earlier version (normalize true, or no normalize at all; no bm25_zeros) loads as it
    # fused then: z-scores of BM25's hits alone
    then = FusionConfig(dense_weight=w, depth=20, normalize="z", bm25_zeros=False)
    as_then = HybridRetriever(built.model, built.doc_ids, built.embeddings, built.bm25, then, built.meta)
    for old in ({"normalize": True}, {}):
        fusion = {k: v for k, v in saved["fusion"].items() if k not in ("normalize", "fit", "bm25_zeros")} | old
        (tmp_path / "h" / "hybrid.json").write_text(json.dumps({**saved, "fusion": fusion}))
        loaded = HybridRetriever.load(tmp_path / "h")
        assert loaded.fusion == then and loaded.search(queries, k=5) == as_then.search(queries, k=5)
    # a weight given by hand is used as is, with no fit
    fixed = HybridRetriever.build(str(tiny_st_dir), no_qrels_beir, fusion={"depth": 20, "dense_weight": 0.3})
    assert fixed.fusion.dense_weight == 0.3 and fixed.fusion.normalize == "z" and fixed.fusion.fit is None
    # a rule given by hand: only the weight is fitted
    given = HybridRetriever.build(str(tiny_st_dir), no_qrels_beir, fusion={"depth": 20, "normalize": "dbsf"})
    assert given.fusion.normalize == "dbsf" and list(given.fusion.fit["grid_ndcg_at_10"]) == ["dbsf"]
    assert given.fusion.fit["fitted"] == ["dense_weight"]


def test_evaluate_hybrid_shows_the_fitted_weight_and_dense_weight_overrides_it(tiny_st_dir, tiny_beir, capsys):
    from hf_cocodr.cli import main

    args = ["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--hybrid"]
    assert main(args) == 0
    fusion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fusion"]
    assert isinstance(fusion["dense_weight"], float) and fusion["fit"]["pseudo_queries"] >= 8
    assert fusion["normalize"] in ("z", "minmax", "dbsf")
    assert main([*args, "--dense-weight", "0.7"]) == 0
    fusion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fusion"]
    assert fusion["dense_weight"] == 0.7 and fusion["normalize"] == "z" and fusion["fit"] is None
    assert main([*args, "--dense-weight", "0.7", "--fusion-normalize", "minmax"]) == 0
    fusion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fusion"]
    assert fusion["dense_weight"] == 0.7 and fusion["normalize"] == "minmax" and fusion["fit"] is None


def test_bm25s_zeros_are_normalised_with_its_hits_but_never_candidates():
    # BM25's top 4 as the index returns it: two hits, then two documents without a query term (score 0)
    b_rows, b_scores = np.array([2, 3, 4, 5]), np.array([10.0, 5.0, 0.0, 0.0])
    at = FusionConfig(dense_weight=0.4, normalize="minmax")
    # min-max over (10, 5, 0, 0): rows 2, 3 at 1, 0.5, every other document at 0 (its BM25 score); fused at 0.4:
    # row 0: 0.4, row 1: 0.2, row 2: 0.6, row 3: 0.5 * 0.6 = 0.3
    rows, scores = fuse(D_ROWS, D_SCORES, b_rows, b_scores, at, 10)
    assert rows.tolist() == [2, 0, 3, 1]
    np.testing.assert_allclose(scores, [0.6, 0.4, 0.3, 0.2], atol=1e-7)
    # without: the hits alone are normalised (row 3 at 0, as a missing document), as a fusion saved earlier did
    old = FusionConfig(dense_weight=0.4, normalize="minmax", bm25_zeros=False)
    rows, scores = fuse(D_ROWS, D_SCORES, b_rows, b_scores, old, 10)
    assert rows.tolist() == [2, 0, 1, 3]
    np.testing.assert_allclose(scores, [0.6, 0.4, 0.2, 0.0], atol=1e-7)
    assert [r.tolist() for r in fuse(D_ROWS, D_SCORES, b_rows[:2], b_scores[:2], at, 10)] == [
        r.tolist() for r in fuse(D_ROWS, D_SCORES, b_rows, b_scores, old, 10)
    ]
    # z-scores over (10, 5, 0, 0): mean 3.75, std sqrt(17.1875); at w = 0 the documents BM25 did not return sit at
    # z(0), in the dense order
    std = np.sqrt(17.1875)
    rows, scores = fuse(D_ROWS, D_SCORES, b_rows, b_scores, FusionConfig(dense_weight=0.0, normalize="z"), 10)
    assert rows.tolist() == [2, 3, 0, 1]
    np.testing.assert_allclose(scores, np.array([6.25, 1.25, -3.75, -3.75]) / std, rtol=1e-6)


@pytest.mark.parametrize("rule", ["convex", "rrf"])
def test_the_fits_curves_are_the_mean_ndcg_of_fuses_rankings(rule):
    """fit_choice scores every weight at once; each value is what ranking with :func:`fuse` at that weight gives
    (ties, BM25 zeros and targets neither system returned included)."""
    rng = np.random.default_rng(5)
    rankings = []
    for _ in range(30):
        d_rows = rng.choice(25, 12, replace=False)
        d_scores = np.sort(rng.integers(0, 6, 12).astype(float))[::-1]  # ties
        b_rows = rng.choice(25, 12, replace=False)
        b_scores = np.sort(np.maximum(rng.integers(-4, 9, 12), 0).astype(float))[::-1]  # zeros at the tail
        rankings.append((d_rows, d_scores, b_rows, b_scores, int(rng.integers(25))))
    fusion = FusionConfig(rule=rule, depth=12)
    _, _, curves = fit_choice(rankings, fusion)
    for norm, curve in curves.items():
        for w, value in curve.items():
            cfg = FusionConfig(rule=rule, dense_weight=w, normalize=norm if rule == "convex" else "z", depth=12)
            gains = []
            for d_rows, d_scores, b_rows, b_scores, target in rankings:
                rows, _ = fuse(d_rows, d_scores, b_rows, b_scores, cfg, 10)
                hit = np.flatnonzero(rows == target)
                gains.append(1.0 / np.log2(hit[0] + 2.0) if hit.size else 0.0)
            assert value == pytest.approx(np.mean(gains), abs=1e-12), (norm, w)
