"""What every stage's settings are built from: :class:`Auto`, the field helper :func:`option` (a field with its
command-line flag and help) and the range checks the settings run on themselves.

A stage's settings are a dataclass of such fields with a ``check`` method (``hf_cocodr/recipe/stages/<name>.py``);
:class:`~hf_cocodr.recipe.RecipeConfig` inherits every stage's settings, so each field is a recipe option and a flag
of ``hf-cocodr recipe``. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, field
from enum import Enum
from typing import Any

from ..config_types import check_training_values
from ..errors import ConfigError
from ..utils import native_bf16


class Auto(str, Enum):
    """A setting the recipe resolves itself: ``AUTO`` by the schedule of the starting model (see
    :func:`~hf_cocodr.recipe.choose_schedule`), ``BUDGET`` (``coco_runs`` only) by the time budget. Members equal,
    print and serialise as their strings (``Auto.AUTO == "auto"``), so configs and records read as before."""

    AUTO = "auto"
    BUDGET = "budget"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


AUTO = Auto.AUTO


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    cli: bool = True,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    default_factory: Any = MISSING,
) -> Any:
    """A field with its command-line flag: ``help`` for ``--help``; ``flag`` the flag's name when it is not
    ``--field-name`` (``aliases``: more names); ``cli=False`` for a field only a ``--config`` file sets;
    ``choices`` the names a string field takes."""
    metadata = {"help": help, "flag": flag, "aliases": aliases, "cli": cli, "choices": choices, "metavar": metavar}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def check_number(obj: Any, name: str, lo: float, hi: float, *, allow_auto: bool = True, allow_none: bool = False):
    """Refuse ``obj.<name>`` unless it is a finite number in ``[lo, hi]`` (or ``auto`` / None where allowed)."""
    v = getattr(obj, name)
    if (allow_auto and v == AUTO) or (allow_none and v is None):
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ConfigError(
            f"recipe option {name} must be a number in [{lo}, {hi}]{' or auto' if allow_auto else ''}, got {v!r}"
        )


def check_whole(obj: Any, name: str, lo: int, *, allow_none: bool = True, hint: str = "") -> None:
    """Refuse ``obj.<name>`` unless it is a whole number ``>= lo`` (or None where allowed)."""
    v = getattr(obj, name)
    if (v is None and not allow_none) or (v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo)):
        raise ConfigError(
            f"recipe option {name} must be a whole number >= {lo}{' (or unset)' if allow_none else ''}, got {v!r}"
            f"{hint}"
        )


def check_flag(obj: Any, name: str) -> None:
    """Refuse ``obj.<name>`` unless it is true or false."""
    if not isinstance(getattr(obj, name), bool):
        raise ConfigError(f"recipe option {name} must be true or false, got {getattr(obj, name)!r}")


def check_switch(obj: Any, name: str) -> None:
    """Refuse ``obj.<name>`` unless it is true, false or auto."""
    if getattr(obj, name) not in (True, False, AUTO):
        raise ConfigError(f"recipe option {name} must be true, false or auto, got {getattr(obj, name)!r}")


def check_choice(obj: Any, name: str, choices: tuple[str, ...], wording: str) -> None:
    """Refuse ``obj.<name>`` unless it is one of ``choices`` (``wording``: how the message lists them)."""
    if getattr(obj, name) not in choices:
        raise ConfigError(f"recipe option {name} must be {wording}, got {getattr(obj, name)!r}")


def no_gpu() -> bool:
    """Whether this machine has no CUDA device (the stages then train with ``use_cpu``)."""
    import torch

    return not torch.cuda.is_available()


# A CUDA GPU trains larger per-device batches than a CPU core: (GiB of GPU memory at least, times the CPU's batch).
# MiniLM-class encoders at 128-256 tokens use a few GiB at the CPU batches; small models are overhead-bound on a GPU,
# so a larger batch is what keeps it busy (docs/throughput.md).
GPU_BATCH_MULTIPLIERS = ((40.0, 4), (16.0, 2))


def gpu_memory_gib() -> float | None:
    """The memory of this process's CUDA device in GiB (None: no CUDA device)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30


