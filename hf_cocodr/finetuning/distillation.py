"""DistillationTrainer and DistillationTrainingArguments: listwise distillation of a teacher's ranking.

One trainer, one config (as trl gives each method its trainer and its arguments): the trainer trains a distillation
loss on rows ``(query, candidate_1, ..., candidate_k)`` whose ``label`` column holds the teacher's ``k`` scores
(e.g. the rows of :func:`hf_cocodr.retrieval.teacher.distill_dataset`), or on
:class:`~hf_cocodr.data.teacher.FrozenCandidateRows`, on the row-based base it shares with
:class:`~hf_cocodr.IDROTrainer` (resumable, a non-finite step skipped, the model card and the output folder as there).
No clusters, no negatives refresh. As sentence-transformers' losses hold theirs, the loss holds its settings
(temperatures, in-batch weight, ...: :class:`~hf_cocodr.finetuning.losses.distill.HybridDistillLoss`,
:func:`~hf_cocodr.finetuning.losses.distill.distill_loss` picks the class the rows need); the arguments hold training
settings only. Given no loss, the trainer trains the rows' loss at its defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sentence_transformers import SentenceTransformerTrainingArguments

from ..data.teacher import TeacherRows
from ..errors import ConfigError
from .losses.distill import HybridDistillLoss, distill_loss
from .rows_trainer import RowsTrainer
from .training_args import check_max_steps

__all__ = ["DistillationTrainer", "DistillationTrainingArguments"]


@dataclass
class DistillationTrainingArguments(SentenceTransformerTrainingArguments):
    """Arguments of :class:`DistillationTrainer`: training settings only (the loss holds its own); see
    :class:`~sentence_transformers.SentenceTransformerTrainingArguments` for the rest (``per_device_train_batch_size``
    is the number of *queries* per device and step).

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


class DistillationTrainer(RowsTrainer):
    """Fine-tune a SentenceTransformer on a teacher's rankings with :class:`HybridDistillLoss`.

    ``train_dataset`` is a ``datasets.Dataset`` (or another :class:`~hf_cocodr.data.training.RowsSource`) of rows
    ``(query, candidate_1, ..., candidate_k)`` with a ``label`` column of the teacher's ``k`` scores, or
    :class:`~hf_cocodr.data.teacher.FrozenCandidateRows`, or a :class:`~hf_cocodr.data.teacher.TeacherRows` holding
    either; each step hands the loss the rows' features and their scores. ``loss=None`` trains the rows' loss at its
    defaults (:meth:`get_default_loss`); a loss with other settings (``distill_loss(model, rows,
    teacher_temperature=2.0)``), or any loss that takes ``(features, teacher scores)``, may be given instead (the
    loss holds its settings, as sentence-transformers' losses do). The keyword arguments of
    :class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer` (``card_methods``, ``target_queries_read``, ...) describe
    the run on the model card.

    Example:
        ::

            from hf_cocodr import DistillationTrainer, DistillationTrainingArguments, load_encoder
            from hf_cocodr.finetuning.losses import distill_loss

            model = load_encoder("out/coco")
            args = DistillationTrainingArguments(output_dir="out/distill", per_device_train_batch_size=16, max_steps=200)
            loss = distill_loss(model, rows, teacher_temperature=2.0)  # the loss holds its settings
            trainer = DistillationTrainer(model=model, args=args, train_dataset=rows, loss=loss)
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
        """The loss of the training rows at its defaults (when the trainer is given no loss), in the model's own
        similarity: :class:`~hf_cocodr.finetuning.losses.distill.HybridDistillLoss`, or
        :class:`~hf_cocodr.finetuning.losses.distill.QuerySideDistillLoss` against the frozen vectors of
        :class:`~hf_cocodr.data.teacher.FrozenCandidateRows` (:func:`~hf_cocodr.finetuning.losses.distill.
        distill_loss`)."""
        return distill_loss(model, self.training_data)
