"""The :class:`Stage` interface of the recipe: what the planner and the runner ask of each stage.

A stage owns its settings (a dataclass :class:`~hf_cocodr.recipe.RecipeConfig` inherits, so its fields are recipe
options and flags), its trainer (:meth:`Stage.build_trainer`, which training and the step-time probe share), its
cost (:meth:`Stage.cost`: seconds a step, fixed seconds, model loads) and its identity (a finished stage whose
identity is unchanged is skipped on a re-run). Stages are instantiated per run, so what a stage keeps between its
hooks lives on the stage. The built-in stages are in :mod:`hf_cocodr.recipe.stages`, one module each.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from ..trainer_common import TrainerMixin
from .outputs import stopped
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


def unbudgeted_steps(runs: bool, fixed: int | None) -> int:
    """A stage's steps without a budget: 0 where it does not run, its ``fixed`` steps where set, else
    :data:`UNBUDGETED_STEPS`."""
    return 0 if not runs else (UNBUDGETED_STEPS if fixed is None else fixed)


# What a probe trainer changes in a stage's training arguments: it writes nothing that outlives the probe.
_PROBE_ARGUMENTS = dict(save_strategy="no", logging_strategy="no", logging_first_step=False, report_to="none")


@dataclass
class Cost:
    """Everything the planner, the deadlines and the budget checks know of a stage (they read nothing else of it).

    Attributes:
        step_s: seconds of one optimizer step (of each run).
        fixed_s: seconds beyond its steps (building its data, a teacher's rankings, clustering, refreshes), charged
            before the budget is split between the stages' steps; a planned stage's deadline leaves them to it.
        parts: ``fixed_s`` one cost by one, by name, where the stage names them (``plan.json``'s ``fixed_costs``;
            what it leaves unnamed is counted as ``other``).
        loads: model loads + exports the stage costs beyond its steps (the planner charges a load for each).
        share: its share of the budget (renormalised over the stages that run; set where a budget is planned).
        steps: the steps the settings fix (None: planned from the budget). Without a budget (``budget_s`` None):
            the steps the stage trains, 0 when it is off.
        runs: the runs its steps are trained in (each from the same start, their weights averaged; each run after
            the first costs a model load + export); None: as many runs of about ``run_steps`` steps as its seconds
            afford. The plan keeps the runs as ``<name>_runs`` where they are not 1.
        run_steps: with ``runs`` None, the length of one run.
        plan: the fields the stage sets in the plan (kept in ``plan.json`` by these names, e.g. ``refreshes``; a
            name ending in ``_steps`` would read back as a stage's steps).
    """

    step_s: float = 0.0
    fixed_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    loads: int = 0
    share: float = 1.0
    steps: int | None = None
    runs: int | None = 1
    run_steps: int | None = None
    plan: dict[str, Any] = field(default_factory=dict)


class Stage:
    """One stage of the recipe. A subclass sets :attr:`name` (and :attr:`settings`, its options) and
    :meth:`build_trainer`; the rest has defaults for a stage that trains ``<name>_steps`` optimizer steps (planned
    from the budget when unset), takes ``<name>_share`` of the budget (1 without such an option) and is always on.
    Its step is timed by the default :meth:`probe` on the trainer :meth:`build_trainer` returns, and the default
    :meth:`train` trains that trainer.

    The hooks (:data:`HOOKS`) are the methods a stage may override: :meth:`enabled`, :meth:`cost`, :meth:`probe`,
    :meth:`arguments`, :meth:`identity`, :meth:`build_trainer`, :meth:`train` and :meth:`check`. The other methods
    (:attr:`label`, :meth:`planned`, :meth:`run_trainer`, :meth:`training_arguments`) are helpers built on them,
    and the class attributes below are data.

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
        reads: the data the stage reads while it has to run, besides the target corpora: ``"source"`` (the
            labelled source task), with the option that must be true for it to be read (None: always).
        after_adaptation: whether the stage runs only where a stage before it changed the model (WiSE-FT: nothing
            adapted, nothing to interpolate).
        entries: what the stage writes into ``OUT`` besides its folder ``OUT/<name>`` (e.g. COCO's ``coco-runs``).
    """

    HOOKS: ClassVar[tuple[str, ...]] = (
        "enabled",
        "cost",
        "probe",
        "arguments",
        "identity",
        "build_trainer",
        "train",
        "check",
    )

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    settings: ClassVar[type | None] = None
    trains: ClassVar[bool] = True
    share_option: ClassVar[str | None] = None
    reads_target_queries: ClassVar[bool] = False
    draws_source: ClassVar[bool] = False
    reads: ClassVar[dict[str, str | None]] = {}
    after_adaptation: ClassVar[bool] = False
    entries: ClassVar[tuple[str, ...]] = ()

    @property
    def label(self) -> str:
        """How messages name the stage: its :attr:`title`, or its name."""
        return self.title or self.name

    # -------------------------------------------------------------------------------------------- the hooks
    def enabled(self, cfg: RecipeConfig) -> bool:
        """Whether the settings switch the stage on."""
        return True

    def cost(
        self,
        throughput: dict[str, float],
        cfg: RecipeConfig,
        *,
        budget_s: float | None = None,
        plan: Plan | None = None,
        **sizes: Any,
    ) -> Cost:
        """What the stage costs a budget of ``budget_s`` seconds (None: no budget, fixed steps), from the measured
        ``throughput`` and the sizes of the data it reads (``sizes``: what the planner knows, e.g. ``pool_docs``,
        ``n_queries``); ``plan``: the plan made (the deadlines ask what the planned stage costs, its plan fields as
        planned). By default: ``<name>_step_s`` a step, nothing fixed, ``<name>_steps`` fixed steps,
        ``share_option`` (or ``<name>_share``) its share."""
        fixed = getattr(cfg, f"{self.name}_steps", None)
        if budget_s is None and plan is None:  # no budget: the steps it trains
            fixed = unbudgeted_steps(self.enabled(cfg), fixed)
        cost = Cost(step_s=throughput.get(f"{self.name}_step_s", 0.0), steps=fixed)
        if budget_s is not None and plan is None:  # (only a budget is shared; the deadlines read no share)
            cost.share = float(getattr(cfg, self.share_option or f"{self.name}_share", 1.0))
        return cost

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Measured seconds of this stage's step (``<name>_step_s``): a few steps of the trainer
        :meth:`build_trainer` returns (on its device, in its precision, its collation included), timed by a
        callback (:func:`~hf_cocodr.recipe.probe.time_trainer_steps`); nothing for a stage without a trainer."""
        if type(self).build_trainer is Stage.build_trainer:
            return {}
        from .probe import time_trainer_steps

        return {f"{self.name}_step_s": time_trainer_steps(self, run)[0]}

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        """The stage's training arguments (the recipe's defaults under the user's options)."""
        return {}

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
        trained, the step a deadline stopped it at, ...), or None when the stage wrote its marker itself. By
        default the trainer :meth:`build_trainer` returns trains the plan's steps (:meth:`run_trainer`)."""
        return self.run_trainer(run, self.build_trainer(run, run.plan.steps_of(self.name)))

    def check(self, cfg: RecipeConfig, stages: Sequence[Stage]) -> None:
        """Refuse, before any work, settings of the run's ``stages`` this stage cannot run with (``ConfigError``);
        nothing by default."""

    # -------------------------------------------------------------------------------------------- helpers
    def planned(self, run: RecipeRun) -> bool:
        """Whether the stage is part of this run: switched on, and (a training stage) given steps by the plan."""
        return self.enabled(run.cfg) and (not self.trains or run.plan.steps_of(self.name) > 0)

    def run_trainer(self, run: RecipeRun, trainer, end: float | None = None) -> dict[str, Any]:
        """Train ``trainer`` (the stage's) by the stage's deadline (or the clock reading ``end``), resuming from its
        latest checkpoint when the run resumes, and save its model; returns the marker's content (the steps trained, and
        the step a deadline stopped it at)."""
        from transformers.trainer_utils import get_last_checkpoint

        guard = run.deadline(trainer, self.name, end)
        # the package's trainers resume from their latest complete checkpoint, or start afresh; another trainer (a
        # plain transformers Trainer) is asked to resume only where a checkpoint exists
        ours = isinstance(trainer, TrainerMixin)
        resume = run.resume and (ours or get_last_checkpoint(trainer.args.output_dir) is not None)
        trainer.train(resume_from_checkpoint=True if resume else None)
        if hasattr(trainer, "finalize"):  # (the package's trainers export the model)
            trainer.finalize()
        else:
            trainer.save_model()
        return {"steps": trainer.state.global_step, **stopped(guard)}

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


def split_runs(
    seconds: float, step_s: float, runs: int | None, run_steps: int | None, given_steps: int | None, load_s: float
) -> tuple[int, int | None]:
    """``(runs, steps of each run)`` for ``seconds`` of a stage trained in runs (steps None: as planned for one run).

    ``runs`` None: as many runs of about ``run_steps`` steps (``given_steps`` when given) as fit, at least one; the
    seconds are then shared out evenly, so a run may come out somewhat shorter or longer than ``run_steps`` and the
    budget is spent. A whole number of runs shares the seconds between that many. Every run after the first costs a
    model load + export (``load_s``) of the seconds."""
    step_s = max(step_s, 1e-9)
    if runs is None:
        per_run = (given_steps or run_steps) * step_s + load_s
        runs = max(1, round((seconds + load_s) / per_run))
    if given_steps is not None:
        return runs, given_steps
    if runs == 1:
        return 1, None
    return runs, max(2, int((seconds - (runs - 1) * load_s) / (runs * step_s)))


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
