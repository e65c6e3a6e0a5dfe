"""Outputs get the modes the umask gives, as ``save_pretrained``'s plain writes do, so another account (a model
server) can read an exported or trained model (issue 30, modes)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from hf_cocodr.cli import main
from hf_cocodr.utils import atomic_write_json, atomic_write_text


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(folder: Path, skip: set[str] = frozenset()) -> dict[str, int]:
    """The permission bits of ``folder`` and everything below it (links left out)."""
    out = {".": stat.S_IMODE(os.lstat(folder).st_mode)}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_symlink() and rel.parts[0] not in skip:
            out[rel.as_posix()] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def expected(folder: Path, file_mode: int, dir_mode: int, skip: set[str] = frozenset()) -> dict[str, int]:
    return {k: dir_mode if (folder / k).is_dir() else file_mode for k in modes(folder, skip)}


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o027, 0o640, 0o750)]
)
def test_atomic_writes_honour_the_umask(tmp_path, mask, file_mode, dir_mode):
    with umask(mask):
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_json(tmp_path / "sub" / "b.json", {"x": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == file_mode
    assert stat.S_IMODE(os.stat(tmp_path / "sub" / "b.json").st_mode) == file_mode
    assert stat.S_IMODE(os.stat(tmp_path / "sub").st_mode) == dir_mode


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_an_exported_model_honours_the_umask(tiny_bert_dir, tmp_path, mask, file_mode, dir_mode):
    out = tmp_path / "model"
    with umask(mask):
        assert main(["export", str(tiny_bert_dir), str(out)]) == 0
    got = modes(out)
    assert {"model.safetensors", "README.md", "1_Pooling/config.json", "hf_cocodr_provenance.json"} <= set(got)
    assert got == expected(out, file_mode, dir_mode)


def test_a_trained_model_honours_the_umask_and_a_users_file_keeps_its_mode(tiny_st_dir, tiny_beir, tmp_path):
    out = tmp_path / "ft"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    os.chmod(out / "notes.txt", 0o600)
    with umask(0o022):
        assert (
            main(
                [
                    "finetune",
                    "--model",
                    str(tiny_st_dir),
                    "--train-data",
                    str(tiny_beir),
                    "--output_dir",
                    str(out),
                    "--num-clusters",
                    "2",
                    "--max_steps",
                    "2",
                    "--save_steps",
                    "1",
                    "--per_device_train_batch_size",
                    "8",
                    "--use_cpu",
                    "--overwrite_output_dir",
                ]
            )
            == 0
        )
    got = modes(out, skip={"notes.txt"})
    assert {"model.safetensors", "README.md", "1_Pooling/config.json", "checkpoint-2/model.safetensors"} <= set(got)
    assert got == expected(out, 0o644, 0o755, skip={"notes.txt"})
    assert stat.S_IMODE(os.stat(out / "notes.txt").st_mode) == 0o600  # not hf_cocodr's: untouched
