"""Training rows for distillation from a retriever's ranking: ``(query, doc_1, ..., doc_k, label)``.

The teacher is any object with ``search(queries, k) -> (ids, scores)`` (a
:class:`hf_cocodr.retrieval.hybrid.HybridRetriever` of the starting model and BM25, in the recipe: its rankings come
from :mod:`hf_cocodr.retrieval.teacher`). Each query's row holds the teacher's top-``k`` documents, best first,
and ``label`` their ``k`` teacher scores, the layout ``HybridDistillLoss`` and sentence-transformers'
``DistillKLDivLoss`` read. Queries for which the teacher returns fewer than ``k`` documents are left out and counted.
The distillation's rows travel as one :class:`TeacherRows` (the teacher makes them, the recipe's stage and
:class:`~hf_cocodr.DistillationTrainer` take them).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from ..errors import ConfigError
from .beir import CORPUS_FILE, jsonl_file
from .target_queries import TargetQueries, read_target_queries
from .training import RowsSource

logger = logging.getLogger(__name__)

__all__ = [
    "FrozenCandidateRows",
    "TeacherRows",
    "TeacherSource",
    "frozen_candidate_rows",
    "route_queries",
    "teacher_rows",
]


def teacher_rows(teacher, queries: Sequence[str], doc_texts: Mapping[str, str], k: int, *, batch_size: int = 1024):
    """A ``datasets.Dataset`` with columns ``query``, ``doc_1`` … ``doc_k`` and ``label`` (a list of ``k`` floats).

    Args:
        teacher: the ranking to distil (``search(queries, k)``).
        queries: the (unlabelled) query texts.
        doc_texts: document id → the text the student encodes for it.
        k: candidates per query (at least 2: a softmax over one candidate carries nothing).
        batch_size: queries searched at once.
    """
    from datasets import Dataset

    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"teacher_rows: k must be a whole number >= 2, got {k!r}")
    columns: dict[str, list] = {"query": [], **{f"doc_{j}": [] for j in range(1, k + 1)}, "label": []}
    short = 0
    queries = list(queries)
    for start in range(0, len(queries), batch_size):
        chunk = queries[start : start + batch_size]
        ids, scores = teacher.search(chunk, k)
        for query, row_ids, row_scores in zip(chunk, ids, scores, strict=True):
            if len(row_ids) < k:
                short += 1
                continue
            columns["query"].append(query)
            for j, doc_id in enumerate(row_ids[:k], start=1):
                columns[f"doc_{j}"].append(doc_texts[doc_id])
            columns["label"].append([float(s) for s in row_scores[:k]])
    if short:
        logger.warning(
            "distillation: %d of %d queries got fewer than %d teacher candidates and were left out",
            short,
            len(queries),
            k,
        )
    if not columns["query"]:
        raise ValueError(
            f"distillation: none of the {len(queries)} queries got {k} teacher candidates; lower k or check the corpus"
        )
    return Dataset.from_dict(columns)


class FrozenCandidateRows(RowsSource):
    """Distillation rows against a frozen document index (query-side distillation): each row is a query, the
    teacher's ``k`` scores and its candidates' rows in the index's vectors. Only the query is text (a step encodes
    it alone); :meth:`row_labels` gives ``(B, 2, k)``: the scores, then the candidates' rows, as
    :class:`~hf_cocodr.finetuning.losses.distill.QuerySideDistillLoss` reads them.

    Args:
        queries: the query texts, one a row.
        scores: ``(n, k)`` teacher scores, best first.
        candidates: ``(n, k)`` rows of the frozen vectors.
        name: a label for logs and the model card.
        vectors: the frozen ``(N, d)`` vectors the candidates' rows index (the starting model's vectors of the
            corpora); :class:`~hf_cocodr.DistillationTrainer`'s default loss distils against them (None: a loss
            given to the trainer holds them).
    """

    negatives_source = "none"

    def __init__(self, queries: Sequence[str], scores, candidates, name: str = "teacher rows", *, vectors=None):
        scores = np.asarray(scores, dtype=np.float64)
        candidates = np.asarray(candidates, dtype=np.int64)
        if not len(queries):
            raise ValueError("distillation: no training rows")
        if scores.shape != candidates.shape or scores.shape[0] != len(queries) or scores.ndim != 2:
            raise ValueError(
                f"FrozenCandidateRows: {len(queries)} queries, scores {scores.shape} and candidates "
                f"{candidates.shape} do not match"
            )
        self.query_texts = list(queries)
        self.query_ids = [str(i) for i in range(len(self.query_texts))]
        self.scores, self.candidates, self.name = scores, candidates, name
        self.vectors = vectors
        self.columns = ["query"]

    def __len__(self) -> int:
        return len(self.query_texts)

    def fingerprint(self) -> dict:
        h = hashlib.sha256()
        for q in self.query_texts:
            h.update(q.encode("utf-8", "surrogatepass") + b"\x1e")
        h.update(self.scores.tobytes() + self.candidates.tobytes())
        return {"frozen_candidate_rows": h.hexdigest()[:16], "rows": len(self)}

    def row_labels(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        return np.stack([self.scores[rows], self.candidates[rows].astype(np.float64)], axis=1)

    def sample(self, rows, *, step: int, seed: int, num_negatives: int):
        return [[self.query_texts[int(r)] for r in rows]], None, None

    def state_tensors(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_tensors(self, tensors, source) -> None:  # nothing changes during training
        pass


def frozen_candidate_rows(
    teacher, queries: Sequence[str], doc_rows: Mapping[str, int], k: int, *, name: str = "", vectors=None
):
    """:class:`FrozenCandidateRows` from the teacher's top-``k`` of each query (``doc_rows``: document id → its row
    in the frozen ``vectors``); queries with fewer than ``k`` candidates are left out and counted, as in
    :func:`teacher_rows`."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"frozen_candidate_rows: k must be a whole number >= 2, got {k!r}")
    queries = list(queries)
    ids, scores = teacher.search(queries, k)
    kept = [i for i, row in enumerate(ids) if len(row) >= k]
    if len(kept) < len(queries):
        logger.warning(
            "distillation: %d of %d queries got fewer than %d teacher candidates and were left out",
            len(queries) - len(kept),
            len(queries),
            k,
        )
    if not kept:
        raise ValueError(
            f"distillation: none of the {len(queries)} queries got {k} teacher candidates; lower k or check the corpus"
        )
    row_scores = [[float(s) for s in scores[i][:k]] for i in kept]
    row_docs = [[doc_rows[d] for d in ids[i][:k]] for i in kept]
    return FrozenCandidateRows(
        [queries[i] for i in kept], row_scores, row_docs, name=name or "teacher rows", vectors=vectors
    )


