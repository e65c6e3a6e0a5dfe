"""The held-out cloze readings the recipe's guard rests on: the dropped words by hand, the view of the corpus with the
held-out documents replaced by their rests (equal to searching a copy of the corpus so edited), and a model that is
better on crops of its documents but worse on clozes (a lexical model against a semantic one) refused."""

from __future__ import annotations

import numpy as np
import tiny

from hf_cocodr.recipe.guard import decide
from hf_cocodr.retrieval.fusion import FusionConfig, fuse
from hf_cocodr.retrieval.held_out import HeldOutView, draw_clozes, drop_shared_words, ndcg_of_target, paired
from hf_cocodr.retrieval.pseudo_queries import PseudoQueryDrawer


class _AllDrawn:
    """A generator whose every draw is 0 (below any share: every shared content word is dropped at share > 0)."""

    def random(self):
        return 0.0


def test_the_dropped_sentence_loses_the_content_words_its_rest_holds_and_keeps_the_rest():
    rest = "Patients were treated with statins. The trial ended early."
    sentence = "Statins lowered cholesterol in the treated patients."
    # "Statins", "treated" and "patients." share their stems with the rest (statin, treat, patient); "in" and "the"
    # are stop words and stay, and so do the words the rest lacks
    assert drop_shared_words(sentence, rest, 1.0, _AllDrawn()) == "lowered cholesterol in the"
    assert drop_shared_words(sentence, rest, 0.0, np.random.default_rng(0)) == sentence


def test_a_cloze_is_a_sentence_and_the_rest_of_its_document_and_a_document_of_one_sentence_gives_none():
    texts = [
        "One single sentence with many words here.",
        "First sentence about coral reefs. Second sentence about tides.",
    ]
    clozes = draw_clozes(["a", "b"], texts, [0, 1], seed=3, drop_share=0.0)
    (c,) = clozes
    assert c.doc_id == "b" and c.sentence in texts[1] and c.dropped == c.sentence
    assert " ".join(sorted([c.sentence, c.rest])) == " ".join(sorted(texts[1].replace(". ", ".|").split("|")))
    assert draw_clozes(["a", "b"], texts, [0, 1], seed=3) == draw_clozes(["a", "b"], texts, [0, 1], seed=3)


def test_the_view_searches_the_corpus_as_a_copy_with_the_rests_in_place():
    rng = np.random.default_rng(0)
    docs = [f"doc {i} about topic {i % 3}. It has a second sentence number {i}." for i in range(12)]
    emb = rng.normal(size=(12, 8)).astype(np.float32)

    def encode(texts):  # a deterministic stand-in for a document encoder
        return np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]).astype(np.float32)

    clozes = draw_clozes([f"d{i}" for i in range(12)], docs, [2, 5, 7], seed=0)
    view = HeldOutView(docs, emb, [f"d{i}" for i in range(12)], clozes, encode)
    copy = emb.copy()
    copy[view.targets] = encode([c.rest for c in view.clozes])
    q = rng.normal(size=(len(clozes), 8)).astype(np.float32)
    scores, rows = view.dense(q, 5)
    expect = q @ copy.T
    for i in range(len(q)):
        order = np.lexsort((np.arange(12), -expect[i]))[:5]
        assert rows[i].tolist() == order.tolist()
        np.testing.assert_allclose(scores[i], expect[i][order], rtol=1e-6)
    # a fusion at dense weight 1 ranks as the dense model alone
    texts = [c.dropped for c in view.clozes]
    dense_only = FusionConfig(dense_weight=1.0, normalize="z", depth=12)
    assert view.hybrid_scores(texts, q, dense_only) == view.dense_scores(q)
    half = FusionConfig(dense_weight=0.5, normalize="z", depth=12)
    (b_s, b_r), (d_s, d_r) = view.bm25(texts, 12), view.dense(q, 12)
    by_hand = [
        ndcg_of_target(fuse(d_r[i], d_s[i], b_r[i], b_s[i], half, 10)[0], int(t)) for i, t in enumerate(view.targets)
    ]
    assert view.hybrid_scores(texts, q, half) == by_hand


