"""The planner: how many steps each stage trains, and by when it must end.

``max_minutes`` is a training budget: :func:`make_plan` times the stages' steps on this machine
(:func:`~hf_cocodr.recipe.probe.measure_throughput`), charges the fixed costs, splits the rest between the stages
by their shares (:func:`budget_plan`), sizes the source draw to the steps (:func:`size_source_queries`) and keeps the
plan in ``OUT/plan.json``; each stage then ends by a wall-clock deadline (:func:`stage_deadlines`) even when its
steps run slower than measured. Without a budget the steps are the ones given (or 500).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..rundir.run_record import digest
from ..utils import atomic_write_json
from .checks import check_budget_buys_steps
from .config import DISTILL_MAX_PASSES, Auto, RecipeConfig
from .context import RecipeRun
from .inputs import draw_source, set_coco_corpora, sizes_source, span_corpus
from .plan import Plan
from .probe import measure_throughput
from .stage import Stage
from .stages import STAGES, CocoStage, stage_step_seconds, stage_switches

logger = logging.getLogger(__name__)

STAGE_LOAD_SECONDS = 20.0  # a model load + export (the planner charges it per load)
NO_BUDGET_COCO_RUNS = 3  # coco_runs "budget" without a budget: this many runs of coco_run_steps steps


def fixed_plan(cfg: RecipeConfig, stages: tuple[Stage, ...] = STAGES) -> Plan:
    """The plan without a time budget: the steps given (or the defaults)."""
    return Plan(
        steps={s.name: s.unbudgeted_steps(cfg) for s in stages if s.trains},
        coco_runs=NO_BUDGET_COCO_RUNS if cfg.coco_runs == Auto.BUDGET else int(cfg.coco_runs),
        refreshes=1 if cfg.refreshes is None else cfg.refreshes,
    )


def saved_plan(out: Path, plan_id: str | Sequence[str]) -> Plan | None:
    """``OUT/plan.json`` if it was made for these inputs (a resumed run keeps the plan it started with); ``plan_id``:
    the identity, or the identities, such a plan may hold (:func:`plan_identities`)."""
    path = out / "plan.json"
    try:
        plan = json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None
    accepted = {plan_id} if isinstance(plan_id, str) else set(plan_id)
    if plan is not None and plan.get("identity") not in accepted:
        logger.info("the inputs or the budget changed since %s was made: planning again", path)
        return None
    return None if plan is None else Plan.from_dict(plan)


def budget_plan(
    budget_s: float,
    tp: dict[str, float],
    cfg: RecipeConfig,
    *,
    overhead_s: float,
    pool_docs: int,
    n_queries: int,
    idro: bool,
    stages: tuple[Stage, ...] = STAGES,
) -> Plan:
    """Spend ``budget_s`` on optimizer steps: fixed costs first (``overhead_s``: loading, exports; K-Means over the
    source queries), then self-negative refreshes only while they cost at most 10% of the budget, the rest split
    between the stages that run by their shares. Evaluation is not part of the budget."""
    refresh_s = tp.get("encode_doc_s", 0.0) * pool_docs + (tp.get("encode_query_s", 0.0) * n_queries if idro else 0.0)
    kmeans_s = tp.get("encode_query_s", 0.0) * n_queries if idro else 0.0
    refreshes = cfg.refreshes
    if refreshes is None:
        refreshes = 0 if cfg.skip_finetune else int(min(2, (0.1 * budget_s) // refresh_s) if refresh_s > 0 else 0)
    fixed = overhead_s + kmeans_s + refreshes * refresh_s
    train_s = max(0.0, budget_s - fixed)
    training = [s for s in stages if s.trains]
    step_s = {s.name: s.step_seconds(tp, cfg) for s in training}
    shares = {s.name: float(s.share(cfg)) for s in training if s.enabled(cfg)}
    total = sum(shares.values()) or 1.0
    plan = Plan(refreshes=refreshes)
    for s in training:
        if s.enabled(cfg):
            s.allot(plan, train_s * shares[s.name] / total, step_s[s.name], cfg, STAGE_LOAD_SECONDS)
        else:
            plan.steps[s.name] = 0
    optimizer_s = sum(s.optimizer_seconds(plan, step_s[s.name]) for s in training)
    plan.budget_seconds, plan.fixed_seconds = round(budget_s, 1), round(fixed, 1)
    plan.refresh_seconds_each, plan.kmeans_seconds = round(refresh_s, 1), round(kmeans_s, 1)
    plan.planned_optimizer_seconds = round(optimizer_s, 1)
    plan.planned_optimizer_share = round(optimizer_s / budget_s, 3) if budget_s else None
    return plan


def plan_budget(
    budget_s: float,
    tp: dict[str, float],
    cfg: RecipeConfig,
    *,
    overhead_s: float,
    pool_docs: int,
    n_queries: int,
    idro: bool,
) -> dict[str, Any]:
    """:func:`budget_plan` as the dict ``plan.json`` keeps (``coco_steps``, ``refreshes``, ``budget_seconds``, ...)."""
    return budget_plan(
        budget_s, tp, cfg, overhead_s=overhead_s, pool_docs=pool_docs, n_queries=n_queries, idro=idro
    ).to_dict()


def size_source_queries(
    budget_s: float,
    tp: dict[str, float],
    cfg: RecipeConfig,
    *,
    overhead_s: float,
    available: int,
    pool_docs_per_query: float,
    max_pool_docs: int,
    mining_s_per_query: float,
    batch: int,
    idro: bool,
    stages: tuple[Stage, ...] = STAGES,
) -> int:
    """How many source queries a budgeted run draws (when ``max_queries`` is unset): the largest ``q`` whose plan
    trains at least ``q / batch`` source steps, so every drawn query is seen once, and never more than ``available``.

    Everything that grows with the queries is charged before the steps are split, as :func:`budget_plan` charges it:
    BM25 mining (``q x mining_s_per_query``), the first K-Means encoding of the queries, and the self-negative
    refreshes over the mining pool (``min(max_pool_docs, q x pool_docs_per_query)`` documents). A large source task
    under a short budget is then drawn to the queries its steps can use instead of being mined and clustered whole."""

    def fits(q: int) -> bool:
        plan = budget_plan(
            budget_s,
            tp,
            cfg,
            overhead_s=overhead_s + q * mining_s_per_query,
            pool_docs=int(min(max_pool_docs, round(q * pool_docs_per_query))),
            n_queries=q,
            idro=idro,
            stages=stages,
        )
        return plan.steps_of("finetune") * batch >= q

    lo, hi = min(batch, available), available
    if fits(hi):
        return hi
    if not fits(lo):
        return lo
    while hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def coco_runs_for(coco_s: float, step_s: float, cfg: RecipeConfig, given_steps: int | None) -> tuple[int, int | None]:
    """``(runs, steps of each run)`` for ``coco_s`` seconds of COCO (steps None: as planned for one run).

    ``coco_runs: "budget"``: as many runs of about ``coco_run_steps`` steps (``coco_steps`` when given) as fit, at
    least one; the seconds are then shared out evenly, so a run may come out somewhat shorter or longer than
    ``coco_run_steps`` and the budget is spent. A whole number of runs shares the seconds between that many. Every
    run after the first costs a model load + export (:data:`STAGE_LOAD_SECONDS`) of the COCO seconds."""
    return CocoStage.runs_for(coco_s, step_s, cfg, given_steps, STAGE_LOAD_SECONDS)


def coco_run_seconds(plan: Plan, stages: tuple[Stage, ...] = STAGES) -> float:
    """Planned seconds of one COCO run of a soup (its steps at the measured step time, and its load + export)."""
    return plan.steps_of("coco") * (plan.throughput or {}).get("coco_step_s", 0.0) + STAGE_LOAD_SECONDS


def stage_deadlines(
    plan: Plan | Mapping[str, Any], cfg: RecipeConfig, t_start: float, stages: tuple[Stage, ...] = STAGES
) -> dict[str, float]:
    """The clock reading (``time.perf_counter()``, started at ``t_start``) by which each training stage must end.

    The last stage that trains must end when the budget does, less the final export (and the WiSE-FT interpolation
    when one follows). Each earlier stage must end early enough to leave the stages after it the seconds the plan gave
    them (their steps x their measured step time, and for the source stage its refreshes and K-Means): a stage that
    runs slower than measured is cut short, and a later stage keeps its steps unless it overruns too. Planned
    seconds come from the plan's ``throughput``; a plan without it (fixed steps, no budget) has no deadlines."""
    plan = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
    if not plan.budgeted:
        return {}
    training = [s for s in stages if s.trains]
    seconds = {
        s.name: s.planned_seconds(plan, s.step_seconds(plan.throughput, cfg), STAGE_LOAD_SECONDS) for s in training
    }
    tail = STAGE_LOAD_SECONDS * (1 + sum(s.load_exports(cfg) for s in stages if not s.trains))
    end = t_start + float(plan.budget_seconds) - tail
    out: dict[str, float] = {}
    for s in reversed(training):  # backwards from the end of the budget
        if plan.steps_of(s.name) > 0:  # (a joint plan gives the target stage no steps of its own)
            out[s.name] = end
            end -= seconds[s.name]
    return out


