"""The recipe's distillation stage: the hybrid teacher (the starting model + BM25) ranks unlabelled target queries and
the dense model learns its ranking; planned, resumable, skipped when finished, its rankings cached."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file
from tiny import crash_at

from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe import RecipeConfig, run_recipe
from hf_cocodr.recipe.plan import Plan
from hf_cocodr.recipe.stages.distill import DistillStage, spread_sample, teacher_fusion

CFG = dict(
    skip_coco=True,
    wise_alpha=None,
    distill_side="full",  # the whole model (auto would train the query side on this CPU: tests/recipe/test_query_side.py)
    distill_steps=4,
    distill_k=3,
    distill={"per_device_train_batch_size": 4, "save_steps": 2},
    guard="record",  # (the stage's model is what these tests read, whatever the guard would decide)
)


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def _weights(folder):
    files = sorted(folder.glob("**/model.safetensors"))
    assert files, folder
    return load_file(str(files[0]))


def test_distillation_trains_on_the_target_queries_and_is_skipped_once_finished(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "run"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"]}
    res = run_recipe(
        str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[f"{tiny_beir}:dev"], config=cfg
    )
    record = json.loads((out / "recipe.json").read_text())
    # the schedule of a model without MLM head switches distillation on when target queries are given
    assert record["schedule"]["chosen"]["skip_distill"] is False
    assert record["steps_trained"] == {"distill": 4}
    marker = json.loads((out / "distill" / "hf_cocodr_stage.json").read_text())
    # the 20 queries of toy:train, all of them (the guard holds out pseudo-queries only)
    assert marker["teacher"][0]["queries"] == "toy:train" and marker["teacher"][0]["num_queries"] == 20
    assert "hybrid-teacher distillation" in (out / "model" / "README.md").read_text()
    assert {"ndcg@10", "bm25", "hybrid", "start"} <= set(res[f"{tiny_beir}:dev"])

    # a re-run trains nothing (no trainer is built) and gives the same result
    import hf_cocodr.finetuning as ft

    def boom(*a, **k):
        raise AssertionError("a finished stage was run again")

    monkeypatch.setattr(ft, "IDROTrainer", boom)
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        again = run_recipe(
            str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[f"{tiny_beir}:dev"], config=cfg
        )
    assert again == res
    assert any("stage distill: already finished" in r.getMessage() for r in caplog.records)


def test_the_teacher_is_the_hybrid_of_the_starting_model_and_its_rankings_are_cached(tiny_bert_nomlm_dir, tiny_beir):
    from hf_cocodr.data.target_queries import read_target_queries
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.teacher import teacher_rankings

    queries = read_target_queries(f"{tiny_beir}:train").texts
    fusion = FusionConfig(dense_weight=0.3)
    first = teacher_rankings(str(tiny_bert_nomlm_dir), "key", tiny_beir, queries, 5, fusion=fusion)
    cached = teacher_rankings(str(tiny_bert_nomlm_dir), "key", tiny_beir, queries, 5, fusion=fusion)
    assert (first[-1], cached[-1]) == (False, True)
    assert cached[:2] == first[:2]  # cached == uncached
    ids, scores = HybridRetriever.build(str(tiny_bert_nomlm_dir), tiny_beir, fusion=fusion).search(queries, 5)
    assert first[0] == ids
    assert np.allclose(np.array(first[1]), np.array(scores), atol=1e-6)
    # another fusion ranks from the same cached indexes, as a teacher built afresh with it does
    ids, scores, *_, was_cached = teacher_rankings(str(tiny_bert_nomlm_dir), "key", tiny_beir, queries, 4)
    fresh = HybridRetriever.build(str(tiny_bert_nomlm_dir), tiny_beir).search(queries, 4)
    assert was_cached and ids == fresh[0] and np.allclose(np.array(scores), np.array(fresh[1]), atol=1e-6)
    # another model (key) is another teacher
    assert teacher_rankings(str(tiny_bert_nomlm_dir), "other", tiny_beir, queries, 4)[-1] is False


def test_an_interrupted_distillation_resumes_to_the_uninterrupted_weights(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch
):
    from hf_cocodr.finetuning import DistillationTrainer

    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"]}
    args = (str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir))
    run_recipe(*args, tmp_path / "whole", config=cfg)
    undo = crash_at(monkeypatch, DistillationTrainer, 3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(*args, tmp_path / "cut", config=cfg)
    assert (tmp_path / "cut" / "distill" / "checkpoint-2").is_dir()
    undo()
    run_recipe(*args, tmp_path / "cut", config=cfg)
    whole, cut = _weights(tmp_path / "whole" / "model"), _weights(tmp_path / "cut" / "model")
    assert whole.keys() == cut.keys()
    for name in whole:
        assert (whole[name] - cut[name]).abs().max().item() <= 1e-6, name


def test_queries_are_routed_to_the_corpus_they_belong_to(tiny_beir, tmp_path):
    from tiny import make_beir

    from hf_cocodr.data.teacher import route_queries

    other = make_beir(tmp_path / "other", seed=3)
    linked = tmp_path / "linked"  # a folder of links to toy's files (as the distillation study builds its splits)
    (linked / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv"):
        (linked / name).symlink_to(tiny_beir / name)
    routed = route_queries([f"{other}:train", f"{linked}:train"], [str(tiny_beir), str(other)])
    assert [str(c) for c, _ in routed] == [str(other), str(tiny_beir)]
    log = tmp_path / "log.jsonl"
    log.write_text('{"text": "a query from a search log"}\n')
    assert [str(c) for c, _ in route_queries([str(log)], [str(other)])] == [str(other)]  # one corpus: it
    with pytest.raises(ConfigError, match=r"log\.jsonl: which target corpus"):
        route_queries([str(log)], [str(tiny_beir), str(other)])
    # queries of a BEIR folder whose corpus is not a target corpus are not ranked over another corpus
    with pytest.raises(ConfigError, match=r"other:train: these queries belong to the corpus of .*add it with"):
        route_queries([f"{other}:train"], [str(tiny_beir)])


def test_distillation_needs_target_queries_and_checks_its_settings():
    with pytest.raises(ConfigError, match="skip_distill is false but no target queries"):
        RecipeConfig(skip_distill=False, pseudo_queries=0).validate()
    with pytest.raises(ConfigError, match="distill_k must be a whole number >= 2"):
        RecipeConfig(distill_k=1).validate()
    with pytest.raises(ConfigError, match=r"distill_teacher_weight must be a number in \[0, 1\]"):
        RecipeConfig(distill_teacher_weight=1.5).validate()
    with pytest.raises(ConfigError, match="distill: unknown field"):
        RecipeConfig(distill={"learning_rat": 1e-5}).validate()
    assert not DistillStage().enabled(RecipeConfig(skip_distill=False, target_queries=[]))
    assert DistillStage().enabled(RecipeConfig(skip_distill=False, target_queries=["q.jsonl"]))
    with pytest.raises(ConfigError, match="distill_document_gradients must be true or false"):
        RecipeConfig(distill_document_gradients="no").validate()
    with pytest.raises(ConfigError, match=r"distill_max_passes must be a number in \[0.01, 1000\]"):
        RecipeConfig(distill_max_passes=0).validate()
    RecipeConfig(distill_max_passes=None).validate()  # no cap


def test_the_distillation_stops_at_its_cap_on_passes_over_the_queries(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    """20 queries in batches of 4 are 5 steps a pass: the plan's steps (500 without a budget) stop at 1.5 passes, 7
    steps, and the record says why; steps fixed by ``distill_steps`` are trained as given."""
    # (guard off: every one of the 20 queries trains, none held out)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_max_passes": 1.5, "guard": "off"}
    del cfg["distill_steps"]
    args = (str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir))
    run_recipe(*args, tmp_path / "capped", config=cfg)
    record = json.loads((tmp_path / "capped" / "recipe.json").read_text())
    assert record["plan"]["distill_steps"] == 500
    assert record["steps_trained"] == {"distill": 7} and record["capped_at_passes"] == {"distill": 1.5}
    run_recipe(*args, tmp_path / "fixed", config={**cfg, "distill_steps": 9})
    record = json.loads((tmp_path / "fixed" / "recipe.json").read_text())
    assert record["steps_trained"] == {"distill": 9} and record["capped_at_passes"] == {}


def test_the_cap_on_passes_counts_every_rank_and_accumulated_batch_and_is_the_stage_identity(monkeypatch):
    """The queries a step takes are per-device batch x ranks x accumulation; the stage's identity holds the steps it
    trains (the cap, where it ends the stage first), so a stage finished before the cap existed keeps its identity
    unless it trained past the cap."""
    from types import SimpleNamespace

    from hf_cocodr.finetuning import DistillationTrainingArguments
    from hf_cocodr.recipe.plan import Plan
    from hf_cocodr.recipe.stages.distill import pass_cap

    assert pass_cap(100, 16, 3.0) == 18 and pass_cap(100, 1, 0.29) == 29  # 0.29 x 100 is 28.999... in floats
    assert pass_cap(3, 16, 3.0) == 1 and pass_cap(100, 16, None) is None
    monkeypatch.setattr(DistillationTrainingArguments, "world_size", property(lambda self: 2))
    stage = DistillStage()
    stage.queries_digest, stage.num_queries = "digest", 240  # (the queries as read, once per run)

    def run(plan_steps, **cfg):
        kw = {"output_dir": "unused", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 3}
        return SimpleNamespace(
            cfg=RecipeConfig(skip_distill=False, target_queries=["q"], **cfg),
            plan=Plan(steps={"distill": plan_steps}),
            arguments={"distill": kw},
        )

    # 240 queries at 4 x 2 ranks x 3 accumulated = 24 a step: 10 steps a pass
    assert stage.steps(run(100, distill_max_passes=3)) == 30
    assert stage.steps(run(100, distill_max_passes=5)) == 50
    assert stage.steps(run(100, distill_max_passes=0.5)) == 5
    with pytest.raises(ConfigError, match="distill_max_passes is still auto"):  # the schedule resolves it first
        stage.steps(run(100))
    assert stage.steps(run(20, distill_max_passes=3)) == 20  # the plan's steps, under the cap
    assert stage.steps(run(100, distill_max_passes=None)) == 100
    assert stage.steps(run(100, distill_steps=100)) == 100  # fixed steps are the user's


def test_the_distillation_without_document_gradients_reaches_the_probe_and_the_trainer_and_its_identity(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch
):
    """``distill_document_gradients: false`` builds the loss of the probe and of the training without them, and a
    run with it is another stage (its identity differs)."""
    from hf_cocodr.finetuning.losses.distill import HybridDistillLoss

    built, real = [], HybridDistillLoss.__init__

    def spy(self, *a, **k):
        built.append(k.get("document_gradients"))
        real(self, *a, **k)

    monkeypatch.setattr(HybridDistillLoss, "__init__", spy)  # (whoever builds it: the trainer, from its arguments)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_document_gradients": False}
    args = (str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir))
    run_recipe(*args, tmp_path / "off", config=cfg, max_minutes=30)
    assert built and set(built) == {False} and len(built) == 2  # the probe's loss and the trainer's
    built.clear()
    run_recipe(*args, tmp_path / "on", config={**cfg, "distill_document_gradients": True})
    assert built == [True]
    marker = "distill/hf_cocodr_stage.json"
    ids = [json.loads((tmp_path / out / marker).read_text())["identity"] for out in ("off", "on")]
    assert ids[0] != ids[1]


def test_a_setting_added_later_leaves_the_plan_of_an_older_run_at_its_default():
    """A run folder planned before ``distill_document_gradients`` and ``distill_max_passes`` existed keeps its plan
    on a re-run: at their defaults the settings are not part of the plan's identity; set otherwise, they are."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from hf_cocodr.recipe.planner import plan_identity

    run = SimpleNamespace(fps={"model": "m", "targets": ["t"]}, max_minutes=15.0)
    now = asdict(RecipeConfig(distill_max_passes=3.0))  # as the corpus-alone schedule resolves it
    before = {k: v for k, v in now.items() if k not in ("distill_document_gradients", "distill_max_passes")}
    assert plan_identity(run, now) == plan_identity(run, before)
    assert plan_identity(run, {**now, "distill_document_gradients": False}) != plan_identity(run, before)
    assert plan_identity(run, {**now, "distill_max_passes": None}) != plan_identity(run, before)
    assert plan_identity(run, {**now, "distill_max_passes": 5.0}) != plan_identity(run, before)


