"""Evaluation: exact dense retrieval and BM25 on BEIR splits, IR metrics, MTEB tasks, alignment/uniformity.

Encoding, indexes and search live below, in :mod:`hf_cocodr.retrieval`."""

from .bm25 import evaluate_bm25
from .metrics import compute_metrics
from .retrieval import evaluate_retrieval

__all__ = ["compute_metrics", "evaluate_bm25", "evaluate_retrieval"]


def __getattr__(name):  # heavier, optional pieces load on first use
    if name == "alignment_uniformity":
        from .alignment import alignment_uniformity

        return alignment_uniformity
    raise AttributeError(name)
