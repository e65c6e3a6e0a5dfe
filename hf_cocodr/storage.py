"""The disk under hf_cocodr's writes: staging beside the destination, sweeping what a killed run left, the cache
folder, and the checks made before any work (writable folders, free space against the model's size).

Every temporary entry hf_cocodr writes is a hidden sibling of its destination named
``.hf_cocodr-tmp-<host>-<pid>-<random>.<name>`` (:func:`staging_path`): on the destination's file system (a rename
into place is atomic, hard links work), removed when its write fails, and recognisable afterwards. A folder being
replaced is moved aside as ``.hf_cocodr-old-...`` for the moment of the swap. A staging entry whose writer is gone
(same host, dead pid) is *stale* and :func:`sweep_stale` removes it on the next run (a folder moved aside whose
destination is missing is renamed back instead); one of another host is stale once it has not changed for
:data:`STALE_SECONDS`. A temporary file of an earlier version's atomic write (``.NAME.XXXXXXXX.tmp``, no writer's id in its name) is
swept once it is a regular file of the sweeping user untouched for :data:`STALE_SECONDS`. A destination name too long
to fit in a staging name (file names are at most 255 bytes) is
shortened in it to a prefix and a hash (:func:`bounded_name`), so a 250-character folder name stages like any other.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
import uuid
from pathlib import Path

from .errors import NotEnoughSpaceError

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".hf_cocodr-tmp-"
BACKUP_PREFIX = ".hf_cocodr-old-"
STALE_SECONDS = 3600  # a staging entry of another host (shared file system) untouched this long is left over
_PID_REUSE_SECONDS = 24 * 3600  # a live pid on this host owning an entry this old is a reused pid
_STAGING = re.compile(r"^\.hf_cocodr-(tmp|old)-([0-9a-f]{8})-(\d+)-[0-9a-f]{8}\.(.+)$", re.DOTALL)
NO_SPACE_CHECK_ENV = "HF_COCODR_NO_SPACE_CHECK"


NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs, APFS, NTFS)
_STAGING_ROOM = NAME_MAX - 64  # what a staging name leaves for the destination's name
_SHORTENED = re.compile(r"~h[0-9a-f]{16}$")


def bounded_name(name: str, room: int = _STAGING_ROOM) -> str:
    """``name`` itself when it fits in ``room`` bytes, else its first bytes and ``~h`` + 16 hex digits of its hash
    (the same long name always gives the same short one)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[: room - 19].decode("utf-8", "ignore") + "~h" + digest


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def staging_path(dest: str | os.PathLike, backup: bool = False) -> Path:
    """A fresh name for a temporary entry beside ``dest`` (same folder, hence same file system), recognisable by
    :func:`sweep_stale` as this process's; ``backup``: the name ``dest`` is moved aside to while it is replaced."""
    dest = Path(dest)
    prefix = BACKUP_PREFIX if backup else STAGING_PREFIX
    return dest.parent / f"{prefix}{_host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.{bounded_name(dest.name)}"


def is_staging_name(name: str) -> bool:
    """Whether ``name`` is that of a staging entry (:func:`staging_path`)."""
    return _STAGING.match(name) is not None


def staged_name(name: str) -> str | None:
    """The destination's name of a staging entry's ``name`` (shortened as :func:`bounded_name` shortens a long one);
    None for any other name."""
    m = _STAGING.match(name)
    return m[4] if m else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(entry: Path, now: float | None = None) -> bool:
    """Whether ``entry`` is a staging entry (:func:`staging_path`) no running writer owns."""
    m = _STAGING.match(entry.name)
    if not m:
        return False
    try:
        age = (time.time() if now is None else now) - entry.lstat().st_mtime
    except OSError:
        return False
    host, pid = m[2], int(m[3])
    if host == _host_tag():
        if pid == os.getpid():
            return False
        return not pid_alive(pid) or age > _PID_REUSE_SECONDS
    return age > STALE_SECONDS


