"""Evaluation: exact dense retrieval, BM25, IR metrics, MTEB tasks, alignment/uniformity."""

from .bm25 import BM25Index, evaluate_bm25
from .metrics import compute_metrics
from .retrieval import build_index, encode_texts, evaluate_retrieval

__all__ = ["BM25Index", "build_index", "compute_metrics", "encode_texts", "evaluate_bm25", "evaluate_retrieval"]


def __getattr__(name):  # heavier, optional pieces load on first use
    if name == "alignment_uniformity":
        from .alignment import alignment_uniformity

        return alignment_uniformity
    raise AttributeError(name)
