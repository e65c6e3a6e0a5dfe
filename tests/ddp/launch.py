"""What the multi-process tests share: the environment a launched process runs in, the ``torchrun`` command of two
CPU ranks, and a run that must succeed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import launcher
from launcher import free_port

ROOT = Path(__file__).resolve().parents[2]


def launch_env(**extra: str) -> dict:
    """The test's environment for a launched process: offline, one thread, this checkout first on the path; ``extra``
    on top (e.g. ``HF_COCODR_CACHE``)."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        **extra,
    )
    return env


def torchrun(port_base: int | None = None) -> list[str]:
    """``torchrun --nproc_per_node 2`` on a free port of its own (:func:`free_port`; ``port_base`` is no longer
    read: every caller gets a port no other holds)."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return [exe, "--nproc_per_node", "2", "--master_port", str(free_port())]


def run_checked(cmd: list[str], cwd=None, **env: str) -> subprocess.CompletedProcess:
    """``cmd`` run to completion in :func:`launch_env` (``env`` on top); a failure shows its stderr's end. A single
    ``python`` process is forked from the suite's fork server (``tests/launcher.py``: the same process, without the
    imports' start-up); ``torchrun`` is launched."""
    proc = launcher.run(cmd, env=launch_env(**env), timeout=900, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def ranks_checked(cmd: list[str], cwd=None, **env: str) -> list[subprocess.CompletedProcess]:
    """``cmd`` (``python ...``) as two ranks in torchrun's environment (``launcher.run_ranks``) over
    :func:`launch_env` (``env`` on top), each to a successful end; each rank's result, in rank order."""
    ranks = launcher.run_ranks(cmd, 2, env=launch_env(**env), cwd=cwd)
    for rank in ranks:
        assert rank.returncode == 0, rank.stderr[-4000:]
    return ranks
