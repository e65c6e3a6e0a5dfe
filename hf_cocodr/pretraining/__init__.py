"""COCO continuous contrastive pretraining: CocoPretrainer, CocoPretrainingArguments, the span builder."""

from .collator import SpanPairBuilder
from .trainer import CocoPretrainer
from .training_args import CocoPretrainingArguments

__all__ = ["CocoPretrainer", "CocoPretrainingArguments", "SpanPairBuilder"]
