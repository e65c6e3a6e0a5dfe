"""The adaptation levers of the recipe: WiSE-FT, target pseudo pairs, the schedule rule and the budget planner."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from tiny import crash_at

from hf_cocodr.data.pseudo_pairs import target_pseudo_pairs
from hf_cocodr.modeling.wise import interpolate_state_dicts, wise_ensemble
from hf_cocodr.recipe import (
    SCHEDULES,
    STAGE_LOAD_SECONDS,
    RecipeConfig,
    choose_schedule,
    plan_budget,
    stage_deadlines,
)


def _perturbed(model_dir, seed):
    from hf_cocodr import load_encoder

    st = load_encoder(str(model_dir))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in st.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return st


def test_wise_alpha_endpoints_are_exact_and_half_is_the_mean(tiny_st_dir):
    from hf_cocodr import load_encoder

    start = load_encoder(str(tiny_st_dir))
    adapted = _perturbed(tiny_st_dir, 0)
    s, a = start.state_dict(), adapted.state_dict()
    assert any(not torch.equal(s[k], a[k]) for k in s)
    zero = interpolate_state_dicts(s, a, 0.0)
    one = interpolate_state_dicts(s, a, 1.0)
    half = interpolate_state_dicts(s, a, 0.5)
    for k in s:
        assert torch.equal(zero[k], s[k]) and torch.equal(one[k], a[k]), k
        if s[k].is_floating_point():
            assert torch.allclose(half[k], (s[k] + a[k]) / 2, atol=1e-7, rtol=0), k
    merged = wise_ensemble(start, _perturbed(tiny_st_dir, 0), 0.5)
    texts = ["alpha beta", "gamma delta epsilon"]
    ref = load_encoder(str(tiny_st_dir))
    ref.load_state_dict(half)
    assert np.array_equal(merged.encode(texts), ref.encode(texts))


def test_wise_refuses_bad_alpha_and_mismatched_models(tiny_st_dir):
    s = {"w": torch.zeros(2, 3)}
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            interpolate_state_dicts(s, s, bad)
    with pytest.raises(ValueError, match="shape"):
        interpolate_state_dicts(s, {"w": torch.zeros(3, 3)}, 0.5)
    with pytest.raises(ValueError, match="differ in parameters"):
        interpolate_state_dicts(s, {"v": torch.zeros(2, 3)}, 0.5)


def test_title_body_pairs(tiny_beir):
    data = target_pseudo_pairs([tiny_beir], "title_body", seed=0, bm25_top_k=5)
    corpus = [json.loads(line) for line in open(tiny_beir / "corpus.jsonl")]
    assert len(data) == len(corpus) and data.pseudo_pairs_mode == "title_body"
    for r in range(len(data)):
        (pos,) = data.positives(r)
        assert data.query_texts[r] == corpus[r]["title"]
        assert data.doc_texts([pos]) == [corpus[r]["text"]]  # the body alone: the title is not in the positive
        negs = data.negatives(r)
        assert len(negs) == 5 and pos not in negs


def test_ict_pairs_take_one_sentence_out(tiny_beir):
    from hf_cocodr.data.spans import split_sentences_regex

    data = target_pseudo_pairs([tiny_beir], "ict", seed=3, negatives="none")
    corpus = [json.loads(line) for line in open(tiny_beir / "corpus.jsonl")]
    assert len(data) > 0
    for r in range(len(data)):
        q = data.query_texts[r]
        doc = corpus[int(data.query_ids[r].rsplit("/", 1)[1])]["text"]
        sents = split_sentences_regex(doc)
        rest = data.doc_texts(data.positives(r))[0]
        assert (
            q in sents
            and rest == " ".join(s for s in sents if s != q or sents.count(q) > 1)
            or sorted(split_sentences_regex(rest) + [q]) == sorted(sents)
        )


def test_pseudo_pairs_without_titles_are_refused(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"Sentence one about {i}. Sentence two."}) for i in range(5)))
    with pytest.raises(ValueError, match="no titles"):
        target_pseudo_pairs([f], "title_body")
    assert len(target_pseudo_pairs([f], "ict", negatives="none")) == 5


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
    for kind in ("no_mlm_head", "mlm_head"):
        assert SCHEDULES[kind]["coco_mlm_weight"] == 1.0 and SCHEDULES[kind]["target_pairs"] == "none"
        assert SCHEDULES[kind]["wise_alpha"] is None and SCHEDULES[kind]["skip_coco"] is False
    assert SCHEDULES["no_mlm_head"]["skip_finetune"] is True and SCHEDULES["no_mlm_head"]["coco_runs"] == "budget"
    assert SCHEDULES["mlm_head"]["skip_finetune"] is False and SCHEDULES["mlm_head"]["coco_runs"] == 1
    assert "30%" in choose_schedule(RecipeConfig(), False)[1]["mlm_head"]
    assert "30%" in choose_schedule(RecipeConfig(), None)[1]["mlm_head"]  # a Hub id cannot be inspected: warmed up
    assert "mlm_head" not in choose_schedule(RecipeConfig(), True)[1]


def test_unlabelled_target_queries_give_a_model_without_mlm_head_the_distillation_alone():
    queries = ["data/scifact:train"]
    cfg, record = choose_schedule(RecipeConfig(target_queries=queries), False)
    assert record["kind"] == "no_mlm_head_queries" and "target queries" in record["why"]
    assert (cfg.skip_coco, cfg.skip_finetune, cfg.skip_distill, cfg.distill_share) == (True, True, False, 1.0)
    assert "mlm_head" not in record  # no COCO: no fresh head to warm up
    # COCO asked for beside it gets an equal share; a model with an MLM head keeps its schedule (no distillation)
    both, record = choose_schedule(RecipeConfig(target_queries=queries, skip_coco=False), False)
    assert (both.skip_coco, both.coco_share, both.distill_share) == (False, 1.0, 1.0) and "mlm_head" in record
    head, record = choose_schedule(RecipeConfig(target_queries=queries), True)
    assert record["kind"] == "mlm_head" and head.skip_distill is True and head.skip_coco is False
    # a setting given by the user wins and is recorded as theirs
    cfg, record = choose_schedule(RecipeConfig(wise_alpha=None, coco_mlm_weight=0.3), False)
    assert cfg.wise_alpha is None and cfg.coco_mlm_weight == 0.3
    assert record["set_by_user"] == {"wise_alpha": None, "coco_mlm_weight": 0.3}


def test_the_recipe_trains_the_stages_the_rule_gives_each_kind_of_model(
    tiny_bert_dir, tiny_bert_nomlm_dir, tiny_beir, tmp_path
):
    """End to end with only step counts set: a head-less tiny model gets a COCO soup (3 runs of coco_run_steps without
    a budget) and no fine-tuning; a tiny model with an MLM head gets one COCO run, then iDRO."""
    from hf_cocodr.recipe import run_recipe

    small = {
        "finetune_steps": 2,
        "corpus_pool": None,
        "coco": {"per_device_train_batch_size": 8, "save_steps": 2},
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 2},
    }
    cases = (
        (tiny_bert_nomlm_dir, {"coco_run_steps": 2}, 3, {"coco": 2}),
        (tiny_bert_dir, {"coco_steps": 2}, 1, {"coco": 2, "finetune": 2}),
    )
    for model_dir, steps, runs, trained in cases:
        out = tmp_path / model_dir.name
        run_recipe(str(model_dir), [str(tiny_beir)], str(tiny_beir), out, config={**small, **steps})
        record = json.loads((out / "recipe.json").read_text())
        assert record["plan"]["coco_runs"] == runs and record["steps_trained"] == trained, model_dir.name
        assert (out / "coco-runs").is_dir() == (runs > 1)
        assert (out / "finetune").is_dir() == ("finetune" in trained)


def test_without_target_corpus_a_headless_model_falls_back_to_the_source_fine_tuning(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path
):
    """The head-less schedule trains COCO alone; with no target corpus there is no COCO, so the source fine-tuning the
    schedule left out runs instead (recorded as chosen). With every stage switched off by the user: refused by name,
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
            str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "none", config={"skip_coco": True}
        )
    assert not (tmp_path / "none").exists()


