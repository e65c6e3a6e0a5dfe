"""What a killed atomic write leaves is swept (issue 66, item 8): ``atomic_write_text`` stages as a hidden sibling
named with its host and process id (``.hf_cocodr-tmp-...``), which the next claim of the folder removes once that
process is gone; an earlier version's ``.NAME.XXXXXXXX.tmp`` is removed once it is an hour old, only when it is a
regular file of the user sweeping."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hf_cocodr.rundir.run_record import RunFolder
from hf_cocodr.storage import STALE_SECONDS, sweep_stale

ROOT = Path(__file__).resolve().parents[2]
KILLED_WRITE = """
import os, signal, sys
from hf_cocodr.utils import atomic_write_text
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed with the text written, before the rename
atomic_write_text(sys.argv[1], "{\\"half\\": true}")
"""


def test_a_killed_atomic_write_leaves_a_file_the_next_claim_removes(tmp_path):
    out = tmp_path / "run folder"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(out / "summary.json")], env=env, timeout=120)
    assert killed.returncode < 0
    left = [p.name for p in out.iterdir()]
    assert len(left) == 1 and "summary.json" in left[0] and not (out / "summary.json").exists()
    folder = RunFolder.claim(out, "export", {})  # (its writer is gone: the claim sweeps it)
    folder.release()
    assert sorted(p.name for p in out.iterdir()) == ["hf_cocodr_run.json"]


def test_an_earlier_versions_temporary_file_is_swept_once_an_hour_old(tmp_path):
    old, young = tmp_path / ".eval.json.k2x_9qaz.tmp", tmp_path / ".recipe.json.p0o9i8u7.tmp"
    other, linked = tmp_path / ".notes.tmp", tmp_path / ".plan.json.zz99yy88.tmp"
    for p in (old, young, other):
        p.write_text("{}")
    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    linked.symlink_to(precious)
    hours_ago = time.time() - STALE_SECONDS - 60
    for p in (old, other):
        os.utime(p, (hours_ago, hours_ago))
    os.utime(linked, (hours_ago, hours_ago), follow_symlinks=False)
    assert sweep_stale(tmp_path) == [old]
    assert young.is_file() and other.is_file() and linked.is_symlink() and precious.read_text() == "mine"
