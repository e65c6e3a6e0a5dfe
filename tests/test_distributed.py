"""The distributed helpers in 2 gloo processes on CPU: arrays of any dtype reach every rank unchanged, uneven row
shards gather in rank order, tensors gather without gradient; and all of them are no-ops in a single process."""

from __future__ import annotations

import os
import sys

import launcher
import numpy as np
import pytest
import torch

from hf_cocodr import distributed as D

pytestmark = pytest.mark.slow  # runs 2 processes


def _worker(rank: int, world: int, out: str) -> None:
    import torch.distributed as dist

    # A file store rather than a TCP store: a TCP store lives in rank 0's process, and when rank 0 exited first, rank
    # 1 (still tearing down its process group) lost it and aborted ("terminate called without an active exception",
    # seen once in CI on a busy machine). A file store belongs to no rank, and needs no free port either.
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'store')}", rank=rank, world_size=world)
    try:
        total = 7  # uneven: rank 0 holds rows 0-3, rank 1 rows 4-6
        lo, hi = D.shard_range(total)
        rows = np.arange(total * 3, dtype=np.float32).reshape(total, 3)[lo:hi] + 0.25
        src = rank == 0
        x = torch.full((2, 3), float(rank), requires_grad=True)
        gathered = D.all_gather_tensor(x * 2)
        res = {
            "world": np.array(D.world()),
            "is_main": np.array(D.is_main()),
            "shard": np.array([lo, hi]),
            "rows": D.gather_rows(rows, total),
            "f32": D.broadcast_array(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3) if src else None),
            "i64": D.broadcast_array(np.array([[3, -1], [7, 2**40]], dtype=np.int64) if src else None),
            "i32": D.broadcast_array(np.array([5, 6], dtype=np.int32) if src else None),
            "none": np.array(D.broadcast_array(None) is None),
            "gathered": gathered.numpy(),
            "gathered_grad": np.array(gathered.requires_grad),
        }
        np.savez(os.path.join(out, f"rank{rank}.npz"), **res)
        D.barrier()  # both ranks are done with every collective before either tears its group down
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # this file run as each of two ranks (forked from the suite's fork server, in torchrun's environment)
    for rank in launcher.run_ranks([sys.executable, __file__, str(out)], 2):
        assert rank.returncode == 0, rank.stderr[-4000:]
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(2)]


def test_broadcast_keeps_dtype_shape_and_none(two_ranks):
    for res in two_ranks:
        np.testing.assert_array_equal(res["f32"], np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3))
        assert res["f32"].dtype == np.float32
        np.testing.assert_array_equal(res["i64"], np.array([[3, -1], [7, 2**40]], dtype=np.int64))
        assert res["i64"].dtype == np.int64
        np.testing.assert_array_equal(res["i32"], np.array([5, 6], dtype=np.int32))
        assert res["i32"].dtype == np.int32
        assert bool(res["none"])


def test_gather_rows_and_tensors_in_rank_order(two_ranks):
    full = np.arange(21, dtype=np.float32).reshape(7, 3) + 0.25
    expected = np.concatenate([np.zeros((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)])
    for rank, res in enumerate(two_ranks):
        assert res["world"].tolist() == [2, rank] and bool(res["is_main"]) == (rank == 0)
        assert res["shard"].tolist() == ([0, 4] if rank == 0 else [4, 7])
        np.testing.assert_array_equal(res["rows"], full)
        np.testing.assert_array_equal(res["gathered"], expected)
        assert not bool(res["gathered_grad"])


def test_single_process_is_a_no_op():
    x = np.ones((3, 2), np.float32)
    assert D.world() == (1, 0) and D.is_main() and D.shard_range(5) == (0, 5)
    assert D.broadcast_array(x) is x and D.broadcast_array(None) is None
    assert D.gather_rows(x, 3) is x
    t = torch.ones(2)
    assert D.all_gather_tensor(t) is t
    D.barrier()


if __name__ == "__main__":
    _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1])
