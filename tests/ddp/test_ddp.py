"""2 ranks == 1 rank with twice the batch, for both trainers (gloo on CPU, world size asserted)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import launcher
import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "worker.py"
pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def run(mode, model_dir, beir, out, batch, extra="", ddp=False):
    # two ranks as torchrun starts them (its environment), forked from the suite's fork server, or one process
    cmd = [sys.executable, str(WORKER), mode, str(model_dir), str(beir), str(out), str(batch)] + (
        [extra] if extra else []
    )
    procs = launcher.run_ranks(cmd, 2, env=_env()) if ddp else [launcher.run(cmd, env=_env(), timeout=900)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2 if ddp else 1)]
    params = [load_file(str(out / f"params{r}.safetensors")) for r in range(2 if ddp else 1)]
    return ranks, params


@pytest.fixture(scope="module")
def nodrop_model(tmp_path_factory):
    import tiny

    # a larger initialisation spreads the embeddings apart, so the gradients are not tiny differences of nearly
    # equal vectors (whose float32 cancellation would swamp the comparison)
    return tiny.make_tiny_bert(tmp_path_factory.mktemp("ddp_model"), dropout=0.0, seed=4, initializer_range=0.2)


@pytest.fixture(scope="module")
def ddp_beir(tmp_path_factory):
    import tiny

    return tiny.make_beir(tmp_path_factory.mktemp("ddp_beir") / "b", n_queries=80, multi_positive=True)


def assert_params_close(a, b, rtol=1e-4, atol=1e-6):
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=rtol, atol=atol, msg=n)


def test_idro_two_ranks_equal_one_rank_doubled_batch(nodrop_model, ddp_beir, tmp_path):
    from hf_cocodr import load_encoder

    st_dir = tmp_path / "st"
    load_encoder(str(nodrop_model)).save(str(st_dir))
    (r0, r1), (p0, p1) = run("idro", st_dir, ddp_beir, tmp_path / "ddp", 4, ddp=True)
    (single,), (ps,) = run("idro", st_dir, ddp_beir, tmp_path / "one", 8)
    assert r0["world_size"] == r0["env_world_size"] == 2 and single["world_size"] == 1
    assert r0["assignments"] == single["assignments"]
    for step in ("1", "2"):
        # identical on both ranks (bit for bit), equal to the single process within float tolerance
        assert r0["steps"][step]["weights"] == r1["steps"][step]["weights"]
        assert r0["steps"][step]["cluster_ids"] == single["steps"][step]["cluster_ids"]
        # ω is an exponential of a Gram-matrix sum (entries ~1e2 here): a float32 reduction-order difference of
        # ~1e-6 relative in the Gram shows up as ~1e-4 relative in ω. A missing gather would be off by far more.
        torch.testing.assert_close(
            torch.tensor(r0["steps"][step]["weights"]),
            torch.tensor(single["steps"][step]["weights"]),
            rtol=1e-3,
            atol=1e-6,
        )
        g_ddp = torch.tensor(r0["steps"][step]["grad_gram"])
        g_one = torch.tensor(single["steps"][step]["grad_gram"])
        tol = 1e-4
        assert (g_ddp - g_one).abs().max() <= tol * g_one.abs().max(), step
    assert [h["loss"] for h in r0["log"]] == pytest.approx([h["loss"] for h in single["log"]], rel=1e-4)
    assert_params_close(p0, p1, rtol=0, atol=0)
    assert_params_close(p0, ps)


def test_methods_two_ranks_equal_one_rank_doubled_batch(nodrop_model, ddp_beir, tmp_path):
    """MoDIR + RMSC under DDP: every rank holds the same token combination at each step (gathered negatives never
    cross combinations), the same momentum queue (all ranks' embeddings) and the same domain classifier; and the
    run equals one process with the doubled batch."""
    from hf_cocodr import load_encoder

    st_dir = tmp_path / "st"
    load_encoder(str(nodrop_model)).save(str(st_dir))
    (r0, r1), (p0, p1) = run("methods", st_dir, ddp_beir, tmp_path / "ddp", 4, ddp=True)
    (single,), (ps,) = run("methods", st_dir, ddp_beir, tmp_path / "one", 8)
    assert r0["world_size"] == 2 and single["world_size"] == 1
    assert r0["combinations"] == r1["combinations"] == single["combinations"]
    assert r0["modir_queue_rows"] == single["modir_queue_rows"] == [24, 24]  # 8 queries + 8 positives + 8 targets
    assert r0["modir_classifier"] == r1["modir_classifier"]
    torch.testing.assert_close(
        torch.tensor(r0["modir_classifier"]), torch.tensor(single["modir_classifier"]), rtol=1e-4, atol=1e-6
    )
    assert [h["loss"] for h in r0["log"]] == pytest.approx([h["loss"] for h in single["log"]], rel=1e-4)
    assert_params_close(p0, p1, rtol=0, atol=0)
    assert_params_close(p0, ps)


@pytest.mark.parametrize("chunk", ["0", "2"])
def test_coco_two_ranks_equal_one_rank_doubled_batch(nodrop_model, ddp_beir, tmp_path, chunk):
    (r0, r1), (p0, p1) = run("coco", nodrop_model, ddp_beir, tmp_path / "ddp", 4, extra=chunk, ddp=True)
    (single,), (ps,) = run("coco", nodrop_model, ddp_beir, tmp_path / "one", 8, extra=chunk)
    assert r0["world_size"] == r0["env_world_size"] == 2
    for key in ("loss", "mlm_loss", "head_mlm_loss", "contrastive_loss"):
        assert [h[key] for h in r0["log"]] == pytest.approx([h[key] for h in single["log"]], rel=1e-4), key
    assert_params_close(p0, p1, rtol=0, atol=0)
    assert_params_close(p0, ps)
