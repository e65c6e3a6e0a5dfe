"""Errors that mean "your input is wrong" (printed as one line by the CLI) rather than "hf_cocodr has a bug".

The bottom layer of the package: it imports nothing of hf_cocodr. ``hf_cocodr.data.beir`` and ``hf_cocodr.hub``
re-export the errors they raise.
"""

from __future__ import annotations

import errno
import os


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
)


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
    cause in words."""
    cause = _CAUSES.get(e.errno or -1, e.strerror or type(e).__name__)
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p)
    return f"{where}: {cause}" if where else cause
