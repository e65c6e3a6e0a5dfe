"""Every text of a step in one length-ordered pass: pack the columns of a batch, embed them, unpack per column.

sentence-transformers calls the model once per column (or, since version 6, once for the queries and once for the
other columns padded to their common width). Here every row of every column goes into one batch ordered by token
count and cut into at most ``max_groups`` length groups, each padded to its own longest row: one forward for a
single group, and no padding computed beyond what the grouping leaves (:func:`length_groups` picks the cut that pads
the fewest tokens). The embeddings come back in the columns' order, so a loss sees exactly what per-column forwards
give (up to dropout sampling and float rounding).

The plan is made on the host from the token counts: :func:`pack_columns` on batches still on the CPU (what
:class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer` does before moving a step's inputs to the device, so the
step reads no count back from the device); a :class:`PackedColumns` carries the plan to the loss, and
:func:`embed_packed` packs plain per-column features itself when it gets no plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DEFAULT_MAX_GROUPS",
    "PackedBatch",
    "PackedColumns",
    "embed_packed",
    "length_groups",
    "pack_columns",
    "task_blind",
]

DEFAULT_MAX_GROUPS = 4  # forwards a step may take: few enough for the per-call cost, enough for queries vs documents


def length_groups(lengths: np.ndarray, max_groups: int = DEFAULT_MAX_GROUPS) -> list[int]:
    """The cut of rows sorted by ``lengths`` (ascending) into at most ``max_groups`` consecutive groups that pads the
    fewest tokens (each group padded to its longest row): the end index of each group, the last one ``len(lengths)``.

    Exact by dynamic programming over the distinct lengths (a group never splits rows of equal length)."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))
    if lengths.size == 0:
        return []
    values, counts = np.unique(lengths, return_counts=True)
    ends = np.cumsum(counts)  # rows up to and including each distinct length
    n = values.size
    starts = np.concatenate([[0], ends[:-1]])
    cols = np.arange(n)
    # cost[i, j]: the rows of distinct lengths i..j in one group, padded to values[j]
    cost = np.where(cols[:, None] <= cols[None, :], (ends[None, :] - starts[:, None]) * values[None, :], np.inf)
    tables, args = [cost[0]], []  # tables[k][j]: the fewest tokens for lengths 0..j in exactly k + 1 groups
    for _ in range(1, min(max_groups, n)):
        # the last group starts at distinct length i >= 1; lengths 0..i-1 take one group fewer
        total = np.concatenate([[np.inf], tables[-1][:-1]])[:, None] + cost
        args.append(total.argmin(0))
        tables.append(total[args[-1], cols])
    k = int(np.argmin([t[-1] for t in tables]))  # the first (fewest groups) among equal costs
    cuts, j = [int(ends[-1])], n - 1
    for level in range(k, 0, -1):
        j = int(args[level - 1][j]) - 1
        cuts.append(int(ends[j]))
    return cuts[::-1]


@dataclass
class PackedBatch:
    """The rows of a step's columns in length groups.

    Attributes:
        groups: one feature dict per group (rows ordered by length, padded to the group's longest row).
        inverse: for each row of the columns in order (column by column), its position in the concatenated groups.
        column_sizes: rows per column.
    """

    groups: list[dict[str, Any]]
    inverse: Tensor
    column_sizes: list[int]

    def to(self, move) -> PackedBatch:
        """The same batch with every tensor passed through ``move`` (e.g. the trainer's ``_prepare_inputs``)."""
        return PackedBatch([move(g) for g in self.groups], move(self.inverse), list(self.column_sizes))


class PackedColumns(list):
    """A step's per-column feature dicts (a plain list to any loss) carrying their :class:`PackedBatch` as
    ``packed``, made on the host before the step's inputs moved to the device."""

    packed: PackedBatch | None = None


def _right_padded(mask: Tensor, lengths: Tensor) -> bool:
    """Every row's tokens come first (so a row keeps its tokens when the batch is cut to a shorter width)."""
    return bool((mask.long().cumprod(1).sum(1) == lengths).all())


def task_blind(model) -> bool:
    """Whether ``model`` embeds a text the same whatever task it was tokenised for (it has no ``Router`` module):
    then the ``task`` each column is stamped with (query, document) need not keep the columns apart."""
    from sentence_transformers.base.modules.router import Router

    return not any(isinstance(m, Router) for m in model.modules())


def pack_columns(
    columns: list[dict[str, Any]], max_groups: int = DEFAULT_MAX_GROUPS, ignore_keys: tuple[str, ...] = ()
) -> PackedBatch | None:
    """Pack per-column features into length groups (on the columns' device; on the CPU it reads nothing back from
    an accelerator). ``ignore_keys``: metadata left out of the groups (``("task",)`` for a :func:`task_blind`
    model). None when the columns cannot share a forward pass (different feature keys, shapes or metadata:
    sentence-transformers' ``merge_feature_batches`` decides) or carry no attention mask."""
    from sentence_transformers.base.losses.merged_forward import merge_feature_batches

    columns = [{k: v for k, v in c.items() if k not in ignore_keys} for c in columns]
    if not columns or max_groups < 1:
        return None
    merged = merge_feature_batches(columns) if len(columns) > 1 else dict(columns[0])
    mask = None if merged is None else merged.get("attention_mask")
    if not isinstance(mask, Tensor) or mask.ndim != 2:
        return None
    rows, width = mask.shape
    lengths = mask.sum(1).cpu()
    if not _right_padded(mask.cpu(), lengths):
        max_groups = 1  # rows cannot be cut to a shorter width: one group at full width
    order = torch.from_numpy(np.argsort(lengths.numpy(), kind="stable"))
    ends = length_groups(lengths.numpy(), max_groups) if max_groups > 1 else [rows]
    sorted_lengths = lengths[order]
    groups, begin = [], 0
    for end in ends:
        idx = order[begin:end].to(mask.device)
        cut = int(sorted_lengths[end - 1]) if max_groups > 1 else width
        groups.append(_select_rows(merged, idx, rows, width, max(cut, 1)))
        begin = end
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(rows)
    return PackedBatch(groups, inverse.to(mask.device), [int(c["attention_mask"].shape[0]) for c in columns])


def _select_rows(features: dict[str, Any], idx: Tensor, rows: int, width: int, cut: int) -> dict[str, Any]:
    """The rows ``idx`` of a merged feature dict, token tensors cut to ``cut`` positions; metadata as is."""
    out = {}
    for key, value in features.items():
        if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == rows and key != "prompt_length":
            value = value.index_select(0, idx)
            if value.ndim >= 2 and value.shape[1] == width:
                value = value[:, :cut]
        out[key] = value
    return out


def embed_packed(
    model, columns, max_groups: int = DEFAULT_MAX_GROUPS, packed: PackedBatch | None = None
) -> list[Tensor] | None:
    """The ``sentence_embedding`` of every column, from one forward per length group: the plan ``packed`` (or the
    one ``columns`` carries as a :class:`PackedColumns`, or one made here). None when the columns cannot be packed
    (the caller then embeds them column by column)."""
    packed = packed or getattr(columns, "packed", None) or pack_columns(list(columns), max_groups)
    if packed is None:
        return None
    outputs = [model(g)["sentence_embedding"] for g in packed.groups]
    embeddings = (torch.cat(outputs, 0) if len(outputs) > 1 else outputs[0]).index_select(0, packed.inverse)
    return list(embeddings.split(packed.column_sizes, 0))
