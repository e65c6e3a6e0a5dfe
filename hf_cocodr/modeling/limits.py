"""The model's position limit, and the one rule every token-length setting follows against it.

The rule: a length longer than the positions the model has (``max_position_embeddings``, less the offset some
architectures reserve) is refused with one line naming the setting, the value, the model and its limit, before any
model is loaded; a length up to the limit is used as given. Nothing is clamped in silence.

The limit is read from the checkpoint's ``config.json`` (of the Transformer module of a sentence-transformers folder)
without loading weights, or from the config of a model already in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# Architectures whose learned position table starts after ``pad_token_id + 1`` reserved rows (fairseq's convention):
# a RoBERTa with ``max_position_embeddings=514`` encodes at most 512 tokens.
PADDING_OFFSET_TYPES = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "roberta-prelayernorm",
        "data2vec-text",
        "longformer",
        "ibert",
        "mpnet",
        "luke",
        "markuplm",
    }
)


def limit_from_config(config: Mapping[str, Any]) -> int | None:
    """Tokens a model with this ``config.json`` content can encode at once (None when the config names no limit)."""
    n = config.get("max_position_embeddings", config.get("n_positions"))
    if (not isinstance(n, int) or isinstance(n, bool) or n <= 0) and isinstance(config.get("text_config"), Mapping):
        return limit_from_config(config["text_config"])
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    if config.get("model_type") in PADDING_OFFSET_TYPES:
        pad = config.get("pad_token_id")
        n -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    return n if n > 0 else None


def _transformer_subfolder(modules: Path) -> str:
    """The folder of the Transformer module named in a sentence-transformers ``modules.json`` ("" for the root)."""
    try:
        entries = json.loads(modules.read_text())
    except (OSError, ValueError):
        return ""
    for m in entries if isinstance(entries, list) else []:
        if isinstance(m, dict) and str(m.get("type", "")).endswith("Transformer"):
            return str(m.get("path", "") or "")
    return ""


def _config_file(source: str, revision: str | None = None) -> Path | None:
    """``config.json`` of a local folder, or of a Hub repository in the local cache (nothing is downloaded)."""
    local = Path(source).expanduser()
    if local.is_dir():
        sub = _transformer_subfolder(local / "modules.json") if (local / "modules.json").is_file() else ""
        for folder in (local / sub, local):
            if (folder / "config.json").is_file():
                return folder / "config.json"
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    try:
        modules = try_to_load_from_cache(source, "modules.json", revision=revision)
        sub = _transformer_subfolder(Path(modules)) if isinstance(modules, str) else ""
        for name in ([f"{sub}/config.json"] if sub else []) + ["config.json"]:
            cached = try_to_load_from_cache(source, name, revision=revision)
            if isinstance(cached, str):
                return Path(cached)
    except (ValueError, OSError):  # not a valid repo id: check_model_source says so
        return None
    return None


def _configs_of(model: Any) -> list[Mapping[str, Any]]:
    """The configs (as mappings) a model in memory carries: of a SentenceTransformer's Transformer module, a
    transformers model or config, a CondenserForPretraining's backbone."""
    found = []
    inner = None
    try:
        first = model[0]
        inner = getattr(first, "auto_model", None) or getattr(first, "model", None)
    except (TypeError, IndexError, KeyError, NotImplementedError):
        pass
    for candidate in (model, getattr(model, "lm", None), inner):
        config = getattr(candidate, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            found.append(config.to_dict())
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        found.append(model.to_dict())
    return [c for c in found if isinstance(c, Mapping)]


def position_limit(model: Any, *, revision: str | None = None) -> int | None:
    """The most tokens ``model`` can encode at once: its ``max_position_embeddings`` less the positions its
    architecture reserves (RoBERTa-style models: ``pad_token_id + 1``). ``model`` is a folder or Hub id (only
    ``config.json`` is read; a Hub repository only from the local cache) or a model in memory. None when it cannot
    be told (no config, or a config without a position limit)."""
    if isinstance(model, (str, os.PathLike)):
        path = _config_file(str(model), revision)
        if path is None:
            return None
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return limit_from_config(config) if isinstance(config, dict) else None
    return next((n for n in map(limit_from_config, _configs_of(model)) if n is not None), None)


def _model_name(model: Any) -> str:
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    names = [c.get("_name_or_path") for c in _configs_of(model)]
    return str(next((n for n in names if n), type(model).__name__))


def check_lengths(model: Any, lengths: Mapping[str, Any], *, revision: str | None = None) -> None:
    """Refuse a token length the model cannot encode, before the model is loaded.

    ``lengths`` maps a setting's name as the user wrote it (``"--doc-max-length"``, ``"max_length"``, ...) to its
    value; None values are not set and skipped. Each value must be a whole number >= 1 and at most
    :func:`position_limit` of ``model`` (not checked against the limit when it cannot be told).

    Raises:
        ConfigError: one line naming the setting, the value, the model and its limit.
    """
    given = {k: v for k, v in lengths.items() if v is not None}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a whole number of tokens >= 1, got {value!r}")
    if not given:
        return
    limit = position_limit(model, revision=revision)
    if limit is None:
        return
    for name, value in given.items():
        if value > limit:
            raise ConfigError(
                f"{name} {value} is longer than the {limit} token positions of the model "
                f"{_model_name(model)} (its position limit); give at most {limit}"
            )
