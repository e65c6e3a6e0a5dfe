"""Running MTEB offline: load the model, attach its generated ``ModelMeta``, ``mteb.evaluate`` every task into a
``mteb.ResultCache`` (the results-repository layout), and return a summary the CLI prints."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...data.sources import is_offline_error
from ...modeling.loading import _hub_has_modules_json, load_encoder, model_source
from ...provenance import resolve_hub_id
from ...retrieval.ann import index_choice
from ...utils import import_mteb
from .common import DEFAULT_LANGUAGES, check_model_name, check_revision, warnings_quiet
from .meta import model_meta_for, model_revision, read_training_info
from .model import mteb_model
from .results import _summarise
from .tasks import _builtin_tasks, beir_task

logger = logging.getLogger(__name__)


class MTEBDataUnavailableError(FileNotFoundError):
    """A built-in MTEB task's dataset is neither cached locally nor downloadable (e.g. the Hub is unreachable)."""


def _is_offline_error(exc: BaseException) -> bool:
    """``exc`` (or an exception it was raised from) says the Hub or the network could not be reached, or (for a
    built-in task's data) that the dataset is not found there."""
    seen, inner = 0, exc
    while inner is not None and seen < 10:
        if type(inner).__name__ == "DatasetNotFoundError":
            return True
        inner, seen = inner.__cause__ or inner.__context__, seen + 1
    return is_offline_error(exc)


def _data_unavailable(task, error: BaseException) -> MTEBDataUnavailableError:
    """The error for a built-in task whose data the Hub could not deliver: names the task, its dataset, the way out."""
    ds = task.metadata.dataset
    return MTEBDataUnavailableError(
        f"MTEB task {task.metadata.name!r} needs the dataset {ds.get('path')!r} (revision {ds.get('revision')}), which "
        "is not in the local Hugging Face cache, and the Hub is unreachable"
        f"{' (HF_HUB_OFFLINE=1)' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''}. Run once with network "
        "access to cache it, or evaluate a local BEIR copy: hf-cocodr mteb MODEL DATA_DIR --task-name NAME."
    )


def _load_with_meta(
    model,
    model_name: str,
    revision: str | None,
    languages: Sequence[str],
    device: str | None,
    meta_kwargs: dict[str, Any],
):
    """The loaded model (from a directory, a Hub id or as given) and its :func:`model_meta_for`; a loaded model's
    meta is read from the folder it runs as (:func:`~hf_cocodr.modeling.loading.model_source`: the folder it was
    loaded from when unchanged, so that its meta is that folder's)."""
    model_dir = None
    meta_kwargs = dict(meta_kwargs)
    if not isinstance(model, (str, os.PathLike)):
        source = model_source(model)
        if isinstance(source, (str, os.PathLike)) and Path(source).expanduser().is_dir():
            model_dir = Path(source).expanduser()
    if isinstance(model, (str, os.PathLike)):
        model_dir = Path(model).expanduser()
        model_id = str(model)
        model = load_encoder(model_dir if model_dir.exists() else model_id, device=device)
        if not model_dir.is_dir():  # a Hub id: no local files to read metadata from
            model_dir = None
            if "raw_checkpoint" not in meta_kwargs:
                with contextlib.suppress(Exception):
                    meta_kwargs["raw_checkpoint"] = not _hub_has_modules_json(model_id, None, None)
    meta = model_meta_for(model_dir, model_name, revision, model=model, languages=languages, **meta_kwargs)
    return model, meta


def _cached_commit(hub_id: str) -> str | None:
    """The commit of the Hub model ``hub_id`` that the local Hugging Face cache holds (the one a load reads), else
    None; no network."""
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        for name in ("modules.json", "config.json"):
            found = try_to_load_from_cache(hub_id, name)
            if isinstance(found, str) and Path(found).parent.parent.name == "snapshots":
                return Path(found).parent.name
    return None


