"""Data: BEIR-format loading and validation, spans for COCO, training rows and negatives for iDRO.

Names are imported on first use, so importing the package loads neither pyarrow nor numpy."""

from __future__ import annotations

import importlib

_LAZY = {
    **{
        name: "beir"
        for name in (
            "BEIRData",
            "BEIRFormatError",
            "available_splits",
            "corpus_texts",
            "doc_text",
            "load_beir",
            "load_corpus",
            "load_qrels",
            "load_queries",
        )
    },
    "RetrievalTrainingData": "training",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_cocodr.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
