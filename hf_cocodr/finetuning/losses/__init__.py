from .distill import HybridDistillLoss, QuerySideDistillLoss
from .idro import PRESETS, IDROLoss
from .infonce import BatchLayout, per_sample_infonce

__all__ = ["BatchLayout", "HybridDistillLoss", "IDROLoss", "PRESETS", "QuerySideDistillLoss", "per_sample_infonce"]