def test_a_plan_written_with_a_later_setting_at_its_default_is_kept(tmp_path):
    """Versions that wrote ``distill_document_gradients: true`` into the plan's digest: their plan.json is accepted
    as well (and one made for other settings is not)."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from hf_cocodr.recipe.plan import Plan
    from hf_cocodr.recipe.planner import plan_identities, plan_identity, saved_plan

    run = SimpleNamespace(fps={"model": "m", "targets": ["t"]}, max_minutes=15.0)
    now = asdict(RecipeConfig())
    written = plan_identity(run, now, keep=("distill_document_gradients",))
    assert written != plan_identity(run, now) and written in plan_identities(run, now)
    (tmp_path / "plan.json").write_text(json.dumps({**Plan(steps={"distill": 33}).to_dict(), "identity": written}))
    assert saved_plan(tmp_path, plan_identities(run, now)).steps_of("distill") == 33
    assert saved_plan(tmp_path, plan_identities(run, {**now, "distill_k": 4})) is None


def test_the_teacher_seconds_move_the_deadline_of_the_stage_before():
    """Hand-computed: a 300 s budget, COCO 10 steps at 4 s then distillation 10 steps at 2 s with 30 s of teacher
    ranking. The distillation ends when the budget less the final export (20 s) does, at 280 s; COCO must end 50 s
    before (its 20 s of steps and the teacher's 30 s), at 230 s. The teacher's seconds are charged as a fixed cost."""
    from hf_cocodr.recipe.planner import stage_deadlines

    cfg = RecipeConfig(
        skip_coco=False,
        skip_finetune=True,
        wise_alpha=None,
        coco_runs=1,
        skip_distill=False,
        target_queries=["q.jsonl"],
    )
    tp = {"coco_step_s": 4.0, "distill_step_s": 2.0, "distill_teacher_s": 30.0}
    plan = Plan(steps={"coco": 10, "finetune": 0, "distill": 10}, budget_seconds=300.0, throughput=tp)
    assert stage_deadlines(plan, cfg, 0.0) == {"distill": 280.0, "coco": 230.0}
    assert DistillStage().cost(tp, cfg, plan=plan).fixed_s == 30.0


def test_a_budgeted_run_times_the_distillation_and_charges_the_teacher_before_the_steps(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, caplog
):
    """The probe times a distillation step and the teacher's ranking; the ranking is a fixed cost of the plan (less
    once the teacher's indexes are cached) and the stage gets a deadline."""
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"]}
    args = (str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir))
    plans = []
    for out in ("first", "cached"):
        with caplog.at_level(logging.INFO, logger="hf_cocodr"):
            run_recipe(*args, tmp_path / out, config=cfg, max_minutes=30.0)
        plans.append(json.loads((tmp_path / out / "recipe.json").read_text())["plan"])
    first, cached = (p["throughput"] for p in plans)
    assert first["distill_step_s"] > 0 and cached["distill_step_s"] > 0
    # uncached: 80 documents and 20 queries to encode; cached: the queries alone (the teacher check, which both runs
    # pay, timed on each run's own clock, is left out of the comparison: its noise is not the cache's saving)
    saved = ("distill_teacher_encode_s", "distill_teacher_bm25_s", "distill_teacher_fit_s")
    assert sum(first.get(k, 0.0) for k in saved) > 0 and sum(cached.get(k, 0.0) for k in saved) == 0
    assert first["distill_teacher_s"] > first.get("distill_teacher_check_s", 0.0)
    assert cached["distill_teacher_s"] >= cached.get("distill_teacher_check_s", 0.0) >= 0
    assert plans[0]["fixed_seconds"] >= first["distill_teacher_s"]
    assert any("stage distill: must end within" in r.getMessage() for r in caplog.records)


