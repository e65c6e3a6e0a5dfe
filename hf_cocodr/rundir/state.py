"""Trainer-side state saved next to checkpoints: safetensors for arrays, JSON for the rest (never pickle)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..utils import atomic_write_json, honour_umask

STATE_TENSORS = "hf_cocodr_state.safetensors"
STATE_JSON = "hf_cocodr_state.json"


def save_state(directory: str | os.PathLike, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, v in tensors.items():
        t = torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v.detach().cpu()
        out[k] = t.contiguous()
    tmp = directory / f".{STATE_TENSORS}.tmp"
    save_file(out, str(tmp))
    honour_umask(tmp)  # safetensors writes 0600
    os.replace(tmp, directory / STATE_TENSORS)
    atomic_write_json(directory / STATE_JSON, meta)


def load_state(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / STATE_JSON).is_file():
        return None
    tensors = load_file(str(directory / STATE_TENSORS)) if (directory / STATE_TENSORS).is_file() else {}
    return tensors, json.loads((directory / STATE_JSON).read_text())
