"""SIGKILL during a step and during a checkpoint save; the CLI resumes from the last complete checkpoint.

The resumed run must end exactly where an uninterrupted run ends (same parameters), and a half-written checkpoint
must never be picked up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import launcher
import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "worker.py"
pytestmark = pytest.mark.slow


def run(mode, step, cli_args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return launcher.run([sys.executable, WORKER, mode, step, "--", *cli_args], env=env)


def finetune_args(model, data, out):
    return [
        "finetune",
        "--model",
        str(model),
        "--train-data",
        str(data),
        "--output_dir",
        str(out),
        "--num-clusters",
        "3",
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--use_cpu",
        "--seed",
        "3",
        "--cluster_every_steps",
        "2",
        "--refresh-negatives-every",
        "3",
        "--learning_rate",
        "1e-3",
    ]


def pretrain_args(model, data, out):
    return [
        "pretrain",
        "--model",
        str(model),
        "--corpus",
        str(data),
        "--output_dir",
        str(out),
        "--max_steps",
        "6",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        "--use_cpu",
        "--seed",
        "3",
    ]


def final_weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
@pytest.mark.parametrize("mode", ["step", "save"])
def test_sigkill_then_resume_equals_uninterrupted(kind, mode, tiny_bert_dir, tiny_beir, tmp_path):
    make = finetune_args if kind == "finetune" else pretrain_args
    ref = run("none", 0, make(tiny_bert_dir, tiny_beir, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr[-3000:]

    out = tmp_path / "killed"
    killed = run(mode, 4, make(tiny_bert_dir, tiny_beir, out))
    assert killed.returncode == -signal.SIGKILL
    ckpts = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    if mode == "save":
        assert "checkpoint-4" in ckpts  # the half-written checkpoint is on disk...
        assert not (out / "checkpoint-4" / "hf_cocodr_checkpoint_complete.json").exists()
    resumed = run("none", 0, make(tiny_bert_dir, tiny_beir, out) + ["--resume_from_checkpoint", "true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "checkpoint-2" in resumed.stderr  # ...and never picked up
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    a, b = final_weights(tmp_path / "ref"), final_weights(out)
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6, msg=n)
