"""A resume from the checkpoint at ``max_steps`` trains nothing: the run stays at ``max_steps`` and its weights are the
uninterrupted run's, bit for bit (a re-run of a finished command, or a resume after a kill during the final save).

transformers' Trainer derives the epoch to resume in from ``global_step // steps_per_epoch``; when ``max_steps`` is
not a multiple of the epoch length the resumed epoch still has batches left, and its loop only checks the step limit
after a step, so one more step was trained (3 -> 4). A constant learning rate makes that extra step visible.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file


def _finetune(model, data, out) -> list[str]:
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
        "3",
        "--save_steps",
        "3",
        "--per_device_train_batch_size",
        "4",
        "--use_cpu",
        "--seed",
        "3",
        "--lr_scheduler_type",
        "constant",
        "--learning_rate",
        "1e-3",
    ]


def _pretrain(model, data, out) -> list[str]:
    return [
        "pretrain",
        "--model",
        str(model),
        "--corpus",
        str(data),
        "--output_dir",
        str(out),
        "--max_steps",
        "3",
        "--save_steps",
        "3",
        "--per_device_train_batch_size",
        "4",
        "--use_cpu",
        "--seed",
        "3",
        "--lr_scheduler_type",
        "constant",
        "--learning_rate",
        "1e-3",
    ]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
@pytest.mark.parametrize("final_save_lost", [False, True])
def test_resume_from_the_final_checkpoint_trains_nothing(kind, final_save_lost, tiny_bert_dir, tiny_beir, tmp_path):
    from hf_cocodr.cli import main

    make = _finetune if kind == "finetune" else _pretrain
    out = tmp_path / "run"
    assert main(make(tiny_bert_dir, tiny_beir, out)) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    # the data holds more than 3 batches, so step 3 ends inside the first epoch (the case transformers gets wrong)
    assert state["epoch"] < 1, state["epoch"]
    finished = _weights(out)
    if final_save_lost:  # killed after checkpoint-3 was complete but before the final model was written
        (out / "model.safetensors").unlink()

    assert main(make(tiny_bert_dir, tiny_beir, out) + ["--resume_from_checkpoint", "true"]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert not (out / "checkpoint-4").exists()
    _assert_same(finished, _weights(out))


@pytest.mark.slow
def test_recipe_stage_resumed_at_its_end_trains_nothing(tiny_bert_dir, tiny_beir, tmp_path):
    """A recipe killed after a stage's final checkpoint and model but before its completion marker: the re-run
    resumes each such stage from its checkpoint at ``max_steps`` and trains no step."""
    from hf_cocodr import recipe as R

    cfg = dict(
        coco_steps=2,
        finetune_steps=3,
        refreshes=0,
        corpus_pool=None,
        wise_alpha=None,
        coco_runs=1,
        coco={"per_device_train_batch_size": 4, "save_steps": 2, "lr_scheduler_type": "constant"},
        finetune={
            "per_device_train_batch_size": 4,
            "num_clusters": 3,
            "save_steps": 3,
            "lr_scheduler_type": "constant",
        },
    )
    out = tmp_path / "run"
    stages = ("coco", "finetune")
    R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    weights = {stage: _weights(out / stage) for stage in stages}
    planned = {"coco": 2, "finetune": 3}
    for (
        stage,
        steps,
    ) in planned.items():  # as if killed after the stage's final checkpoint and model, before its marker
        (out / stage / "hf_cocodr_stage.json").unlink()
        R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
        state = json.loads((out / stage / "trainer_state.json").read_text())
        assert state["global_step"] == steps, stage
        assert state["epoch"] < 1, (stage, state["epoch"])  # the final step ends inside an epoch
        assert json.loads((out / stage / "hf_cocodr_stage.json").read_text())["steps"] == steps
        assert not (out / stage / f"checkpoint-{steps + 1}").exists()
        _assert_same(weights[stage], _weights(out / stage))
