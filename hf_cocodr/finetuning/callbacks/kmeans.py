"""KMeansClusteringCallback: (re-)cluster the training queries inside ``trainer.train()``."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from transformers import TrainerCallback

from ... import distributed as D
from ...retrieval.index import kmeans

logger = logging.getLogger(__name__)


def match_centroids(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """For each new centroid, the old centroid it continues (Hungarian matching on squared distance; -1 if none)."""
    d = ((new[:, None, :] - old[None, :, :]) ** 2).sum(-1)
    mapping = np.full(len(new), -1, dtype=np.int64)
    r, c = linear_sum_assignment(d)  # scipy is a dependency of sentence-transformers
    mapping[r] = c
    return mapping


class KMeansClusteringCallback(TrainerCallback):
    """Encode every training query with the current model, run K-Means, and hand the cluster ids to the loss.

    Runs at the start of training and then every ``every_steps`` optimizer steps (or at each new epoch when
    ``every_steps`` is 0), inside ``trainer.train()``. When clusters are recomputed the iDRO weights are carried
    over by matching new centroids to old ones (``carry="match"``) or reset (``carry="reset"``); either is logged.
    Under DDP the queries are encoded in shards, rank 0 clusters, and every rank receives the same ids.

    The :class:`~hf_cocodr.IDROTrainer` inserts this callback itself when an iDRO loss is used; pass your own
    instance in ``callbacks=[...]`` to change its settings.

    Args:
        num_clusters: K (default: the loss's). Clamped to the number of queries, with a warning.
        every_steps: re-cluster period in optimizer steps (0: once per epoch).
        max_points_per_centroid: K-Means training points per centroid; None uses all points.
        niter: Lloyd iterations. seed: K-Means seed (offset by the re-clustering count).
        carry: ``"match"`` or ``"reset"``. backend: ``"auto"`` / ``"faiss"`` (faiss.Kmeans) or ``"torch"``
            (without faiss: scikit-learn's KMeans); see :func:`hf_cocodr.retrieval.index.kmeans`.
    """

    def __init__(
        self,
        num_clusters: int | None = None,
        every_steps: int = 0,
        max_points_per_centroid: int | None = None,
        niter: int = 20,
        seed: int | None = None,
        carry: str = "match",
        backend: str = "auto",
        batch_size: int = 64,
    ):
        if carry not in ("match", "reset"):
            raise ValueError(f"carry must be 'match' or 'reset', got {carry!r}")
        self.num_clusters = num_clusters
        self.every_steps = every_steps
        self.max_points_per_centroid = max_points_per_centroid
        self.niter = niter
        self.seed = seed
        self.carry = carry
        self.backend = backend
        self.batch_size = batch_size
        self.trainer = None  # set by IDROTrainer
        self.centroids: np.ndarray | None = None
        self.count = 0
        self.restored = False
        self.history: list[dict[str, Any]] = []
        self._last_epoch = 0

    # -------------------------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        if self.restored:
            logger.info("K-Means state restored from the checkpoint (%d clusterings so far)", self.count)
            return
        self.cluster(reason="train start")

    def on_epoch_begin(self, args, state, control, **kwargs):
        # the epoch index, not the rounded progress: a run resumed in the second half of an epoch (state.epoch
        # e.g. 1.5) continues epoch 1, which was already clustered
        epoch = int(math.floor((state.epoch or 0) + 1e-6))
        if self.every_steps == 0 and epoch > self._last_epoch:
            self._last_epoch = epoch
            self.cluster(reason=f"epoch {epoch}")

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps and state.global_step % self.every_steps == 0 and state.global_step < state.max_steps:
            nc = getattr(self.trainer, "negatives_callback", None)
            if nc is not None and nc.recluster and state.global_step % nc.every_steps == 0:
                return  # the negatives refresh re-clusters at this step (with the same query embeddings)
            self.cluster(reason=f"step {state.global_step}")

    # -------------------------------------------------------------------------------------------- work
    def encode_queries(self) -> np.ndarray:
        trainer = self.trainer
        texts = trainer.training_data.query_texts
        lo, hi = D.shard_range(len(texts))
        model = trainer.model
        was_training = model.training
        try:  # model geometry (CLS/dot or whatever the model uses); rows a method encodes with tokens of their own
            emb = trainer.encode_query_rows(lo, hi, batch_size=self.batch_size)
        finally:
            model.train(was_training)
        if emb.ndim != 2:
            emb = emb.reshape(hi - lo, -1)
        return D.gather_rows(emb.astype(np.float32), len(texts))

    def cluster(self, reason: str, embeddings: np.ndarray | None = None) -> None:
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("KMeansClusteringCallback.trainer is not set; use it through IDROTrainer")
        loss = trainer.idro_loss
        t0 = time.perf_counter()
        x = self.encode_queries() if embeddings is None else embeddings
        n = len(x)
        k = self.num_clusters or (loss.num_clusters if loss is not None else 50)
        if k > n:
            logger.warning("num_clusters=%d is larger than the %d training queries: using K=%d", k, n, n)
            k = n
        seed = (self.seed if self.seed is not None else trainer.args.seed) + self.count
        if D.is_main():
            centroids, assign = kmeans(
                x,
                k,
                niter=self.niter,
                seed=seed,
                max_points_per_centroid=self.max_points_per_centroid,
                backend=self.backend,
            )
            mapping = (
                match_centroids(self.centroids, centroids)
                if self.carry == "match" and self.centroids is not None
                else None
            )
        else:
            centroids = assign = mapping = None
        centroids = D.broadcast_array(centroids)
        assign = D.broadcast_array(assign)
        mapping = D.broadcast_array(mapping)  # None on every rank when there is nothing to carry over
        if loss is not None:
            if mapping is not None:
                import torch

                loss.remap_clusters(torch.as_tensor(mapping), k)
            elif loss.num_clusters != k or self.count > 0:
                loss.remap_clusters(None, k)
        trainer.cluster_ids = assign.astype(np.int64)
        self.centroids = centroids
        self.count += 1
        sizes = np.bincount(assign, minlength=k)
        step = trainer.state.global_step if trainer.state is not None else 0
        self.history.append({"step": int(step), "sizes": sizes.tolist(), "reason": reason})
        carry = (
            "first clustering"
            if self.count == 1
            else ("weights carried over by centroid matching" if mapping is not None else "weights reset")
        )
        logger.info(
            "K-Means (%s): %d queries into %d clusters in %.1fs (sizes min %d / median %d / max %d; all %d points "
            "used for training: %s); %s",
            reason,
            n,
            k,
            time.perf_counter() - t0,
            sizes.min(),
            int(np.median(sizes)),
            sizes.max(),
            n,
            self.max_points_per_centroid is None,
            carry,
        )

    # -------------------------------------------------------------------------------------------- state
    def state_tensors(self) -> dict[str, np.ndarray]:
        return {} if self.centroids is None else {"centroids": self.centroids}

    def state_meta(self) -> dict[str, Any]:
        return {"count": self.count, "history": self.history, "last_epoch": self._last_epoch}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        if "centroids" in tensors:
            self.centroids = np.asarray(tensors["centroids"])
        self.count = int(meta.get("count", 0))
        self.history = list(meta.get("history", []))
        self._last_epoch = int(meta.get("last_epoch", 0))
        self.restored = True
