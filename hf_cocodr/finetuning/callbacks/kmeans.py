"""KMeansClusteringCallback: (re-)cluster the training queries inside ``trainer.train()``."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
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
    instance in ``callbacks=[...]`` to change its settings. The trainer hands it what it reads and updates through
    :meth:`bind` (the query encoder, the cluster assignment, the loss whose weights follow the clusters); it never
    sees the trainer. Its state (centroids, clusterings so far) is saved with every checkpoint
    (:class:`~hf_cocodr.finetuning.checkpoint_state.CheckpointState`, name ``kmeans``).

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
        self.encode: Callable[[int, int, int], np.ndarray] | None = None  # set by bind()
        self.num_queries = 0
        self.clusters = None
        self.loss = None
        self.run_seed = 0
        self.refresh = None
        self.centroids: np.ndarray | None = None
        self.count = 0
        self.restored = False
        self.history: list[dict[str, Any]] = []
        self._last_epoch = 0

    state_name = "kmeans"

    def bind(
        self,
        *,
        encode: Callable[[int, int, int], np.ndarray],
        num_queries: int,
        clusters,
        loss=None,
        seed: int = 0,
        refresh=None,
    ) -> KMeansClusteringCallback:
        """What the callback works with: ``encode(lo, hi, batch_size)`` gives the embeddings of training queries
        ``lo..hi-1`` (numpy; the model left in the mode it was in), ``num_queries`` how many there are, ``clusters``
        (a :class:`~hf_cocodr.finetuning.checkpoint_state.ClusterAssignment`) receives the ids, ``loss`` (an
        :class:`~hf_cocodr.IDROLoss` or None) has its weights carried over or reset, ``seed`` is the run's seed
        (when the callback has none of its own) and ``refresh`` a
        :class:`~hf_cocodr.finetuning.HardNegativeRefreshCallback` that re-clusters at its own steps."""
        self.encode, self.num_queries, self.clusters = encode, num_queries, clusters
        self.loss, self.run_seed, self.refresh = loss, seed, refresh
        return self

    # -------------------------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        if self.restored:
            logger.info("K-Means state restored from the checkpoint (%d clusterings so far)", self.count)
            return
        self.cluster(reason="train start", step=state.global_step)

    def on_epoch_begin(self, args, state, control, **kwargs):
        # the epoch index, not the rounded progress: a run resumed in the second half of an epoch (state.epoch
        # e.g. 1.5) continues epoch 1, which was already clustered
        epoch = int(math.floor((state.epoch or 0) + 1e-6))
        if self.every_steps == 0 and epoch > self._last_epoch:
            self._last_epoch = epoch
            self.cluster(reason=f"epoch {epoch}", step=state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps and state.global_step % self.every_steps == 0 and state.global_step < state.max_steps:
            if self.refresh is not None and self.refresh.reclusters_at(state.global_step):
                return  # the negatives refresh re-clusters at this step (with the same query embeddings)
            self.cluster(reason=f"step {state.global_step}", step=state.global_step)

    # -------------------------------------------------------------------------------------------- work
    def encode_queries(self) -> np.ndarray:
        """Every training query's embedding (this rank encodes its shard; every rank gets all rows)."""
        n = self.num_queries
        lo, hi = D.shard_range(n)
        emb = self.encode(lo, hi, self.batch_size)
        if emb.ndim != 2:
            emb = emb.reshape(hi - lo, -1)
        return D.gather_rows(emb.astype(np.float32), n)

    def cluster(self, reason: str, embeddings: np.ndarray | None = None, step: int = 0) -> None:
        """Cluster the queries (their ``embeddings`` when given, else freshly encoded) at optimizer ``step``."""
        if self.encode is None or self.clusters is None:
            raise RuntimeError(
                "KMeansClusteringCallback is not bound (its trainer is not set; use it through IDROTrainer, which "
                "binds it, or call bind(...))"
            )
        loss = self.loss
        t0 = time.perf_counter()
        x = self.encode_queries() if embeddings is None else embeddings
        n = len(x)
        k = self.num_clusters or (loss.num_clusters if loss is not None else 50)
        if k > n:
            logger.warning("num_clusters=%d is larger than the %d training queries: using K=%d", k, n, n)
            k = n
        seed = (self.seed if self.seed is not None else self.run_seed) + self.count
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
        self.clusters.ids = assign.astype(np.int64)
        self.centroids = centroids
        self.count += 1
        sizes = np.bincount(assign, minlength=k)
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
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.state_tensors(), self.state_meta()

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
