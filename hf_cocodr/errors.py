"""Errors that mean "your input is wrong" (printed as one line by the CLI) rather than "hf_cocodr has a bug".

The bottom layer of the package: it imports nothing of hf_cocodr. ``hf_cocodr.data.beir`` and ``hf_cocodr.hub``
re-export the errors they raise.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil


class ConfigError(ValueError):
    """Conflicting or invalid arguments; the message says which and how to fix them."""


class BEIRFormatError(ValueError):
    """A BEIR file is malformed. The message names the file, the line and how to fix it."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}" + (f", line {line}" if line is not None else "") + ": "
        super().__init__(where + message)
        self.path = None if path is None else str(path)
        self.line = line


class HubPushError(RuntimeError):
    """A push failed; the message says why (status, repository) and the local directory is untouched."""


class NotEnoughSpaceError(OSError):
    """Refused before any work: the file system of an output folder has less free space than the command needs. The
    message names the folder, the free and the needed bytes (``errno`` is ``ENOSPC``)."""

    def __init__(self, message: str, path: str | os.PathLike):
        super().__init__(errno.ENOSPC, message, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


USER_ERRORS: tuple[type[BaseException], ...] = (
    BEIRFormatError,
    ConfigError,
    HubPushError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    NotEnoughSpaceError,
)


class OtherRankFailed(RuntimeError):
    """Another rank of a ``torch.distributed`` launch failed and this one stops with it (raised on every rank but the
    one that failed, :func:`hf_cocodr.distributed.raise_together`). The message says which rank and its one line;
    ``exit_code`` is the failing rank's (2: a refusal of the input, 1: a fault of the machine or a bug, 130:
    interrupted), so every rank of a refused run exits as the rank that refused it, in one line."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = int(exit_code)


def exit_code(e: BaseException) -> int:
    """The exit code the command line gives ``e``: 2 for bad input (:data:`USER_ERRORS`), 130 for an interrupt, 1
    for a fault of the machine (another ``OSError``) or anything else; another rank's failure keeps that rank's."""
    if isinstance(e, OtherRankFailed):
        return e.exit_code
    if isinstance(e, USER_ERRORS):
        return 2
    if isinstance(e, KeyboardInterrupt):
        return 130
    return 1


_CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EXDEV: "source and destination are on different file systems (cross-device link)",
    errno.EIO: "an input/output error of the device",
}


def describe_os_error(e: OSError) -> str:
    """One line for a fault of the machine (disk full, read-only, permission, cross-device): the path(s) and the
    cause in words. An error without an errno says what its message says (a library's ``OSError("... does not
    appear to have a file named ...")``), a ``shutil.Error`` of a copy its first failed entry (source, destination,
    cause) and how many more failed; only an error with no message at all is named by its class."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        failed = e.args[0]
        first = failed[0]
        said = (
            f"{first[0]} -> {first[1]}: {' '.join(str(first[2]).split())}"
            if isinstance(first, tuple) and len(first) == 3
            else " ".join(str(first).split())
        )
        return f"copy failed: {said}" + (f" (and {len(failed) - 1} more entries)" if len(failed) > 1 else "")
    message = " ".join(str(e.args[0] if len(e.args) == 1 else e).split()) if e.errno is None else ""
    cause = _CAUSES.get(e.errno or -1, e.strerror or message or f"{type(e).__name__} (no message)")
    if e.errno in _CAUSES and e.strerror and e.strerror != os.strerror(e.errno):
        cause += f" ({e.strerror})"  # what hf_cocodr knows beyond the cause: which write failed and how
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p)
    return f"{where}: {cause}" if where else cause


# A failed write as the serialisers report it: torch's zip writer ("unexpected pos 8832 vs 8724", "PytorchStreamWriter
# failed writing file ..."), safetensors' Rust error ("IoError(Os { code: 28, kind: StorageFull, ... })").
_TORCH_WRITE_FAILED = re.compile(r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing|file write failed")
_RUST_OS_CODE = re.compile(r"Os \{ code: (\d+)")
_LOW_SPACE = 64 << 20  # after a failed write, a file system with less free space than this is taken for full


def _free_bytes(path: str | os.PathLike) -> int | None:
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def as_disk_fault(e: BaseException, path: str | os.PathLike) -> OSError | None:
    """The ``OSError`` (naming ``path`` when the error names no file) for a write that failed because of the disk:
    an ``OSError`` of the disk (full, quota, read-only, I/O) without a file name, a plain ``OSError`` with neither an
    errno nor a file name (numpy's short write on a full disk, ``"8192 requested and 0 written"``: "write failed
    (disk full?)"), torch's zip-writer ``RuntimeError`` or a safetensors ``SafetensorError`` carrying an OS error.
    ``None`` for every other error (left as it is)."""
    disk_errnos = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG)
    if isinstance(e, OSError):
        if e.errno in disk_errnos and not e.filename:
            return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
        if type(e) is OSError and e.errno is None and not e.filename:  # (a subclass is one of hf_cocodr's own lines)
            detail = " ".join(str(e).split())[:200]
            return OSError(None, "write failed (disk full?)" + (f": {detail}" if detail else ""), str(path))
        return None
    text = str(e)
    if type(e).__name__ == "SafetensorError":
        m = _RUST_OS_CODE.search(text)
        if m:
            code = int(m[1])
            return OSError(code, os.strerror(code), str(path))
        return None
    if isinstance(e, RuntimeError) and _TORCH_WRITE_FAILED.search(text):
        free = _free_bytes(path)
        if free is not None and free < _LOW_SPACE:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return OSError(errno.EIO, f"writing failed ({' '.join(text.split())[:200]})", str(path))
    return None


@contextlib.contextmanager
def disk_faults(path: str | os.PathLike):
    """Turn a write that fails because of the disk into one ``OSError`` naming ``path`` (see
    :func:`as_disk_fault`); every other error passes unchanged."""
    try:
        yield
    except Exception as e:
        fault = as_disk_fault(e, path)
        if fault is None:
            raise
        raise fault from e
