"""With ``save_total_limit``, a save killed or failed before the new checkpoint is complete must leave the complete
checkpoint before it: the Trainer removed older checkpoints *before* hf_cocodr's completion marker was written, so a
kill or a full disk between the two left none to resume from (issue 66, item 9: transformers resumes from the highest
checkpoint whether complete or not; hf_cocodr skips it, and now still has the one before). The resume from it ends
where the uninterrupted run ends, bit for bit."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors.torch import load_file

from hf_cocodr.cli import main


class Killed(BaseException):
    """Stands for a SIGKILL in this process: no ``except Exception`` or cleanup of the command catches it."""


def argv(model, data, out) -> list[str]:
    return [
        "finetune",
        "--model",
        str(model),
        "--train-data",
        str(data),
        "--output_dir",
        str(out),
        "--num-clusters",
        "2",
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--save_total_limit",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--use_cpu",
        "--seed",
        "29",
        "--learning_rate",
        "2e-3",
    ]


@pytest.fixture(scope="module")
def uninterrupted(tiny_st_dir, tiny_beir, tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("whole") / "run"
    assert main(argv(tiny_st_dir, tiny_beir, out)) == 0
    return load_file(str(out / "model.safetensors"))


def resume_equals(uninterrupted, model, data, out, capsys) -> None:
    capsys.readouterr()
    assert main([*argv(model, data, out), "--resume_from_checkpoint", "true"]) == 0
    err = capsys.readouterr().err
    assert f"resuming from {out / 'checkpoint-2'}" in err, err[-2000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4
    resumed = load_file(str(out / "model.safetensors"))
    assert resumed.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        assert torch.equal(value, resumed[name]), name


def test_a_kill_before_the_newest_checkpoints_marker_resumes_from_the_one_before(
    uninterrupted, tiny_st_dir, tiny_beir, tmp_path, monkeypatch, capsys
):
    from hf_cocodr.trainer_common import TrainerMixin

    original = TrainerMixin._mark_checkpoint_complete

    def mark(self, trial):
        if self.state.global_step == 4:  # checkpoint-4 written in full, its marker not yet
            raise Killed
        return original(self, trial)

    monkeypatch.setattr(TrainerMixin, "_mark_checkpoint_complete", mark)
    out = tmp_path / "killed at 4"
    with pytest.raises(Killed):
        main(argv(tiny_st_dir, tiny_beir, out))
    monkeypatch.undo()
    assert (out / "checkpoint-4").is_dir() and (out / "checkpoint-2" / "hf_cocodr_checkpoint_complete.json").is_file()
    resume_equals(uninterrupted, tiny_st_dir, tiny_beir, out, capsys)
    assert not (out / "checkpoint-2").exists()  # the limit holds once checkpoint-4 is complete


def test_a_full_disk_at_the_newest_checkpoints_marker_leaves_the_one_before(
    uninterrupted, tiny_st_dir, tiny_beir, tmp_path, monkeypatch, capsys
):
    import hf_cocodr.rundir.checkpoints as checkpoints

    original = checkpoints.atomic_write_json

    def write(path, obj, *a, **k):
        if "checkpoint-4" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(path, obj, *a, **k)

    monkeypatch.setattr(checkpoints, "atomic_write_json", write)
    out = tmp_path / "disk filled at 4"
    assert main(argv(tiny_st_dir, tiny_beir, out)) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"hf-cocodr finetune: error: {out}: the disk is full"
    monkeypatch.undo()
    assert not (out / "checkpoint-4").exists()  # the unfinished checkpoint is removed, the one before is there
    assert (out / "checkpoint-2" / "hf_cocodr_checkpoint_complete.json").is_file()
    resume_equals(uninterrupted, tiny_st_dir, tiny_beir, out, capsys)