def test_target_queries_switch_distillation_on_without_disturbing_the_fine_tuning_methods(
    tiny_bert_dir, tiny_beir, tmp_path, caplog
):
    """A fine-tune with a method that reads no target queries (BERM) finishes; adding target queries for the
    distillation leaves it finished (its inputs are unchanged) and only the distillation trains."""
    out = tmp_path / "run"
    base = {
        **CFG,
        "skip_finetune": False,
        "finetune_steps": 2,
        "methods": ["berm"],
        "finetune": {"per_device_train_batch_size": 4, "num_clusters": 2},
    }
    args = (str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out)
    run_recipe(*args, config=base)
    assert json.loads((out / "recipe.json").read_text())["steps_trained"] == {"finetune": 2}
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        run_recipe(*args, config={**base, "skip_distill": False, "target_queries": [f"{tiny_beir}:train"]})
    assert any("stage finetune: already finished" in r.getMessage() for r in caplog.records)
    assert json.loads((out / "recipe.json").read_text())["steps_trained"] == {"finetune": 2, "distill": 4}
    # without a reader the target queries are refused by name, before any work
    with pytest.raises(ConfigError, match="nothing reads them: the distill stage is off"):
        run_recipe(*args, config={**base, "target_queries": [f"{tiny_beir}:train"]})