def test_a_stage_the_user_switches_on_gets_a_share_of_the_budget():
    """The schedule gives target pairs no share; asking for them must not plan them 2 steps."""
    from hf_cocodr.errors import ConfigError

    tp = {"coco_step_s": 4.0, "finetune_step_s": 10.0, "target_step_s": 8.0}
    alone, record = choose_schedule(RecipeConfig(skip_coco=True, skip_finetune=True, target_pairs="ict"), False)
    assert alone.target_share == 1.0 and record["chosen"]["target_share"] == 1.0
    plan = plan_budget(480.0, tp, alone, overhead_s=40.0, pool_docs=0, n_queries=0, idro=False)
    assert plan["target_steps"] == int(440.0 / 8.0)
    # beside the paper's two stages (shares 0.4 / 0.6) it gets their mean, 0.5, and the record says so
    added, record = choose_schedule(RecipeConfig(target_pairs="title_body"), True)
    assert (added.coco_share, added.finetune_share, added.target_share) == (0.4, 0.6, 0.5)
    assert record["chosen"]["target_share"] == 0.5
    plan = plan_budget(900.0, tp, added, overhead_s=0.0, pool_docs=0, n_queries=0, idro=False)
    assert plan["target_steps"] == int(900.0 * 0.5 / 1.5 / 8.0)
    # a share the user gives is kept; a 0 for a stage that runs is refused by name; fixed steps need no share
    assert choose_schedule(RecipeConfig(target_pairs="ict", target_share=0.2), False)[0].target_share == 0.2
    with pytest.raises(ConfigError, match="target_share is 0 but the target stage runs"):
        choose_schedule(RecipeConfig(target_pairs="ict", target_share=0.0), False)
    assert (
        choose_schedule(RecipeConfig(target_pairs="ict", target_share=0.0, target_steps=3), False)[0].target_steps == 3
    )
    # beside a head-less model's COCO soup alone (share 1) it gets 1: half the budget each
    beside_soup, _ = choose_schedule(RecipeConfig(target_pairs="title_body"), False)
    assert (beside_soup.coco_share, beside_soup.target_share) == (1.0, 1.0)
    # in the joint schedule the pairs are a term of the source steps: no share of their own is needed
    joint, _ = choose_schedule(RecipeConfig(target_pairs="title_body", target_schedule="joint"), True)
    assert joint.target_share == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(coco_mlm_weight=float("nan")),
        dict(wise_alpha=1.5),
        dict(coco_steps=-5),
        dict(target_pairs="titles"),
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
        "target_step_s": 8.0,
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
    assert plan["target_steps"] == int(left * shares["target_share"] / 8.0)
    assert plan["planned_optimizer_share"] >= 0.7
    # a small pool is refreshed, and the refresh is charged before the steps are split
    small = plan_budget(900.0, tp, cfg, overhead_s=60.0, pool_docs=1000, n_queries=1000, idro=True)
    assert small["refreshes"] == 2 and small["finetune_steps"] < plan["finetune_steps"]
    # a head-less model's schedule: the budget goes to COCO runs of about 76 steps (hand-computed:
    # round((840 + 20) / (76 x 4 + 20)) = 3 runs of (840 - 2 x 20) / (3 x 4) = 66 steps), >= 70% of it to steps
    soup, _ = choose_schedule(RecipeConfig(), False)
    p = plan_budget(900.0, tp, soup, overhead_s=60.0, pool_docs=20_000, n_queries=1000, idro=True)
    assert (p["coco_runs"], p["coco_steps"], p["finetune_steps"], p["refreshes"]) == (3, 66, 0, 0)
    assert p["planned_optimizer_share"] == round(3 * 66 * 4.0 / 900.0, 3) >= 0.7
    # stages that do not run get no steps, and the others share the budget
    only, _ = choose_schedule(RecipeConfig(skip_coco=True, target_pairs="none", refreshes=0), True)
    p = plan_budget(900.0, tp, only, overhead_s=0.0, pool_docs=0, n_queries=0, idro=False)
    assert (p["coco_steps"], p["target_steps"], p["finetune_steps"]) == (0, 0, 90)


