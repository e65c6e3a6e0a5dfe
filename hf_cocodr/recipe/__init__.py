"""The adaptation recipe in one call: COCO on the target corpora, fine-tuning on the source labels, distillation of
the hybrid teacher on unlabelled target queries (or pseudo-queries of the corpora), WiSE-FT, then export, card and
evaluation of the adapted and the starting model.

- :mod:`~hf_cocodr.recipe.config`: :class:`RecipeConfig` (torch-free: the command line builds its flags from it),
  which inherits each stage's settings; :mod:`~hf_cocodr.recipe.settings`: what settings are made of.
- :mod:`~hf_cocodr.recipe.schedules`: what ``"auto"`` settings resolve to for each kind of starting model.
- :mod:`~hf_cocodr.recipe.stage`: the :class:`Stage` interface (settings, trainer, cost, probe, identity);
  :mod:`~hf_cocodr.recipe.stages`: one module per stage (``coco``, ``finetune``, ``distill``, ``wise``)
  and :data:`STAGES`, their order.
- :mod:`~hf_cocodr.recipe.plan` / :mod:`~hf_cocodr.recipe.planner` / :mod:`~hf_cocodr.recipe.probe`: the
  :class:`Plan`, how a time budget is spent on each stage's steps and deadlines, and the step-time probe (the
  stage's own trainer, timed by a callback).
- :mod:`~hf_cocodr.recipe.context`: :class:`RecipeRun`, the state the stages share; :mod:`~hf_cocodr.recipe.inputs`
  / :mod:`~hf_cocodr.recipe.outputs`: the data the stages share and what a run writes besides trainer output.
- :mod:`~hf_cocodr.recipe.runner`: :func:`run_recipe`, which runs the stages in order and writes the records.

Names are imported lazily, so ``hf_cocodr.recipe.config`` loads without the training stack.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Auto": "config",
    "RecipeArguments": "config",
    "RecipeConfig": "config",
    "check_max_minutes": "config",
    "uses_wise": "config",
    "PAPER_SCHEDULE": "schedules",
    "SCHEDULES": "schedules",
    "choose_schedule": "schedules",
    "MLM_HEAD_WARMUP_SHARE": "stages",
    "STAGES": "stages",
    "Stage": "stage",
    "Cost": "stage",
    "CocoStage": "stages",
    "DistillStage": "stages",
    "FinetuneStage": "stages",
    "WiseStage": "stages",
    "STAGE_SETTINGS": "stages",
    "stage_switches": "stages",
    "stage_step_seconds": "stages",
    "Plan": "plan",
    "STAGE_LOAD_SECONDS": "planner",
    "NO_BUDGET_COCO_RUNS": "planner",
    "budget_plan": "planner",
    "size_source_queries": "planner",
    "stage_deadlines": "planner",
    "SIZE_PROBE_QUERIES": "inputs",
    "StepTimer": "probe",
    "time_trainer_steps": "probe",
    "STAGE_MARKER": "outputs",
    "RecipeRun": "context",
    "RECIPE_ENTRIES": "runner",
    "run_recipe": "runner",
    "split_hybrid": "runner",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_cocodr.recipe' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__():
    return __all__
