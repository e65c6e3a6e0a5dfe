"""Checks :func:`hf_cocodr.recipe.run_recipe` makes before any training: the target corpora and the distillation's
inputs (before the output folder is claimed or any model loads), token lengths against the model's position limit,
and a budget (``max_minutes``) against the fixed costs and the cost of one step of each training stage."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..modeling.limits import check_lengths


def check_source_needed(source_data, cfg: Any, choice: dict[str, Any], stages) -> None:
    """Without source data, refuse (naming the stage and the schedule) a run whose switched-on stage fine-tunes on the
    labelled source task; a stage that reads the source corpus only where an option asks (COCO's
    ``include_source_corpus``) trains on the target corpora alone."""
    if source_data is not None:
        return
    for stage in stages:
        if stage.enabled(cfg) and (stage.draws_source or "source" in stage.reads and stage.reads["source"] is None):
            raise ConfigError(
                f"the {stage.label} stage of the {choice['kind']} schedule trains on the labelled source task, and no "
                f"source data is given: add --source-data (a BEIR folder or Hub dataset with qrels/"
                f"{cfg.source_split}.tsv), or set skip_{stage.name}: true"
            )


def check_target_corpora(target_corpora) -> None:
    """Every ``--target-corpus`` given as a path exists (a folder or a file), before any work."""
    for corpus in target_corpora:
        if isinstance(corpus, (str, os.PathLike)) and not Path(corpus).expanduser().exists():
            raise ConfigError(f"--target-corpus {corpus}: no such folder or file")


DISTILL_BATCH_SIZE = 16  # the distillation's per_device_train_batch_size unless its options set one


def check_distill_inputs(cfg: Any, target_corpora) -> None:
    """What the distillation needs, known before the teacher encodes a document: every ``--target-queries`` source
    holds a query (after empty ones and repeats are dropped), the queries fill one training batch (the stage drops an
    incomplete last batch), and each target corpus ranked has at least ``distill_k`` documents with text."""
    from ..data.teacher import route_queries
    from ..retrieval.hybrid import _corpus_ids_texts

    batch = distill_batch(cfg)
    routed = route_queries(cfg.target_queries, target_corpora)
    pseudo = cfg.pseudo_queries if isinstance(cfg.pseudo_queries, int) else 0
    total = pseudo  # (a corpus that gives fewer is said when they are drawn)
    for _, src in routed:
        if not src.texts:
            raise ConfigError(
                f"--target-queries {src.name}: no query with text (all are empty or blank); the distillation trains "
                "on target queries: give a source that holds some"
            )
        total += len(src.texts)
    if total < batch:
        raise ConfigError(
            f"--target-queries: {total} distinct queries, fewer than one distillation batch of {batch} "
            "(per_device_train_batch_size x gradient_accumulation_steps; an incomplete batch is dropped): give more "
            f"queries or set distill: {{per_device_train_batch_size: {max(1, total)}}}"
        )
    ranked = [c for c, _ in routed] + (list(target_corpora) if pseudo else [])
    for corpus in dict.fromkeys(ranked):
        _, texts = _corpus_ids_texts(corpus)
        docs = sum(1 for t in texts if t.strip())
        if docs < cfg.distill_k:
            raise ConfigError(
                f"recipe option distill_k {cfg.distill_k} is more than the {docs} documents with text in the target "
                f"corpus {corpus}: the teacher cannot rank {cfg.distill_k} candidates; lower distill_k"
            )


def distill_batch(cfg: Any) -> int:
    """The distillation's training batch: ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` of its
    options (:data:`DISTILL_BATCH_SIZE` x 1 by default)."""
    options = getattr(cfg, "distill", None) or {}
    return int(options.get("per_device_train_batch_size", DISTILL_BATCH_SIZE)) * int(
        options.get("gradient_accumulation_steps", 1)
    )


def check_drawn_queries(cfg: Any, queries) -> None:
    """What the distillation trains on once the pseudo-queries are drawn (``queries``: each target corpus's
    :class:`~hf_cocodr.recipe.queries.CorpusQueries`), before the teacher encodes a document: at least one training
    batch of queries (:func:`distill_batch`). A corpus that gave fewer pseudo-queries than asked for (documents of
    one word hold no span, keyword pair or sentence to draw) is named with what it gave."""
    batch = distill_batch(cfg)
    given = sum(int(q.counts.get("train_queries", 0)) for q in queries)
    drawn = {q.name: int(q.counts.get("train_pseudo_queries", 0)) for q in queries}
    if given + sum(drawn.values()) >= batch:
        return
    asked = int(cfg.pseudo_queries or 0) if isinstance(cfg.pseudo_queries, int) else 0
    total = given + sum(drawn.values())
    said = ", ".join(f"{name} gave {n}" for name, n in drawn.items()) or "no target corpus gave any"
    smaller = f", or set distill: {{per_device_train_batch_size: {total}}}" if total else ""
    raise ConfigError(
        f"pseudo_queries {asked}: the target corpora gave {sum(drawn.values())} distinct pseudo-queries ({said}: "
        f"a span, a keyword pair or a sentence needs documents of several words), and with {given} of your queries "
        f"that is fewer than one distillation batch of {batch}: give --target-queries, a corpus of longer "
        f"documents{smaller}"
    )


def check_recipe_lengths(model: Any, cfg: Any) -> None:
    """``train_max_length`` and the length fields of each stage's training arguments (its settings'
    ``length_options``, e.g. ``coco.max_span_length``) against ``model``'s position limit (see
    :func:`hf_cocodr.modeling.limits.check_lengths`); read from ``config.json``, before any model is loaded."""
    lengths: dict[str, Any] = {"train_max_length": cfg.train_max_length}
    for settings in cfg.settings_classes():
        stage = getattr(settings, "training_options", None)
        options = (getattr(cfg, stage, None) or {}) if stage else {}
        for name in getattr(settings, "length_options", ()):
            if name in options:
                lengths[f"{stage}.{name}"] = options[name]
    check_lengths(model, lengths)


def _minutes(seconds: float) -> str:
    """``seconds`` as minutes, rounded up to the hundredth (the least budget that covers them)."""
    return f"{math.ceil(seconds / 60.0 * 100.0) / 100.0:g}"


def check_budget_floor(max_minutes: float, load_s: float, loads: list[str]) -> None:
    """Refuse a budget that the run's fixed costs alone use up, before any data or model is loaded.

    The planner charges ``load_s`` for each model load + export before any step: the final model's and one for each
    of ``loads`` (the titles of the stages that load and export a model of their own, e.g. COCO's and WiSE-FT's).
    The budget must exceed them, or no step could be trained and every stage deadline would lie in the past.
    ``max_minutes`` is a checked budget (:func:`~hf_cocodr.recipe.config.check_max_minutes`).

    Raises:
        ConfigError: one line with the budget, the fixed costs and the least budget that leaves time for steps.
    """
    named = ["the final model's"] + [f"{title}'s" for title in loads]
    fixed_s = load_s * len(named)
    budget_s = float(max_minutes) * 60.0
    if budget_s <= fixed_s:
        what = f"{len(named)} model load(s) and export(s) ({', '.join(named)}, {load_s:g} s each)"
        raise ConfigError(
            f"max_minutes {max_minutes:g} ({budget_s:.1f} s) leaves no time to train: {what} alone "
            f"take {fixed_s:g} s; give more than {_minutes(fixed_s)} minutes"
        )


def check_budget_buys_steps(plan: Mapping[str, Any], one_step: Mapping[str, tuple[float, str]]) -> None:
    """Refuse, before any training, a budgeted plan whose budget cannot buy one optimizer step of each training stage.

    ``plan`` is the planner's (``budget_seconds``, ``fixed_seconds``: loads, exports, K-Means, refreshes and the time
    spent so far); ``one_step`` maps each training stage that runs, in order, to the seconds its first step costs and
    how they are made up (:func:`~hf_cocodr.recipe.planner.one_step`: a COCO soup of several runs needs one step of
    each run and a model load + export for every run after the first).

    Raises:
        ConfigError: one line naming the first stage the budget cannot reach, its probed step cost, the budget and the
            least budget that buys one step of every stage.
    """
    budget_s, fixed_s = float(plan["budget_seconds"]), float(plan.get("fixed_seconds") or 0.0)
    needed = fixed_s + sum(cost for cost, _ in one_step.values())
    if budget_s >= needed:
        return
    spent = fixed_s
    for stage, (cost, per_step) in one_step.items():
        if spent + cost > budget_s:
            before = f" and one step of each stage before it ({spent - fixed_s:.1f} s)" if spent > fixed_s else ""
            raise ConfigError(
                f"max_minutes {budget_s / 60.0:g} ({budget_s:.1f} s) cannot buy one step of the {stage} stage: "
                f"its probed cost is {per_step}, and {_fixed_costs(plan, fixed_s)}{before}; give at least "
                f"{_minutes(needed)} minutes"
            )
        spent += cost
    raise ConfigError(
        f"max_minutes {budget_s / 60.0:g} ({budget_s:.1f} s) leaves no time to train: {_fixed_costs(plan, fixed_s)}; "
        f"give at least {_minutes(needed)} minutes"
    )


def _fixed_costs(plan: Mapping[str, Any], fixed_s: float) -> str:
    """What the fixed costs are, for a refusal: the three largest of the plan's ``fixed_costs`` by name (the
    teacher's corpus encoding on a cold CPU run), else what they are made of."""
    named = sorted(((float(v), k) for k, v in (plan.get("fixed_costs") or {}).items() if v and v > 0), reverse=True)
    if not named:
        return f"the fixed costs (model loads, exports, clustering, the time spent so far) take {fixed_s:.1f} s"
    largest = ", ".join(f"{k} {v:.1f} s" for v, k in named[:3])
    return f"the fixed costs take {fixed_s:.1f} s (the largest: {largest})"
