"""IDROTrainer: a row-based SentenceTransformerTrainer for iDRO fine-tuning, clustering and negatives inside
train()."""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..data.training import StaticRows
from .callbacks.kmeans import KMeansClusteringCallback
from .callbacks.negatives import HardNegativeRefreshCallback
from .losses.idro import IDROLoss
from .rows_trainer import EVAL_ROW_BITS, ROW_COLUMN, RowsTrainer
from .training_args import IDROTrainingArguments

__all__ = ["EVAL_ROW_BITS", "ROW_COLUMN", "IDROTrainer"]

logger = logging.getLogger(__name__)


class IDROTrainer(RowsTrainer):
    """Fine-tune a SentenceTransformer with :class:`~hf_cocodr.IDROLoss` (COCO-DR's iDRO stage).

    ``train_dataset`` is a :class:`~hf_cocodr.data.RetrievalTrainingData` (queries, positives and a negatives
    table, e.g. from :meth:`RetrievalTrainingData.from_beir`) or an ordinary sentence-transformers dataset with
    ``(query, positive[, negative...])`` columns. The dataloader yields row indices; each step turns them into
    texts with the *current* cluster ids and negatives, so re-clustering and negative refreshes take effect at
    the next step, and a resumed run draws exactly what the uninterrupted run drew.

    When the loss is an :class:`IDROLoss` with a preset that reads clusters (every preset but ``uniform``) and no
    :class:`KMeansClusteringCallback` is given, one is inserted (as sentence-transformers' ``prepare_loss`` inserts
    a loss's callback); when ``refresh_negatives_every_steps > 0`` a :class:`HardNegativeRefreshCallback` is
    inserted too. Each is bound to what it reads and updates (the query encoder, the cluster assignment, the loss,
    the training rows), never to the trainer. Their state, the iDRO weights and the negatives table are saved with
    every checkpoint (safetensors + JSON, see :mod:`~hf_cocodr.finetuning.checkpoint_state`) and restored by
    ``trainer.train(resume_from_checkpoint=...)``. A step whose loss is not finite is skipped (no optimizer
    update) and logged. Any other sentence-transformers loss is called with the rows' features (and their targets,
    when the rows carry any), as :class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer` does.

    Other methods plug in through the :class:`~hf_cocodr.methods.Method` hooks (``methods=[...]`` or
    :meth:`add_method`; :func:`~hf_cocodr.methods.build_methods` builds them from names): loss terms of the IDROLoss,
    batch transforms and samplers, the encoding of queries for clustering, checkpoint state, transforms of saved
    models and model-card lines. The trainer itself knows no particular method.

    The keyword arguments ``card_methods``, ``negatives_label``, ``target_corpora_read`` and ``target_queries_read``
    describe the run on the model card (see :class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer`).

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

    arguments_class = IDROTrainingArguments

    def __init__(self, *args, **kwargs):
        self.kmeans_callback: KMeansClusteringCallback | None = None  # (set when the loss is prepared)
        self.negatives_callback: HardNegativeRefreshCallback | None = None
        self._weight_steps: list[tuple[int, torch.Tensor]] = []  # (step, iDRO weights after it): weight_history
        super().__init__(*args, **kwargs)

    def _check_rows(self, args) -> None:
        super()._check_rows(args)
        if isinstance(self.training_data, StaticRows) and args.refresh_negatives_every_steps:
            raise ValueError(
                "refresh_negatives_every_steps needs RetrievalTrainingData (a corpus to mine from); "
                "a plain dataset has none"
            )

    def get_default_loss(self, model) -> IDROLoss:
        """The IDROLoss the arguments describe (when the trainer is given no loss)."""
        args = self.args
        return IDROLoss(
            model,
            preset=args.idro_preset,
            num_clusters=args.num_clusters,
            beta=args.idro_beta,
            tau=args.idro_tau,
            grad_params=args.idro_grad_params,
            in_batch_negatives=args.in_batch_negatives,
            scale=args.idro_scale,
            gather_across_devices=args.world_size > 1,
            gram_normalization=args.idro_gram_normalization,
        )

    def prepare_loss(self, loss, model):
        """The loss on the model's device, plus the callbacks an :class:`IDROLoss` needs (see the class
        docstring): a K-Means callback unless the preset is ``uniform``, a negatives refresh when asked for; one the
        user passed is bound and kept in its place."""
        loss = super().prepare_loss(loss, model)
        handler = self.callback_handler.callbacks
        self.kmeans_callback = next((c for c in handler if isinstance(c, KMeansClusteringCallback)), None)
        self.negatives_callback = next((c for c in handler if isinstance(c, HardNegativeRefreshCallback)), None)
        idro = loss if isinstance(loss, IDROLoss) else None
        # the uniform preset never reads cluster ids: no K-Means (it would encode every query for nothing)
        if idro is not None and idro.preset != "uniform" and self.kmeans_callback is None:
            self.kmeans_callback = self._default_kmeans(idro)
            self.add_callback(self.kmeans_callback)
        if self.negatives_callback is None and self.args.refresh_negatives_every_steps:
            self.negatives_callback = self._default_refresh()
            self.add_callback(self.negatives_callback)
        if self.kmeans_callback is not None:
            self.kmeans_callback.bind(
                encode=self._encode_for_clustering,
                num_queries=len(self.training_data.query_texts),
                clusters=self.clusters,
                loss=idro,
                seed=self.args.seed,
                refresh=self.negatives_callback,
            )
        if self.negatives_callback is not None:
            self.negatives_callback.bind(
                model=self.model,
                rows=self.training_data,
                use_row_group=self.use_row_group,
                kmeans=self.kmeans_callback,
            )
        return loss

    def _default_kmeans(self, loss: IDROLoss) -> KMeansClusteringCallback:
        args = self.args
        return KMeansClusteringCallback(
            num_clusters=loss.num_clusters,
            every_steps=args.cluster_every_steps,
            max_points_per_centroid=args.kmeans_max_points_per_centroid,
            niter=args.kmeans_niter,
            carry=args.cluster_weight_carry,
            backend=args.kmeans_backend,
            batch_size=args.encode_batch_size,
        )

    def _default_refresh(self) -> HardNegativeRefreshCallback:
        args = self.args
        return HardNegativeRefreshCallback(
            args.refresh_negatives_every_steps,
            top_k=args.negatives_top_k,
            skip_top=args.negatives_skip_top,
            recluster=args.recluster_on_refresh,
            batch_size=args.encode_batch_size,
            max_length=args.max_length,
            encode_precision=args.negatives_encode_precision,
        )

    def _encode_for_clustering(self, lo: int, hi: int, batch_size: int) -> np.ndarray:
        """:meth:`encode_query_rows`, the model left in the mode it was in (what K-Means encodes with)."""
        was_training = self.model.training
        try:  # model geometry (CLS/dot or whatever the model uses); rows a method encodes with tokens of their own
            return self.encode_query_rows(lo, hi, batch_size=batch_size)
        finally:
            self.model.train(was_training)

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

    # ---------------------------------------------------------------------------------------------- loss
    def rows_loss(self, loss_fn, rows: torch.Tensor) -> torch.Tensor:
        """An :class:`IDROLoss` reads the rows' cluster ids, document keys and texts; any other loss is called as
        the base calls it (:meth:`RowsTrainer.rows_loss`)."""
        if not isinstance(loss_fn, IDROLoss):
            return super().rows_loss(loss_fn, rows)
        features, labels, doc_keys, pos_keys, texts = self.materialize(rows)
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
        return loss

    def _after_idro_forward(self, loss_fn: IDROLoss) -> None:
        s = loss_fn.last_stats
        if s.get("skipped"):
            self._flag_skip()
            return
        w = loss_fn.weights.detach()
        entropy = -(w * w.clamp(min=1e-300).log()).sum()
        # kept on the device and summed there; read back when the trainer logs (no host synchronisation per step)
        acc = {
            **s.get("aux_metrics", {}),
            "idro_clusters_present": float(len(s["cluster_ids"])),
            "idro_weight_max": w.max(),
            "idro_weight_min": w.min(),
            "idro_weight_perplexity": entropy.exp() / loss_fn.num_clusters,
            "idro_worst_cluster_loss": s["cluster_losses"].max(),
        }
        for k, v in acc.items():
            self._log_acc[k] = self._log_acc.get(k, 0.0) + v
        self._log_n += 1
        if self.model.training:
            self._weight_steps.append((int(self.state.global_step + 1), w.float().clone()))

    @property
    def weight_history(self) -> list[dict]:
        """The iDRO weights after each training step, ``[{"step": ..., "weights": [...]}, ...]`` (kept on the
        device during training and read back when asked for)."""
        return [{"step": step, "weights": w.tolist()} for step, w in self._weight_steps]

    def _after_log(self, top: int = 3) -> None:
        """The most up- and down-weighted clusters, after each logged training loss."""
        loss = self.idro_loss
        if loss is None or not loss.last_stats or loss.last_stats.get("skipped") or loss.preset == "uniform":
            return  # (uniform weights: nothing is up- or down-weighted)
        w = loss.weights.float().cpu().numpy()
        sizes = np.bincount(self.cluster_ids, minlength=len(w))
        order = np.argsort(-w)
        desc = ", ".join(f"#{c} w={w[c]:.3f} ({sizes[c]} queries)" for c in order[:top])
        low = ", ".join(f"#{c} w={w[c]:.3f} ({sizes[c]} queries)" for c in order[-top:])
        logger.info("step %d iDRO weights: up-weighted %s; down-weighted %s", self.state.global_step, desc, low)