@pytest.mark.parametrize(
    ("native", "option", "expected"),
    [(True, None, "bf16"), (False, None, "fp32"), (True, False, "fp32"), (False, True, "bf16")],
)
def test_the_distillation_trains_under_bf16_where_the_machine_has_it_unless_told(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, native, option, expected
):
    """By default the distillation trains under bf16 where the machine has native bf16 kernels and in fp32
    elsewhere; ``distill: {bf16: ...}`` decides instead. The probe times the step in that precision (so the plan buys
    the steps it affords), the trainer runs in it, and the run's record says which and why."""
    import hf_cocodr.finetuning as finetuning
    import hf_cocodr.recipe.runner as runner_module
    import hf_cocodr.recipe.stages.distill as distill_module

    for module in (distill_module, runner_module):
        monkeypatch.setattr(module, "native_bf16", lambda: native)
    trained_in, real_trainer = [], finetuning.DistillationTrainer

    class Spy(real_trainer):  # records the precision the stage's trainer is built with
        def __init__(self, *a, args=None, **k):
            trained_in.append(args.bf16)
            super().__init__(*a, args=args, **k)

    monkeypatch.setattr(finetuning, "DistillationTrainer", Spy)
    options = {**CFG["distill"], **({} if option is None else {"bf16": option})}
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "distill": options}
    out = tmp_path / "out"
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=30)
    precision = json.loads((out / "recipe.json").read_text())["precision"]
    assert precision["training"] == ("bf16 (distill)" if expected == "bf16" else "fp32")
    assert ("distill: the stage's default" in precision["why"]) is (option is None and native)
    # the probe (its trainer, timed) and the training: both in that precision
    assert trained_in == [expected == "bf16"] * 2


