"""GPU check: how fast the package's trainers move texts on this machine's device, against sentence-transformers'
own trainer on the same card, and the recipe end to end under a budget.

One command, offline, at most about 6 minutes on one GPU:

    python scripts/tools/gpu_check.py --out gpu_check.json

It prints a table and writes JSON (``--out``): for sentence-transformers' ``MultipleNegativesRankingLoss`` trainer,
``IDROTrainer`` (paper and reference presets), the distillation step (``DistillationTrainer`` with
``HybridDistillLoss``) and COCO against a plain ``BertForMaskedLM`` MLM step, each at the batch the recipe trains
with on this device and in its precision (bf16 on a GPU with native bf16): texts/s, tokens/s (padding not counted)
and the GPU's mean utilisation while it trained (sampled every 0.5 s), counted by
:class:`~hf_cocodr.finetuning.callbacks.ThroughputMeter`, with the ratios to MNRL (COCO: to the plain MLM step). Then
the recipe with unlabelled target queries (the distillation study's pools of SciFact and NFCorpus queries, none of
them a dev query) under ``--max-minutes 2`` on the device: the steps each stage trained, its texts/s and GPU
utilisation, and nDCG@10 of the starting and the adapted model on the SciFact and NFCorpus dev splits.

``--smoke`` runs the same code paths on a CPU with tiny sizes (splade-tiny, a slice of NFCorpus) in about a minute;
``tests/test_gpu_check.py`` runs it. What a CUDA image lacks and how to bring it: docs/throughput.md.

    python scripts/tools/gpu_check.py --smoke --out reports/benchmarks/gpu_check_smoke.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# (TOKENIZERS_PARALLELISM is left as the caller set it: on a GPU, the tokenizers' own threads double the trainers'
# texts/s, docs/throughput.md; --smoke turns them off, as the test suite runs on 2 cores)

# what the package needs at run time beyond torch, transformers and sentence-transformers: (module, wheel to carry)
REQUIRED = (
    ("datasets", "datasets (+ dill, multiprocess, xxhash)"),
    ("bm25s", "bm25s"),
    ("Stemmer", "PyStemmer"),
    ("pytrec_eval", "pytrec-eval-terrier"),
    ("pysbd", "pysbd"),
)
FULL = dict(model="all-MiniLM-L6-v2", steps=20, skip=3, max_length=256, span_length=64, k=8, minutes=2.0)
SMOKE = dict(model="splade-tiny", steps=2, skip=1, max_length=32, span_length=16, k=3, minutes=30.0)
BENCHES = ("mnrl", "idro_paper", "idro_reference", "distill", "coco", "mlm")


def check_packages() -> None:
    """Stop with the wheels to bring when a package the recipe cannot run without is missing."""
    missing = [wheel for module, wheel in REQUIRED if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(
            "gpu_check: missing packages the recipe needs: " + ", ".join(missing) + ". Bring them as wheels "
            "(docs/throughput.md, 'Running the GPU check'), install them with pip install --no-deps --target "
            "/tmp/site and put /tmp/site on PYTHONPATH."
        )


class Setup:
    """The device, precision, model, data and sizes of one check."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from hf_cocodr.modeling.bundled import bundled_model_path
        from hf_cocodr.recipe.settings import device_batch_size, device_record, gpu_bf16

        self.smoke = args.smoke
        self.sizes = dict(SMOKE if args.smoke else FULL)
        if args.max_minutes is not None:
            self.sizes["minutes"] = args.max_minutes
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
        self.model = args.model or bundled_model_path(self.sizes["model"])
        self.data = Path(args.data)
        self.device = device_record()
        self.on_gpu = torch.cuda.is_available()
        self.bf16 = gpu_bf16()
        self.precision = "bf16" if self.bf16 else "fp32"
        # the batches the recipe trains with on this device (its stages' defaults)
        self.batch = 4 if self.smoke else device_batch_size(32, 128)  # rows (query, positive, negative) a step
        self.distill_batch = 4 if self.smoke else device_batch_size(16, 64)
        self.coco_batch = 4 if self.smoke else device_batch_size(32, 128)
        if self.smoke:
            self.data = subset_data(self.data, self.work / "data")

    def arguments(self, name: str, **kw) -> dict[str, Any]:
        """Training arguments shared by every benchmark (``name``: its folder): this device, its precision, no saving,
        no logging."""
        return dict(
            output_dir=str(self.work / name),
            max_steps=self.sizes["steps"] + self.sizes["skip"],
            learning_rate=2e-5,
            seed=0,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_drop_last=True,
            use_cpu=not self.on_gpu,
            bf16=self.bf16,
            **kw,
        )