# the temporary file of an atomic write of earlier versions of hf_cocodr (staged by tempfile.mkstemp:
# ".NAME." + 8 letters, digits or underscores + ".tmp"); with no writer's id in its name, one is left over once it is
# older than STALE_SECONDS, a regular file (not a link) of the user sweeping
_LEGACY_TMP = re.compile(r"^\.(.+)\.[a-z0-9_]{8}\.tmp$", re.DOTALL)


def is_legacy_leftover(entry: Path, now: float | None = None) -> bool:
    """Whether ``entry`` is a temporary file an earlier version's atomic write left (``.NAME.XXXXXXXX.tmp``): a
    regular file of this user, untouched for :data:`STALE_SECONDS`."""
    if not _LEGACY_TMP.match(entry.name):
        return False
    try:
        st = entry.lstat()
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    age = (time.time() if now is None else now) - st.st_mtime
    return stat.S_ISREG(st.st_mode) and mine and age > STALE_SECONDS


def remove_entry(path: Path) -> None:
    """Remove a file, link or folder tree of ours; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def sweep_stale(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove the stale staging entries in ``folder`` (of destination ``name`` only, if given); returns them.
    Entries that cannot be removed are left with a warning."""
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        legacy = _LEGACY_TMP.match(entry.name)
        if legacy and (name is None or legacy[1] == bounded_name(name)) and is_legacy_leftover(entry):
            with contextlib.suppress(OSError):
                entry.unlink()
                logger.warning("removed %s, a temporary file an earlier run left (over an hour old)", entry)
                removed.append(entry)
            continue
        if not is_staging_name(entry.name) or (name is not None and staged_name(entry.name) != bounded_name(name)):
            continue
        if is_stale(entry):
            dest = folder / (staged_name(entry.name) or "")
            if _SHORTENED.search(dest.name):  # a long name: the destination is the entry whose name shortens to it
                match = [e for e in entries if not is_staging_name(e.name) and bounded_name(e.name) == dest.name]
                if not match and entry.name.startswith(BACKUP_PREFIX):
                    logger.warning(
                        "left %s: a folder an earlier run moved aside while replacing it (its name was too long to "
                        "record whole); rename it back to its name if that folder is missing",
                        entry,
                    )
                    continue
                dest = match[0] if match else dest
            try:
                if entry.name.startswith(BACKUP_PREFIX) and not (dest.exists() or dest.is_symlink()):
                    os.replace(entry, dest)  # killed between the two renames of a swap: the old folder comes back
                    logger.warning(
                        "restored %s from %s, left by an earlier run that was stopped while replacing it", dest, entry
                    )
                    continue
                remove_entry(entry)
            except OSError as e:
                logger.warning("could not remove %s, left by an earlier run that was stopped: %s", entry, e)
                continue
            logger.warning("removed %s, left by an earlier run that was stopped while writing", entry)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def staged_file(dest: str | os.PathLike):
    """Yield a staging path beside ``dest``; on success it is renamed onto ``dest``, on any failure removed."""
    dest = Path(dest)
    tmp = staging_path(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_entry(tmp)
        raise


@contextlib.contextmanager
def staged_directory(dest: str | os.PathLike):
    """Yield a fresh staging folder beside ``dest`` (its parent is created, stale staging entries there are swept
    first); it is removed on exit whatever happens, a kill aside (then the next run's sweep removes it)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(dest.parent)
    tmp = staging_path(dest)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            remove_entry(tmp)


_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Hard-link ``src`` (a link itself, not its target) as ``dst``; where no hard link can be made (another file
    system, a file system without them, a file of another user) copy it instead."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def carry_over(src: Path, dst: Path) -> None:
    """Put the entry ``src`` (a file, a link or a folder tree) at ``dst`` by hard links, copies where none can be
    made (:func:`link_or_copy`); links are kept as links, never followed."""
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, copy_function=link_or_copy, symlinks=True)
    else:
        link_or_copy(src, dst)


# ------------------------------------------------------------------------------------------------- links inside
ENTRIES_FILE = ".hf_cocodr_entries.json"  # the entries hf_cocodr wrote into a folder it replaces as a whole


def _listed_entries(folder: Path) -> set[str] | None:
    """The entries a folder's :data:`ENTRIES_FILE` lists as hf_cocodr's; None without a readable one."""
    try:
        names = json.loads((folder / ENTRIES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else None


def link_inside(folder: str | os.PathLike, names, allowed=()) -> Path | None:
    """The first symbolic link at or below the entries ``names`` of ``folder`` (never followed), at any depth; None
    when there is none. ``allowed``: patterns (``fnmatch``, relative to ``folder``) of the links the caller makes
    itself and replaces as links. Inside a folder that lists its own entries (:data:`ENTRIES_FILE`) the entries it
    does not list are the user's, carried over as they are (never written through), and not looked into."""
    folder = Path(folder)
    todo = [folder / n for n in sorted(names)]
    while todo:
        path = todo.pop()
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            if not any(fnmatch.fnmatchcase(rel, pattern) for pattern in allowed):
                return path
            continue
        if path.is_dir():
            try:
                children = sorted(path.iterdir())
            except OSError:
                continue
            listed = _listed_entries(path)
            todo += [c for c in children if listed is None or c.name in listed]
    return None


def refuse_links(folder: str | os.PathLike, names, allowed=()) -> None:
    """Refuse, in one line naming the link and its target, a symbolic link at or below the entries ``names`` of
    ``folder`` (see :func:`link_inside`): hf_cocodr writes those entries and never writes through a link."""
    link = link_inside(folder, names, allowed)
    if link is not None:
        raise FileExistsError(
            f"{link} is a symbolic link (to {os.readlink(link)}) where hf_cocodr writes; it never writes through a "
            "link (the link's target is not its to change): remove the link, or give a new folder"
        )


# ------------------------------------------------------------------------------------------------------- the cache
def cache_root() -> Path:
    """hf_cocodr's cache folder: ``$HF_COCODR_CACHE``, else ``$XDG_CACHE_HOME/hf_cocodr`` (``~/.cache/hf_cocodr``)."""
    base = os.environ.get("HF_COCODR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hf_cocodr"
    )
    return Path(base).expanduser()


def cache_dir(kind: str) -> Path:
    """The cache sub-folder ``kind`` (created), with what killed runs left there swept; refused with one line naming
    the folder when it cannot be written."""
    path = cache_root() / kind
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PermissionError(
            f"the cache folder {path} cannot be created ({e.strerror or e}); set HF_COCODR_CACHE to a writable folder"
        ) from None
    check_writable(path, "the cache folder", hint="set HF_COCODR_CACHE to a writable folder")
    sweep_stale(path)
    return path


# -------------------------------------------------------------------------------------------- checks before work
def _existing_ancestor(path: Path) -> Path:
    path = Path(path).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(folder: str | os.PathLike, what: str = "the output folder", hint: str = "") -> None:
    """Refuse, with one ``PermissionError`` line naming the folder, a folder (or, when it does not exist yet, the
    nearest existing folder above it, where it would be created) that this process cannot write."""
    existing = _existing_ancestor(Path(folder))
    if not existing.is_dir():
        raise NotADirectoryError(f"{what} {folder}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = f"{folder}" if existing == Path(folder).expanduser().absolute() else f"{folder} ({existing})"
        raise PermissionError(f"{what} {where} is not writable" + (f"; {hint}" if hint else ""))


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


def _weights_in(folder: Path) -> int:
    """Bytes of the weight files of one folder (safetensors preferred when both formats are there)."""
    sizes: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            if p.suffix in _WEIGHT_SUFFIXES and p.is_file():
                key = "safetensors" if p.suffix == ".safetensors" else "other"
                sizes[key] = sizes.get(key, 0) + p.stat().st_size
    return sizes.get("safetensors") or sizes.get("other", 0)


def model_weight_bytes(model) -> int | None:
    """The bytes of a model's weight files: a local folder (its top level and module sub-folders, not its
    checkpoints), or a Hub id found in the local Hugging Face cache; None when unknown."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    path = Path(str(model)).expanduser()
    if not path.exists():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(str(model), local_files_only=True))
        except Exception:  # not cached, not a repository id, offline: the size is unknown
            return None
    if path.is_file():
        return path.stat().st_size
    total = _weights_in(path)
    with contextlib.suppress(OSError):
        for sub in path.iterdir():
            if sub.is_dir() and not sub.name.startswith((".", "checkpoint-", "runs")):
                total += _weights_in(sub)
    return total or None


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def check_free_space(folder: str | os.PathLike, needed: int | None, why: str = "") -> None:
    """Refuse, with one :class:`~hf_cocodr.errors.NotEnoughSpaceError` line naming the folder, the free and the needed bytes, a folder whose
    file system has less than ``needed`` bytes free. ``needed=None`` (unknown) checks nothing; so does
    ``$HF_COCODR_NO_SPACE_CHECK=1``."""
    if not needed or os.environ.get(NO_SPACE_CHECK_ENV):
        return
    existing = _existing_ancestor(Path(folder))
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return
    if free < needed:
        raise NotEnoughSpaceError(
            f"not enough free space: {_size(free)} free, about {_size(needed)} needed"
            + (f" ({why})" if why else "")
            + f"; free some space or set {NO_SPACE_CHECK_ENV}=1",
            folder,
        )


# how many times the model's weight files a command writes at most at one time into its output folder
EXPORT_SPACE_FACTOR = 1.2  # the exported weights (the old folder's files are carried by hard links)
TRAINING_SPACE_FACTOR = 4.0  # a checkpoint (weights and the optimizer's two moments) and the final model


def check_before_work(
    output_dir: str | os.PathLike,
    model=None,
    *,
    factor: float = TRAINING_SPACE_FACTOR,
    cache: bool = True,
    staged_beside: bool = False,
    what: str = "the output folder",
) -> None:
    """The checks of the disk made before any model loads: ``output_dir`` (and with ``cache`` hf_cocodr's cache
    folder) writable, and free space on ``output_dir``'s file system for ``factor`` times ``model``'s weight files.
    ``staged_beside``: ``output_dir`` is written as a staging sibling renamed into place, so its parent folder must
    be writable too, and it must not be a symbolic link. With a local ``model``, an ``output_dir`` that is the model's folder, holds it or lies inside it
    is refused (a run must never read what it writes): one check for every command."""
    if model is not None and isinstance(model, (str, os.PathLike)):
        check_not_source(output_dir, model)
    check_writable(output_dir, what)
    out = Path(output_dir).expanduser().absolute()
    if staged_beside and out.is_symlink():  # (replaced as a whole: never a folder a link points to)
        raise FileExistsError(
            f"{what} {output_dir} is a symbolic link (to {os.readlink(out)}); it is written beside and renamed into "
            "place, and hf_cocodr never writes through a link: remove the link, or give another folder"
        )
    if staged_beside and out.exists():
        check_writable(
            out.parent, f"the folder holding {what}", hint=f"{out.name} is written beside it and renamed into place"
        )
    if cache:
        check_writable(cache_root(), "the cache folder", hint="set HF_COCODR_CACHE to a writable folder")
    weights = model_weight_bytes(model) if model is not None else None
    if weights:
        check_free_space(output_dir, int(weights * factor), f"{factor:g} x the model's {_size(weights)} of weights")


def check_not_source(out_dir: str | os.PathLike, source: str | os.PathLike | None) -> None:
    """Refuse an output folder that is the folder a model is read from, holds it or lies inside it."""
    if source is not None and Path(str(source)).exists():
        out = Path(out_dir).expanduser().resolve()
        src = Path(str(source)).expanduser().resolve()
        if out == src or src in out.parents or out in src.parents:
            raise FileExistsError(
                f"refusing to write into {out_dir}: the model is read from {source}; give a different output folder"
            )
