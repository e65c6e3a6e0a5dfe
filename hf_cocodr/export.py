"""Export any encoder as a correct sentence-transformers directory (CLS pooling, dot product by default).

The directory is written to a temporary sibling and renamed into place, so a crash never leaves a half-written
model under the final name. Everything is staged beside the destination (same file system, never ``$TMPDIR``), is
removed when the export fails or is interrupted, and what a killed export left is swept by the next one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from .model_card import write_model_card
from .modeling.asymmetric import is_asymmetric
from .modeling.limits import check_lengths, position_limit
from .modeling.loading import (
    COCODR_POOLING,
    COCODR_SIMILARITY,
    build_sentence_transformer,
    is_sentence_transformers_dir,
    load_encoder,
    pooling_mode,
)
from .provenance import LEGACY_TRAINING_INFO_FILE, PROVENANCE_FILE, read_provenance, source_info, start_path
from .rundir.run_record import LOCK, RECORD, RunFolder, acquire_lock, fingerprint, note_written
from .storage import EXPORT_SPACE_FACTOR, carry_over, check_before_work, staged_directory
from .utils import (
    atomic_directory,
    atomic_write_json,
    check_not_precious,
    check_not_source,
    honour_umask,
    refuse_linked_destination,
)

logger = logging.getLogger(__name__)

POOLING_CHOICES = ("cls", "mean", "max", "lasttoken")
SIMILARITY_CHOICES = ("dot", "cosine")


def _transformer_module(model):
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    first = model[0]
    if is_asymmetric(model):
        raise ValueError(
            "the model is asymmetric (a sentence-transformers Router: a query route and a document route); export "
            "rebuilds one symmetric Transformer + Pooling model and would lose a route. Its folder is complete as "
            "SentenceTransformer.save wrote it: load, evaluate or push it as it is."
        )
    if not isinstance(first, Transformer):
        raise ValueError(f"the model's first module is {type(first).__name__}; export expects a Transformer module.")
    extra = [type(m).__name__ for m in list(model)[1:] if not isinstance(m, (Pooling, Normalize))]
    if extra:
        raise ValueError(
            f"the model has modules {extra} after the Transformer; export rebuilds Transformer + Pooling only and would "
            "drop them. Save the model with model.save(...) instead."
        )
    return first


def _as_sentence_transformer(
    model_or_path,
    max_seq_length,
    trust_remote_code: bool,
    pooling: str = COCODR_POOLING,
    similarity: str = COCODR_SIMILARITY,
):
    from sentence_transformers import SentenceTransformer

    if isinstance(model_or_path, SentenceTransformer):
        return model_or_path
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        PreTrainedModel = ()  # type: ignore[assignment]
    if isinstance(model_or_path, PreTrainedModel):
        raise TypeError(
            "pass a SentenceTransformer or a path; for a bare transformers model call model.save_pretrained(dir) and "
            "tokenizer.save_pretrained(dir) first and export the directory."
        )
    path = str(model_or_path)
    if Path(path).exists() and not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is a file; expected a model directory.")
    return load_encoder(
        path,
        max_seq_length=max_seq_length,
        trust_remote_code=trust_remote_code,
        pooling=pooling,
        similarity=similarity,
    )


def export_sentence_transformer(
    model_or_path,
    out_dir: str | os.PathLike,
    pooling: str = COCODR_POOLING,
    similarity: str = COCODR_SIMILARITY,
    max_seq_length: int | None = None,
    legacy_format: bool = False,
    *,
    query_length: int | None = None,
    document_length: int | None = None,
    card_data: dict[str, Any] | None = None,
    extra_files: dict[str, str | os.PathLike] | None = None,
    trust_remote_code: bool = False,
    preserve: list[str] | None = None,
    overwrite_output_dir: bool = False,
    run_record: bool = True,
):
    """Write a complete sentence-transformers directory: Transformer + Pooling, the similarity stored, a model card.

    Args:
        model_or_path: a ``SentenceTransformer``, a sentence-transformers directory, a raw transformers checkpoint
            directory, or a Hub id.
        out_dir: the target directory (replaced atomically if it exists).
        pooling: ``"cls"`` (COCO-DR), ``"mean"``, ``"max"`` or ``"lasttoken"``.
        similarity: ``"dot"`` (COCO-DR) or ``"cosine"``. No Normalize module is added.
        max_seq_length: token limit stored with the tokenizer (default: keep the source's).
        legacy_format: also make the directory loadable by sentence-transformers 5.x (its module layout).
        query_length / document_length: per-task token limits used by ``encode_query`` / ``encode_document``
            (sentence-transformers 6; not kept by ``legacy_format``).
        card_data: fields for the model card (see :mod:`hf_cocodr.model_card`).
        extra_files: ``{name_in_out_dir: source_path}`` copied into the directory (e.g. the Condenser head).
        preserve: names of entries of an existing ``out_dir`` to keep. Every entry of an existing folder that
            the export does not write itself is kept anyway (checkpoints, trainer state, files of the user): they are
            hard-linked into the new directory before the swap, so they survive even a crash mid-export.
        overwrite_output_dir: write into a folder that holds files hf_cocodr's export did not write (a fine-tune
            output, the user's files): the export replaces only the model files it writes and carries over the rest.
            Without it such a folder is refused before any work, as are a file, ``.``, its parents, home, ``/`` and
            the folder the model is read from. A folder an earlier export wrote is replaced without it.
        run_record: claim ``out_dir`` with an owner record and a lock (``hf_cocodr_run.json``, see
            :mod:`hf_cocodr.rundir.run_record`); off for exports a trainer makes into its own, already claimed folder.

    Returns:
        The exported ``SentenceTransformer`` (loaded from the written directory).
    """
    source = model_or_path if isinstance(model_or_path, (str, os.PathLike)) else None
    lengths = {"max_seq_length": max_seq_length, "query_length": query_length, "document_length": document_length}
    claim = _check_before_export(
        model_or_path,
        out_dir,
        source,
        pooling=pooling,
        similarity=similarity,
        lengths=lengths,
        legacy_format=legacy_format,
        overwrite_output_dir=overwrite_output_dir,
        run_record=run_record,
    )
    from sentence_transformers import SentenceTransformer

    src = _as_sentence_transformer(model_or_path, max_seq_length, trust_remote_code, pooling, similarity)
    transformer = _transformer_module(src)
    origin = str(source) if source is not None else start_path(src)
    card_data, extra_files = _carried_from_source(
        origin, transformer, pooling, similarity, max_seq_length, card_data, extra_files
    )
    out_dir = Path(out_dir)
    run = None
    with staged_directory(out_dir) as staging:
        model = _rebuild_in(staging, transformer, origin, pooling, similarity, lengths, trust_remote_code)
        if run_record:
            run = RunFolder.claim(out_dir, **claim)
        try:
            _write_export(model, out_dir, legacy_format, extra_files, preserve, card_data, pooling, similarity, run)
        finally:
            if run is not None:
                run.release()
    logger.info("exported %s pooling / %s similarity encoder to %s", pooling, similarity, out_dir)
    return SentenceTransformer(str(out_dir))


def _check_before_export(
    model_or_path,
    out_dir,
    source,
    *,
    pooling: str,
    similarity: str,
    lengths: dict[str, int | None],
    legacy_format: bool,
    overwrite_output_dir: bool,
    run_record: bool,
) -> dict[str, Any] | None:
    """What :func:`export_sentence_transformer` checks before any model is loaded: the choices, the token limits
    and the destination (with ``run_record``, claimed in a dry run and checked for room). Returns the arguments of
    the destination's :meth:`RunFolder.claim`, or ``None`` without ``run_record``."""
    if pooling not in POOLING_CHOICES:
        raise ValueError(f"pooling must be one of {POOLING_CHOICES}, got {pooling!r}")
    if similarity not in SIMILARITY_CHOICES:
        raise ValueError(f"similarity must be one of {SIMILARITY_CHOICES}, got {similarity!r}")
    check_lengths(model_or_path, lengths)
    refuse_linked_destination(out_dir)  # (the folder is replaced as a whole: never one a link points to)
    if not run_record:  # a trainer's export into the folder it claimed: the claim decided which entries are the user's
        check_not_precious(out_dir)
        check_not_source(out_dir, source)
        return None
    check_not_source(out_dir, source)
    identity = {
        "source": fingerprint(str(source)) if source is not None else type(model_or_path).__name__,
        "pooling": pooling,
        "similarity": similarity,
        "max_seq_length": lengths["max_seq_length"],
        "legacy_format": legacy_format,
    }
    claim = dict(command="export", identity=identity, overwrite=overwrite_output_dir, replaces_own=True)
    RunFolder.claim(out_dir, **claim, dry_run=True)
    # the destination's folder is where everything is staged: writable, with room for the model's weights
    check_before_work(out_dir, source, factor=EXPORT_SPACE_FACTOR, cache=False, staged_beside=True)
    return claim


def _carried_from_source(
    origin: str | None,
    transformer,
    pooling: str,
    similarity: str,
    max_seq_length: int | None,
    card_data: dict[str, Any] | None,
    extra_files: dict[str, str | os.PathLike] | None,
) -> tuple[dict[str, Any], dict[str, str | os.PathLike] | None]:
    """The card data (the source's provenance under the caller's ``card_data``) and the extra files (plus the
    source's evaluations, when they hold for the export) of an export from ``origin``."""
    inherited, same_encoding = _inherited_provenance(origin, pooling, similarity)
    card_data = {**inherited, **(card_data or {})}
    if same_encoding and max_seq_length in (None, transformer.max_seq_length):
        # the same weights, pooling and similarity: the source's evaluations hold for the export too
        for name in ("eval.json", "mteb_results"):
            if (Path(origin) / name).exists() and name not in (extra_files or {}):
                extra_files = {**(extra_files or {}), name: Path(origin) / name}
    return card_data, extra_files


def _rebuild_in(staging: Path, transformer, origin: str | None, pooling, similarity, lengths, trust_remote_code):
    """The exported model, built in ``staging`` from the source's Transformer module with the requested pooling,
    similarity and token limits (a limit not given keeps the source's)."""
    # Save the Transformer module alone, then rebuild with the requested pooling from those files: this keeps
    # the tokenizer (and its lower-casing) exactly as it was and works for any source layout.
    transformer.save(staging)
    query_length, document_length = lengths["query_length"], lengths["document_length"]
    model = build_sentence_transformer(
        staging,
        pooling=pooling,
        similarity=similarity,
        max_seq_length=lengths["max_seq_length"] or transformer.max_seq_length,
        query_length=query_length if query_length is not None else getattr(transformer, "query_length", None),
        document_length=(
            document_length if document_length is not None else getattr(transformer, "document_length", None)
        ),
        trust_remote_code=trust_remote_code,
    )
    if origin:  # the exported model comes from the source, not from the staging folder (never saved to disk)
        model[0].auto_model.config._name_or_path = origin
    return model


def _inherited_provenance(origin: str | None, pooling: str, similarity: str) -> tuple[dict[str, Any], bool]:
    """What an export carries over from its source's provenance (see :mod:`hf_cocodr.provenance`): stages, base model,
    data sets, ... — everything but what the export writes anew — and whether the source is an hf_cocodr model with
    the same pooling and similarity (then its scores hold for the export; otherwise they are not carried)."""
    info = source_info(origin)
    for key in ("settings", "versions", "format"):
        info.pop(key, None)
    old = read_provenance(origin).get("settings") or {} if origin and Path(origin).is_dir() else {}
    same = bool(old) and (old.get("pooling"), old.get("similarity")) == (pooling, similarity)
    if not same:
        info.pop("start_vs_adapted", None)
    return info, same


def _write_export(
    model, out_dir: Path, legacy_format, extra_files, preserve, card_data, pooling, similarity, run
) -> None:

    with atomic_directory(out_dir) as tmp:
        model.save(str(tmp))
        if legacy_format:
            write_legacy_layout(tmp, model)
        for name, source in (extra_files or {}).items():
            if Path(source).is_dir():
                shutil.copytree(source, tmp / name)
            else:
                shutil.copy2(source, tmp / name)
        honour_umask(tmp)  # before anything is carried over: only what this export wrote
        if run is not None:  # never replace a file no hf_cocodr run recorded as its own
            clash = sorted(({p.name for p in tmp.iterdir()} | {PROVENANCE_FILE}) & set(run.record["preexisting"]))
            if clash:
                raise FileExistsError(
                    f"{out_dir} holds {', '.join(clash)}, which hf_cocodr did not write; the "
                    "export would replace it: give a new folder"
                )
        # Everything of an existing model folder that this export does not write (checkpoints, trainer state,
        # the user's own files) is carried over by hard links, so replacing the folder never loses it.
        carried = set(preserve or [])
        if out_dir.is_dir():
            carried |= {p.name for p in out_dir.iterdir() if not (tmp / p.name).exists()}
        carried -= {PROVENANCE_FILE, LEGACY_TRAINING_INFO_FILE}  # the provenance of the model written now replaces it
        if run is not None:
            carried -= {LOCK, RECORD}
        for name in sorted(carried):
            old = out_dir / name
            if (tmp / name).exists():
                continue
            if old.exists() or old.is_symlink():
                carry_over(old, tmp / name)  # hard links (copies where the file system has none)

        write_model_card(tmp, model, card_data or {}, pooling=pooling, similarity=similarity, name=out_dir.name)
        if run is not None:  # the record lists what this export wrote; everything carried over is not its own
            written = {p.name for p in tmp.iterdir()} - carried
            run.record["preexisting"] = sorted(set(run.record["preexisting"]) | (carried - written))
            run.path, home = tmp, run.path
            run.save()
            run.path = home

            acquire_lock(tmp)  # the lock moves with the folder; released after the swap


def write_legacy_layout(directory: str | os.PathLike, model) -> None:
    """Rewrite a sentence-transformers 6 directory in the 5.x module layout (it still loads in 6.x)."""
    import sentence_transformers
    import torch
    import transformers

    directory = Path(directory)
    modules = json.loads((directory / "modules.json").read_text())
    legacy_types = {
        "Transformer": "sentence_transformers.models.Transformer",
        "Pooling": "sentence_transformers.models.Pooling",
        "Normalize": "sentence_transformers.models.Normalize",
    }
    for entry in modules:
        short = entry["type"].rsplit(".", 1)[-1]
        if short not in legacy_types:
            raise ValueError(f"module {short} has no sentence-transformers 5.x equivalent")
        entry["type"] = legacy_types[short]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    transformer = model[0]
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": transformer.max_seq_length, "do_lower_case": False}, indent=2)
    )
    mode = pooling_mode(model)
    pool_cfg = {
        "word_embedding_dimension": transformer.get_embedding_dimension(),
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": mode == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken",
        "include_prompt": True,
    }
    for entry in modules:
        if entry["type"].endswith("Pooling"):
            (directory / entry["path"] / "config.json").write_text(json.dumps(pool_cfg, indent=4))
    cfg_path = directory / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["__version__"] = {
        "sentence_transformers": "5.1.0",
        "transformers": transformers.__version__,
        "pytorch": torch.__version__,
        "written_by": f"hf_cocodr legacy export (sentence-transformers {sentence_transformers.__version__})",
    }
    cfg.setdefault("prompts", {"query": "", "document": ""})
    cfg.setdefault("default_prompt_name", None)
    cfg["similarity_fn_name"] = str(model.similarity_fn_name)
    cfg_path.write_text(json.dumps(cfg, indent=2))


