"""IDROTrainer: a SentenceTransformerTrainer for iDRO fine-tuning with clustering and negatives inside train()."""

from __future__ import annotations

import logging
import math
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
from ..retrieval.encoding import encode_texts
from ..rundir.run_record import fingerprint, model_fingerprint
from ..rundir.state import load_state, save_state
from ..trainer_common import TrainerMixin
from .callbacks.kmeans import KMeansClusteringCallback
from .callbacks.negatives import HardNegativeRefreshCallback
from .checkpoint_state import collect_state, restore_state
from .losses.idro import IDROLoss
from .stage_info import finetune_card_data, starting_model_info
from .training_args import IDROTrainingArguments

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


def _default_loss(model, args) -> IDROLoss:
    """The IDROLoss the arguments describe (when the trainer is given no loss)."""
    return IDROLoss(
        model,
        preset=args.idro_preset,
        num_clusters=args.num_clusters,
        beta=args.idro_beta,
        tau=args.idro_tau,
        grad_params=args.idro_grad_params if args.idro_preset != "reference" else None,
        in_batch_negatives=args.in_batch_negatives,
        scale=args.idro_scale,
        gather_across_devices=args.world_size > 1,
        gram_normalization=args.idro_gram_normalization,
    )


def _is_row_view(dataset) -> bool:
    """A Dataset of row indices only (what ``IDROTrainer._eval_rows`` builds), not a user's dataset of texts."""
    import datasets

    return isinstance(dataset, datasets.Dataset) and dataset.column_names == [ROW_COLUMN]


