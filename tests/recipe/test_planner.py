"""The budget planner: shares of the budget, refused settings, optimizer steps, the source draw, COCO runs."""

from __future__ import annotations

import json

import pytest

from hf_cocodr.recipe import (
    SCHEDULES,
    STAGE_LOAD_SECONDS,
    RecipeConfig,
    budget_plan,
    choose_schedule,
    stage_deadlines,
)


def plan_budget(*args, **kwargs) -> dict:
    """The plan as ``plan.json`` keeps it."""
    return budget_plan(*args, **kwargs).to_dict()


def test_a_stage_the_user_switches_on_gets_a_share_of_the_budget():
    """The schedule of a model with an MLM head gives the distillation no share; asking for it must not plan it 2
    steps."""
    from hf_cocodr.errors import ConfigError

    tp = {"coco_step_s": 4.0, "finetune_step_s": 10.0, "distill_step_s": 8.0}
    queries = dict(skip_distill=False, target_queries=["q.jsonl"])
    alone, record = choose_schedule(RecipeConfig(skip_coco=True, skip_finetune=True, **queries), True)
    assert alone.distill_share == 1.0 and record["chosen"]["distill_share"] == 1.0
    plan = plan_budget(480.0, tp, alone, overhead_s=40.0, pool_docs=0, n_queries=0, idro=False)
    assert plan["distill_steps"] == int(440.0 / 8.0)
    # beside the paper's two stages (shares 0.4 / 0.6) it gets their mean, 0.5, and the record says so
    added, record = choose_schedule(RecipeConfig(**queries), True)
    assert (added.coco_share, added.finetune_share, added.distill_share) == (0.4, 0.6, 0.5)
    assert record["chosen"]["distill_share"] == 0.5
    plan = plan_budget(900.0, tp, added, overhead_s=0.0, pool_docs=0, n_queries=0, idro=False)
    assert plan["distill_steps"] == int(900.0 * 0.5 / 1.5 / 8.0)
    # a share the user gives is kept; a 0 for a stage that runs is refused by name; fixed steps need no share
    assert choose_schedule(RecipeConfig(distill_share=0.2, **queries), True)[0].distill_share == 0.2
    with pytest.raises(ConfigError, match="distill_share is 0 but the distill stage runs"):
        choose_schedule(RecipeConfig(distill_share=0.0, **queries), True)
    assert choose_schedule(RecipeConfig(distill_share=0.0, distill_steps=3, **queries), True)[0].distill_steps == 3


@pytest.mark.parametrize(
    "bad",
    [
        dict(coco_mlm_weight=float("nan")),
        dict(wise_alpha=1.5),
        dict(coco_steps=-5),
        dict(distill_side="sideways"),
        dict(refreshes=-1),
        dict(coco_share="half"),
    ],
)
def test_bad_recipe_settings_are_refused_by_name(bad):
    from hf_cocodr.errors import ConfigError

    with pytest.raises(ConfigError, match=next(iter(bad))):
        RecipeConfig.from_dict(bad)


def test_planner_spends_the_budget_on_optimizer_steps():
    cfg, _ = choose_schedule(RecipeConfig(), True)  # the paper's stages: COCO, then iDRO
    tp = {
        "coco_step_s": 4.0,
        "finetune_step_s": 10.0,
        "encode_doc_s": 0.03,
        "encode_query_s": 0.005,
    }
    plan = plan_budget(900.0, tp, cfg, overhead_s=60.0, pool_docs=20_000, n_queries=1000, idro=True)
    # a refresh of 20k documents (600 s) is far above 10% of 900 s: none is planned
    assert plan["refreshes"] == 0
    kmeans = 0.005 * 1000
    left = 900.0 - 60.0 - kmeans
    shares = SCHEDULES["mlm_head"]
    assert plan["coco_steps"] == int(left * shares["coco_share"] / 4.0)
    assert plan["finetune_steps"] == int(left * shares["finetune_share"] / 10.0)
    assert plan["planned_optimizer_share"] >= 0.7
    # a small pool is refreshed, and the refresh is charged before the steps are split
    small = plan_budget(900.0, tp, cfg, overhead_s=60.0, pool_docs=1000, n_queries=1000, idro=True)
    assert small["refreshes"] == 2 and small["finetune_steps"] < plan["finetune_steps"]
    # a head-less model's schedule: the budget goes to COCO runs of about 76 steps (hand-computed:
    # round((840 + 20) / (76 x 4 + 20)) = 3 runs of (840 - 2 x 20) / (3 x 4) = 66 steps), >= 70% of it to steps
    soup, _ = choose_schedule(RecipeConfig(pseudo_queries=0), False)  # the head-less COCO soup
    p = plan_budget(900.0, tp, soup, overhead_s=60.0, pool_docs=20_000, n_queries=1000, idro=True)
    assert (p["coco_runs"], p["coco_steps"], p["finetune_steps"], p["refreshes"]) == (3, 66, 0, 0)
    assert p["planned_optimizer_share"] == round(3 * 66 * 4.0 / 900.0, 3) >= 0.7
    # stages that do not run get no steps, and the others share the budget
    only, _ = choose_schedule(RecipeConfig(skip_coco=True, refreshes=0), True)
    p = plan_budget(900.0, tp, only, overhead_s=0.0, pool_docs=0, n_queries=0, idro=False)
    assert (p["coco_steps"], p["finetune_steps"]) == (0, 90)


