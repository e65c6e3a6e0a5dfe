"""What the multi-process tests share: the environment a launched process runs in, the ``torchrun`` command of two
CPU ranks, and a run that must succeed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import launcher

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


def free_port() -> int:
    """A TCP port of loopback that no process holds now (the OS picks it), so runs in parallel test workers never
    share one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
