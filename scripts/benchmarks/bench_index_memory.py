"""Benchmark: peak memory of the exact-search index against the raw size of the embeddings it holds.

Each configuration runs in a fresh process: ``DenseIndex`` (faiss ``IndexFlatIP`` when installed) receives
``--docs`` random float32 embeddings of ``--dim`` in blocks of ``--block`` (as ``evaluate_retrieval`` streams them),
with and without ``capacity`` (the number of documents, which the evaluation knows in advance). Peak RSS growth
(``VmHWM``) over the process before the index existed is divided by the raw size ``docs x dim x 4`` bytes; the
embedding blocks themselves are re-used, so the ratio is the index's own.

    python scripts/benchmarks/bench_index_memory.py [--docs 300000] [--dim 384] [--out reports/benchmarks/bench_index_memory.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys, numpy as np
from hf_cocodr.retrieval.index import DenseIndex
docs, dim, block, backend, presize = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) / 1024
x = np.random.default_rng(0).standard_normal((block, dim)).astype(np.float32)
base = status("VmRSS")
index = DenseIndex(dim, backend=backend, capacity=docs if presize else None)
for s in range(0, docs, block):
    index.add(x[: min(block, docs - s)])
print(status("VmHWM") - base, status("VmRSS") - base, index.backend)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=300_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", default="reports/benchmarks/bench_index_memory.json")
    args = ap.parse_args()
    raw = args.docs * args.dim * 4 / 2**20
    rows = {}
    for presize in (False, True):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(args.docs),
                str(args.dim),
                str(args.block),
                args.backend,
                "1" if presize else "0",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        peak, final, backend = out.stdout.split()
        name = "capacity" if presize else "growing"
        rows[name] = {
            "peak_delta_mb": round(float(peak), 1),
            "final_delta_mb": round(float(final), 1),
            "peak_ratio_to_raw": round(float(peak) / raw, 3),
            "backend": backend,
        }
        print(
            f"{name:9s} ({backend}): peak {float(peak):.0f} MB for {raw:.0f} MB of embeddings "
            f"= {float(peak) / raw:.2f}x raw (goal <= 1.5x)"
        )
    result = {
        "docs": args.docs,
        "dim": args.dim,
        "block": args.block,
        "raw_mb": round(raw, 1),
        **rows,
        "command": "python " + " ".join(sys.argv),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