def test_the_budget_sizes_the_source_draw_and_charges_what_grows_with_it():
    """Hand-computed: 900 s, 100 s spent before planning, 1 s per source step of 32 queries, BM25 mining 1/32 s and
    the first K-Means encoding 1/64 s per query, no refreshes. q queries leave floor(800 - 3q/64) steps; the steps
    see every drawn query once while 32 x floor(800 - 3q/64) >= q, i.e. up to q = 10,240 (320 steps; 10,241 would
    leave 319 steps for 10,241 queries)."""
    from hf_cocodr.recipe import size_source_queries

    cfg, _ = choose_schedule(RecipeConfig(skip_coco=True, refreshes=0), True)
    tp = {"finetune_step_s": 1.0, "encode_query_s": 1 / 64, "encode_doc_s": 0.0}
    kw = dict(
        overhead_s=100.0, pool_docs_per_query=2.0, max_pool_docs=20_958, mining_s_per_query=1 / 32, batch=32, idro=True
    )
    q = size_source_queries(900.0, tp, cfg, available=87_599, **kw)
    assert q == 10_240
    plan = plan_budget(900.0, tp, cfg, overhead_s=100.0 + q / 32, pool_docs=2 * q, n_queries=q, idro=True)
    assert (plan["finetune_steps"], plan["kmeans_seconds"], plan["fixed_seconds"]) == (320, 160.0, 580.0)
    # a small source task is drawn whole; a budget spent before planning still draws the planner's minimum of 2 steps
    assert size_source_queries(900.0, tp, cfg, available=500, **kw) == 500
    assert size_source_queries(60.0, tp, cfg, available=87_599, **kw) == 2 * 32
    # the fine-tuning stage's deadline is the end of the budget less the final export (20 s)
    plan.update(throughput=tp, budget_seconds=900.0)
    assert stage_deadlines(plan, cfg, t_start=1000.0) == {"finetune": 1000.0 + 900.0 - STAGE_LOAD_SECONDS}


def test_a_budgeted_recipe_draws_the_source_queries_its_steps_use(tiny_bert_dir, tmp_path, monkeypatch):
    """End to end: the budget (step times fixed by hand) buys fewer steps than the source task has batches, so the
    recipe draws only the queries the steps use, clusters and trains on those, and a re-run keeps the draw."""
    from tiny import make_beir

    import hf_cocodr.recipe.planner as recipe
    from hf_cocodr.recipe import run_recipe

    source = make_beir(tmp_path / "source", n_docs=120, n_queries=400, splits=("train",))
    tp = {"finetune_step_s": 0.5, "encode_query_s": 0.001, "encode_doc_s": 0.001}
    monkeypatch.setattr(recipe, "measure", lambda *a, **k: dict(tp))
    monkeypatch.setattr(recipe, "STAGE_LOAD_SECONDS", 1.0)
    config = {
        "skip_coco": True,
        "refreshes": 0,
        "corpus_pool": 2,
        "finetune_preset": "paper",  # iDRO: K-Means
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 1000},
    }
    out = tmp_path / "run"
    run_recipe(str(tiny_bert_dir), [], str(source), out, config=config, max_minutes=0.2)
    plan = json.loads((out / "plan.json").read_text())
    q, steps = plan["source_queries"], plan["finetune_steps"]
    assert plan["source_queries_available"] == 400 and 8 <= q < 400 and steps * 8 >= q
    weights = json.loads((out / "finetune" / "idro_weights.json").read_text())
    assert sum(weights["clusterings"][0]["sizes"]) == q  # the first K-Means clustered the draw, not the task
    run_recipe(str(tiny_bert_dir), [], str(source), out, config=config, max_minutes=0.2)
    assert json.loads((out / "plan.json").read_text()) == plan  # a re-run keeps the plan and its draw


def test_coco_runs_share_the_budget():
    """Hand-computed: 800 s of COCO at 2.5 s a step, runs of about 76 steps (190 s + 20 s load each):
    round((800 + 20) / 210) = 4 runs, then (800 - 3 x 20) / (4 x 2.5) = 74 steps each."""
    from hf_cocodr.recipe import STAGE_LOAD_SECONDS, CocoStage

    def coco_runs_for(coco_s, step_s, cfg, given_steps):
        return CocoStage.runs_for(coco_s, step_s, cfg, given_steps, STAGE_LOAD_SECONDS)

    assert STAGE_LOAD_SECONDS == 20.0
    cfg = RecipeConfig(coco_runs="budget", coco_run_steps=76)
    assert coco_runs_for(800.0, 2.5, cfg, None) == (4, 74)
    assert coco_runs_for(100.0, 2.5, cfg, None) == (1, None)  # less than one run: one run, planned as before
    assert coco_runs_for(800.0, 2.5, cfg, 30) == (9, 30)  # fixed steps per run: round(820 / 95) runs of them
    assert coco_runs_for(800.0, 2.5, RecipeConfig(coco_runs=2), None) == (2, int(780.0 / 5.0))
    assert coco_runs_for(800.0, 2.5, RecipeConfig(coco_runs=1), None) == (1, None)
    # in a whole plan: the runs' steps are optimizer seconds, their extra loads are not
    only_coco, _ = choose_schedule(RecipeConfig(coco_runs="budget", skip_finetune=True, pseudo_queries=0), False)
    plan = plan_budget(900.0, {"coco_step_s": 2.5}, only_coco, overhead_s=100.0, pool_docs=0, n_queries=0, idro=False)
    assert (plan["coco_runs"], plan["coco_steps"]) == (4, 74)
    assert plan["planned_optimizer_share"] == round(4 * 74 * 2.5 / 900.0, 3)
    for bad in ({"coco_runs": 0}, {"coco_runs": "many"}, {"coco_run_steps": 0}):
        from hf_cocodr.errors import ConfigError

        with pytest.raises(ConfigError, match=next(iter(bad))):
            RecipeConfig.from_dict(bad)