def test_the_budget_sizes_the_source_draw_and_charges_what_grows_with_it():
    """Hand-computed: 900 s, 100 s spent before planning, 1 s per source step of 32 queries, BM25 mining 1/32 s and
    the first K-Means encoding 1/64 s per query, no refreshes. q queries leave floor(800 - 3q/64) steps; the steps
    see every drawn query once while 32 x floor(800 - 3q/64) >= q, i.e. up to q = 10,240 (320 steps; 10,241 would
    leave 319 steps for 10,241 queries)."""
    from hf_cocodr.recipe import size_source_queries

    cfg, _ = choose_schedule(RecipeConfig(skip_coco=True, target_pairs="none", refreshes=0), True)
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
    monkeypatch.setattr(recipe, "measure_throughput", lambda *a, **k: dict(tp))
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


def _joint_run(tiny_st_dir, tiny_beir, tmp_path, name, weight=None, steps=2):
    from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
    from hf_cocodr.methods.joint import JointPseudoPairs, TargetPairsObjective

    torch.manual_seed(0)
    model = load_encoder(str(tiny_st_dir))
    for m in model.modules():  # no dropout: the extra forward of the joint term must not shift any RNG stream
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=8,
        max_steps=steps,
        num_clusters=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=5,
        learning_rate=1e-3,
        dataloader_drop_last=True,
        num_negatives=1,
    )
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    joint = []
    if weight is not None:
        pairs = target_pseudo_pairs([tiny_beir], "title_body", seed=1, bm25_top_k=5)
        objective = TargetPairsObjective(pairs, weight, batch_size=6, similarity="dot", scale=1.0, seed=1)
        joint = [JointPseudoPairs(objective)]
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, methods=joint)
    trainer.train()
    return trainer, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_joint_with_target_weight_zero_is_plain_idro(tiny_st_dir, tiny_beir, tmp_path):
    _, plain = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "plain")
    tr, zero = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "zero", weight=0.0)
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    assert not any("target_pairs_loss" in h for h in tr.state.log_history)
    tr1, one = _joint_run(tiny_st_dir, tiny_beir, tmp_path, "one", weight=1.0)
    assert any(not torch.equal(plain[k], one[k]) for k in plain)
    assert any("target_pairs_loss" in h for h in tr1.state.log_history)


