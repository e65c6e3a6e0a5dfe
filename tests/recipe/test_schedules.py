"""The schedule rule: which stages the recipe trains for each kind of starting model and input."""

from __future__ import annotations

import json

import pytest

from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe import (
    SCHEDULES,
    RecipeConfig,
    choose_schedule,
)
from hf_cocodr.recipe.schedules import CORPUS_PSEUDO_QUERIES, CORPUS_WISE_ALPHA


def test_schedule_rule_follows_the_mlm_head(tiny_bert_dir, tiny_bert_nomlm_dir):
    from hf_cocodr.modeling.condenser import checkpoint_has_mlm_head

    for model_dir, kind in ((tiny_bert_dir, "mlm_head"), (tiny_bert_nomlm_dir, "no_mlm_head")):
        cfg, record = choose_schedule(RecipeConfig(), checkpoint_has_mlm_head(str(model_dir)))
        assert record["kind"] == kind
        for key, value in SCHEDULES[kind].items():
            assert getattr(cfg, key) == value, key
    # the rule the README states: both kinds train COCO with MLM and nothing after (no pairs, no WiSE-FT); a head-less
    # model (already a retriever) trains COCO alone as a soup of runs the budget buys, a model with an MLM head the
    # paper's stages (one COCO run -> iDRO); a head-less model's fresh MLM head is warmed up first, and the record
    # says so
    for kind in ("no_mlm_head_soup", "mlm_head"):
        assert SCHEDULES[kind]["coco_mlm_weight"] == 1.0 and SCHEDULES[kind]["skip_distill"] is True
        assert SCHEDULES[kind]["wise_alpha"] is None and SCHEDULES[kind]["skip_coco"] is False
    soup = SCHEDULES["no_mlm_head_soup"]
    assert soup["skip_finetune"] is True and soup["coco_runs"] == "budget" and soup["pseudo_queries"] == 0
    assert SCHEDULES["mlm_head"]["skip_finetune"] is False and SCHEDULES["mlm_head"]["coco_runs"] == 1
    # the corpus alone: a head-less model distils the hybrid on pseudo-queries drawn from the corpus, no COCO
    alone = SCHEDULES["no_mlm_head"]
    assert (alone["skip_coco"], alone["skip_finetune"], alone["skip_distill"]) == (True, True, False)
    assert alone["pseudo_queries"] == CORPUS_PSEUDO_QUERIES and alone["distill_share"] == 1.0
    # ... and its query route interpolated toward the start; with the user's queries, no WiSE-FT
    assert alone["wise_alpha"] == CORPUS_WISE_ALPHA == 0.75 and SCHEDULES["no_mlm_head_queries"]["wise_alpha"] is None
    cfg, record = choose_schedule(RecipeConfig(), False)
    assert cfg.wise_alpha == 0.75 and record["chosen"]["wise_alpha"] == 0.75
    assert "mlm_head" not in choose_schedule(RecipeConfig(), False)[1]  # no COCO: no fresh head to warm up
    # the soup, where no pseudo-query is drawn (or the distillation is off): its fresh MLM head warmed up
    for off in ({"pseudo_queries": 0}, {"skip_distill": True}):
        cfg, record = choose_schedule(RecipeConfig(**off), False)
        assert record["kind"] == "no_mlm_head_soup" and cfg.skip_coco is False and "30%" in record["mlm_head"]
    assert "30%" in choose_schedule(RecipeConfig(pseudo_queries=0), None)[1]["mlm_head"]  # a Hub id: warmed up
    assert "mlm_head" not in choose_schedule(RecipeConfig(), True)[1]
    with pytest.raises(ConfigError, match="nothing to train on"):  # a model with an MLM head draws no pseudo-query
        choose_schedule(RecipeConfig(skip_distill=False), True)


