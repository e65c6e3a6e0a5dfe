"""Models: encoder loading with the COCO-DR convention, and the Condenser pretraining model."""

from .loading import build_sentence_transformer, load_encoder, pooling_mode

__all__ = ["build_sentence_transformer", "load_encoder", "pooling_mode"]