def subset_data(root: Path, out: Path, docs: int = 80) -> Path:
    """A slice of NFCorpus as a BEIR folder (its first ``docs`` documents, the queries judged on them) for
    ``--smoke``."""
    src, dst = root / "nfcorpus", out / "nfcorpus"
    (dst / "qrels").mkdir(parents=True, exist_ok=True)
    kept, ids = [], set()
    with open(src / "corpus.jsonl") as f:
        for line in f:
            if len(kept) == docs:
                break
            kept.append(line)
            ids.add(json.loads(line)["_id"])
    (dst / "corpus.jsonl").write_text("".join(kept))
    asked = set()
    for split in ("train", "dev"):
        lines = (src / "qrels" / f"{split}.tsv").read_text().splitlines()
        rows = [r for r in lines[1:] if r.split("\t")[1] in ids]
        asked |= {r.split("\t")[0] for r in rows}
        (dst / "qrels" / f"{split}.tsv").write_text("\n".join([lines[0], *rows]) + "\n")
    with open(src / "queries.jsonl") as f:
        (dst / "queries.jsonl").write_text("".join(q for q in f if json.loads(q)["_id"] in asked))
    return out


# ---------------------------------------------------------------------------------------------------- benchmarks
def measured(trainer, setup: Setup) -> dict[str, Any]:
    """Train ``trainer`` with a :class:`ThroughputMeter` (its first steps a warm-up); the meter's record."""
    from hf_cocodr.finetuning.callbacks import ThroughputMeter

    meter = ThroughputMeter(skip_steps=setup.sizes["skip"])
    trainer.add_callback(meter)
    trainer.train()
    return meter.summary()


def source_rows(setup: Setup, n: int):
    """``n`` NFCorpus train rows (query, positive, one BM25 negative) as a Dataset, the same for every trainer."""
    from datasets import Dataset

    from hf_cocodr.data.training import RetrievalTrainingData

    data = RetrievalTrainingData.from_beir(setup.data / "nfcorpus", "train", negatives="bm25", max_queries=n, seed=0)
    cols, _, _ = data.sample(range(len(data)), step=0, seed=0, num_negatives=1)
    return Dataset.from_dict({"query": cols[0], "positive": cols[1], "negative": cols[2]})


def encoder(setup: Setup):
    from hf_cocodr import load_encoder

    model = load_encoder(setup.model)
    model.max_seq_length = setup.sizes["max_length"]
    return model


def bench_mnrl(setup: Setup, rows) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = encoder(setup)
    args = SentenceTransformerTrainingArguments(**setup.arguments("mnrl", per_device_train_batch_size=setup.batch))
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=rows, loss=MultipleNegativesRankingLoss(model)
    )
    return {"batch": setup.batch, "texts_per_row": 3, **measured(trainer, setup)}


def bench_idro(setup: Setup, rows, preset: str) -> dict[str, Any]:
    from hf_cocodr import IDROTrainer, IDROTrainingArguments

    clusters = 3 if setup.smoke else 50
    args = IDROTrainingArguments(
        **setup.arguments(f"idro_{preset}", per_device_train_batch_size=setup.batch),
        idro_preset=preset,
        num_clusters=clusters,
        max_length=setup.sizes["max_length"],
    )
    trainer = IDROTrainer(model=encoder(setup), args=args, train_dataset=rows)
    return {"batch": setup.batch, "texts_per_row": 3, "num_clusters": clusters, **measured(trainer, setup)}


