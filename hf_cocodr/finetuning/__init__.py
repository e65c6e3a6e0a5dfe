"""Fine-tuning: the row-based trainers (IDROTrainer and its arguments, IDROLoss and the clustering/negatives
callbacks; DistillationTrainer, its arguments and HybridDistillLoss) on their shared base, RowsTrainer."""

from .callbacks import HardNegativeRefreshCallback, KMeansClusteringCallback
from .checkpoint_state import CheckpointState
from .distillation import DistillationTrainer, DistillationTrainingArguments
from .losses import HybridDistillLoss, IDROLoss
from .rows_trainer import RowsTrainer
from .trainer import IDROTrainer
from .training_args import IDROTrainingArguments

__all__ = [
    "CheckpointState",
    "DistillationTrainer",
    "DistillationTrainingArguments",
    "HardNegativeRefreshCallback",
    "HybridDistillLoss",
    "IDROLoss",
    "IDROTrainer",
    "IDROTrainingArguments",
    "KMeansClusteringCallback",
    "RowsTrainer",
]
