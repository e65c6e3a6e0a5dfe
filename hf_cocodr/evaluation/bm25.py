"""BM25 evaluation on a BEIR split (the index itself, :class:`~hf_cocodr.retrieval.index.BM25Index`, lives with the other
indexes)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..data.beir import BEIRData, column_numpy, corpus_texts, load_beir
from ..retrieval.index import BM25Index
from .retrieval import summarize, write_result

logger = logging.getLogger(__name__)


def evaluate_bm25(
    folder: str | os.PathLike | BEIRData,
    split: str = "test",
    *,
    top_k: int = 1000,
    k_values: tuple[int, ...] = (1, 3, 5, 10, 100, 1000),
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """BM25 on a BEIR split; same JSON keys as :func:`~hf_cocodr.evaluation.evaluate_retrieval`."""
    data = folder if isinstance(folder, BEIRData) else load_beir(folder, split)
    t0 = time.perf_counter()
    texts = [t for _, batch in corpus_texts(data.corpus) for t in batch]
    index = BM25Index(texts, name=str(data.folder))
    del texts
    index_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    qids = list(data.queries["_id"])
    scores, idx = index.search(list(data.queries["text"]), top_k)
    doc_ids = column_numpy(data.corpus, "_id")
    run = {q: {doc_ids[j]: float(s) for j, s in zip(idx[i], scores[i]) if s > 0} for i, q in enumerate(qids)}
    search_seconds = time.perf_counter() - t1
    result = summarize(data.qrels, run, k_values=k_values)
    result.update(
        num_queries=len(qids),
        num_docs=len(data.corpus),
        encode_seconds=round(index_seconds, 3),
        search_seconds=round(search_seconds, 3),
        index_backend="bm25s",
    )
    if output is not None:
        write_result(output, result, run)
    return result