def convert_checkpoint(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    name: str | None = None,
    query_length: int | None = None,
    document_length: int | None = None,
    max_seq_length: int | None = None,
    legacy_format: bool = False,
    card_data: dict[str, Any] | None = None,
    overwrite_output_dir: bool = False,
):
    """Convert a raw COCO-DR / Condenser checkpoint (plain BERT) into a CLS/dot sentence-transformers directory.

    Query and document lengths default to the paper's evaluation setting (64 / 256 tokens; ``max_seq_length`` 512),
    each at most the model's position limit; a length given past that limit is refused (see
    :func:`~hf_cocodr.modeling.limits.check_lengths`). ``out_dir`` is claimed as by
    :func:`export_sentence_transformer`.
    """
    src_s = str(src)
    if (Path(src_s) / "router_config.json").is_file():
        raise ValueError(
            f"{src_s} is an asymmetric sentence-transformers model (router_config.json: a query route and a document "
            "route, as query-side distillation saves it); convert turns a raw COCO-DR / Condenser checkpoint into a "
            "CLS/dot model and would lose a route. The folder loads as it is: SentenceTransformer(path)."
        )
    check_lengths(
        src_s, {"query_length": query_length, "document_length": document_length, "max_seq_length": max_seq_length}
    )
    limit = position_limit(src_s)

    def paper(value: int | None, default: int) -> int:
        return value if value is not None else default if limit is None else min(default, limit)

    query_length, document_length = paper(query_length, 64), paper(document_length, 256)
    max_seq_length = paper(max_seq_length, 512)
    if Path(src_s).exists() and is_sentence_transformers_dir(src_s):
        logger.warning("%s is already a sentence-transformers directory; re-exporting it with CLS/dot.", src_s)
    card = {"model_name": name, "base_model": src_s if not Path(src_s).exists() else None, **(card_data or {})}
    model = export_sentence_transformer(
        src_s,
        out_dir,
        pooling="cls",
        similarity="dot",
        max_seq_length=max_seq_length,
        legacy_format=legacy_format,
        query_length=query_length,
        document_length=document_length,
        card_data=card,
        overwrite_output_dir=overwrite_output_dir,
    )
    write_model_meta(
        out_dir, model, name or f"local/{Path(out_dir).name}", adapted_from=src_s if not Path(src_s).exists() else None
    )

    note_written(out_dir)
    return model


MODEL_META_FILE = "mteb_model_meta.json"


def write_model_meta(out_dir: str | os.PathLike, model, model_name: str, adapted_from: str | None = None) -> dict:
    """Write the generated mteb ``ModelMeta`` (CLS, dot, sizes, training data) as ``mteb_model_meta.json``."""
    from .evaluation.mteb import model_meta_for, model_revision

    meta = model_meta_for(out_dir, model_name, revision=model_revision(model), model=model, adapted_from=adapted_from)
    data = json.loads(json.dumps(meta.to_dict(), default=str))
    atomic_write_json(Path(out_dir) / MODEL_META_FILE, data)
    return data
