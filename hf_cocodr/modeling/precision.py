"""Encoding precision for evaluation and negative mining: fp32 (exact), bf16 (autocast) or int8 (dynamic).

* ``fp32``: the model as it is; nothing changes (bit-identical to not asking).
* ``bf16``: the forward pass under ``torch.autocast`` in bfloat16; embeddings come back as float32. Fast only on
  hardware with native bf16 (:func:`hf_cocodr.utils.native_bf16`); elsewhere it is slower than fp32.
* ``int8``: a copy of the model whose ``nn.Linear`` layers use torch's dynamic int8 quantization (int8 weights,
  activations quantized per batch; CPU only). The model being trained is never changed.

Whether a precision keeps retrieval quality is measured, not assumed: ``scripts/benchmarks/bench_precision.py`` reports
nDCG@10 and speed of each on SciFact.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator

from ..errors import ConfigError

ENCODE_PRECISIONS = ("fp32", "bf16", "int8")


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
