"""Training pairs mined from an unlabelled target corpus: no queries, no relevance labels.

Two kinds of free in-domain positives (the inverse-cloze family, Lee et al., ACL 2019):

* ``"title_body"``: a document's title is the query, its body (without the title) the positive. Scientific,
  medical and legal corpora usually carry titles, and a title is a short query-like statement about its body.
  Documents without a title are skipped (counted in the log).
* ``"ict"``: one sentence of the document (drawn with a seeded generator) is the query, the rest of the document
  the positive. Works on any corpus whose documents have at least two sentences.

The result is an ordinary :class:`~hf_cocodr.data.RetrievalTrainingData` (one row per document, the positive's text
is the "rest" of that document), so the iDRO trainer, BM25 warm-up negatives mined *within the target corpus* and the
self-negative refresh all work on it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .beir import column_numpy, load_corpus
from .options import PSEUDO_PAIR_MODES
from .spans import jsonl_title_text, split_sentences_regex
from .training import RetrievalTrainingData

logger = logging.getLogger(__name__)


def _title_text_records(spec, text_column: str = "text") -> tuple[str, Iterator[tuple[str, str]]]:
    """``(name, iterator of (title, text))`` for a BEIR folder, a JSONL file or a ``datasets.Dataset``."""
    import datasets

    if isinstance(spec, datasets.Dataset):
        if text_column not in spec.column_names:
            raise ValueError(f"the dataset has no {text_column!r} column (columns: {spec.column_names})")
        titles = spec["title"] if "title" in spec.column_names else [""] * len(spec)
        return spec.info.dataset_name or "dataset", zip(titles, spec[text_column])
    path = Path(str(spec)).expanduser()
    if path.is_dir():
        corpus = load_corpus(path)
        titles = column_numpy(corpus, "title").tolist() if "title" in corpus.column_names else [""] * len(corpus)
        return path.name, zip(titles, column_numpy(corpus, "text").tolist())
    if path.is_file():
        return path.stem, jsonl_title_text(path, text_column)
    raise FileNotFoundError(f"corpus {spec} not found: expected a BEIR folder, a JSONL file or a datasets.Dataset")


def _ict_pair(text: str, rng: np.random.Generator, split) -> tuple[str, str] | None:
    sents = split(text)
    if len(sents) < 2:
        return None
    i = int(rng.integers(len(sents)))
    return sents[i], " ".join(s for j, s in enumerate(sents) if j != i)


def _document_pairs(
    name: str, records, mode: str, rng: np.random.Generator, min_query_chars: int
) -> list[tuple[str, str, str]]:
    """The ``(query, positive, id)`` pair of each usable document of one corpus; logs how many were used and
    skipped."""
    pairs = []
    skipped = 0
    for i, (title, text) in enumerate(records):
        title, text = (title or "").strip(), (text or "").strip()
        if mode == "title_body":
            pair = (title, text) if len(title) >= min_query_chars and text else None
        else:
            pair = _ict_pair(text, rng, split_sentences_regex) if text else None
            if pair is not None and len(pair[0]) < min_query_chars:
                pair = None
        if pair is None:
            skipped += 1
            continue
        pairs.append((pair[0], pair[1], f"{name}/{i}"))
    logger.info(
        "pseudo pairs (%s) from %s: %d documents used, %d skipped (%s)",
        mode,
        name,
        len(pairs),
        skipped,
        "no title or empty body" if mode == "title_body" else "fewer than two sentences",
    )
    return pairs


def target_pseudo_pairs(
    corpora: Iterable,
    mode: str = "title_body",
    *,
    negatives: str = "bm25",
    bm25_top_k: int = 30,
    max_pairs: int | None = None,
    seed: int = 0,
    min_query_chars: int = 12,
    text_column: str = "text",
) -> RetrievalTrainingData:
    """Query/positive pairs from the documents of ``corpora`` alone (see the module docstring).

    Args:
        corpora: BEIR folders, JSONL files (``text`` [+ ``title``]) or ``datasets.Dataset`` objects.
        mode: ``"title_body"`` or ``"ict"``.
        negatives: ``"bm25"`` mines hard negatives for each pseudo query among the other documents of the same
            target corpora (its own document excluded); ``"none"``: in-batch negatives only.
        max_pairs: keep a seeded random subset of this many pairs.
        min_query_chars: shorter titles/sentences are not used as queries.
    """
    import datasets

    if mode not in PSEUDO_PAIR_MODES:
        raise ValueError(f"pseudo-pair mode must be one of {PSEUDO_PAIR_MODES}, got {mode!r}")

    rng = np.random.default_rng(seed)
    queries: list[str] = []
    bodies: list[str] = []
    ids: list[str] = []
    names = []
    for spec in corpora:
        name, records = _title_text_records(spec, text_column)
        names.append(name)
        for query, body, doc_id in _document_pairs(name, records, mode, rng, min_query_chars):
            queries.append(query)
            bodies.append(body)
            ids.append(doc_id)
    if not queries:
        raise ValueError(
            f"no {mode} pseudo pairs could be built from {names}: "
            + (
                "the documents have no titles; use mode='ict'"
                if mode == "title_body"
                else "no document has two sentences"
            )
        )
    if max_pairs is not None and max_pairs < len(queries):
        keep = np.sort(np.random.default_rng(seed).choice(len(queries), max_pairs, replace=False))
        queries, bodies, ids = [queries[i] for i in keep], [bodies[i] for i in keep], [ids[i] for i in keep]
    corpus = datasets.Dataset.from_dict({"_id": ids, "text": bodies})
    data = RetrievalTrainingData(
        corpus, [f"q:{d}" for d in ids], queries, [[i] for i in range(len(ids))], name=f"{'+'.join(names)}:{mode}"
    )
    data.pseudo_pairs_mode = mode  # the model card says these are pseudo pairs, not source labels
    data.corpora = names
    if negatives == "bm25":
        data.mine_bm25_negatives(top_k=bm25_top_k)
    elif negatives != "none":
        raise ValueError(f"negatives must be 'bm25' or 'none', got {negatives!r}")
    logger.info("%s: %d pseudo pairs", data.name, len(data))
    return data
