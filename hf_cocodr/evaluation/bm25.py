"""BM25 with bm25s (English Snowball stemmer, English stop words): the lexical baseline and negative miner."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from ..data.beir import BEIRData, column_numpy, corpus_texts, load_beir
from .retrieval import summarize, write_result

logger = logging.getLogger(__name__)


class BM25Index:
    """A bm25s index over a list of texts; ``search`` returns ``(scores, row_indices)`` like :class:`DenseIndex`."""

    def __init__(self, texts: list[str], *, k1: float = 1.5, b: float = 0.75, language: str = "english",
                 show_progress: bool = False):
        import bm25s
        import Stemmer

        self._bm25s = bm25s
        self.stemmer = Stemmer.Stemmer(language)
        self.stopwords = "en" if language == "english" else None
        tokens = bm25s.tokenize(texts, stopwords=self.stopwords, stemmer=self.stemmer, show_progress=show_progress)
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(tokens, show_progress=show_progress)
        self.ntotal = len(texts)
        self.show_progress = show_progress

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.ntotal)
        q_tokens = self._bm25s.tokenize(
            queries, stopwords=self.stopwords, stemmer=self.stemmer, show_progress=False,
        )
        # A query made only of stop words has no tokens; bm25s then scores every document 0.
        idx, scores = self.retriever.retrieve(q_tokens, k=k, show_progress=self.show_progress, n_threads=0)
        return np.asarray(scores, np.float32), np.asarray(idx, np.int64)


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
    index = BM25Index(texts)
    del texts
    index_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    qids = list(data.queries["_id"])
    scores, idx = index.search(list(data.queries["text"]), top_k)
    doc_ids = column_numpy(data.corpus, "_id")
    run = {
        q: {doc_ids[j]: float(s) for j, s in zip(idx[i], scores[i]) if s > 0}
        for i, q in enumerate(qids)
    }
    search_seconds = time.perf_counter() - t1
    result = summarize(data.qrels, run, k_values=k_values)
    result.update(
        num_queries=len(qids), num_docs=len(data.corpus), encode_seconds=round(index_seconds, 3),
        search_seconds=round(search_seconds, 3), index_backend="bm25s",
    )
    if output is not None:
        write_result(output, result, run)
    return result
