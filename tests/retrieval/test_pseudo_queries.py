"""Pseudo-queries drawn from a corpus (hf_cocodr.data.pseudo_queries): hand-computed small cases, and the rules every
draw keeps (never empty, never over its length bound, never repeated, never an evaluation query)."""

from __future__ import annotations

import math

import pytest

from hf_cocodr.data.target_queries import normalize_query
from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.pseudo_queries import (
    PseudoQuery,
    PseudoQueryDrawer,
    count_words,
    inverse_cloze,
    parse_mix,
    quotas,
    split_sentences,
)

# three documents whose drawn pseudo-queries can be worked out by hand: each has one sentence of four words (the
# only one a span or an inverse-cloze query can come from), and the spans are set to four words
IDS = ["d1", "d2", "d3"]
TITLES = ["Coral reef bleaching", "", "Tide tables"]
BODIES = [
    "Warm water stresses corals. Reefs fade.",
    "Compilers cache bytecode files. It helps.",
    "Tides rise twice daily.",
]


def drawer(**kw) -> PseudoQueryDrawer:
    d = PseudoQueryDrawer(IDS, TITLES, BODIES, seed=kw.pop("seed", 3), **kw)
    d.span_lengths, d.keyword_counts = [4], [2]
    return d


def texts(drawn: list[PseudoQuery]) -> dict[str, str]:
    return {p.doc_id: p.text for p in drawn}


def test_the_spans_keywords_and_titles_of_a_three_document_corpus():
    # spans: the one four-word sentence of each document, its final full stop stripped
    assert texts(drawer().draw(3, "span")) == {
        "d1": "Warm water stresses corals",
        "d2": "Compilers cache bytecode files",
        "d3": "Tides rise twice daily",
    }
    # keywords: the two terms of highest BM25 weight. Every term occurs in one document (the same idf), so the
    # weight follows the term's count: "coral" and "reef" twice in d1 (corals, Reefs stem to them), "tide" twice
    # in d3; ties go to the earlier term (d2: all once). Written as first seen, in document order
    assert texts(drawer().draw(3, "keywords")) == {"d1": "Coral reef", "d2": "Compilers cache", "d3": "Tide tables"}
    # titles: the two documents that have one (d2 has none, so 2 of the 3 asked for)
    assert texts(drawer().draw(3, "title")) == {"d1": "Coral reef bleaching", "d3": "Tide tables"}
    # inverse cloze: the whole sentence, its full stop kept
    assert texts(drawer().draw(3, "ict"))["d2"] == "Compilers cache bytecode files."


def test_keywords_rank_terms_by_their_bm25_weight_not_their_count_alone():
    """A term in every document has the lowest idf: "cell" twice in each document loses to terms once in one."""
    bodies = ["cell cell alpha beta", "cell cell gamma delta", "cell cell epsilon zeta"]
    d = PseudoQueryDrawer(["a", "b", "c"], ["", "", ""], bodies, seed=0)
    d.keyword_counts = [2]
    assert texts(d.draw(3, "keywords")) == {"a": "alpha beta", "b": "gamma delta", "c": "epsilon zeta"}
    # by hand, the weight of a term: idf (bm25s's Lucene variant) x saturated count; "cell" is in all 3 documents
    d._index_terms()
    n, k1, b = 3, 1.5, 0.75
    norm = k1 * (1 - b + b * 4 / 4)  # every document has 4 terms: its length is the mean length
    idf_cell, idf_alpha = math.log(1 + (n - 3 + 0.5) / (3 + 0.5)), math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    assert d._weights[0]["cell"] == pytest.approx(idf_cell * 2 * (k1 + 1) / (2 + norm))
    assert d._weights[0]["alpha"] == pytest.approx(idf_alpha * 1 * (k1 + 1) / (1 + norm))


def test_a_draw_is_seeded_and_mixes_its_kinds_by_weight():
    a, b = drawer(seed=5).draw(6, "span:1,keywords:1"), drawer(seed=5).draw(6, "span:1,keywords:1")
    assert a == b
    assert {p.kind for p in a} == {"span", "keywords"} and len(a) == 6
    # largest remainders, ties in the kinds' order: 10 x (1/4, 1/4, 1/2) = 2.5, 2.5, 5
    assert quotas(10, {"span": 1, "keywords": 1, "title": 2}) == {"span": 3, "keywords": 2, "title": 5}
    assert quotas(7, {"span": 3.0}) == {"span": 7}