def test_joint_term_is_the_infonce_of_the_sampled_pairs(tiny_st_dir, tiny_beir):
    """The term equals a hand-written InfoNCE over the same pairs (dot product, in-batch + hard negatives), scaled
    by its weight; with the source loss weighted 0 it would be the whole gradient."""
    from hf_cocodr import load_encoder
    from hf_cocodr.methods.joint import TargetPairsObjective

    model = load_encoder(str(tiny_st_dir)).eval()
    pairs = target_pseudo_pairs([tiny_beir], "title_body", seed=1, bm25_top_k=5)
    obj = TargetPairsObjective(pairs, 0.5, batch_size=4, similarity="dot", scale=1.0, seed=1)
    rows = obj.sample_rows(3, 4)
    assert len(set(rows.tolist())) == 4 and np.array_equal(rows, obj.sample_rows(3, 4))
    with torch.no_grad():
        term = obj.compute(model, [torch.zeros(4, 2)], None, {"step": 3})["target_pairs_loss"]
        cols, _, _ = pairs.sample(rows, step=3, seed=1, num_negatives=1)
        q = torch.as_tensor(model.encode_query(cols[0]))
        d = torch.as_tensor(np.concatenate([model.encode_document(cols[1]), model.encode_document(cols[2])]))
        s = q @ d.T
        by_hand = -(s.diagonal() - torch.logsumexp(s, dim=1)).mean()
    assert float(term) == pytest.approx(0.5 * float(by_hand), rel=1e-4)


def _study_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "adaptation_study.py"
    spec = importlib.util.spec_from_file_location("adaptation_study", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_killed_study_arm_resumes_to_the_same_row(tiny_bert_nomlm_dir, tmp_path, monkeypatch, caplog):
    """A study arm killed mid-stage resumes from its last complete checkpoint and reports exactly the row of an
    uninterrupted run (same steps, same data draws, same evaluation)."""
    import argparse

    import tiny

    from hf_cocodr.finetuning import IDROTrainer

    root = tmp_path / "data"
    for name, seed in (("scifact", 1), ("nfcorpus", 2), ("squad-v1.1", 3)):
        tiny.make_beir(root / name, seed=seed)
    study = _study_module()
    overrides = {
        "max_queries": None,
        "corpus_pool": None,
        "coco": {"per_device_train_batch_size": 8},
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3},
        "target": {"per_device_train_batch_size": 8, "save_steps": 1},
    }

    def ns(work):
        return argparse.Namespace(
            work=str(work), budget_minutes=1.0, doc_max_length=32, fixed_steps=3, overrides=overrides
        )

    model = str(tiny_bert_nomlm_dir)
    whole = study.run_arm("title-body", 0, ns(tmp_path / "a"), root, model)

    undo = crash_at(monkeypatch, IDROTrainer, 2, "killed")
    with pytest.raises(RuntimeError, match="killed"):
        study.run_arm("title-body", 0, ns(tmp_path / "b"), root, model)
    undo()
    import logging

    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        resumed = study.run_arm("title-body", 0, ns(tmp_path / "b"), root, model)
    assert any("resuming from" in r.getMessage() and "checkpoint-2" in r.getMessage() for r in caplog.records)
    assert resumed["metrics"] == whole["metrics"]
    assert resumed["plan"]["target_steps"] == 3
    # the WiSE-FT arm reuses the trained arm and adds only an interpolation + an evaluation
    wise = study.run_arm("title-body+wise0.5", 0, ns(tmp_path / "b"), root, model)
    assert wise["model_dir"] == resumed["model_dir"] and set(wise["metrics"]) == set(resumed["metrics"])
    # ARM@STAGE evaluates what one stage left behind: title-body's only stage is its final model
    staged = study.run_arm("title-body@target", 0, ns(tmp_path / "b"), root, model)
    assert staged["metrics"] == resumed["metrics"]
    with pytest.raises(SystemExit, match="no stage 'coco'"):
        study.run_arm("title-body@coco", 0, ns(tmp_path / "b"), root, model)


