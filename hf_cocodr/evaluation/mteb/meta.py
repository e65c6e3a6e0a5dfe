"""The ``mteb.ModelMeta`` of a model directory, as an mteb model-implementation PR would declare it.

A model mteb already knows (or its adaptation) starts from mteb's registered meta; any other starts from mteb's own
``ModelMeta.from_sentence_transformer_model``. Both are completed from the loaded model (pooling, similarity, sizes),
the provenance record (:mod:`hf_cocodr.provenance`: training data, base model) and the model card (license).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...citations import CITATIONS
from ...modeling.asymmetric import document_modules, is_asymmetric, query_modules
from ...modeling.loading import is_sentence_transformers_dir, load_encoder, pooling_mode
from ...provenance import is_cocodr_model, is_hub_model_id, read_card, read_provenance, resolve_hub_id
from ...utils import import_mteb
from .common import (
    DEFAULT_LANGUAGES,
    TRAINING_CODE_URL,
    check_model_name,
    check_revision,
    mteb_dataset_name,
    warnings_quiet,
)
from .model import _sentence_transformers_loader, cocodr_sentence_transformer_loader


def _similarity_name(model) -> str:
    name = getattr(model, "similarity_fn_name", None) or "cosine"
    return str(getattr(name, "value", name))


def model_revision(model) -> str:
    """A content hash of what a SentenceTransformer computes: its weights, pooling, similarity and lengths.

    Used as the results revision when none is given (for an unpublished model there is no Hub commit yet).
    """
    import torch  # heavy: only a model in hand needs it

    h = hashlib.sha256()
    desc = [pooling_mode(model), str(_similarity_name(model)), getattr(model, "max_seq_length", None)]
    h.update(json.dumps(desc, default=str).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode() + b"\0")
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    tok = getattr(model, "tokenizer", None)
    vocab = getattr(tok, "get_vocab", None)
    if callable(vocab):
        h.update(json.dumps(sorted(vocab().items())).encode())
    return h.hexdigest()[:40]


def read_training_info(model_dir: str | os.PathLike | None) -> dict[str, Any]:
    """The provenance record of a model directory (``hf_cocodr_provenance.json``, or the older
    ``hf_cocodr_training.json``; ``{}`` when absent or unreadable)."""
    return read_provenance(model_dir)


def declared_training_datasets(info: dict[str, Any]) -> set[str]:
    """Every data set a model saw, from its training info: COCO corpora, the corpora the distillation ranked
    (pseudo-queries drawn from them included), the target queries it trained on, fine-tuning sources and
    ``datasets``.

    COCO pretraining reads the target corpora (documents only) and counts as training on them: MTEB uses this to mark
    results on those tasks as not zero-shot. Names are mapped to MTEB task names where MTEB has the data set.
    """
    specs: list[str] = []
    for stage in info.get("stages") or []:
        if not isinstance(stage, dict):
            continue
        specs += [str(c) for c in stage.get("corpora") or []]  # (COCO's, the distillation's: pseudo-queries too)
        specs += [str(q) for q in stage.get("target queries") or []]  # the queries a stage trained on
        if stage.get("source_data"):
            specs.append(str(stage["source_data"]))
    specs += [str(d) for d in info.get("datasets") or []]
    return {mteb_dataset_name(s) for s in specs if str(s).strip()}


def _release_date(model_dir: Path | None) -> str:
    """The date of the newest weight file (the day the model was written), else today.

    Not mteb's ``ModelMeta.fetch_release_date``: it asks the Hub for the first commit of a published model.
    """
    stamps = []
    if model_dir is not None:
        stamps = [p.stat().st_mtime for pat in ("*.safetensors", "*.bin") for p in model_dir.glob(pat)]
    ts = max(stamps) if stamps else datetime.datetime.now().timestamp()
    return datetime.date.fromtimestamp(ts).isoformat()


def _hub_id(value: Any) -> str | None:
    """``value`` when it looks like a Hub model id (``org/name``) rather than a local path, else None."""
    return value if is_hub_model_id(value) else None


def _registry_meta(name: str | None):
    """mteb's registered ``ModelMeta`` of ``name`` (offline: mteb's own registry), else None."""
    if not name:
        return None
    try:
        mteb = import_mteb()  # heavy: imported on first use only
        from mteb.models.get_model_meta import MODEL_REGISTRY

        if name not in MODEL_REGISTRY:
            return None
        with warnings_quiet():
            return mteb.get_model_meta(name, fetch_from_hf=False)
    except Exception:  # an mteb without this registry layout: treat the model as unknown
        return None


def _embedding_parameters(modules) -> int | None:
    """The input-embedding parameters of the transformers models among ``modules`` (each counted once)."""
    seen, total = set(), 0
    for module in modules:
        with contextlib.suppress(Exception):
            weight = module.auto_model.get_input_embeddings().weight
            if id(weight) not in seen:
                seen.add(id(weight))
                total += int(weight.numel())
    return total or None


def _measure(model) -> dict[str, Any]:
    """What the loaded model itself says: sizes, pooling, similarity, lengths and prompts. An asymmetric (Router)
    model counts both routes in ``n_parameters`` and ``n_embedding_parameters`` and its query route as active
    (``n_active_parameters``: the query route's parameters less its embeddings, mteb's rule for the active
    parameters applied to the route a query runs through), as mteb registers its ``router`` models."""
    params = list(model.parameters())
    router = is_asymmetric(model)
    routes = [*query_modules(model), *document_modules(model)] if router else list(model)
    n_embedding = _embedding_parameters(routes)
    active = None
    if router:
        query = {id(p): p for m in query_modules(model) for p in m.parameters()}
        active = sum(p.numel() for p in query.values()) - (_embedding_parameters(query_modules(model)) or 0)
    return {
        "model_type": ["router"] if router else ["dense"],
        "n_active_parameters": active,
        "n_parameters": int(sum(p.numel() for p in params)),
        "memory_usage_mb": round(sum(p.numel() * p.element_size() for p in params) / 2**20, 1),
        "n_embedding_parameters": n_embedding,
        "pooling": pooling_mode(model) or "unknown",
        "similarity": _similarity_name(model),
        "max_tokens": model.max_seq_length,
        "embed_dim": int(model.get_embedding_dimension()),
        "prompts": {k: v for k, v in (getattr(model, "prompts", None) or {}).items() if v},
    }


def _base_model(
    path: Path | None, model_name: str, adapted_from: str | None, info: dict[str, Any], card: dict[str, Any]
) -> str | None:
    """The Hub model this one was adapted from: given, recorded in the provenance or the card, or (for an untrained
    local copy of a Hub model) the Hub id the folder resolves to; None when it is the model itself."""
    base = adapted_from or _hub_id(info.get("base_model")) or _hub_id(card.get("base_model"))
    if base is None and path is not None and not info.get("stages"):  # a local copy of a Hub model keeps its origin
        base = _hub_id(resolve_hub_id(path)[0])
    return None if base == model_name else base


def _known_model_fields(
    known,
    changed: dict[str, Any],
    facts: dict[str, Any],
    path: Path | None,
    *,
    trained: bool,
    ours: set[str] | None,
    opts: dict[str, Any],
) -> dict[str, Any]:
    """The registry's meta of a known model with only what adaptation changed replaced."""
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.model_meta import ScoringFunction  # heavy: imported on first use only

    fields = dict(known)
    fields.update(changed)
    if trained or opts["release_date"]:
        fields["release_date"] = opts["release_date"] or _release_date(path)
    if ours is not None or known.training_datasets is not None:
        fields["training_datasets"] = set(known.training_datasets or set()) | (ours or set())
    measured = {
        "similarity_fn_name": ScoringFunction(facts["similarity"]),
        "max_tokens": facts["max_tokens"],
        "embed_dim": facts["embed_dim"],
        "n_parameters": facts["n_parameters"],
    }
    fields.update({k: v for k, v in measured.items() if fields.get(k) != v})
    if fields["n_parameters"] != known.n_parameters:
        fields.update(memory_usage_mb=facts["memory_usage_mb"], n_embedding_parameters=facts["n_embedding_parameters"])
    if changed["model_type"] == ["dense"] and known.model_type != ["dense"]:
        fields["model_type"] = list(known.model_type)  # (a known model of another kind keeps it)
    if changed["n_active_parameters_override"] is None and fields["n_parameters"] == known.n_parameters:
        fields["n_active_parameters_override"] = known.n_active_parameters_override
    if tuple(opts["languages"]) != tuple(DEFAULT_LANGUAGES):
        fields["languages"] = list(opts["languages"])
    if opts["license"]:
        fields["license"] = opts["license"]
    if trained and opts["public_training_code"]:
        fields["public_training_code"] = opts["public_training_code"]
    if opts["public_training_data"] is not None:
        fields["public_training_data"] = opts["public_training_data"]
    if known.name != changed["name"]:
        fields["reference"] = opts["reference"] or f"https://huggingface.co/{changed['name']}"
    elif opts["reference"]:
        fields["reference"] = opts["reference"]
    if opts["citation"] is not None:
        fields["citation"] = opts["citation"]
    if opts["contacts"]:
        fields["contacts"] = list(opts["contacts"])
    if path is not None and any(path.glob("*.safetensors")) and "safetensors" not in fields["framework"]:
        fields["framework"] = [*fields["framework"], "safetensors"]
    return fields


