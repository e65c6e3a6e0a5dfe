"""Held-out cloze readings: how well a model (or a hybrid) finds a document from one of its sentences, on documents
no training read, with the lexical shortcut taken away (what the recipe's teacher check and guard rest on).

A **cloze** of a document is one of its sentences (the *sentence*) and the rest of the document without it (the
*rest*, the one relevant document); the corpus is searched with each held-out document replaced by its rest
(:class:`HeldOutView`), so a hit on the rest is a label the corpus gave for free. The plain sentence shares many words
with its rest (a document repeats its terms), which is BM25's task, and that of a model imitating BM25: its
*dropped* form (:func:`drop_shared_words`) leaves out, with probability :data:`DROP_SHARE` each, the content words
whose stem the rest also holds (as the BM25 index stems them; stop words stay), so what is left finds the rest as much
by its meaning as by its words. A reading on the dropped form is not lexical by construction: it reads, besides the
words, whether the model still matches meaning, the ability a model trained toward a lexical teacher can lose.

:func:`draw_clozes` draws one cloze per held-out document (seeded); :func:`paired` compares two sets of per-query
scores (adapted − start: the mean, its standard error and a verdict at one standard error).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .fusion import fuse
from .pseudo_queries import MIN_SENTENCE_WORDS, count_words, split_sentences
from .vectors import MappedIndex

DROP_SHARE = 0.5  # the share of the shared content words a dropped cloze leaves out (each with this probability)
MIN_LEFT = 3  # a dropped cloze keeps at least this many words (else its document gives no cloze)
DEPTH = 10  # nDCG@10
_WORD = re.compile(r"\w+(?:[-'’]\w+)*", re.UNICODE)


@dataclass(frozen=True)
class Cloze:
    """One held-out document's cloze: its id, the sentence, its dropped form and the rest of the document."""

    doc_id: str
    sentence: str
    dropped: str
    rest: str

    def as_row(self) -> dict[str, str]:
        return {"kind": "cloze", "doc_id": self.doc_id, "text": self.sentence, "dropped": self.dropped,
                "rest": self.rest}  # fmt: skip

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Cloze:
        return cls(str(row["doc_id"]), str(row["text"]), str(row["dropped"]), str(row["rest"]))


def _stemmer():
    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN

    return Stemmer.Stemmer("english").stemWord, frozenset(STOPWORDS_EN)


def drop_shared_words(sentence: str, rest: str, share: float, rng: np.random.Generator, stem=None) -> str:
    """``sentence`` with each content word whose stem ``rest`` also holds left out with probability ``share`` (one
    draw per word, in order); stop words, and words ``rest`` lacks, stay. ``stem``: ``(stem_word, stop_words)``
    (default: the English stemmer and the stop words the BM25 index uses)."""
    stem_word, stop = stem or _stemmer()
    shared = {stem_word(w.lower()) for w in _WORD.findall(rest)}
    kept = []
    for token in sentence.split():
        words = [w.lower() for w in _WORD.findall(token)]
        content = [w for w in words if w not in stop]
        if content and any(stem_word(w) in shared for w in content) and rng.random() < share:
            continue
        kept.append(token)
    return " ".join(kept)


def draw_clozes(
    doc_ids: Sequence[str],
    texts: Sequence[str],
    rows: Sequence[int],
    seed: int,
    *,
    drop_share: float = DROP_SHARE,
    min_words: int = MIN_SENTENCE_WORDS,
    min_left: int = MIN_LEFT,
) -> list[Cloze]:
    """One cloze for each document of ``rows`` that can give one (two sentences or more, one of at least
    ``min_words`` words, whose dropped form keeps ``min_left`` words), in the order of ``rows``; ``texts``: the
    documents as the BM25 index reads them (``title + text``). Deterministic for ``seed``."""
    rng = np.random.default_rng([seed, 29])
    stem = _stemmer()
    out = []
    for row in rows:
        sentences = split_sentences(texts[row])
        usable = [i for i, x in enumerate(sentences) if count_words(x) >= min_words]
        if len(sentences) < 2 or not usable:
            continue
        pick = usable[int(rng.integers(len(usable)))]
        rest = " ".join(x for i, x in enumerate(sentences) if i != pick)
        dropped = drop_shared_words(sentences[pick], rest, drop_share, rng, stem)
        if count_words(dropped) >= min_left:
            out.append(Cloze(str(doc_ids[row]), sentences[pick], dropped, rest))
    return out


def ndcg_of_target(rows: np.ndarray, target: int) -> float:
    """nDCG@10 of a ranking (``rows``, best first) with one relevant row."""
    hit = np.flatnonzero(np.asarray(rows[:DEPTH]) == target)
    return float(1.0 / math.log2(hit[0] + 2)) if hit.size else 0.0


