"""Small torch.distributed helpers that are no-ops in a single process.

The collectives are the library's: ``broadcast_object_list`` / ``all_gather_object`` for NumPy arrays (any shape,
dtype or row count; they follow the backend's device rules, so they also work under NCCL) and sentence-transformers'
``all_gather`` for tensors.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
import torch.distributed as dist

from .errors import ConfigError, OtherRankFailed, describe_os_error, exit_code


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def is_main() -> bool:
    return world()[1] == 0


def barrier() -> None:
    if world()[0] > 1:
        dist.barrier()


def broadcast_array(arr: np.ndarray | None, src: int = 0) -> np.ndarray | None:
    """Rank ``src``'s array (any shape and dtype, or None) on every rank."""
    if world()[0] == 1:
        return arr
    box = [arr]
    dist.broadcast_object_list(box, src)
    return box[0]


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` (anything picklable) on every rank: what one rank decided (a plan measured on its clock,
    a guard's verdict), so every rank goes on with the same."""
    if world()[0] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]


def main_first(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on rank 0 (the rank that writes the run's files), its result broadcast to every rank;
    a failure on rank 0 is raised on every rank (:func:`raise_together`). One process: ``fn``'s call."""
    if world()[0] == 1:
        return fn(*args, **kwargs)
    result, error = None, None
    if is_main():
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # raised on every rank below
            error = e
    raise_together(error)
    return broadcast_object(result)


def gather_rows(x: np.ndarray, total: int) -> np.ndarray:
    """All-gather contiguous row shards (rank r holds the rows :func:`shard_range` gives it) into the full array."""
    size, _ = world()
    if size == 1:
        return x
    parts: list[np.ndarray | None] = [None] * size
    dist.all_gather_object(parts, x)
    out = np.concatenate(parts)
    if len(out) != total:
        raise RuntimeError(f"gather_rows: the ranks hold {len(out)} rows together, expected {total}")
    return out


def chunk_owner(index: int, size: int) -> int:
    """The rank that encodes chunk ``index`` of a corpus's length-sorted order among ``size`` ranks.

    Whole chunks are dealt in a snake (ranks 0, 1, ..., N-1, then N-1, ..., 0, then 0, 1, ...): each chunk is a
    contiguous slice of the sorted order, so its documents are batched exactly as one process batches them (the same
    vectors, bit for bit on the same threads), while the ranks share long and short documents alike. Contiguous runs
    of chunks would give rank 0 all the longest documents (the first of a length-sorted order), and dealing round
    robin (0, 1, 0, 1, ...) would give it the longer chunk of every pair."""
    if size <= 1:
        return 0
    r = index % (2 * size)
    return r if r < size else 2 * size - 1 - r


def agree(ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (a collective; ``ok`` itself in one process)."""
    if world()[0] == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def raise_together(error: BaseException | None) -> None:
    """Raise on every rank when any rank failed (a collective): the failing rank re-raises its own ``error``, the
    others an :class:`~hf_cocodr.errors.OtherRankFailed` with its line and its exit code (a refusal of the input
    exits 2 on every rank, in one line each, without a traceback), so no rank is left waiting in a later
    collective."""
    size, rank = world()
    if size == 1:
        if error is not None:
            raise error
        return
    errors: list[tuple[str, int] | None] = [None] * size
    dist.all_gather_object(errors, None if error is None else (_one_line(error), exit_code(error)))
    if error is not None:
        raise error
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        r, (line, code) = failed[0]
        raise OtherRankFailed(f"rank {r} of {size} stopped the run ({line}); this rank stops with it", code)


def _one_line(error: BaseException) -> str:
    """``error`` as the command line prints it: a machine fault's path and cause, anything else's message."""
    if isinstance(error, OSError) and exit_code(error) == 1:
        return describe_os_error(error)
    return " ".join((str(error) or type(error).__name__).split())


def same_settings(settings: dict, what: str = "the settings") -> None:
    """Refuse, on every rank in one line, a launch whose ranks were given other ``settings`` (a collective; nothing
    in one process): every rank's are gathered and compared with rank 0's, key by key, so a rank started with
    another ``--distill-steps`` is refused before any work, instead of waiting for ever in a collective of a step the
    other ranks never take, or being silently overridden by what rank 0 decides."""
    size, _ = world()
    if size == 1:
        return
    mine = json.loads(json.dumps(settings, sort_keys=True, default=str))
    everyone: list[dict | None] = [None] * size
    dist.all_gather_object(everyone, mine)
    first = everyone[0] or {}
    for r, other in enumerate(everyone[1:], start=1):
        other = other or {}
        differ = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        if differ:
            shown = "; ".join(f"{k}: {other.get(k)!r} on rank {r}, {first.get(k)!r} on rank 0" for k in differ[:3])
            more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
            raise ConfigError(
                f"the ranks of this launch were given different {what}: {shown}{more}; launch every rank with the "
                "same arguments"
            )


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env() -> bool:
    """Join the process group a launcher such as ``torchrun`` describes (``RANK`` and ``WORLD_SIZE`` in the
    environment, world size > 1) unless one is initialised already: NCCL where CUDA is available, gloo otherwise.
    Returns whether this call initialised it (the caller then destroys it, :func:`destroy`)."""
    if not (dist.is_available() and "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1):
        return False
    if dist.is_initialized():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return True


def destroy(*, wait: bool = True) -> None:
    """Leave the process group, after a barrier (so no rank exits while another still talks to it) unless ``wait``
    is false: a rank that failed leaves at once (waiting could hang on ranks still in another collective; the
    launcher stops them when it exits)."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def shard_range(total: int) -> tuple[int, int]:
    size, rank = world()
    shard = (total + size - 1) // size
    return min(rank * shard, total), min((rank + 1) * shard, total)


def all_gather_tensor(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape on every rank) along dim 0, in rank order; no gradient."""
    if world()[0] == 1:
        return x
    from sentence_transformers.util import all_gather

    return all_gather(x.detach().contiguous())


def gather_cat(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Every rank's ``x`` (same shape on every rank) concatenated along ``dim`` in rank order; no gradient flows."""
    size, _ = world()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def gather_padded(x: torch.Tensor, pad: int = -1) -> torch.Tensor:
    """:func:`gather_cat` along dim 0 of (B, P_r) tensors whose second dimension differs across ranks: each is
    right-padded with ``pad`` to the widest first."""
    size, _ = world()
    if size == 1:
        return x
    width = torch.tensor([x.shape[1]], device=x.device)
    widths = [torch.zeros_like(width) for _ in range(size)]
    dist.all_gather(widths, width)
    w = max(int(v) for v in widths)
    if x.shape[1] < w:
        x = torch.cat([x, torch.full((x.shape[0], w - x.shape[1]), pad, dtype=x.dtype, device=x.device)], 1)
    return gather_cat(x, 0)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over ranks, as a new tensor (``x`` itself is left unchanged)."""
    if world()[0] == 1:
        return x
    out = x.clone().contiguous()
    dist.all_reduce(out)
    return out