def _new_model_fields(
    model,
    changed: dict[str, Any],
    facts: dict[str, Any],
    path: Path | None,
    *,
    ours: set[str] | None,
    card: dict[str, Any],
    opts: dict[str, Any],
) -> dict[str, Any]:
    """mteb's own ``ModelMeta.from_sentence_transformer_model`` (no Hub access), completed from the model, the
    directory and the card."""
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.model_meta import ModelMeta, ScoringFunction  # heavy: imported on first use only

    with warnings_quiet():  # fill_missing=None: its default (False) only raises a deprecation warning
        meta = ModelMeta.from_sentence_transformer_model(
            model, revision=changed["revision"], fill_missing=None, fetch_from_hf=False
        )
    framework = list(dict.fromkeys([*meta.framework, "Sentence Transformers", "PyTorch"]))
    if path is not None and any(path.glob("*.safetensors")):
        framework.append("safetensors")
    fields = dict(meta)
    fields.update(
        changed,
        release_date=opts["release_date"] or _release_date(path),
        languages=list(opts["languages"]),
        n_parameters=facts["n_parameters"],
        n_embedding_parameters=facts["n_embedding_parameters"]
        if facts["n_embedding_parameters"] is not None
        else meta.n_embedding_parameters,
        memory_usage_mb=facts["memory_usage_mb"],
        max_tokens=facts["max_tokens"],
        embed_dim=facts["embed_dim"],
        license=opts["license"] or card.get("license") or "apache-2.0",
        open_weights=True,
        public_training_code=opts["public_training_code"],
        public_training_data=opts["public_training_data"],
        framework=framework,
        reference=opts["reference"] or f"https://huggingface.co/{changed['name']}",
        similarity_fn_name=ScoringFunction(facts["similarity"]),
        use_instructions=bool(facts["prompts"]),
        training_datasets=ours,
        modalities=["text"],
        citation=opts["citation"],
        contacts=list(opts["contacts"]) if opts["contacts"] else None,
    )
    return fields


