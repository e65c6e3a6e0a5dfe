"""Finding the checkpoint to resume from: only complete checkpoints count.

A checkpoint is complete when our marker (written after everything else, atomically) is present and its
``trainer_state.json`` parses. A folder left behind by a crash during a save is never picked up.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from .state import COMPLETE_MARKER

logger = logging.getLogger(__name__)
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def is_complete(path: str | os.PathLike) -> bool:
    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        return False
    try:
        json.loads((path / "trainer_state.json").read_text())
        json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return True


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CKPT.match(p.name))]
    return sorted(found)


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    complete = [p for _, p in list_checkpoints(output_dir) if is_complete(p)]
    return complete[-1] if complete else None


def resolve_resume(value, output_dir: str | os.PathLike) -> str | None:
    """``True``/"true" → the latest complete checkpoint in ``output_dir`` (or None: start fresh, logged);
    a path → that checkpoint, which must be complete; ``None``/False → None."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "no", "0")):
        return None
    if value is True or (isinstance(value, str) and value.lower() in ("true", "yes", "1", "latest")):
        latest = latest_complete_checkpoint(output_dir)
        for step, p in list_checkpoints(output_dir):
            if not is_complete(p) and (latest is None or step > int(latest.name.split("-")[1])):
                logger.warning("removing incomplete checkpoint %s (interrupted while saving)", p)
                shutil.rmtree(p, ignore_errors=True)
        if latest is None:
            logger.info("no complete checkpoint in %s: training starts from the beginning", output_dir)
            return None
        logger.info("resuming from %s", latest)
        return str(latest)
    path = Path(value)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} not found")
    if not is_complete(path):
        raise ValueError(f"checkpoint {path} is incomplete (it was being written when the run stopped); "
                         f"resume from {latest_complete_checkpoint(path.parent) or 'the beginning'} instead")
    return str(path)
