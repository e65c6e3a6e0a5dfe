"""Errors that mean "your input is wrong" (printed as one line by the CLI) rather than "hf_cocodr has a bug".

The bottom layer of the package: it imports nothing of hf_cocodr. ``hf_cocodr.data.beir`` and ``hf_cocodr.hub``
re-export the errors they raise.
"""

from __future__ import annotations

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
