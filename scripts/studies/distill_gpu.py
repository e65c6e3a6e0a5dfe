"""The distill study's setting at step counts a 15-minute CPU budget cannot buy: one GPU, fixed steps.

The same starting model (all-MiniLM-L6-v2), unlabelled query pools, teacher and dev splits as
``scripts/studies/distill_study.py`` (its ``prepare_data`` makes them), the recipe's distillation stage alone at its
defaults (lr 5e-5, k 8, teacher temperature 1, in-batch weight 1; bf16 where the device computes it natively) for a
fixed number of steps: 42 (what 15 minutes bought on one CPU core), about one pass over the 3,001 pooled queries
(188 steps of 16) and three passes (564). Each row is one ``run_recipe`` call, evaluated on SciFact's dev half and
NFCorpus ``dev`` at 256 tokens, and written to ``--out`` (JSON, then a Markdown table) as soon as it is done, so a run
cut short keeps its rows; a row already in ``--out`` is not run again::

    python scripts/studies/distill_gpu.py --model MODEL --data DATA --out reports/studies/distill_gpu --deadline-minutes 7

``--report-only`` rewrites the Markdown from the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import adaptation_study as A
import distill_study as D

PASS = 188  # one pass over the 3,001 pooled queries in batches of 16
# (seed, steps, precision) in the order they run: seed 42 at each step count first, then the other seeds
ORDER = [
    (42, 42, "default"),
    (42, PASS, "default"),
    (42, 3 * PASS, "default"),
    (42, 42, "fp32"),
    (43, PASS, "default"),
    (44, PASS, "default"),
    (43, 3 * PASS, "default"),
    (44, 3 * PASS, "default"),
    (43, 42, "default"),
    (44, 42, "default"),
    (42, 6 * PASS, "default"),
]


def key(seed: int, steps: int, precision: str) -> str:
    return f"steps{steps}-{precision}-seed{seed}"


def run_one(seed: int, steps: int, precision: str, ns, data: Path) -> dict:
    from hf_cocodr import run_recipe

    cfg, _ = D.ARMS["distill-lr5e-5"]
    cfg = {
        **D.BASE,
        **cfg,
        "distill": {"learning_rate": 5e-5, **({"bf16": False} if precision == "fp32" else {})},
        "target_queries": [str(data / p) for p in D.POOL],
        "seed": seed,
        "evaluate_start": False,
        "distill_steps": steps,
        "distill_max_passes": None,  # the steps asked for, not the recipe's cap of 3 passes
        "refreshes": 1,
    }
    out = Path(ns.work) / key(seed, steps, precision)
    t0 = time.time()
    if not (out / "run" / "recipe.json").is_file():
        run_recipe(
            ns.model,
            [str(data / "scifact"), str(data / "nfcorpus")],
            str(data / "squad-v1.1"),
            out / "run",
            config=cfg,
            max_minutes=None,
        )
    record = json.loads((out / "run" / "recipe.json").read_text())
    train_seconds = time.time() - t0
    metrics = A.evaluate(out / "run" / "model", out, data, 256)
    return {
        "seed": seed,
        "steps": steps,
        "precision": record.get("precision", {}).get("training", precision),
        "metrics": metrics,
        "steps_trained": record.get("steps_trained"),
        "run_seconds": round(train_seconds, 1),
        "stage_seconds": record.get("stage_seconds"),
    }


def write(ns, result: dict) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    atomic_write_json(Path(f"{ns.out}.json"), result)
    start = result.get("start")
    lines = [
        "# Distillation from the hybrid teacher on one GPU, at fixed steps",
        "",
        f"Device: {result.get('device', '?')}. all-MiniLM-L6-v2, the distill study's pools and dev splits "
        "(`scripts/studies/distill_study.py`), the distillation stage alone at its defaults; nDCG@10 at 256 tokens. "
        "Mean ± half-range over seeds; Δ against the start.",
        "",
        "| steps | passes over the pool | precision | seeds | SciFact dev | Δ | NFCorpus dev | Δ | distill s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if start:
        s, n = start["SciFact dev"]["ndcg@10"], start["NFCorpus dev"]["ndcg@10"]
        lines.append(f"| 0 (start) | 0 | – | – | {s:.4f} | | {n:.4f} | | |")
    groups: dict[tuple, list] = {}
    for row in result.get("rows", {}).values():
        groups.setdefault((row["steps"], row["precision"]), []).append(row)
    for (steps, precision), rows in sorted(groups.items()):
        cells = []
        for label in ("SciFact dev", "NFCorpus dev"):
            vals = [r["metrics"][label]["ndcg@10"] for r in rows]
            mean, half = statistics.mean(vals), (max(vals) - min(vals)) / 2
            delta = f"{mean - start[label]['ndcg@10']:+.4f}" if start else ""
            cells += [f"{mean:.4f} ± {half:.4f}", delta]
        seeds = ",".join(str(r["seed"]) for r in sorted(rows, key=lambda r: r["seed"]))
        secs = statistics.median((r.get("stage_seconds") or {}).get("distill", float("nan")) for r in rows)
        cells.append(f"{secs:.0f}")
        lines.append(f"| {steps} | {steps * 16 / 3001:.2f} | {precision} | {seeds} | " + " | ".join(cells) + " |")
    lines += ["", "distill s: the median seconds of the stage (teacher rows from its cache, training, checkpoints)."]
    lines += [f"\n{note}" for note in result.get("notes", [])]
    lines += ["", f"Command: `{result.get('command', '')}`", ""]
    atomic_write_text(Path(f"{ns.out}.md"), "\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="the starting model's folder (default: the bundled MiniLM)")
    ap.add_argument("--data", default=None, help="the folder holding scifact/ and nfcorpus/ (default: the data root)")
    ap.add_argument("--work", default="outputs/distill_gpu")
    ap.add_argument("--out", default="reports/studies/distill_gpu", help="prefix of the JSON and Markdown written")
    ap.add_argument("--deadline-minutes", type=float, default=8.0, help="start no run past this")
    ap.add_argument("--order", default=None, help="SEED:STEPS:PRECISION,... instead of the default order")
    ap.add_argument("--report-only", action="store_true")
    ns = ap.parse_args()
    from hf_cocodr.utils import get_data_root, setup_logging

    path = Path(f"{ns.out}.json")
    result = json.loads(path.read_text()) if path.is_file() else {"rows": {}}
    if ns.report_only:
        write(ns, result)
        return 0
    import torch

    setup_logging()
    if ns.model is None:
        from hf_cocodr.modeling.bundled import bundled_model_path

        ns.model = bundled_model_path("all-MiniLM-L6-v2")
    data = D.prepare_data(Path(ns.work).absolute(), Path(ns.data) if ns.data else get_data_root())
    A.EVALS[:] = D.EVALS
    result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    result["command"] = "python " + " ".join(sys.argv)
    t0 = time.time()
    if "start" not in result:
        result["start"] = A.evaluate(ns.model, Path(ns.work) / "start", data, 256)
        write(ns, result)
    order = (
        [tuple(int(x) if x.isdigit() else x for x in o.split(":")) for o in ns.order.split(",")] if ns.order else ORDER
    )
    seen: list[tuple[int, float]] = []  # (steps, seconds) of the runs done here
    for seed, steps, precision in order:
        name = key(seed, steps, precision)
        if name in result["rows"]:
            continue
        # 30 s of loads, teacher rows, export and evaluation, and the slowest step seen
        guess = 30 + steps * max(((secs - 30) / n for n, secs in seen), default=0.0)
        if (time.time() - t0 + guess) / 60 > ns.deadline_minutes:
            print(f"deadline: {name} not started", flush=True)
            continue
        t1 = time.time()
        result["rows"][name] = run_one(seed, steps, precision, ns, data)
        seen.append((steps, time.time() - t1))
        write(ns, result)
        print(name, json.dumps(result["rows"][name]["metrics"]), f"{time.time() - t1:.0f} s", flush=True)
    print(Path(f"{ns.out}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
