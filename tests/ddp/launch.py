"""What the multi-process tests share: the environment a launched process runs in, the ``torchrun`` command of two
CPU ranks, and a run that must succeed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def torchrun(port_base: int) -> list[str]:
    """``torchrun --nproc_per_node 2`` on a port of its own (``port_base`` + this process's id mod 1000)."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return [exe, "--nproc_per_node", "2", "--master_port", str(port_base + os.getpid() % 1000)]


def run_checked(cmd: list[str], cwd=None, **env: str) -> subprocess.CompletedProcess:
    """``cmd`` run to completion in :func:`launch_env` (``env`` on top); a failure shows its stderr's end."""
    proc = subprocess.run(cmd, env=launch_env(**env), capture_output=True, text=True, timeout=900, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
