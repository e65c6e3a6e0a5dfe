"""Search, one home below both training and evaluation: encoding a corpus and queries with a model
(:mod:`~hf_cocodr.retrieval.encoding`, as a run's :class:`~hf_cocodr.retrieval.session.EncodingSession` says), the
exact dense and BM25 indexes and K-Means (:mod:`~hf_cocodr.retrieval.index`), the fusion of two rankings (its rules:
:mod:`~hf_cocodr.retrieval.fusion`; their label-free fit: :mod:`~hf_cocodr.retrieval.fusion_fit`), the hybrid retriever
(:mod:`~hf_cocodr.retrieval.hybrid`) and the distillation teacher's rankings (:mod:`~hf_cocodr.retrieval.teacher`).

Names are imported on first use, so ``import hf_cocodr.retrieval.fusion`` loads no torch.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "encode_texts": "encoding",
    "build_index": "encoding",
    "search_run": "encoding",
    "model_similarity": "encoding",
    "EncodingSession": "session",
    "DenseIndex": "index",
    "IndexChoice": "ann",
    "BM25Index": "index",
    "kmeans": "index",
    "FusionConfig": "fusion",
    "fuse": "fusion",
    "HybridRetriever": "hybrid",
    "teacher_rankings": "teacher",
    "distill_dataset": "teacher",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_cocodr.retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
