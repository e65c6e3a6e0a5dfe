"""The label-free fitted fusion: the normalisation and the weight picked from hand-made rankings, the pseudo-queries
drawn from a corpus, that no judgment is read, and that the fitted fusion travels with a saved retriever and the
evaluation JSON (and a fusion saved by an earlier version still loads)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval import fusion_fit
from hf_cocodr.retrieval.fusion import FIT, FusionConfig, fuse, normalized
from hf_cocodr.retrieval.fusion_fit import (
    FIT_GRID,
    KEEP_SHARES,
    fit_choice,
    is_fit_of,
    keep_share_for,
    pseudo_queries,
)
from hf_cocodr.retrieval.hybrid import HybridRetriever
from hf_cocodr.retrieval.pseudo_queries import bm25_top_z

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
    norm, w, curves = fit_choice([_pseudo(0), _pseudo(3)], cfg, within_one_se=False)  # the peak
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
    _, w, curves = fit_choice([_pseudo(3)], cfg)  # one pseudo-query: no standard error, the peak
    assert w == 0.2 and curves["z"][0.2] == pytest.approx(GAIN[2]) and curves["z"][0.25] == pytest.approx(GAIN[3])


def test_the_choice_walks_from_the_peak_toward_half_while_within_one_standard_error():
    cfg = FusionConfig(depth=10, normalize="z")
    # row 2 (BM25's first) is first while w < 3 / 5.4495 = 0.5505, then second. Targets 0, 0, 3, 2:
    #   w in [0.35, 0.55]: gains (GAIN2, GAIN2, GAIN4, 1)    w in [0.6, 0.7]: (1, 1, GAIN4, GAIN2), the peak
    # per-query differences at 0.5 from the peak: (a, a, 0, -a), a = 1 - GAIN2 = 0.3691: mean a / 4 = 0.0923, sample
    # std a * sqrt(((3/4)² · 2 + (1/4)² + (5/4)²) / 3) = 0.9574 a, standard error 0.9574 a / 2 = 0.1767 >= 0.0923
    rankings = [_pseudo(0), _pseudo(0), _pseudo(3), _pseudo(2)]
    assert fit_choice(rankings, cfg, within_one_se=False)[1] == 0.6
    norm, w, curves = fit_choice(rankings, cfg)
    assert (norm, w) == ("z", 0.5)  # 0.55 gives what 0.5 gives: the walk from 0.6 passes it and reaches 0.5
    np.testing.assert_allclose(curves["z"][0.6] - curves["z"][0.5], (1 - GAIN[2]) / 4)
    # ten of row 0 and nine of row 3: at 0.5 the differences are a (ten times) and 0: mean 10 a / 19 = 0.1943, standard
    # error a sqrt(10 · 9 / 19²  · 19 / 18) / sqrt(19) = 0.0434: outside; every weight below 0.6 is further: the peak
    many = [_pseudo(0)] * 10 + [_pseudo(3)] * 9
    assert fit_choice(many, cfg)[1] == fit_choice(many, cfg, within_one_se=False)[1] == 0.6
    # the walk stops at the first weight beyond one standard error, even where a further one is within it. Row 1 is
    # fourth below w = 0.3101 (BM25's row 3 and row 0 above it), third up to 0.71. Targets 1, 1, 1, 2, 3, 3:
    #   w in [0, 0.2]: (G4, G4, G4, 1, G2, G2), mean 0.5923, the peak (0.2 nearest 0.5)
    #   w in [0.25, 0.3]: row 3 drops to third: (G4, G4, G4, 1, G3, G3), mean 0.5487; differences (0, 0, 0, 0, b, b),
    #     b = G2 - G3 = 0.1309: mean 0.0436 > standard error 0.0276
    #   w in [0.35, 0.55]: (G3, G3, G3, 1, G4, G4), mean 0.5602; differences (-c, -c, -c, 0, d, d), c = G3 - G4 =
    #     0.0693, d = G2 - G4 = 0.2002: mean 0.0321 <= standard error 0.0543, within it, but never reached
    uneven = [_pseudo(1)] * 3 + [_pseudo(2)] + [_pseudo(3)] * 2
    details: dict = {}
    assert fit_choice(uneven, cfg, details=details)[:2] == ("z", 0.2)
    within = details["within_one_se"]["z"]
    assert 0.2 in within and 0.25 not in within and 0.3 not in within and 0.35 in within and 0.5 in within
    assert details["peak"] == {"normalize": "z", "dense_weight": 0.2, "ndcg_at_10": 0.5923}


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
    norm, w, curves = fit_choice([_pseudo(2), SECOND], FusionConfig(depth=10), within_one_se=False)  # the peak
    assert (norm, w) == ("minmax", 0.45)
    # one step from it, at 0.5, min-max puts row 2 second (it ties row 0, which the dense rank puts first) and keeps
    # row 0 third: per-query differences (1 - 1/log2 3, 0), and one non-zero difference of two has a mean equal to its
    # standard error, so the walk reaches 0.5 keeping the peak's normalisation
    assert fit_choice([_pseudo(2), SECOND], FusionConfig(depth=10))[:2] == ("minmax", 0.5)
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
    checks = {"checks": fusion_fit.FIT_CHECKS}
    fitted = FusionConfig(
        depth=20, dense_weight=0.3, normalize="minmax", fit={"fitted": ["normalize", "dense_weight"], **checks}
    )
    assert is_fit_of(fitted, asked)
    assert not is_fit_of(fitted, FusionConfig(depth=30))  # other settings
    assert not is_fit_of(fitted, FusionConfig(depth=20, normalize="z"))  # the rule given: only the weight to fit
    # an earlier version's fit: z-scores, the weight alone
    old = FusionConfig(depth=20, dense_weight=0.3, normalize=True, fit={"method": "...", **checks})
    assert is_fit_of(old, FusionConfig(depth=20, normalize="z")) and not is_fit_of(old, asked)
    # a fit made before the checks that leave one system to rank alone is made again, not reused
    unchecked = replace(fitted, fit={"fitted": ["normalize", "dense_weight"]})
    assert not is_fit_of(unchecked, asked)
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


def test_the_words_a_share_keeps_in_the_document_are_kept_at_every_larger_share():
    texts = [
        "The first sentence of this document has quite a few words in it. A second sentence follows it here. End.",
        "Another document starts with a long opening sentence about many things. Then it closes with one more line.",
        "Short one. The middle sentence of the third document is the longest of them all by far. Last words here.",
    ]
    plain = pseudo_queries(texts, n=10, seed=3)
    assert pseudo_queries(texts, n=10, seed=3, keep_share=0.0) == plain
    shares = (0.25, 0.5, 1.0)
    at = {f: pseudo_queries(texts, n=10, seed=3, keep_share=f) for f in shares}
    for i, (row, query, rest) in enumerate(plain):
        full = at[1.0][i][2].split()  # the whole sentence stays: the document, word for word
        assert at[1.0][i][:2] == (row, query) and full == texts[row].split()
        words = query.split()
        start = next(j for j in range(len(full)) if full[j : j + len(words)] == words)
        before, after = full[:start], full[start + len(words) :]
        assert rest.split() == before + after
        kept = {}
        for f in shares:
            got = at[f][i][2].split()
            assert got[: len(before)] == before and got[len(got) - len(after) :] == after
            kept[f] = got[len(before) : len(got) - len(after)]
        # each share's words are a subsequence of the next share's, in the sentence's order
        for small, big in ((0.25, 0.5), (0.5, 1.0)):
            it = iter(kept[big])
            assert all(w in it for w in kept[small])


def test_bm25_top_z_and_the_keep_share_by_hand():
    # [4, 2, 0, 0]: mean 1.5, variance (2.5² + 0.5² + 1.5² + 1.5²) / 4 = 2.75; a constant list stands out nowhere
    np.testing.assert_allclose(
        bm25_top_z(np.array([[4.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])), [2.5 / 2.75**0.5, 0]
    )
    # the share whose pseudo-queries' median is nearest the queries' among those tried; equal distances: the smaller
    assert keep_share_for({0.0: 4.4, 0.125: 5.0, 0.25: 5.5}, 5.64) == 0.25
    assert keep_share_for({0.0: 4.4, 0.125: 5.0, 0.25: 5.9}, 5.64) == 0.25
    assert keep_share_for({0.0: 4.0, 0.125: 5.0, 0.25: 6.0}, 5.5) == 0.125
    assert keep_share_for({0.0: 6.0}, 5.5) == 0.0


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
    assert fit["peak"]["ndcg_at_10"] == max(v for curve in grid.values() for v in curve.values())
    assert max(grid[fit["peak"]["normalize"]].values()) == fit["peak"]["ndcg_at_10"] >= grid[norm][f"{w:g}"]
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


@pytest.fixture(scope="module")
def worded_corpus(tmp_path_factory):
    """A corpus (JSONL) of 80 documents of three six-word sentences over 400 made-up words: a sentence shares few
    words with the rest of its document, so a sentence taken out of it is hard for BM25 and one left in it is easy."""
    rng = np.random.default_rng(0)
    vocab = [f"w{i}x" for i in range(400)]
    docs = []
    for i in range(80):
        sentences = [" ".join(rng.choice(vocab, 6)) + "." for _ in range(3)]
        docs.append({"_id": f"d{i}", "title": "", "text": " ".join(sentences)})
    path = tmp_path_factory.mktemp("worded") / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def _sentences_of(corpus, n):
    """Whole sentences of the corpus's documents: queries that copy its words, as SQuAD's questions do."""
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    return [t.split(". ")[1] for t in texts][:n]


def test_the_queries_set_the_share_of_words_kept(tiny_st_dir, worded_corpus):
    copying = _sentences_of(worded_corpus, 12)
    built = HybridRetriever.build(str(tiny_st_dir), worded_corpus, fusion={"depth": 20}, queries=copying)
    fit = built.fusion.fit
    medians = {float(f): m for f, m in fit["bm25_top_z_median"].items() if f != "queries"}
    target = fit["bm25_top_z_median"]["queries"]
    # whole copied sentences stand out in BM25 more than sentences taken out of their documents
    assert fit["real_queries"] == 12 and medians[0.0] < target and fit["keep_share"] > 0
    assert fit["keep_share"] == keep_share_for(medians, target) and max(medians.values()) >= target
    # the shares are tried in order and stop at the first that reaches the queries' median
    assert list(medians) == list(KEEP_SHARES[: len(medians)]) and all(m < target for m in list(medians.values())[:-1])
    # queries BM25 finds nothing for stand out nowhere (z 0): the plain inverse cloze, no other share tried
    unmatched = HybridRetriever.build(
        str(tiny_st_dir), worded_corpus, fusion={"depth": 20}, queries=["qqqq zzzz xxxx"] * 3
    )
    assert unmatched.fusion.fit["keep_share"] == 0.0 and list(unmatched.fusion.fit["bm25_top_z_median"]) == [
        "queries",
        "0",
    ]
    # without queries: the plain inverse cloze, the same fit as queries that ask for no share
    plain = HybridRetriever.build(str(tiny_st_dir), worded_corpus, fusion={"depth": 20})
    assert plain.fusion.fit["keep_share"] == 0.0 and "real_queries" not in plain.fusion.fit
    drop = ("real_queries", "bm25_top_z_median", "agreement")
    assert {k: v for k, v in unmatched.fusion.fit.items() if k not in drop} == plain.fusion.fit
    # (the tiny random model agrees with BM25 no more than chance on the pseudo-queries: nothing for the queries'
    # agreement to fall short of, the weight is the fit's)
    assert unmatched.fusion.fit["agreement"]["pseudo_queries"] < 0.05 and "ranks_alone" not in unmatched.fusion.fit
    assert (unmatched.fusion.dense_weight, unmatched.fusion.normalize) == (
        plain.fusion.dense_weight,
        plain.fusion.normalize,
    )


def test_the_fit_with_queries_reads_no_judgments(tiny_st_dir, no_qrels_beir, monkeypatch):
    from hf_cocodr.data import beir

    def refuse(*a, **k):
        raise AssertionError("the fit read qrels")

    monkeypatch.setattr(beir, "_parse_qrels", refuse)
    queries = [json.loads(line)["text"] for line in (no_qrels_beir / "queries.jsonl").read_text().splitlines()]
    built = HybridRetriever.build(str(tiny_st_dir), no_qrels_beir, fusion={"depth": 20}, queries=queries)
    assert built.fusion.fit["real_queries"] == len(queries) and not built.fusion.needs_fit


def test_a_fusion_left_to_fit_is_fitted_once_the_queries_are_known(tiny_st_dir, worded_corpus, tmp_path):
    queries = _sentences_of(worded_corpus, 6)
    later = HybridRetriever.build(str(tiny_st_dir), worded_corpus, fusion={"depth": 20}, fit=False)
    assert later.fusion.needs_fit
    with pytest.raises(ConfigError, match="not fitted"):
        later.save(tmp_path / "h")
    assert not (tmp_path / "h").exists()
    with pytest.raises(ConfigError, match="not fitted"):
        later.search(queries, k=3)
    fitted = later.fit_fusion(queries)
    now = HybridRetriever.build(str(tiny_st_dir), worded_corpus, fusion={"depth": 20}, queries=queries)
    assert fitted == now.fusion == later.fusion and later.search(queries, k=5) == now.search(queries, k=5)
    assert later.fit_fusion(["something else entirely"]) == fitted  # fitted once: a later call changes nothing


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


def test_the_recipes_saved_retriever_is_calibrated_to_the_target_queries_of_its_corpus(
    tiny_st_dir, tiny_beir, tmp_path
):
    """A target corpus whose folder also gave ``--target-queries`` (``DIR:SPLIT``, however spelled) gets a fusion
    calibrated to those queries; queries from another folder calibrate nothing."""
    from types import SimpleNamespace

    from hf_cocodr import load_encoder
    from hf_cocodr.data.target_queries import read_target_queries
    from hf_cocodr.recipe.runner import _save_hybrids

    model = load_encoder(str(tiny_st_dir))
    other = tmp_path / "other"
    shutil.copytree(tiny_beir, other)
    for name, specs in (("own", [f"{tiny_beir / 'qrels' / '..'}:train"]), ("other", [f"{other}:train"])):
        out = tmp_path / f"out-{name}"
        out.mkdir()
        cfg = SimpleNamespace(eval_batch_size=16, target_queries=specs)
        _save_hybrids(SimpleNamespace(target_corpora=[str(tiny_beir)], out=out, cfg=cfg), model)
        fit = HybridRetriever.load(out / "hybrid" / tiny_beir.name).fusion.fit
        if name == "own":
            assert fit["real_queries"] == len(read_target_queries(f"{tiny_beir}:train").texts) > 0
        else:
            assert "real_queries" not in fit and fit["keep_share"] == 0.0
