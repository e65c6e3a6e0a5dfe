"""Spans for COCO pretraining: offline sentence splitting, span grouping, corpus loading and caching.

Each document becomes a list of spans (token-id lists, no special tokens):

* ``span_mode="sentence_groups"`` (COCO-DR's default): sentences are greedily grouped into spans of at most
  ``span_max_tokens`` word pieces; at each sentence boundary the current span is closed early with probability
  ``span_break_prob``; a single sentence longer than the limit is its own span.
* ``span_mode="random_crops"`` (coCondenser style): the document's tokens are kept whole and two
  non-overlapping crops of ``span_len`` tokens are cut at sampling time.

Documents that cannot give two spans are skipped and counted. Built spans are cached on disk (keyed by the
corpus, the tokenizer and the settings), so a second run starts at once. The cache heals itself: a damaged entry is
rebuilt with a warning naming it, a write that fails leaves nothing, and a new entry for a corpus file that changed
replaces the entries of its earlier contents.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..rundir.file_hash import file_sha256
from ..storage import cache_dir, remove_entry, staged_file
from ..utils import atomic_write_json
from .beir import BEIRFormatError, check_text_field, doc_text, iter_jsonl_records, jsonl_file, load_corpus

logger = logging.getLogger(__name__)

_ABBREV = {
    "e.g",
    "i.e",
    "et al",
    "al",
    "fig",
    "figs",
    "eq",
    "eqs",
    "ref",
    "refs",
    "dr",
    "mr",
    "mrs",
    "ms",
    "prof",
    "vs",
    "etc",
    "approx",
    "no",
    "vol",
    "pp",
    "ca",
    "cf",
    "resp",
    "st",
    "jr",
    "sr",
    "inc",
    "ltd",
    "co",
    "u.s",
    "u.k",
    "dept",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
}
_BOUNDARY = re.compile(r"[.!?]['\")\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences_regex(text: str) -> list[str]:
    """A fast rule-based English sentence splitter (abbreviation- and initial-aware)."""
    out, start = [], 0
    for m in _BOUNDARY.finditer(text):
        end = m.start() + 1
        prev = text[start:end].rstrip(".!?'\")]").rsplit(None, 1)
        last = prev[-1].lower() if prev else ""
        if text[m.start()] == "." and (last in _ABBREV or (len(last) == 1 and last.isalpha())):
            continue
        sent = text[start : m.end()].strip()
        if sent:
            out.append(sent)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def get_sentence_splitter(name: str):
    if name == "regex":
        return split_sentences_regex
    if name == "pysbd":
        try:
            import pysbd
        except ImportError:  # pragma: no cover
            raise ImportError("sentence_splitter='pysbd' needs pysbd: pip install pysbd") from None
        seg = pysbd.Segmenter(language="en", clean=False)
        return lambda text: [s.strip() for s in seg.segment(text) if s.strip()]
    raise ValueError(f"sentence_splitter must be 'regex' or 'pysbd', got {name!r}")


def group_sentences(
    lengths: Sequence[int], max_tokens: int, break_prob: float, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """Greedy grouping of consecutive sentences into ``[start, end)`` sentence ranges."""
    groups, start, cur = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (cur + n > max_tokens or rng.random() < break_prob):
            groups.append((start, i))
            start, cur = i, 0
        cur += n
    if len(lengths) > start:
        groups.append((start, len(lengths)))
    return groups


@dataclass
class CorpusSource:
    """One input corpus: a name (for logs and the model card) and a way to iterate its texts."""

    name: str
    texts: object  # callable returning an iterable of texts
    fingerprint: str
    origin: str = ""  # where the corpus lives (a file's path), the same when its contents change; "" = fingerprint


def corpus_source(spec, text_column: str = "text") -> CorpusSource:
    """A BEIR folder, a JSONL file (``text`` [+ ``title``] per line) or a ``datasets.Dataset`` with a text column."""
    import datasets

    if isinstance(spec, datasets.Dataset):
        if text_column not in spec.column_names:
            raise ValueError(
                f"the dataset has no {text_column!r} column (columns: {spec.column_names}); pass text_column=..."
            )
        if len(spec) == 0:
            raise ValueError("the corpus dataset is empty")
        has_title = "title" in spec.column_names

        def gen_ds():
            for start in range(0, len(spec), 10_000):
                b = spec[start : start + 10_000]
                titles = b["title"] if has_title else [""] * len(b[text_column])
                for t, x in zip(titles, b[text_column]):
                    yield doc_text(t, x or "")

        return CorpusSource(spec.info.dataset_name or "dataset", gen_ds, f"ds:{spec._fingerprint}:{text_column}")
    path = Path(str(spec)).expanduser()
    if path.is_dir():
        corpus = load_corpus(path)

        def gen_beir():
            titles = corpus.data.column("title")
            texts = corpus.data.column("text")
            for t, x in zip(titles.to_pylist(), texts.to_pylist()):
                yield doc_text(t, x)

        content = file_sha256(jsonl_file(path, "corpus.jsonl"))  # (every byte: a corpus rewritten in place is new)
        return CorpusSource(path.name, gen_beir, f"beir:{path.resolve()}:{content}", f"beir:{path.resolve()}")
    if path.is_file():

        def gen_jsonl():
            for title, text in jsonl_title_text(path, text_column):
                yield doc_text(title, text)

        return CorpusSource(
            path.stem, gen_jsonl, f"jsonl:{path.resolve()}:{file_sha256(path)}", f"jsonl:{path.resolve()}"
        )
    raise FileNotFoundError(f"corpus {spec} not found: expected a BEIR folder, a JSONL file or a datasets.Dataset")


def jsonl_title_text(path: Path, text_column: str = "text"):
    """``(title, text)`` of every record of a JSONL corpus file; errors name the file and the line."""

    for lineno, rec in iter_jsonl_records(path, "corpus"):
        if text_column not in rec:
            raise BEIRFormatError(f"missing field {text_column!r} (found {sorted(rec)}).", path, lineno)
        yield (
            check_text_field(rec.get("title"), "title", path, lineno),
            check_text_field(rec[text_column], text_column, path, lineno),
        )


def continuation_table(tokenizer) -> np.ndarray:
    """``is_continuation[token_id]``: True for sub-word pieces that continue a word (for whole-word masking)."""
    vocab = tokenizer.get_vocab()
    table = np.zeros(max(vocab.values()) + 1, dtype=bool)
    pieces = list(vocab.items())
    wordpiece = any(t.startswith("##") for t, _ in pieces[:5000])
    sp_marker = next((m for m in ("▁", "Ġ") if any(t.startswith(m) for t, _ in pieces[:5000])), None)
    special = set(tokenizer.all_special_ids)
    for tok, i in pieces:
        if i in special:
            continue
        if wordpiece:
            table[i] = tok.startswith("##")
        elif sp_marker:
            table[i] = not tok.startswith(sp_marker)
    return table


class _SpanArrays:
    """The growing arrays of a :class:`SpanCorpus`: documents -> their spans -> the spans' tokens."""

    def __init__(self):
        self.doc_span_ptr, self.span_tok_ptr, self.tokens, self.doc_source = [0], [0], [], []

    def add(self, documents: list[list[np.ndarray] | None], source: int) -> int:
        """Append each document's spans; returns how many documents were skipped (``None``: too short)."""
        skipped = 0
        for spans in documents:
            if spans is None:
                skipped += 1
                continue
            for span in spans:
                self.tokens.append(span)
                self.span_tok_ptr.append(self.span_tok_ptr[-1] + len(span))
            self.doc_span_ptr.append(self.doc_span_ptr[-1] + len(spans))
            self.doc_source.append(source)
        return skipped


