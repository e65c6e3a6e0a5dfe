"""Training rows for distillation from a retriever's ranking: ``(query, doc_1, ..., doc_k, label)``.

The teacher is any object with ``search(queries, k) -> (ids, scores)`` (a :class:`hf_cocodr.hybrid.HybridRetriever`
of the starting model and BM25, in the recipe). Each query's row holds the teacher's top-``k`` documents, best first,
and ``label`` their ``k`` teacher scores, the layout ``HybridDistillLoss`` and sentence-transformers'
``DistillKLDivLoss`` read. Queries for which the teacher returns fewer than ``k`` documents are left out and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

__all__ = ["teacher_rows"]


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
        raise ValueError(f"distillation: no query got {k} teacher candidates; lower k or check the corpus")
    return Dataset.from_dict(columns)
