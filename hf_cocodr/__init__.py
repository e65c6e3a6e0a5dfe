"""hf_cocodr: COCO-DR domain adaptation for dense retrievers as Hugging Face trainers.

Public API (imported lazily, so ``import hf_cocodr`` stays cheap)::

    from hf_cocodr import load_encoder, export_sentence_transformer, evaluate_retrieval
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "load_encoder": "hf_cocodr.modeling.loading",
    "export_sentence_transformer": "hf_cocodr.export",
    "convert_checkpoint": "hf_cocodr.export",
    "evaluate_retrieval": "hf_cocodr.evaluation.retrieval",
    "evaluate_bm25": "hf_cocodr.evaluation.bm25",
    "load_beir": "hf_cocodr.data.beir",
    "BEIRFormatError": "hf_cocodr.data.beir",
    "write_model_card": "hf_cocodr.model_card",
    "IDROLoss": "hf_cocodr.finetuning",
    "IDROTrainer": "hf_cocodr.finetuning",
    "IDROTrainingArguments": "hf_cocodr.finetuning",
    "KMeansClusteringCallback": "hf_cocodr.finetuning",
    "HardNegativeRefreshCallback": "hf_cocodr.finetuning",
    "HybridDistillLoss": "hf_cocodr.finetuning",
    "DistillationTrainer": "hf_cocodr.finetuning",
    "DistillationTrainingArguments": "hf_cocodr.finetuning",
    "RetrievalTrainingData": "hf_cocodr.data.training",
    "CocoPretrainer": "hf_cocodr.pretraining",
    "CocoPretrainingArguments": "hf_cocodr.pretraining",
    "CondenserForPretraining": "hf_cocodr.modeling.condenser",
    "run_recipe": "hf_cocodr.recipe",
    "HybridRetriever": "hf_cocodr.retrieval.hybrid",
    "FusionConfig": "hf_cocodr.retrieval.fusion",
    "bundled_model_path": "hf_cocodr.modeling.bundled",
    "RecipeConfig": "hf_cocodr.recipe",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_cocodr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
