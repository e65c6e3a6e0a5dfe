"""The registry of fine-tuning methods: ``--method NAME`` looks a :class:`~hf_cocodr.methods.base.Method` up here.

Adding a method is one module (a :class:`Method` subclass with its settings dataclass) plus one line in
``BUILTIN``. The settings of the built-in methods become fields of :class:`~hf_cocodr.IDROTrainingArguments` (and
so command-line flags); :func:`register_method` adds a method at run time (its settings are then read from the
arguments only if they already have those fields, e.g. for a plug-in tried in a test).
"""

from __future__ import annotations

from .base import Method
from .berm import BERM
from .modir import MoDIR
from .rmsc import RMSC

BUILTIN: tuple[type[Method], ...] = (
    MoDIR,
    BERM,
    RMSC,
)

_REGISTRY: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    """Register ``cls`` under ``cls.name`` (lower case); usable as a class decorator."""
    name = str(cls.name).lower()
    if not name:
        raise ValueError(f"{cls.__name__} has no name")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"a method named {name!r} is already registered ({_REGISTRY[name].__name__})")
    _REGISTRY[name] = cls
    return cls


def unregister_method(name: str) -> None:
    """Remove the method ``name`` from the registry (a no-op if it is not registered)."""
    _REGISTRY.pop(str(name).lower(), None)


def registered_methods() -> dict[str, type[Method]]:
    """The registered methods by name, in registration order (built-in ones first)."""
    return dict(_REGISTRY)


def get_method(name: str) -> type[Method] | None:
    return _REGISTRY.get(str(name).lower())


def builtin_settings() -> list[type]:
    """The settings dataclasses of the built-in methods, in registry order (the bases of the training arguments)."""
    return [cls.settings for cls in BUILTIN if cls.settings is not None]


for _cls in BUILTIN:
    register_method(_cls)