def test_unlabelled_target_queries_give_a_model_without_mlm_head_the_distillation_alone(monkeypatch):
    queries = ["data/scifact:train"]
    monkeypatch.setattr("hf_cocodr.recipe.schedules.no_gpu", lambda: True)  # (the query side: 5 passes)
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries), False)
    assert record["kind"] == "no_mlm_head_queries" and "target queries" in record["why"]
    assert (cfg.skip_coco, cfg.skip_finetune, cfg.skip_distill, cfg.distill_share) == (True, True, False, 1.0)
    assert "mlm_head" not in record  # no COCO: no fresh head to warm up
    # its teacher is the hybrid fitted to each corpus; the corpus alone and the paper keep the fixed fusion at 0.5
    assert cfg.distill_teacher_weight == "fit"
    assert record["chosen"]["distill_teacher_weight"] == "fit"
    assert choose_schedule(RecipeConfig(), False)[0].distill_teacher_weight == 0.5
    assert (
        choose_schedule(RecipeConfig(target_queries=queries, schedule="paper"), False)[0].distill_teacher_weight == 0.5
    )
    mine, record = choose_schedule(RecipeConfig(target_queries=queries, distill_teacher_weight=0.3), False)
    assert mine.distill_teacher_weight == 0.3 and record["set_by_user"]["distill_teacher_weight"] == 0.3
    # at most 5 passes over the user's queries; 3 over the corpus alone's pseudo-queries and in the paper schedule
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries), False)
    assert cfg.distill_max_passes == 5.0 and record["chosen"]["distill_max_passes"] == 5.0
    assert choose_schedule(RecipeConfig(), False)[0].distill_max_passes == 3.0
    assert choose_schedule(RecipeConfig(target_queries=queries, schedule="paper"), False)[0].distill_max_passes == 3.0
    for mine in (None, 2.0):  # the user's cap (or none) wins
        cfg_mine, rec = choose_schedule(RecipeConfig(target_queries=queries, distill_max_passes=mine), False)
        assert cfg_mine.distill_max_passes == mine and rec["set_by_user"]["distill_max_passes"] == mine
    # COCO asked for beside it gets an equal share; a model with an MLM head keeps its schedule (no distillation)
    both, record = choose_schedule(RecipeConfig(target_queries=queries, skip_coco=False), False)
    assert (both.skip_coco, both.coco_share, both.distill_share) == (False, 1.0, 1.0) and "mlm_head" in record
    head, record = choose_schedule(RecipeConfig(target_queries=queries), True)
    assert record["kind"] == "mlm_head" and head.skip_distill is True and head.skip_coco is False
    # a setting given by the user wins and is recorded as theirs
    cfg, record = choose_schedule(RecipeConfig(wise_alpha=None, coco_mlm_weight=0.3), False)
    assert cfg.wise_alpha is None and cfg.coco_mlm_weight == 0.3
    assert record["set_by_user"] == {"wise_alpha": None, "coco_mlm_weight": 0.3}


def test_distill_side_auto_is_the_query_side_on_a_cpu_where_nothing_else_trains_the_model(monkeypatch):
    """``distill_side: auto`` resolves to ``query`` on a CPU when the distillation starts from the starting model
    (a WiSE-FT after it or not), to ``full`` where a stage trains before it or a GPU trains on the user's queries
    alone; a side the user gives is kept; the choice and why are recorded."""
    queries = ["data/scifact:train"]
    monkeypatch.setattr("hf_cocodr.recipe.schedules.no_gpu", lambda: True)
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries), False)
    assert cfg.distill_side == "query" == record["chosen"]["distill_side"] and "CPU" in record["distill_side"]
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries, skip_coco=False), False)
    assert cfg.distill_side == "full" and "COCO" in record["distill_side"]
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries, wise_alpha=0.5), False)
    assert cfg.distill_side == "query"  # (WiSE-FT interpolates the query route alone)
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries, distill_side="full"), False)
    assert cfg.distill_side == "full" and "distill_side" not in record["chosen"]
    cfg, record = choose_schedule(RecipeConfig(pseudo_queries=0), False)  # no distillation: nothing to choose
    assert cfg.distill_side in ("full", "query") and "distill_side" not in record
    monkeypatch.setattr("hf_cocodr.recipe.schedules.no_gpu", lambda: False)
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries), False)
    assert cfg.distill_side == "full" and "GPU" in record["distill_side"]
    # the whole model keeps the cap of 3 passes; 5 are the query side's (a cap the user gives stands)
    assert cfg.distill_max_passes == 3.0 == record["chosen"]["distill_max_passes"]
    assert (
        choose_schedule(RecipeConfig(target_queries=queries, distill_max_passes=5), False)[0].distill_max_passes == 5
    )
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries, distill_side="query"), False)
    assert cfg.distill_max_passes == 5.0 == record["chosen"]["distill_max_passes"]
    # on a GPU too, a distillation on pseudo-queries trains the query side: the guard cannot vouch for a document
    # side trained on them; one after COCO trains the whole model (and the guard says it cannot vouch for it)
    cfg, record = choose_schedule(RecipeConfig(), False)
    assert record["kind"] == "no_mlm_head" and cfg.pseudo_queries > 0
    assert cfg.distill_side == "query" and "pseudo-queries" in record["distill_side"]
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries, pseudo_queries=100), False)
    assert cfg.distill_side == "query"
    cfg, record = choose_schedule(RecipeConfig(skip_coco=False), False)
    assert cfg.distill_side == "full" and "COCO" in record["distill_side"]