def test_the_probe_times_documents_spread_through_the_corpora_it_will_encode():
    """The teacher's encoding is timed on documents spread through every corpus to encode, in proportion to its size
    (their lengths, not the first rows' of the first corpus): hand-computed rows."""
    big = [f"a{i}" for i in range(300)]
    small = [f"b{i}" for i in range(100)]
    # 8 of 400: 6 from the 300 (rows 0, 60, 120, 179, 239, 299) and 2 from the 100 (rows 0 and 99)
    assert spread_sample([big, small], 8) == ["a0", "a60", "a120", "a179", "a239", "a299", "b0", "b99"]
    # a corpus too small for its share still gives one document; an empty one none
    assert spread_sample([big, ["c0", "c1"], []], 4) == ["a0", "a100", "a199", "a299", "c0"]
    # fewer documents than asked: all of them, in order
    assert spread_sample([small[:3], big[:2]], 8) == ["b0", "b1", "b2", "a0", "a1"]


# ---- the loss holds its settings, the arguments the training's (issues 51, 65)
# a value other than the default for each option that sets a setting of the loss
OPTION_VALUES = {
    "distill_teacher_temperature": 2.5,
    "distill_in_batch_weight": 0.25,
    "distill_document_gradients": False,
}


def test_the_distill_mapping_takes_only_what_the_distillation_reads():
    """The ``distill:`` mapping is checked against DistillationTrainingArguments, the class the stage trains with: an
    iDRO field it never read is refused by name, a setting of the loss (a field once) is left to its option, and the
    student's temperature (a field once) is the loss's own, retired from the recipe."""
    from hf_cocodr.finetuning import DistillationTrainingArguments
    from hf_cocodr.recipe.stages.distill import LOSS_OPTIONS

    unknown = (
        r"^recipe option distill: unknown field\(s\) \['idro_preset'\], not DistillationTrainingArguments fields$"
    )
    with pytest.raises(ConfigError, match=unknown):
        RecipeConfig(distill={"idro_preset": "uniform"}).validate()
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['modir_lambda'\]"):
        RecipeConfig(distill={"modir_lambda": 0.1}).validate()
    for option in LOSS_OPTIONS:
        with pytest.raises(
            ConfigError, match=f"^recipe option distill.{option}: set the recipe option {option} instead$"
        ):
            RecipeConfig(distill={option: OPTION_VALUES[option]}).validate()
    with pytest.raises(ConfigError, match="^recipe option distill.distill_temperature is retired"):
        RecipeConfig.from_dict({"distill": {"distill_temperature": 0.1}})
    RecipeConfig(distill={"packed_forward": False, "max_length": 64}).validate()  # the trainer's own fields
    with pytest.raises(ConfigError, match=r"no field\(s\) \['idro_preset'\]"):
        DistillationTrainingArguments.from_arguments({"output_dir": "unused", "idro_preset": "uniform"})


