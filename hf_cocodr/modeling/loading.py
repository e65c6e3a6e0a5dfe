"""Loading encoders as SentenceTransformers, with the COCO-DR convention (CLS pooling, dot product) for raw checkpoints."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..rundir.run_record import PROVENANCE_FILE, model_fingerprint
from ..storage import cache_dir, model_weight_bytes, staged_directory
from ..utils import atomic_write_json, is_hub_id

logger = logging.getLogger(__name__)

COCODR_POOLING = "cls"
COCODR_SIMILARITY = "dot"


def is_sentence_transformers_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "modules.json").is_file()


def _hub_has_modules_json(repo_id: str, revision: str | None, token: str | bool | None) -> bool:
    """Whether a Hub repo is a sentence-transformers repo (has ``modules.json``)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(repo_id, "modules.json", revision=revision, token=token)
        return True
    except EntryNotFoundError:
        return False


def check_model_source(path: str | os.PathLike, *, revision: str | None = None) -> bool:
    """Check a model argument before anything is loaded; True for a local directory, False for a Hub id.

    Raises:
        FileNotFoundError: one line: a file instead of a folder, a folder without ``modules.json`` / ``config.json``,
            a folder without a weights file (``model.safetensors``, ``pytorch_model.bin`` or their shards, at its top
            or in a module's folder), neither a folder nor a Hub id, or (offline, ``HF_HUB_OFFLINE=1``) a Hub id that
            is not in the cache.
    """
    name = str(path)
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir():
            raise FileNotFoundError(f"{local} is a file; expected a model directory.")
        if not is_sentence_transformers_dir(local) and not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"{local} is neither a sentence-transformers directory (modules.json) nor a transformers checkpoint "
                "(config.json)."
            )
        if not model_weight_bytes(local):
            raise FileNotFoundError(
                f"{local} holds no weights: no model.safetensors, pytorch_model.bin or shards of them (at its top or in "
                "a module's folder); copy the model's weight files there, or pass the folder that has them."
            )
        return True
    from huggingface_hub import constants, try_to_load_from_cache

    if not is_hub_id(name):
        raise FileNotFoundError(f"model {name!r} not found: no such directory, and it is not a Hub id (org/name).")
    if constants.is_offline_mode() and not any(
        isinstance(try_to_load_from_cache(name, f, revision=revision), str) for f in ("modules.json", "config.json")
    ):
        raise FileNotFoundError(
            f"model {name!r} is not a local folder and is not in the Hugging Face cache (offline: HF_HUB_OFFLINE=1); "
            "download it once with network access, or pass a local folder."
        )
    return False


