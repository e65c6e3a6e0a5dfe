"""DistillationTrainer and DistillationTrainingArguments: listwise distillation of a teacher's ranking.

One trainer, one config (as trl gives each method its trainer and its arguments): the trainer trains
:class:`~hf_cocodr.finetuning.losses.distill.HybridDistillLoss` on rows ``(query, candidate_1, ..., candidate_k)``
whose ``label`` column holds the teacher's ``k`` scores (e.g. the rows of
:func:`hf_cocodr.retrieval.teacher.distill_dataset`), or
:class:`~hf_cocodr.finetuning.losses.distill.QuerySideDistillLoss` on
:class:`~hf_cocodr.data.teacher.FrozenCandidateRows`, on the row-based base it shares with
:class:`~hf_cocodr.IDROTrainer` (resumable, a non-finite step skipped, the model card and the output folder as there).
No clusters, no negatives refresh. The loss is built from :class:`DistillationTrainingArguments`, the one settings
source of a distillation (the recipe's ``distill_*`` options set its fields).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sentence_transformers import SentenceTransformerTrainingArguments

from ..data.teacher import FrozenCandidateRows, TeacherRows
from ..errors import ConfigError
from .losses.distill import HybridDistillLoss, QuerySideDistillLoss
from .rows_trainer import RowsTrainer
from .training_args import check_max_steps

__all__ = ["DistillationTrainer", "DistillationTrainingArguments"]


@dataclass
class DistillationTrainingArguments(SentenceTransformerTrainingArguments):
    """Arguments of :class:`DistillationTrainer`; see
    :class:`~sentence_transformers.SentenceTransformerTrainingArguments` for the rest (``per_device_train_batch_size``
    is the number of *queries* per device and step).

    The loss (what the trainer's default loss, :meth:`DistillationTrainer.get_default_loss`, reads):
        distill_temperature: the student's temperature ``T_s`` (None: 0.05 for a cosine model, its trained scale of
            20; 1 for a dot-product model).
        distill_teacher_temperature: ``T_t`` of the teacher's scores.
        distill_in_batch_weight: ``λ`` of the in-batch InfoNCE term (0: off).
        distill_document_gradients: back-propagate through the candidates (False: a forward pass only; no meaning
            for frozen candidates).
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
        """The arguments ``arguments``, then ``overrides``; a name that is not a field (e.g. iDRO's
        ``idro_preset``, which a distillation has nothing to act on) is refused by name."""
        values = {**arguments, **overrides}
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"{cls.__name__} has no field(s) {unknown}")
        return cls(**values)

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
    ``(query, candidate_1, ..., candidate_k)`` with a ``label`` column of the teacher's ``k`` scores, or
    :class:`~hf_cocodr.data.teacher.FrozenCandidateRows`, or a :class:`~hf_cocodr.data.teacher.TeacherRows` holding
    either; each step hands the loss the rows' features and their scores. ``loss=None`` builds the loss from the
    arguments (:meth:`get_default_loss`); any loss that takes ``(features, teacher scores)`` may be given instead. The keyword arguments of
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

    def __init__(self, model=None, args=None, train_dataset=None, *pos, **kwargs):
        if isinstance(train_dataset, TeacherRows):
            train_dataset = train_dataset.rows
        super().__init__(model, args, train_dataset, *pos, **kwargs)

    def _check_rows(self, args) -> None:
        super()._check_rows(args)
        if self.training_data.row_labels([0]) is None:
            raise ValueError(
                "DistillationTrainer needs rows with the teacher's scores: a Dataset with a 'label' column "
                "(one score per candidate)"
            )

    def get_default_loss(self, model) -> HybridDistillLoss:
        """The loss the arguments describe (when the trainer is given no loss), in the model's own similarity:
        :class:`HybridDistillLoss`, or :class:`QuerySideDistillLoss` against the frozen vectors of
        :class:`~hf_cocodr.data.teacher.FrozenCandidateRows` (``distill_document_gradients`` has no meaning
        there)."""
        a, rows = self.args, self.training_data
        similarity = getattr(model, "similarity_fn_name", None) or "cosine"
        temperature = a.distill_temperature
        if temperature is None:
            temperature = 0.05 if similarity == "cosine" else 1.0
        options = dict(
            temperature=temperature,
            teacher_temperature=a.distill_teacher_temperature,
            in_batch_weight=a.distill_in_batch_weight,
            similarity=similarity,
        )
        if isinstance(rows, FrozenCandidateRows):
            if rows.vectors is None:
                raise ValueError(
                    "DistillationTrainer: FrozenCandidateRows without their vectors (vectors=...): give the rows "
                    "the frozen vectors their candidates index, or a QuerySideDistillLoss"
                )
            return QuerySideDistillLoss(model, rows.vectors, **options)
        return HybridDistillLoss(model, document_gradients=a.distill_document_gradients, **options)