def test_no_pseudo_query_is_empty_over_its_bound_or_repeated():
    """Documents with blank bodies, repeated sentences and titles, long sentences: every draw keeps its rules, with a
    token counter (here: characters / 4) and without one (words)."""
    ids = [f"d{i}" for i in range(12)]
    titles = ["Same title here"] * 6 + [""] * 3 + ["   ", "x", "A long title " + "word " * 40]
    bodies = ["   "] * 2 + ["Repeated sentence of five words. Repeated sentence of five words."] * 4
    bodies += ["One two three four five six seven eight nine ten eleven twelve thirteen. " * 3] * 6
    for counter, bound in ((None, 6), (lambda t: math.ceil(len(t) / 4), 8)):
        d = PseudoQueryDrawer(ids, titles, bodies, seed=1, max_tokens=bound, count_tokens=counter)
        drawn = d.draw(40, "span:1,keywords:1,title:1,ict:1")
        keys = [normalize_query(p.text) for p in drawn]
        assert all(p.text.strip() for p in drawn)
        assert len(keys) == len(set(keys))
        measure = counter or count_words
        assert all(measure(p.text) <= bound for p in drawn)
        assert all(p.doc_id in ids for p in drawn)


def test_an_evaluation_query_is_never_drawn():
    plain = drawer().draw(3, "span")
    assert "Tides rise twice daily" in [p.text for p in plain]
    excluded = drawer().draw(3, "span", exclude=["  TIDES rise\u200b twice daily "])  # as the overlap guard compares
    assert "Tides rise twice daily" not in [p.text for p in excluded] and len(excluded) == 2


def test_a_mix_is_checked_by_name():
    assert parse_mix("span:2, keywords") == {"span": 2.0, "keywords": 1.0}
    assert parse_mix(None) == parse_mix("default") == {"span": 1.0, "keywords": 1.0, "title": 1.0}
    with pytest.raises(ConfigError, match="unknown kind 'queries'"):
        parse_mix("span,queries")
    with pytest.raises(ConfigError, match="'span:x' is not KIND or KIND:WEIGHT"):
        parse_mix("span:x")
    with pytest.raises(ConfigError, match="no kind has a positive weight"):
        parse_mix("span:0")
    with pytest.raises(ConfigError, match="its documents have no titles"):
        PseudoQueryDrawer(["a"], [""], ["One two three four."]).draw(2, "title")


def test_a_draw_can_set_documents_apart_and_another_salt_draws_other_documents():
    """What the recipe's guard holds out: drawn with a salt of its own, and the training draw skips its documents."""
    ids = [f"d{i}" for i in range(40)]
    bodies = [f"Alpha{i} beta{i} gamma{i} delta{i} epsilon{i}." for i in range(40)]
    d = PseudoQueryDrawer(ids, [f"Title number {i}" for i in range(40)], bodies, seed=2)
    held = d.draw(8, "span:1,keywords:1,title:1,ict:1", salt=1)
    assert {p.kind for p in held} == {"span", "keywords", "title", "ict"} and len(held) == 8
    assert [p.doc_id for p in held] != [p.doc_id for p in d.draw(8, "span:1,keywords:1,title:1,ict:1")]
    train = d.draw(60, "span", skip_docs={p.doc_id for p in held})
    assert not {p.doc_id for p in train} & {p.doc_id for p in held}
    assert len(train) == 40 - len({p.doc_id for p in held})  # one span a document, from every other document


def test_sentences_end_at_the_full_stops_of_other_scripts_too():
    assert split_sentences("First one here. Second one! Third?  ") == ["First one here.", "Second one!", "Third?"]
    assert split_sentences("今日は晴れです。明日は雨でしょう！本当？") == [
        "今日は晴れです。",
        "明日は雨でしょう！",
        "本当？",
    ]
    assert count_words("今日は晴れです") == 7 and count_words("two words") == 2
    # the fit's inverse cloze finds its pseudo-queries in such a corpus (it found none before)
    corpus = ["猫は魚が好きです。犬は肉が好きです。鳥は種が好きです。"] * 3
    assert len(inverse_cloze(corpus, n=3, seed=0)) == 3