def build_sentence_transformer(
    transformer_path: str,
    *,
    pooling: str = COCODR_POOLING,
    similarity: str = COCODR_SIMILARITY,
    max_seq_length: int | None = None,
    query_length: int | None = None,
    document_length: int | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    token: str | bool | None = None,
    device: str | None = None,
):
    """A SentenceTransformer made of ``Transformer(transformer_path)`` + ``Pooling(pooling)`` with the given similarity."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    model_kwargs = {"trust_remote_code": trust_remote_code}
    common = {"revision": revision, "token": token} if (revision or token) else {}
    transformer = Transformer(
        transformer_path,
        max_seq_length=max_seq_length,
        query_length=query_length,
        document_length=document_length,
        model_kwargs={**model_kwargs, **common},
        processor_kwargs={"trust_remote_code": trust_remote_code, **common},
        config_kwargs={"trust_remote_code": trust_remote_code, **common},
    )
    _zero_missing_pooler(transformer, transformer_path)
    pool = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    return SentenceTransformer(modules=[transformer, pool], similarity_fn_name=similarity, device=device)


def load_encoder(
    path: str | os.PathLike,
    *,
    pooling: str = COCODR_POOLING,
    similarity: str = COCODR_SIMILARITY,
    max_seq_length: int | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    token: str | bool | None = None,
    device: str | None = None,
):
    """Load any encoder as a :class:`~sentence_transformers.SentenceTransformer`.

    * A sentence-transformers directory or Hub repo (with ``modules.json``) loads as it is, with its own pooling
      and similarity.
    * A raw transformers checkpoint (no ``modules.json``, e.g. the published ``OpenMatch/cocodr-*`` BERT
      checkpoints) loads with **CLS pooling and dot-product similarity** (``pooling``/``similarity`` to change it),
      and a log line says so, instead of sentence-transformers' silent mean-pooling fallback.

    Args:
        path: a local directory or a Hub id.
        trust_remote_code: run custom modelling code from the checkpoint (off unless you ask).
    """
    from sentence_transformers import SentenceTransformer

    name = str(path)
    local = Path(name).expanduser()
    if check_model_source(name, revision=revision):
        if is_sentence_transformers_dir(local):
            return SentenceTransformer(str(local), trust_remote_code=trust_remote_code, device=device)
        is_st = False
    else:
        is_st = _hub_has_modules_json(name, revision, token)
        if is_st:
            return SentenceTransformer(
                name, trust_remote_code=trust_remote_code, revision=revision, token=token, device=device
            )
    convention = " (the COCO-DR convention)" if (pooling, similarity) == (COCODR_POOLING, COCODR_SIMILARITY) else ""
    logger.info(
        "%s has no modules.json: loading it as a raw transformers checkpoint with %s pooling and %s similarity%s, "
        "not sentence-transformers' mean-pooling fallback.",
        name,
        pooling.upper() if pooling == "cls" else pooling,
        similarity,
        convention,
    )
    return build_sentence_transformer(
        name,
        pooling=pooling,
        similarity=similarity,
        max_seq_length=max_seq_length,
        trust_remote_code=trust_remote_code,
        revision=revision,
        token=token,
        device=device,
    )


def _zero_missing_pooler(transformer, path: str) -> None:
    """Raw MLM checkpoints have no pooler weights, so transformers initialises the (unused) pooler at random.

    Zeroing it makes every load of the checkpoint identical (and the saved model deterministic); sentence-transformers
    pooling never reads it.
    """
    import torch

    from .condenser import _checkpoint_keys

    pooler = getattr(getattr(transformer, "model", None), "pooler", None)
    if pooler is None or not Path(path).is_dir():
        return
    keys = _checkpoint_keys(Path(path))
    if keys is not None and not any(k.split(".")[0] == "pooler" or ".pooler." in k for k in keys):
        with torch.no_grad():
            for p in pooler.parameters():
                p.zero_()


def pooling_mode(model) -> str | None:
    """The pooling mode of a SentenceTransformer (``"cls"``, ``"mean"``, ...), or None if it has no Pooling (an
    asymmetric model's: its document route's, :func:`~hf_cocodr.modeling.asymmetric.document_modules`)."""
    from .asymmetric import document_modules

    for module in document_modules(model):
        mode = getattr(module, "pooling_mode", None)
        if mode is not None:
            return mode if isinstance(mode, str) else "+".join(mode)
    return None


# ------------------------------------------------------------------------------------------- a model in memory
def _loaded_from(model) -> str | None:
    """The folder (or Hub id) a SentenceTransformer was loaded from: the folder of its (query route's) first module,
    the sentence-transformers folder above a module folder; None when it names none."""
    from .asymmetric import is_asymmetric, query_modules

    try:
        first = (query_modules(model) if is_asymmetric(model) else list(model))[0]
        ref = str(first.auto_model.config._name_or_path or "")
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    if not ref:
        return None
    path = Path(ref).expanduser()
    if path.is_dir() and not is_sentence_transformers_dir(path) and is_sentence_transformers_dir(path.parent):
        return str(path.parent)  # a module folder (0_Transformer) of a sentence-transformers folder
    return ref


def computation_signature(model) -> str:
    """What a SentenceTransformer computes, as one hash: its modules (their configuration), lengths, similarity,
    prompts and weights (names, shapes, dtypes, bytes)."""
    parts = [
        repr(model),
        getattr(model, "max_seq_length", None),
        str(getattr(model, "similarity_fn_name", None)),
        getattr(model, "prompts", None),
        getattr(model, "default_prompt_name", None),
        model_fingerprint(model)["weights_sha256"],
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def model_source(model) -> Any:
    """What a model argument runs as, for the code that reads a model by its folder: a path or Hub id as given; a
    loaded ``SentenceTransformer`` as the folder (or Hub id) it was loaded from, when that still loads to the same
    computation (:func:`computation_signature`), so that it gives the same result and the same provenance as the
    folder; else (trained or changed in memory, or built there) as a folder it is saved into once in the cache,
    keyed by that signature, whose provenance records it as a model held in memory: its weights' fingerprint and
    ``model_card_data.base_model`` (the Hub model it is known to come from). Any other object is returned as it is."""
    if model is None or isinstance(model, (str, os.PathLike)) or not _is_sentence_transformer(model):
        return model
    signature = computation_signature(model)
    known = _SOURCES.get(signature)
    if known is not None and Path(known).expanduser().exists():
        return known
    ref = _loaded_from(model)
    if ref is not None and (Path(ref).expanduser().is_dir() or is_hub_id(ref)):
        try:
            same = computation_signature(load_encoder(ref, device="cpu")) == signature
        except (OSError, ValueError):  # the folder is gone or no longer a model
            same = False
        if same:
            _SOURCES[signature] = ref
            return ref
    _SOURCES[signature] = str(_save_in_cache(model, signature, ref))
    return _SOURCES[signature]


_SOURCES: dict[str, str] = {}  # computation signature -> what the model runs as (within one process)


def _is_sentence_transformer(model) -> bool:
    return any(c.__name__ == "SentenceTransformer" for c in type(model).__mro__)


def _save_in_cache(model, signature: str, ref: str | None) -> Path:
    """``model`` saved once as ``$HF_COCODR_CACHE/models/<signature>`` (staged, renamed into place), with the
    provenance of a model held in memory."""
    dest = cache_dir("models") / signature
    if (dest / PROVENANCE_FILE).is_file():
        return dest
    base = getattr(getattr(model, "model_card_data", None), "base_model", None)
    base = base if is_hub_id(base) else ref if is_hub_id(ref) else None
    provenance = {
        "format": 1,
        **({"base_model": base} if base else {}),
        "base_model_source": {
            "in_memory": True,
            "weights_sha256": model_fingerprint(model)["weights_sha256"],
            "computation_signature": signature,
            "loaded_from": ref,
        },
    }
    with staged_directory(dest) as tmp:
        model.save(str(tmp))
        atomic_write_json(tmp / PROVENANCE_FILE, provenance)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / PROVENANCE_FILE).is_file():
                raise
    logger.info(
        "a model held in memory (weights %s) saved as %s", provenance["base_model_source"]["weights_sha256"], dest
    )
    return dest