def _stub_run(tmp_path, **options):
    """A run of the stage with ``options``, as far as its training arguments read it."""
    from types import SimpleNamespace

    distill = {"per_device_train_batch_size": 4, "bf16": False}
    cfg = RecipeConfig(skip_distill=False, target_queries=["q"], distill=distill, **options)
    run = SimpleNamespace(cfg=cfg, dir=lambda name: tmp_path / name, arguments={})
    run.arguments["distill"] = DistillStage().arguments(run)
    return run


def test_each_option_sets_the_setting_of_the_loss_the_stage_builds(tmp_path):
    """An option gives its setting to the loss the stage builds (and nothing to the training arguments), and it moves
    the stage's identity."""
    from hf_cocodr.recipe.stages.distill import LOSS_OPTIONS, loss_settings

    assert set(OPTION_VALUES) == set(LOSS_OPTIONS)
    plain = _stub_run(tmp_path)
    for option, setting in LOSS_OPTIONS.items():
        run = _stub_run(tmp_path, **{option: OPTION_VALUES[option]})
        assert loss_settings(run.cfg) == {**loss_settings(plain.cfg), setting: OPTION_VALUES[option]}
        assert loss_settings(plain.cfg)[setting] != OPTION_VALUES[option]
        assert run.arguments == plain.arguments