def test_study_report_calls_differences_within_the_seed_spread_the_same(tmp_path):
    """A Δ to the start beyond the arm's own seed half-range is better/worse, within it same; the stricter column uses
    the largest half-range of any arm. Hand-made rows: title-body seeds give SciFact 0.62 / 0.63 / 0.64 (spread
    ±0.01, mean 0.63 vs start 0.60 -> better) and NFCorpus 0.30 / 0.305 / 0.31 (±0.005, mean 0.305 vs start 0.302 ->
    same); source-only (3 seeds) is 0.58 / 0.28 (worse / worse); coco-mlm1 is SciFact 0.607 / 0.608 / 0.609 (Δ
    +0.008 beyond its own ±0.001: better; within the largest ±0.01: same) and NFCorpus 0.306 in every seed (Δ
    +0.004 beyond its own ±0: better; within the largest ±0.005: same); a one-seed arm gets no verdict."""
    import argparse
    import json

    study = _study_module()

    def row(sf, nf):
        return {
            "metrics": {
                "SciFact dev": {"ndcg@10": sf, "recall@100": 0.9},
                "NFCorpus dev": {"ndcg@10": nf, "recall@100": 0.3},
            }
        }

    steps = {"coco_steps": 0, "finetune_steps": 0, "target_steps": 38, "refreshes": 0}
    # seed 42 was planned by the clock (8 minutes, 74% for optimizer steps); 43 and 44 trained its steps on a busy
    # machine, so their (longer) times must not enter the train-minutes column
    timing = {
        42: {"plan": {**steps, "max_minutes": 8.0, "planned_optimizer_share": 0.74}, "train_seconds": 450.0},
        43: {"plan": steps, "train_seconds": 900.0},
        44: {"plan": steps, "train_seconds": 1200.0},
    }
    rows = {
        "start": {0: row(0.60, 0.302)},
        "title-body": {
            s: {**row(*v), **timing[s]} for s, v in ((42, (0.62, 0.30)), (43, (0.64, 0.31)), (44, (0.63, 0.305)))
        },
        "source-only": {s: row(0.58, 0.28) for s in (42, 43, 44)},
        "ict": {42: row(0.70, 0.35)},
        "coco-mlm1": {42: row(0.607, 0.306), 43: row(0.608, 0.306), 44: row(0.609, 0.306)},
    }
    ns = argparse.Namespace(
        work=str(tmp_path / "work"),
        budget_minutes=8.0,
        doc_max_length=128,
        report=str(tmp_path / "rep"),
        findings=str(tmp_path / "none.md"),
    )
    study.write_report(ns, rows)
    report = json.loads((tmp_path / "rep.json").read_text())
    assert report["noise_ndcg@10"] == pytest.approx({"SciFact dev": 0.01, "NFCorpus dev": 0.005})
    assert report["arms"]["title-body"]["SciFact dev ndcg@10"]["mean"] == pytest.approx(0.63)
    assert "--arms title-body --seeds 42,43,44" in report["commands"]["title-body"]
    text = (tmp_path / "rep.md").read_text()
    by_arm = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| better / same | better / same |" in by_arm["title-body"]
    assert "| worse | worse |" in by_arm["source-only"]
    assert "| better | same |" in by_arm["coco-mlm1"]
    assert "| n<3 |" in by_arm["ict"]
    assert "+0.0300" in by_arm["title-body"]
    assert "| 0 / 0 / 38 (0) | 7.5 (74%) |" in by_arm["title-body"]


