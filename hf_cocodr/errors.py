"""Errors that mean "your input is wrong" (printed as one line by the CLI) rather than "hf_cocodr has a bug"."""

from __future__ import annotations

from .data.beir import BEIRFormatError


class ConfigError(ValueError):
    """Conflicting or invalid arguments; the message says which and how to fix them."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    BEIRFormatError,
    ConfigError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)
