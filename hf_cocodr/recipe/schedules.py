"""The schedule presets: the settings an ``"auto"`` value of :class:`~hf_cocodr.recipe.RecipeConfig` resolves to,
by the kind of starting model. Why each preset is what it is: ``docs/adaptation.md`` (and the studies it links)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import Any

from ..errors import ConfigError
from .config import AUTO, Auto, RecipeConfig
from .settings import no_gpu
from .stage import Stage
from .stages import MLM_HEAD_WARMUP_SHARE, STAGE_SETTINGS, instantiate
from .stages.distill import DISTILL_MAX_PASSES, QUERIES_MAX_PASSES, resolve_distill_side

# COCO-DR's own stages: COCO with masked-LM through the Condenser head, then iDRO on the source task.
PAPER_SCHEDULE: dict[str, Any] = dict(
    skip_coco=False,
    coco_mlm_weight=1.0,
    coco_learning_rate=2e-5,
    coco_runs=1,
    skip_finetune=False,
    wise_alpha=None,
    coco_share=0.4,
    finetune_share=0.6,
    finetune_preset="paper",
    skip_distill=True,
    distill_share=0.0,
    distill_teacher_weight=0.5,
    distill_max_passes=DISTILL_MAX_PASSES,
    pseudo_queries=0,
)

# By the kind of starting model. A value the user sets explicitly always wins over these.
# the pseudo-queries a head-less model's corpus-only schedule draws (split among the target corpora by size): three
# passes over them fill about 15 minutes of one core with native bf16 (docs/adaptation.md)
CORPUS_PSEUDO_QUERIES = 8000

SCHEDULES: dict[str, dict[str, Any]] = {
    # No MLM head (an already trained retriever such as all-MiniLM-L6-v2), with no pseudo-queries (pseudo_queries 0)
    # or no distillation (skip_distill true): COCO alone, spent as a soup of runs of about 76 steps (MLM through a
    # fresh Condenser head warmed up first), no source fine-tuning; the corpus-only default before issue 53.
    "no_mlm_head_soup": dict(
        PAPER_SCHEDULE, coco_runs=Auto.BUDGET, skip_finetune=True, coco_share=1.0, finetune_share=0.0
    ),
    # A trained MLM head (BERT, Condenser, COCO-DR checkpoints): COCO, then the plain contrastive fine-tune (the
    # paper-setting ablation's best arm; docs/adaptation.md).
    "mlm_head": dict(PAPER_SCHEDULE, finetune_preset="uniform"),
}
# No MLM head and unlabelled target queries given (--target-queries): the whole budget on distilling the hybrid
# teacher (the starting model + BM25) into the model, no COCO (docs/adaptation.md links the study).
# The teacher is the hybrid fitted to each corpus (the saved hybrid's fusion), not the fixed z-score fusion at 0.5:
# issue 49's screen, docs/adaptation.md. At most 5 passes over the user's queries where the query
# side trains (the whole model keeps 3, the most measured there): with the fitted teacher the query encoder
# under-fits its own queries at 3 (docs/adaptation.md).
SCHEDULES["no_mlm_head_queries"] = dict(
    SCHEDULES["no_mlm_head_soup"],
    skip_coco=True,
    coco_share=0.0,
    skip_distill=False,
    distill_share=1.0,
    distill_teacher_weight="fit",
    distill_max_passes=QUERIES_MAX_PASSES,
)
# No MLM head and the corpus alone: the same distillation on pseudo-queries drawn from the target corpora, its query
# route then interpolated with the start's at CORPUS_WISE_ALPHA (WiSE-FT; the corpus-only study's best arm,
# docs/adaptation.md "Adaptation from the corpus alone").
CORPUS_WISE_ALPHA = 0.75
SCHEDULES["no_mlm_head"] = dict(
    SCHEDULES["no_mlm_head_queries"],
    pseudo_queries=CORPUS_PSEUDO_QUERIES,
    wise_alpha=CORPUS_WISE_ALPHA,
    distill_teacher_weight=0.5,
    distill_max_passes=DISTILL_MAX_PASSES,
)


def choose_schedule(
    cfg: RecipeConfig,
    has_mlm_head: bool | None,
    stages: Sequence[Stage | type[Stage]] | None = None,
    *,
    plain_corpora: Sequence[str] = (),
) -> tuple[RecipeConfig, dict[str, Any]]:
    """Resolve every ``"auto"`` setting of ``cfg`` from :data:`SCHEDULES` by the kind of starting model, for the
    run's ``stages`` (default :data:`~hf_cocodr.recipe.stages.STAGES`).

    Returns the resolved config and a record of the choice (the kind, why, and which of the run's options were
    chosen vs set by the user: the recipe's own and its stages' settings) for the log, ``recipe.json`` and the model
    card. ``schedule="paper"`` resolves "auto" to COCO-DR's stages for every kind (COCO with MLM -> iDRO; no WiSE-FT,
    no distillation). A model without an MLM head given unlabelled target queries gets
    ``no_mlm_head_queries`` (the distillation alone), one given the corpus alone ``no_mlm_head`` (the distillation on
    pseudo-queries drawn from it), or ``no_mlm_head_soup`` (the COCO soup) where ``pseudo_queries`` is 0,
    ``skip_distill`` true or the run has no distillation stage, or where a target corpus is plain texts without
    document ids (``plain_corpora``: nothing to draw a pseudo-query from and rank) and ``pseudo_queries`` is left to
    the schedule. The shares and the side the distillation trains are resolved against the run's stages.
    """
    stages = instantiate(stages)
    options = run_options(stages)
    kind, why = _kind(cfg, has_mlm_head, distills="skip_distill" in options, plain_corpora=plain_corpora)
    preset = SCHEDULES[kind] if cfg.schedule == AUTO else PAPER_SCHEDULE
    chosen, user = {}, {}
    values = asdict(cfg)
    if values["finetune_preset"] == AUTO and "idro_preset" in values["finetune"]:  # finetune: {idro_preset: ...}
        values["finetune_preset"] = values["finetune"]["idro_preset"]
    for key, default in preset.items():
        if values[key] == AUTO:
            values[key] = default
            if key in options:
                chosen[key] = _plain(default)
        elif key in options:
            user[key] = _plain(values[key])
    resolved = type(cfg)(**values)
    distills = "skip_distill" in options and resolved.skip_distill is False
    if distills and not resolved.target_queries and not resolved.pseudo_queries:
        raise ConfigError(
            f"recipe option skip_distill is false but the distillation has nothing to train on: no target queries, and "
            f"the {kind} schedule draws no pseudo-queries; give --target-queries or --pseudo-queries N"
        )
    _share_switched_on_stages(resolved, chosen, stages)
    record = {"kind": kind, "why": why, "schedule": cfg.schedule, "chosen": chosen, "set_by_user": user}
    named = [s.name for s in stages]
    if resolved.distill_side == AUTO and "distill" in named:  # the query side where it can on a CPU
        side, side_why = resolve_distill_side(resolved, stages, on_gpu=not no_gpu())
        resolved.distill_side = side
        if not resolved.skip_distill:
            chosen["distill_side"] = side
            record["distill_side"] = side_why
    if resolved.distill_side == "full" and "distill_max_passes" in chosen:  # more than 3 passes: the query side's
        resolved.distill_max_passes = chosen["distill_max_passes"] = min(
            resolved.distill_max_passes, DISTILL_MAX_PASSES
        )
    if has_mlm_head is not True and "skip_coco" in options and not resolved.skip_coco:  # a fresh head, warmed up
        record["mlm_head"] = (
            f"fresh: it trains alone for the first {MLM_HEAD_WARMUP_SHARE:.0%} of COCO's steps when COCO uses MLM"
        )
    return resolved, record


def run_options(stages: Sequence[Stage]) -> set[str]:
    """The options of a run with ``stages``: the recipe's own (those of no built-in stage's settings) and those of
    the stages' settings."""
    builtin = {f.name for settings in STAGE_SETTINGS for f in fields(settings)}
    own = {f.name for f in fields(RecipeConfig)} - builtin
    return own | {f.name for s in stages if s.settings is not None for f in fields(s.settings)}


