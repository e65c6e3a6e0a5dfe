from .distill import HybridDistillLoss, QuerySideDistillLoss, distill_loss
from .idro import PRESETS, IDROLoss
from .infonce import BatchLayout, per_sample_infonce

__all__ = [
    "BatchLayout",
    "HybridDistillLoss",
    "IDROLoss",
    "PRESETS",
    "QuerySideDistillLoss",
    "distill_loss",
    "per_sample_infonce",
]