def bench_distill(setup: Setup) -> dict[str, Any]:
    """The distillation step on rows of its shape (NFCorpus train queries, ``k`` random NFCorpus documents each,
    random teacher scores: the planner's probe does the same), at the recipe's default batch for this device."""
    import numpy as np

    from hf_cocodr import DistillationTrainer
    from hf_cocodr.data.target_queries import read_target_queries
    from hf_cocodr.data.teacher import teacher_rows
    from hf_cocodr.finetuning import DistillationTrainingArguments
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

    k = setup.sizes["k"]
    docs = dict(zip(*_corpus_ids_texts(str(setup.data / "nfcorpus"))))
    queries, doc_ids = list(read_target_queries(f"{setup.data / 'nfcorpus'}:train").texts), list(docs)
    gen = np.random.default_rng(0)
    n = setup.distill_batch * (setup.sizes["steps"] + setup.sizes["skip"] + 1)
    asked = [queries[i] for i in gen.choice(len(queries), n, replace=len(queries) < n)]

    class Random:  # the teacher's rankings are not what is timed
        def search(self, chunk, kk):
            picks = [[doc_ids[i] for i in gen.choice(len(doc_ids), kk, replace=False)] for _ in chunk]
            return picks, gen.standard_normal((len(chunk), kk)).tolist()

    args = DistillationTrainingArguments(
        **setup.arguments("distill", per_device_train_batch_size=setup.distill_batch),
        max_length=setup.sizes["max_length"],
    )
    trainer = DistillationTrainer(
        model=encoder(setup), args=args, train_dataset=teacher_rows(Random(), asked, docs, k)
    )
    return {"batch": setup.distill_batch, "texts_per_row": 1 + k, **measured(trainer, setup)}


def bench_coco(setup: Setup) -> dict[str, Any]:
    from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

    args = CocoPretrainingArguments(
        **setup.arguments("coco", per_device_train_batch_size=setup.coco_batch),
        max_span_length=setup.sizes["span_length"],
    )
    trainer = CocoPretrainer(setup.model, args, corpora=[str(setup.data / "nfcorpus")])
    return {"batch": setup.coco_batch, "texts_per_row": 2, **measured(trainer, setup)}


