"""Joint schedule: target pseudo pairs as an extra loss term of every source fine-tuning step.

The paper's schedule is sequential (COCO on the target corpora, then fine-tuning on the source labels). The joint
schedule trains both in one loop: each step adds ``weight`` × the in-batch contrastive loss of a fresh sample of
target pseudo pairs (a title or sentence against the rest of its document, see
:func:`hf_cocodr.data.pseudo_pairs.target_pseudo_pairs`) to the (iDRO-reweighted) source loss, so the encoder never
drifts far from the target domain while it learns the source task.

:class:`JointPseudoPairs` is that term as a :class:`~hf_cocodr.methods.base.Method`: give it to the trainer
(``IDROTrainer(..., methods=[JointPseudoPairs(objective)])``) and its term joins the iDRO loss, its corpora the model
card's list of target data read.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import distributed as D
from .base import Method


class TargetPairsObjective(nn.Module):
    """Auxiliary term of :class:`~hf_cocodr.IDROLoss`: InfoNCE of target pseudo pairs with in-batch negatives.

    Args:
        pairs: a :class:`~hf_cocodr.data.RetrievalTrainingData` of pseudo pairs (its query texts are the pseudo
            queries, the positive the rest of the document; its negatives table, e.g. BM25 within the target corpus,
            gives ``num_negatives`` hard negatives per pair).
        weight: multiplies the term; 0 disables it (no forward pass at all).
        batch_size: pairs per step and device (default: the source batch size).
        similarity / scale: ``"cosine"`` (×scale) or ``"dot"``, as the source loss.
        seed: the pairs of step ``s`` come from a generator seeded by ``(seed, s)``: a resumed run draws the same.
    """

    def __init__(
        self,
        pairs,
        weight: float = 1.0,
        *,
        batch_size: int | None = None,
        num_negatives: int = 1,
        similarity: str = "cosine",
        scale: float = 20.0,
        max_length: int | None = None,
        seed: int = 0,
    ):
        super().__init__()
        if not weight >= 0:
            raise ValueError(f"the joint target-pairs weight must be >= 0, got {weight!r}")
        self.pairs = pairs
        self.weight = float(weight)
        self.batch_size = batch_size
        self.num_negatives = num_negatives
        self.similarity = similarity
        self.scale = scale
        self.max_length = max_length
        self.seed = seed

    def sample_rows(self, step: int, n: int) -> np.ndarray:
        """This rank's rows of one global draw of ``n × world`` pairs for ``step`` (2 ranks = 1 doubled batch)."""
        world, rank = D.world()
        rng = np.random.default_rng([self.seed, step, 7])
        total = min(n * world, len(self.pairs))
        rows = rng.choice(len(self.pairs), size=total, replace=False)
        per_rank = max(1, total // world)
        return rows[rank * per_rank : (rank + 1) * per_rank]

    def loss_on(self, model, rows: np.ndarray, step: int) -> Tensor:
        """The InfoNCE of ``rows``: each pseudo query against its positive, the other positives and the hard
        negatives of the batch."""
        cols, _, _ = self.pairs.sample(rows, step=step, seed=self.seed, num_negatives=self.num_negatives)
        device = next(model.parameters()).device
        kw = {"max_length": self.max_length} if self.max_length else {}
        q = _encode(model, cols[0], "query", device, kw)
        docs = torch.cat([_encode(model, c, "document", device, kw) for c in cols[1:]])
        if self.similarity == "cosine":
            q, docs = F.normalize(q, dim=-1), F.normalize(docs, dim=-1)
        scores = q @ docs.T * (self.scale if self.similarity == "cosine" else 1.0)
        return F.cross_entropy(scores.float(), torch.arange(len(q), device=device))

    def compute(self, model, embeddings: list[Tensor], outputs, context: dict) -> dict[str, Tensor]:
        if self.weight == 0.0:
            return {}
        step = int(context.get("step", 0))
        n = self.batch_size or embeddings[0].shape[0]
        loss = self.loss_on(model, self.sample_rows(step, n), step)
        return {"target_pairs_loss": self.weight * loss, "_target_pairs_infonce": loss.detach()}


class JointPseudoPairs(Method):
    """The joint schedule's term as a method: its loss term is ``objective`` (a :class:`TargetPairsObjective`), and
    the model card lists ``pseudo-pairs`` and the target corpora of its pairs. Not a ``--method``: the recipe's
    joint schedule (``target_pairs`` with a joint weight) turns it on."""

    name = "pseudo-pairs"
    label = "pseudo pairs"

    def __init__(self, objective: TargetPairsObjective):
        super().__init__()
        self.objective = objective
        self.target_corpora_read = list(objective.pairs.corpora)

    def loss_terms(self) -> list:
        return [self.objective]

    @classmethod
    def card_metadata(cls) -> dict:
        """Nothing of its own: the model card names ``pseudo-pairs`` and says it read target documents itself (as
        for the sequential schedule's pseudo-pair stage)."""
        return {}


def _encode(model, texts: list[str], task: str, device, kw: dict) -> Tensor:
    """Embeddings with gradient, through the model's own preprocessing for ``task`` (query / document)."""
    if hasattr(model, "encode_document"):
        kw = {**kw, "task": task}
    feats = model.preprocess(texts, **kw)
    feats = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in feats.items()}
    return model(feats)["sentence_embedding"]
