"""Data: BEIR-format loading and validation, spans for COCO, training rows and negatives for iDRO."""

from .beir import (
    BEIRData,
    BEIRFormatError,
    available_splits,
    corpus_texts,
    doc_text,
    load_beir,
    load_corpus,
    load_qrels,
    load_queries,
)

__all__ = [
    "BEIRData",
    "BEIRFormatError",
    "available_splits",
    "corpus_texts",
    "doc_text",
    "load_beir",
    "load_corpus",
    "load_qrels",
    "load_queries",
]
