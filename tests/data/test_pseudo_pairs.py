"""Target pseudo pairs: title-body and inverse-cloze pairs from a target corpus, and what is refused."""

from __future__ import annotations

import json

import pytest

from hf_cocodr.data.pseudo_pairs import target_pseudo_pairs


def test_title_body_pairs(tiny_beir):
    data = target_pseudo_pairs([tiny_beir], "title_body", seed=0, bm25_top_k=5)
    corpus = [json.loads(line) for line in open(tiny_beir / "corpus.jsonl")]
    assert len(data) == len(corpus) and data.pseudo_pairs_mode == "title_body"
    for r in range(len(data)):
        (pos,) = data.positives(r)
        assert data.query_texts[r] == corpus[r]["title"]
        assert data.doc_texts([pos]) == [corpus[r]["text"]]  # the body alone: the title is not in the positive
        negs = data.negatives(r)
        assert len(negs) == 5 and pos not in negs


def test_ict_pairs_take_one_sentence_out(tiny_beir):
    from hf_cocodr.data.spans import split_sentences_regex

    data = target_pseudo_pairs([tiny_beir], "ict", seed=3, negatives="none")
    corpus = [json.loads(line) for line in open(tiny_beir / "corpus.jsonl")]
    assert len(data) > 0
    for r in range(len(data)):
        q = data.query_texts[r]
        doc = corpus[int(data.query_ids[r].rsplit("/", 1)[1])]["text"]
        sents = split_sentences_regex(doc)
        rest = data.doc_texts(data.positives(r))[0]
        assert (
            q in sents
            and rest == " ".join(s for s in sents if s != q or sents.count(q) > 1)
            or sorted(split_sentences_regex(rest) + [q]) == sorted(sents)
        )


def test_pseudo_pairs_without_titles_are_refused(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"Sentence one about {i}. Sentence two."}) for i in range(5)))
    with pytest.raises(ValueError, match="no titles"):
        target_pseudo_pairs([f], "title_body")
    assert len(target_pseudo_pairs([f], "ict", negatives="none")) == 5
