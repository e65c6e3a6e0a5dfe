"""The method interface: how a fine-tuning method plugs into :class:`~hf_cocodr.IDROTrainer`.

A method is a :class:`Method` subclass in its own module, registered in :mod:`hf_cocodr.methods.registry`. It
owns its settings (a dataclass of ``<name>_*`` fields that :class:`~hf_cocodr.IDROTrainingArguments` inherits), its
paper citation and its hooks. Every hook defaults to a no-op, so a method implements only what it changes:

========================  ====================================================================================
Hook                      What it is for
========================  ====================================================================================
``build``                 the method from the training arguments, the model, the data and the target streams
``prepare_data``          a data transform before the trainer exists (new training rows, new tokens)
``loss_terms``            auxiliary objectives added to :class:`~hf_cocodr.IDROLoss` (``auxiliary=[...]``)
``before_batch``          a batch transform: called with the row indices of each training batch
``use_row_group``         make the model encode as it does for the training rows of a group
``batch_sampler``         the batch sampler of the training rows (``None``: the trainer's own)
``encode_query_rows``     embeddings of training queries for clustering (``None``: plain query encoding)
``state_tensors``         tensors to save with every checkpoint, and ``load_state_tensors`` to restore them
                          (the trainer saves them as the checkpoint-state component ``method_<name>``)
``before_save``           make the model in memory encode as the saved model will (before each save)
``after_save``            a transform of the files of a saved model (checkpoints and the final model)
``stage_info``            lines of the fine-tuning stage on the model card
========================  ====================================================================================

Card metadata also comes from class attributes: ``citation`` (title + BibTeX), ``display_name``, ``label`` and
``reads_target_corpora`` / ``reads_target_queries`` with the names actually read (``target_corpora_read``,
``target_queries_read``), so the card can say which target data the model saw.

This module imports nothing heavy: the training arguments import the settings dataclasses through it.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, ClassVar

from ..errors import ConfigError


def check_number(args, name: str, *, positive: bool) -> None:
    """``name`` must be a finite number, > 0 (``positive``) or >= 0: nan and inf are refused by name too."""
    v = getattr(args, name)
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or (v <= 0 if positive else v < 0)
    ):
        raise ConfigError(f"{name} must be {'> 0' if positive else '>= 0'} and finite, got {v!r}")


class Method:
    """A fine-tuning method: settings, hooks into :class:`~hf_cocodr.IDROTrainer` and card metadata.

    Subclasses set ``name`` (the ``--method`` value), ``label`` (its short name on the card), ``display_name``,
    ``citation`` and ``settings`` (a dataclass whose fields are all ``<name>_*``; ``None`` for none), and override
    the hooks they need. A method instance belongs to one trainer; the trainer calls the hooks in the order the
    methods were added.
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    citation: ClassVar[dict[str, str] | None] = None
    settings: ClassVar[type | None] = None
    reads_target_corpora: ClassVar[bool] = False  # needs a target stream (--target-corpus) and reads its documents
    reads_target_queries: ClassVar[bool] = False  # may read unlabelled target queries (--target-queries)

    def __init__(self, settings: Any = None):
        self.config = settings  # an instance of ``settings`` (or None)
        self.target_corpora_read: list[str] = []
        self.target_queries_read: list[str] = []

    # ------------------------------------------------------------------------------------------ configuration
    @classmethod
    def settings_from(cls, args, **overrides) -> Any:
        """This method's settings, read from ``args`` (e.g. an IDROTrainingArguments; a field it lacks keeps its
        default); ``overrides`` that are not None replace fields of the same name."""
        if cls.settings is None:
            return None
        values = {f.name: getattr(args, f.name) for f in fields(cls.settings) if hasattr(args, f.name)}
        names = {f.name for f in fields(cls.settings)}
        values.update({k: v for k, v in overrides.items() if v is not None and k in names})
        return cls.settings(**values)

    @classmethod
    def build(cls, model, args, data, *, target_corpora=(), target_queries=(), **overrides) -> Method:
        """The method for a run: ``args`` are the training arguments, ``data`` the (untransformed) training data,
        ``target_corpora`` / ``target_queries`` the unlabelled target streams; ``overrides`` replace settings."""
        return cls(cls.settings_from(args, **overrides))

    def prepare_data(self, model, data):
        """The training data the trainer should use (``data`` unchanged by default); may also change the model
        (e.g. add tokens). Called once, before the trainer is built."""
        return data

    def loss_terms(self) -> list:
        """Auxiliary objectives of :class:`~hf_cocodr.IDROLoss`: modules with ``compute(model, embeddings, outputs,
        context) -> dict`` of named terms (names starting with ``_`` are logged metrics, not added)."""
        return []

    # ------------------------------------------------------------------------------------------ training
    def before_batch(self, trainer, rows) -> None:
        """Called with the row indices (numpy) of each training batch, before its texts are tokenized."""

    def use_row_group(self, trainer, group: str) -> None:
        """Make the model encode as it does for the training rows of ``group`` (e.g. before a negatives refresh)."""

    def batch_sampler(self, trainer, dataset, batch_size: int, seed: int):
        """A batch sampler over the training rows, or None to keep the trainer's."""
        return None

    def encode_query_rows(self, trainer, lo: int, hi: int, batch_size: int):
        """Embeddings of the training queries ``lo..hi-1`` (numpy), or None for the trainer's plain encoding."""
        return None

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_tensors(self) -> dict[str, Any]:
        """Tensors saved with every checkpoint (the state of the loss terms is saved with the loss)."""
        return {}

    def load_state_tensors(self, tensors: dict[str, Any]) -> None:
        """Restore what :meth:`state_tensors` saved (``tensors`` holds this method's keys only)."""

    # the checkpoint-state protocol (hf_cocodr.finetuning.checkpoint_state.CheckpointState), through the two hooks
    @property
    def state_name(self) -> str:
        return f"method_{self.name}"

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.state_tensors(), {}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        self.load_state_tensors(tensors)

    # ------------------------------------------------------------------------------------------ saved models
    def before_save(self, trainer) -> None:
        """Make the model in memory encode as the saved model will (before every save and at the end)."""

    def after_save(self, trainer, output_dir: str) -> None:
        """Transform the files of a model just saved to ``output_dir`` (main process only)."""

    # ------------------------------------------------------------------------------------------ model card
    def stage_info(self, args) -> dict[str, str]:
        """Lines of the fine-tuning stage on the model card (``{heading: text}``); ``args`` are the trainer's."""
        return {}

    @classmethod
    def card_metadata(cls) -> dict[str, Any]:
        """What the model card needs to know of this method without importing it: its name and citation."""
        meta: dict[str, Any] = {"display_name": cls.display_name or cls.name}
        if cls.citation:
            meta["citation"] = dict(cls.citation)
        if cls.reads_target_corpora:
            meta["reads_target_corpora"] = cls.label or cls.name
        if cls.reads_target_queries:
            meta["reads_target_queries"] = cls.label or cls.name
        return meta
