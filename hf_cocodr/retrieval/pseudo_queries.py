"""Pseudo-queries drawn from a corpus: what the user's queries would look like, made from the documents alone.

Each pseudo-query comes from one document (its *source*, which it is known to be about: a hit on it is a label the
corpus gave for free) and has a *kind*:

- ``span``: a few words to a clause cropped from one sentence of the document (the cropping of Contriever, at query
  length): a run of 4 to 12 consecutive words, its ends stripped of punctuation;
- ``keywords``: a handful (3 to 6) of the document's most distinctive terms, in document order, as a search box's or
  NFCorpus's queries are written: its terms ranked by their BM25 weight in the document (the index's idf, as
  bm25s's Lucene variant computes it, times the term's saturated frequency), stop words left out, one surface form
  per stem;
- ``title``: the document's title, where the corpus has titles;
- ``ict``: one whole sentence of the document (the inverse cloze task), the label-free fusion fit's pseudo-query
  (:func:`inverse_cloze`, which also gives the rest of the document).

:class:`PseudoQueryDrawer` draws ``n`` of them in a mix of kinds (:func:`parse_mix`), seeded: never an empty or blank
query, never one longer than ``max_tokens`` tokens (the model's tokenizer, when given; else words), never one
repeated (compared by their words, as :func:`~hf_cocodr.data.target_queries.normalize_query` compares queries: case,
punctuation and spacing ignored), and never one with the words of a query in ``exclude`` (the user's evaluation
queries: a run must not train on them, nor on one of them with a full stop added).

:data:`GUARD_MIX` is what the recipe's label-free guard (:mod:`hf_cocodr.recipe.guard`) holds out: every kind the
corpus can give, in equal shares whatever mix trains, drawn (``salt``) from documents no trained pseudo-query comes
from (``skip_docs``), so the guard reads more than the training distribution.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..utils import normalize_query

logger = logging.getLogger(__name__)

PSEUDO_QUERY_KINDS = ("span", "keywords", "title", "ict")
# the mix drawn by default (docs/adaptation.md, "Adaptation from the corpus alone")
DEFAULT_MIX = {"span": 1.0, "keywords": 1.0, "title": 1.0}
GUARD_MIX = {kind: 1.0 for kind in PSEUDO_QUERY_KINDS}  # the guard's held-out pseudo-queries: every kind alike
SPAN_WORDS = (4, 12)  # a span's words, inclusive
KEYWORDS = (3, 6)  # a keyword query's terms, inclusive
MIN_SENTENCE_WORDS = 4  # a sentence a span or an inverse-cloze query is drawn from has at least this many words
MAX_TOKENS = 32  # the default bound on a pseudo-query's length

# a sentence ends at . ! ? followed by white space, or at the full stops of scripts written without spaces (CJK's
# 。！？ and their half-width forms, the Devanagari danda, the Arabic question mark), followed by any space or none
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？｡।॥؟])\s*")
_WORD = re.compile(r"\w+(?:[-'’]\w+)*", re.UNICODE)
# characters of scripts written without spaces between words: each counts as a word where words are counted
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_EDGE_PUNCT = ".,;:!?()[]{}\"'“”‘’«»-–—/"


@dataclass(frozen=True)
class PseudoQuery:
    """One pseudo-query: its text, the id of the document it was drawn from, and its kind."""

    text: str
    doc_id: str
    kind: str


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (see :data:`_SENTENCE_END`), stripped, none empty."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s and s.strip()]


def count_words(text: str) -> int:
    """Words in ``text``: white-space separated ones, where a run of characters of a script written without spaces
    (CJK, kana, hangul) counts one word a character."""
    unspaced = len(_UNSPACED.findall(text))
    if not unspaced:
        return len(text.split())
    return unspaced + len(_UNSPACED.sub(" ", text).split())


def parse_mix(mix: str | Mapping[str, float] | Sequence[str] | None) -> dict[str, float]:
    """A mix of kinds as ``{kind: weight}``: ``"span:2,keywords:1"``, ``"span,title"`` (equal weights), a mapping or a
    list of kinds; ``None`` or ``"default"`` is :data:`DEFAULT_MIX`. Unknown kinds, negative or non-finite weights, and
    a mix whose weights are all 0 are refused by name."""
    if mix is None or (isinstance(mix, str) and mix.strip() in ("", "default")):
        return dict(DEFAULT_MIX)
    if isinstance(mix, str):
        items = []
        for part in mix.split(","):
            kind, _, weight = part.strip().partition(":")
            try:
                items.append((kind.strip(), float(weight) if weight.strip() else 1.0))
            except ValueError:
                raise ConfigError(f"pseudo_query_mix: {part.strip()!r} is not KIND or KIND:WEIGHT") from None
    elif isinstance(mix, Mapping):
        items = list(mix.items())
    elif isinstance(mix, (list, tuple)):
        items = [(k, 1.0) for k in mix]
    else:  # (a number or a flag in a YAML file)
        raise ConfigError(
            f"pseudo_query_mix must be KIND:WEIGHT pairs such as 'span:1,keywords:1' (kinds: "
            f"{', '.join(PSEUDO_QUERY_KINDS)}), a mapping of kinds to weights, a list of kinds or auto; got {mix!r}"
        )
    out: dict[str, float] = {}
    for kind, weight in items:
        if kind not in PSEUDO_QUERY_KINDS:
            raise ConfigError(f"pseudo_query_mix: unknown kind {kind!r} (the kinds: {', '.join(PSEUDO_QUERY_KINDS)})")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ConfigError(f"pseudo_query_mix: the weight of {kind} must be a number >= 0, got {weight!r}")
        out[kind] = out.get(kind, 0.0) + float(weight)
    if not out or sum(out.values()) <= 0:
        raise ConfigError(f"pseudo_query_mix: no kind has a positive weight in {mix!r}")
    return out


def quotas(n: int, weights: Mapping[str, float]) -> dict[str, int]:
    """``n`` split among the kinds in proportion to their weights (largest remainders; ties in
    :data:`PSEUDO_QUERY_KINDS` order)."""
    total = sum(weights.values())
    share = {k: n * w / total for k, w in weights.items()}
    out = {k: int(math.floor(v)) for k, v in share.items()}
    order = sorted(weights, key=lambda k: (-(share[k] - out[k]), PSEUDO_QUERY_KINDS.index(k)))
    for k in order[: n - sum(out.values())]:
        out[k] += 1
    return out


class PseudoQueryDrawer:
    """Draws pseudo-queries from one corpus (see the module docstring).

    Args:
        doc_ids: the documents' ids.
        titles: their titles (``""`` or ``None`` where a document has none).
        bodies: their texts, without the title.
        seed: what every draw follows.
        max_tokens: the longest pseudo-query, in tokens of ``count_tokens`` (in words without it).
        count_tokens: the model's token count of a text (its tokenizer's, special tokens left out).
    """

    def __init__(
        self,
        doc_ids: Sequence[str],
        titles: Sequence[str | None],
        bodies: Sequence[str | None],
        *,
        seed: int = 0,
        max_tokens: int = MAX_TOKENS,
        count_tokens: Callable[[str], int] | None = None,
    ):
        if not (len(doc_ids) == len(titles) == len(bodies)):
            raise ValueError("doc_ids, titles and bodies must be of one length")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
            raise ConfigError(f"pseudo-queries: max_tokens must be a whole number >= 2, got {max_tokens!r}")
        self.doc_ids = [str(d) for d in doc_ids]
        self.titles = [(t or "").strip() for t in titles]
        self.bodies = [(b or "").strip() for b in bodies]
        self.seed, self.max_tokens = int(seed), max_tokens
        self.count_tokens = count_tokens
        self.span_lengths: list[int] = list(range(SPAN_WORDS[0], SPAN_WORDS[1] + 1))
        self.keyword_counts: list[int] = list(range(KEYWORDS[0], KEYWORDS[1] + 1))
        self._sentences: dict[int, list[str]] = {}
        self._weights: list[dict[str, float]] | None = None  # per document: stem -> BM25 weight
        self._surface: list[dict[str, str]] | None = None  # per document: stem -> its first surface form
        self._first: list[dict[str, int]] | None = None  # per document: stem -> its first position

    # -------------------------------------------------------------------------------------------------- drawing
    def available(self, kind: str) -> bool:
        """Whether the corpus can give pseudo-queries of ``kind`` (titles need documents with titles)."""
        return kind != "title" or any(self.titles)

    def draw(
        self,
        n: int,
        mix: str | Mapping[str, float] | None = None,
        *,
        exclude: Sequence[str] = (),
        skip_docs: Set[str] = frozenset(),
        salt: int = 0,
    ) -> list[PseudoQuery]:
        """``n`` pseudo-queries (fewer where the corpus cannot give that many distinct ones: logged) in ``mix``
        (:func:`parse_mix`; kinds the corpus cannot give are left out and their share goes to the others), none of
        them the text of a query in ``exclude`` nor drawn from a document of ``skip_docs``. Deterministic for a seed
        and ``salt`` (another salt draws other documents); the result is in a seeded random order."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"pseudo-queries: the count must be a whole number >= 0, got {n!r}")
        weights = {k: w for k, w in parse_mix(mix).items() if w > 0 and self.available(k)}
        if not weights:
            raise ConfigError(
                f"pseudo-queries: this corpus can give none of the kinds asked for ({', '.join(parse_mix(mix))}): "
                "its documents have no titles"
            )
        banned = {normalize_query(q) for q in exclude}
        seen: set[str] = set()
        dropped = {"repeated": 0, "evaluation query": 0}
        streams = {k: self._stream(k, skip_docs, salt) for k in PSEUDO_QUERY_KINDS if k in weights}
        out: list[PseudoQuery] = []

        def take(kind: str, count: int) -> int:
            got = 0
            for text, row in streams[kind]:
                key = normalize_query(text)
                if not key:
                    continue
                if key in banned:
                    dropped["evaluation query"] += 1
                    continue
                if key in seen:
                    dropped["repeated"] += 1
                    continue
                seen.add(key)
                out.append(PseudoQuery(text, self.doc_ids[row], kind))
                got += 1
                if got == count:
                    break
            return got

        short = 0
        for kind, quota in quotas(n, weights).items():
            short += quota - take(kind, quota)
        for kind in list(streams):  # a kind that ran out of documents: the others give its share
            if short <= 0:
                break
            short -= take(kind, short)
        if len(out) < n:
            logger.warning(
                "pseudo-queries: the corpus gave %d distinct pseudo-queries of the %d asked for (%s)",
                len(out),
                n,
                ", ".join(sorted(weights)),
            )
        if dropped["evaluation query"]:
            logger.info(
                "pseudo-queries: %d drawn texts were evaluation queries and were left out", dropped["evaluation query"]
            )
        order = np.random.default_rng([self.seed, 7]).permutation(len(out))
        return [out[i] for i in order]

    def _stream(self, kind: str, skip_docs: Set[str] = frozenset(), salt: int = 0) -> Iterator[tuple[str, int]]:
        """``(text, document row)`` of ``kind``, one a document, the documents (less ``skip_docs``) in a seeded random
        order."""
        index = PSEUDO_QUERY_KINDS.index(kind)
        rng = np.random.default_rng([self.seed, index] if not salt else [self.seed, index, salt])
        make = getattr(self, f"_{kind}")
        for row in rng.permutation(len(self.doc_ids)).tolist():
            if skip_docs and self.doc_ids[row] in skip_docs:
                continue
            text = make(row, rng)
            if text:
                text = self._bounded(text)
                if text:
                    yield text, row

    def _bounded(self, text: str) -> str:
        """``text`` with words dropped from its end until it has at most ``max_tokens`` tokens (words, where no token
        count was given); ``""`` if even its first word is longer."""
        count = self.count_tokens or count_words
        words = text.split()[: self.max_tokens]  # a word is at least one token
        while words and count(" ".join(words)) > self.max_tokens:
            words.pop()
        return " ".join(words)

    # ------------------------------------------------------------------------------------------------ the kinds
    def _title(self, row: int, rng) -> str | None:
        title = self.titles[row].strip().rstrip(".").strip()
        return title if count_words(title) >= 2 else None

    def _sentences_of(self, row: int) -> list[str]:
        if row not in self._sentences:
            self._sentences[row] = split_sentences(self.bodies[row])
        return self._sentences[row]

    def _usable(self, row: int) -> list[str]:
        return [s for s in self._sentences_of(row) if count_words(s) >= MIN_SENTENCE_WORDS]

    def _ict(self, row: int, rng) -> str | None:
        usable = self._usable(row)
        return usable[int(rng.integers(len(usable)))] if usable else None

    def _span(self, row: int, rng) -> str | None:
        usable = self._usable(row)
        if not usable:
            return None
        words = usable[int(rng.integers(len(usable)))].split()
        length = self.span_lengths[int(rng.integers(len(self.span_lengths)))]
        start = int(rng.integers(max(1, len(words) - length + 1)))
        text = " ".join(words[start : start + length]).strip(_EDGE_PUNCT + " ")
        return text if count_words(text) >= 2 else None

    def _keywords(self, row: int, rng) -> str | None:
        self._index_terms()
        weights = self._weights[row]
        if len(weights) < 2:
            return None
        count = self.keyword_counts[int(rng.integers(len(self.keyword_counts)))]
        # the highest weights (ties: the earlier term), written in the order they first occur in the document
        best = sorted(weights, key=lambda s: (-weights[s], self._first[row][s]))[:count]
        best.sort(key=lambda s: self._first[row][s])
        return " ".join(self._surface[row][s] for s in best)

    def _index_terms(self, k1: float = 1.5, b: float = 0.75) -> None:
        """Each document's terms (stemmed as the BM25 index stems them, stop words and one-character or numeric
        tokens left out) with their BM25 weight in it."""
        if self._weights is not None:
            return
        import Stemmer
        from bm25s.stopwords import STOPWORDS_EN

        stem = Stemmer.Stemmer("english").stemWord
        stop = set(STOPWORDS_EN)
        docs: list[list[tuple[str, str]]] = []
        for title, body in zip(self.titles, self.bodies):
            terms = []
            for m in _WORD.finditer(f"{title} {body}" if title else body):
                word = m.group(0)
                low = word.lower()
                if len(low) < 2 or low in stop or low.replace("-", "").isdigit():
                    continue
                terms.append((stem(low), word))
            docs.append(terms)
        df: dict[str, int] = {}
        for terms in docs:
            for s in {s for s, _ in terms}:
                df[s] = df.get(s, 0) + 1
        n = len(docs)
        avgdl = max(1e-9, sum(map(len, docs)) / max(1, n))
        self._weights, self._surface, self._first = [], [], []
        for terms in docs:
            tf: dict[str, int] = {}
            surface: dict[str, str] = {}
            first: dict[str, int] = {}
            for i, (s, word) in enumerate(terms):
                tf[s] = tf.get(s, 0) + 1
                surface.setdefault(s, word)
                first.setdefault(s, i)
            norm = k1 * (1 - b + b * len(terms) / avgdl)
            self._weights.append(
                {s: math.log(1 + (n - df[s] + 0.5) / (df[s] + 0.5)) * c * (k1 + 1) / (c + norm) for s, c in tf.items()}
            )
            self._surface.append(surface)
            self._first.append(first)