def test_a_model_better_on_crops_but_worse_on_clozes_is_refused():
    """The start reads meaning (synonyms are one), the 'adapted' model reads words: on crops of the documents (the
    pseudo-queries the training draws) it reads better, on clozes (the rest of the document names the same things
    by other words) far worse; the verdict rests on the clozes: worse."""
    texts, ids, lexical, semantic = tiny.synonym_toy()
    crops = PseudoQueryDrawer(ids, [""] * len(ids), texts, seed=0).draw(48, {"span": 1.0})

    def crop_scores(encode):
        s = encode([p.text for p in crops]) @ encode(texts).T
        order = np.lexsort((np.tile(np.arange(len(ids)), (len(crops), 1)), -s), axis=1)
        return [ndcg_of_target(order[i], ids.index(p.doc_id)) for i, p in enumerate(crops)]

    clozes = draw_clozes(ids, texts, list(range(len(ids))), seed=0)
    on_clozes = {}
    for name, encode in (("start", semantic), ("adapted", lexical)):
        view = HeldOutView(texts, encode(texts), ids, clozes, encode)
        on_clozes[name] = view.dense_scores(encode([c.dropped for c in view.clozes]))
    readings = {
        "pseudo_queries": paired(crop_scores(semantic), crop_scores(lexical)),
        "cloze": paired(on_clozes["start"], on_clozes["adapted"]),
    }
    assert readings["pseudo_queries"]["verdict"] == "better" and readings["cloze"]["verdict"] == "worse"
    assert decide(readings) == "worse"
    assert decide({"pseudo_queries": readings["pseudo_queries"]}) == "unverified"  # crops alone vouch for nothing


def test_the_verdict_by_hand():
    """Better on the clozes (and no decided reading worse beyond two standard errors) is ``better``; a decided reading
    below two standard errors is ``worse``; one below one standard error only, within one, or nothing read,
    ``unverified`` or ``better`` as the clozes read; a reading the training shaped decides nothing."""
    better = paired([0.5, 0.6, 0.7, 0.4], [0.7, 0.8, 0.9, 0.6])
    worse = paired([0.5, 0.6, 0.7, 0.4], [0.3, 0.4, 0.55, 0.2])
    same = paired([0.5, 0.6, 0.7, 0.4], [0.52, 0.59, 0.7, 0.41])
    # by hand: differences 0.02, -0.01, 0, 0.01: mean 0.005, SD sqrt(0.0005 / 3), SE = SD / 2 = 0.0065
    assert same["difference"] == 0.005 and same["se"] == 0.0065 and same["verdict"] == "no difference"
    # by hand: differences -0.02, -0.01, -0.02, 0.01: mean -0.01, SD sqrt(0.0006 / 3), SE = 0.0071: below one SE and
    # above two
    slightly = paired([0.5, 0.6, 0.7, 0.4], [0.48, 0.59, 0.68, 0.41])
    assert slightly["difference"] == -0.01 and slightly["se"] == 0.0071 and slightly["verdict"] == "worse"
    assert decide({"cloze": better, "cloze_hybrid": same}) == "better"
    assert decide({"cloze": better, "cloze_hybrid": slightly}) == "better"  # a veto needs two standard errors
    assert decide({"cloze": better, "cloze_hybrid": worse}) == "worse"
    assert decide({"cloze": worse, "cloze_hybrid": better}) == "worse"
    assert decide({"cloze": slightly, "cloze_hybrid": better}) == "unverified"
    assert decide({"cloze": same, "cloze_hybrid": better}) == "unverified"
    assert decide({}) == "unverified"
    shaped = {"cloze": "trained on them", "cloze_hybrid": "trained on them"}
    assert decide({"cloze": better}, shaped) == decide({"cloze": worse}, shaped) == "unverified"
