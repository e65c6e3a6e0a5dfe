"""Memory at scale: streaming encode + index of 200k synthetic documents, then K-Means and a negative refresh at 500k.

A tiny random BERT (2 layers, hidden 64) keeps the run short; what is measured is the pipeline around it:
* encoding + indexing 200k documents: peak RSS above the level before encoding, against the raw embedding size
  (n × dim × 4 bytes; target ≤ 1.5× + a constant), and the time per 10k documents as the corpus grows (flat);
* K-Means (K=50, all points) on 500k query embeddings and a self-negative refresh (encode 500k documents, search
  500k queries top-100, positives removed, CSR table) — peak RSS of each against its own data size.

Run it as a module from the repository root (it builds its model and corpus with the test suite's ``tests/tiny.py``):

    python -m scripts.benchmarks.bench_scale [--docs 200000] [--big 500000] [--out reports/benchmarks/bench_scale.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from scripts.benchmarks.benchutil import PeakRSS as Peak  # noqa: E402

PROC = psutil.Process()


def write_corpus(folder: Path, n: int, seed: int = 0) -> None:
    from tests import tiny

    rng = random.Random(seed)
    topics = sorted(tiny.TOPICS)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": tiny.document(rng, topics[i % 8], 2)}) + "\n")
    with open(folder / "queries.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"_id": f"q{i}", "text": tiny.sentence(rng, topics[i % 8], 6)}) + "\n")
    with open(folder / "qrels" / "train.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for i in range(n):
            f.write(f"q{i}\td{i}\t1\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--big", type=int, default=500_000)
    ap.add_argument("--out", default="reports/benchmarks/bench_scale.json")
    args = ap.parse_args()

    from sentence_transformers import SentenceTransformer

    from hf_cocodr import export_sentence_transformer, load_beir
    from hf_cocodr.retrieval.encoding import build_index
    from hf_cocodr.retrieval.index import kmeans
    from tests import tiny

    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    tiny.make_tiny_bert(work / "bert", hidden=64, dropout=0.0)
    export_sentence_transformer(str(work / "bert"), work / "st", max_seq_length=64)
    model = SentenceTransformer(str(work / "st"))
    dim = model.get_embedding_dimension()
    result = {"dim": dim, "command": " ".join(["python -m scripts.benchmarks.bench_scale", *sys.argv[1:]])}

    # ---------------------------------------------------------------- 1. encode + index, streaming
    write_corpus(work / "c200", args.docs)
    data = load_beir(work / "c200", None)
    marks = []
    t_start = time.perf_counter()

    def on_chunk(done):
        marks.append((done, time.perf_counter() - t_start, PROC.memory_info().rss / 2**20))

    with Peak() as mem:
        index, order = build_index(
            model,
            data.corpus,
            batch_size=256,
            max_length=64,
            chunk_docs=10_000,
            show_progress_bar=False,
            on_chunk=on_chunk,
        )
    raw_mb = args.docs * dim * 4 / 2**20
    per10k = [round(b[1] - a[1], 2) for a, b in zip([(0, 0.0, 0)] + marks[:-1], marks)]
    result["encode_index"] = {
        "docs": args.docs,
        "raw_embeddings_mb": raw_mb,
        "peak_rss_delta_mb": mem.delta_mb,
        "ratio_to_raw": mem.delta_mb / raw_mb,
        "seconds_per_10k_docs": per10k,
        "rss_mb_by_docs": [(d, round(r, 1)) for d, _, r in marks],
    }
    print(
        f"encode+index {args.docs} docs: peak +{mem.delta_mb:.0f} MB vs raw embeddings {raw_mb:.0f} MB "
        f"({mem.delta_mb / raw_mb:.2f}x); seconds per 10k docs first/last: {per10k[0]} / {per10k[-1]}",
        flush=True,
    )
    del index, order, data
    gc.collect()

    # ---------------------------------------------------------------- 2. K-Means at 500k points
    x = np.random.default_rng(0).standard_normal((args.big, dim)).astype(np.float32)
    with Peak() as mem:
        t0 = time.perf_counter()
        _, assign = kmeans(x, 50, max_points_per_centroid=None, seed=0)
        secs = time.perf_counter() - t0
    result["kmeans"] = {
        "points": args.big,
        "k": 50,
        "data_mb": x.nbytes / 2**20,
        "peak_rss_delta_mb": mem.delta_mb,
        "seconds": secs,
        "all_points_used": True,
    }
    print(
        f"K-Means on {args.big} points: {secs:.1f}s, peak +{mem.delta_mb:.0f} MB (data {x.nbytes / 2**20:.0f} MB)",
        flush=True,
    )
    del x, assign

    # ---------------------------------------------------------------- 3. negative refresh at 500k
    from hf_cocodr.data.training import RetrievalTrainingData
    from hf_cocodr.finetuning.callbacks.negatives import HardNegativeRefreshCallback

    write_corpus(work / "c500", args.big, seed=1)
    train = RetrievalTrainingData.from_beir(work / "c500", "train", negatives="none")

    cb = HardNegativeRefreshCallback(every_steps=1, top_k=100, recluster=False, batch_size=256, max_length=64)
    cb.bind(model=model, rows=train)
    with Peak() as mem:
        t0 = time.perf_counter()
        cb.refresh(step=1)
        secs = time.perf_counter() - t0
    table_mb = (train.neg_idx.nbytes + train.neg_ptr.nbytes) / 2**20
    emb_mb = args.big * dim * 4 / 2**20
    result["refresh"] = {
        "queries": args.big,
        "docs": args.big,
        "top_k": 100,
        "seconds": secs,
        "peak_rss_delta_mb": mem.delta_mb,
        "negatives_table_mb": table_mb,
        "doc_embeddings_mb": emb_mb,
        "mean_negatives_per_query": float(np.diff(train.neg_ptr).mean()),
    }
    print(
        f"negative refresh {args.big} queries x {args.big} docs: {secs:.0f}s, peak +{mem.delta_mb:.0f} MB "
        f"(doc embeddings {emb_mb:.0f} MB + table {table_mb:.0f} MB)",
        flush=True,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                "encode_ratio": result["encode_index"]["ratio_to_raw"],
                "kmeans_peak_mb": result["kmeans"]["peak_rss_delta_mb"],
                "refresh_peak_mb": result["refresh"]["peak_rss_delta_mb"],
            }
        )
    )


if __name__ == "__main__":
    main()
