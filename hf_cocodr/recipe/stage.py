"""The :class:`Stage` interface of the recipe: what the planner and the runner ask of each stage.

A stage owns its settings (a dataclass :class:`~hf_cocodr.recipe.RecipeConfig` inherits, so its fields are recipe
options and flags), its trainer (:meth:`Stage.build_trainer`, which training and the step-time probe share), its
cost (:meth:`Stage.cost`: seconds a step, fixed seconds, model loads) and its identity (a finished stage whose
identity is unchanged is skipped on a re-run). Stages are instantiated per run, so what a stage keeps between its
hooks lives on the stage. The built-in stages are in :mod:`hf_cocodr.recipe.stages`, one module each.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConfigError
from .settings import no_gpu

if TYPE_CHECKING:
    from .config import RecipeConfig
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
# What a probe trainer changes in a stage's training arguments: it writes nothing that outlives the probe.
_PROBE_ARGUMENTS = dict(save_strategy="no", logging_strategy="no", logging_first_step=False, report_to="none")


@dataclass
class Cost:
    """What a stage costs the budget: ``step_s`` seconds an optimizer step, ``fixed_s`` seconds beyond its steps
    (building its data, a teacher's rankings, clustering; charged before the budget is split between the stages'
    steps), ``loads`` model loads + exports, and the ``plan`` fields it sets (``refreshes``, ...)."""

    step_s: float = 0.0
    fixed_s: float = 0.0
    loads: int = 0
    plan: dict[str, Any] = field(default_factory=dict)


class Stage:
    """One stage of the recipe. A subclass sets :attr:`name` (and :attr:`settings`, its options) and implements
    :meth:`build_trainer` and :meth:`train`; the other hooks have defaults for a stage that trains
    ``<name>_steps`` optimizer steps (planned from the budget when unset), takes ``<name>_share`` of the budget
    (1 without such an option) and is always on. Its step is timed by the default :meth:`probe` on the trainer
    :meth:`build_trainer` returns.

    Attributes:
        name: the stage's name: its folder ``OUT/<name>``, its key in the plan (``<name>_steps``), the record and
            the throughput (``<name>_step_s``).
        title: how messages name it (default: its name).
        settings: the dataclass of the stage's options (``<name>_steps``, ``<name>_share``, ...) with a ``check``
            method; :class:`~hf_cocodr.recipe.RecipeConfig` inherits it (None: no options).
        trains: whether the stage trains optimizer steps the budget pays for (WiSE-FT does not: it only writes).
        share_option: the option holding its share of the budget (default ``<name>_share`` where the settings
            have it; a share of 1 otherwise).
        reads_target_queries: whether the stage trains on the unlabelled ``target_queries`` when it runs.
        draws_source: whether the stage trains on the labelled source task (a budget sizes the source draw to its
            steps).
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    settings: ClassVar[type | None] = None
    trains: ClassVar[bool] = True
    share_option: ClassVar[str | None] = None
    reads_target_queries: ClassVar[bool] = False
    draws_source: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """How messages name the stage: its :attr:`title`, or its name."""
        return self.title or self.name

    # -------------------------------------------------------------------------------------------- the switch
    def enabled(self, cfg: RecipeConfig) -> bool:
        """Whether the settings switch the stage on."""
        return True

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        """The steps the settings fix (``<name>_steps``; None: planned from the budget)."""
        return getattr(cfg, f"{self.name}_steps", None)

    def planned(self, run: RecipeRun) -> bool:
        """Whether the stage is part of this run: switched on, and (a training stage) given steps by the plan."""
        return self.enabled(run.cfg) and (not self.trains or run.plan.steps_of(self.name) > 0)

    def should_run(self, run: RecipeRun) -> bool:
        """Whether the runner runs (or skips as finished) the stage now."""
        return self.planned(run)

    # -------------------------------------------------------------------------------------------- the budget
    def share(self, cfg: RecipeConfig) -> float:
        """The stage's share of the training budget (renormalised over the stages that run)."""
        option = self.share_option or f"{self.name}_share"
        return float(getattr(cfg, option, 1.0))

    def step_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        """Seconds of one optimizer step, from the measured ``throughput``."""
        return throughput.get(f"{self.name}_step_s", 0.0)

    def fixed_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        """Seconds the stage spends beyond its steps (building its data, say), from the measured ``throughput``."""
        return 0.0

    def fixed_parts(self, throughput: dict[str, float], cfg: RecipeConfig) -> dict[str, float]:
        """:meth:`fixed_seconds` one cost by one, by name (for ``plan.json``'s ``fixed_costs``); by default one
        entry, ``<name>``, where the stage has fixed costs."""
        seconds = self.fixed_seconds(throughput, cfg)
        return {self.name: round(seconds, 2)} if seconds else {}

    def load_exports(self, cfg: RecipeConfig) -> int:
        """Model loads + exports the stage costs beyond its steps (charged by the planner)."""
        return 0

    def cost(self, throughput: dict[str, float], cfg: RecipeConfig, *, budget_s: float, **sizes: Any) -> Cost:
        """What the stage costs the budget of ``budget_s`` seconds, from the measured ``throughput`` and the sizes of
        the data it reads (``sizes``: what the planner knows, e.g. ``pool_docs``, ``n_queries``); the planner,
        the deadlines and the budget checks use nothing else. Built from :meth:`step_seconds`,
        :meth:`fixed_seconds` and :meth:`load_exports`."""
        return Cost(self.step_seconds(throughput, cfg), self.fixed_seconds(throughput, cfg), self.load_exports(cfg))

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Measured seconds of this stage's step (``<name>_step_s``): a few steps of the trainer
        :meth:`build_trainer` returns (on its device, in its precision, its collation included), timed by a
        callback (:func:`~hf_cocodr.recipe.probe.time_trainer_steps`); nothing for a stage without a trainer."""
        if type(self).build_trainer is Stage.build_trainer:
            return {}
        from .probe import time_trainer_steps

        return {f"{self.name}_step_s": time_trainer_steps(self, run)[0]}

    def unbudgeted_steps(self, cfg: RecipeConfig) -> int:
        """The stage's steps in a run without a budget: the fixed steps, or :data:`UNBUDGETED_STEPS` (0: off)."""
        fixed = self.fixed_steps(cfg)
        return 0 if not self.enabled(cfg) else (UNBUDGETED_STEPS if fixed is None else fixed)

    def allot(self, plan: Plan, seconds: float, step_s: float, cfg: RecipeConfig, load_s: float) -> None:
        """Set the stage's steps in ``plan`` for ``seconds`` of training at ``step_s`` a step (its fixed steps
        when it has them; at least 2). ``load_s``: the seconds of one model load + export."""
        fixed = self.fixed_steps(cfg)
        if fixed is None and not step_s > 0:
            raise ConfigError(
                f"stage {self.name}: no step time was measured, so the budget cannot be spent on its steps; give the "
                f"stage a trainer (build_trainer) or a probe, or fix its steps ({self.name}_steps)"
            )
        plan.steps[self.name] = fixed if fixed is not None else max(2, int(seconds / step_s))

    def one_step(self, plan: Plan, step_s: float, load_s: float) -> tuple[float, str]:
        """The seconds the stage's first step costs the budget, and how they are made up (for the check that a
        budget buys one step of every stage)."""
        return step_s, f"{step_s:.2f} s per step"

    def optimizer_seconds(self, plan: Plan, step_s: float) -> float:
        """Planned seconds of the stage's optimizer steps."""
        return plan.steps_of(self.name) * step_s

    def planned_seconds(self, plan: Plan, step_s: float, load_s: float) -> float:
        """Planned wall-clock seconds of the stage (its steps and its own fixed costs), for the deadlines."""
        return plan.steps_of(self.name) * step_s

    # -------------------------------------------------------------------------------------------- the run
    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        """The stage's training arguments (the recipe's defaults under the user's options)."""
        return {}

    def needs(self, run: RecipeRun) -> set[str]:
        """The data the stage still has to read: ``"source"`` (the labelled source task), ``"target_pairs"``;
        nothing once it finished."""
        return set()

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        """What the stage's result depends on (``start``: the identity of the model it starts from)."""
        return {"stage": self.name, "start": start, "steps": run.plan.steps_of(self.name)}

    def build_trainer(self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False):
        """The stage's trainer for ``max_steps`` steps from ``run.current`` into ``output_dir`` (default
        ``OUT/<name>``). :meth:`train` trains with it and :meth:`probe` times its steps: ``probe=True`` asks for
        a trainer that writes nothing beyond ``output_dir`` (a temporary folder) and may train on a sample of the
        stage's data of the same shape."""
        raise NotImplementedError

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        """Train from ``run.current`` into ``run.dir(self.name)``; returns the completion marker's content (steps
        trained, the step a deadline stopped it at, ...), or None when the stage wrote its marker itself."""
        raise NotImplementedError

    # -------------------------------------------------------------------------------------------- helpers
    def training_arguments(
        self, run: RecipeRun, cls: type, max_steps: int, *, output_dir=None, probe=False, forced=None, **defaults
    ):
        """``cls`` (the stage's arguments class) from the stage's arguments (over ``defaults``, under ``forced``)
        for ``max_steps`` steps into ``output_dir`` (default ``OUT/<name>``); a probe's write nothing that outlives
        the probe."""
        values = {**defaults, **run.arguments.get(self.name, {}), **(forced or {}), "max_steps": max_steps}
        names = {f.name for f in fields(cls)}
        if "overwrite_output_dir" in names:  # (the package's arguments classes: this stage's folder is its own)
            values["overwrite_output_dir"] = True
        if output_dir is not None:
            values["output_dir"] = str(output_dir)
        if probe:
            values.update(_PROBE_ARGUMENTS)
        # (an arguments class with ``from_arguments`` takes the fields it has, e.g. the distillation's)
        return cls.from_arguments(values) if hasattr(cls, "from_arguments") else cls(**values)


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


def trajectory(kw: dict[str, Any]) -> dict[str, Any]:
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