def _checked_and_loaded(model_name: str, model_dir, model, revision: str | None):
    """:func:`model_meta_for`'s model name checked, its directory, its model (loaded from the directory when not
    given) and its revision (checked, or the weights' content hash)."""
    model_name = check_model_name(model_name)
    path = Path(model_dir).expanduser() if model_dir is not None else None
    if path is not None and not path.is_dir():
        raise FileNotFoundError(f"model directory {path} not found.")
    if model is None:
        if path is None:
            raise ValueError("model_meta_for needs a model directory or a loaded model.")
        model = load_encoder(path)
    revision = check_revision(revision) if revision is not None else model_revision(model)
    return model_name, path, model, revision


def _meta_fields(
    model,
    path: Path | None,
    model_name: str,
    revision: str,
    adapted_from: str | None,
    training_datasets: Iterable[str] | None,
    raw_checkpoint: bool | None,
    opts: dict[str, Any],
) -> dict[str, Any]:
    """The fields of :func:`model_meta_for`'s ``ModelMeta``: read from the provenance, the card and the model, on top
    of the registry's meta of a known model or of mteb's own meta of a new one."""
    info = read_training_info(path)
    card = read_card(path)[0] if path is not None else {}
    trained = bool(info.get("stages"))
    base = _base_model(path, model_name, adapted_from, info, card)
    known = _registry_meta(model_name) or (_registry_meta(base) if base else None)
    # Training data: none declared and no provenance is unknown (None), not "none" (an empty set).
    ours = None
    if trained or info.get("datasets") or training_datasets is not None:
        ours = declared_training_datasets(info) | {mteb_dataset_name(d) for d in training_datasets or []}
    facts = _measure(model)
    if raw_checkpoint is None:
        raw_checkpoint = path is not None and not is_sentence_transformers_dir(path)
    citation = opts["citation"]
    if citation is None and is_cocodr_model({**info, "base_model": base or info.get("base_model")}):
        citation = CITATIONS["cocodr"]["bibtex"]
        if known is not None and known.citation:
            citation = f"{citation}\n\n{known.citation.strip()}"
    opts = {**opts, "citation": citation}
    changed = {
        "name": model_name,
        "revision": revision,
        "loader": cocodr_sentence_transformer_loader if raw_checkpoint else _sentence_transformers_loader(),
        "loader_kwargs": {"pooling_mode": facts["pooling"], "similarity_fn_name": facts["similarity"]}
        if raw_checkpoint
        else {},
        "adapted_from": base,
        "model_type": facts["model_type"],
        "n_active_parameters_override": facts["n_active_parameters"],
    }
    if known is not None:
        return _known_model_fields(known, changed, facts, path, trained=trained, ours=ours, opts=opts)
    return _new_model_fields(model, changed, facts, path, ours=ours, card=card, opts=opts)


