"""The lock that keeps one writer per output folder: ``hf_cocodr_run.lock`` (see :mod:`hf_cocodr.rundir.run_record`).

The lock file holds the writer's pid, host and start, with the process's start time and the boot id, so that a pid
given later to another process is not taken for the writer. A second writer gets a one-line error naming the lock
file and the first writer's pid; a lock left by a process that is gone (same host) is taken over with a warning, by
exactly one of the processes that find it (:func:`acquire_lock`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # POSIX only; elsewhere locks are taken without the folder guard
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

logger = logging.getLogger(__name__)

LOCK = "hf_cocodr_run.lock"


class RunLockedError(FileExistsError):
    """Another live process is writing the output folder."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _boot_id() -> str | None:
    """This boot's id (Linux), or None where the system does not expose one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None where ``/proc``
    is absent or the process is gone. With the boot id it tells a live holder from an unrelated process that was
    given the same pid later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # field 2 (the command name, in parentheses) may itself hold spaces and parentheses: count after the last ')'
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _started_after(pid: int, when: float) -> bool:
    """Whether process ``pid`` started after the time ``when`` (seconds since the epoch), with two seconds' slack;
    False where that cannot be told."""
    ticks = _process_start(pid)
    try:
        btime = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return ticks is not None and btime + ticks / hz > when + 2


def _holder_is_gone(holder: dict[str, Any], host: str, written: float | None = None) -> str | None:
    """Why the lock ``holder`` (the JSON of a lock file, last written at ``written``) is stale, or None when it may
    still be running (or that cannot be told: another host, no ``/proc``)."""
    pid = holder.get("pid")
    if holder.get("host") != host or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    boot = _boot_id()
    if holder.get("boot_id") and boot and holder["boot_id"] != boot:
        return "which ran before this machine restarted"
    if not _pid_alive(pid):
        return "which is no longer running"
    recorded, now = holder.get("pid_start"), _process_start(pid)
    if isinstance(recorded, int) and now is not None and recorded != now:
        return f"which is no longer running (pid {pid} now belongs to another process)"
    if not isinstance(recorded, int) and written is not None and _started_after(pid, written):
        # a lock of an earlier version (no start time): the process under its pid started after it was written
        return f"which is no longer running (pid {pid} now belongs to a process started after the lock was written)"
    return None


@contextlib.contextmanager
def _folder_guard(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the folder itself while a lock is checked and taken or released: every hf_cocodr
    process serialises there, so a stale lock is replaced by exactly one of them. Where the platform or file system
    has no ``flock`` on folders, the lock is taken without the guard."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            logger.debug("no flock on %s; locking without the folder guard", folder)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the flock


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The JSON of the lock file: ``{}`` if it is unreadable, None if it is not there."""
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _create_from(tmp: Path, path: Path) -> None:
    """Create ``path`` with the content of ``tmp``, failing with ``FileExistsError`` if it exists: a hard link (the
    lock appears complete in one step), or an exclusive create where the file system has no hard links."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(tmp.read_text())


def acquire_lock(folder: str | os.PathLike) -> Path:
    """Create ``folder/hf_cocodr_run.lock`` or fail with a one-line :class:`RunLockedError` naming the lock file and
    its holder.

    The lock records the writer's pid, host, start, boot id and the process's start time. A lock left by a process
    that is gone (same host: its pid is not running, belongs to a process started at another time, or was taken
    before this machine restarted) is taken over with a warning. The check and the takeover happen under an
    exclusive ``flock`` on the folder, and the lock file appears complete in one step (a hard link of a written
    temporary file, or a rename over the stale one): however many processes start on one stale lock, exactly one
    takes it.
    """
    folder = Path(folder)
    path = folder / LOCK
    host = socket.gethostname()
    me = {
        "pid": os.getpid(),
        "host": host,
        "started": _now(),
        "boot_id": _boot_id(),
        "pid_start": _process_start(os.getpid()),
    }
    tmp = folder / f".{LOCK}.{uuid.uuid4().hex[:8]}.tmp"
    with _folder_guard(folder):
        tmp.write_text(json.dumps(me))
        try:
            for _ in range(3):
                try:
                    _create_from(tmp, path)
                    return path
                except FileExistsError:
                    pass
                holder = _read_holder(path)
                if holder is None:
                    continue  # released meanwhile
                if holder.get("pid") == os.getpid() and holder.get("host") == host:
                    return path  # this process holds it already (a trainer inside a recipe stage, ...)
                try:
                    written = path.stat().st_mtime
                except OSError:
                    written = None
                why = _holder_is_gone(holder, host, written)
                if why is not None:
                    logger.warning(
                        "taking over the lock %s left by process %s (started %s), %s",
                        path,
                        holder.get("pid"),
                        holder.get("started", "?"),
                        why,
                    )
                    os.replace(tmp, path)
                    return path
                if not holder:
                    raise RunLockedError(
                        f"{folder} is locked by {path} (unreadable); if no hf-cocodr process "
                        "writes there, delete that file"
                    ) from None
                raise RunLockedError(
                    f"{folder} is being written by another hf-cocodr process (pid {holder.get('pid')} on "
                    f"{holder.get('host')}, since {holder.get('started')}; lock file {path}); wait for it to finish "
                    "or use another folder (if that process is not hf-cocodr and no hf-cocodr process writes there, "
                    "delete the lock file)"
                ) from None
            raise RunLockedError(f"could not lock {folder}: {path} keeps changing")
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def release_lock(folder: str | os.PathLike) -> None:
    folder = Path(folder)
    path = folder / LOCK
    with contextlib.suppress(OSError), _folder_guard(folder):
        holder = _read_holder(path)
        if holder and holder.get("pid") == os.getpid():
            path.unlink()
