"""DistillationTrainer and DistillationTrainingArguments: listwise distillation of a teacher's ranking.

One trainer, one config (as trl gives each method its trainer and its arguments): the trainer trains
:class:`~hf_cocodr.finetuning.losses.distill.HybridDistillLoss` on rows ``(query, candidate_1, ..., candidate_k)``
whose ``label`` column holds the teacher's ``k`` scores (e.g. :func:`hf_cocodr.data.teacher.distill_dataset`'s rows),
on the row-based base it shares with :class:`~hf_cocodr.IDROTrainer` (resumable, a non-finite step skipped, the
model card and the output folder as there). No clusters, no negatives refresh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sentence_transformers import SentenceTransformerTrainingArguments

from ..errors import ConfigError
from .losses.distill import HybridDistillLoss
from .rows_trainer import RowsTrainer
from .training_args import check_max_steps

__all__ = ["DistillationTrainer", "DistillationTrainingArguments"]


@dataclass
class DistillationTrainingArguments(SentenceTransformerTrainingArguments):
    """Arguments of :class:`DistillationTrainer`; see
    :class:`~sentence_transformers.SentenceTransformerTrainingArguments` for the rest (``per_device_train_batch_size``
    is the number of *queries* per device and step).

    The loss (used when the trainer builds its :class:`HybridDistillLoss` itself):
        distill_temperature: the student's temperature ``T_s`` (None: 0.05 for a cosine model, its trained scale of
            20; 1 for a dot-product model).
        distill_teacher_temperature: ``T_t`` of the teacher's scores.
        distill_in_batch_weight: ``λ`` of the in-batch InfoNCE term (0: off).
        distill_document_gradients: back-propagate through the candidates (False: a forward pass only).
    Rows:
        max_length: token limit of the training texts (None: the model's own); the saved model keeps its limits.
        packed_forward: embed the queries and their candidates together, ordered by length, in one forward per
            length group (:mod:`hf_cocodr.modeling.packing`); False: one forward per column.
        overwrite_output_dir: as for :class:`~hf_cocodr.IDROTrainingArguments`.
    """

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "replace the files of an earlier or different run recorded in output_dir"},
    )
    distill_temperature: float | None = field(
        default=None, metadata={"help": "student temperature (None: 0.05 for cosine models, 1 for dot products)"}
    )
    distill_teacher_temperature: float = field(default=1.0, metadata={"help": "teacher temperature"})
    distill_in_batch_weight: float = field(default=1.0, metadata={"help": "weight of the in-batch InfoNCE term"})
    distill_document_gradients: bool = field(
        default=True, metadata={"help": "back-propagate through the candidates' embeddings"}
    )
    max_length: int | None = field(default=None, metadata={"help": "token limit of training texts"})
    packed_forward: bool = field(
        default=True,
        metadata={
            "help": "embed every text of a step in one forward per length group (False: one forward per column)"
        },
    )

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any], **overrides) -> DistillationTrainingArguments:
        """The arguments of ``arguments`` this class has, then ``overrides``. ``arguments`` may hold
        :class:`~hf_cocodr.IDROTrainingArguments` fields (the recipe's stage arguments): the iDRO-only ones (e.g.
        ``idro_preset``) have nothing to act on in a distillation and are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in arguments.items() if k in known}, **overrides})

    def __post_init__(self):
        super().__post_init__()
        check_max_steps(self)
        for name in ("distill_temperature", "distill_teacher_temperature"):
            value = getattr(self, name)
            if value is None and name == "distill_temperature":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        w = self.distill_in_batch_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < math.inf:
            raise ConfigError(f"distill_in_batch_weight must be a number >= 0, got {w!r}")


class DistillationTrainer(RowsTrainer):
    """Fine-tune a SentenceTransformer on a teacher's rankings with :class:`HybridDistillLoss`.

    ``train_dataset`` is a ``datasets.Dataset`` (or another :class:`~hf_cocodr.data.training.RowsSource`) of rows
    ``(query, candidate_1, ..., candidate_k)`` with a ``label`` column of the teacher's ``k`` scores; each step hands
    the loss the rows' features and their scores. ``loss=None`` builds the loss from the arguments; any loss that
    takes ``(features, teacher scores)`` may be given instead. The keyword arguments of
    :class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer` (``card_methods``, ``target_queries_read``, ...) describe
    the run on the model card.

    Example:
        ::

            from hf_cocodr import DistillationTrainer, DistillationTrainingArguments, load_encoder

            args = DistillationTrainingArguments(output_dir="out/distill", per_device_train_batch_size=16,
                                                 max_steps=200, distill_teacher_temperature=1.0)
            trainer = DistillationTrainer(model=load_encoder("out/coco"), args=args, train_dataset=rows)
            trainer.train()
    """

    arguments_class = DistillationTrainingArguments
    stage_type = "distill"  # how the model card and the provenance describe the stage (stage_info)

    def _check_rows(self, args) -> None:
        super()._check_rows(args)
        if self.training_data.row_labels([0]) is None:
            raise ValueError(
                "DistillationTrainer needs rows with the teacher's scores: a Dataset with a 'label' column "
                "(one score per candidate)"
            )

    def get_default_loss(self, model) -> HybridDistillLoss:
        """The :class:`HybridDistillLoss` the arguments describe (when the trainer is given no loss)."""
        a = self.args
        similarity = getattr(model, "similarity_fn_name", None) or "cosine"
        temperature = a.distill_temperature
        if temperature is None:
            temperature = 0.05 if similarity == "cosine" else 1.0
        return HybridDistillLoss(
            model,
            temperature=temperature,
            teacher_temperature=a.distill_teacher_temperature,
            in_batch_weight=a.distill_in_batch_weight,
            similarity=similarity,
            document_gradients=a.distill_document_gradients,
        )
