"""Benchmark: building, saving, loading and searching a hybrid retriever over 100k+ documents.

The corpus is made of the sentences of the shared data's documents (SQuAD paragraphs, SciFact and NFCorpus abstracts,
cut at sentence ends, at least 40 characters), as many as ``--docs``; the queries are SQuAD dev questions. Each phase
runs in this process and is timed on its own; peak memory is the process's resident high-water mark after each phase
(it only grows, so a phase's figure includes the phases before it).

    python scripts/benchmarks/bench_hybrid.py [--docs 100000] [--queries 1000] [--model all-MiniLM-L6-v2]

Prints a table and writes ``reports/benchmarks/bench_hybrid.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def sentences(root: Path, limit: int) -> list[str]:
    out: list[str] = []
    for name in ("squad-v1.1", "scifact", "nfcorpus"):
        with open(root / name / "corpus.jsonl") as f:
            for line in f:
                for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]):
                    if len(s) >= 40:
                        out.append(s)
                        if len(out) >= limit:
                            return out
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="a bundled model name or a model path")
    ap.add_argument("--doc-max-length", type=int, default=128)
    ap.add_argument("--output", default="reports/benchmarks/bench_hybrid.json")
    ns = ap.parse_args()

    import datasets
    import torch

    from hf_cocodr import HybridRetriever, load_encoder
    from hf_cocodr.modeling.bundled import BUNDLED_MODELS, bundled_model_path
    from hf_cocodr.utils import atomic_write_json, get_data_root

    root = get_data_root()
    texts = sentences(root, ns.docs)
    corpus = datasets.Dataset.from_dict({"_id": [f"s{i}" for i in range(len(texts))], "text": texts})
    with open(root / "squad-v1.1" / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for _, line in zip(range(ns.queries), f)]
    model_path = bundled_model_path(ns.model) if ns.model in BUNDLED_MODELS else ns.model
    st = load_encoder(model_path)
    rows = {}

    t0 = time.perf_counter()
    hybrid = HybridRetriever.build(st, corpus, doc_max_length=ns.doc_max_length, batch_size=128)
    rows["build"] = {"seconds": time.perf_counter() - t0, **hybrid.meta["build_seconds"], "peak_mib": peak_mib()}
    tmp = Path(tempfile.mkdtemp(prefix="bench_hybrid_"))
    try:
        t0 = time.perf_counter()
        hybrid.save(tmp / "h")
        size = sum(p.stat().st_size for p in (tmp / "h").rglob("*") if p.is_file())
        rows["save"] = {"seconds": time.perf_counter() - t0, "disk_mib": size / 2**20, "peak_mib": peak_mib()}
        t0 = time.perf_counter()
        loaded = HybridRetriever.load(tmp / "h", model=st)
        rows["load"] = {"seconds": time.perf_counter() - t0, "peak_mib": peak_mib()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    q_emb = loaded.encode_queries(queries)
    for name, fn in (
        ("search dense", lambda: loaded.search_dense(queries, 10, query_embeddings=q_emb)),
        ("search bm25", lambda: loaded.search_bm25(queries, 100)),
        ("search hybrid", lambda: loaded.search(queries, 10, query_embeddings=q_emb)),
    ):
        t0 = time.perf_counter()
        fn()
        rows[name] = {"seconds": time.perf_counter() - t0, "peak_mib": peak_mib()}
    print(f"{len(texts):,} documents, {len(queries):,} queries, {ns.model}, {torch.get_num_threads()} threads")
    print(f"{'phase':15s} {'seconds':>9s} {'peak MiB':>9s}  notes")
    for name, r in rows.items():
        notes = ", ".join(f"{k} {v:.1f}" for k, v in r.items() if k not in ("seconds", "peak_mib"))
        print(f"{name:15s} {r['seconds']:9.1f} {r['peak_mib']:9.0f}  {notes}")
    atomic_write_json(
        ns.output,
        {
            "docs": len(texts),
            "queries": len(queries),
            "model": ns.model,
            "doc_max_length": ns.doc_max_length,
            "threads": torch.get_num_threads(),
            "query_encoding_excluded_from_search": True,
            "rows": {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in rows.items()},
            "command": "python scripts/benchmarks/bench_hybrid.py " + " ".join(sys.argv[1:]),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
