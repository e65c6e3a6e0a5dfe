"""Per-sample InfoNCE with hard negatives, optional in-batch negatives, a false-negative mask and DDP layout.

Layout of a batch (the sentence-transformers convention): queries ``Q`` (B×d) and document columns
``D_0`` (positives), ``D_1..D_m`` (hard negatives), flattened column-major into candidates ``C`` (B·(1+m)×d).
Under DDP with gathering, candidates of all ranks are concatenated rank by rank.

Every candidate carries an integer *key* (the document's identity). A candidate whose key is one of the query's
labelled positives is never a negative for that query (datasets with several positives per query, such as
NFCorpus, would otherwise train against their own labels), except in the query's own positive slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class BatchLayout:
    """Who is who in a (possibly gathered) batch.

    Attributes:
        batch_size: rows per rank (B).
        num_columns: document columns per row (1 + number of hard negatives).
        world_size: number of ranks whose candidates are in ``C``.
        doc_keys: (world·B·(1+m),) identity of every candidate, or None (then only the own slot is special).
        pos_keys: (world·B, P) labelled-positive keys of every row (padded with -1), or None.
    """

    batch_size: int
    num_columns: int
    world_size: int = 1
    doc_keys: Tensor | None = None
    pos_keys: Tensor | None = None

    def candidate_coords(self, device) -> tuple[Tensor, Tensor, Tensor]:
        """(rank, column, row-in-rank) of every candidate in C."""
        B, M, W = self.batch_size, self.num_columns, self.world_size
        idx = torch.arange(W * M * B, device=device)
        return idx // (M * B), (idx % (M * B)) // B, idx % B

    def mask_and_targets(self, row_ranks: Tensor, row_b: Tensor, in_batch: bool, cross_rank: bool):
        """Boolean ``allowed`` (rows × candidates) and the target column of each row."""
        device = row_ranks.device
        c_rank, c_col, c_b = self.candidate_coords(device)
        own = (c_rank[None, :] == row_ranks[:, None]) & (c_b[None, :] == row_b[:, None])
        is_pos = own & (c_col[None, :] == 0)
        if in_batch:
            base = torch.ones_like(own) if cross_rank else (c_rank[None, :] == row_ranks[:, None])
            base = base | own
        else:
            base = own
        if self.doc_keys is not None and self.pos_keys is not None:
            global_rows = row_ranks * self.batch_size + row_b
            pk = self.pos_keys[global_rows]  # rows × P
            false_neg = (self.doc_keys[None, :, None] == pk[:, None, :]).any(-1)  # padding (-1) never matches
            base = base & ~(false_neg & ~is_pos)
        targets = is_pos.float().argmax(dim=1)
        return base, targets


def similarity_matrix(q: Tensor, c: Tensor, similarity: str, scale: float) -> Tensor:
    if similarity == "cosine":
        q = F.normalize(q, dim=-1)
        c = F.normalize(c, dim=-1)
    elif similarity != "dot":
        raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
    return scale * (q @ c.T)


def per_sample_infonce(
    q: Tensor, c: Tensor, allowed: Tensor, targets: Tensor, similarity: str, scale: float
) -> Tensor:
    """ℓ_b = −log softmax over the allowed candidates of row b, at its positive."""
    logits = similarity_matrix(q, c, similarity, scale)
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.logsumexp(logits, dim=1) - logits.gather(1, targets[:, None]).squeeze(1)


def infonce_cotangents(
    q: Tensor, c: Tensor, allowed: Tensor, targets: Tensor, weights: Tensor, similarity: str, scale: float
) -> tuple[Tensor, Tensor]:
    """The gradients of ``Σ_b weights[p, b] · ℓ_b`` (ℓ of :func:`per_sample_infonce`) with respect to ``q`` (B×d) and
    ``c`` (N×d), for every row ``p`` of ``weights`` (P×B) at once, in closed form: ``(P×B×d, P×N×d)``.

    With ``G = softmax(logits) − onehot(targets)`` (zero where not allowed), ``∂ℓ_b/∂logit_bj = G_bj``, so for dot
    products ``∂/∂q_b = scale · w_pb (G C)_b`` and ``∂/∂c_j = scale · Σ_b w_pb G_bj q_b``; for cosine the same with
    the unit vectors, then through the normalisation (``(g − (g·x̂) x̂) / |x|``). One matrix product per cluster
    instead of one backward pass through the loss per cluster."""
    if similarity == "cosine":
        q_norm, c_norm = q.norm(dim=-1, keepdim=True), c.norm(dim=-1, keepdim=True)
        qu, cu = F.normalize(q, dim=-1), F.normalize(c, dim=-1)
    elif similarity == "dot":
        qu, cu = q, c
    else:
        raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
    logits = (scale * (qu @ cu.T)).masked_fill(~allowed, float("-inf"))
    g = torch.softmax(logits, dim=1)
    g = g - F.one_hot(targets, g.shape[1]).to(g.dtype)
    cot_q = scale * weights[:, :, None] * (g @ cu)[None]
    cot_c = scale * torch.matmul((weights[:, :, None] * g[None]).transpose(1, 2), qu)
    if similarity == "cosine":
        cot_q = (cot_q - (cot_q * qu).sum(-1, keepdim=True) * qu) / q_norm.clamp(min=1e-12)
        cot_c = (cot_c - (cot_c * cu).sum(-1, keepdim=True) * cu) / c_norm.clamp(min=1e-12)
    return cot_q, cot_c