def _batch_spans(
    batch: list[str],
    *,
    tokenizer,
    mode: str,
    split,
    rng: np.random.Generator,
    span_max_tokens: int,
    span_break_prob: float,
    min_span_tokens: int,
    max_doc_tokens: int,
) -> list[list[np.ndarray] | None]:
    """The spans (token id arrays) of each document of ``batch``, or ``None`` for a document that cannot give two:
    ``random_crops`` keeps the whole document as one span to crop from; ``sentence_groups`` groups its sentences."""
    if not batch:
        return []
    if mode == "random_crops":
        ids = tokenizer(batch, add_special_tokens=False, truncation=True, max_length=max_doc_tokens)["input_ids"]
        return [[np.asarray(d, dtype=np.int32)] if len(d) >= 2 * min_span_tokens else None for d in ids]
    sents = [split(t) for t in batch]
    flat = [s for ss in sents for s in ss]
    ids = (
        tokenizer(flat, add_special_tokens=False, truncation=True, max_length=max_doc_tokens)["input_ids"]
        if flat
        else []
    )
    out, pos = [], 0
    for ss in sents:
        sent_ids = ids[pos : pos + len(ss)]
        pos += len(ss)
        groups = group_sentences([len(x) for x in sent_ids], span_max_tokens, span_break_prob, rng)
        spans = [np.concatenate([np.asarray(sent_ids[k], dtype=np.int32) for k in range(a, b)]) for a, b in groups]
        spans = [s for s in spans if len(s) >= min_span_tokens]
        out.append(spans if len(spans) >= 2 else None)
    return out