def bench_mlm(setup: Setup) -> dict[str, Any]:
    """A plain ``BertForMaskedLM`` MLM step on NFCorpus documents cut at COCO's span length, as many texts a step
    as COCO's two spans of each document."""
    from datasets import Dataset
    from transformers import (
        AutoModelForMaskedLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    from hf_cocodr.modeling.condenser import _transformer_dir
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

    path = _transformer_dir(setup.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = list(_corpus_ids_texts(str(setup.data / "nfcorpus"))[1])
    batch = 2 * setup.coco_batch
    texts = (texts * (1 + batch * (setup.sizes["steps"] + setup.sizes["skip"] + 1) // max(1, len(texts))))[
        : batch * (setup.sizes["steps"] + setup.sizes["skip"] + 1)
    ]
    encoded = tokenizer(texts, truncation=True, max_length=setup.sizes["span_length"])
    trainer = Trainer(
        model=AutoModelForMaskedLM.from_pretrained(path),
        args=TrainingArguments(**setup.arguments("mlm", per_device_train_batch_size=batch)),
        train_dataset=Dataset.from_dict(dict(encoded)),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
    )
    return {"batch": batch, "texts_per_row": 1, **measured(trainer, setup)}


# ---------------------------------------------------------------------------------------------------- the recipe
def _read_lines(folder: Path, name: str) -> list[str]:
    """The lines of ``folder/name`` or of ``folder/name.gz``."""
    import gzip

    path = folder / name
    opened = open(path) if path.is_file() else gzip.open(path.with_name(name + ".gz"), "rt")
    with opened as f:
        return [line for line in f.read().splitlines() if line.strip()]


def dev_and_pool(root: Path, out: Path, names=("nfcorpus", "scifact")) -> Path:
    """The distillation study's splits (scripts/studies/distill_study.py) in ``out``: SciFact's judged claims split by
    id (even: the unlabelled ``pool``, odd: ``dev``), NFCorpus' train queries (``pool``) and its ``dev`` split; a pool
    keeps no query whose text a dev query has (the recipe refuses to train on the queries it evaluates). Corpora and
    queries are linked."""
    from hf_cocodr.data.target_queries import normalize_query

    for name in names:
        src, dst = root / name, out / name
        (dst / "qrels").mkdir(parents=True, exist_ok=True)
        for f in ("corpus.jsonl", "corpus.jsonl.gz", "queries.jsonl", "queries.jsonl.gz"):
            if (src / f).is_file() and not (dst / f).exists():
                (dst / f).symlink_to((src / f).resolve())
        header, *train = _read_lines(src / "qrels", "train.tsv")
        if name == "scifact":
            pool = [r for r in train if int(r.split("\t")[0]) % 2 == 0]
            dev = [r for r in train if int(r.split("\t")[0]) % 2 == 1]
        else:
            pool, dev = train, _read_lines(src / "qrels", "dev.tsv")[1:]
        texts = {q["_id"]: q["text"] for q in map(json.loads, _read_lines(src, "queries.jsonl"))}
        dev_texts = {normalize_query(texts[r.split("\t")[0]]) for r in dev}  # (a claim can repeat under two ids)
        pool = [r for r in pool if normalize_query(texts[r.split("\t")[0]]) not in dev_texts]
        for split, rows in (("pool", pool), ("dev", dev)):
            (dst / "qrels" / f"{split}.tsv").write_text("\n".join([header, *rows]) + "\n")
    return out


def check_recipe(setup: Setup) -> dict[str, Any]:
    """The recipe with unlabelled target queries (the study's pools) under ``--max-minutes`` on the device; what it
    trained, how busy it kept the device, and nDCG@10 of the starting and the adapted model on the dev splits."""
    from hf_cocodr.recipe import run_recipe

    names = ("nfcorpus",) if setup.smoke else ("nfcorpus", "scifact")
    data = dev_and_pool(setup.data, setup.work / "study", names)
    targets = [str(data / n) for n in names]
    evals = [f"{data / n}:dev" for n in names]
    config: dict[str, Any] = {"target_queries": [f"{data / n}:pool" for n in names]}
    if setup.smoke:  # a slice: NFCorpus is its own source task; the distillation alone, as MiniLM's schedule trains
        # it, and fixed steps keep it short (the probe, the plan and the deadlines of a budget stay; the budget is
        # wide, so that a busy CPU does not refuse it)
        source = str(setup.data / "nfcorpus")
        # the whole model, as a GPU trains it (distill_side auto is the query side on a CPU)
        config.update(skip_coco=True, skip_finetune=True, distill_steps=2, distill_k=3, distill_side="full")
        config["distill"] = {"per_device_train_batch_size": 4}
    else:
        source = str(setup.data / "squad-v1.1")
    config.update(skip_distill=False, save_hybrid=False)
    out = setup.work / "recipe"
    t0 = time.perf_counter()
    summary = run_recipe(
        setup.model, targets, source, out, evals=evals, config=config, max_minutes=setup.sizes["minutes"]
    )
    record = json.loads((out / "recipe.json").read_text())
    return {
        "max_minutes": setup.sizes["minutes"],
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "train_over_budget_seconds": record.get("train_over_budget_seconds"),
        "steps_trained": record["steps_trained"],
        "stopped_by_deadline": record["stopped_by_deadline"],
        "batches": record["batches"],
        "precision": record["precision"]["training"],
        "throughput": record["throughput"],
        "ndcg@10": {
            Path(spec.rsplit(":", 1)[0]).name + ":" + spec.rsplit(":", 1)[1]: {
                "start": r["start"]["ndcg@10"],
                "adapted": r["ndcg@10"],
            }
            for spec, r in summary.items()
        },
    }


# ---------------------------------------------------------------------------------------------------- report
def ratios(benches: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each trainer's cost per text against MNRL's (``x`` = MNRL texts/s / its texts/s: above 1 is slower), its
    tokens/s against MNRL's, and COCO's tokens/s against the plain MLM step's."""

    def over(a, b, key):
        x, y = benches[a].get(key), benches[b].get(key)
        return round(x / y, 3) if x and y else None

    out: dict[str, float | None] = {}
    for name in ("idro_paper", "idro_reference", "distill"):
        out[f"{name}_cost_per_text_vs_mnrl"] = over("mnrl", name, "texts_per_s")
        out[f"{name}_tokens_per_s_vs_mnrl"] = over(name, "mnrl", "tokens_per_s")
    out["coco_tokens_per_s_vs_mlm"] = over("coco", "mlm", "tokens_per_s")
    return out


def table(result: dict[str, Any]) -> str:
    rows = [f"{'trainer':<16}{'batch':>6}{'texts/s':>10}{'tokens/s':>11}{'GPU %':>7}  precision {result['precision']}"]
    for name, b in result["benchmarks"].items():
        gpu = b.get("gpu_utilization_mean")
        rows.append(
            f"{name:<16}{b['batch']:>6}{b['texts_per_s'] or 0:>10.1f}{b['tokens_per_s'] or 0:>11.0f}"
            f"{'' if gpu is None else f'{gpu:.0f}':>7}"
        )
    rows += [f"{k}: {v}" for k, v in result["ratios"].items()]
    rec = result["recipe"]
    rows.append(f"recipe --max-minutes {rec['max_minutes']:g}: steps {rec['steps_trained']}, {rec['wall_seconds']} s")
    for stage, t in rec["throughput"].items():
        gpu = t.get("gpu_utilization_mean")
        rows.append(f"  {stage:<10} {t['texts_per_s']} texts/s" + ("" if gpu is None else f", GPU {gpu:.0f}%"))
    for spec, v in rec["ndcg@10"].items():
        rows.append(f"  {spec}: nDCG@10 {v['start']:.4f} -> {v['adapted']:.4f} ({v['adapted'] - v['start']:+.4f})")
    return "\n".join(rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every benchmark and the recipe; the record written to ``--out``."""
    import sentence_transformers
    import torch
    import transformers

    t0 = time.perf_counter()
    check_packages()
    setup = Setup(args)
    rows = source_rows(setup, setup.batch * (setup.sizes["steps"] + setup.sizes["skip"] + 1))
    calls = {
        "mnrl": lambda: bench_mnrl(setup, rows),
        "idro_paper": lambda: bench_idro(setup, rows, "paper"),
        "idro_reference": lambda: bench_idro(setup, rows, "reference"),
        "distill": lambda: bench_distill(setup),
        "coco": lambda: bench_coco(setup),
        "mlm": lambda: bench_mlm(setup),
    }
    benches = {}
    for name, call in calls.items():
        t1 = time.perf_counter()
        benches[name] = {**call(), "precision": setup.precision}
        benches[name]["wall_seconds"] = round(time.perf_counter() - t1, 1)  # loading and warm-up included
        print(f"gpu_check: {name}: {benches[name]['texts_per_s']} texts/s ({benches[name]['wall_seconds']} s)")
    result = {
        "smoke": setup.smoke,
        "device": setup.device,
        "precision": setup.precision,
        "model": Path(setup.model).name if args.model else setup.sizes["model"],
        "max_length": setup.sizes["max_length"],
        "measured_steps": setup.sizes["steps"],
        "benchmarks": benches,
        "ratios": ratios(benches),
        "recipe": check_recipe(setup),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "python": platform.python_version(),
        },
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the record here as JSON (and the table beside it, .txt)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on any machine (the test suite runs it)")
    ap.add_argument("--model", help="the encoder (default: all-MiniLM-L6-v2; --smoke: splade-tiny, both bundled)")
    ap.add_argument("--data", default=os.environ.get("HF_COCODR_DATA", "../shared/data"), help="BEIR folders")
    ap.add_argument("--max-minutes", type=float, help="the recipe's budget (default 2; --smoke: 30, fixed steps)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(args)
    text = table(result)
    print(text)
    if args.out:
        from hf_cocodr.utils import atomic_write_json, atomic_write_text

        atomic_write_json(Path(args.out), result)
        atomic_write_text(Path(args.out).with_suffix(".txt"), text + "\n")
    return result


if __name__ == "__main__":
    main()
