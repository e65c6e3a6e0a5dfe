"""HardNegativeRefreshCallback: ANCE-style self-mined negatives, refreshed inside ``trainer.train()``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from transformers import TrainerCallback

from ... import distributed as D
from ...data.training import RetrievalTrainingData
from ...modeling.precision import check_encode_precision, encoding_precision
from ...retrieval.encoding import build_index, encode_texts

logger = logging.getLogger(__name__)


class HardNegativeRefreshCallback(TrainerCallback):
    """Every ``every_steps`` optimizer steps, re-encode the training corpus and the queries with the current model,
    search the top ``top_k`` documents of each query with an exact index (faiss when installed), and install ranks
    ``[skip_top, top_k)`` minus the query's labelled positives as its new negatives. With ``recluster=True`` the
    queries are re-clustered at the same time (as the COCO-DR paper does), reusing the query embeddings.

    The ranks share the corpus's encoding (each encodes its chunks); rank 0 ranks the queries and broadcasts the
    table, so every rank samples from the same negatives.

    The :class:`~hf_cocodr.IDROTrainer` inserts it when ``refresh_negatives_every_steps > 0`` and hands it what it
    reads and updates through :meth:`bind` (the model, the training rows, the row-group switch, the K-Means
    callback); it never sees the trainer. Its schedule is saved with every checkpoint (name ``negatives``).
    """

    state_name = "negatives"

    def __init__(
        self,
        every_steps: int,
        top_k: int = 100,
        skip_top: int = 0,
        recluster: bool = True,
        batch_size: int = 64,
        max_length: int | None = None,
        query_chunk: int = 65536,
        encode_precision: str = "fp32",
    ):
        if every_steps <= 0:
            raise ValueError(f"every_steps must be > 0, got {every_steps}")
        if top_k <= skip_top:
            raise ValueError(f"top_k ({top_k}) must be larger than skip_top ({skip_top})")
        self.every_steps = every_steps
        self.top_k = top_k
        self.skip_top = skip_top
        self.recluster = recluster
        self.batch_size = batch_size
        self.max_length = max_length
        self.encode_precision = check_encode_precision(encode_precision)  # fp32 | bf16 | int8 (modeling.precision)
        self.query_chunk = query_chunk
        self.model = None  # set by bind()
        self.rows = None
        self.use_row_group: Callable[[str], None] | None = None
        self.kmeans = None
        self.count = 0
        self.history: list[dict] = []

    def bind(self, *, model, rows, use_row_group: Callable[[str], None] | None = None, kmeans=None):
        """What the callback works with: the ``model`` it encodes with, the training ``rows`` (a
        :class:`~hf_cocodr.data.training.RowsSource` whose ``negatives_table()`` receives the new negatives),
        ``use_row_group(group)`` to make the model encode those rows as they are trained, and the ``kmeans``
        callback to re-cluster with the same query embeddings (``recluster=True``)."""
        self.model, self.rows, self.use_row_group, self.kmeans = model, rows, use_row_group, kmeans
        return self

    def reclusters_at(self, step: int) -> bool:
        """Whether a refresh at optimizer ``step`` re-clusters the queries."""
        return self.recluster and step % self.every_steps == 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_steps == 0 and state.global_step < state.max_steps:
            self.refresh(state.global_step)

    def refresh(self, step: int = 0) -> None:
        """Mine and install new negatives with the current model (at optimizer ``step``, for the logs)."""
        if self.model is None or self.rows is None:
            raise RuntimeError(
                "HardNegativeRefreshCallback is not bound (its trainer is not set; use it through IDROTrainer, "
                "which binds it, or call bind(...))"
            )
        data = self.rows.negatives_table()  # the rows with a corpus and a negatives table
        if not isinstance(data, RetrievalTrainingData):
            raise ValueError("negatives can only be refreshed for RetrievalTrainingData (a corpus is needed)")
        model = self.model
        was_training = model.training
        t0 = time.perf_counter()
        group = self.rows.negatives_group
        if group is not None and self.use_row_group is not None:  # encoded as trained (a method's hook)
            self.use_row_group(group)
        try:
            neg_ptr, neg_idx, q_all = self._mine(model, data)
        finally:
            model.train(was_training)
        neg_ptr = D.broadcast_array(neg_ptr)
        neg_idx = D.broadcast_array(neg_idx)
        if self.recluster:
            q_all = D.broadcast_array(q_all)
        data.install_negatives(neg_ptr, neg_idx, source=f"self-mined@{step}")
        self.count += 1
        sizes = np.diff(data.neg_ptr)
        self.history.append({"step": int(step), "mean_candidates": float(sizes.mean())})
        logger.info(
            "negatives refreshed at step %d in %.1fs: %.1f candidates per query from ranks [%d, %d)",
            step,
            time.perf_counter() - t0,
            sizes.mean(),
            self.skip_top,
            self.top_k,
        )
        if self.recluster and self.kmeans is not None:
            same_rows = data is self.rows  # else K-Means clusters rows the refresh did not encode
            self.kmeans.cluster(
                reason=f"negatives refresh at step {step}", embeddings=q_all if same_rows else None, step=step
            )

    def _mine(self, model, data):
        """``(neg_ptr, neg_idx, query embeddings or None)`` on rank 0 (``None``s elsewhere): the ranks share the
        corpus's encoding (:func:`~hf_cocodr.retrieval.encoding.build_index` under torch.distributed), rank 0 ranks
        the queries."""
        with encoding_precision(model, self.encode_precision) as encoder:
            index, order = build_index(
                encoder,
                data.corpus,
                batch_size=self.batch_size,
                show_progress_bar=False,
                max_length=self.max_length,
            )
            if not D.is_main():
                return None, None, None
            k = min(self.top_k + int(np.diff(data.pos_ptr).max()), index.ntotal)
            blocks, q_parts = [], []
            for s in range(0, len(data), self.query_chunk):  # bounded memory for very large query sets
                q = encode_texts(
                    encoder,
                    data.query_texts[s : s + self.query_chunk],
                    kind="query",
                    batch_size=self.batch_size,
                    max_length=self.max_length,
                )
                _, idx = index.search(q, k)
                ranked = np.where(idx >= 0, order[np.clip(idx, 0, None)], -1)
                blocks.append(data.clean_ranking(s, ranked, self.skip_top, self.top_k - self.skip_top))
                if self.recluster:
                    q_parts.append(q.astype(np.float32))
        del index
        counts = np.concatenate([c for c, _ in blocks])
        neg_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        neg_idx = np.concatenate([f for _, f in blocks]).astype(np.int64)
        q_all = np.concatenate(q_parts) if q_parts else None
        return neg_ptr, neg_idx, q_all

    def state(self) -> tuple[dict, dict]:
        return {}, self.state_meta()

    def state_meta(self) -> dict:
        return {"count": self.count, "history": self.history}

    def load_state(self, tensors, meta) -> None:
        self.count = int(meta.get("count", 0))
        self.history = list(meta.get("history", []))