def test_further_seeds_train_the_steps_of_the_first_seeds_plan(tmp_path):
    """Seed 43 of an arm gets exactly the steps seed 42's wall-clock plan bought; a stage planned with 0 steps is
    skipped, not planned anew; without seed 42's plan the study stops with a message naming the file."""
    import argparse
    import json

    study = _study_module()
    ns = argparse.Namespace(work=str(tmp_path), budget_minutes=8.0, plan_from_seed=42)
    plan_dir = study.arm_dir(tmp_path, 8.0, "title-body", 42) / "run"
    with pytest.raises(SystemExit, match="plan.json"):
        study.planned_steps(ns, "title-body", 43)
    plan_dir.mkdir(parents=True)
    (plan_dir / "plan.json").write_text(
        json.dumps({"coco_steps": 0, "finetune_steps": 12, "target_steps": 0, "refreshes": 0})
    )
    assert study.planned_steps(ns, "title-body", 43) == {
        "refreshes": 0,
        "skip_coco": True,
        "finetune_steps": 12,
        "target_pairs": "none",
    }
    # seed 42's clock stopped its source stage at step 9: further seeds train 9 steps
    (plan_dir / "recipe.json").write_text(json.dumps({"steps_trained": {"finetune": 9}}))
    assert study.planned_steps(ns, "title-body", 43)["finetune_steps"] == 9
    # a soup: further seeds train as many COCO runs of as many steps
    soup_dir = study.arm_dir(tmp_path, 8.0, "coco-soup", 42) / "run"
    soup_dir.mkdir(parents=True)
    (soup_dir / "plan.json").write_text(
        json.dumps({"coco_steps": 74, "coco_runs": 4, "finetune_steps": 0, "target_steps": 0, "refreshes": 0})
    )
    assert study.planned_steps(ns, "coco-soup", 43) == {
        "refreshes": 0,
        "coco_steps": 74,
        "coco_runs": 4,
        "skip_finetune": True,
        "target_pairs": "none",
    }


def test_study_keeps_the_reported_rows_whose_cache_is_gone(tmp_path):
    """``outputs/`` is not committed: on a fresh checkout the report's JSON stands in for the runs it recorded (rows
    and the plan further seeds follow), a row found in the cache replaces the recorded one, and a report written for
    another budget is not mixed in."""
    import argparse
    import json

    study = _study_module()

    def row(sf, nf, **extra):
        return {
            "metrics": {
                "SciFact dev": {"ndcg@10": sf, "recall@100": 0.9},
                "NFCorpus dev": {"ndcg@10": nf, "recall@100": 0.3},
            },
            **extra,
        }

    plan = {"coco_steps": 70, "finetune_steps": 0, "target_steps": 0, "refreshes": 0, "max_minutes": 15.0}
    ns = argparse.Namespace(
        work=str(tmp_path / "work"),
        budget_minutes=15.0,
        doc_max_length=128,
        plan_from_seed=42,
        report=str(tmp_path / "rep"),
        findings=None,
    )
    study.write_report(
        ns,
        {
            "start": {0: row(0.60, 0.30)},
            "coco-mlm1": {42: row(0.62, 0.31, plan=plan, steps_trained={"coco": 66}, train_seconds=880.0)},
        },
    )
    # the start row is cached again (a new measurement); coco-mlm1's cache is gone
    cache = study.arm_dir(tmp_path / "work", 15.0, "start", 0)
    cache.mkdir(parents=True)
    (cache / "dev_eval.json").write_text(json.dumps({"doc_max_length": 128, "metrics": row(0.61, 0.30)["metrics"]}))
    rows = study.cached_rows(ns, tmp_path, "unused-model")
    assert rows["start"][0]["metrics"]["SciFact dev"]["ndcg@10"] == 0.61
    assert rows["coco-mlm1"][42]["metrics"]["SciFact dev"]["ndcg@10"] == 0.62
    # seed 43 trains the 66 steps seed 42 ran, from the report
    assert study.planned_steps(ns, "coco-mlm1", 43) == {
        "refreshes": 0,
        "coco_steps": 66,
        "coco_runs": 1,
        "skip_finetune": True,
        "target_pairs": "none",
    }
    study.write_report(ns, rows)
    assert json.loads((tmp_path / "rep.json").read_text())["arms"]["coco-mlm1"]["SciFact dev ndcg@10"]["values"] == [
        0.62
    ]
    other = argparse.Namespace(**{**vars(ns), "budget_minutes": 8.0})
    assert study.recorded_rows(other) == {}