def _dense_part(model_ref, meta, given: str | None) -> tuple[str, str | None]:
    """How the hybrid's meta names its dense part, and that part's own revision where it has one: the name given
    (``--dense-model-name``; no revision); a Hub id as given, at the commit the cache holds; for a local folder no
    hf_cocodr stage trained, the base model it copies (``adapted_from``, e.g. mteb's registry name) at the revision
    recorded for the copy; else the folder's last component, with no revision (a local folder has no Hub commit).
    Never a local path, and never the hybrid's own revision."""
    if given:
        return given, None
    if isinstance(model_ref, (str, os.PathLike)):
        path = Path(model_ref).expanduser()
        if not path.exists():
            return str(model_ref), _cached_commit(str(model_ref))
        info = read_training_info(path)
        if not info.get("stages") and meta.adapted_from:
            base = str(meta.adapted_from)
            revision = info.get("base_model_revision") if info.get("base_model") == base else None
            if revision is None:
                hub_id, hub_revision = resolve_hub_id(path)
                revision = hub_revision if hub_id == base else None
            return base, revision
        return path.resolve().name, None
    return str(meta.adapted_from or meta.name), None


_SKIPPED = {
    False: "its results in the output folder were computed from this model and data (--overwrite runs it again)",
    True: "results are already in the output folder, not computed by this run (overwrite=True runs it again)",
}
# how a results file's inputs that differ from this run's are named
_WHAT_DIFFERS = {
    "model": "model",
    "data": "data",
    "system": "system (dense or hybrid)",
    "fusion": "fusion",
    "index": "dense index",
}


def _system(hybrid: bool, fusion) -> dict[str, Any]:
    """What a results file was computed with besides the model and data: the dense model alone, or the hybrid with
    its fusion settings."""
    if not hybrid:
        return {"system": "dense"}
    from .hybrid import _fusion_config

    return {"system": "hybrid", "fusion": asdict(_fusion_config(fusion))}


def _strategy(cache, task, meta, provenance: dict[str, Any] | None, rel: str, inputs: dict[str, Any]) -> str:
    """How to run ``task`` without ``overwrite``: ``"skip"`` when its results file is complete and (when
    ``provenance`` is kept) was computed from ``inputs``; ``"always"`` when the file was computed from other inputs,
    or from inputs ``provenance`` does not know; else mteb's ``"only-missing"`` (no file yet, or splits missing)."""
    path = cache.cache_path / rel
    if not path.is_file():
        return "only-missing"
    if provenance is not None and provenance.get(rel) != inputs:
        earlier = provenance.get(rel)
        differs = (
            [_WHAT_DIFFERS.get(k, k) for k in sorted(inputs) if earlier.get(k) != inputs[k]]
            if isinstance(earlier, dict)
            else []
        )
        logger.warning(
            "%s: %s was computed from %s; running the task again",
            task.metadata.name,
            path,
            f"another {', '.join(differs)}" if differs else "inputs the folder's record does not name",
        )
        return "always"
    try:
        with warnings_quiet():
            existing = cache.load_task_result(task.metadata.name, meta)
    except Exception:  # unreadable: mteb says what is wrong with it
        return "only-missing"
    if existing is not None and not existing.get_missing_evaluations(task):
        return "skip"
    return "only-missing"


def _evaluate(encoder, task, cache, strategy: str, *, builtin: bool, **kwargs):
    """``mteb.evaluate`` of one task into ``cache`` with the overwrite ``strategy``; a built-in task whose data the Hub
    cannot deliver raises :class:`MTEBDataUnavailableError`, a task that fails a ``RuntimeError``."""
    mteb = import_mteb()  # heavy: imported on first use only

    try:
        with warnings_quiet():
            result = mteb.evaluate(
                encoder,
                task,
                cache=cache,
                overwrite_strategy=strategy,
                show_progress_bar=False,
                raise_error=True,
                **kwargs,
            )
    except Exception as e:
        if builtin and _is_offline_error(e):
            raise _data_unavailable(task, e) from e
        raise
    if result.exceptions:
        raise RuntimeError(f"MTEB task {task.metadata.name!r} failed: {result.exceptions[0].exception}")
    return result


