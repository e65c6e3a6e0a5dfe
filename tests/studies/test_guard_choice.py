"""The guard-choice study (``scripts/studies/guard_choice.py``, issue 49) on hand-made runs: it reads each run's dev
gains and guard readings, ranks them as given, and chooses per seed the run with the highest reading."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest


def _study():
    spec = importlib.util.spec_from_file_location(
        "guard_choice_under_test", Path(__file__).resolve().parents[2] / "scripts" / "studies" / "guard_choice.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root: Path, arm: str, seed: int, scifact: float, nfcorpus: float, pseudo: float, queries: float) -> None:
    folder = root / arm / f"seed{seed}"
    (folder / "run").mkdir(parents=True)
    metrics = {
        "SciFact dev": {"ndcg@10": 0.6 + scifact, "start_ndcg@10": 0.6},
        "NFCorpus dev": {"ndcg@10": 0.3 + nfcorpus, "start_ndcg@10": 0.3},
    }
    (folder / "row.json").write_text(json.dumps({"arm": arm, "seed": seed, "metrics": metrics}))

    def cell(d):
        return {"difference": d, "se": 0.01}

    guard = {
        "readings": {"pseudo_queries": cell(pseudo), "queries": cell(queries)},
        "corpora": {c: {"pseudo_queries": cell(pseudo), "queries": cell(queries)} for c in ("scifact", "nfcorpus")},
    }
    (folder / "run" / "recipe.json").write_text(json.dumps({"guard": guard}))


def test_it_reads_ranks_and_chooses_as_given(tmp_path, monkeypatch):
    study = _study()
    # seed 42: the pseudo-query reading ranks the runs as NFCorpus does (ρ = 1 with every corpus' gain over the
    # three runs), the agreement reading the other way (ρ = −1); a run without its recipe.json is not read
    _run(tmp_path, "a", 42, 0.01, 0.010, pseudo=0.001, queries=0.03)
    _run(tmp_path, "b", 42, 0.02, 0.020, pseudo=0.002, queries=0.02)
    _run(tmp_path, "c", 42, 0.03, 0.025, pseudo=0.003, queries=0.01)
    (tmp_path / "d" / "seed42").mkdir(parents=True)
    (tmp_path / "d" / "seed42" / "row.json").write_text(json.dumps({"arm": "d", "seed": 42, "metrics": {}}))
    runs = study.read_runs([str(tmp_path)])
    assert sorted(r["arm"] for r in runs) == ["a", "b", "c"]
    assert {r["arm"]: round(r["gains"]["nfcorpus"], 6) for r in runs} == {"a": 0.01, "b": 0.02, "c": 0.025}

    out = tmp_path / "report"
    monkeypatch.setattr(sys, "argv", ["guard_choice.py", "--runs", str(tmp_path), "--out", str(out)])
    assert study.main() == 0
    report = json.loads(Path(str(out) + ".json").read_text())
    pooled = report["correlations"]["pseudo-queries (pooled)"]
    assert pooled["runs"] == 3 and pooled["nfcorpus"]["rho"] == pytest.approx(1.0)
    assert report["correlations"]["held-out queries' agreement (pooled)"]["nfcorpus"]["rho"] == pytest.approx(-1.0)
    by_reading = {c["reading"]: c for c in report["choices"]}
    assert by_reading["pseudo-queries (pooled)"]["chosen"] == "c"  # the highest reading, here the best run
    assert by_reading["held-out queries' agreement (pooled)"]["chosen"] == "a"  # the worst run
    assert by_reading["pseudo-queries (pooled)"]["oracle"]["nfcorpus"] == pytest.approx(0.025)
    assert by_reading["pseudo-queries (pooled)"]["mean"]["nfcorpus"] == pytest.approx(0.055 / 3)
    assert "| `c` | 42 | +0.0300 | +0.0250 |" in Path(str(out) + ".md").read_text()
