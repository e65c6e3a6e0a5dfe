"""The adaptation study script (``scripts/studies/adaptation_study.py``): resumed arms, the report's verdicts,
further seeds, rows whose cache is gone."""

from __future__ import annotations

import json
import logging

import pytest
from tiny import crash_at


def _study_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "studies" / "adaptation_study.py"
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
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 1},
    }

    def ns(work):
        return argparse.Namespace(
            work=str(work), budget_minutes=1.0, doc_max_length=32, fixed_steps=3, overrides=overrides
        )

    model = str(tiny_bert_nomlm_dir)
    whole = study.run_arm("source-only", 0, ns(tmp_path / "a"), root, model)

    undo = crash_at(monkeypatch, IDROTrainer, 2, "killed")
    with pytest.raises(RuntimeError, match="killed"):
        study.run_arm("source-only", 0, ns(tmp_path / "b"), root, model)
    undo()

    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        resumed = study.run_arm("source-only", 0, ns(tmp_path / "b"), root, model)
    assert any("resuming from" in r.getMessage() and "checkpoint-2" in r.getMessage() for r in caplog.records)
    assert resumed["metrics"] == whole["metrics"]
    assert resumed["plan"]["finetune_steps"] == 3
    # the WiSE-FT arm reuses the trained arm and adds only an interpolation + an evaluation
    wise = study.run_arm("source-only+wise0.5", 0, ns(tmp_path / "b"), root, model)
    assert wise["model_dir"] == resumed["model_dir"] and set(wise["metrics"]) == set(resumed["metrics"])
    # ARM@STAGE evaluates what one stage left behind: source-only's only stage is its final model
    staged = study.run_arm("source-only@finetune", 0, ns(tmp_path / "b"), root, model)
    assert staged["metrics"] == resumed["metrics"]
    with pytest.raises(SystemExit, match="no stage 'coco'"):
        study.run_arm("source-only@coco", 0, ns(tmp_path / "b"), root, model)


def test_study_report_calls_differences_within_the_seed_spread_the_same(tmp_path):
    """A Δ to the start beyond the arm's own seed half-range is better/worse, within it same; the stricter column uses
    the largest half-range of any arm. Hand-made rows: title-body seeds give SciFact 0.62 / 0.63 / 0.64 (spread
    ±0.01, mean 0.63 vs start 0.60 -> better) and NFCorpus 0.30 / 0.305 / 0.31 (±0.005, mean 0.305 vs start 0.302 ->
    same); source-only (3 seeds) is 0.58 / 0.28 (worse / worse); coco-mlm1 is SciFact 0.607 / 0.608 / 0.609 (Δ
    +0.008 beyond its own ±0.001: better; within the largest ±0.01: same) and NFCorpus 0.306 in every seed (Δ
    +0.004 beyond its own ±0: better; within the largest ±0.005: same); a one-seed arm gets no verdict."""
    import argparse

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
    }


def test_study_keeps_the_reported_rows_whose_cache_is_gone(tmp_path):
    """``outputs/`` is not committed: on a fresh checkout the report's JSON stands in for the runs it recorded (rows
    and the plan further seeds follow), a row found in the cache replaces the recorded one, and a report written for
    another budget is not mixed in."""
    import argparse

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
    }
    study.write_report(ns, rows)
    assert json.loads((tmp_path / "rep.json").read_text())["arms"]["coco-mlm1"]["SciFact dev ndcg@10"]["values"] == [
        0.62
    ]
    other = argparse.Namespace(**{**vars(ns), "budget_minutes": 8.0})
    assert study.recorded_rows(other) == {}