# over 80 lines: the Python twin of `hf-cocodr mteb`, one documented keyword argument per flag (a 70-line body)
def run_mteb(
    model,
    folder: str | os.PathLike | None = None,
    split: str = "test",
    task_name: str | None = None,
    model_name: str | None = None,
    revision: str | None = None,
    output_folder: str | os.PathLike = "mteb_results",
    *,
    tasks: Sequence[Any] | None = None,
    batch_size: int = 64,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    task_languages: Sequence[str] | None = None,
    overwrite: bool = False,
    prediction_folder: str | os.PathLike | None = None,
    co2_tracker: bool = False,
    device: str | None = None,
    meta_kwargs: dict[str, Any] | None = None,
    hybrid: bool = False,
    fusion=None,
    dense_model_name: str | None = None,
    provenance: dict[str, Any] | None = None,
    index=None,
) -> dict[str, Any]:
    """Evaluate a model with ``mteb.evaluate`` on a local BEIR split and/or built-in MTEB tasks.

    Results land in the MTEB results-repository layout, written by ``mteb.ResultCache``:
    ``OUT/results/ORG__NAME/REV/{TASK}.json`` and ``OUT/results/ORG__NAME/REV/model_meta.json`` (the generated
    :func:`model_meta_for`), so the revision folder can be copied into ``embeddings-benchmark/results`` as it is. The
    main score is nDCG@10; on a BEIR folder it equals :func:`hf_cocodr.evaluate_retrieval`'s (same texts, same
    query/document encoders, same similarity).

    Args:
        model: a model directory (sentence-transformers or raw checkpoint, loaded with CLS/dot) or a loaded
            SentenceTransformer.
        folder / split / task_name: a local BEIR folder to evaluate as the task ``task_name`` (see :func:`beir_task`).
        model_name: ``ORG/NAME`` (required).
        revision: the model revision (default: a content hash of the weights).
        output_folder: the MTEB cache folder written to (``OUT``).
        tasks: built-in MTEB task names (``["SciFact", "NFCorpus"]``) or MTEB task objects; they need the Hub or a
            local Hugging Face datasets cache.
        batch_size: encoding batch size.
        languages: the model's languages (for the ModelMeta) and the local task's languages.
        task_languages: restrict multilingual built-in tasks to these languages.
        overwrite: re-run tasks that already have results in ``output_folder``. Without it a task whose results
            file is complete is skipped and reported as skipped (``{"skipped": why, "file"}``, no scores: this run
            computed none), unless ``provenance`` says the file was computed from other inputs; missing splits run.
        prediction_folder: also save the top-ranked documents per query there.
        meta_kwargs: extra arguments for :func:`model_meta_for` (license, training_datasets, adapted_from, ...).
        hybrid: run the package's hybrid (the model + bm25s over each task's corpus, fused per query; see
            :mod:`.hybrid`) through mteb's search protocol instead of the dense model alone; ``model_name`` is then
            the hybrid's name and its ``ModelMeta`` has ``model_type=["hybrid"]``. Each task's scores equal
            ``hf-cocodr evaluate --hybrid``'s on the same data.
        fusion: with ``hybrid``: a :class:`~hf_cocodr.retrieval.fusion.FusionConfig` or its fields (default: the normalisation
            and the dense weight fitted to each task's corpus without labels).
        dense_model_name: with ``hybrid``: how ``model_meta.json`` names the dense part (default: the Hub id given,
            else the base model mteb knows for a model no hf_cocodr stage trained, else the last component of the
            model's folder: never a local path, and never labelled with the hybrid's revision).
        index: with ``hybrid``: the dense index (``auto``, ``exact``, ``hnsw``, ``ivf`` or an :class:`~hf_cocodr.
            retrieval.ann.IndexChoice`, default ``auto``); a task searched with an approximate one has ``"index"``
            (its kind, parameters and recall@100).
        provenance: what computed each results file in ``output_folder``: its path relative to the folder →
            ``{"model": content hash of the model, "data": the task's dataset revision, "batch_size", "system", ...}``, as
            ``hf-cocodr mteb`` keeps it in the folder's owner record; updated in place as files are written. With
            it, a task is skipped only when its file was computed from this run's inputs; a file computed from
            other ones (another model or data under the same name, revision and task; the hybrid after the dense
            model), or from inputs it does not name, is computed again.

    Returns:
        ``{"results_folder", "model_meta", "model_name", "revision", "tasks": {name: {"main_score", "ndcg@10",
        "recall@100", "mrr@10", "splits", "file"}}}``; with ``hybrid`` each task also has ``"fusion"`` (the
        normalisation and weight used, and how they were fitted); a skipped task is ``{"skipped": why, "file"}``.

    Raises:
        ValueError: bad model name, revision, task name or unknown MTEB task; nothing to evaluate.
        FileNotFoundError / BEIRFormatError: missing model or BEIR folder, malformed data.
        MTEBDataUnavailableError: a built-in task's data is not cached and the Hub is unreachable.
    """
    mteb = import_mteb()  # heavy (about 9 s): imported on first use only

    model_name = check_model_name(model_name)
    if revision is not None:
        revision = check_revision(revision)
    if batch_size is None or batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    choice = None if index is None else index_choice(index)  # a bad index is refused before any work
    if folder is None and not tasks:
        raise ValueError(
            "nothing to evaluate: give a BEIR folder (DATA_DIR) or MTEB task names (--tasks SciFact,...)."
        )
    local_tasks = [beir_task(folder, split, task_name, languages=languages)] if folder is not None else []
    task_objects = [t for t in tasks or [] if not isinstance(t, str)]
    builtin_names = [t for t in tasks or [] if isinstance(t, str)]
    with warnings_quiet():
        builtin = _builtin_tasks(builtin_names, task_languages) if builtin_names else []

    model_ref = model if isinstance(model, (str, os.PathLike)) else model_source(model)
    model, meta = _load_with_meta(model, model_name, revision, languages, device, meta_kwargs or {})
    if hybrid:
        from .hybrid import HybridSearchModel, hybrid_model_meta

        dense_ref, dense_revision = _dense_part(model_ref, meta, dense_model_name)
        meta = hybrid_model_meta(meta, model_name, fusion, dense_ref, dense_revision)
        encoder = HybridSearchModel(model, meta, fusion, batch_size=batch_size, index=choice or "auto")
    else:
        encoder = mteb_model(model, meta)
    cache = mteb.ResultCache(output_folder)
    encode_kwargs = {"batch_size": int(batch_size), "show_progress_bar": False}
    summary: dict[str, Any] = {}
    system = _system(hybrid, fusion)
    if hybrid and choice is not None:  # a results file computed with another index is computed again
        system["index"] = asdict(choice)
    model_hash = model_revision(model) if provenance is not None else None
    for task in [*local_tasks, *task_objects, *builtin]:
        name = task.metadata.name
        rel = cache.get_task_result_path(name, meta).relative_to(cache.cache_path).as_posix()
        # as the owner record keeps it (JSON: tuples read back as lists), so that equal inputs compare equal
        # (and the batch size the model encoded at: another batch pads otherwise, its vectors round otherwise)
        given = {"model": model_hash, "data": task.metadata.revision, "batch_size": int(batch_size), **system}
        inputs = json.loads(json.dumps(given, default=str))
        strategy = "always" if overwrite else _strategy(cache, task, meta, provenance, rel, inputs)
        if strategy == "skip":
            summary[name] = {"skipped": _SKIPPED[provenance is None], "file": str(cache.cache_path / rel)}
            logger.info("%s: skipped, %s", name, _SKIPPED[provenance is None])
            continue
        if provenance is not None:  # until it is written again, the file is not known to be this run's
            provenance.pop(rel, None)
        result = _evaluate(
            encoder,
            task,
            cache,
            strategy,
            builtin=task in builtin,
            encode_kwargs=dict(encode_kwargs),
            co2_tracker=co2_tracker,
            prediction_folder=prediction_folder,
        )
        for task_result in result.task_results:
            file = cache.get_task_result_path(task_result.task_name, meta)
            summary[task_result.task_name] = {**_summarise(task_result), "file": str(file)}
            if hybrid and task_result.task_name in encoder.fusions:
                summary[task_result.task_name]["fusion"] = encoder.fusions[task_result.task_name]
            if hybrid and task_result.task_name in encoder.indexes:
                summary[task_result.task_name]["index"] = encoder.indexes[task_result.task_name]
        if provenance is not None:
            provenance[rel] = inputs
    # ResultCache.save_to_cache writes model_meta.json next to the task files, as if it were a task's results
    meta_path = cache.get_task_result_path("model_meta", meta)
    return {
        "results_folder": str(meta_path.parent.resolve()),
        "model_meta": str(meta_path.resolve()),
        "model_name": meta.name,
        "revision": meta.revision,
        "tasks": summary,
    }
