"""Benchmark: the hybrid build (:meth:`HybridRetriever.build`) on 2 CPU ranks against one single-threaded process.

The corpus is synthetic: ``--docs`` documents, each two to four sentences of the shared data's SciFact and NFCorpus
abstracts recombined (nothing is copied into the repository). The model is a random BERT (4 layers, hidden 256, the
bundled all-MiniLM-L6-v2 tokenizer; documents cut at 128 tokens), so the corpus encoding dominates the build. The
same build runs twice, each in fresh processes with one thread per process (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``): once as one process without torch.distributed, once under ``torchrun
--nproc_per_node 2`` (gloo), where the ranks share the encoding (:func:`~hf_cocodr.retrieval.encoding.
encode_sharded`). Both then rank ``--queries`` queries (SciFact and NFCorpus queries), and the rankings must be the
same.

    python scripts/benchmarks/bench_shard.py [--docs 100000] [--queries 1000]

Prints a table and writes its JSON (``--output``; default: this script's name under ``reports/benchmarks``).
``--docs 2000 --chunk-docs 250`` is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("scifact", "nfcorpus")


def sentences(root: Path) -> list[str]:
    out: list[str] = []
    for name in SOURCES:
        with open(root / name / "corpus.jsonl") as f:
            for line in f:
                out += [s for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]) if len(s) >= 30]
    return out


def make_corpus(root: Path, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` documents of 2-4 sentences drawn (seeded) from the shared corpora, and their ids."""
    pool = sentences(root)
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(pool) for _ in range(rng.randint(2, 4))) for _ in range(n)]
    return [f"s{i}" for i in range(n)], texts


def make_queries(root: Path, n: int) -> list[str]:
    out: list[str] = []
    for name in SOURCES:
        with open(root / name / "queries.jsonl") as f:
            out += [json.loads(line)["text"] for line in f]
    return (out * (n // max(1, len(out)) + 1))[:n]


def make_model(folder: Path) -> Path:
    """A random 4-layer BERT (hidden 256) with the bundled MiniLM tokenizer, saved as a sentence-transformers model."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    from hf_cocodr.modeling.bundled import bundled_model_path

    tok = AutoTokenizer.from_pretrained(bundled_model_path("all-MiniLM-L6-v2"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    raw = folder / "raw"
    BertModel(config).save_pretrained(raw)
    tok.save_pretrained(raw)
    word = Transformer(str(raw), max_seq_length=128)
    st = SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")])
    st.save(str(folder / "st"))
    return folder / "st"


def worker(ns) -> int:
    """One build (one process, or one rank of the torchrun launch): rank 0 writes its timings and rankings."""
    import datasets
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    from hf_cocodr import HybridRetriever, load_encoder
    from hf_cocodr import distributed as D
    from hf_cocodr.retrieval import encoding
    from hf_cocodr.utils import get_data_root

    if ns.chunk_docs:
        encoding.CHUNK_DOCS = ns.chunk_docs
    root = get_data_root()
    ids, texts = make_corpus(root, ns.docs)
    corpus = datasets.Dataset.from_dict({"_id": ids, "text": texts})
    queries = make_queries(root, ns.queries)
    st = load_encoder(ns.model_dir)
    st.eval()
    D.barrier()
    t0 = time.perf_counter()
    hybrid = HybridRetriever.build(st, corpus, doc_max_length=128, batch_size=64, index="exact")
    seconds = time.perf_counter() - t0
    ranked, _ = hybrid.search(queries, 10)
    size, rank = D.world()
    if rank == 0:
        out = {
            "ranks": size,
            "seconds": seconds,
            **{f"{k}_seconds": v for k, v in hybrid.meta["build_seconds"].items()},
            "fusion": repr(hybrid.fusion),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rankings": ranked,
        }
        Path(ns.result).write_text(json.dumps(out))
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--output", default=str(Path("reports") / "benchmarks" / f"{Path(__file__).stem}.json"))
    ap.add_argument(
        "--chunk-docs",
        type=int,
        default=0,
        help="documents a chunk of the encoding (default: the library's, 4096); smaller shares a small corpus",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.worker:
        return worker(ns)

    from hf_cocodr.utils import atomic_write_json

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    tmp = Path(tempfile.mkdtemp(prefix="bench_shard_"))
    try:
        model_dir = make_model(tmp / "model")
        args = [__file__, "--worker", "--docs", str(ns.docs), "--queries", str(ns.queries)]
        args += ["--chunk-docs", str(ns.chunk_docs), "--model-dir"]
        args.append(str(model_dir))
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        runs = {
            "one process": [sys.executable] + args + ["--result", str(tmp / "one.json")],
            "2 ranks": [torchrun, "--nproc_per_node", "2", "--master_port", str(29400 + os.getpid() % 1000)]
            + args
            + ["--result", str(tmp / "two.json")],
        }
        results = {}
        for name, cmd in runs.items():
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"{name}: the build failed (exit {proc.returncode})")
            results[name] = json.loads(Path(cmd[-1]).read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    one, two = results["one process"], results["2 ranks"]
    same = one["rankings"] == two["rankings"]
    report = {
        "docs": ns.docs,
        "queries": ns.queries,
        "model": "random BERT, 4 layers, hidden 256, max length 128, mean pooling",
        "threads_per_process": 1,
        "chunk_docs": ns.chunk_docs or "default",
        "runs": {name: {k: v for k, v in r.items() if k != "rankings"} for name, r in results.items()},
        "speedup": round(one["seconds"] / two["seconds"], 3),
        "dense_speedup": round(one["dense_seconds"] / max(two["dense_seconds"], 1e-9), 3),
        "same_rankings": same,
        "same_fusion": one["fusion"] == two["fusion"],
    }
    print(f"hybrid build over {ns.docs} documents, one thread per process")
    print(f"{'run':<12} {'build s':>9} {'dense s':>9} {'bm25 s':>8} {'fit s':>7} {'peak MiB':>9}")
    for name, r in results.items():
        print(
            f"{name:<12} {r['seconds']:>9.1f} {r['dense_seconds']:>9.1f} {r['bm25_seconds']:>8.1f} "
            f"{r.get('fusion_fit_seconds', 0.0):>7.1f} {r['peak_mib']:>9.0f}"
        )
    print(
        f"speedup {report['speedup']}x (dense part {report['dense_speedup']}x); same rankings on {ns.queries} "
        f"queries: {same}"
    )
    out = Path(ns.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, report)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
