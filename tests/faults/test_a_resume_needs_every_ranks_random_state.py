"""A resume needs each rank's random state (issue 66, item 6): a checkpoint of a two-rank run whose marker lists the
random state of one rank only (marked before the other rank had written its own) is passed over for the newest one
that has both, as a damaged checkpoint is. The marking itself, after every rank's files, is tested under torchrun in
tests/ddp/test_ranks_agree.py."""

from __future__ import annotations

import json
import logging

from hf_cocodr.rundir.checkpoints import latest_complete_checkpoint, mark_complete, resolve_resume


def _checkpoint(out, step: int, files: list[str], world_size: int):
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for name in files:
        (folder / name).write_bytes(f"{name} at {step}".encode())
    mark_complete(folder, step, "run-b7", world_size)
    return folder


def test_a_checkpoint_without_one_ranks_random_state_is_passed_over(tmp_path, caplog):
    out = tmp_path / "distill"
    both = _checkpoint(out, 30, ["model.safetensors", "rng_state_0.pth", "rng_state_1.pth"], 2)
    _checkpoint(out, 45, ["model.safetensors", "rng_state_0.pth"], 2)  # rank 1's never came
    with caplog.at_level(logging.WARNING):
        assert latest_complete_checkpoint(out, "run-b7") == both
    assert any("rng_state_1.pth (a rank's random state) is missing" in r.getMessage() for r in caplog.records)
    assert resolve_resume(True, out, "run-b7") == str(both)


def test_a_checkpoint_saved_without_random_states_needs_none(tmp_path):
    out = tmp_path / "coco"
    only_model = _checkpoint(out, 12, ["model.safetensors"], 3)  # save_only_model: no rank wrote a random state
    assert latest_complete_checkpoint(out, "run-b7") == only_model
