"""Helpers shared by several test modules (this is not a test module: tests import from here, never from each
other). Fixtures live in ``conftest.py``; tiny models and data in ``tiny.py``; the stand-in Hub in ``hub_standin.py``."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import torch

from hf_cocodr import CocoPretrainer, CocoPretrainingArguments
from hf_cocodr.cli import main
from hf_cocodr.recipe import Stage
from hf_cocodr.recipe.outputs import export_final

# ------------------------------------------------------------------------------------- the recipe at its smallest
CFG = dict(
    pseudo_queries=0,  # (a head-less model's schedule without queries: the COCO soup, as these tests were written)
    guard="record",  # (a tiny random model's few steps read worse or better by chance: the guard's own tests decide)
    coco_steps=2,
    finetune_steps=4,
    refreshes=1,
    corpus_pool=None,
    wise_alpha=0.5,
    skip_finetune=False,
    coco_runs=1,
    finetune_preset="paper",  # every stage runs, COCO
    # once, the fine-tune with iDRO (the automatic schedule itself is tested in tests/recipe/test_schedules.py)
    coco={"per_device_train_batch_size": 8, "save_steps": 2},
    finetune={"per_device_train_batch_size": 8, "num_clusters": 3, "save_steps": 2},
)

# the query side's distillation at its smallest: 2 steps of 4 queries against the teacher's top 3 (guard and queries
# as each test sets them)
QUERY_SIDE_CFG = dict(
    skip_coco=True,
    wise_alpha=None,
    distill_steps=2,
    distill_k=3,
    distill_side="query",
    distill={"per_device_train_batch_size": 4, "save_steps": 2},
)


def spy_distillation_trainers(monkeypatch) -> list:
    """Every :class:`~hf_cocodr.finetuning.DistillationTrainer` built from now on, in order (a recipe's probe
    builds one before its stage's, so the stage's trainer is the last)."""
    from hf_cocodr.finetuning import DistillationTrainer

    trainers, real_init = [], DistillationTrainer.__init__

    def spy(self, *args, **kwargs):
        trainers.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(DistillationTrainer, "__init__", spy)
    return trainers


# ------------------------------------------------------------------------------------------ bad inputs and the CLI
def beir(
    root: Path,
    corpus: str | bytes | None = None,
    queries: str | None = None,
    qrels: str | None = None,
    split: str = "train",
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    docs = (
        corpus
        if corpus is not None
        else "".join(
            json.dumps(
                {"_id": f"d{i}", "title": "", "text": f"Sentence one about topic {i}. Sentence two follows here."}
            )
            + "\n"
            for i in range(12)
        )
    )
    (root / "corpus.jsonl").write_bytes(docs if isinstance(docs, bytes) else docs.encode())
    q = (
        queries
        if queries is not None
        else "".join(json.dumps({"_id": f"q{i}", "text": f"topic {i}"}) + "\n" for i in range(12))
    )
    (root / "queries.jsonl").write_text(q)
    rows = (
        qrels if qrels is not None else "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(12))
    )
    (root / "qrels" / f"{split}.tsv").write_text(rows)
    return root


def run_cli(args, capsys) -> str:
    rc = main([str(a) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, f"exit status {rc}, stderr {lines}"
    assert not any("Traceback" in line for line in lines), lines
    # progress bars and the log lines of work done before the problem was found may precede it; the error
    # itself is exactly one line, the last one
    errors = [line for line in lines if line.startswith("hf-cocodr")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


# ------------------------------------------------------------------------------------------------- COCO pretraining
def coco_args(out, **kw):
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=11,
        disable_tqdm=True,
    )
    base.update(kw)
    return CocoPretrainingArguments(**base)


def grads_after_step(model_dir, corpus, out, chunk, accumulation=1, batch=8):
    torch.manual_seed(0)
    args = coco_args(
        out,
        gradient_cache_chunk_size=chunk,
        per_device_train_batch_size=batch,
        max_steps=1,
        gradient_accumulation_steps=accumulation,
        learning_rate=0.0,
        warmup_steps=0,
        max_grad_norm=1e9,
    )
    trainer = CocoPretrainer(str(model_dir), args, corpora=[corpus])
    grads = {}

    def keep(n):
        def hook(g):
            grads[n] = grads.get(n, 0) + g.detach().clone()

        return hook

    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            p.register_hook(keep(n))
    trainer.train()
    return trainer, grads


# --------------------------------------------------------------------------------------------------------- the iDRO loss
def features_for(model, columns):
    return [model.preprocess(col) for col in columns]


def batch(n=8, seed=0):
    import random

    import tiny

    rng = random.Random(seed)
    topics = sorted(tiny.TOPICS)
    qs, pos, neg = [], [], []
    for i in range(n):
        t = topics[i % len(topics)]
        qs.append(tiny.sentence(rng, t, 5))
        pos.append(tiny.document(rng, t, 2))
        neg.append(tiny.document(rng, topics[(i + 3) % len(topics)], 2))
    return [qs, pos, neg]


# Every training stage of the recipe for two steps on tiny batches (COCO, the paper-preset fine-tune, the
# distillation), no pseudo pairs, no WiSE-FT, no saved hybrid: the runs that check what each stage's steps see.
EVERY_STAGE_TWO_STEPS = dict(
    skip_coco=False,
    skip_finetune=False,
    skip_distill=False,
    wise_alpha=None,
    coco_runs=1,
    coco_steps=2,
    finetune_steps=2,
    distill_steps=2,
    finetune_preset="paper",
    save_hybrid=False,
    distill_k=3,
    coco={"per_device_train_batch_size": 4},
    finetune={"per_device_train_batch_size": 4, "num_clusters": 3, "num_negatives": 1},
    distill={"per_device_train_batch_size": 4},
)


def push_capturing(model: Path, monkeypatch, repo_id: str, token: str) -> dict[str, bytes]:
    """``push_directory(model, repo_id)`` against a stand-in ``HfApi`` that keeps what would be uploaded (path in the
    repository -> bytes)."""
    from types import SimpleNamespace

    import huggingface_hub

    from hf_cocodr.hub import push_directory

    uploaded: dict[str, bytes] = {}

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, *a, **k):
            return None

        def create_commit(self, repo_id, operations, **k):
            for op in operations:
                src = op.path_or_fileobj
                uploaded[op.path_in_repo] = src if isinstance(src, bytes) else Path(src).read_bytes()
            return SimpleNamespace(commit_url="https://hub.invalid/commit/1")

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    push_directory(model, repo_id, token=token)
    return uploaded


# ------------------------------------------------------------------------------------- a toy stage of the contract
class Copy(Stage):
    """A stage that "trains" two steps by copying the model it starts from."""

    name = "polish"

    def cost(self, throughput, cfg, **kw):
        return replace(super().cost(throughput, cfg, **kw), steps=2)

    def train(self, run):
        export_final(Path(run.current), run.dir(self.name))
        return {"steps": 2}


# ------------------------------------------------------------------------------------------------------ the demo
DEMO = Path(__file__).resolve().parent.parent / "scripts" / "tools" / "demo.py"


def load_demo():
    """``scripts/tools/demo.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