class SpanCorpus:
    """Spans of one or several corpora, stored as flat Arrow arrays (docs → spans → token ids)."""

    def __init__(
        self,
        doc_span_ptr: np.ndarray,
        span_tok_ptr: np.ndarray,
        tokens: np.ndarray,
        doc_source: np.ndarray,
        sources: list[str],
        mode: str,
        stats: dict,
    ):
        self.doc_span_ptr = doc_span_ptr
        self.span_tok_ptr = span_tok_ptr
        self.tokens = tokens
        self.doc_source = doc_source
        self.sources = sources
        self.mode = mode
        self.stats = stats

    def __len__(self) -> int:
        return len(self.doc_span_ptr) - 1

    def spans_of(self, doc: int) -> list[np.ndarray]:
        a, b = self.doc_span_ptr[doc], self.doc_span_ptr[doc + 1]
        return [self.tokens[self.span_tok_ptr[s] : self.span_tok_ptr[s + 1]] for s in range(a, b)]

    def sample_pair(self, doc: int, rng: np.random.Generator, span_len: int) -> tuple[np.ndarray, np.ndarray]:
        spans = self.spans_of(doc)
        if self.mode == "random_crops":
            toks = spans[0]
            n = len(toks)
            ln = min(span_len, n // 2)
            # two non-overlapping crops: pick a split point, one crop on each side
            cut = int(rng.integers(ln, n - ln + 1))
            a0 = int(rng.integers(0, cut - ln + 1))
            b0 = int(rng.integers(cut, n - ln + 1))
            first, second = toks[a0 : a0 + ln], toks[b0 : b0 + ln]
            return (first, second) if rng.random() < 0.5 else (second, first)
        i, j = rng.choice(len(spans), 2, replace=False)
        return spans[int(i)], spans[int(j)]

    # ------------------------------------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        corpora: Iterable,
        tokenizer,
        *,
        mode: str = "sentence_groups",
        span_max_tokens: int = 30,
        span_break_prob: float = 0.1,
        span_len: int = 64,
        min_span_tokens: int = 4,
        sentence_splitter: str = "regex",
        seed: int = 42,
        text_column: str = "text",
        max_doc_tokens: int = 4096,
        cache: bool = True,
    ) -> SpanCorpus:
        if mode not in ("sentence_groups", "random_crops"):
            raise ValueError(f"span_mode must be 'sentence_groups' or 'random_crops', got {mode!r}")
        if isinstance(corpora, (str, os.PathLike)) or not isinstance(corpora, (list, tuple)):
            corpora = [corpora]
        if not corpora:
            raise ValueError("no corpus given: pass at least one BEIR folder, JSONL file or dataset")
        sources = [corpus_source(c, text_column) for c in corpora]
        settings = dict(
            mode=mode,
            span_max_tokens=span_max_tokens,
            span_break_prob=span_break_prob,
            span_len=span_len,
            min_span_tokens=min_span_tokens,
            splitter=sentence_splitter,
            seed=seed,
            max_doc_tokens=max_doc_tokens,
            tokenizer=_tokenizer_fingerprint(tokenizer),
            v=2,
        )
        cache_file = _cache_file(sources, settings) if cache else None
        if cache_file is not None and cache_file.exists():
            out = cls._load_or_discard(cache_file)
            if out is not None:
                logger.info("spans loaded from cache %s", cache_file)
                return out
        spans_of = functools.partial(
            _batch_spans,
            tokenizer=tokenizer,
            mode=mode,
            split=get_sentence_splitter(sentence_splitter),
            rng=np.random.default_rng(seed),
            span_max_tokens=span_max_tokens,
            span_break_prob=span_break_prob,
            min_span_tokens=min_span_tokens,
            max_doc_tokens=max_doc_tokens,
        )
        arrays, per_source = cls._read_sources(sources, spans_of)
        out = cls._from_arrays(arrays, sources, per_source, mode, min_span_tokens)
        if cache_file is not None:
            out._save(cache_file)
            _prune_older_entries(cache_file)
        return out

    @staticmethod
    def _read_sources(sources: list[CorpusSource], spans_of) -> tuple[_SpanArrays, list[dict]]:
        """Each source's documents, 512 at a time, through ``spans_of`` into one :class:`_SpanArrays`; returns the
        arrays and per-source counts (documents read, skipped). An empty source raises."""
        arrays = _SpanArrays()
        per_source = []
        for si, src in enumerate(sources):
            n_docs = n_skipped = 0
            batch: list[str] = []
            for text in src.texts():
                n_docs += 1
                if text and text.strip():
                    batch.append(text)
                else:
                    n_skipped += 1
                if len(batch) >= 512:
                    n_skipped += arrays.add(spans_of(batch), si)
                    batch = []
            n_skipped += arrays.add(spans_of(batch), si)
            per_source.append({"corpus": src.name, "documents": n_docs, "skipped": n_skipped})
            if n_docs == 0:
                raise ValueError(f"corpus {src.name!r} is empty")
        return arrays, per_source

    @classmethod
    def _from_arrays(
        cls,
        arrays: _SpanArrays,
        sources: list[CorpusSource],
        per_source: list[dict],
        mode: str,
        min_span_tokens: int,
    ) -> SpanCorpus:
        """The corpus of the grown arrays, with its statistics; raises when no document yielded two spans."""
        doc_span_ptr, span_tok_ptr, tokens, doc_source = (
            arrays.doc_span_ptr,
            arrays.span_tok_ptr,
            arrays.tokens,
            arrays.doc_source,
        )
        n_used = len(doc_span_ptr) - 1
        stats = {
            "sources": per_source,
            "documents_used": n_used,
            "documents_skipped": sum(p["skipped"] for p in per_source),
            "spans": len(span_tok_ptr) - 1,
            "mode": mode,
        }
        if n_used == 0:
            hint = (
                f"documents need at least two sentences/spans of >= {min_span_tokens} tokens"
                if mode == "sentence_groups"
                else f"documents need at least {2 * min_span_tokens} tokens"
            )
            raise ValueError(
                f"no document yields two spans ({stats['documents_skipped']} skipped): {hint}. "
                "Try span_mode='random_crops' or a smaller span_max_tokens."
            )
        out = cls(
            np.asarray(doc_span_ptr, np.int64),
            np.asarray(span_tok_ptr, np.int64),
            np.concatenate(tokens).astype(np.int32),
            np.asarray(doc_source, np.int32),
            [s.name for s in sources],
            mode,
            stats,
        )
        return out

    def _save(self, path: Path) -> None:
        """Arrays to ``.npz`` (no pickle), then the JSON metadata, whose presence marks a complete cache entry. Both
        are staged beside their destination and renamed into place; a failed write leaves neither."""
        with staged_file(path.with_suffix(".npz")) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                doc_span_ptr=self.doc_span_ptr,
                span_tok_ptr=self.span_tok_ptr,
                tokens=self.tokens,
                doc_source=self.doc_source,
            )
        atomic_write_json(
            path, {"sources": self.sources, "mode": self.mode, "stats": self.stats, "tokens": int(len(self.tokens))}
        )

    @classmethod
    def _load(cls, path: Path) -> SpanCorpus:
        """The entry whose metadata is ``path``; raises on any damage (unreadable, truncated, inconsistent)."""
        meta = json.loads(path.read_text())
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as arrays:
            doc_span_ptr, span_tok_ptr, tokens, doc_source = (
                arrays["doc_span_ptr"],
                arrays["span_tok_ptr"],
                arrays["tokens"],
                arrays["doc_source"],
            )
        n_docs, n_spans = len(doc_span_ptr) - 1, len(span_tok_ptr) - 1
        if not (
            n_docs >= 1
            and n_spans >= 1
            and len(doc_source) == n_docs
            and doc_span_ptr[-1] == n_spans
            and span_tok_ptr[-1] == len(tokens)
            and meta.get("tokens", len(tokens)) == len(tokens)
        ):
            raise ValueError(f"inconsistent arrays ({n_docs} documents, {n_spans} spans, {len(tokens)} tokens)")
        return cls(doc_span_ptr, span_tok_ptr, tokens, doc_source, meta["sources"], meta["mode"], meta["stats"])

    @classmethod
    def _load_or_discard(cls, path: Path) -> SpanCorpus | None:
        """The cached entry, or None when it is damaged: it is then removed (with a warning naming it) and rebuilt."""
        try:
            return cls._load(path)
        except Exception as e:  # zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, ...
            problem = " ".join(str(e).split())[:200] or type(e).__name__
        logger.warning("span cache entry %s is damaged (%s); removing it and building the spans again", path, problem)
        for p in (path, path.with_suffix(".npz")):
            remove_entry(p)
        return None


