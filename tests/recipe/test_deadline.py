"""The recipe's time budget is a limit: planned steps are an upper bound, each stage ends by its deadline."""

from __future__ import annotations

import json
import logging

import pytest
from helpers import CFG
from transformers import TrainerControl, TrainerState

from hf_cocodr.finetuning.callbacks import WallClockDeadline
from hf_cocodr.recipe import RecipeConfig, choose_schedule, run_recipe, stage_deadlines


def test_deadline_stops_after_the_first_step_that_ends_past_it():
    """Steps end at clock readings 1, 2, 3, ...; with the deadline at 2.5 the step ending at 3 (step 3) is the last."""
    now = {"t": 0.0}
    guard = WallClockDeadline(2.5, clock=lambda: now["t"])
    state = TrainerState(max_steps=5)
    stops = []
    for step in range(1, 6):
        now["t"] = float(step)
        state.global_step = step
        control = guard.on_step_end(None, state, TrainerControl())
        stops.append(control.should_training_stop)
        if control.should_training_stop:
            break
    assert stops == [False, False, True] and guard.stopped_at_step == 3
    # a deadline reached on the planned last step stops nothing early
    late = WallClockDeadline(0.0, clock=lambda: 10.0)
    state = TrainerState(max_steps=2)
    state.global_step = 2
    assert not late.on_step_end(None, state, TrainerControl()).should_training_stop
    assert late.stopped_at_step is None


def _plan(**kw):
    plan = {
        "coco_steps": 10,
        "finetune_steps": 20,
        "distill_steps": 30,
        "refreshes": 1,
        "budget_seconds": 900.0,
        "refresh_seconds_each": 70.0,
        "kmeans_seconds": 5.0,
        "throughput": {"coco_step_s": 3.0, "finetune_step_s": 10.0, "distill_step_s": 8.0},
    }
    return {**plan, **kw}


def test_stage_deadlines_leave_each_later_stage_its_planned_seconds():
    """Hand-computed: start at t=100, budget 900 s, WiSE-FT after training (tail 2 x 20 s): training ends by 960.
    distillation 30 x 8 = 240 s -> the source stage ends by 720; it plans 20 x 10 + 70 + 5 = 275 s -> COCO ends by
    445."""

    def resolved(**kw):  # the settings as the recipe resolves them for the paper's stages (a model with MLM head)
        return choose_schedule(RecipeConfig(skip_distill=False, target_queries=["q.jsonl"], **kw), True)[0]

    cfg = resolved(wise_alpha=0.5)
    assert stage_deadlines(_plan(), cfg, 100.0) == pytest.approx({"distill": 960.0, "finetune": 720.0, "coco": 445.0})
    # no WiSE-FT: only the final export follows (tail 20 s); a stage without steps has no deadline
    assert stage_deadlines(_plan(coco_steps=0), resolved(wise_alpha=None), 100.0) == pytest.approx(
        {"distill": 980.0, "finetune": 740.0}
    )
    # fixed steps without a budget: no deadlines
    assert stage_deadlines({**_plan(), "budget_seconds": None}, cfg, 100.0) == {}
    assert stage_deadlines({k: v for k, v in _plan().items() if k != "throughput"}, cfg, 100.0) == {}


def test_a_budgeted_recipe_ends_each_stage_by_its_deadline(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, caplog
):
    """Deadlines already past: every stage stops after its first step, saves, and the record says so; a re-run
    finds the stopped stages finished (their identity is the plan's) and trains nothing."""
    import hf_cocodr.recipe.planner as recipe

    seen = {}

    def past(plan, cfg, t_start, stages):
        seen.update(
            stage_deadlines(plan, cfg, t_start, stages)
        )  # the real deadlines exist for every stage that trains
        return {stage: t_start - 1.0 for stage in seen}

    monkeypatch.setattr(recipe, "stage_deadlines", past)
    out = tmp_path / "run"
    cfg = {**CFG, "wise_alpha": None}
    with caplog.at_level(logging.WARNING, logger="hf_cocodr"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=5.0)
    assert set(seen) == {"coco", "finetune"}
    record = json.loads((out / "recipe.json").read_text())
    assert (record["plan"]["coco_steps"], record["plan"]["finetune_steps"]) == (2, 4)
    assert record["steps_trained"] == {"coco": 1, "finetune": 1}
    assert record["stopped_by_deadline"] == {"coco": 1, "finetune": 1}
    assert sum("stopped at step 1 of" in r.getMessage() for r in caplog.records) == 2
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=5.0)
    assert sum("already finished" in r.getMessage() for r in caplog.records) == 2
    assert json.loads((out / "recipe.json").read_text())["steps_trained"] == record["steps_trained"]


def test_a_recipe_with_time_to_spare_trains_every_planned_step(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    out = tmp_path / "run"
    run_recipe(
        str(tiny_bert_nomlm_dir),
        [str(tiny_beir)],
        str(tiny_beir),
        out,
        config={**CFG, "wise_alpha": None, "skip_coco": True},
        max_minutes=30.0,
    )
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"] == {"finetune": 4} and record["stopped_by_deadline"] == {}


def test_every_run_of_a_coco_soup_ends_by_its_deadline(tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch):
    """A soup's COCO deadline already past: each run stops after its first step (a run's own deadline leaves the
    runs after it their planned seconds, so none is skipped), and the soup averages what the runs trained."""
    import hf_cocodr.recipe.planner as recipe

    monkeypatch.setattr(recipe, "stage_deadlines", lambda plan, cfg, t0, stages: {"coco": t0 - 1.0})
    out = tmp_path / "run"
    cfg = {**CFG, "wise_alpha": None, "skip_finetune": True, "coco_runs": 2}
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=5.0)
    for i in range(2):
        marker = json.loads((out / "coco-runs" / f"run-{i}" / "hf_cocodr_stage.json").read_text())
        assert marker["steps"] == 1 and marker["stopped_by_deadline_at_step"] == 1 and marker["seed"] == 42 + i
    record = json.loads((out / "recipe.json").read_text())
    assert record["plan"]["coco_runs"] == 2 and record["stopped_by_deadline"] == {"coco": 1}
