"""Small torch.distributed helpers that are no-ops in a single process."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def is_main() -> bool:
    return world()[1] == 0


def barrier() -> None:
    if world()[0] > 1:
        dist.barrier()


def broadcast_array(arr: np.ndarray | None, src: int = 0) -> np.ndarray:
    """Send rank ``src``'s array (any shape, int64/float32) to every rank."""
    size, rank = world()
    if size == 1:
        return arr
    if rank == src:
        t = torch.from_numpy(np.ascontiguousarray(arr))
        meta = torch.tensor([t.ndim, *t.shape, 0 if t.dtype == torch.int64 else 1] + [0] * (8 - t.ndim - 2),
                            dtype=torch.int64)
    else:
        meta = torch.zeros(8, dtype=torch.int64)
    dist.broadcast(meta, src)
    ndim = int(meta[0])
    shape = [int(x) for x in meta[1:1 + ndim]]
    dtype = torch.int64 if int(meta[1 + ndim]) == 0 else torch.float32
    if rank != src:
        t = torch.empty(shape, dtype=dtype)
    dist.broadcast(t, src)
    return t.numpy()


def gather_rows(x: np.ndarray, total: int) -> np.ndarray:
    """All-gather contiguous row shards (rank r holds rows [r·s, (r+1)·s) of ``total``) into the full array."""
    size, _ = world()
    if size == 1:
        return x
    shard = (total + size - 1) // size
    t = torch.zeros((shard, *x.shape[1:]), dtype=torch.from_numpy(x[:0]).dtype)
    t[: len(x)] = torch.from_numpy(x)
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t)
    return torch.cat(parts)[:total].numpy()


def shard_range(total: int) -> tuple[int, int]:
    size, rank = world()
    shard = (total + size - 1) // size
    return min(rank * shard, total), min((rank + 1) * shard, total)


def all_gather_tensor(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape on every rank) along dim 0, in rank order; no gradient."""
    size, _ = world()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.detach().contiguous())
    return torch.cat(parts)
