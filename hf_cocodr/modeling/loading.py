"""Loading encoders as SentenceTransformers, with the COCO-DR convention (CLS pooling, dot product) for raw checkpoints."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..storage import model_weight_bytes
from ..utils import is_hub_id

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