def test_soup_is_the_uniform_mean_of_the_runs(tiny_st_dir):
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.wise import average_state_dicts, soup

    runs = [_perturbed(tiny_st_dir, seed) for seed in (1, 2, 3)]
    sds = [r.state_dict() for r in runs]
    one = average_state_dicts(sds[:1])
    assert all(torch.equal(one[k], sds[0][k]) for k in sds[0])  # a soup of one run is that run, exactly
    mean = average_state_dicts(sds)
    for k, t in sds[0].items():
        if t.is_floating_point():
            hand = (sds[0][k].double() + sds[1][k].double() + sds[2][k].double()) / 3
            assert torch.allclose(mean[k].double(), hand, atol=1e-7, rtol=0), k
        else:
            assert torch.equal(mean[k], t), k
    merged = soup([_perturbed(tiny_st_dir, seed) for seed in (1, 2, 3)])
    ref = load_encoder(str(tiny_st_dir))
    ref.load_state_dict(mean)
    texts = ["alpha beta", "gamma delta epsilon"]
    assert np.array_equal(merged.encode(texts), ref.encode(texts))
    with pytest.raises(ValueError, match="shape"):
        average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])
    with pytest.raises(ValueError, match="at least one"):
        average_state_dicts([])


def test_coco_runs_share_the_budget():
    """Hand-computed: 800 s of COCO at 2.5 s a step, runs of about 76 steps (190 s + 20 s load each):
    round((800 + 20) / 210) = 4 runs, then (800 - 3 x 20) / (4 x 2.5) = 74 steps each."""
    from hf_cocodr.recipe import STAGE_LOAD_SECONDS, coco_runs_for

    assert STAGE_LOAD_SECONDS == 20.0
    cfg = RecipeConfig(coco_runs="budget", coco_run_steps=76)
    assert coco_runs_for(800.0, 2.5, cfg, None) == (4, 74)
    assert coco_runs_for(100.0, 2.5, cfg, None) == (1, None)  # less than one run: one run, planned as before
    assert coco_runs_for(800.0, 2.5, cfg, 30) == (9, 30)  # fixed steps per run: round(820 / 95) runs of them
    assert coco_runs_for(800.0, 2.5, RecipeConfig(coco_runs=2), None) == (2, int(780.0 / 5.0))
    assert coco_runs_for(800.0, 2.5, RecipeConfig(coco_runs=1), None) == (1, None)
    # in a whole plan: the runs' steps are optimizer seconds, their extra loads are not
    only_coco, _ = choose_schedule(RecipeConfig(coco_runs="budget", skip_finetune=True), False)
    plan = plan_budget(900.0, {"coco_step_s": 2.5}, only_coco, overhead_s=100.0, pool_docs=0, n_queries=0, idro=False)
    assert (plan["coco_runs"], plan["coco_steps"]) == (4, 74)
    assert plan["planned_optimizer_share"] == round(4 * 74 * 2.5 / 900.0, 3)
    for bad in ({"coco_runs": 0}, {"coco_runs": "many"}, {"coco_run_steps": 0}):
        from hf_cocodr.errors import ConfigError

        with pytest.raises(ConfigError, match=next(iter(bad))):
            RecipeConfig.from_dict(bad)


def test_a_recipe_soup_is_the_mean_of_its_runs_and_its_first_run_is_the_single_run(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, caplog
):
    from safetensors.torch import load_file

    from hf_cocodr.modeling.wise import average_state_dicts
    from hf_cocodr.recipe import run_recipe

    cfg = dict(
        skip_finetune=True,
        target_pairs="none",
        wise_alpha=None,
        coco_steps=2,
        corpus_pool=None,
        coco={"per_device_train_batch_size": 8, "save_steps": 2},
    )

    def weights(folder):
        return load_file(str(folder / "model.safetensors"))

    soup_out, single_out = tmp_path / "soup", tmp_path / "single"
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), soup_out, config={**cfg, "coco_runs": 2})
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), single_out, config={**cfg, "coco_runs": 1})
    runs = [weights(soup_out / "coco-runs" / f"run-{i}") for i in range(2)]
    assert any(not torch.equal(runs[0][k], runs[1][k]) for k in runs[0])  # the seeds differ
    single = weights(single_out / "coco")
    assert all(torch.equal(runs[0][k], single[k]) for k in single)  # run 0 is the single run, bit for bit
    mean, souped = average_state_dicts(runs), weights(soup_out / "coco")
    assert all(torch.equal(mean[k], souped[k]) for k in mean)
    assert all(torch.equal(souped[k], v) for k, v in weights(soup_out / "model").items())  # the final model
    record = json.loads((soup_out / "recipe.json").read_text())
    assert record["plan"]["coco_runs"] == 2 and record["steps_trained"] == {"coco": 2}
    assert "model soup" in (soup_out / "model" / "README.md").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):  # a re-run trains nothing
        run_recipe(
            str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), soup_out, config={**cfg, "coco_runs": 2}
        )
    assert any("stage coco: already finished" in r.getMessage() for r in caplog.records)


