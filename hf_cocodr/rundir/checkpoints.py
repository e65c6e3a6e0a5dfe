"""Finding the checkpoint to resume from: only complete, intact checkpoints of this run count.

A checkpoint is complete when our marker (written after everything else, atomically; under ``torch.distributed``
after every rank wrote its files) is present and its ``trainer_state.json`` parses, and, where it holds random
states, it holds the state of each rank that wrote it (``rng_state_<rank>.pth``, listed in its marker). The marker records the run id of the run that wrote it and a SHA-256 of every file; a
resume takes the newest checkpoint of *this* run whose files still match, and falls back past a damaged one with a
warning naming it. A folder left behind by a crash during a save is never picked up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

from ..utils import atomic_write_json

logger = logging.getLogger(__name__)
_CKPT = re.compile(r"^checkpoint-(\d+)$")


COMPLETE_MARKER = "hf_cocodr_checkpoint_complete.json"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_checksums(folder: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` except the completion marker."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != COMPLETE_MARKER:
            out[str(p.relative_to(folder))] = _sha256(p)
    return out


def mark_complete(folder: str | os.PathLike, global_step: int, run_id: str | None, world_size: int = 1) -> None:
    """Write ``folder``'s completion marker, last and atomically: its step, the run it belongs to, the number of
    ranks that wrote it and the SHA-256 of every file in it. Only checkpoints with this marker are ever resumed from
    (see :func:`damage`); under ``torch.distributed`` the caller writes it once every rank has written its files."""
    atomic_write_json(
        os.path.join(folder, COMPLETE_MARKER),
        {"global_step": global_step, "run_id": run_id, "world_size": int(world_size), "files": file_checksums(folder)},
    )


def rng_states(world_size: int) -> list[str]:
    """The random-state files the Trainer saves in a checkpoint of a run of ``world_size`` ranks."""
    return ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{r}.pth" for r in range(world_size)]


def _missing_rng_state(marker: dict, recorded: dict) -> str | None:
    """The random state of a rank a checkpoint lacks (its marker lists the files it held when it was marked): a
    resume restores each rank's, so one that lacks a rank's would train that rank otherwise. A checkpoint without
    random states (``save_only_model``) needs none; one marked before markers said their ranks is read with this
    launch's ranks."""
    if not any(name.startswith("rng_state") for name in recorded):
        return None
    world = marker.get("world_size")
    if not isinstance(world, int):
        from ..distributed import world as current

        world = current()[0]
    missing = [name for name in rng_states(world) if name not in recorded]
    return f"{missing[0]} (a rank's random state) is missing" if missing else None


def _marker(path: Path) -> dict | None:
    try:
        json.loads((path / "trainer_state.json").read_text())
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_complete(path: str | os.PathLike) -> bool:
    return _marker(Path(path)) is not None


def damage(path: str | os.PathLike) -> str | None:
    """What is wrong with a complete checkpoint's files (None: they match the checksums its marker recorded)."""
    path = Path(path)
    marker = _marker(path) or {}
    recorded = marker.get("files")
    if recorded is None:
        return None  # written before checksums were kept
    for name, sha in recorded.items():
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        if _sha256(p) != sha:
            return f"{name} changed after the checkpoint was written"
    return _missing_rng_state(marker, recorded)


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CKPT.match(p.name))]
    return sorted(found)


def latest_complete_checkpoint(output_dir: str | os.PathLike, run_id: str | None = None) -> Path | None:
    """The newest complete checkpoint whose files are intact (and, given ``run_id``, that this run wrote)."""
    for _, p in reversed(list_checkpoints(output_dir)):
        marker = _marker(p)
        if marker is None or (run_id is not None and marker.get("run_id") != run_id):
            continue
        problem = damage(p)
        if problem:
            logger.warning("checkpoint %s is damaged (%s): falling back to the previous intact one", p, problem)
            continue
        return p
    return None


def rotate(output_dir: str | os.PathLike, limit: int | None, keep: str | os.PathLike | None = None) -> list[Path]:
    """Remove the checkpoints of ``output_dir`` older than its newest ``limit`` complete ones (``save_total_limit``;
    None or < 1: none), except ``keep`` (the best one); returns them. Called once the newest checkpoint's marker is
    written: a checkpoint is only ever removed when ``limit`` newer complete ones exist, so a save killed or failed
    before its marker always leaves the complete checkpoint before it. One newer than the newest complete one (being
    written) is never touched."""
    if not limit or limit < 1:
        return []
    found = list_checkpoints(output_dir)
    complete = [p for _, p in found if is_complete(p)]
    if len(complete) <= limit:
        return []
    oldest_kept = min(int(p.name.split("-")[1]) for p in complete[-limit:])
    best = Path(keep).name if keep else None
    removed = [p for step, p in found if step < oldest_kept and p.name != best]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def resolve_resume(value, output_dir: str | os.PathLike, run_id: str | None = None) -> str | None:
    """``True``/"true" → the latest complete, intact checkpoint of this run in ``output_dir`` (or None: start fresh,
    logged); a path → that checkpoint, which must be complete and intact; ``None``/False → None."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "no", "0")):
        return None
    if value is True or (isinstance(value, str) and value.lower() in ("true", "yes", "1", "latest")):
        latest = latest_complete_checkpoint(output_dir, run_id)
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
        raise ValueError(
            f"checkpoint {path} is incomplete (it was being written when the run stopped); "
            f"resume from {latest_complete_checkpoint(path.parent, run_id) or 'the beginning'} instead"
        )
    problem = damage(path)
    if problem:
        raise ValueError(
            f"checkpoint {path} is damaged ({problem}); resume from "
            f"{latest_complete_checkpoint(path.parent, run_id) or 'the beginning'} instead"
        )
    return str(path)