def _old_loss(model, cfg, similarity: str, vectors=None):
    """The loss the stage built by hand before the trainer built it from its arguments (its ``_loss_options``)."""
    from hf_cocodr.finetuning.losses.distill import HybridDistillLoss, QuerySideDistillLoss

    options = {
        "temperature": 0.05 if similarity == "cosine" else 1.0,
        "teacher_temperature": float(cfg.distill_teacher_temperature),
        "in_batch_weight": float(cfg.distill_in_batch_weight),
        "similarity": similarity,
    }
    if vectors is not None:
        return QuerySideDistillLoss(model, vectors, **options)
    return HybridDistillLoss(model, document_gradients=bool(cfg.distill_document_gradients), **options)


@pytest.mark.parametrize("options", [{}, OPTION_VALUES], ids=["defaults", "options"])
@pytest.mark.parametrize("side", ["full", "query"])
def test_the_loss_the_stage_builds_is_the_one_it_built_before(
    tiny_st_dir, tiny_bert_nomlm_dir, tmp_path, options, side
):
    """The loss the stage builds from its options (and, at the defaults, the trainer's default loss) gives the value
    of the loss the stage built by hand before on a small batch: for a cosine and a dot-product model, the full and
    the query-side distillation."""
    import random

    import tiny
    import torch
    from datasets import Dataset

    from hf_cocodr.data.teacher import FrozenCandidateRows, TeacherRows
    from hf_cocodr.finetuning import DistillationTrainer, DistillationTrainingArguments
    from hf_cocodr.finetuning.losses import distill_loss
    from hf_cocodr.modeling.asymmetric import query_side_model
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.recipe.runner import _model_similarity
    from hf_cocodr.recipe.stages.distill import loss_settings

    rng, k, n = random.Random(3), 3, 4
    topics = sorted(tiny.TOPICS)
    queries = [tiny.sentence(rng, rng.choice(topics), 5) for _ in range(n)]
    docs = [[tiny.sentence(rng, rng.choice(topics)) for _ in range(k)] for _ in range(n)]
    scores = [sorted((rng.gauss(0, 1) for _ in range(k)), reverse=True) for _ in range(n)]
    run = _stub_run(tmp_path, **options)
    forced = {"router_mapping": {"query": "query"}} if side == "query" else None
    args = DistillStage().training_arguments(run, DistillationTrainingArguments, 2, forced=forced)
    values = set()
    for path in (tiny_st_dir, tiny_bert_nomlm_dir):
        similarity = _model_similarity(str(path))[1]
        model = load_encoder(str(path)).eval()
        if side == "query":
            model = query_side_model(model).eval()
            vectors = torch.randn(n * k, model.get_embedding_dimension(), generator=torch.Generator().manual_seed(0))
            rows = FrozenCandidateRows(
                queries, scores, [[q * k + j for j in range(k)] for q in range(n)], vectors=vectors
            )
            old = _old_loss(model, run.cfg, similarity, vectors)
            features, labels = [model.preprocess(queries, task="query")], torch.as_tensor(rows.row_labels(range(n)))
        else:
            columns = {"query": queries, **{f"doc_{j + 1}": [d[j] for d in docs] for j in range(k)}, "label": scores}
            rows, old = Dataset.from_dict(columns), _old_loss(model, run.cfg, similarity)
            features = [model.preprocess(queries, task="query")]
            features += [model.preprocess([d[j] for d in docs], task="document") for j in range(k)]
            labels = torch.tensor(scores)
        loss = distill_loss(model, TeacherRows(rows), **loss_settings(run.cfg))  # (as the stage's build_trainer)
        trainer = DistillationTrainer(model=model, args=args, train_dataset=TeacherRows(rows), loss=loss)
        assert type(trainer.loss) is type(old) and trainer.loss.get_config_dict() == old.get_config_dict()
        if not options:  # the trainer's default loss is the stage's at the defaults
            default = DistillationTrainer(model=model, args=args, train_dataset=TeacherRows(rows)).loss
            assert default.get_config_dict() == old.get_config_dict()
        with torch.no_grad():
            got, expected = float(trainer.loss(features, labels)), float(old(features, labels))
        assert got == pytest.approx(expected, rel=1e-6)
        values.add(round(got, 6))
    assert len(values) == 2  # (the two models' losses differ: the batch tells them apart)


