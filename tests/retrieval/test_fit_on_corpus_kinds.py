"""The label-free fit on corpora of three kinds, built by hand: one where BM25 is useless (queries and documents
name the same things by different words), one where the dense model is random, and a lexical one where both systems
read the same words (today's behaviour: the checks added for the first two leave it as it was)."""

from __future__ import annotations

import random
import re
import zlib

import numpy as np
import pytest
import tiny

from hf_cocodr.retrieval import fusion_fit
from hf_cocodr.retrieval.fusion import FusionConfig, fuse
from hf_cocodr.retrieval.fusion_fit import fit_fusion
from hf_cocodr.retrieval.index import BM25Index
from hf_cocodr.retrieval.vectors import MappedIndex


def _synonym_queries(texts: list[str], n: int) -> list[str]:
    """For each of the first ``n`` documents of the synonym toy, a query naming its concepts by synonyms the document
    never uses (so BM25 finds only other documents)."""
    rng = random.Random(1)
    out = []
    for text in texts[:n]:
        words = set(re.findall(r"\w+", text.lower()))
        concepts = sorted({int(w[1 : w.index("x")]) for w in words if re.fullmatch(r"w\d+x\d+", w)})
        picked = []
        for c in concepts:
            picked += rng.sample([f"w{c}x{s}" for s in range(12) if f"w{c}x{s}" not in words], 2)
        out.append(" ".join(picked))
    return out


def _random_encoder(dim: int = 16):
    """Vectors that depend on nothing but a hash of the text: a dense model that reads nothing."""

    def encode(texts):
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(dim) for t in texts]
        return np.asarray(rows, np.float32)

    return encode


def _lexical_corpus(n: int = 60) -> list[str]:
    """Documents of three sentences drawn from a topic's own ten words (disjoint topics): a sentence shares words
    with its document's rest, and with no other topic's documents."""
    rng = np.random.default_rng(0)
    texts = []
    for i in range(n):
        topic = [f"t{i}w{j}" for j in range(10)]
        texts.append(" ".join(" ".join(rng.choice(topic, 6)) + "." for _ in range(3)))
    return texts


def test_where_bm25_is_useless_the_dense_model_ranks_alone():
    texts, _, _, semantic = tiny.synonym_toy()
    queries = _synonym_queries(texts, 24)
    fitted = fit_fusion(FusionConfig(), texts, semantic(texts), semantic, semantic, queries=queries)
    assert fitted.dense_weight == 1.0 and "ranks_alone" in fitted.fit, fitted.fit
    assert fitted.fit["ranks_alone"] in fusion_fit.fit_outcome(fitted)  # (the build log says why)
    assert fitted.fit["bm25_alone"] < fusion_fit.ALONE_MIN_SHARE * fitted.fit["dense_alone"]
    # the hybrid is the dense ranking: each query's fused top 10 is its dense top 10, in order
    bm25 = BM25Index(texts)
    q = semantic(queries)
    d_s, d_r = MappedIndex(semantic(texts), name="toy").search(q, fitted.depth)
    b_s, b_r = bm25.search(queries, fitted.depth)
    for i in range(len(queries)):
        rows, _ = fuse(d_r[i], d_s[i], b_r[i], b_s[i], fitted, 10)
        assert list(rows) == list(d_r[i][:10])
    # (BM25 has hits for these queries, in other documents: there is something for the fusion to be misled by)
    assert (b_s[:, 0] > 0).all()


def test_where_the_dense_model_is_random_bm25_ranks_alone():
    texts = _lexical_corpus()
    encode = _random_encoder()
    queries = [" ".join(t.split(". ")[1].split()[:4]) for t in texts[:20]]
    for given in (None, queries):
        fitted = fit_fusion(FusionConfig(), texts, encode(texts), encode, encode, queries=given)
        assert fitted.dense_weight == 0.0 and "ranks_alone" in fitted.fit, fitted.fit


@pytest.mark.parametrize("with_queries", [False, True])
def test_on_a_lexical_corpus_the_checks_change_nothing(with_queries, monkeypatch):
    """Both systems read the words (the dense model a bag of them): the fit is the one the checks' thresholds switched
    off give, and neither check speaks."""
    texts = _lexical_corpus()
    vocab = sorted({w for t in texts for w in re.findall(r"\w+", t)})
    index = {w: i for i, w in enumerate(vocab)}

    def bag(ts):
        out = np.zeros((len(ts), len(vocab)), np.float32)
        for i, t in enumerate(ts):
            for w in re.findall(r"\w+", t):
                if w in index:
                    out[i, index[w]] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    queries = [" ".join(t.split(". ")[1].split()[:4]) for t in texts[:20]] if with_queries else None
    fitted = fit_fusion(FusionConfig(), texts, bag(texts), bag, bag, queries=queries)
    assert "ranks_alone" not in fitted.fit
    monkeypatch.setattr(fusion_fit, "ALONE_MIN_SHARE", 0.0)
    monkeypatch.setattr(fusion_fit, "AGREEMENT_FLOOR", 0.0)
    unchecked = fit_fusion(FusionConfig(), texts, bag(texts), bag, bag, queries=queries)
    assert (fitted.dense_weight, fitted.normalize) == (unchecked.dense_weight, unchecked.normalize)
    assert 0.0 < fitted.dense_weight < 1.0  # (a real mix: the case the checks must leave alone)


def test_agreement_is_chance_corrected():
    """Identical top 10s read 1, disjoint ones below 0, and a query BM25 has no hit for reads 0."""
    rows = np.arange(10)
    hit = np.ones(10, np.float32)
    assert fusion_fit.top_agreement([rows], [rows], [hit], 1000) == pytest.approx(1.0)
    # disjoint: (0 - chance) / (10 - chance), chance = 10 * 10 / 1000
    assert fusion_fit.top_agreement([rows], [rows + 10], [hit], 1000) == pytest.approx(-0.1 / 9.9)
    assert fusion_fit.top_agreement([rows], [rows], [np.zeros(10, np.float32)], 1000) == 0.0
    # half shared, hits on 5 of BM25's 10: most = 5, chance = 10 * 5 / 100
    half = np.r_[np.arange(5), np.arange(50, 55)]
    part = np.r_[np.ones(5), np.zeros(5)].astype(np.float32)
    assert fusion_fit.top_agreement([rows], [half], [part], 100) == pytest.approx((5 - 0.5) / (5 - 0.5))
