"""A kill at any moment of a training command's final save (its model files half written, or all written but not yet
listed in the owner record) is resumed by the re-run, which writes the final model again; before, every re-run was
refused because the folder "holds ... which hf_cocodr did not write" (issue 66, item 3). The final model's entries are
declared in the owner record before the save (``TrainerMixin._declare_outputs``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import launcher
import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).parent / "worker.py"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(mode: str, nth: int, argv: list[str]) -> subprocess.CompletedProcess:
    # (the checkout under test first on the path, whatever copy of hf_cocodr the environment has installed)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=path)
    return launcher.run([sys.executable, WORKER, mode, nth, "--", *argv], env=env)


def trainer_argv(kind: str, model: Path, data: Path, out: Path) -> list[str]:
    argv = [kind, "--model", str(model), "--output_dir", str(out), "--max_steps", "3", "--save_steps", "3"]
    argv += ["--per_device_train_batch_size", "4", "--use_cpu", "--seed", "11"]
    if kind == "finetune":
        return [*argv, "--train-data", str(data), "--num-clusters", "2"]
    return [*argv, "--corpus", str(data)]


def assert_weights_equal(final: dict, checkpoint: dict, prefix: str = "") -> None:
    assert final
    for name, value in final.items():
        assert torch.equal(value, checkpoint[prefix + name]), name


class Killed(BaseException):
    """Stands for a SIGKILL in this process: no ``except Exception`` or cleanup of the command catches it."""


def kill_at_record(monkeypatch, nth: int) -> None:
    """The ``nth`` final save of a trainer in this process is written, and the process dies before its owner record
    lists what it wrote (the moment a kill left the files looking like the user's)."""
    from hf_cocodr.trainer_common import TrainerMixin

    calls, original = [0], TrainerMixin._record_outputs

    def record(self):
        calls[0] += 1
        if calls[0] == nth:
            raise Killed
        return original(self)

    monkeypatch.setattr(TrainerMixin, "_record_outputs", record)


def test_finetune_killed_inside_its_final_save_is_resumed_by_the_rerun(tiny_st_dir, tiny_beir, tmp_path):
    out = tmp_path / "interrupted run"
    argv = trainer_argv("finetune", tiny_st_dir, tiny_beir, out)
    killed = run("final-card", 1, argv)  # SIGKILL: the final model's files written, its card not yet
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (out / "checkpoint-3").is_dir() and (out / "model.safetensors").is_file()

    resumed = run("none", 0, [*argv, "--resume_from_checkpoint", "true"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "did not write" not in resumed.stderr
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    record = json.loads((out / "hf_cocodr_run.json").read_text())
    assert {"model.safetensors", "modules.json", "README.md"} <= set(record["files"]) and not record["preexisting"]
    checkpoint = load_file(str(out / "checkpoint-3" / "model.safetensors"))  # the final model: the last checkpoint's
    assert_weights_equal(load_file(str(out / "model.safetensors")), checkpoint)


def test_pretrain_killed_before_its_final_save_is_recorded_is_resumed_by_the_rerun(
    tiny_bert_dir, tiny_beir, tmp_path, monkeypatch, capsys
):
    from hf_cocodr.cli import main

    out = tmp_path / "coco after a kill"
    argv = trainer_argv("pretrain", tiny_bert_dir, tiny_beir, out)
    kill_at_record(monkeypatch, 1)
    with pytest.raises(Killed):
        main(argv)
    monkeypatch.undo()
    assert (out / "model.safetensors").is_file() and "model.safetensors" not in json.loads(
        (out / "hf_cocodr_run.json").read_text()
    )["files"]
    assert main([*argv, "--resume_from_checkpoint", "true"]) == 0, capsys.readouterr().err
    assert "did not write" not in capsys.readouterr().err
    record = json.loads((out / "hf_cocodr_run.json").read_text())
    assert {"model.safetensors", "condenser_head.safetensors"} <= set(record["files"]) and not record["preexisting"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3


def test_a_recipe_killed_in_a_stages_final_save_finishes_on_the_rerun(tiny_bert_dir, tiny_beir, tmp_path, monkeypatch):
    """Killed once the fine-tuning stage's final model is written (the second trainer's; COCO finished before),
    before its record lists it: the re-run skips COCO, resumes the fine-tuning at its last checkpoint (nothing left
    to train), writes its model again and finishes the recipe."""
    from hf_cocodr import recipe as R

    config = {
        "pseudo_queries": 0,
        "guard": "record",
        "coco_steps": 2,
        "finetune_steps": 2,
        "skip_finetune": False,
        "target_pairs": "none",
        "wise_alpha": None,
        "coco_runs": 1,
        "corpus_pool": None,
        "refreshes": 0,
        "coco": {"per_device_train_batch_size": 4, "save_steps": 2},
        "finetune": {"per_device_train_batch_size": 4, "num_clusters": 2, "save_steps": 2},
    }
    out = tmp_path / "recipe out"
    kill_at_record(monkeypatch, 2)
    with pytest.raises(Killed):
        R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=config)
    monkeypatch.undo()
    assert (out / "coco" / "hf_cocodr_stage.json").is_file() and not (
        out / "finetune" / "hf_cocodr_stage.json"
    ).exists()
    assert (out / "finetune" / "model.safetensors").is_file()

    R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=config)
    assert json.loads((out / "finetune" / "hf_cocodr_stage.json").read_text())["steps"] == 2
    assert (out / "model" / "model.safetensors").is_file() and (out / "recipe.json").is_file()
    checkpoint = load_file(str(out / "finetune" / "checkpoint-2" / "model.safetensors"))
    assert_weights_equal(load_file(str(out / "finetune" / "model.safetensors")), checkpoint)
