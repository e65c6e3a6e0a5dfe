"""The disk is checked before any model loads (writable output and cache folders, free space against the model's
size), and a disk that fills up during a save ends in one line naming the folder, never a traceback."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from hf_cocodr.cli import main

Usage = namedtuple("Usage", "total used free")
TORCH_FULL_DISK = "[enforce fail at inline_container.cc:664] . unexpected pos 8832 vs 8724"


def read_only(folder: Path, monkeypatch) -> Path:
    """``folder`` made read-only: by its mode, and (root writes anyway) by what ``os.access`` answers for it."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real = os.access

        def access(path, mode, *args, **kwargs):
            if Path(path).absolute() == folder.absolute() and mode & os.W_OK:
                return False
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)
    return folder


@pytest.fixture
def restore_modes(tmp_path):
    yield
    for p in [tmp_path, *tmp_path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load (or, for the recipe, any stage) fails the test."""
    import hf_cocodr.export as export
    import hf_cocodr.recipe.runner as runner
    from hf_cocodr.modeling import condenser, loading

    def loaded(*args, **kwargs):
        raise AssertionError("the work started before the disk was checked")

    monkeypatch.setattr(export, "load_encoder", loaded)
    monkeypatch.setattr(loading, "load_encoder", loaded)
    monkeypatch.setattr(condenser.CondenserForPretraining, "from_pretrained", loaded)
    monkeypatch.setattr(runner, "load_data", loaded)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def command(kind: str, model: Path, data: Path, out: Path) -> list[str]:
    return {
        "export": ["export", str(model), str(out)],
        "recipe": [
            "recipe",
            "--model",
            str(model),
            "--target-corpus",
            str(data),
            "--source-data",
            str(data),
            "--output_dir",
            str(out),
        ],
        "finetune": [
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
            "2",
            "--per_device_train_batch_size",
            "8",
            "--use_cpu",
        ],
        "pretrain": [
            "pretrain",
            "--model",
            str(model),
            "--corpus",
            str(data),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--use_cpu",
        ],
    }[kind]


@pytest.mark.parametrize("kind", ["export", "recipe"])
def test_a_read_only_output_folder_is_refused_in_one_line_before_the_model_loads(
    kind, tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch, restore_modes, no_model_loads
):
    out = read_only(tmp_path / "out", monkeypatch)
    assert main(command(kind, tiny_st_dir, tiny_beir, out)) == 2
    assert one_line(capsys) == f"hf-cocodr {kind}: error: the output folder {out} is not writable"
    assert sorted(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["pretrain", "finetune", "recipe"])
def test_a_read_only_cache_folder_is_refused_in_one_line_before_the_model_loads(
    kind, tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch, restore_modes, no_model_loads
):
    cache = read_only(tmp_path / "cache", monkeypatch)
    monkeypatch.setenv("HF_COCODR_CACHE", str(cache))
    assert main(command(kind, tiny_st_dir, tiny_beir, tmp_path / "out")) == 2
    line = one_line(capsys)
    assert line.startswith(f"hf-cocodr {kind}: error: the cache folder {cache} is not writable"), line
    assert "HF_COCODR_CACHE" in line


@pytest.mark.parametrize("kind", ["export", "finetune", "pretrain", "recipe"])
def test_too_little_free_space_is_refused_naming_the_folder_free_and_needed(
    kind, tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch, no_model_loads
):
    weights = (tiny_st_dir / "model.safetensors").stat().st_size
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 1000, 1000))
    out = tmp_path / "out"
    assert main(command(kind, tiny_st_dir, tiny_beir, out)) == 2
    line = one_line(capsys)
    assert line.startswith(f"hf-cocodr {kind}: error: {out}: not enough free space: 1000 bytes free, about "), line
    number, unit = re.match(r"([\d.]+) (bytes|KiB|MiB)", line.split("about ")[1]).groups()
    assert float(number) * {"bytes": 1, "KiB": 1024, "MiB": 1024**2}[unit] >= weights  # at least the weights
    assert not out.exists() or sorted(out.iterdir()) == []


def test_the_space_check_can_be_switched_off(tiny_st_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 1000, 1000))
    monkeypatch.setenv("HF_COCODR_NO_SPACE_CHECK", "1")
    assert main(["export", str(tiny_st_dir), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_full_disk_during_a_checkpoint_save_is_one_line_naming_the_folder(
    tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch
):
    import torch

    monkeypatch.setenv("HF_COCODR_NO_SPACE_CHECK", "1")  # the disk fills up during the run, not before
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 4096, 4096))

    def full_disk(*args, **kwargs):
        raise RuntimeError(TORCH_FULL_DISK)  # what torch.save says when the disk fills up under it

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "ft"
    assert main([*command("finetune", tiny_st_dir, tiny_beir, out), "--save_steps", "1"]) == 1
    assert one_line(capsys) == f"hf-cocodr finetune: error: {out}: the disk is full"
    assert not list(out.glob("checkpoint-*"))  # the half-written checkpoint is gone (it was never complete)


def test_a_full_disk_during_the_final_export_is_one_line_naming_the_folder(
    tiny_bert_dir, tiny_beir, tmp_path, capsys, monkeypatch
):
    import hf_cocodr.export as export

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write() reports it: no file name

    monkeypatch.setattr(export, "write_model_card", full_disk)
    out = tmp_path / "coco"
    assert main([*command("pretrain", tiny_bert_dir, tiny_beir, out), "--save_strategy", "no"]) == 1
    assert one_line(capsys) == f"hf-cocodr pretrain: error: {out}: the disk is full"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # the staging folders are gone


def test_serialiser_errors_of_the_disk_become_one_os_error_and_others_pass(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    from hf_cocodr.errors import describe_os_error, disk_faults

    path = tmp_path / "model"
    with pytest.raises(OSError) as e, disk_faults(path):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )
    assert e.value.errno == errno.ENOSPC and describe_os_error(e.value) == f"{path}: the disk is full"
    with pytest.raises(OSError) as e, disk_faults(path):  # torch's write failure with room left: not "full"
        raise RuntimeError(TORCH_FULL_DISK)
    assert e.value.errno == errno.EIO and "unexpected pos 8832 vs 8724" in describe_os_error(e.value)
    assert str(path) in describe_os_error(e.value)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes"), disk_faults(path):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    with pytest.raises(OSError) as e, disk_faults(path):  # an error that names its file keeps it
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.bin"))
    assert e.value.filename == str(tmp_path / "x.bin")