class TeacherSource(TypedDict):
    """One query source the teacher ranked (as the stage's completion marker records it)."""

    queries: str  # the source's name
    corpus: str  # the target corpus its queries were ranked over
    num_queries: int
    cached: bool  # whether the teacher's indexes of the corpus came from the cache


@dataclass
class TeacherRows:
    """The distillation's training rows, as the teacher makes them and the recipe's stage and
    :class:`~hf_cocodr.DistillationTrainer` take them.

    Args:
        rows: the trainer's rows: a ``datasets.Dataset`` of ``(query, doc_1, ..., doc_k, label)``
            (:func:`teacher_rows`), or :class:`FrozenCandidateRows` holding the frozen vectors its candidates index
            (query-side distillation).
        sources: each query source the teacher ranked (none for rows of the right shape drawn for a probe).
    """

    rows: Any
    sources: list[TeacherSource] = field(default_factory=list)

    @property
    def query_side(self) -> bool:
        """Whether the candidates are rows of frozen vectors (only the queries are encoded)."""
        return isinstance(self.rows, FrozenCandidateRows)

    def __len__(self) -> int:
        return len(self.rows)


# ------------------------------------------------------------------------------------------ the recipe's teacher
def _corpus_file(corpus) -> Path | None:
    """The corpus file a target corpus or a query source's BEIR folder reads, links resolved (None: a dataset)."""

    if not isinstance(corpus, (str, os.PathLike)):
        return None
    path = Path(corpus).expanduser()
    if path.is_dir():
        path = jsonl_file(path, CORPUS_FILE)
    return path.resolve()


def route_queries(query_specs: Sequence, target_corpora: Sequence) -> list[tuple[Any, TargetQueries]]:
    """Each ``--target-queries`` source with the target corpus its teacher ranks: the corpus whose corpus file is
    the source folder's (links resolved), else the only target corpus. A source that matches none of several target
    corpora (a JSONL search log) is refused by name, before any work. A source given as ``(spec, corpus)`` (the
    recipe's own query files, :mod:`hf_cocodr.recipe.queries`; or ``(spec, corpus, name)``) is routed to that target
    corpus."""

    if not target_corpora:
        raise ConfigError("distillation needs a target corpus for the teacher to rank (--target-corpus)")
    files = [_corpus_file(c) for c in target_corpora]
    routed = []
    for spec in query_specs:
        if isinstance(spec, tuple):  # pinned to its corpus (and named: what the queries are, for the records)
            spec, corpus, *name = spec
            if not any(corpus is c or corpus == c for c in target_corpora):
                raise ConfigError(f"queries {spec}: {corpus} is not a target corpus")
            src = read_target_queries(spec)
            if name:
                src.name = name[0]
            routed.append((corpus, src))
            continue
        src = read_target_queries(spec)
        own = _corpus_file(src.folder) if src.folder is not None else None
        match = [c for c, f in zip(target_corpora, files) if own is not None and f == own]
        if match:
            routed.append((match[0], src))
        elif src.folder is None and len(target_corpora) == 1:  # a search log: the one target corpus
            routed.append((target_corpora[0], src))
        elif src.folder is not None:
            raise ConfigError(
                f"--target-queries {spec}: these queries belong to the corpus of {src.folder}, which is not a target "
                f"corpus ({', '.join(str(c) for c in target_corpora)}); the teacher ranks them over their own "
                "corpus: add it with --target-corpus"
            )
        else:
            raise ConfigError(
                f"--target-queries {spec}: which target corpus are these queries for? A JSONL file names none and "
                f"there are {len(target_corpora)} target corpora ({', '.join(str(c) for c in target_corpora)}); "
                "give them as DIR:SPLIT of the corpus's BEIR folder, or distil one target corpus per run"
            )
    return routed
