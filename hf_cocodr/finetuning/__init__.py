"""iDRO fine-tuning: IDROTrainer, IDROTrainingArguments, IDROLoss and the clustering/negatives callbacks."""

from .callbacks import HardNegativeRefreshCallback, KMeansClusteringCallback
from .losses import IDROLoss
from .trainer import IDROTrainer
from .training_args import IDROTrainingArguments

__all__ = [
    "HardNegativeRefreshCallback",
    "IDROLoss",
    "IDROTrainer",
    "IDROTrainingArguments",
    "KMeansClusteringCallback",
]