# Settings added after plans were first written, with their defaults: at the default they are left out of the plan's
# identity, so a run folder planned before they existed keeps its plan (and its finished stages) on a re-run.
ADDED_LATER = {"distill_document_gradients": True, "distill_max_passes": DISTILL_MAX_PASSES}


def plan_identity(run: RecipeRun, cfg_values: dict[str, Any], keep: Iterable[str] = ()) -> str:
    """The digest of what a plan depends on: the inputs, the budget and the settings (not the ones only the end of
    the run reads; not the :data:`ADDED_LATER` ones at their defaults, unless named in ``keep``)."""
    kept = set(keep)
    return digest(
        {
            "inputs": run.fps,
            "max_minutes": run.max_minutes,
            "config": {
                k: v
                for k, v in cfg_values.items()
                if k not in ("wise_alpha", "evaluate_start", "eval_batch_size", "save_hybrid")
                and not (k in ADDED_LATER and v == ADDED_LATER[k] and k not in kept)
            },
        }
    )


def plan_identities(run: RecipeRun, cfg_values: dict[str, Any]) -> list[str]:
    """The identities a saved plan for these inputs may hold: :func:`plan_identity`'s first, then those of versions
    that wrote some :data:`ADDED_LATER` settings at their defaults into the digest (any subset of them)."""
    present = [k for k in ADDED_LATER if k in cfg_values]
    subsets = itertools.chain.from_iterable(itertools.combinations(present, n) for n in range(1, len(present) + 1))
    return [plan_identity(run, cfg_values), *(plan_identity(run, cfg_values, keep=sub) for sub in subsets)]


