"""The :class:`Stage` interface of the recipe: what the planner and the runner ask of each stage.

A stage says whether it runs (its switch in :class:`~hf_cocodr.recipe.RecipeConfig`), what share of the budget it
gets and what one of its steps costs, which training arguments it uses, what its result depends on (its identity: a
finished stage whose identity is unchanged is skipped on a re-run), and how it trains. The built-in stages are in
:mod:`hf_cocodr.recipe.stages`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .config import RecipeConfig, no_gpu
from .context import RecipeRun
from .plan import Plan

# Training arguments that do not change what a stage computes (left out of its identity).
_NOT_TRAJECTORY = (
    "output_dir",
    "logging_steps",
    "logging_first_step",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "disable_tqdm",
    "report_to",
    "use_cpu",
)
UNBUDGETED_STEPS = 500  # a stage's steps without a budget and without fixed steps


class Stage:
    """One stage of the recipe. Subclasses set :attr:`name` and implement :meth:`train`; the other hooks have
    defaults for a stage that trains ``<name>_steps`` optimizer steps and is always on.

    Attributes:
        name: the stage's name: its folder ``OUT/<name>``, its key in the plan (``<name>_steps``), the record and
            the throughput (``<name>_step_s``).
        trains: whether the stage trains optimizer steps the budget pays for (WiSE-FT does not: it only writes).
        share_option: the :class:`~hf_cocodr.recipe.RecipeConfig` field holding its share of the budget (None: a
            share of 1).
        reads_target_queries: whether the stage trains on the unlabelled ``target_queries`` when it runs.
    """

    name: ClassVar[str] = ""
    trains: ClassVar[bool] = True
    share_option: ClassVar[str | None] = None
    reads_target_queries: ClassVar[bool] = False

    # -------------------------------------------------------------------------------------------- the switch
    def enabled(self, cfg: RecipeConfig) -> bool:
        """Whether the settings switch the stage on."""
        return True

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        """The steps the settings fix (None: planned from the budget)."""
        return None

    def planned(self, run: RecipeRun) -> bool:
        """Whether the stage is part of this run: switched on, and (a training stage) given steps by the plan."""
        return self.enabled(run.cfg) and (not self.trains or run.plan.steps_of(self.name) > 0)

    def should_run(self, run: RecipeRun) -> bool:
        """Whether the runner runs (or skips as finished) the stage now."""
        return self.planned(run)

    # -------------------------------------------------------------------------------------------- the budget
    def share(self, cfg: RecipeConfig) -> float:
        """The stage's share of the training budget (renormalised over the stages that run)."""
        return float(getattr(cfg, self.share_option)) if self.share_option else 1.0

    def step_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        """Seconds of one optimizer step, from the measured ``throughput``."""
        return throughput.get(f"{self.name}_step_s", 0.0)

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Measured seconds this stage adds to the throughput (``<name>_step_s``); the built-in stages are timed
        together by :func:`~hf_cocodr.recipe.measure_throughput`, which loads the model once."""
        return {}

    def fixed_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        """Seconds the stage spends beyond its steps (building its data, say), from the measured ``throughput``;
        charged before the budget is split between the stages' steps, and part of the stage's deadline."""
        return 0.0

    def unbudgeted_steps(self, cfg: RecipeConfig) -> int:
        """The stage's steps in a run without a budget: the fixed steps, or :data:`UNBUDGETED_STEPS` (0: off)."""
        fixed = self.fixed_steps(cfg)
        return 0 if not self.enabled(cfg) else (UNBUDGETED_STEPS if fixed is None else fixed)

    def allot(self, plan: Plan, seconds: float, step_s: float, cfg: RecipeConfig, load_s: float) -> None:
        """Set the stage's steps in ``plan`` for ``seconds`` of training at ``step_s`` a step (its fixed steps
        when it has them; at least 2). ``load_s``: the seconds of one model load + export."""
        fixed = self.fixed_steps(cfg)
        plan.steps[self.name] = fixed if fixed is not None else max(2, int(seconds / step_s))

    def optimizer_seconds(self, plan: Plan, step_s: float) -> float:
        """Planned seconds of the stage's optimizer steps."""
        return plan.steps_of(self.name) * step_s

    def planned_seconds(self, plan: Plan, step_s: float, load_s: float) -> float:
        """Planned wall-clock seconds of the stage (its steps and its own fixed costs), for the deadlines."""
        return plan.steps_of(self.name) * step_s

    def load_exports(self, cfg: RecipeConfig) -> int:
        """Model loads + exports the stage costs beyond its steps (charged by the planner)."""
        return 0

    # -------------------------------------------------------------------------------------------- the run
    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        """The stage's training arguments (the recipe's defaults under the user's options)."""
        return {}

    def needs(self, run: RecipeRun) -> set[str]:
        """The data the stage still has to read: ``"source"`` (the labelled source task), ``"target_pairs"``,
        ``"spans"`` (COCO's span corpus); nothing once it finished."""
        return set()

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        """What the stage's result depends on (``start``: the identity of the model it starts from)."""
        return {"stage": self.name, "start": start, "steps": run.plan.steps_of(self.name)}

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        """Train from ``run.current`` into ``run.dir(self.name)``; returns the completion marker's content (steps
        trained, the step a deadline stopped it at, ...), or None when the stage wrote its marker itself."""
        raise NotImplementedError


def run_arguments(run: RecipeRun, name: str, *, logging_steps: int, save_steps: int) -> dict[str, Any]:
    """The training arguments every stage's trainer takes from the run: its folder ``OUT/<name>``, the seed,
    logging and checkpointing every ``logging_steps`` / ``save_steps`` steps (the latest checkpoint kept), no
    reporting, no progress bar, and the CPU where there is no GPU."""
    return dict(
        output_dir=str(run.dir(name)),
        seed=run.cfg.seed,
        report_to="none",
        logging_steps=logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,
        use_cpu=no_gpu(),
        disable_tqdm=True,
    )


def settings(kw: dict[str, Any]) -> dict[str, Any]:
    """The training arguments that change what a stage computes, sorted (part of its identity)."""
    return {k: v for k, v in sorted(kw.items()) if k not in _NOT_TRAJECTORY}


def source_identity(run: RecipeRun) -> dict[str, Any]:
    """The source task data as the stages that read it draw it."""
    cfg, plan = run.cfg, run.plan
    return {
        "data": run.fps["source"],
        "split": cfg.source_split,
        "max_queries": plan.source_queries if plan.source_queries is not None else cfg.max_queries,
        "corpus_pool": cfg.corpus_pool,
        "seed": cfg.seed,
    }
