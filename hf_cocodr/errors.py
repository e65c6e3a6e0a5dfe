"""Errors that mean "your input is wrong" (printed as one line by the CLI) rather than "hf_cocodr has a bug"."""

from __future__ import annotations

from .data.beir import BEIRFormatError
from .hub import HubPushError


class ConfigError(ValueError):
    """Conflicting or invalid arguments; the message says which and how to fix them."""


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
