"""Export stages beside its destination (never in ``$TMPDIR``), leaves nothing when it fails, and the next export
sweeps what a killed one left."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hf_cocodr.export import export_sentence_transformer
from hf_cocodr.rundir.run_record import RECORD

ROOT = Path(__file__).resolve().parents[2]

KILLED_EXPORT = """
import sys, time
from pathlib import Path
import hf_cocodr.export as ex

real = ex.write_model_card

def card_then_hang(*args, **kwargs):
    real(*args, **kwargs)
    Path(sys.argv[3]).write_text("ready")
    time.sleep(600)

ex.write_model_card = card_then_hang
ex.export_sentence_transformer(sys.argv[1], sys.argv[2])
"""


def test_export_works_with_an_unusable_tmpdir(tiny_st_dir, tmp_path, monkeypatch):
    missing = tmp_path / "no-such-tmp"
    monkeypatch.setenv("TMPDIR", str(missing))
    monkeypatch.setattr(tempfile, "tempdir", str(missing))  # as a small or vanished $TMPDIR fails
    out = tmp_path / "parent" / "model"
    model = export_sentence_transformer(str(tiny_st_dir), out)
    assert model.encode(["a heart study"]).shape[0] == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
    assert not missing.exists()


@pytest.mark.slow  # a second Python process loads torch and the model
def test_the_next_export_sweeps_what_a_killed_export_left(tiny_st_dir, tmp_path):
    parent, tmpdir = tmp_path / "parent", tmp_path / "tmpdir"
    parent.mkdir()
    tmpdir.mkdir()
    ready = tmp_path / "ready"
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_EXPORT, str(tiny_st_dir), str(parent / "model"), str(ready)],
        env=env,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 180
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert ready.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "export hung"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    staged = sorted(p.name for p in parent.iterdir() if p.name.startswith("."))
    assert staged, sorted(parent.iterdir())  # the killed export's staging folders
    assert sorted(tmpdir.iterdir()) == []  # nothing staged in $TMPDIR

    export_sentence_transformer(str(tiny_st_dir), parent / "model")
    assert sorted(p.name for p in parent.iterdir()) == ["model"]


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_an_export_failing_midway_leaves_nothing(tiny_st_dir, tmp_path, monkeypatch, fault):
    import hf_cocodr.export as ex

    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    out = tmp_path / "parent" / "model"
    export_sentence_transformer(str(tiny_st_dir), out)

    def model_files():  # the owner record is the claim's (rewritten when an export claims the folder)
        return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != RECORD}

    before = model_files()

    def failing_card(*args, **kwargs):
        raise fault

    monkeypatch.setattr(ex, "write_model_card", failing_card)
    with pytest.raises(type(fault)):
        export_sentence_transformer(str(tiny_st_dir), out, pooling="mean")
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
    assert model_files() == before
    assert sorted(tmpdir.iterdir()) == []


def test_carried_files_are_copied_where_no_hard_link_can_be_made(tiny_st_dir, tmp_path, monkeypatch):
    out = tmp_path / "model"
    export_sentence_transformer(str(tiny_st_dir), out)
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("my notes")
    (out / "mine.txt").write_text("my file")

    def cross_device(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))

    monkeypatch.setattr(os, "link", cross_device)
    export_sentence_transformer(str(tiny_st_dir), out, pooling="mean", overwrite_output_dir=True)
    assert (out / "mine.txt").read_text() == "my file"
    assert (out / "notes" / "mine.txt").read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_folder_moved_aside_by_a_killed_swap_is_renamed_back(tmp_path):
    from hf_cocodr.storage import staging_path, sweep_stale

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = str(proc.pid)
    model = tmp_path / "model"
    aside = staging_path(model, backup=True)
    aside = aside.with_name(aside.name.replace(f"-{os.getpid()}-", f"-{dead}-"))
    aside.mkdir()
    (aside / "config.json").write_text("{}")
    half = staging_path(tmp_path / "other")
    half = half.with_name(half.name.replace(f"-{os.getpid()}-", f"-{dead}-"))
    half.mkdir()
    sweep_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the old folder is back, the half one gone
    assert (model / "config.json").read_text() == "{}"