class HeldOutView:
    """A corpus with each held-out document replaced by its cloze's rest, in both systems: the dense vectors (the
    rests encoded by ``encode_documents``, the document encoder of the model whose ``embeddings`` these are; the
    corpus's own vectors are searched as they are, memory-mapped or not, and never copied) and a BM25 index over the
    texts (built once, on first use). Rankings are over the whole corpus, each query's target being its cloze's
    document."""

    def __init__(self, texts: list[str], embeddings: np.ndarray, doc_ids: Sequence[str], clozes: list[Cloze],
                 encode_documents: Callable[[list[str]], np.ndarray]):  # fmt: skip
        from .index import check_finite

        row_of = {str(d): i for i, d in enumerate(doc_ids)}
        self.clozes = [c for c in clozes if c.doc_id in row_of]
        self.targets = np.array([row_of[c.doc_id] for c in self.clozes], np.int64)
        self.texts = list(texts)
        for c, row in zip(self.clozes, self.targets):
            self.texts[int(row)] = c.rest
        self.embeddings = embeddings
        self.rests = np.zeros((0, np.shape(embeddings)[1]), np.float32)
        if self.clozes:
            self.rests = check_finite(np.asarray(encode_documents([c.rest for c in self.clozes]), np.float32), "rests")
        self._bm25 = None

    def bm25(self, queries: list[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
        from .index import BM25Index

        if self._bm25 is None:
            self._bm25 = BM25Index(self.texts)
        return self._bm25.search(queries, min(depth, len(self.texts)))

    def dense(self, query_vectors: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner-product top-``depth`` ``(scores, rows)`` over the corpus with the held-out documents' vectors
        those of their rests (equal scores in row order)."""
        q = np.asarray(query_vectors, np.float32)
        n = len(self.embeddings)
        k = min(depth, n)
        found_s, found_r = MappedIndex(self.embeddings, name="the corpus's vectors").search(
            q, min(n, k + len(self.targets))
        )
        rest_s = q @ self.rests.T
        scores, rows = np.empty((len(q), k), np.float32), np.empty((len(q), k), np.int64)
        for i in range(len(q)):
            other = ~np.isin(found_r[i], self.targets)
            cand_r = np.concatenate([found_r[i][other], self.targets])
            cand_s = np.concatenate([found_s[i][other], rest_s[i]])
            keep = np.lexsort((cand_r, -cand_s))[:k]
            scores[i], rows[i] = cand_s[keep], cand_r[keep]
        return scores, rows

    def _check(self, n: int) -> None:
        if n != len(self.targets):
            raise ValueError(f"{n} queries for the view's {len(self.targets)} clozes: one query per cloze, in order")

    def dense_scores(self, query_vectors: np.ndarray) -> list[float]:
        """Each cloze's query's nDCG@10 of its target by the dense ranking (one query per cloze, in order)."""
        self._check(len(query_vectors))
        _, rows = self.dense(query_vectors, DEPTH)
        return [ndcg_of_target(r, t) for r, t in zip(rows, self.targets)]

    def hybrid_scores(self, queries: list[str], query_vectors: np.ndarray, fusion) -> list[float]:
        """Each query's nDCG@10 of its target by the fused ranking (``fusion``: a fitted
        :class:`~hf_cocodr.retrieval.fusion.FusionConfig`)."""
        self._check(len(query_vectors))
        d_s, d_r = self.dense(query_vectors, fusion.depth)
        b_s, b_r = self.bm25(queries, fusion.depth)
        out = []
        for i, target in enumerate(self.targets):
            rows, _ = fuse(d_r[i], d_s[i], b_r[i], b_s[i], fusion, DEPTH)
            out.append(ndcg_of_target(rows, int(target)))
        return out


def paired(start: Sequence[float], adapted: Sequence[float]) -> dict[str, Any]:
    """The per-query difference adapted − start: the two means, the mean difference, its standard error and the
    verdict (``better`` above +1 SE, ``worse`` below −1 SE, else ``no difference``; with fewer than two queries
    ``no reading``)."""
    s, a = np.asarray(start, np.float64), np.asarray(adapted, np.float64)
    n = len(s)
    if n < 2:
        return {"queries": n, "verdict": "no reading"}
    d = a - s
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    verdict = "better" if mean > se else "worse" if mean < -se else "no difference"
    return {
        "queries": n,
        "start": round(float(s.mean()), 4),
        "adapted": round(float(a.mean()), 4),
        "difference": round(mean, 4),
        "se": round(se, 4),
        "verdict": verdict,
    }
