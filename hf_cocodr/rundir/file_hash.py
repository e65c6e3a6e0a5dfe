"""The content hash of a whole file (:func:`file_sha256`), which every "same inputs" decision and every cache keyed by
a file rests on: the run identities and their fingerprints (:func:`~hf_cocodr.rundir.run_record.fingerprint`), the
starting model's evaluation, the BEIR and span caches.

A file's SHA-256 covers every byte of it: a model whose middle layers changed in place, or a corpus rewritten in the
middle at the same size, is another input. Hashing runs at about 1 GB/s on one core (a 400 MB model in about 0.4 s;
docs/safety.md), and is memoized so that a command run again on the same files reads none of them again:

* **The rule.** A file's hash is reused while its resolved path, device, inode, size, modification time and status
  change time (``st_ctime_ns``) are all those it was hashed at. The kernel sets the change time on every write, and
  no user can set it back (``touch -d`` or ``os.utime`` put back the modification time, and set the change time to
  now): a file rewritten in place, whatever its size and modification time, is hashed again.
* **Racy files.** A file changed less than :data:`RACY_SECONDS` before it was hashed is not memoized (file systems
  keep times at a clock tick's resolution, so a write just after the hash could leave them unchanged), nor is one
  that changed while it was read.
* **Where.** In this process's memory, and for files of :data:`MEMO_MIN_BYTES` or more in
  ``<cache>/file_hashes/<hash of the path>.json`` (one small entry per path, replaced when the file changes). A
  cache folder that cannot be written only costs the time of hashing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..storage import cache_root
from ..utils import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = ["MEMO_MIN_BYTES", "RACY_SECONDS", "file_sha256"]

MEMO_KIND = "file_hashes"  # the cache sub-folder
MEMO_MIN_BYTES = 1 << 20  # smaller files are hashed faster than their memo is read
RACY_SECONDS = 2.0
_memory: dict[str, tuple[tuple, str]] = {}


def _stamp(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _hash(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _memo_file(where: str) -> Path:
    return cache_root() / MEMO_KIND / f"{hashlib.sha256(where.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.json"


def _read_memo(where: str, stamp: tuple) -> str | None:
    try:
        entry = json.loads(_memo_file(where).read_text())
        if entry.get("path") == where and tuple(entry.get("stamp") or ()) == stamp:
            return str(entry["sha256"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # absent or damaged: hashed again
    return None


def _write_memo(where: str, stamp: tuple, sha: str) -> None:
    try:
        path = _memo_file(where)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"path": where, "stamp": list(stamp), "sha256": sha})
    except Exception as e:  # a cache that cannot be written only costs time
        logger.debug("the hash of %s is not memoized (%s)", where, e)


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of every byte of the file at ``path``, memoized by the rule of this module's docstring."""
    path = Path(path)
    where = str(path.resolve())
    st = os.stat(where)
    stamp = _stamp(st)
    held = _memory.get(where)
    if held is not None and held[0] == stamp:
        return held[1]
    on_disk = st.st_size >= MEMO_MIN_BYTES
    sha = _read_memo(where, stamp) if on_disk else None
    if sha is None:
        sha = _hash(Path(where))
        racy = time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 < RACY_SECONDS
        if racy or _stamp(os.stat(where)) != stamp:  # changed just before or while it was read: never memoized
            return sha
        if on_disk:
            _write_memo(where, stamp, sha)
    _memory[where] = (stamp, sha)
    return sha


def file_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """A file's fingerprint in run records: its size and the first 32 hex digits of its :func:`file_sha256`."""
    return {"size": os.stat(path).st_size, "sha256": file_sha256(path)[:32]}