def _kind(
    cfg: RecipeConfig, has_mlm_head: bool | None, distills: bool, plain_corpora: Sequence[str] = ()
) -> tuple[str, str]:
    """The kind of starting model (the :data:`SCHEDULES` key) and why; ``distills``: whether the run has a
    distillation stage; ``plain_corpora``: the target corpora without document ids."""
    kind = "mlm_head" if has_mlm_head else "no_mlm_head"
    why = (
        "the starting model has a trained MLM head"
        if has_mlm_head
        else "the starting model has no MLM head"
        if has_mlm_head is False
        else "the starting model's MLM head could not be inspected (treated as absent)"
    )
    if kind == "no_mlm_head":
        if not distills:  # (the why names no stage the run does not have)
            kind = "no_mlm_head_soup"
        elif cfg.target_queries:
            kind, why = "no_mlm_head_queries", f"{why}, and unlabelled target queries are given"
        elif cfg.pseudo_queries == 0 or cfg.skip_distill is True:
            asked = "pseudo_queries 0" if cfg.pseudo_queries == 0 else "skip_distill true"
            kind, why = "no_mlm_head_soup", f"{why}, and no distillation on pseudo-queries ({asked})"
        elif plain_corpora and cfg.pseudo_queries == AUTO:
            kind = "no_mlm_head_soup"
            why = (
                f"{why}, and {', '.join(plain_corpora)}: plain texts without document ids, so no pseudo-query is drawn"
            )
        else:
            why = f"{why}, and no query is given: the distillation on pseudo-queries drawn from the target corpora"
    return kind, why


def _plain(value: Any) -> Any:
    """A setting as the record keeps it: an :class:`Auto` member as its string."""
    return str(value) if isinstance(value, Auto) else value


def _share_switched_on_stages(cfg: RecipeConfig, chosen: dict[str, Any], stages: Sequence[Stage]) -> None:
    """Give a budget share to a stage the user switched on that the schedule leaves out.

    The schedule's share for a stage it does not run is 0 (the default gives none to the distillation of a model with
    an MLM head); a user who switches it on (``skip_distill: false``) without a share would get 2 steps. A stage that runs with an automatic
    share of 0 gets the mean of the other running stages' shares (1 when it runs alone); the value is recorded as
    chosen. A share of 0 the user gave to a stage that runs and has no fixed step count is refused."""
    planned = [
        s.share_option
        for s in stages
        if s.trains and s.share_option and s.enabled(cfg) and s.cost({}, cfg, budget_s=0.0).steps is None
    ]
    for key in planned:
        if float(getattr(cfg, key)) == 0.0 and key not in chosen:
            stage = key.removesuffix("_share")
            raise ConfigError(
                f"recipe option {key} is 0 but the {stage} stage runs: it would get no budget; give it "
                f"a share > 0, fix its steps ({stage}_steps), or switch the stage off"
            )
    others = [float(getattr(cfg, k)) for k in planned if float(getattr(cfg, k)) > 0]
    for key in planned:
        if float(getattr(cfg, key)) == 0.0:
            share = round(sum(others) / len(others), 6) if others else 1.0
            setattr(cfg, key, share)
            chosen[key] = share
