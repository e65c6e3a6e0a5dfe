"""HardNegativeRefreshCallback: ANCE-style self-mined negatives, refreshed inside ``trainer.train()``."""

from __future__ import annotations

import logging
import time

import numpy as np
from transformers import TrainerCallback

from ... import distributed as D

logger = logging.getLogger(__name__)


class HardNegativeRefreshCallback(TrainerCallback):
    """Every ``every_steps`` optimizer steps, re-encode the training corpus and the queries with the current model,
    search the top ``top_k`` documents of each query with an exact index (faiss when installed), and install ranks
    ``[skip_top, top_k)`` minus the query's labelled positives as its new negatives. With ``recluster=True`` the
    queries are re-clustered at the same time (as the COCO-DR paper does), reusing the query embeddings.

    Rank 0 mines and broadcasts the table, so every rank samples from the same negatives.
    """

    def __init__(self, every_steps: int, top_k: int = 100, skip_top: int = 0, recluster: bool = True,
                 batch_size: int = 64):
        if every_steps <= 0:
            raise ValueError(f"every_steps must be > 0, got {every_steps}")
        if top_k <= skip_top:
            raise ValueError(f"top_k ({top_k}) must be larger than skip_top ({skip_top})")
        self.every_steps = every_steps
        self.top_k = top_k
        self.skip_top = skip_top
        self.recluster = recluster
        self.batch_size = batch_size
        self.trainer = None
        self.count = 0
        self.history: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_steps == 0 and state.global_step < state.max_steps:
            self.refresh()

    def refresh(self) -> None:
        from ...data.training import RetrievalTrainingData
        from ...evaluation.retrieval import build_index, encode_texts

        trainer = self.trainer
        data = trainer.training_data
        if not isinstance(data, RetrievalTrainingData):
            raise ValueError("negatives can only be refreshed for RetrievalTrainingData (a corpus is needed)")
        model = trainer.model
        was_training = model.training
        t0 = time.perf_counter()
        try:
            if D.is_main():
                index, order = build_index(model, data.corpus, batch_size=self.batch_size, show_progress_bar=False)
                q = encode_texts(model, data.query_texts, kind="query", batch_size=self.batch_size)
                k = min(self.top_k + int(np.diff(data.pos_ptr).max()), index.ntotal)
                _, idx = index.search(q, k)
                ranked = np.where(idx >= 0, order[np.clip(idx, 0, None)], -1)
            else:
                ranked = q = None
        finally:
            model.train(was_training)
        ranked = D.broadcast_array(ranked)
        q_all = D.broadcast_array(None if q is None else q.astype(np.float32))
        data.set_negatives(ranked, source=f"self-mined@{trainer.state.global_step}", skip_top=self.skip_top,
                           keep=self.top_k - self.skip_top)
        self.count += 1
        sizes = np.diff(data.neg_ptr)
        self.history.append({"step": int(trainer.state.global_step), "mean_candidates": float(sizes.mean())})
        logger.info("negatives refreshed at step %d in %.1fs: %.1f candidates per query from ranks [%d, %d)",
                    trainer.state.global_step, time.perf_counter() - t0, sizes.mean(), self.skip_top, self.top_k)
        if self.recluster and trainer.kmeans_callback is not None:
            trainer.kmeans_callback.cluster(reason=f"negatives refresh at step {trainer.state.global_step}",
                                            embeddings=q_all)

    def state_meta(self) -> dict:
        return {"count": self.count, "history": self.history}

    def load_state(self, tensors, meta) -> None:
        self.count = int(meta.get("count", 0))
        self.history = list(meta.get("history", []))