def bm25_top_z(scores: np.ndarray) -> np.ndarray:
    """How far each query's best BM25 score stands above its list: ``(s_1 − mean) / std`` over each row of
    ``scores`` (a query's top ``depth`` as the index returns it, zeros included; 0 where the row is constant)."""
    s = np.asarray(scores, np.float64)
    if s.ndim != 2 or s.shape[1] == 0:
        return np.zeros(len(s))
    std = s.std(axis=1)
    return np.where(std > 0, (s[:, 0] - s.mean(axis=1)) / np.where(std > 0, std, 1.0), 0.0)


# ----------------------------------------------------------------------------------------- the fit's inverse cloze
def _drawn(texts: list[str], n: int, seed: int, min_words: int) -> list[tuple[int, list[str], int]]:
    """The documents and sentences :func:`inverse_cloze` draws: ``(row, sentences, picked sentence)``."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, list[str], int]] = []
    for row in rng.permutation(len(texts)).tolist():
        sentences = split_sentences(texts[row])
        if len(sentences) < 2:
            continue
        usable = [i for i, x in enumerate(sentences) if count_words(x) >= min_words]
        if not usable:
            continue
        out.append((row, sentences, usable[int(rng.integers(len(usable)))]))
        if len(out) == n:
            break
    return out


def inverse_cloze(
    texts: list[str], n: int = 400, seed: int = 0, min_words: int = MIN_SENTENCE_WORDS, keep_share: float = 0.0
) -> list[tuple[int, str, str]]:
    """Inverse-cloze pseudo-queries drawn from a corpus: ``(row, query, rest)`` for up to ``n`` documents taken at
    random (``seed``), where ``query`` is one sentence of the document (of at least ``min_words`` words,
    :func:`count_words`) and ``rest`` the document without it. Documents of one sentence are skipped (nothing would be
    left to find).

    ``keep_share``: the share of the sentence's words left in its place in ``rest`` (each word kept with that
    probability, drawn once per word from ``seed``, so the words kept at a share are also kept at every larger one;
    1: the whole sentence stays)."""
    drawn = _drawn(texts, n, seed, min_words)
    words_rng = np.random.default_rng([seed, 1])
    out: list[tuple[int, str, str]] = []
    for row, sentences, pick in drawn:
        words = sentences[pick].split()
        kept = [w for w, u in zip(words, words_rng.random(len(words))) if u < keep_share]
        parts = [" ".join(kept) if i == pick else x for i, x in enumerate(sentences)]
        out.append((row, sentences[pick], " ".join(x for x in parts if x)))
    return out
