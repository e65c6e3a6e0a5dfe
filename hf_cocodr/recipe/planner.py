"""The planner: how many steps each stage trains, and by when it must end.

``max_minutes`` is a training budget: :func:`make_plan` has each stage time its own step on this machine
(:meth:`~hf_cocodr.recipe.Stage.probe`), charges what each stage costs beyond its steps (:meth:`~hf_cocodr.recipe.
Stage.cost`), splits the rest between the stages by their shares (:func:`budget_plan`), sizes the source draw to the
steps (:func:`size_source_queries`) and keeps the plan in ``OUT/plan.json``; each stage then ends by a wall-clock
deadline (:func:`stage_deadlines`) even when its steps run slower than measured. Without a budget the steps are the
ones given (or 500). Nothing here names a stage.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..retired import RETIRED_OPTIONS
from ..rundir.run_record import digest
from ..utils import atomic_write_json
from .checks import check_budget_buys_steps
from .config import RecipeConfig
from .context import RecipeRun
from .inputs import sizes_source
from .plan import Plan
from .stage import Cost, Stage, split_runs
from .stages import DISTILL_MAX_PASSES, instantiate
from .stages.coco import NO_BUDGET_COCO_RUNS  # noqa: F401  (re-exported: hf_cocodr.recipe.NO_BUDGET_COCO_RUNS)

logger = logging.getLogger(__name__)

STAGE_LOAD_SECONDS = 20.0  # a model load + export (the planner charges it per load)


def fixed_plan(cfg: RecipeConfig, stages: Sequence[Stage] | None = None) -> Plan:
    """The plan without a time budget: the steps given (or the defaults), as each stage's
    :meth:`~hf_cocodr.recipe.Stage.cost` without a budget says."""
    plan = Plan()
    for s in instantiate(stages):
        cost = s.cost({}, cfg)
        if s.trains:
            plan.steps[s.name] = int(cost.steps or 0)
        plan.stage_fields.update(cost.plan)
    return plan


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
    stages: Sequence[Stage] | None = None,
    **sizes: Any,
) -> Plan:
    """Spend ``budget_s`` on optimizer steps: fixed costs first (``overhead_s``: loading, exports, the time spent so
    far; then what each stage that runs costs beyond its steps, :meth:`~hf_cocodr.recipe.Stage.cost`, given the data
    ``sizes``), the rest split between the stages that run by their shares. Evaluation is not part of the budget."""
    training = [s for s in instantiate(stages) if s.trains]
    costs = {s.name: s.cost(tp, cfg, budget_s=budget_s, **sizes) for s in training}
    on = [s.name for s in training if s.enabled(cfg)]
    fixed = overhead_s + sum(costs[name].fixed_s for name in on)
    train_s = max(0.0, budget_s - fixed)
    total = sum(costs[name].share for name in on) or 1.0
    plan, optimizer_s = Plan(), 0.0
    for s in training:
        plan.stage_fields.update(costs[s.name].plan)
    for s in training:
        cost = costs[s.name]
        if s.name not in on:
            plan.steps[s.name] = 0
            continue
        plan.steps[s.name], runs = allot(s.name, train_s * cost.share / total, cost, STAGE_LOAD_SECONDS)
        if cost.runs != 1:
            plan.stage_fields[f"{s.name}_runs"] = runs
        optimizer_s += plan.steps[s.name] * cost.step_s * runs
    plan.budget_seconds, plan.fixed_seconds = round(budget_s, 1), round(fixed, 1)
    plan.planned_optimizer_seconds = round(optimizer_s, 1)
    plan.planned_optimizer_share = round(optimizer_s / budget_s, 3) if budget_s else None
    return plan


def allot(name: str, seconds: float, cost: Cost, load_s: float) -> tuple[int, int]:
    """``(steps, runs)`` of stage ``name`` for ``seconds`` of training as its ``cost`` says: its fixed steps when it
    has them, else as many as the seconds buy (at least 2); a stage trained in runs shares the seconds between them
    (:func:`split_runs`; ``load_s``: the seconds of one model load + export)."""
    if cost.steps is None and not cost.step_s > 0:
        raise ConfigError(
            f"stage {name}: no step time was measured, so the budget cannot be spent on its steps; give the "
            f"stage a trainer (build_trainer) or a probe, or fix its steps ({name}_steps)"
        )
    steps = cost.steps if cost.steps is not None else max(2, int(seconds / cost.step_s))
    if cost.runs == 1:
        return steps, 1
    runs, each = split_runs(seconds, cost.step_s, cost.runs, cost.run_steps, cost.steps, load_s)
    return (steps if each is None else each), runs


def planned_seconds(plan: Plan, name: str, cost: Cost, load_s: float) -> float:
    """Planned wall-clock seconds of stage ``name`` (its steps in each of its runs, a load + export for each run
    after the first, and its fixed costs), for the deadlines."""
    runs = plan.runs_of(name)
    return plan.steps_of(name) * cost.step_s * runs + (runs - 1) * load_s + cost.fixed_s


def one_step(step_s: float, runs: int, load_s: float) -> tuple[float, str]:
    """The seconds the first step of a stage costs the budget (one step of each of its ``runs``, and a load +
    export for every run after the first), and how they are made up (for the check that a budget buys one step of
    every stage)."""
    return step_s * runs + (runs - 1) * load_s, f"{step_s:.2f} s per step" + (f" x {runs} runs" if runs > 1 else "")


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
    idro: bool | None = None,
    stages: Sequence[Stage] | None = None,
) -> int:
    """How many source queries a budgeted run draws (when ``max_queries`` is unset): the largest ``q`` whose plan
    trains at least ``q / batch`` steps of the stage that trains on the source task, so every drawn query is seen
    once, and never more than ``available``.

    Everything that grows with the queries is charged before the steps are split, as :func:`budget_plan` charges it:
    BM25 mining (``q x mining_s_per_query``), and what the stages cost for ``q`` queries and their mining pool
    (``min(max_pool_docs, q x pool_docs_per_query)`` documents: K-Means, self-negative refreshes). A large source task
    under a short budget is then drawn to the queries its steps can use instead of being mined and clustered whole."""
    stages = instantiate(stages)
    drawer = next((s.name for s in stages if s.trains and s.enabled(cfg) and s.draws_source), None)

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
        return drawer is not None and plan.steps_of(drawer) * batch >= q

    lo, hi = min(batch, available), available
    if fits(hi):
        return hi
    if not fits(lo):
        return lo
    while hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def one_step_costs(
    plan: Plan, step_s: Mapping[str, float], cfg: RecipeConfig, stages: Sequence[Stage] | None = None
) -> dict[str, tuple[float, str]]:
    """What the first step of each training stage that runs costs the budget, in order (:func:`one_step`, with the
    runs the plan gives the stage), from the measured ``step_s``."""
    return {
        s.name: one_step(step_s[s.name], plan.runs_of(s.name), STAGE_LOAD_SECONDS)
        for s in instantiate(stages)
        if s.trains and s.enabled(cfg) and s.name in step_s
    }


def stage_deadlines(
    plan: Plan | Mapping[str, Any], cfg: RecipeConfig, t_start: float, stages: Sequence[Stage] | None = None
) -> dict[str, float]:
    """The clock reading (``time.perf_counter()``, started at ``t_start``) by which each training stage must end.

    The last stage that trains must end when the budget does, less the final export (and the model loads + exports
    of the stages after it that train no step, e.g. the WiSE-FT interpolation). Each earlier stage must end early
    enough to leave the stages after it the seconds the plan gave them (:func:`planned_seconds`: their steps x their
    measured step time, and their own fixed costs such as the source stage's refreshes and K-Means): a stage that
    runs slower than measured is cut short, and a later stage keeps its steps unless it overruns too. Planned seconds
    come from the plan's ``throughput`` and each stage's :meth:`~hf_cocodr.recipe.Stage.cost` of the plan; a plan
    without a throughput (fixed steps, no budget) has no deadlines."""
    plan = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
    if not plan.budgeted:
        return {}
    stages = instantiate(stages)
    costs = {s.name: s.cost(plan.throughput, cfg, budget_s=plan.budget_seconds, plan=plan) for s in stages}
    tail = STAGE_LOAD_SECONDS * (1 + sum(costs[s.name].loads for s in stages if not s.trains))
    end = t_start + float(plan.budget_seconds) - tail
    out: dict[str, float] = {}
    for s in reversed([s for s in stages if s.trains]):  # backwards from the end of the budget
        if plan.steps_of(s.name) > 0:  # (a stage that is off has no steps)
            out[s.name] = end
            end -= planned_seconds(plan, s.name, costs[s.name], STAGE_LOAD_SECONDS)
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
    that wrote some :data:`ADDED_LATER` settings at their defaults into the digest (any subset of them), then the same
    for the versions that still had the retired options (:data:`~hf_cocodr.retired.RETIRED_OPTIONS`), at the values a
    default run had (where they did nothing)."""
    present = [k for k in ADDED_LATER if k in cfg_values]
    subsets = list(
        itertools.chain.from_iterable(itertools.combinations(present, n) for n in range(1, len(present) + 1))
    )
    retired = {name: r.default for name, r in RETIRED_OPTIONS.items() if name not in cfg_values}
    out = []
    for values in (cfg_values, {**cfg_values, **retired}) if retired else (cfg_values,):
        out += [plan_identity(run, values), *(plan_identity(run, values, keep=sub) for sub in subsets)]
    return out


def stage_ids(run: RecipeRun, stages: Sequence[Stage] | None = None) -> dict[str, str]:
    """Each planned stage's identity: what it starts from (the stage before it), the data it reads, its settings and
    steps. A finished stage is skipped only when its identity is unchanged."""
    ids, current = {}, digest(run.fps["model"])
    for s in instantiate(stages):
        if s.planned(run):
            current = ids[s.name] = digest(s.identity(run, current))
    return ids


def measure(run: RecipeRun, stages: Sequence[Stage]) -> dict[str, float]:
    """Each stage that runs times its own step (and what else it costs) on this machine: the throughput."""
    tp: dict[str, float] = {}
    for s in stages:
        if s.enabled(run.cfg):
            tp.update(s.probe(run))
    return tp


def _sized_draw(run: RecipeRun, stages: Sequence[Stage], tp: dict[str, float], overhead: float) -> dict[str, Any]:
    """The source draw a budgeted run's steps can use (see :func:`size_source_queries`): the queries, the mining
    pool and the overhead of mining them again; nothing when the budget does not size the draw."""
    data, kw = run.train_data, run.arguments
    if data is None or not sizes_source(run, stages):
        sizes = {"pool_docs": len(data.corpus), "n_queries": len(data)} if data is not None else {}
        return {"sizes": sizes, "overhead": overhead, "fields": {}}
    drawer = next(s.name for s in stages if s.draws_source)
    mining = data.mining_seconds / max(1, len(data))  # mining the draw again, at the probe draw's seconds per query
    q = size_source_queries(
        run.budget_s,
        tp,
        run.cfg,
        overhead_s=overhead,
        available=data.available_queries,
        pool_docs_per_query=len(data.corpus) / max(1, len(data)),
        max_pool_docs=data.full_corpus_docs,
        mining_s_per_query=mining,
        batch=kw[drawer]["per_device_train_batch_size"] * kw[drawer].get("gradient_accumulation_steps", 1),
        stages=stages,
    )
    pool_docs = int(min(data.full_corpus_docs, round(q * len(data.corpus) / max(1, len(data)))))
    return {
        "sizes": {"pool_docs": pool_docs, "n_queries": q},
        "overhead": overhead + (q * mining if q != len(data) else 0.0),
        "fields": {
            "source_queries": q,
            "source_queries_available": data.available_queries,
            "mining_seconds_per_query": round(mining, 6),
        },
    }


def _budgeted_plan(run: RecipeRun, stages: Sequence[Stage]) -> Plan:
    """Measure this machine's step times and spend the budget (see :func:`budget_plan`); refuses a budget that
    cannot buy one step of each stage that runs."""
    t0, cfg = time.perf_counter(), run.cfg
    tp = measure(run, stages)
    measured_s = time.perf_counter() - t0
    # spent so far, plus a model load + export for the final model and each stage that loads and exports one
    costs = {s.name: s.cost(tp, cfg, budget_s=run.budget_s) for s in stages}
    spent = time.perf_counter() - run.t_start
    loads = STAGE_LOAD_SECONDS * (1 + sum(c.loads for c in costs.values()))
    overhead = spent + loads
    draw = _sized_draw(run, stages, tp, overhead)
    plan = budget_plan(run.budget_s, tp, cfg, overhead_s=draw["overhead"], stages=stages, **draw["sizes"])
    for key, value in draw["fields"].items():
        setattr(plan, key, value)
    plan.max_minutes, plan.throughput = run.max_minutes, {k: round(v, 4) for k, v in tp.items()}
    plan.measure_seconds, plan.identity = round(measured_s, 1), run.plan_id
    plan.fixed_costs = {"spent_before_the_plan": round(spent, 1), "model_loads_exports": round(loads, 1)}
    if draw["overhead"] > overhead:
        plan.fixed_costs["source_mining"] = round(draw["overhead"] - overhead, 1)
    for s in stages:
        if s.trains and s.enabled(cfg):
            plan.fixed_costs.update(costs[s.name].parts)
    rest = round(plan.fixed_seconds - sum(plan.fixed_costs.values()), 1)
    if abs(rest) >= 0.1:  # what a stage's cost charges beyond its named parts (K-Means, refreshes), and rounding
        plan.fixed_costs["other"] = rest
    logger.info("recipe plan: fixed costs (s) %s", plan.fixed_costs)
    # a budget below one step of each stage is refused before any training
    step_s = {s.name: costs[s.name].step_s for s in stages if s.trains}
    check_budget_buys_steps(plan.to_dict(), one_step_costs(plan, step_s, cfg, stages))
    logger.info(
        "recipe plan for %.0f minutes of training: measured %s; %s; %.0f%% of the budget planned for optimizer "
        "steps (evaluation not included)",
        run.max_minutes,
        plan.throughput,
        ", ".join(f"{s.name} {plan.steps_of(s.name)} steps" for s in stages if s.trains and s.enabled(cfg)),
        100 * (plan.planned_optimizer_share or 0),
    )
    return plan


def make_plan(run: RecipeRun, stages: Sequence[Stage] | None = None) -> Plan:
    """Measure this machine's step times and size the stages to the budget (:func:`budget_plan`); the plan is kept
    in ``OUT/plan.json`` (written by rank 0). The runner takes it, with each stage's deadline
    (:func:`stage_deadlines`)."""
    from .. import distributed as D

    # every rank probes (a probe's steps are a distributed trainer's); rank 0's measurements plan them all
    plan = D.broadcast_object(_budgeted_plan(run, instantiate(stages)))
    if D.is_main():
        atomic_write_json(run.out / "plan.json", plan.to_dict())
    return plan