def test_the_recipe_trains_the_stages_the_rule_gives_each_kind_of_model(
    tiny_bert_dir, tiny_bert_nomlm_dir, tiny_beir, tmp_path
):
    """End to end with only step counts set: a head-less tiny model gets the distillation on pseudo-queries drawn from
    the corpus, or with pseudo_queries 0 a COCO soup (3 runs of coco_run_steps without a budget), and no fine-tuning;
    a tiny model with an MLM head gets one COCO run, then iDRO."""
    from hf_cocodr.recipe import run_recipe

    small = {
        "finetune_steps": 2,
        "corpus_pool": None,
        "coco": {"per_device_train_batch_size": 8, "save_steps": 2},
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 2},
    }
    cases = (
        (tiny_bert_nomlm_dir, {"distill_steps": 2, "distill": {"per_device_train_batch_size": 4}}, 1, {"distill": 2}),
        (tiny_bert_nomlm_dir, {"coco_run_steps": 2, "pseudo_queries": 0}, 3, {"coco": 2}),
        (tiny_bert_dir, {"coco_steps": 2}, 1, {"coco": 2, "finetune": 2}),
    )
    for i, (model_dir, steps, runs, trained) in enumerate(cases):
        out = tmp_path / f"{model_dir.name}-{i}"
        run_recipe(str(model_dir), [str(tiny_beir)], str(tiny_beir), out, config={**small, **steps})
        record = json.loads((out / "recipe.json").read_text())
        assert record["steps_trained"] == trained, model_dir.name
        assert "coco" not in trained or record["plan"]["coco_runs"] == runs
        assert (out / "coco-runs").is_dir() == (runs > 1)
        assert (out / "finetune").is_dir() == ("finetune" in trained)


def test_without_target_corpus_a_headless_model_falls_back_to_the_source_fine_tuning(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path
):
    """The head-less schedule trains on the target corpus alone; with no target corpus there is nothing to draw
    pseudo-queries from and no COCO, so the source fine-tuning the schedule left out runs instead (recorded as chosen). With every stage switched off by the user: refused by name,
    before anything is written."""
    from hf_cocodr.errors import ConfigError
    from hf_cocodr.recipe import run_recipe

    out = tmp_path / "src"
    run_recipe(
        str(tiny_bert_nomlm_dir),
        [],
        str(tiny_beir),
        out,
        config={
            "finetune_steps": 2,
            "corpus_pool": None,
            "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 2},
        },
    )
    record = json.loads((out / "recipe.json").read_text())
    assert record["steps_trained"] == {"finetune": 2} and record["schedule"]["chosen"]["skip_finetune"] is False
    with pytest.raises(ConfigError, match="nothing to train"):
        run_recipe(
            str(tiny_bert_nomlm_dir),
            [str(tiny_beir)],
            str(tiny_beir),
            tmp_path / "none",
            config={"skip_coco": True, "pseudo_queries": 0},
        )
    assert not (tmp_path / "none").exists()