def model_meta_for(
    model_dir: str | os.PathLike | None,
    model_name: str,
    revision: str | None = None,
    *,
    model=None,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    license: str | None = None,
    release_date: str | None = None,
    training_datasets: Iterable[str] | None = None,
    adapted_from: str | None = None,
    public_training_code: str | None = TRAINING_CODE_URL,
    public_training_data: str | bool | None = None,
    reference: str | None = None,
    contacts: Sequence[str] | None = None,
    citation: str | None = None,
    raw_checkpoint: bool | None = None,
):
    """The ``mteb.ModelMeta`` of a model directory, as an mteb model-implementation PR would declare it.

    For a model mteb already knows (``model_name`` itself, or the base model it was adapted from, e.g.
    ``sentence-transformers/all-MiniLM-L6-v2``; ``mteb.get_model_meta`` reads mteb's registry offline), the registry's
    meta is the starting point and only what adaptation changed is replaced: name, revision, loader, the training data
    added by hf_cocodr's stages, the release date of this model (when a stage trained it), ``adapted_from``, and the
    pooling / similarity / sizes when the exported model differs. Other models get mteb's own
    ``ModelMeta.from_sentence_transformer_model`` (no Hub access), completed from the model and the directory.

    Read from the model: pooling and similarity, ``n_parameters``, ``n_embedding_parameters``, ``embed_dim``,
    ``max_tokens`` and ``memory_usage_mb``; from ``hf_cocodr_provenance.json``: the training data sets (COCO corpora,
    fine-tuning source, ``datasets``) and the base model (``adapted_from``; for a local copy of a Hub model, the Hub
    id it was resolved to); from the card's front matter (read by ``huggingface_hub``): the license. The COCO-DR
    citation is set only for COCO-DR models (a COCO stage ran, or the base is a COCO-DR checkpoint). A
    sentence-transformers directory gets mteb's ``SentenceTransformerEncoderWrapper`` as loader; a raw checkpoint gets
    :func:`cocodr_sentence_transformer_loader` with its pooling and similarity.

    Args:
        model_dir: the model directory (``None`` when only ``model`` is given).
        model_name: the published name, ``ORG/NAME``.
        revision: the Hub commit SHA of the published model (default: a content hash of the weights).
        model: the already loaded SentenceTransformer (default: loaded from ``model_dir``).
        languages: ISO 639-3 + script codes the model is meant for (a known model keeps its own unless these differ
            from the default).
        license: default: the known model's or the card's license, else ``apache-2.0`` (the hf_cocodr card's default).
        release_date: ``YYYY-MM-DD`` (default: the date of the weight files; a known model that no stage trained keeps
            its own).
        training_datasets: extra data sets to declare, on top of those read from the provenance. Without either (and
            no known base), ``training_datasets`` is ``None``: unknown to MTEB, whose zero-shot status is then unknown.
        adapted_from: the base model (default: ``base_model`` from the provenance or card, when a Hub id).
        raw_checkpoint: whether the published model lacks ``modules.json`` (so its loader must set CLS pooling);
            default: read from ``model_dir``, else False.

    Returns:
        A validated ``mteb.models.ModelMeta``.

    Raises:
        ValueError: bad model name, revision, language code or license.
        FileNotFoundError: ``model_dir`` is not a model directory.
    """
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.model_meta import ModelMeta  # heavy: imported on first use only

    model_name, path, model, revision = _checked_and_loaded(model_name, model_dir, model, revision)
    opts = {
        "languages": languages,
        "license": license,
        "release_date": release_date,
        "reference": reference,
        "public_training_code": public_training_code,
        "public_training_data": public_training_data,
        "citation": citation,
        "contacts": contacts,
    }
    fields = _meta_fields(model, path, model_name, revision, adapted_from, training_datasets, raw_checkpoint, opts)
    return ModelMeta(**fields)