def device_batch_size(cpu_batch: int, cap: int) -> int:
    """A stage's default per-device batch on this machine: ``cpu_batch`` on a CPU; on a CUDA GPU ``cpu_batch`` times
    the multiplier of its memory (:data:`GPU_BATCH_MULTIPLIERS`: x4 from 40 GiB, x2 from 16 GiB), at most ``cap``
    (never below ``cpu_batch``). A stage's options (``per_device_train_batch_size``) decide instead."""
    memory = gpu_memory_gib()
    if memory is None:
        return cpu_batch
    times = next((t for gib, t in GPU_BATCH_MULTIPLIERS if memory >= gib), 1)
    return max(cpu_batch, min(cap, cpu_batch * times))


# Corpus encodings and evaluations on a CPU core run faster in small batches (sentence-transformers sorts the texts by
# length, so a batch pads little, and a batch of 16 x 256 tokens keeps its activations in cache; docs/precision.md
# gives the measurement). A GPU wants larger ones.
CPU_ENCODE_BATCH, GPU_ENCODE_BATCH = 16, 64


def encode_batch_size(cfg: Any) -> int:
    """The batch of the recipe's corpus encodings and evaluations: ``eval_batch_size`` when set, else
    :data:`CPU_ENCODE_BATCH` on a CPU and :data:`GPU_ENCODE_BATCH` on a CUDA GPU."""
    given = getattr(cfg, "eval_batch_size", None)
    return given if given is not None else CPU_ENCODE_BATCH if no_gpu() else GPU_ENCODE_BATCH


def gpu_bf16() -> bool:
    """Whether the stages train under bf16 by default: on a CUDA GPU with native bf16 kernels (Ampere and later,
    :func:`~hf_cocodr.utils.native_bf16`); a CPU keeps fp32 (the distillation's own default also covers CPUs with
    AMX / AVX-512 BF16)."""
    return not no_gpu() and native_bf16()


def gpu_bf16_default(options: dict[str, Any]) -> dict[str, Any]:
    """``{"bf16": True}`` where a stage with the training ``options`` trains under bf16 without being told
    (:func:`gpu_bf16`, and its options set neither ``bf16`` nor ``fp16``); ``{}`` otherwise."""
    return {"bf16": True} if gpu_bf16() and "bf16" not in options and not options.get("fp16") else {}


def device_record() -> dict[str, Any]:
    """The device the stages train on, for ``recipe.json``: ``{"type": "cuda", "name", "memory_gib"}`` or
    ``{"type": "cpu"}``."""
    memory = gpu_memory_gib()
    if memory is None:
        return {"type": "cpu"}
    import torch

    return {"type": "cuda", "name": torch.cuda.get_device_name(), "memory_gib": round(memory, 1)}


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, int if hint is int else int | float) and not isinstance(value, bool)
    if hint in (str, list, dict) or origin in (list, dict):
        return isinstance(value, origin or hint)
    return True  # enums, callables, ...: left to the class


def check_training_arguments(option_name: str, sub: Any, cls: type) -> None:
    """A stage's mapping of training arguments (``coco: {...}`` in a ``--config``): known fields of ``cls``, values
    of their types, and ``cls``'s own range checks (run by building it), before any model is loaded."""
    if not isinstance(sub, dict):
        raise ConfigError(f"recipe option {option_name!r} must be a mapping of training arguments, got {sub!r}")
    if "max_steps" in sub:
        raise ConfigError(
            f"recipe option {option_name}.max_steps: the recipe sets each stage's steps; use {option_name}_steps "
            "instead"
        )
    hints = typing.get_type_hints(cls)
    unknown = sorted(k for k in sub if k not in hints)
    if unknown:
        raise ConfigError(f"recipe option {option_name}: unknown field(s) {unknown}, not {cls.__name__} fields")
    for key, value in sub.items():
        if not _fits(value, hints[key]):
            expected = getattr(hints[key], "__name__", str(hints[key]))
            raise ConfigError(f"recipe option {option_name}.{key} must be of type {expected}, got {value!r}")
    try:
        # on the device the stage will use (bf16 on a CPU is refused unless use_cpu is set)
        built = cls(**{"output_dir": "unused", "report_to": "none", "use_cpu": no_gpu(), **sub, "max_steps": 1})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"recipe option {option_name}: {' '.join(str(e).split())}") from None
    try:  # values the class takes but training cannot use (a batch of 0, a scheduler's unknown option)
        check_training_values(built, f"recipe option {option_name}")
    except ValueError as e:
        raise ConfigError(str(e)) from None
