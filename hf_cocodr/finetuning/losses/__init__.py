from .idro import PRESETS, IDROLoss
from .infonce import BatchLayout, per_sample_infonce

__all__ = ["BatchLayout", "IDROLoss", "PRESETS", "per_sample_infonce"]