def _cache_dir() -> Path:
    return cache_dir("spans")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _cache_file(sources: list[CorpusSource], settings: dict) -> Path:
    """``spans-<lineage>-<key>.json``: the lineage names the corpora by where they live (and the settings), the key
    adds their contents' fingerprints; a corpus file that changed gets a new key under the same lineage."""
    lineage = _digest([s.origin or s.fingerprint for s in sources] + [settings])
    key = _digest([s.fingerprint for s in sources] + [settings])
    return _cache_dir() / f"spans-{lineage}-{key}.json"


# entries and temporary files of the earlier naming (one key, temporary files without a writer's id)
_LEGACY = re.compile(r"^spans-[0-9a-f]{24}\.(json|npz)$|^\.spans-[0-9a-f]{24}\.(\d+\.npz|json\..+\.tmp)$")


def _prune_older_entries(current: Path) -> None:
    """Remove the cache entries of the same corpora and settings built from their earlier contents, and those of
    the earlier naming of cache entries (which no version reads any more)."""
    lineage = current.stem.rsplit("-", 1)[0]
    for p in current.parent.iterdir():
        older = p.name.startswith(f"{lineage}-") and p.stem != current.stem and p.suffix in (".json", ".npz")
        if older or _LEGACY.match(p.name):
            remove_entry(p)
            logger.info("removed the span cache entry %s (an earlier version of the corpus or of the cache)", p)


def _tokenizer_fingerprint(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256(json.dumps(sorted(vocab.items())[:2000]).encode())
    h.update(str(len(vocab)).encode())
    h.update(repr(tokenizer("Hello World, COCO-DR!", add_special_tokens=False)["input_ids"]).encode())
    return h.hexdigest()[:16]
