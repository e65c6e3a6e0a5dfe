"""RowsTrainer: the shared base of the row-based trainers (:class:`~hf_cocodr.IDROTrainer`,
:class:`~hf_cocodr.DistillationTrainer`).

A row-based trainer's dataloader yields row indices of a :class:`~hf_cocodr.data.training.RowsSource`; each step
turns them into texts as drawn at that step (current negatives, the step's seed), so state that changes during
training (re-clustering, refreshed negatives) takes effect at the next step and a resumed run draws exactly what the
uninterrupted run drew. The base owns everything that does not depend on the loss: the rows, evaluation on rows,
the skip of a step whose loss is not finite, the methods' hooks, the checkpoint state (one protocol,
:class:`~hf_cocodr.finetuning.checkpoint_state.CheckpointState`), the model card and the output folder.
A subclass names its arguments class and its default loss, and may override :meth:`rows_loss` (how the loss is
called on a step's rows) and :meth:`prepare_loss` (to insert the callbacks its loss needs, as sentence-transformers'
trainers do).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformerTrainer

from ..data.training import RowsSource, StaticRows
from ..errors import ConfigError, disk_faults
from ..hub import check_push_possible
from ..methods.base import Method
from ..model_card import write_model_card
from ..modeling.limits import check_lengths
from ..modeling.packing import PackedColumns, pack_columns, task_blind
from ..retired import RETIRED_STATE, retired_message
from ..retrieval.encoding import encode_texts
from ..rundir.run_record import fingerprint, model_fingerprint
from ..rundir.state import load_state, save_state
from ..trainer_common import TrainerMixin
from .checkpoint_state import CheckpointState, ClusterAssignment, RowsState, SkippedSteps, collect_state, restore_state
from .stage_info import finetune_card_data, starting_model_info

logger = logging.getLogger(__name__)

ROW_COLUMN = "label"  # the only dataset column: the row index, resolved into texts at step time
EVAL_ROW_BITS = 40  # evaluation rows: (evaluation set << EVAL_ROW_BITS) | row


def _as_rows_source(dataset, what: str):
    """What the trainer samples rows from: a :class:`~hf_cocodr.data.training.RowsSource` (RetrievalTrainingData,
    a method's own rows) as is, a Dataset of text columns as StaticRows."""
    import datasets

    if isinstance(dataset, RowsSource):
        return dataset
    if isinstance(dataset, datasets.Dataset):
        return StaticRows(dataset)
    raise ValueError(f"{what} must be RetrievalTrainingData or datasets.Dataset, got {type(dataset)}")


def _has_negatives_table(data: RowsSource) -> bool:
    return data.negatives_table() is not None


def _is_row_view(dataset) -> bool:
    """A Dataset of row indices only (what ``IDROTrainer._eval_rows`` builds), not a user's dataset of texts."""
    import datasets

    return isinstance(dataset, datasets.Dataset) and dataset.column_names == [ROW_COLUMN]


class RowsTrainer(TrainerMixin, SentenceTransformerTrainer):
    """The shared base of the row-based trainers (see the module docstring); not used on its own.

    Args (beyond sentence-transformers' ``SentenceTransformerTrainer``):
        train_dataset / eval_dataset: a :class:`~hf_cocodr.data.training.RowsSource` (e.g.
            :class:`~hf_cocodr.data.RetrievalTrainingData`) or a ``datasets.Dataset`` of text columns (``eval_dataset``
            also a dict of them).
        methods: :class:`~hf_cocodr.methods.Method` instances to plug in, in the order their hooks run.
        card_methods: method names the model card lists (in this order) before those of ``methods``.
        negatives_label: how the card describes the negatives (default: the rows' own ``negatives_source``).
        target_corpora_read / target_queries_read: target data the run read beyond the methods' (for the card).
    """

    arguments_class: type = object  # the arguments class this trainer needs (subclasses set it)

    def __init__(
        self,
        model=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        loss=None,
        evaluator=None,
        callbacks=None,
        methods: list[Method] | None = None,
        *,
        card_methods=(),
        negatives_label: str | None = None,
        target_corpora_read=(),
        target_queries_read=(),
        **kwargs,
    ):
        import datasets

        args = self._check_arguments(model, args, train_dataset)
        self.training_data = _as_rows_source(train_dataset, "train_dataset")
        self._check_rows(args)
        self._hub_token = self._prepare_hub_args(args)
        if args.push_to_hub:  # offline or without a token the push would fail after training
            check_push_possible(args.hub_model_id, self._hub_token)
        self.methods: list[Method] = []  # plugged-in methods, in the order their hooks run
        self.clusters = ClusterAssignment(len(self.training_data))  # the group of each row (iDRO's clusters)
        self._skips = SkippedSteps()
        rows = datasets.Dataset.from_dict({ROW_COLUMN: np.arange(len(self.training_data), dtype=np.int64)})
        self._eval_sources: list[tuple[Any, Any]] = []  # (what the user passed, its rows source)
        eval_rows = self._eval_rows(eval_dataset) if eval_dataset is not None else None
        super().__init__(
            model=model,
            args=args,
            train_dataset=rows,
            eval_dataset=eval_rows,
            loss=loss,
            evaluator=evaluator,
            callbacks=list(callbacks or []),
            **kwargs,
        )
        self.extra_methods: list[str] = [str(n) for n in card_methods]  # method names for the model card
        self.negatives_label = negatives_label  # None: the rows' negatives_source when the card is written
        self.target_corpora_read: list[str] = list(target_corpora_read)  # target corpora a method reads (card)
        self.target_queries_read: list[str] = list(target_queries_read)  # unlabelled target queries read (card)
        self._skip_optimizer_step = False
        self._log_acc: dict[str, float] = {}
        self._log_n = 0
        self._num_negatives = getattr(args, "num_negatives", 0) if _has_negatives_table(self.training_data) else None
        self._identity = None
        self._run_identity()
        self._log_setup()
        self.add_methods(methods or [])

    def _check_arguments(self, model, args, train_dataset):
        """The arguments (a default when None); refuses a wrong arguments class, no model or no training data."""
        name, want = type(self).__name__, self.arguments_class
        if args is None:
            args = want(output_dir="tmp_trainer")
        if not isinstance(args, want):
            raise ValueError(f"{name} needs {want.__name__} (it extends SentenceTransformerTrainingArguments)")
        if model is None:
            raise ConfigError(
                f"{name} needs model=: a SentenceTransformer, e.g. hf_cocodr.load_encoder('org/name'); got None"
            )
        check_lengths(model, {"max_length": args.max_length})
        if train_dataset is None:
            raise ValueError(f"{name} needs a train_dataset (RetrievalTrainingData or a Dataset of text columns)")
        return args

    def _check_rows(self, args) -> None:
        """The training rows can fill one batch (and whatever a subclass needs of them)."""
        if len(self.training_data) == 0:
            raise ValueError("the training data is empty")
        per_step = args.per_device_train_batch_size * max(1, args.world_size)
        if len(self.training_data) < per_step:
            raise ConfigError(
                f"{len(self.training_data)} training queries cannot fill one batch of {per_step} "
                f"({args.per_device_train_batch_size} per device x {max(1, args.world_size)} devices); "
                "lower per_device_train_batch_size"
            )

    # ---------------------------------------------------------------------------------------------- helpers
    @property
    def cluster_ids(self) -> np.ndarray:
        """The cluster id of every training row (all 0 until K-Means runs, and without one)."""
        return self.clusters.ids

    @cluster_ids.setter
    def cluster_ids(self, ids) -> None:
        self.clusters.ids = np.asarray(ids).astype(np.int64)

    @property
    def skipped_steps(self) -> list[int]:
        """The optimizer steps skipped after a non-finite loss (1-based)."""
        return self._skips.steps

    @skipped_steps.setter
    def skipped_steps(self, steps) -> None:
        self._skips.steps = list(steps)

    @property
    def idro_loss(self):
        """The :class:`~hf_cocodr.IDROLoss` being trained, or None (another loss)."""
        return None

    def _log_setup(self) -> None:
        a = self.args
        m = self._num_negatives if self._num_negatives is not None else max(0, len(self.training_data.columns) - 2)
        per_step = a.per_device_train_batch_size * max(1, a.world_size)
        logger.info(
            "%s on %s: %d queries; %d queries per step (%d per device x %d devices x %d accumulation); "
            "%d hard negatives (%s) per query; loss %s",
            type(self).__name__,
            self.training_data.name,
            len(self.training_data),
            per_step * a.gradient_accumulation_steps,
            a.per_device_train_batch_size,
            max(1, a.world_size),
            a.gradient_accumulation_steps,
            m,
            self.training_data.negatives_source,
            type(self.loss).__name__,
        )

    def materialize(self, rows: torch.Tensor):
        """Row indices → (features, cluster ids, doc keys, positive keys, texts) for the current step; the methods'
        batch transforms (:meth:`Method.before_batch`) run first."""
        rows_np = rows.detach().cpu().numpy().astype(np.int64)
        for method in self.methods:
            method.before_batch(self, rows_np)
        features, doc_keys, pos_keys, columns = self._sample_features(
            self.training_data, rows_np, step=self.state.global_step, num_negatives=self._num_negatives or 0
        )
        # the cluster ids stay on the host: the loss checks them and finds the present clusters there (no read-back)
        labels = torch.as_tensor(self.cluster_ids[rows_np])
        return features, labels, doc_keys, pos_keys, columns

    def _sample_features(self, data, rows: np.ndarray, step: int, num_negatives: int):
        """Rows of ``data`` drawn as at ``step`` → (features, doc keys, positive keys, texts)."""
        columns, doc_keys, pos_keys = data.sample(rows, step=step, seed=self.args.seed, num_negatives=num_negatives)
        names = ["query", "positive"] + [f"negative_{i}" for i in range(1, len(columns) - 1)]
        examples = [dict(zip(names, values)) for values in zip(*columns)]
        batch = self.data_collator(examples)
        # the length groups of one packed forward, planned here on the host (see hf_cocodr.modeling.packing)
        packed = None
        if self.args.packed_forward:  # (queries and documents share a forward unless the model routes them apart)
            if getattr(self, "_task_blind", None) is None:  # (the model's modules do not change during training)
                self._task_blind = task_blind(self.model)
            ignore = ("task",) if self._task_blind else ()
            packed = pack_columns(self.collect_features(batch)[0], ignore_keys=ignore)
        features = PackedColumns(self.collect_features(self._prepare_inputs(batch))[0])
        features.packed = packed.to(self._prepare_input) if packed is not None else None
        device = features[0]["input_ids"].device

        def as_tensor(x):
            return None if x is None else torch.as_tensor(x, device=device)

        return features, as_tensor(doc_keys), as_tensor(pos_keys), columns

    # ---------------------------------------------------------------------------------------------- methods
    def add_method(self, method: Method) -> None:
        """Plug ``method`` in: its loss terms join the IDROLoss's auxiliary objectives, its name and the target data
        it reads go to the model card, and its hooks run from now on."""
        terms = list(method.loss_terms())
        if terms:
            loss = self.idro_loss
            if loss is None:
                raise ConfigError(
                    f"method {method.name!r} adds loss terms: it needs an IDROLoss, got {type(self.loss).__name__}"
                )
            loss.auxiliary.extend(terms)
        self.methods.append(method)
        if method.name and method.name not in self.extra_methods:
            self.extra_methods.append(method.name)
        self.target_corpora_read = list(dict.fromkeys(self.target_corpora_read + list(method.target_corpora_read)))
        self.target_queries_read = list(dict.fromkeys(self.target_queries_read + list(method.target_queries_read)))

    def add_methods(self, methods, names=None) -> None:
        """:meth:`add_method` for each of ``methods``; ``names`` (as the user listed them) orders the card's list."""
        if names is not None:
            self.extra_methods = [str(n).lower() for n in names]
        for method in methods:
            self.add_method(method)

    def use_row_group(self, group: str) -> None:
        """Make the model encode as it does for the training rows of ``group`` (a group of a grouped training set,
        e.g. the labelled rows before a negatives refresh); a no-op unless a method encodes groups differently."""
        for method in self.methods:
            method.use_row_group(self, group)

    def encode_query_rows(self, lo: int, hi: int, batch_size: int = 64) -> np.ndarray:
        """Embeddings of the training queries ``lo..hi-1`` as they are trained (eval mode, no grad): a method's
        :meth:`Method.encode_query_rows` when it has one (rows that carry their own tokens), else plain queries."""
        for method in self.methods:
            emb = method.encode_query_rows(self, lo, hi, batch_size)
            if emb is not None:
                return emb
        return encode_texts(self.model, self.training_data.query_texts[lo:hi], kind="query", batch_size=batch_size)

    def get_batch_sampler(self, dataset, batch_size, drop_last, valid_label_columns=None, generator=None, seed=0):
        for method in self.methods:  # e.g. batches that never mix row groups
            sampler = method.batch_sampler(self, dataset, batch_size, seed)
            if sampler is not None:
                return sampler
        return super().get_batch_sampler(dataset, batch_size, drop_last, valid_label_columns, generator, seed)

    def get_data_collator(self, model, args, processing_class=None):
        collator = super().get_data_collator(model=model, args=args, processing_class=processing_class)
        # queries are encoded as queries, documents as documents (model's query/document lengths and prompts)
        mapping = {"query": "query", "positive": "document", **{f"negative_{i}": "document" for i in range(1, 65)}}
        if not collator.router_mapping:
            collator.router_mapping = mapping
        return collator

    # ---------------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if ROW_COLUMN not in inputs:  # evaluation datasets in the ordinary sentence-transformers format
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss_fn = self.loss
        if model == self.model_wrapped and hasattr(loss_fn, "model") and loss_fn.model != model:
            loss_fn = self.override_model_in_loss(loss_fn, model)
        loss = self.rows_loss(loss_fn, inputs[ROW_COLUMN])
        return (loss, {}) if return_outputs else loss

    def rows_loss(self, loss_fn, rows: torch.Tensor) -> torch.Tensor:
        """The loss of a step's ``rows``: ``loss_fn(features, targets)`` with the rows' targets
        (:meth:`RowsSource.row_labels`, e.g. a teacher's scores; None when the rows carry none), as
        sentence-transformers calls a loss. A dict of terms is logged term by term and summed; a loss that is not
        finite skips the optimizer step."""
        features = self.materialize(rows)[0]
        targets = self.training_data.row_labels(rows.detach().cpu().numpy())
        if targets is not None:  # per-row scores (a distillation teacher's) for the loss
            targets = torch.as_tensor(targets, device=features[0]["input_ids"].device)
        loss = loss_fn(features, targets)
        if isinstance(loss, dict):
            self.track_loss_components(loss)
            loss = torch.stack(list(loss.values())).sum()
        if not torch.isfinite(loss.detach()):
            self._flag_skip()
            loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0
        return loss

    # ---------------------------------------------------------------------------------------------- evaluation
    def _eval_rows(self, dataset):
        """The dataset the evaluation loop iterates for an ``eval_dataset`` (RetrievalTrainingData, a Dataset of text
        columns, or a dict of them): its row indices, each packed with the index of its set in ``_eval_sources``
        (``set << EVAL_ROW_BITS | row``), so a batch names its own data whatever the data loader does with it."""
        import datasets

        if _is_row_view(dataset):  # already ours (transformers hands the sets of a dict back one by one)
            return dataset
        if isinstance(dataset, dict):
            return datasets.DatasetDict({name: self._eval_rows(d) for name, d in dataset.items()})
        index = next((i for i, (given, _) in enumerate(self._eval_sources) if given is dataset), None)
        if index is None:
            self._eval_sources.append((dataset, _as_rows_source(dataset, "eval_dataset")))
            index = len(self._eval_sources) - 1
        n = len(self._eval_sources[index][1])
        return datasets.Dataset.from_dict({ROW_COLUMN: (index << EVAL_ROW_BITS) + np.arange(n, dtype=np.int64)})

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """``trainer.evaluate()``: ``eval_loss`` is the plain contrastive objective of the loss (for an
        :class:`IDROLoss` the mean InfoNCE, without cluster weights) on every evaluation set, plus the metrics of
        ``evaluator``. Evaluation reads no cluster ids and changes no state: ω, clusters, negatives and the
        optimizer stay as they were. Each evaluation draws the same positives and negatives (those of step 0)."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            eval_dataset = self._eval_rows(eval_dataset)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if ROW_COLUMN not in inputs:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        packed = inputs[ROW_COLUMN].detach().cpu().numpy().astype(np.int64)
        sets = np.unique(packed >> EVAL_ROW_BITS)
        if len(sets) != 1:
            raise ValueError(f"an evaluation batch mixes {len(sets)} evaluation sets; evaluate them one by one")
        data = self._eval_sources[int(sets[0])][1]
        negatives = self.args.num_negatives if _has_negatives_table(data) else 0
        with torch.no_grad(), self.compute_loss_context_manager():
            features, doc_keys, pos_keys, _ = self._sample_features(
                data, packed & ((1 << EVAL_ROW_BITS) - 1), step=0, num_negatives=negatives
            )
            loss = self.plain_loss(features, doc_keys, pos_keys)
        return loss.detach(), None, None

    def plain_loss(self, features, doc_keys=None, pos_keys=None) -> torch.Tensor:
        """The evaluation objective: the loss's ``plain_loss`` when it has one (:meth:`IDROLoss.plain_loss`),
        otherwise the loss itself (without labels, as sentence-transformers evaluates it)."""
        plain = getattr(self.loss, "plain_loss", None)
        if plain is not None:
            return plain(features, doc_keys=doc_keys, pos_keys=pos_keys)
        loss = self.loss(features, None)
        if isinstance(loss, dict):
            self.track_loss_components(loss)
            loss = torch.stack(list(loss.values())).sum()
        return loss

    def _flag_skip(self) -> None:
        self._skip_optimizer_step = True
        step = self.state.global_step + 1
        if not self.skipped_steps or self.skipped_steps[-1] != step:
            self.skipped_steps.append(step)
            logger.warning(
                "non-finite loss at step %d: the optimizer step is skipped (%d skipped so far)",
                step,
                len(self.skipped_steps),
            )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._log_n:
            logs = dict(logs)
            for k, v in self._log_acc.items():  # (sums of device tensors: read back here, once per log)
                logs[k] = round(float(v) / self._log_n, 6)
            self._log_acc, self._log_n = {}, 0
            if self._num_negatives is not None:
                logs["hard_negatives_per_query"] = self._num_negatives
            if self.skipped_steps:
                logs["skipped_steps"] = len(self.skipped_steps)
            self._after_log()
        return super().log(logs, start_time)

    def _after_log(self) -> None:
        """Called after a training loss was logged with the step's accumulated metrics."""

    # ---------------------------------------------------------------------------------------------- optimizer
    def create_optimizer(self, *args, **kwargs):
        """The Trainer's optimizer, with a step pre-hook (``torch.optim.Optimizer.register_step_pre_hook``) that
        turns the step after a non-finite loss into a no-op (see :meth:`_skip_flagged_step`)."""
        optimizer = super().create_optimizer(*args, **kwargs)
        if getattr(self, "_skip_hook_of", None) is not optimizer:  # create_optimizer may return the same one again
            optimizer.register_step_pre_hook(self._skip_flagged_step)
            self._skip_hook_of = optimizer
        return optimizer

    def _skip_flagged_step(self, optimizer, args, kwargs) -> None:
        """Before ``optimizer.step()``: after a non-finite loss, drop the gradients of every parameter, so the step
        changes neither the parameters nor the optimizer state (torch optimizers skip a parameter whose ``.grad`` is
        None: no update, no weight decay, no step count; the Trainer zeroes the gradients right after the step
        anyway). No callback can do this (callbacks observe) and the Trainer has no hook around its
        ``optimizer.step()``; the scheduler still steps, as it did when the step was skipped outright."""
        if not self._skip_optimizer_step:
            return
        self._skip_optimizer_step = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    # ---------------------------------------------------------------------------------------------- state
    def state_components(self) -> list[CheckpointState]:
        """Every component whose state is saved beside a checkpoint's weights: the cluster ids, the loss and its
        auxiliary terms (those that keep state), the methods, the training rows, the list of skipped steps and the
        callbacks that keep state (see :mod:`~hf_cocodr.finetuning.checkpoint_state`)."""
        losses = [self.loss, *getattr(self.loss, "auxiliary", [])]
        callbacks = [cb for cb in self.callback_handler.callbacks if isinstance(cb, CheckpointState)]
        return [
            self.clusters,
            *[x for x in losses if isinstance(x, CheckpointState)],
            *self.methods,
            RowsState(self.training_data),
            self._skips,
            *callbacks,
        ]

    def state_for_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(tensors, meta)``: the run's own state beside a checkpoint's weights (:meth:`state_components`)."""
        return collect_state(self.state_components())

    def load_checkpoint_state(self, checkpoint: str) -> None:
        """Restore what :meth:`state_for_checkpoint` saved into ``checkpoint`` (older checkpoints' layout too)."""
        loaded = load_state(checkpoint)
        if loaded is None:
            logger.warning("%s has no hf_cocodr state: clusters and negatives start afresh", checkpoint)
            return
        for name, option in RETIRED_STATE.items():  # a retired callback's state: the run trained with its lever
            if name in loaded[1] or any(key.startswith(f"{name}_") for key in loaded[0]):
                raise ConfigError(retired_message(option, f"checkpoint {checkpoint}: the state of {option}"))
        restore_state(self.state_components(), *loaded)
        logger.info("restored the training state from %s", checkpoint)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            tensors, meta = self.state_for_checkpoint()
            save_state(folder, tensors, meta)
        super()._save_checkpoint(model, trial)  # (then its completion marker: TrainerMixin)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint)
        self.load_checkpoint_state(resume_from_checkpoint)

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: the best checkpoint's weights *and* its training state (through
        :meth:`_load_from_checkpoint`); the list of skipped steps stays the whole run's."""
        skipped = list(self.skipped_steps)
        super()._load_best_model()
        self.skipped_steps = skipped

    # ---------------------------------------------------------------------------------------------- output
    def starting_model_info(self) -> dict[str, Any]:
        """The training record of the model this run started from (its stages go first on the card)."""
        if getattr(self, "_prev_info", None) is None:
            self._prev_info = starting_model_info(self.model)
        return self._prev_info

    def card_data(self) -> dict[str, Any]:
        """What the model card of this run shows: the starting model's stages, then this one."""
        return finetune_card_data(self, self.starting_model_info())

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        for method in self.methods:  # every saved model (checkpoints too) encodes as the final one
            method.before_save(self)
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            for method in self.methods:  # transforms of the saved files
                method.after_save(self, output_dir or self.args.output_dir)
            # regenerate our card at every save (checkpoints and the final model)
            write_model_card(output_dir or self.args.output_dir, self.model, self.card_data())

    _command = "finetune"

    def _run_identity(self) -> dict:
        if getattr(self, "_identity", None) is None:  # the starting weights: taken before the first step changes them
            self._identity = {"model": model_fingerprint(self.model), "data": fingerprint(self.training_data)}
        return {**self._identity, "settings": self._trajectory_settings()}

    def finalize(self) -> str:
        """Write the final model, ``trainer_state.json`` and the card into ``output_dir`` (once per train())."""
        for method in self.methods:  # the model in memory encodes as the saved one
            method.before_save(self)
        if not getattr(self, "_finalized", False):
            self._declare_outputs()  # a kill during the save: the re-run owns what it wrote (and writes it again)
            with disk_faults(self.args.output_dir):  # a full disk: one OSError naming the folder
                self.save_model(self.args.output_dir, _internal_call=True)  # _save runs the methods' save hooks
                self.save_state()
            self._finalized = True
            self._record_outputs()
        return self.args.output_dir
