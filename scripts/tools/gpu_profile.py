"""Where a GPU trainer's step spends its time: cProfile of ``gpu_check.py``'s MNRL and distillation benchmarks, with
the tokenizers' own threads on or off (``--parallel``), on whatever device the machine has. Prints the top functions
by their own time and writes the texts/s and GPU use as JSON.

    PYTHONPATH=$PWD python scripts/tools/gpu_profile.py --model MODEL --data DATA --out profile.json --parallel true
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parallel", choices=("true", "false"), default="true")
    ap.add_argument("--top", type=int, default=22)
    ns = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = ns.parallel
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).with_name("gpu_check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    setup = check.Setup(argparse.Namespace(smoke=False, model=ns.model, data=ns.data, max_minutes=None, out=None))
    rows = check.source_rows(setup, 2000)
    out = {}
    for name, call in (
        ("mnrl", lambda: check.bench_mnrl(setup, rows)),
        ("distill", lambda: check.bench_distill(setup)),
    ):
        prof, t0 = cProfile.Profile(), time.time()
        prof.enable()
        result = call()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(ns.top)
        out[name] = {
            "texts_per_s": result.get("texts_per_s"),
            "gpu_utilization_mean": result.get("gpu_utilization_mean"),
            "seconds": round(time.time() - t0, 1),
        }
        print(f"== {name}, TOKENIZERS_PARALLELISM={ns.parallel}: {out[name]}\n{text.getvalue()}", flush=True)
    Path(ns.out).write_text(json.dumps({"parallel": ns.parallel, **out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