def stage_ids(run: RecipeRun, stages: tuple[Stage, ...] = STAGES) -> dict[str, str]:
    """Each planned stage's identity: what it starts from (the stage before it), the data it reads, its settings and
    steps. A finished stage is skipped only when its identity is unchanged."""
    ids, current = {}, digest(run.fps["model"])
    for s in stages:
        if s.planned(run):
            current = ids[s.name] = digest(s.identity(run, current))
    return ids


def make_plan(run: RecipeRun, stages: tuple[Stage, ...] = STAGES) -> None:
    """Measure this machine's step times and size the stages to the budget (unless ``plan.json`` holds the plan for
    these inputs, or the steps are fixed); then each stage's deadline."""
    from ..finetuning import IDROTrainingArguments
    from ..pretraining import CocoPretrainingArguments

    cfg = run.cfg
    if any("spans" in s.needs(run) for s in stages):
        run.spans = span_corpus(run)
    if run.plan is None:
        t0 = time.perf_counter()
        kw = run.arguments
        tp = measure_throughput(
            run.model,
            CocoPretrainingArguments(**{**kw["coco"], "max_steps": 1}),
            IDROTrainingArguments(**{**kw["finetune"], "max_steps": 1}),
            run.spans,
            run.train_data if not cfg.skip_finetune else None,
            run.pooling,
            target_args=IDROTrainingArguments(**{**kw["target"], "max_steps": 1}),
            target_data=run.target_data,
        )
        for s in stages:
            if s.enabled(cfg):
                tp.update(s.probe(run))
        measured_s = time.perf_counter() - t0
        # spent so far, plus a model load + export for the final model and each stage that loads and exports one
        overhead = (time.perf_counter() - run.t_start) + STAGE_LOAD_SECONDS * (
            1 + sum(s.load_exports(cfg) for s in stages)
        )
        overhead += sum(s.fixed_seconds(tp, cfg) for s in stages if s.enabled(cfg))  # e.g. the teacher's rankings
        data, sized = run.train_data, {}
        idro = kw["finetune"].get("idro_preset", "paper") != "uniform"
        pool_docs, n_queries = (len(data.corpus), len(data)) if data is not None else (0, 0)
        budget_s = run.max_minutes * 60.0
        if data is not None and sizes_source(run):
            # the draw the steps can use; mining it again is charged at the probe draw's seconds per query
            mining = data.mining_seconds / max(1, len(data))
            q = size_source_queries(
                budget_s,
                tp,
                cfg,
                overhead_s=overhead,
                available=data.available_queries,
                pool_docs_per_query=len(data.corpus) / max(1, len(data)),
                max_pool_docs=data.full_corpus_docs,
                mining_s_per_query=mining,
                batch=kw["finetune"]["per_device_train_batch_size"]
                * kw["finetune"].get("gradient_accumulation_steps", 1),
                idro=idro,
                stages=stages,
            )
            redraw = q != len(data)
            pool_docs = int(min(data.full_corpus_docs, round(q * len(data.corpus) / max(1, len(data)))))
            n_queries, overhead = q, overhead + (q * mining if redraw else 0.0)
            sized = {
                "source_queries": q,
                "source_queries_available": data.available_queries,
                "mining_seconds_per_query": round(mining, 6),
            }
        plan = budget_plan(
            budget_s, tp, cfg, overhead_s=overhead, pool_docs=pool_docs, n_queries=n_queries, idro=idro, stages=stages
        )
        for key, value in sized.items():
            setattr(plan, key, value)
        plan.max_minutes, plan.throughput = run.max_minutes, {k: round(v, 4) for k, v in tp.items()}
        plan.measure_seconds, plan.identity = round(measured_s, 1), run.plan_id
        on = stage_switches(cfg, stages)  # a budget below one step of each stage is refused before any training
        check_budget_buys_steps(
            plan.to_dict(),
            {s: v for s, v in stage_step_seconds(tp, cfg, stages).items() if on[s][0]},
            load_s=STAGE_LOAD_SECONDS,
        )
        logger.info(
            "recipe plan for %.0f minutes of training: measured %s; COCO %d run(s) of %d steps, source "
            "fine-tuning %d steps with %d negative refresh(es), target pairs %d steps, distillation %d steps; "
            "%.0f%% of the budget planned for optimizer steps (evaluation not included)",
            run.max_minutes,
            plan.throughput,
            plan.coco_runs,
            plan.steps_of("coco"),
            plan.steps_of("finetune"),
            plan.refreshes,
            plan.steps_of("target"),
            plan.steps_of("distill"),
            100 * (plan.planned_optimizer_share or 0),
        )
        atomic_write_json(run.out / "plan.json", plan.to_dict())
        run.plan = plan
        run.ids = stage_ids(run, stages)
        if plan.source_queries is not None and plan.source_queries != len(run.train_data):
            logger.info(
                "recipe: the budget's steps use %d of %d source queries: drawing them",
                plan.source_queries,
                plan.source_queries_available,
            )
            run.train_data = draw_source(run, plan.source_queries)
            set_coco_corpora(run)
            if not cfg.skip_coco and not run.done("coco") and cfg.include_source_corpus:
                run.spans = span_corpus(run)
    if run.max_minutes is not None:
        # (called with three arguments for the built-in stages, as stage_deadlines is documented)
        custom = {} if stages is STAGES else {"stages": stages}
        run.deadlines = stage_deadlines(run.plan, cfg, run.t_start, **custom)
        run.coco_run_seconds = coco_run_seconds(run.plan)
    run.stage_seconds["planning"] = round(time.perf_counter() - run.t_start - sum(run.stage_seconds.values()), 1)