class IDROTrainer(TrainerMixin, SentenceTransformerTrainer):
    """Fine-tune a SentenceTransformer with :class:`~hf_cocodr.IDROLoss` (COCO-DR's iDRO stage).

    ``train_dataset`` is a :class:`~hf_cocodr.data.RetrievalTrainingData` (queries, positives and a negatives
    table, e.g. from :meth:`RetrievalTrainingData.from_beir`) or an ordinary sentence-transformers dataset with
    ``(query, positive[, negative...])`` columns. The dataloader yields row indices; each step turns them into
    texts with the *current* cluster ids and negatives, so re-clustering and negative refreshes take effect at
    the next step, and a resumed run draws exactly what the uninterrupted run drew.

    When the loss is an :class:`IDROLoss` with a preset that reads clusters (every preset but ``uniform``) and no
    :class:`KMeansClusteringCallback` is given, one is inserted;
    when ``refresh_negatives_every_steps > 0`` a :class:`HardNegativeRefreshCallback` is inserted too. Their state,
    the iDRO weights and the negatives table are saved with every checkpoint (safetensors + JSON) and restored by
    ``trainer.train(resume_from_checkpoint=...)``. A step whose loss is not finite is skipped (no optimizer
    update) and logged.

    Other methods plug in through the :class:`~hf_cocodr.methods.Method` hooks (``methods=[...]`` or
    :meth:`add_method`; :func:`~hf_cocodr.methods.configure_methods` builds them from names): loss terms of the
    IDROLoss, batch transforms and samplers, the encoding of queries for clustering, checkpoint state, transforms of
    saved models and model-card lines. The trainer itself knows no particular method.

    ``eval_dataset`` takes the forms of ``train_dataset`` (or a dict of them): its ``eval_loss`` is the plain
    contrastive objective of the loss (:meth:`IDROLoss.plain_loss`: no cluster weights, no gradient similarity),
    so evaluating never moves ω, the clusters or the negatives. ``evaluator=`` takes any sentence-transformers
    evaluator, e.g. :class:`~hf_cocodr.evaluation.evaluator.BEIRRetrievalEvaluator`; with
    ``load_best_model_at_end`` the best checkpoint's iDRO state is restored with its weights.

    Example:
        ::

            from hf_cocodr import IDROTrainer, IDROTrainingArguments, load_encoder
            from hf_cocodr.data import RetrievalTrainingData

            model = load_encoder("out/coco")  # e.g. a COCO-pretrained encoder
            data = RetrievalTrainingData.from_beir("data/squad-v1.1", "train", negatives="bm25")
            args = IDROTrainingArguments(output_dir="out/idro", per_device_train_batch_size=32, max_steps=300,
                                         num_clusters=50, refresh_negatives_every_steps=150)
            trainer = IDROTrainer(model=model, args=args, train_dataset=data)
            trainer.train()
    """

    def __init__(
        self,
        model=None,
        args: IDROTrainingArguments | None = None,
        train_dataset=None,
        eval_dataset=None,
        loss=None,
        evaluator=None,
        callbacks=None,
        methods: list[Method] | None = None,
        **kwargs,
    ):
        import datasets

        if args is None:
            args = IDROTrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, IDROTrainingArguments):
            raise ValueError(
                "IDROTrainer needs IDROTrainingArguments (it extends SentenceTransformerTrainingArguments)"
            )
        if model is None:
            raise ConfigError(
                "IDROTrainer needs model=: a SentenceTransformer, e.g. hf_cocodr.load_encoder('org/name'); got None"
            )
        check_lengths(model, {"max_length": args.max_length})
        if train_dataset is None:
            raise ValueError("IDROTrainer needs a train_dataset (RetrievalTrainingData or a Dataset of text columns)")
        self.training_data = _as_rows_source(train_dataset, "train_dataset")
        if len(self.training_data) == 0:
            raise ValueError("the training data is empty")
        per_step = args.per_device_train_batch_size * max(1, args.world_size)
        if len(self.training_data) < per_step:
            raise ConfigError(
                f"{len(self.training_data)} training queries cannot fill one batch of {per_step} "
                f"({args.per_device_train_batch_size} per device x {max(1, args.world_size)} devices); "
                "lower per_device_train_batch_size"
            )
        self._hub_token = self._prepare_hub_args(args)
        if args.push_to_hub:  # offline or without a token the push would fail after training
            check_push_possible(args.hub_model_id, self._hub_token)
        if isinstance(self.training_data, StaticRows) and args.refresh_negatives_every_steps:
            raise ValueError(
                "refresh_negatives_every_steps needs RetrievalTrainingData (a corpus to mine from); "
                "a plain dataset has none"
            )
        if loss is None:
            loss = _default_loss(model, args)
        self.methods: list[Method] = []  # plugged-in methods, in the order their hooks run
        self.cluster_ids = np.zeros(len(self.training_data), dtype=np.int64)
        rows = datasets.Dataset.from_dict({ROW_COLUMN: np.arange(len(self.training_data), dtype=np.int64)})
        callbacks = self._with_default_callbacks(list(callbacks or []), loss, args)
        self._eval_sources: list[tuple[Any, Any]] = []  # (what the user passed, its rows source)
        eval_rows = self._eval_rows(eval_dataset) if eval_dataset is not None else None
        super().__init__(
            model=model,
            args=args,
            train_dataset=rows,
            eval_dataset=eval_rows,
            loss=loss,
            evaluator=evaluator,
            callbacks=callbacks,
            **kwargs,
        )
        for cb in (self.kmeans_callback, self.negatives_callback):
            if cb is not None:
                cb.trainer = self
        self.extra_methods: list[str] = []  # method names for the model card
        self.target_corpora_read: list[str] = []  # target corpora whose documents a method reads (model card)
        self.target_queries_read: list[str] = []  # unlabelled target query sets a method reads (model card)
        self._skip_optimizer_step = False
        self.skipped_steps: list[int] = []
        self.weight_history: list[dict[str, Any]] = []
        self._log_acc: dict[str, float] = {}
        self._log_n = 0
        self._num_negatives = args.num_negatives if _has_negatives_table(self.training_data) else None
        self._identity = None
        self._run_identity()
        self._log_setup()
        self.add_methods(methods or [])

    def _with_default_callbacks(self, callbacks: list, loss, args) -> list:
        """``callbacks`` plus the K-Means and negatives-refresh callbacks the run needs and the user did not pass
        (``self.kmeans_callback`` / ``self.negatives_callback``, None without one)."""
        idro = loss if isinstance(loss, IDROLoss) else None
        self.kmeans_callback = next((c for c in callbacks if isinstance(c, KMeansClusteringCallback)), None)
        if idro is not None and idro.preset != "uniform" and self.kmeans_callback is None:
            # the uniform preset never reads cluster ids: no K-Means (it would encode every query for nothing)
            self.kmeans_callback = KMeansClusteringCallback(
                num_clusters=idro.num_clusters,
                every_steps=args.cluster_every_steps,
                max_points_per_centroid=args.kmeans_max_points_per_centroid,
                niter=args.kmeans_niter,
                carry=args.cluster_weight_carry,
                backend=args.kmeans_backend,
                batch_size=args.encode_batch_size,
            )
            callbacks.append(self.kmeans_callback)
        self.negatives_callback = next((c for c in callbacks if isinstance(c, HardNegativeRefreshCallback)), None)
        if self.negatives_callback is None and args.refresh_negatives_every_steps:
            self.negatives_callback = HardNegativeRefreshCallback(
                args.refresh_negatives_every_steps,
                top_k=args.negatives_top_k,
                skip_top=args.negatives_skip_top,
                recluster=args.recluster_on_refresh,
                batch_size=args.encode_batch_size,
                max_length=args.max_length,
                encode_precision=args.negatives_encode_precision,
            )
            callbacks.append(self.negatives_callback)
        return callbacks

    # ---------------------------------------------------------------------------------------------- helpers
    @property
    def idro_loss(self) -> IDROLoss | None:
        return self.loss if isinstance(self.loss, IDROLoss) else None

    def _log_setup(self) -> None:
        a = self.args
        m = self._num_negatives if self._num_negatives is not None else max(0, len(self.training_data.columns) - 2)
        per_step = a.per_device_train_batch_size * max(1, a.world_size)
        in_batch = (per_step * (1 + m) - 1 - m) if getattr(self.idro_loss, "in_batch_negatives", True) else 0
        logger.info(
            "%s on %s: %d queries; %d queries per step (%d per device x %d devices x %d accumulation); "
            "%d hard negatives (%s) + %d in-batch negatives per query; loss %s",
            "iDRO fine-tuning" if self.idro_loss is not None else "fine-tuning",
            self.training_data.name,
            len(self.training_data),
            per_step * a.gradient_accumulation_steps,
            a.per_device_train_batch_size,
            max(1, a.world_size),
            a.gradient_accumulation_steps,
            m,
            self.training_data.negatives_source,
            in_batch,
            self.idro_loss.get_config_dict() if self.idro_loss is not None else type(self.loss).__name__,
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
        labels = torch.as_tensor(self.cluster_ids[rows_np], device=features[0]["input_ids"].device)
        return features, labels, doc_keys, pos_keys, columns

    def _sample_features(self, data, rows: np.ndarray, step: int, num_negatives: int):
        """Rows of ``data`` drawn as at ``step`` → (features, doc keys, positive keys, texts)."""
        columns, doc_keys, pos_keys = data.sample(rows, step=step, seed=self.args.seed, num_negatives=num_negatives)
        names = ["query", "positive"] + [f"negative_{i}" for i in range(1, len(columns) - 1)]
        examples = [dict(zip(names, values)) for values in zip(*columns)]
        batch = self._prepare_inputs(self.data_collator(examples))
        features, _ = self.collect_features(batch)
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
        features, labels, doc_keys, pos_keys, texts = self.materialize(inputs[ROW_COLUMN])
        loss_fn = self.loss
        if model == self.model_wrapped and hasattr(loss_fn, "model") and loss_fn.model != model:
            loss_fn = self.override_model_in_loss(loss_fn, model)
        if isinstance(loss_fn, IDROLoss):
            loss = loss_fn(
                features,
                labels,
                doc_keys=doc_keys,
                pos_keys=pos_keys,
                context={"texts": texts, "step": self.state.global_step},
            )
            self._after_idro_forward(loss_fn)
            if isinstance(loss, dict):  # auxiliary objectives: every term is logged
                if self.model.training:
                    self.track_loss_components(loss)
                loss = torch.stack(list(loss.values())).sum()
        else:
            targets = self.training_data.row_labels(inputs[ROW_COLUMN].detach().cpu().numpy())
            if targets is not None:  # per-row scores (a distillation teacher's) for the loss
                targets = torch.as_tensor(targets, device=features[0]["input_ids"].device)
            loss = loss_fn(features, targets)
            if isinstance(loss, dict):
                self.track_loss_components(loss)
                loss = torch.stack(list(loss.values())).sum()
            if not torch.isfinite(loss.detach()):
                self._flag_skip()
                loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0
        return (loss, {}) if return_outputs else loss

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

    def _after_idro_forward(self, loss_fn: IDROLoss) -> None:
        s = loss_fn.last_stats
        if s.get("skipped"):
            self._flag_skip()
            return
        w = loss_fn.weights
        entropy = float(-(w * w.clamp(min=1e-300).log()).sum())
        acc = {
            **s.get("aux_metrics", {}),
            "idro_clusters_present": float(len(s["cluster_ids"])),
            "idro_weight_max": float(w.max()),
            "idro_weight_min": float(w.min()),
            "idro_weight_perplexity": math.exp(entropy) / loss_fn.num_clusters,
            "idro_worst_cluster_loss": float(s["cluster_losses"].max()),
        }
        for k, v in acc.items():
            self._log_acc[k] = self._log_acc.get(k, 0.0) + v
        self._log_n += 1
        if self.model.training:
            self.weight_history.append({"step": int(self.state.global_step + 1), "weights": w.float().tolist()})

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._log_n:
            logs = dict(logs)
            for k, v in self._log_acc.items():
                logs[k] = round(v / self._log_n, 6)
            self._log_acc, self._log_n = {}, 0
            if self._num_negatives is not None:
                logs["hard_negatives_per_query"] = self._num_negatives
            if self.skipped_steps:
                logs["skipped_steps"] = len(self.skipped_steps)
            self._log_clusters()
        return super().log(logs, start_time)

    def _log_clusters(self, top: int = 3) -> None:
        loss = self.idro_loss
        if loss is None or not loss.last_stats or loss.last_stats.get("skipped") or loss.preset == "uniform":
            return  # (uniform weights: nothing is up- or down-weighted)
        w = loss.weights.float().cpu().numpy()
        sizes = np.bincount(self.cluster_ids, minlength=len(w))
        order = np.argsort(-w)
        desc = ", ".join(f"#{c} w={w[c]:.3f} ({sizes[c]} queries)" for c in order[:top])
        low = ", ".join(f"#{c} w={w[c]:.3f} ({sizes[c]} queries)" for c in order[-top:])
        logger.info("step %d iDRO weights: up-weighted %s; down-weighted %s", self.state.global_step, desc, low)

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
    def state_for_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's own state beside a checkpoint's weights (:func:`~.checkpoint_state.collect_state`)."""
        return collect_state(self)

    def load_checkpoint_state(self, checkpoint: str) -> None:
        """Restore what :meth:`state_for_checkpoint` saved into ``checkpoint``."""
        loaded = load_state(checkpoint)
        if loaded is None:
            logger.warning("%s has no hf_cocodr state: clusters and negatives start afresh", checkpoint)
            return
        restore_state(self, *loaded)
        logger.info("restored iDRO state from %s", checkpoint)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            tensors, meta = self.state_for_checkpoint()
            save_state(folder, tensors, meta)
        super()._save_checkpoint(model, trial)
        self._mark_checkpoint_complete(trial)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint)
        self.load_checkpoint_state(resume_from_checkpoint)

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: the best checkpoint's weights *and* its iDRO weights, clusters, centroids,
        negatives and auxiliary state (through :meth:`_load_from_checkpoint`); the list of skipped steps stays the
        whole run's."""
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
            with disk_faults(self.args.output_dir):  # a full disk: one OSError naming the folder
                self.save_model(self.args.output_dir, _internal_call=True)  # _save runs the methods' save hooks
                self.save_state()
            self._finalized = True
            self._record_outputs()
        return self.args.output_dir
