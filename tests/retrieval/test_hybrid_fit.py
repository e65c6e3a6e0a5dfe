"""The label-free fitted fusion: the weight picked from hand-made rankings, the pseudo-queries drawn from a corpus,
that no judgment is read, and that the fitted weight travels with a saved retriever and the evaluation JSON."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.fusion import FIT, FusionConfig, fit_dense_weight, fuse, pseudo_queries
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
    cfg = FusionConfig(depth=10)
    w, curve = fit_dense_weight([_pseudo(0), _pseudo(3)], cfg)
    # w >= 0.6: row 0 first, row 3 fourth: (1 + 1/log2 5) / 2, the best; of the equal weights 0.6 is nearest 0.5
    assert w == 0.6
    np.testing.assert_allclose(curve[0.6], (GAIN[1] + GAIN[4]) / 2)
    np.testing.assert_allclose(curve[1.0], (GAIN[1] + GAIN[4]) / 2)
    np.testing.assert_allclose(curve[0.1], (GAIN[3] + GAIN[2]) / 2)  # row 0 third, row 3 second
    np.testing.assert_allclose(curve[0.25], (GAIN[2] + GAIN[3]) / 2)  # row 0 second, row 3 third
    np.testing.assert_allclose(curve[0.4], (GAIN[2] + GAIN[4]) / 2)
    # a document only BM25 finds well: weights 0 to 0.2 keep it second; 0.2 is the one nearest 0.5
    w, curve = fit_dense_weight([_pseudo(3)], cfg)
    assert w == 0.2 and curve[0.2] == pytest.approx(GAIN[2]) and curve[0.25] == pytest.approx(GAIN[3])


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
    w = built.fusion.dense_weight
    assert isinstance(w, float) and 0.0 <= w <= 1.0
    fit = built.fusion.fit
    assert fit["pseudo_queries"] >= 8 and fit["grid_ndcg_at_10"][f"{w:g}"] == max(fit["grid_ndcg_at_10"].values())
    built.save(tmp_path / "h")
    saved = json.loads((tmp_path / "h" / "hybrid.json").read_text())
    assert saved["fusion"]["dense_weight"] == w and saved["fusion"]["fit"] == fit
    again = HybridRetriever.load(tmp_path / "h")
    assert again.fusion == built.fusion
    queries = ["cardiac artery blood pressure", "neuron cortex memory"]
    assert again.search(queries, k=5) == built.search(queries, k=5)
    # a weight given by hand is used as is, with no fit
    fixed = HybridRetriever.build(str(tiny_st_dir), no_qrels_beir, fusion={"depth": 20, "dense_weight": 0.3})
    assert fixed.fusion.dense_weight == 0.3 and fixed.fusion.fit is None


def test_evaluate_hybrid_shows_the_fitted_weight_and_dense_weight_overrides_it(tiny_st_dir, tiny_beir, capsys):
    from hf_cocodr.cli import main

    args = ["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--hybrid"]
    assert main(args) == 0
    fusion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fusion"]
    assert isinstance(fusion["dense_weight"], float) and fusion["fit"]["pseudo_queries"] >= 8
    assert main([*args, "--dense-weight", "0.7"]) == 0
    fusion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fusion"]
    assert fusion["dense_weight"] == 0.7 and fusion["fit"] is None
