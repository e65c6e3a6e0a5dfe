from .distill import HybridDistillLoss
from .idro import PRESETS, IDROLoss
from .infonce import BatchLayout, per_sample_infonce

__all__ = ["BatchLayout", "HybridDistillLoss", "IDROLoss", "PRESETS", "per_sample_infonce"]