def test_a_killed_soup_resumes_to_the_uninterrupted_soup(tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch):
    """A crash in the second COCO run: the re-run skips the first run, resumes the second from its checkpoint, and
    the soup is bit for bit the soup of an uninterrupted run."""
    from safetensors.torch import load_file

    from hf_cocodr.pretraining import CocoPretrainer
    from hf_cocodr.recipe import run_recipe

    cfg = dict(
        skip_finetune=True,
        target_pairs="none",
        wise_alpha=None,
        coco_steps=3,
        corpus_pool=None,
        coco_runs=2,
        coco={"per_device_train_batch_size": 8, "save_steps": 1},
    )
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "whole", config=cfg)
    original = CocoPretrainer.training_step

    def crash_in_run_2(self, *a, **k):
        if self.args.seed == 43 and self.state.global_step == 2:
            raise RuntimeError("simulated crash")
        return original(self, *a, **k)

    monkeypatch.setattr(CocoPretrainer, "training_step", crash_in_run_2)
    out = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    assert (out / "coco-runs" / "run-0" / "hf_cocodr_stage.json").is_file()
    assert not (out / "coco-runs" / "run-1" / "hf_cocodr_stage.json").exists()
    monkeypatch.setattr(CocoPretrainer, "training_step", original)
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    whole, resumed = (load_file(str(d / "model" / "model.safetensors")) for d in (tmp_path / "whole", out))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_step_probe_runs_in_the_precision_the_stages_train_in(tiny_bert_nomlm_dir, tiny_beir, monkeypatch, bf16):
    """A stage set to bf16 trains under bf16 autocast; the planner's probe must time its steps the same way, or a
    bf16 recipe is planned with fp32 step times and leaves a third of its budget unused."""
    from transformers import AutoTokenizer

    from hf_cocodr import IDROTrainingArguments, RetrievalTrainingData
    from hf_cocodr.data.spans import SpanCorpus
    from hf_cocodr.finetuning.losses.idro import IDROLoss
    from hf_cocodr.modeling.condenser import CondenserForPretraining
    from hf_cocodr.pretraining import CocoPretrainingArguments
    from hf_cocodr.recipe import measure_throughput

    seen = {"coco": [], "finetune": []}

    def spy(cls, name):
        original = cls.forward

        def forward(self, *a, **kw):
            seen[name].append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
            return original(self, *a, **kw)

        monkeypatch.setattr(cls, "forward", forward)

    spy(CondenserForPretraining, "coco")
    spy(IDROLoss, "finetune")
    common = dict(report_to="none", use_cpu=True, max_steps=1, per_device_train_batch_size=4)
    coco_args = CocoPretrainingArguments(output_dir="unused", **common)
    ft_args = IDROTrainingArguments(output_dir="unused", num_clusters=3, num_negatives=1, **common)
    coco_args.bf16 = ft_args.bf16 = bf16  # set after validation: the probe, not the Trainer, is under test
    spans = SpanCorpus.build([tiny_beir], AutoTokenizer.from_pretrained(tiny_bert_nomlm_dir), cache=False)
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    tp = measure_throughput(str(tiny_bert_nomlm_dir), coco_args, ft_args, spans, data, "mean")
    assert {"coco_step_s", "finetune_step_s"} <= set(tp)
    assert seen["coco"] and set(seen["coco"]) == {bf16}
    assert seen["finetune"] and set(seen["finetune"]) == {bf16}


def test_step_timing_is_the_median_of_the_timed_calls_after_a_warm_up(monkeypatch):
    """Hand-made clock: the warm-up call is not timed and one slow call does not move the plan."""
    import hf_cocodr.recipe.probe as recipe

    ticks = iter([0.0, 2.0, 10.0, 19.0, 20.0, 23.0])  # timed calls take 2, 9 and 3 seconds
    calls = []
    monkeypatch.setattr(recipe.time, "perf_counter", lambda: next(ticks))
    assert recipe._time_it(lambda: calls.append(1), repeats=3) == 3.0
    assert len(calls) == 4  # the warm-up, then three timed calls
