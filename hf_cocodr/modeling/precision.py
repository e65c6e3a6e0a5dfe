"""Encoding precision for evaluation and negative mining: fp32 (exact), bf16 (autocast) or int8 (dynamic).

* ``fp32``: the model as it is; nothing changes (bit-identical to not asking).
* ``bf16``: the forward pass under ``torch.autocast`` in bfloat16; embeddings come back as float32. Fast only on
  hardware with native bf16 (:func:`hf_cocodr.utils.native_bf16`); elsewhere it is slower than fp32.
* ``int8``: a copy of the model whose ``nn.Linear`` layers use torch's dynamic int8 quantization (int8 weights,
  activations quantized per batch; CPU only). The model being trained is never changed.

Whether a precision keeps retrieval quality is measured, not assumed: docs/precision.md gives each one's nDCG@10 and
speed, and the commands that measure them.

Corpus encodings of a whole run (the recipe's teacher, evaluations and hybrids) follow one precision, held by the
run's :class:`~hf_cocodr.retrieval.session.EncodingSession`: :func:`~hf_cocodr.retrieval.encoding.encode_texts`
encodes under it (:func:`encoding_autocast`) and the encoding cache keys by it. ``auto``
(:func:`resolve_corpus_precision`) is bf16 where the machine computes bf16 natively and fp32 elsewhere.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator

from ..errors import ConfigError
from ..utils import native_bf16

ENCODE_PRECISIONS = ("fp32", "bf16", "int8")
CORPUS_PRECISIONS = ("auto", "fp32", "bf16")  # what a run's corpus encodings may use (int8 loses nDCG@10)


def check_encode_precision(precision: str, flag: str = "encode_precision") -> str:
    if precision not in ENCODE_PRECISIONS:
        raise ConfigError(f"{flag} must be one of {', '.join(ENCODE_PRECISIONS)}, got {precision!r}")
    return precision


def int8_copy(model):
    """A copy of ``model`` with dynamically int8-quantized linear layers (on CPU)."""
    import torch

    device = getattr(model, "device", torch.device("cpu"))
    if torch.device(device).type != "cpu":
        raise ConfigError(
            f"encode_precision='int8' runs on CPU only (torch dynamic quantization); the model is on "
            f"{device}: use 'bf16' on GPUs"
        )
    with warnings.catch_warnings():  # torch marks eager-mode quantization as moving to torchao; it still works
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model).eval(), {torch.nn.Linear}, dtype=torch.qint8
        )


@contextlib.contextmanager
def encoding_precision(model, precision: str = "fp32") -> Iterator:
    """Yield the model to encode with in ``precision`` (see the module docstring)."""
    check_encode_precision(precision)
    if precision == "fp32":
        yield model
    elif precision == "bf16":
        import torch

        device = getattr(model, "device", torch.device("cpu"))
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            yield model
    else:
        yield int8_copy(model)


def resolve_corpus_precision(choice: str = "auto") -> tuple[str, str]:
    """``(precision, why)`` for a run's corpus encodings: ``auto`` is ``bf16`` where
    :func:`hf_cocodr.utils.native_bf16` is true (a CUDA card or a CPU with bf16 kernels; bf16 encoding kept nDCG@10
    on the dev splits, docs/precision.md) and ``fp32`` elsewhere, where bf16 runs a slow reference kernel."""
    choice = str(choice)
    if choice not in CORPUS_PRECISIONS:
        raise ConfigError(f"encode_precision must be one of {', '.join(CORPUS_PRECISIONS)}, got {choice!r}")
    if choice != "auto":
        return choice, "asked for"
    if native_bf16():
        return "bf16", "auto: the machine computes bf16 natively"
    return "fp32", "auto: no native bf16 on this machine (bf16 would run a slow reference kernel)"


@contextlib.contextmanager
def encoding_autocast(model, precision: str = "fp32") -> Iterator[None]:
    """bf16 autocast on ``model``'s device when ``precision`` (a run's corpus-encoding precision) is ``bf16`` and no
    autocast is on already; nothing otherwise."""
    import torch

    kind = torch.device(getattr(model, "device", "cpu")).type
    if precision != "bf16" or torch.is_autocast_enabled(kind):
        yield
        return
    with torch.autocast(kind, dtype=torch.bfloat16):
        yield
