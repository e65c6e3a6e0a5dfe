"""``scripts/tools/gpu_check.py --smoke`` runs the GPU check's code paths on this CPU and writes every key of its record."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "tools" / "gpu_check.py"
BENCH_KEYS = {"batch", "texts_per_row", "steps", "texts", "tokens", "padded_tokens", "seconds", "texts_per_s"}
BENCH_KEYS |= {"tokens_per_s", "precision", "wall_seconds"}
RATIO_KEYS = {
    f"{name}_{what}"
    for name in ("idro_paper", "idro_reference", "distill")
    for what in ("cost_per_text_vs_mnrl", "tokens_per_s_vs_mnrl")
} | {"coco_tokens_per_s_vs_mlm"}
RECIPE_KEYS = {"max_minutes", "wall_seconds", "train_over_budget_seconds", "steps_trained", "stopped_by_deadline"}
RECIPE_KEYS |= {"batches", "precision", "throughput", "ndcg@10"}


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_smoke_check_writes_every_key(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "check.json"
    result = _script().main(["--smoke", "--data", str(shared_data), "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert {"smoke", "device", "precision", "model", "benchmarks", "ratios", "recipe", "versions", "seconds"} <= set(
        written
    )
    assert written["smoke"] is True and written["device"] == {"type": "cpu"} and written["precision"] == "fp32"
    assert set(written["benchmarks"]) == {"mnrl", "idro_paper", "idro_reference", "distill", "coco", "mlm"}
    for name, bench in written["benchmarks"].items():
        assert BENCH_KEYS <= set(bench), name
        assert bench["steps"] == 2 and bench["texts"] == 2 * bench["batch"] * bench["texts_per_row"], name
        assert bench["tokens"] > 0 and bench["texts_per_s"] > 0, name
    assert set(written["ratios"]) == RATIO_KEYS and all(v > 0 for v in written["ratios"].values())
    recipe = written["recipe"]
    assert RECIPE_KEYS <= set(recipe)
    assert recipe["steps_trained"] == {"distill": 2} and set(recipe["throughput"]) == {"distill"}
    assert set(recipe["ndcg@10"]) == {"nfcorpus:dev"} and set(recipe["ndcg@10"]["nfcorpus:dev"]) == {
        "start",
        "adapted",
    }
    assert out.with_suffix(".txt").read_text().startswith("trainer")
