"""Seconds of one distillation step, full model against query side (``distill_side``), in alternating rounds in one
process on the same core, so both meet the same load: the recipe's own trainers, built as its probe builds them
(the stage's settings: 16 queries a step, 8 candidates, 128 tokens, fp32; the study's target queries and corpora).

    taskset -c 0 env OMP_NUM_THREADS=1 python scripts/benchmarks/bench_distill_side.py --rounds 3
    # writes reports/benchmarks/bench_distill_side.json and prints a table
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def stage_run(side: str, data: Path, model: str, tmp: str):
    """What :meth:`DistillStage.build_trainer` reads of a recipe run, for ``side``."""
    from hf_cocodr.recipe import RecipeConfig
    from hf_cocodr.recipe.stages.distill import DistillStage

    queries = [f"{data / 'scifact'}:pool-distinct", f"{data / 'nfcorpus'}:pool-distinct"]
    cfg = RecipeConfig(skip_distill=False, target_queries=queries, distill_side=side, wise_alpha=None)
    run = SimpleNamespace(
        cfg=cfg,
        model=model,
        current=model,
        similarity="cosine",
        target_corpora=[str(data / "scifact"), str(data / "nfcorpus")],
        dir=lambda name: Path(tmp) / name,
    )
    stage = DistillStage()
    run.arguments = {"distill": stage.arguments(run)}
    return stage, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--query-steps", type=int, default=10, help="timed query-side steps a round")
    ap.add_argument("--full-steps", type=int, default=2, help="timed full steps a round")
    ap.add_argument("--work", default="outputs/cpu_budget")
    ap.add_argument("--output", default="reports/benchmarks/bench_distill_side.json")
    ns = ap.parse_args()
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.recipe.probe import StepTimer
    from hf_cocodr.utils import atomic_write_json, setup_logging

    setup_logging()
    data = Path(ns.work).absolute() / "data"
    if not (data / "scifact" / "qrels" / "pool-distinct.tsv").is_file():
        sys.exit(f"{data}: run scripts/studies/cpu_budget.py first (it writes the study's splits)")
    model = str(bundled_model_path("all-MiniLM-L6-v2"))
    times: dict[str, list[float]] = {"full": [], "query": []}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ns.rounds):
            for side, steps in (("full", ns.full_steps), ("query", ns.query_steps)):
                stage, run = stage_run(side, data, model, tmp)
                trainer = stage.build_trainer(run, 1 + steps, output_dir=Path(tmp) / side, probe=True)
                timer = StepTimer()
                trainer.add_callback(timer)
                loads.append(os.getloadavg()[0])
                trainer.train()
                times[side] += timer.intervals
    rows = {
        side: {"median_s": round(statistics.median(t), 3), "min_s": round(min(t), 3), "steps_timed": len(t)}
        for side, t in times.items()
    }
    ratio = rows["full"]["median_s"] / rows["query"]["median_s"]
    print("| side | median s a step | min s | steps timed |")
    print("|---|---|---|---|")
    for side, r in rows.items():
        print(f"| {side} | {r['median_s']} | {r['min_s']} | {r['steps_timed']} |")
    print(f"full / query: {ratio:.1f}; load average during: {min(loads):.1f} to {max(loads):.1f}")
    atomic_write_json(
        Path(ns.output),
        {
            "rows": rows,
            "full_over_query": round(ratio, 2),
            "load_average": [round(x, 2) for x in loads],
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "affinity": sorted(os.sched_getaffinity(0)),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python " + " ".join(sys.argv),
            "note": "the machine is shared: both sides alternate, so both meet the same load",
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
