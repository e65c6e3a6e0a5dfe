"""The stage interface: a new stage is one Stage subclass and one entry in the stage list; the planner, the runner,
resume and the run record take it as they take the built-in stages."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_cocodr.recipe import STAGES, RecipeConfig, Stage, choose_schedule, run_recipe
from hf_cocodr.recipe.outputs import export_final
from hf_cocodr.recipe.planner import STAGE_LOAD_SECONDS, budget_plan, stage_deadlines


class PassOn(Stage):
    """A toy stage: it "trains" a fixed number of steps by copying the model it starts from."""

    name = "toy"

    def __init__(self, steps: int = 3):
        self.steps, self.calls = steps, 0

    def cost(self, throughput, cfg, **kw):
        return replace(super().cost(throughput, cfg, **kw), steps=self.steps)

    def train(self, run):
        self.calls += 1
        export_final(Path(run.current), run.dir(self.name))
        return {"steps": self.steps}


ONLY_TOY = dict(skip_coco=True, skip_finetune=True, skip_distill=True, wise_alpha=None, save_hybrid=False)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_a_toy_stage_is_planned_run_skipped_on_a_rerun_and_recorded(tiny_st_dir, tiny_beir, tmp_path, caplog):
    toy = PassOn()
    stages = (*STAGES, toy)  # the one line a new stage needs
    out = tmp_path / "run"
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=ONLY_TOY, stages=stages)
    record = json.loads((out / "recipe.json").read_text())
    assert record["plan"]["toy_steps"] == 3 and record["plan"]["coco_steps"] == 0  # planned beside the others
    assert record["steps_trained"] == {"toy": 3} and "toy" in record["stage_seconds"]  # recorded
    marker = json.loads((out / "toy" / "hf_cocodr_stage.json").read_text())
    assert marker["steps"] == 3 and marker["identity"] and toy.calls == 1
    start, final = _weights(Path(tiny_st_dir)), _weights(out / "model")  # the final model is the toy's output
    assert start.keys() == final.keys() and all(torch.equal(start[k], final[k]) for k in start)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=ONLY_TOY, stages=stages)
    assert toy.calls == 1 and any("stage toy: already finished" in r.getMessage() for r in caplog.records)
    # its identity holds its steps: with other steps it runs again
    longer = PassOn(steps=4)
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=ONLY_TOY, stages=(*STAGES, longer))
    assert longer.calls == 1 and json.loads((out / "recipe.json").read_text())["steps_trained"] == {"toy": 4}


def test_a_toy_stage_with_a_share_gets_its_part_of_the_budget_and_a_deadline():
    """Hand-computed: 300 s, nothing fixed; COCO's share 0.5 and the toy's 1 (no share option): COCO gets 100 s at
    4 s a step (25 steps), the toy 200 s at 2 s (100 steps). The toy trains last: it ends when the budget less the
    final export does (280 s), COCO 200 s before (80 s)."""

    class Shared(PassOn):
        def cost(self, throughput, cfg, **kw):
            return Stage.cost(self, throughput, cfg, **kw)

    stages = (*STAGES, Shared())
    cfg, _ = choose_schedule(RecipeConfig(skip_finetune=True, coco_runs=1, coco_share=0.5, wise_alpha=None), True)
    tp = {"coco_step_s": 4.0, "toy_step_s": 2.0}
    plan = budget_plan(300.0, tp, cfg, overhead_s=0.0, pool_docs=0, n_queries=0, idro=False, stages=stages)
    assert plan.steps == {"coco": 25, "finetune": 0, "distill": 0, "toy": 100}
    assert plan.planned_optimizer_seconds == 300.0
    plan.throughput = tp
    assert STAGE_LOAD_SECONDS == 20.0
    assert stage_deadlines(plan, cfg, 0.0, stages) == pytest.approx({"toy": 280.0, "coco": 80.0})
    # the built-in stages alone, from the same dict the run record keeps: no toy, COCO alone
    assert stage_deadlines(plan.to_dict(), cfg, 0.0) == pytest.approx({"coco": 280.0})


def test_the_plan_dict_round_trips():
    """plan.json and recipe.json keep the plan as a flat dict; a saved plan reads back to the same dict."""
    from hf_cocodr.recipe import Plan

    cfg, _ = choose_schedule(RecipeConfig(), True)
    tp = {
        "coco_step_s": 4.0,
        "finetune_step_s": 10.0,
        "encode_doc_s": 0.03,
        "encode_query_s": 0.005,
    }
    plan = budget_plan(900.0, tp, cfg, overhead_s=60.0, pool_docs=1000, n_queries=1000, idro=True)
    plan.throughput, plan.identity, plan.source_queries = tp, "abc", 1000
    saved = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(saved) == plan and Plan.from_dict(saved).to_dict() == saved
    assert {
        "coco_steps",
        "finetune_steps",
        "coco_runs",
        "refreshes",
        "budget_seconds",
        "planned_optimizer_share",
        "throughput",
        "identity",
        "source_queries",
    } <= set(saved)


def test_the_fine_tune_refreshes_its_negatives_as_often_as_planned_and_never_more():
    from hf_cocodr.recipe.stages import refresh_interval

    def refreshes_run(steps: int, every: int) -> int:  # the negatives callback: after each multiple below max_steps
        return sum(1 for step in range(1, steps + 1) if every and step % every == 0 and step < steps)

    assert refresh_interval(467, 1) == 234 and refreshes_run(467, 234) == 1  # rounded down (233): a second at 466
    assert refresh_interval(560, 1) == 280 and refreshes_run(560, 280) == 1
    assert refresh_interval(10, 3) == 3 and refreshes_run(10, 3) == 3
    assert refresh_interval(100, 0) == 0 and refresh_interval(1, 2) == 0
    for steps in range(2, 300):
        for planned in range(1, 6):
            assert refreshes_run(steps, refresh_interval(steps, planned)) <= planned
