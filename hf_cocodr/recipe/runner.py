"""The recipe in one call (:func:`run_recipe`): the stages of :data:`~hf_cocodr.recipe.stages.STAGES` in order,
then export, card and evaluation of the adapted and the starting model.

Stages write into ``OUT/<stage>`` (``OUT/coco``, ``OUT/finetune``, ``OUT/distill``, ``OUT/wise``); the final model is
``OUT/model``, the evaluation ``OUT/eval.json`` (each split's metrics with the starting model's under ``"start"``)
and the run record ``OUT/recipe.json`` (settings, the schedule choice and why, the plan, the seconds of every stage).
Each stage is resumable (the latest complete checkpoint) and a finished stage (``hf_cocodr_stage.json`` present, every
output it lists there at its size) is skipped on a re-run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .. import distributed as D
from ..data.beir import BEIRFormatError, open_jsonl, parse_eval_spec
from ..data.sources import data_label, resolve_data
from ..data.target_queries import refuse_eval_overlap
from ..errors import ConfigError
from ..evaluation.retrieval import evaluate_retrieval
from ..export import export_sentence_transformer
from ..methods import method_target_queries, validate_methods
from ..model_card import EVAL_FILE, EVAL_RESULTS_DIR, write_model_card
from ..modeling.condenser import checkpoint_has_mlm_head
from ..modeling.loading import load_encoder, model_source, pooling_mode
from ..modeling.precision import resolve_corpus_precision
from ..provenance import PROVENANCE_FILE
from ..retrieval.hybrid import HYBRID_FILE, HybridRetriever
from ..retrieval.session import EncodingSession
from ..rundir.run_record import RunFolder, data_fingerprint, digest, fingerprint
from ..storage import check_before_work
from ..utils import add_written_entries, atomic_write_json, native_bf16
from . import planner
from .checks import (
    check_budget_floor,
    check_distill_inputs,
    check_drawn_queries,
    check_recipe_lengths,
    check_source_needed,
    check_target_corpora,
)
from .config import RecipeConfig, check_max_minutes, check_stages, config_class
from .context import RecipeRun
from .fusions import kept_eval_fusion, kept_fusion, shares_documents
from .guard import Candidates, guard_run
from .inputs import coco_corpora, draw_source, load_data
from .outputs import check_no_retired_levers, export_final, read_marker, write_marker
from .planner import fixed_plan, make_plan, plan_identities, saved_plan, stage_ids
from .queries import corpus_names, guard_not_read, hybrid_queries, prepare_queries
from .schedules import choose_schedule
from .settings import device_record, encode_batch_size
from .stage import Stage
from .stages import STAGES, instantiate

logger = logging.getLogger(__name__)

# Everything run_recipe writes into its output folder besides the stages' folders and entries (declared in its
# record before any stage starts).
RUN_ENTRIES = (
    "model",
    "hybrid",
    "plan.json",
    "start_eval.json",
    "eval.json",
    "recipe.json",
    "idro_weights.json",
    "queries",
)


def recipe_entries(stages: Sequence[Stage | type[Stage]] = STAGES) -> tuple[str, ...]:
    """The entries a recipe with ``stages`` writes into its output folder (each stage's folder and its
    :attr:`~hf_cocodr.recipe.Stage.entries`, and the run's)."""
    return tuple(dict.fromkeys([*(s.name for s in stages), *(e for s in stages for e in s.entries), *RUN_ENTRIES]))


RECIPE_ENTRIES = recipe_entries()


# over 80 lines: the public entry point, its docstring one documented argument per input (a 45-line body)
def run_recipe(
    model,
    target_corpora: list,
    source_data=None,
    output_dir: str | os.PathLike | None = None,
    *,
    evals: list[str] | tuple[str, ...] = (),
    config: RecipeConfig | dict | None = None,
    max_minutes: float | None = None,
    resume: bool = True,
    overwrite_output_dir: bool = False,
    stages: Sequence[Stage | type[Stage]] | None = None,
) -> dict[str, Any]:
    """Run COCO → source fine-tuning → distillation → WiSE-FT → guard → export → card → evaluation.

    Returns ``{eval_spec: {"ndcg@10", "recall@100", ..., "start": {...}}}``: each split's metrics for the adapted
    model, with the starting model's beside them (``"start"``, unless ``evaluate_start`` is off).

    Args:
        model: starting encoder (sentence-transformers directory, raw checkpoint, Hub id, or a loaded
            ``SentenceTransformer``: :func:`~hf_cocodr.modeling.loading.model_source`). Its pooling and similarity
            are kept (raw checkpoints: CLS + dot, the COCO-DR convention).
        target_corpora: BEIR folders / JSONL files / Hub dataset ids / ``datasets`` objects of the target domain
            (only their documents are read).
        source_data: the labelled source task (a BEIR folder or Hub dataset with ``qrels/<source_split>.tsv``);
            ``None`` where the schedule does not fine-tune on one (else one line names the stage).
        output_dir: ``OUT``; stages go to ``OUT/<stage>`` (``OUT/coco``, ``OUT/finetune``, ``OUT/distill``,
            ``OUT/wise``), the final model to ``OUT/model``.
        evals: ``DIR:SPLIT`` specifications evaluated on the final model (and on the starting model).
        config: a :class:`RecipeConfig` or a mapping of its fields.
        max_minutes: the training budget: the stages are sized so that the run, apart from the evaluations asked
            for, takes this long on this machine, and a stage whose steps run slower than measured stops at its
            deadline with fewer steps (``OUT/plan.json`` has the plan and its measured inputs, ``OUT/recipe.json``
            the actual time and steps of each stage and which stages a deadline stopped). A resumed run gets the
            budget anew for what is left.
        resume: continue unfinished stages from their latest complete checkpoint and skip the finished stages
            whose inputs (model, data, settings, plan, the stage before) are unchanged; a stage whose inputs changed
            runs again, and so does every stage after it. ``False`` starts over, which needs
            ``overwrite_output_dir`` when ``OUT`` holds an earlier run.
        overwrite_output_dir: write into an ``OUT`` that holds files hf_cocodr did not write (they stay untouched),
            and, with ``resume=False``, replace an earlier run's files. ``OUT`` is claimed before any work (owner
            record ``hf_cocodr_run.json`` and a lock, see :mod:`hf_cocodr.rundir.run_record`).
        stages: the stages in order (default :data:`~hf_cocodr.recipe.stages.STAGES`); a new stage is a
            :class:`~hf_cocodr.recipe.Stage` subclass (or an instance of one) added to this list, and its
            ``settings`` are then recipe options of this call's ``config``. Classes are instantiated for this run.
    """
    t_start = time.perf_counter()
    _same_on_every_rank(model, target_corpora, source_data, output_dir, evals, config, max_minutes, resume,
                        overwrite_output_dir, stages)  # fmt: skip
    stages = check_stages(instantiate(stages), RUN_ENTRIES)  # names and options a run can keep apart
    cfg = _config(config, stages)
    model, target_corpora, source_data, evals = _inputs(model, target_corpora, source_data, output_dir, evals)
    check_no_retired_levers(Path(output_dir), resume)  # an earlier run's retired levers, before any work
    has_mlm = checkpoint_has_mlm_head(model) if os.path.exists(str(model)) else None
    plain = [str(c) for c in target_corpora if _without_ids(c)]  # (nothing to rank: no pseudo-query is drawn)
    cfg, choice = choose_schedule(cfg, has_mlm, stages, plain_corpora=plain)  # the one choice of the schedule
    methods = _check_before_work(model, list(target_corpora), cfg, choice, stages, evals, max_minutes, source_data)
    logger.info(
        "recipe schedule for %s: %s (%s); chosen: %s; set by you: %s",
        model,
        choice["kind"],
        choice["why"],
        choice["chosen"] or "nothing",
        choice["set_by_user"] or "nothing",
    )
    fps = {
        "model": fingerprint(model),
        "targets": fingerprint([str(t) if isinstance(t, os.PathLike) else t for t in target_corpora]),
        "source": None if source_data is None else fingerprint(str(source_data)),
    }
    entries = recipe_entries(stages)
    check_before_work(output_dir, model)  # writable OUT and cache folder, room for the stages' checkpoints
    if cfg.save_hybrid:
        check_hybrid_folders(Path(output_dir), target_corpora)
    folder = D.main_first(_claim, output_dir, fps, resume, overwrite_output_dir, entries)  # (rank 0's: docs/scale.md)
    try:
        inputs = (model, list(target_corpora), source_data, Path(output_dir), evals)
        run = RecipeRun(*inputs, cfg, choice, has_mlm, methods, max_minutes, resume, t_start, fps)
        result = _run_stages(run, stages)
        D.barrier()  # (rank 0 releases OUT once every rank finished; a rank that fails leaves at once)
        return result
    finally:
        if D.is_main() and folder is not None:
            folder.release()


def _same_on_every_rank(model, target_corpora, source_data, output_dir, evals, config, *rest) -> None:
    """Under torchrun, refuse in one line a launch whose ranks were given other settings (before any work)."""
    max_minutes, resume, overwrite_output_dir, stages = rest
    given = {
        "model": model,
        "target_corpora": list(target_corpora),
        "source_data": source_data,
        "output_dir": output_dir,
        "evals": list(evals),
        "config": asdict(config) if isinstance(config, RecipeConfig) else dict(config or {}),
        "max_minutes": max_minutes,
        "resume": resume,
        "overwrite_output_dir": overwrite_output_dir,
        "stages": [getattr(s, "name", s) for s in stages or ()],
    }
    D.same_settings(given, "recipe settings")


def _inputs(model, target_corpora, source_data, output_dir, evals) -> tuple[Any, list, Any, list[str]]:
    """What the run reads, checked and made local before any work: each ``--eval`` (a bad one fails here), the Hub
    datasets and ``DatasetDict`` objects as their cached BEIR folders, a loaded model as the folder it runs as."""
    if output_dir is None:
        raise ConfigError("run_recipe needs output_dir")
    evals = list(evals)
    for spec in evals:
        parse_eval_spec(spec)  # (a Hub dataset is read into the cache here)
    target_corpora = [resolve_data(c, "--target-corpus") for c in target_corpora]
    source_data = resolve_data(source_data, "--source-data") if source_data is not None else None
    return model_source(model), target_corpora, source_data, evals


def _claim(output_dir, fps, resume: bool, overwrite: bool, entries) -> RunFolder:
    """``OUT`` claimed for the recipe (on rank 0 alone under torch.distributed; the other ranks hold no claim)."""
    folder = RunFolder.claim(
        output_dir, "recipe", None if resume else fps, resume=resume, overwrite=overwrite, writes=entries
    )
    folder.expect(entries)
    return folder


def _without_ids(corpus) -> bool:
    """Whether a target corpus is plain texts without document ids (a JSONL file whose first record has no ``_id``,
    a dataset without an ``_id`` column): COCO reads it, nothing can be ranked in it."""
    if isinstance(corpus, (str, os.PathLike)):
        path = Path(corpus)
        if not path.is_file():
            return False  # a BEIR folder: its corpus holds ids (checked where it is read)
        with open_jsonl(path) as f:
            for raw in f:
                if raw.strip():
                    try:
                        return "_id" not in json.loads(raw)
                    except ValueError:
                        return False  # (refused by name where it is read)
        return False
    return "_id" not in getattr(corpus, "column_names", ["_id"])


def _config(config: RecipeConfig | dict | None, stages: tuple[Stage, ...]) -> RecipeConfig:
    """The run's settings, checked: :class:`RecipeConfig` with the options of any added stage."""
    cls = config_class([s.settings for s in stages])
    if not isinstance(config, cls):
        config = cls.from_dict(asdict(config) if isinstance(config, RecipeConfig) else dict(config or {}))
    config.validate()
    return config


def _without_targets(cfg: RecipeConfig, choice: dict[str, Any]) -> None:
    """No target corpus: nothing of the target domain to read, so no COCO and no distillation (refused where the user
    asked for them), and the source fine-tuning even where the schedule left it out."""
    if cfg.skip_coco is False and "skip_coco" in choice["set_by_user"]:
        raise ConfigError("at least one target corpus is needed for COCO (or set skip_coco)")
    if cfg.skip_distill is False and "skip_distill" in choice["set_by_user"] and cfg.target_queries:
        raise ConfigError("distillation needs a target corpus for its teacher to rank (or set skip_distill)")
    cfg.skip_coco = True  # nothing of the target domain to read
    if cfg.skip_distill is False and "skip_distill" in choice["chosen"]:
        cfg.skip_distill = choice["chosen"]["skip_distill"] = True
    if cfg.skip_finetune is True and "skip_finetune" in choice["chosen"]:  # the schedule left it out, not you
        cfg.skip_finetune, cfg.finetune_share = False, 1.0
        choice["chosen"].update(skip_finetune=False, finetune_share=1.0)
    logger.warning("no target corpus given: no COCO and no distillation, only the source fine-tuning")


def _check_before_work(
    model: str,
    target_corpora: list,
    cfg: RecipeConfig,
    choice: dict[str, Any],
    stages: tuple[Stage, ...],
    evals: list[str],
    max_minutes: float | None,
    source_data=None,
) -> list:
    """Everything :func:`run_recipe` refuses before it claims ``OUT`` or loads a model; returns the fine-tuning
    methods, checked."""
    check_max_minutes(max_minutes)
    check_target_corpora(target_corpora)  # a missing corpus, before OUT is claimed or a model loads
    if not target_corpora:
        _without_targets(cfg, choice)
    check_source_needed(source_data, cfg, choice, stages)  # (after the schedule without targets is set)
    training = [s for s in stages if s.trains]
    if not any(s.enabled(cfg) for s in training):
        raise ConfigError(f"nothing to train: {_all_off(cfg, training)}; switch one on")
    check_recipe_lengths(model, cfg)  # token lengths against the model's position limit (its config.json only)
    if max_minutes is not None:  # a budget the fixed model loads + exports alone use up
        loads = [s.label for s in stages if s.cost({}, cfg, budget_s=float(max_minutes) * 60.0).loads]
        check_budget_floor(max_minutes, planner.STAGE_LOAD_SECONDS, loads)
    # the stages that read the target queries (distillation) take them whatever the methods are
    readers = [s.name for s in stages if s.reads_target_queries and s.enabled(cfg)]
    if cfg.target_queries and not readers and not method_target_queries(cfg.methods, cfg.target_queries):
        raise ConfigError(
            "target queries are given but nothing reads them: "
            + (
                "the distill stage needs a target corpus (--target-corpus) for its teacher to rank"
                if not target_corpora
                else f"the distill stage is off here (skip_distill: {cfg.skip_distill}) and MoDIR is not asked "
                "for; set skip_distill false, add --method modir, or drop --target-queries"
            )
        )
    # fail before any stage runs; the fine-tuning methods get the target queries only when one of them reads them
    methods = validate_methods(cfg.methods, target_corpora, method_target_queries(cfg.methods, cfg.target_queries))
    refuse_eval_overlap(cfg.target_queries, evals)  # no run trains on the queries it is evaluated on
    if any(s.reads_target_queries and s.enabled(cfg) for s in stages) and target_corpora:
        check_distill_inputs(cfg, target_corpora)  # before the teacher encodes the corpus
    for stage in stages:  # what a stage refuses of the other stages' settings (e.g. query-side distillation)
        stage.check(cfg, stages)
    return methods


def _all_off(cfg: RecipeConfig, training: list[Stage]) -> str:
    """Which training stages are off, and the switches that turned them off (the run's options each stage's
    settings has among ``skip_<name>``)."""
    switches = [
        f"{f.name}={getattr(cfg, f.name)}"
        for s in training
        if s.settings is not None
        for f in fields(s.settings)
        if f.name.startswith("skip_")
    ]
    what = ", ".join(s.label for s in training) or "no stage that trains is in the stage list"
    return f"{what} {'are' if len(training) > 1 else 'is'} all off" + (f" ({', '.join(switches)})" if switches else "")


def _run_stages(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any]:
    """The stages of :func:`run_recipe` in its claimed output folder, then the export and the evaluations; each
    corpus is encoded once per model (the teacher, the evaluations and the hybrids share it, and a resumed or repeated
    run reads it from the cache: the run's :class:`~hf_cocodr.retrieval.session.EncodingSession`)."""
    run.encode_precision, run.encode_precision_why = resolve_corpus_precision(run.cfg.encode_precision)
    run.encodings = EncodingSession(run.encode_precision, cache=True, record=run.corpus_encodings)
    return _run_stages_cached(run, stages)


def _run_stages_cached(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any]:
    """:func:`_run_stages` once its encoding session is made."""
    cfg = run.cfg
    run.pooling, run.similarity = _model_similarity(run.model)
    logger.info(
        "recipe: starting model %s (%s pooling, %s similarity); targets %s; source %s:%s",
        run.model,
        run.pooling,
        run.similarity,
        ", ".join(map(str, run.target_corpora)),
        run.source_data,
        cfg.source_split,
    )
    # (the distillation's training queries, the guard's held-out ones; written by rank 0 under torch.distributed)
    run.queries = D.main_first(prepare_queries, run)
    if any(s.reads_target_queries and s.enabled(cfg) for s in stages) and run.target_corpora and run.queries:
        check_drawn_queries(cfg, run.queries)  # (what was drawn fills a batch: before the teacher's work)
    run.arguments = {s.name: s.arguments(run) for s in stages}
    # The plan (kept in OUT/plan.json for the inputs it was made for) and each stage's identity: a finished stage is
    # skipped only when its identity (its inputs, settings, steps and the stage before it) is unchanged.
    ids = plan_identities(run, asdict(cfg))
    run.plan_id = ids[0]
    run.plan = fixed_plan(cfg, stages) if run.max_minutes is None else D.main_first(saved_plan, run.out, ids)
    run.ids = stage_ids(run, stages) if run.plan else {}
    run.precision = _precision_choice(cfg, run.arguments, stages)
    run.precision.update(encoding=run.encode_precision, encoding_why=run.encode_precision_why)
    logger.info("recipe precision: %s (%s)", run.precision["training"], run.precision["why"])
    logger.info("recipe corpus encodings: %s (%s)", run.encode_precision, run.encode_precision_why)
    t0 = time.perf_counter()
    run.train_data = load_data(run, stages)
    run.coco_corpora = coco_corpora(run, run.train_data)
    run.stage_seconds["data"] = round(time.perf_counter() - t0, 1)
    _plan(run, stages)
    for stage in stages:
        # (a stage that runs after adaptation only, WiSE-FT, runs where a stage before it changed the model)
        if stage.planned(run) and (not stage.after_adaptation or run.current != run.model):
            _run_stage(run, stage)
    return _finish(run, stages)


def _plan(run: RecipeRun, stages: tuple[Stage, ...]) -> None:
    """A budgeted run without a saved plan measures and plans now (:func:`~hf_cocodr.recipe.planner.make_plan`), and
    draws the source queries its steps use; then each stage's deadline."""
    if run.plan is None:
        run.plan = make_plan(run, stages)
        run.ids = stage_ids(run, stages)
        queries = run.plan.source_queries
        if queries is not None and queries != len(run.train_data):
            logger.info(
                "recipe: the budget's steps use %d of %d source queries: drawing them",
                queries,
                run.plan.source_queries_available,
            )
            run.train_data = draw_source(run, queries)
            run.coco_corpora = coco_corpora(run, run.train_data)
    if run.max_minutes is not None:
        run.load_s = planner.STAGE_LOAD_SECONDS
        run.deadlines = planner.stage_deadlines(run.plan, run.cfg, run.t_start, stages)
    run.stage_seconds["planning"] = round(time.perf_counter() - run.t_start - sum(run.stage_seconds.values()), 1)


def _run_stage(run: RecipeRun, stage: Stage) -> None:
    """Run ``stage`` (skipped when it finished with the same inputs); the next stage starts from its model."""
    t0, stage_dir = time.perf_counter(), run.dir(stage.name)
    if run.done(stage.name):
        logger.info("stage %s: already finished (%s) with the same inputs, skipped", stage.name, stage_dir)
    else:
        run.log_rerun(stage_dir)
        marker = stage.train(run)
        D.barrier()  # (what rank 0 wrote of the stage is there for every rank)
        meter = run.meters.get(stage.name)
        throughput = {"throughput": meter.summary()} if meter is not None and meter.steps else {}
        if marker is None and throughput:  # the stage wrote its marker itself
            marker = read_marker(stage_dir)
        if marker is not None and D.is_main():
            write_marker(stage_dir, {**marker, **throughput, "identity": run.ids[stage.name]})
        D.barrier()
    if not (read_marker(stage_dir) or {}).get("declined"):  # (a stage that declined to train left no model)
        run.current = str(stage_dir)
    run.stage_seconds[stage.name] = D.main_first(_stage_seconds, stage_dir, t0)  # (rank 0 writes the marker)


def _model_similarity(model_path: str) -> tuple[str, str]:
    """(pooling, similarity) the starting model declares; raw checkpoints follow COCO-DR (cls, dot)."""
    st = load_encoder(model_path)
    return pooling_mode(st) or "cls", str(st.similarity_fn_name or "dot")


def _stage_seconds(stage_dir: Path, t0: float) -> float:
    """Seconds the stage took: measured now, or (a stage finished by an earlier run) as its marker recorded them."""
    marker = read_marker(stage_dir) or {}
    if "seconds" not in marker:
        marker = {**marker, "seconds": round(time.perf_counter() - t0, 1)}
        write_marker(stage_dir, marker)
    return float(marker["seconds"])


def _precision_choice(
    cfg: RecipeConfig, arguments: dict[str, dict[str, Any]] | None = None, stages: tuple[Stage, ...] = ()
) -> dict[str, Any]:
    """The training precision of the stages and why (logged and kept in ``recipe.json``): bf16 for a stage whose
    options set ``bf16: true``, and for a switched-on stage of ``stages`` whose own default is bf16 (``arguments``:
    each stage's training arguments; the distillation's default where this machine has native bf16 kernels, every
    stage's on a CUDA GPU with them, see docs/precision.md); fp32 otherwise. Where the machine has no native bf16 kernels bf16 is many times slower. No ``stages``: the options of the built-in stages are read, and no stage's
    default."""
    native = native_bf16()
    # the stages' mappings of training arguments (coco, finetune, ...), in the run's order
    options = [o for s in instantiate(stages or None) if (o := getattr(s.settings, "training_options", None))]
    stages = instantiate(stages)
    off = {s.name for s in stages if not s.enabled(cfg)}  # a stage switched off trains in no precision
    asked = [stage for stage in options if getattr(cfg, stage).get("bf16") and stage not in off]
    defaulted = [
        s.name
        for s in stages
        if s.name not in asked
        and s.enabled(cfg)
        and "bf16" not in (getattr(cfg, s.name) if s.name in options else {})
        and (arguments or {}).get(s.name, {}).get("bf16")
    ]
    if asked or defaulted:
        why = []
        if asked:
            why.append(
                "set in the options of "
                + ", ".join(asked)
                + ("" if native else "; this machine has no native bf16: expect it slower")
            )
        if defaulted:
            why.append(
                ", ".join(defaulted) + ": the stage's default on a machine with native bf16 (the distillation's) or "
                "on a CUDA GPU with it (every stage's); bf16: false in its options turns it off"
            )
        on = [stage for stage in options if stage in asked or stage in defaulted]
        on += [name for name in defaulted if name not in on]
        return {"training": "bf16 (" + ", ".join(on) + ")", "native_bf16": native, "why": "; ".join(why)}
    why = (
        "this machine has native bf16, but the stages that run here train in fp32 unless their options set "
        "bf16: true (the distillation's default is bf16 on such a machine)"
        if native
        else "this machine has no native bf16 kernels, where bf16 runs many times slower"
    )
    return {"training": "fp32", "native_bf16": native, "why": why}


# ---------------------------------------------------------------------------------------------- export + evaluation
SUMMARY_KEYS = ("ndcg@10", "recall@100", "mrr@10", "num_queries", "num_docs")
CHANNEL_KEYS = ("ndcg@10", "recall@100", "mrr@10")


def split_hybrid(result: dict[str, Any]) -> dict[str, Any]:
    """A hybrid evaluation as the recipe reports it: the dense model's metrics at the top level (the model is what
    the recipe trains), with ``"bm25"`` and ``"hybrid"`` beside them."""
    return {
        **{k: result["dense"][k] for k in SUMMARY_KEYS},
        "bm25": {k: result["bm25"][k] for k in CHANNEL_KEYS},
        "hybrid": {**{k: result[k] for k in CHANNEL_KEYS}, "fusion": result["fusion"]},
    }


def _run_start_eval(
    model: str,
    evals: list[str],
    out: Path,
    batch_size: int,
    session: EncodingSession | None = None,
    *,
    query_max_length: int | None = None,
    doc_max_length: int | None = None,
) -> dict[str, dict]:
    """The starting model on the ``--eval`` splits, cached in ``OUT/start_eval.json``: each split's result under the
    fingerprints of what it was computed from (the model's files and the split's folder: qrels, queries, corpus) and
    of everything that changes its vectors (:func:`_start_eval_encoding`: the corpus-encoding precision, the batch
    size, the token lengths), so a changed model, a changed split or an evaluation in another precision is evaluated
    again, whatever its name."""
    path = out / "start_eval.json"
    cached = D.main_first(_read_start_eval, path)  # (rank 0's reading: every rank evaluates the same splits)
    model_fp = digest(fingerprint(model))
    if not isinstance(cached, dict) or cached.get("model_fingerprint") != model_fp:
        cached = {"model": model, "model_fingerprint": model_fp, "results": {}, "inputs": {}}
    encoding = _start_eval_encoding(session, batch_size, query_max_length, doc_max_length)
    # (the files the loader reads of each split, and how its vectors are computed)
    inputs = {spec: digest({"data": data_fingerprint(*parse_eval_spec(spec)), "encoding": encoding}) for spec in evals}
    todo = [
        s
        for s in evals
        if "hybrid" not in cached["results"].get(s, {}) or cached.get("inputs", {}).get(s) != inputs[s]
    ]
    if todo:
        st = load_encoder(model)
        lengths = {"query_max_length": query_max_length, "doc_max_length": doc_max_length}
        for spec in todo:
            folder, split = parse_eval_spec(spec)
            res = evaluate_retrieval(
                st,
                folder,
                split,
                show_progress_bar=False,
                batch_size=batch_size,
                hybrid=True,
                session=session,
                **lengths,
            )
            cached["results"][spec] = split_hybrid(res)
            cached.setdefault("inputs", {})[spec] = inputs[spec]
            cached.setdefault("encoding", {})[spec] = encoding  # (what the key holds, for a reader)
            if D.is_main():
                atomic_write_json(path, cached)
    return {s: cached["results"][s] for s in evals}


def _start_eval_encoding(
    session: EncodingSession | None, batch_size: int, query_max_length: int | None, doc_max_length: int | None
) -> dict[str, Any]:
    """What changes the starting model's vectors in its evaluation besides the model's files and the data, part of
    ``start_eval.json``'s key: the corpus-encoding precision (the ``session``'s; fp32 without one), the batch size
    and the token lengths (``None``: the model's own, which its files hold)."""
    return {
        "encode_precision": session.precision if session is not None else "fp32",
        "batch_size": int(batch_size),
        "query_max_length": query_max_length,
        "doc_max_length": doc_max_length,
    }


def _read_start_eval(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}  # a damaged cache is a missing one


def _finish(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any]:
    """Export the final model, evaluate it (and the starting model), write the card, ``eval.json`` and
    ``recipe.json``; returns the summary."""
    from ..training_api import evaluate_all

    t0, cfg, final_dir = time.perf_counter(), run.cfg, run.out / "model"
    verdict = guard_run(run, Candidates(start=run.model, adapted=str(run.current)))
    verdict = D.broadcast_object(verdict)  # rank 0's verdict, on every rank
    if verdict is not None:  # the model it keeps is the one exported
        run.guard, run.current = verdict.record, verdict.keep
        run.stage_seconds["guard"] = verdict.record["seconds"]
        t0 = time.perf_counter()
    else:  # (its state is always said: here and in recipe.json)
        (logger.info if run.cfg.guard == "off" else logger.warning)("guard: not read (%s)", guard_not_read(run)["why"])
    D.main_first(_export, run, final_dir)
    seconds = run.stage_seconds
    seconds["export"] = round(time.perf_counter() - t0, 1)
    train_seconds = round(sum(seconds.values()), 1)  # data + planning + stages + export
    t0 = time.perf_counter()
    final = load_encoder(str(final_dir))
    start_model = load_encoder(run.model)  # (a query-side final model's hybrids keep its fusions: .fusions)
    shared = shares_documents(final, start_model)  # (one fingerprint of each document route, for every split)
    batch = encode_batch_size(cfg)
    starts: dict[str, dict] = {}
    if run.evals and cfg.evaluate_start:  # (first: the final model's hybrid evaluation keeps its fusion)
        t1 = time.perf_counter()
        starts = _run_start_eval(run.model, run.evals, run.out, batch, run.encodings)
        seconds["start_evaluation"] = round(time.perf_counter() - t1, 1)
        t0 += time.perf_counter() - t1
    reusing = run.encodings.with_reuse()  # a target corpus that is also evaluated is encoded once by the final model
    results: dict[str, dict] = {}
    for spec in run.evals:
        fusion = kept_eval_fusion(final, start_model, starts.get(spec), shared=shared)
        results.update(
            evaluate_all(
                final,
                [spec],
                final_dir if D.is_main() else None,
                batch_size=batch,
                hybrid=True,
                session=reusing,
                **({"fusion": fusion} if fusion else {}),
            )
        )
    summary = {spec: split_hybrid(r) for spec, r in results.items()}
    seconds["evaluation"] = round(time.perf_counter() - t0, 1)
    if cfg.save_hybrid and run.target_corpora:
        t0 = time.perf_counter()
        _save_hybrids(run, final, reusing, start_model, shared=shared)
        seconds["hybrid_retrievers"] = round(time.perf_counter() - t0, 1)
    del reusing  # (the final model's kept indexes)
    for spec, start in starts.items():
        summary[spec]["start"] = start
        logger.info(
            "%s: nDCG@10 %.4f adapted vs %.4f starting model (%+.4f)",
            spec,
            summary[spec]["ndcg@10"],
            start["ndcg@10"],
            summary[spec]["ndcg@10"] - start["ndcg@10"],
        )
    if D.is_main():
        _write_records(run, stages, summary, train_seconds, final_dir)
    logger.info(
        "recipe finished: training %.1f minutes%s, evaluation %.1f minutes",
        train_seconds / 60,
        f" (budget {run.max_minutes:g})" if run.max_minutes is not None else "",
        (seconds["evaluation"] + seconds.get("start_evaluation", 0.0)) / 60,
    )
    return summary


def _export(run: RecipeRun, final_dir: Path) -> None:
    """The final model into ``OUT/model`` (the starting model's export where the guard or the stages left it)."""
    if run.current == run.model:
        export_sentence_transformer(
            run.model, final_dir, pooling=run.pooling, similarity=run.similarity, run_record=False
        )
    else:
        export_final(Path(run.current), final_dir)
    # what the recipe writes into OUT/model next is its own too (a re-run replaces it, never carries it over)
    add_written_entries(final_dir, (EVAL_FILE, "README.md", PROVENANCE_FILE, EVAL_RESULTS_DIR))


def hybrid_folders(out: Path, target_corpora) -> list[tuple[Any, Path]]:
    """``(corpus, OUT/hybrid/<name>)`` for each target corpus, named as :func:`~hf_cocodr.recipe.queries.corpus_names`
    names it (from its resolved path: ``..``, ``q/qrels/..`` or ``.`` name the folder they are, never ``OUT/hybrid``
    itself; the folder's name for a ``corpus.jsonl``; ``-2``, ``-3``, ... after a name already taken)."""
    return [
        (corpus, Path(out) / "hybrid" / name) for corpus, name in zip(target_corpora, corpus_names(target_corpora))
    ]


def check_hybrid_folders(out: Path, target_corpora) -> None:
    """Refuse, before any work, an ``OUT/hybrid/<corpus>`` that exists and is not a saved hybrid retriever (the
    recipe would have to replace the user's folder after training)."""
    for _, folder in hybrid_folders(out, target_corpora):
        if folder.exists() and not (folder / HYBRID_FILE).is_file():
            raise FileExistsError(
                f"{folder} exists and is not a saved hybrid retriever; the recipe saves the retriever of a target "
                "corpus there: move that folder, or set save_hybrid: false"
            )


def _save_hybrids(
    run: RecipeRun, model, session: EncodingSession | None = None, start=None, shared: bool | None = None
) -> None:
    """A hybrid retriever (the final model + BM25) for each target corpus in ``OUT/hybrid/<corpus name>``, its fusion
    fitted to that corpus and calibrated to the target queries given from its folder, if any (where the final model
    shares its document route with ``start``, the loaded starting model, the start's fusion, :mod:`.fusions`);
    encoded in ``session`` (the run's)."""
    for corpus, folder in hybrid_folders(run.out, run.target_corpora):
        try:
            hybrid = HybridRetriever.build(
                model,
                corpus,
                fusion=kept_fusion(run, model, start, corpus, session, shared=shared) if start is not None else None,
                queries=hybrid_queries(corpus, run.cfg.target_queries),
                batch_size=encode_batch_size(run.cfg),
                session=session,
            )
        except BEIRFormatError as e:  # a plain text corpus (no document ids) trains COCO but cannot be searched
            logger.warning("no hybrid retriever for %s: %s", corpus, e)
            continue
        if D.is_main():  # (every rank built it, sharing the encoding; rank 0 writes)
            hybrid.save(folder)
            logger.info("hybrid retriever for %s saved in %s (HybridRetriever.load)", corpus, folder)


def _steps_trained(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any]:
    """The steps each training stage ran (from its completion marker); where a wall-clock deadline ended a stage
    before its planned steps, the step it stopped at; where a cap on passes over its data did, the cap; the texts and
    tokens its steps encoded per second (and on CUDA how busy the GPU was), as its throughput meter counted them."""
    markers = {s.name: read_marker(run.dir(s.name), run.ids[s.name]) for s in stages if s.trains and s.name in run.ids}
    markers = {s: m for s, m in markers.items() if m is not None and "steps" in m}
    return {
        "steps_trained": {s: m["steps"] for s, m in markers.items()},
        "stopped_by_deadline": {
            s: m["stopped_by_deadline_at_step"] for s, m in markers.items() if "stopped_by_deadline_at_step" in m
        },
        "capped_at_passes": {s: m["capped_at_passes"] for s, m in markers.items() if "capped_at_passes" in m},
        "throughput": {s: m["throughput"] for s, m in markers.items() if "throughput" in m},
    }


def _teacher_check(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any]:
    """``{"teacher_check": ...}`` where a stage checked its teacher before training (its marker's record), else
    ``{}``."""
    for s in stages:
        marker = read_marker(run.dir(s.name), run.ids.get(s.name)) if s.name in run.ids else None
        if marker and "teacher_check" in marker:
            return {"teacher_check": marker["teacher_check"]}
    return {}


def _queries_trained(run: RecipeRun, stages: tuple[Stage, ...]) -> dict[str, Any] | None:
    """What the distillation trained on, for the card: the user's queries and the pseudo-queries (by kind) drawn
    from the target corpora; None where no stage read them."""
    if not any(s.reads_target_queries and s.enabled(run.cfg) for s in stages) or not run.queries:
        return None
    kinds: dict[str, int] = {}
    for q in run.queries:
        for kind, n in q.counts.get("train_pseudo_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + n
    return {
        "queries": sum(q.counts.get("train_queries", 0) for q in run.queries),
        "pseudo_queries": sum(kinds.values()),
        "kinds": kinds,
    }


def _write_records(
    run: RecipeRun, stages: tuple[Stage, ...], summary: dict, train_seconds: float, final_dir: Path
) -> None:
    record = {
        "model": run.model,
        "target_corpora": [data_label(c) if isinstance(c, (str, os.PathLike)) else str(c) for c in run.target_corpora],
        "source_data": data_label(run.source_data) if run.source_data is not None else None,
        "evals": run.evals,
        "config": asdict(run.cfg),
        "schedule": run.choice,
        "precision": run.precision,
        "device": device_record(),
        "ranks": D.world()[0],  # the processes of a torch.distributed launch (torchrun) that ran it
        # each training stage's per-device batch (a GPU's default is larger than a CPU's: settings.device_batch_size)
        "batches": {
            s.name: run.arguments[s.name]["per_device_train_batch_size"]
            for s in stages
            if s.trains and s.planned(run) and "per_device_train_batch_size" in run.arguments.get(s.name, {})
        },
        "plan": run.plan.to_dict(),
        "stage_seconds": run.stage_seconds,
        **_steps_trained(run, stages),
        "train_seconds": train_seconds,
        "wall_seconds": round(time.perf_counter() - run.t_start, 1),
        # every corpus encoding (by document encoder and corpus content): "encoded", or reused from the cache
        "corpus_encodings": run.corpus_encodings,
        # the queries drawn, held out and trained on per target corpus, and the label-free guard's reading
        "queries": {q.name: q.counts for q in run.queries},
        "guard": run.guard if run.guard is not None else guard_not_read(run),
        **_teacher_check(run, stages),
    }
    if run.max_minutes is not None:
        record["budget_seconds"] = round(run.budget_s, 1)
        record["train_over_budget_seconds"] = round(train_seconds - run.budget_s, 1)
    keys = ("ndcg@10", "recall@100")

    def row(v: dict) -> dict:
        return {**{k: v[k] for k in keys}, **{ch: {k: v[ch][k] for k in keys} for ch in ("bm25", "hybrid") if ch in v}}

    write_model_card(
        final_dir,
        load_encoder(str(final_dir)),
        {
            "recipe_schedule": run.choice,
            "guard": run.guard,
            "teacher_check": _teacher_check(run, stages).get("teacher_check"),
            "queries_trained": _queries_trained(run, stages),
            "start_vs_adapted": {
                s: {"adapted": row(v), "start": row(v["start"])} for s, v in summary.items() if "start" in v
            },
        },
    )
    atomic_write_json(run.out / "eval.json", summary)
    atomic_write_json(run.out / "recipe.json", record)
