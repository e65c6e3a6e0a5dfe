"""The recipe's stages, one module each (its settings, its trainer, its cost and its probe): COCO (one run or a soup
of runs, :mod:`.coco`), fine-tuning on the source task (:mod:`.finetune`), distillation of the hybrid teacher
(:mod:`.distill`) and WiSE-FT (:mod:`.wise`); :data:`STAGES`, their order.

The runner goes through the stages in order; each starts from the model the stage before it wrote (``run.current``)
and writes into ``OUT/<name>``, with a completion marker (``hf_cocodr_stage.json``) once it finished. A new stage is
a :class:`~hf_cocodr.recipe.stage.Stage` subclass plus one entry in :data:`STAGES` (or in the ``stages`` argument
of :func:`~hf_cocodr.recipe.run_recipe`). Stages are instantiated per run (:func:`instantiate`).

These modules import neither torch nor transformers until a stage trains.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...errors import ConfigError
from ..plan import Plan
from ..stage import Stage
from .coco import MLM_HEAD_WARMUP_SHARE, CocoStage
from .distill import DISTILL_MAX_PASSES, DistillStage
from .finetune import FINETUNE_PRESETS, FinetuneStage, refresh_interval
from .wise import WiseStage

if TYPE_CHECKING:
    from ..config import RecipeConfig

# The recipe's stages, in order: the one list of them. A new stage: a Stage subclass and one line here.
STAGES: tuple[type[Stage], ...] = (CocoStage, FinetuneStage, DistillStage, WiseStage)
# The settings of the built-in stages, in their order (RecipeConfig inherits them).
STAGE_SETTINGS: tuple[type, ...] = tuple(s.settings for s in STAGES if s.settings is not None)

__all__ = [
    "DISTILL_MAX_PASSES",
    "FINETUNE_PRESETS",
    "MLM_HEAD_WARMUP_SHARE",
    "STAGES",
    "STAGE_SETTINGS",
    "CocoStage",
    "DistillStage",
    "FinetuneStage",
    "WiseStage",
    "instantiate",
    "refresh_interval",
    "stage_step_seconds",
    "stage_switches",
]


def instantiate(stages: Iterable[Stage | type[Stage]] | None = None) -> tuple[Stage, ...]:
    """The stages of one run: each class instantiated (a stage keeps its state on itself), instances as given; an
    entry that is neither a :class:`Stage` subclass nor an instance of one is refused (``ConfigError``)."""
    out = []
    for i, s in enumerate(STAGES if stages is None else stages):
        if isinstance(s, type) and issubclass(s, Stage):
            s = s()
        elif not isinstance(s, Stage):
            raise ConfigError(
                f"stage list entry stages[{i}] = {repr(s)[:80]} is not a Stage: give a Stage subclass or an instance "
                "of one (hf_cocodr.recipe.Stage)"
            )
        out.append(s)
    return tuple(out)


def stage_switches(cfg: RecipeConfig, stages=None) -> dict[str, tuple[bool, int | None]]:
    """Whether each training stage runs, and its fixed step count (None: planned from the budget; its
    :meth:`~hf_cocodr.recipe.Stage.cost` says)."""
    return {s.name: (s.enabled(cfg), s.cost({}, cfg, plan=Plan()).steps) for s in instantiate(stages) if s.trains}


def stage_step_seconds(tp: dict[str, float], cfg: RecipeConfig, stages=None) -> dict[str, float]:
    """Measured seconds of one optimizer step of each training stage (its :meth:`~hf_cocodr.recipe.Stage.cost`)."""
    return {s.name: s.cost(tp, cfg, plan=Plan()).step_s for s in instantiate(stages) if s.trains}
