"""Type checks for configuration values that did not come through a typed parser (YAML ``--config`` files).

A value given on the command line is converted by ``argparse``; a value read from YAML arrives as whatever YAML made
of it (``seed: true`` is a bool, ``logging_steps: [3]`` a list) and ``argparse`` passes non-string defaults through
unconverted, so a wrong type would surface later as a traceback far from the file. ``check_field_types`` compares
every value with its dataclass field's annotation first and names the key, the expected type and the value.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

__all__ = ["check_field_types", "check_training_values", "expected_type", "matches_type"]

_BOOL_WORDS = {"true", "false", "yes", "no", "1", "0", "y", "n", "t", "f"}


def _is_number_text(value: str, kind: type) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def matches_type(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation`` as the command-line parser would accept it.

    Strings are accepted for numbers and booleans when they parse as such, because ``argparse`` converts string
    defaults with the field's type (``learning_rate: 1e-4`` is a string in YAML 1.1). Annotations this checker does
    not know (classes of other libraries, ``Any``) accept every value.
    """
    if annotation is Any or annotation is None and value is None:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, arm) for arm in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (list, tuple, set, typing.List):  # noqa: UP006
        args = typing.get_args(annotation)
        return isinstance(value, list) and (not args or all(matches_type(v, args[0]) for v in value))
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is bool:
        return isinstance(value, bool) or isinstance(value, str) and value.lower() in _BOOL_WORDS
    if annotation is int:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and _is_number_text(value, int)
        )
    if annotation is float:
        return (isinstance(value, int | float) and not isinstance(value, bool)) or (
            isinstance(value, str) and _is_number_text(value, float)
        )
    if annotation is str:
        return isinstance(value, str)
    if annotation is list:
        return isinstance(value, list)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return isinstance(value, annotation) or value in {m.value for m in annotation}
    return True


def expected_type(annotation: Any) -> str:
    """``annotation`` in words, for error messages."""
    if annotation is None or annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(expected_type(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (list, tuple, set) or annotation is list:
        args = typing.get_args(annotation)
        plural = {bool: "booleans", int: "whole numbers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0], expected_type(args[0]))}" if args else "a list"
    if origin is dict or annotation is dict:
        return "a mapping"
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    if annotation in words:
        return words[annotation]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def check_field_types(cls: type, values: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming the first value of ``values`` that does not fit its field of dataclass ``cls``.

    Keys that are not fields of ``cls`` are ignored (the caller reports unknown keys itself).
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key in names and not matches_type(value, hints.get(key, Any)):
            raise ValueError(f"{where}: option {key} must be {expected_type(hints[key])}, got {value!r}")


def check_training_values(args: Any, where: str) -> None:
    """Raise ``ValueError`` for values ``TrainingArguments`` accepts but no training can use, found only after the
    data is prepared otherwise: a batch size or an accumulation below 1, and ``lr_scheduler_kwargs`` that the
    ``lr_scheduler_type`` does not take (tried on a one-parameter optimizer, so nothing is loaded)."""
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(args, name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: option {name} must be a whole number >= 1, got {value!r}")
    kwargs = getattr(args, "lr_scheduler_kwargs", None)
    if kwargs:
        import torch
        from transformers.optimization import get_scheduler

        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        kind = getattr(args, "lr_scheduler_type", "linear")
        try:
            get_scheduler(
                kind, optimizer, num_warmup_steps=1, num_training_steps=10, scheduler_specific_kwargs=dict(kwargs)
            )
        except (TypeError, ValueError, KeyError) as e:
            kind = getattr(kind, "value", kind)
            raise ValueError(
                f"{where}: option lr_scheduler_kwargs {dict(kwargs)!r} is not taken by the {kind} scheduler "
                f"({' '.join(str(e).split())})"
            ) from None
