"""The recipe's :class:`Plan`: the steps of each stage and, for a budgeted run, what the budget was spent on.

A plan is made by :mod:`hf_cocodr.recipe.planner` and kept as a dict with flat keys (``coco_steps``,
``finetune_steps``, ``refreshes``, ``budget_seconds``, ...) in ``OUT/plan.json`` and under ``"plan"`` in
``OUT/recipe.json``; :meth:`Plan.to_dict` and :meth:`Plan.from_dict` convert, so a run resumes from the plan an
earlier run saved. The fields a stage sets (``coco_runs``, ``refreshes``, ...: its
:attr:`~hf_cocodr.recipe.stage.Cost.plan`) are one mapping, :attr:`Plan.stage_fields`, whatever the stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# The budget block: present together in a budgeted plan (``planned_optimizer_share`` may be None: a zero budget).
_BUDGET_KEYS = ("budget_seconds", "fixed_seconds", "planned_optimizer_seconds", "planned_optimizer_share")


_NESTED = {"steps", "stage_fields"}  # kept as flat keys, not under their own names


@dataclass
class Plan:
    """What the recipe will train.

    Args:
        steps: optimizer steps of each training stage, by stage name (0: the stage does not train; for a stage
            trained in several runs, the steps of each run).
        stage_fields: what the stages set in the plan, by the names ``plan.json`` keeps them: the runs of a stage
            trained in several (``<name>_runs``, e.g. ``coco_runs``: COCO runs averaged into one encoder) and each
            stage's own (the source fine-tuning's ``refreshes``, ``refresh_seconds_each``, ``kmeans_seconds``).
        budget_seconds: the training budget (None: steps fixed, no budget and no deadlines).
        fixed_seconds: the budget's fixed costs (loads, exports, K-Means, refreshes), charged before the steps.
        planned_optimizer_seconds: planned seconds of all optimizer steps.
        planned_optimizer_share: those seconds as a share of the budget.
        source_queries: the source queries the budget's steps use (when the budget sized the draw).
        source_queries_available: the source queries the task has.
        mining_seconds_per_query: BM25 mining seconds per source query, as measured on the probe draw.
        max_minutes: the budget as given.
        throughput: measured seconds per step of each stage (``<stage>_step_s``) and per encoded document / query.
        measure_seconds: seconds the measurement took.
        fixed_costs: ``fixed_seconds`` one cost by one, by name: the seconds spent before the plan (loading the data,
            the probes), the model loads and exports, and each stage's own (e.g. the distillation teacher's corpus
            encoding, BM25 index and ranking of the queries), as measured here.
        identity: digest of the inputs the plan was made for (a resumed run with other inputs plans again).
    """

    steps: dict[str, int] = field(default_factory=dict)
    stage_fields: dict[str, Any] = field(default_factory=dict)
    budget_seconds: float | None = None
    fixed_seconds: float | None = None
    planned_optimizer_seconds: float | None = None
    planned_optimizer_share: float | None = None
    source_queries: int | None = None
    source_queries_available: int | None = None
    mining_seconds_per_query: float | None = None
    max_minutes: float | None = None
    throughput: dict[str, float] | None = None
    measure_seconds: float | None = None
    fixed_costs: dict[str, float] | None = None
    identity: str | None = None

    def steps_of(self, stage: str) -> int:
        """The planned optimizer steps of ``stage`` (0 when the plan gives it none)."""
        return int(self.steps.get(stage, 0))

    def runs_of(self, stage: str) -> int:
        """The runs ``stage``'s steps are trained in (``<stage>_runs``; 1 when the plan gives none)."""
        return int(self.stage_fields.get(f"{stage}_runs") or 1)

    @property
    def budgeted(self) -> bool:
        """Whether the plan spends a time budget measured on this machine (it then has deadlines)."""
        return bool(self.throughput) and self.budget_seconds is not None

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``plan.json`` / ``recipe.json`` keep it (flat keys: ``<stage>_steps`` per stage, then the
        stages' fields, then the plan's own)."""
        out: dict[str, Any] = {f"{stage}_steps": steps for stage, steps in self.steps.items()}
        out.update(self.stage_fields)
        if self.budget_seconds is not None:
            out.update({key: getattr(self, key) for key in _BUDGET_KEYS})
        for f in fields(self):
            if f.name not in out and f.name not in _NESTED and getattr(self, f.name) is not None:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """A plan from its dict (see :meth:`to_dict`): ``<stage>_steps`` keys are the steps, the plan's own keys its
        fields, and every other key a stage's field (so a plan written by any version, or with any stages, keeps
        them all)."""
        own = {f.name for f in fields(cls)} - _NESTED
        steps = {key.removesuffix("_steps"): int(v) for key, v in data.items() if key.endswith("_steps")}
        staged = {k: v for k, v in data.items() if k not in own and not k.endswith("_steps")}
        return cls(steps=steps, stage_fields=staged, **{k: v for k, v in data.items() if k in own})
