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