def test_an_old_run_folders_distillation_keeps_its_identity(tmp_path):
    """The stage's identity, pinned as the code before issue 65 computed it (commit 123371a: the loss's settings were
    fields of the arguments then, the identity named them one by one; its settings held ``idro_preset``), so a
    distillation finished then is skipped on a re-run: the whole model and the query side, at the defaults and with
    each loss option set. The teacher's weight and the side are as the schedule resolves them."""
    from hf_cocodr.rundir.run_record import digest

    def identity(**options):
        options = {"distill_teacher_weight": 0.5, "distill_side": "full", **options}
        run = _stub_run(tmp_path, distill_steps=10, **options)
        run.plan, run.fps, run.encode_precision = Plan(steps={"distill": 10}), {"model": "m", "targets": "t"}, "fp32"
        stage = DistillStage()
        stage.queries_digest, stage.num_queries = "digest", 240
        return digest(stage.identity(run, "start"))

    assert identity() == "61c569a66b5fb125"
    assert identity(**OPTION_VALUES) == "54a4ee34b9fe5000"  # the options of then, each set
    assert identity(distill_side="query") == "4b1502fea890e75d"
    assert identity(distill_side="query", **OPTION_VALUES) == "e8410475f511da8a"
    with pytest.raises(ConfigError, match="distill_side is still auto"):
        identity(distill_side="auto")


def test_the_teacher_weight_fit_distils_the_hybrid_fitted_to_each_corpus(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    """``--distill-teacher-weight fit``: the teacher's fusion is fitted to the corpus without labels (the rule the
    saved hybrid uses) and the teacher kept with its fit; a number keeps the fixed z-score fusion; anything else is
    refused by name, before any work."""
    import os

    import yaml

    from hf_cocodr.cli import main

    fitted = teacher_fusion(RecipeConfig(distill_teacher_weight="fit"))
    fixed = teacher_fusion(RecipeConfig(distill_teacher_weight=0.3))
    assert fitted.needs_fit and (fixed.needs_fit, fixed.dense_weight, fixed.normalize) == (False, 0.3, "z")
    for bad in ("fitted", 1.5, None):
        with pytest.raises(ConfigError, match="distill_teacher_weight"):
            RecipeConfig(distill_teacher_weight=bad).validate()
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({**CFG, "target_queries": [f"{tiny_beir}:train"], "distill_steps": 2}))
    args = ["recipe", "--model", str(tiny_bert_nomlm_dir), "--target-corpus", str(tiny_beir)]
    args += ["--source-data", str(tiny_beir), "--config", str(config), "--distill-teacher-weight"]
    teachers = Path(os.environ["HF_COCODR_CACHE"]) / "teacher"
    for weight, out in (("fit", tmp_path / "fit"), ("0.5", tmp_path / "fixed")):
        assert main([*args, weight, "--output_dir", str(out)]) == 0
        recorded = json.loads((out / "recipe.json").read_text())["config"]["distill_teacher_weight"]
        assert recorded == ("fit" if weight == "fit" else float(weight))
    # one teacher per model and corpus (the fixed run reads the fitted run's indexes): it was built, and kept, fitted
    (saved,) = teachers.glob("*/hybrid.json")
    assert json.loads(saved.read_text())["fusion"]["fit"] is not None
