"""HardNegativeRefreshCallback: ANCE-style self-mined negatives, refreshed inside ``trainer.train()``."""

from __future__ import annotations

import logging
import time

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

    Rank 0 mines and broadcasts the table, so every rank samples from the same negatives.
    """

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
        self.trainer = None
        self.count = 0
        self.history: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_steps == 0 and state.global_step < state.max_steps:
            self.refresh()

    def refresh(self) -> None:

        trainer = self.trainer
        data = trainer.training_data.negatives_table()  # the rows with a corpus and a negatives table
        if not isinstance(data, RetrievalTrainingData):
            raise ValueError("negatives can only be refreshed for RetrievalTrainingData (a corpus is needed)")
        model = trainer.model
        was_training = model.training
        t0 = time.perf_counter()
        q_all = None
        group = trainer.training_data.negatives_group
        if group is not None:  # those rows are encoded as they are trained (a method's hook, e.g. its tokens)
            trainer.use_row_group(group)
        try:
            if D.is_main():
                with encoding_precision(model, self.encode_precision) as encoder:
                    index, order = build_index(
                        encoder,
                        data.corpus,
                        batch_size=self.batch_size,
                        show_progress_bar=False,
                        max_length=self.max_length,
                    )
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
            else:
                neg_ptr = neg_idx = None
        finally:
            model.train(was_training)
        neg_ptr = D.broadcast_array(neg_ptr)
        neg_idx = D.broadcast_array(neg_idx)
        if self.recluster:
            q_all = D.broadcast_array(q_all)
        data.install_negatives(neg_ptr, neg_idx, source=f"self-mined@{trainer.state.global_step}")
        self.count += 1
        sizes = np.diff(data.neg_ptr)
        self.history.append({"step": int(trainer.state.global_step), "mean_candidates": float(sizes.mean())})
        logger.info(
            "negatives refreshed at step %d in %.1fs: %.1f candidates per query from ranks [%d, %d)",
            trainer.state.global_step,
            time.perf_counter() - t0,
            sizes.mean(),
            self.skip_top,
            self.top_k,
        )
        if self.recluster and trainer.kmeans_callback is not None:
            same_rows = data is trainer.training_data  # else K-Means clusters rows the refresh did not encode
            trainer.kmeans_callback.cluster(
                reason=f"negatives refresh at step {trainer.state.global_step}",
                embeddings=q_all if same_rows else None,
            )

    def state_meta(self) -> dict:
        return {"count": self.count, "history": self.history}

    def load_state(self, tensors, meta) -> None:
        self.count = int(meta.get("count", 0))
        self.history = list(meta.get("history", []))
