"""Does bf16 encoding keep nDCG@10? The dev splits' nDCG@10 of a model encoding under bf16 autocast against fp32,
measured with real bf16 kernels on any machine (issue 39: the recipe encodes at the fastest precision the machine
computes natively, where that precision keeps retrieval).

On a CPU without native bf16 the bf16 forward runs a slow reference kernel (7 to 11 times slower than fp32 here),
so the script does not encode the whole corpus in bf16. It encodes, under bf16, every document that can reach a
query's bf16 top 10:

1. the fp32 encoding of the corpus (read from the encoding cache when a run made it) ranks every document;
2. the candidates are the union over the dev queries of the fp32 top ``--depth`` (judged documents outside it
   need no bf16 vector: nDCG@10's ideal ranking comes from the judgments);
3. the queries and the candidates are encoded under bf16 autocast, and each query's bf16 ranking over the
   candidates gives its bf16 nDCG@10;
4. a **certificate** checks that no document outside the candidates could have entered a bf16 top 10: with
   ``delta`` the largest |bf16 score - fp32 score| seen over all query x candidate pairs, a query is certified when
   its bf16 10th score exceeds its fp32 ``depth+1``-th score by more than ``2 * delta``. The report counts the
   queries certified; an uncertified query's bf16 nDCG@10 is still computed over the candidates.

    taskset -c 0 env OMP_NUM_THREADS=1 python scripts/benchmarks/bench_encode_bf16.py \\
        --data outputs/cpu_budget/data --corpus scifact --split dev
    # prints a line, writes reports/benchmarks/bench_encode_bf16_scifact.json (--output sets another path)
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    import numpy as np

    d = np.asarray(a) - np.asarray(b)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="a bundled model's name or a model path")
    ap.add_argument("--data", required=True, help="a folder of BEIR folders")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--depth", type=int, default=20, help="the fp32 top-k of each query kept as a bf16 candidate")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--output", default=None)
    ns = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import corpus_texts, load_beir
    from hf_cocodr.evaluation.metrics import compute_metrics
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.retrieval.encoding import build_index, encode_texts
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.utils import atomic_write_json, native_bf16

    try:
        path = bundled_model_path(ns.model)
    except Exception:  # a path or a Hub id
        path = ns.model
    model = SentenceTransformer(path, device="cpu")
    data = load_beir(os.path.join(ns.data, ns.corpus), ns.split)
    ids, texts = [], []
    for b_ids, b_texts in corpus_texts(data.corpus):
        ids += list(b_ids)
        texts += b_texts
    qids = list(data.queries["_id"])
    qtexts = list(data.queries["text"])

    t0 = time.perf_counter()
    session = EncodingSession(cache=True)
    index, order = build_index(model, data.corpus, batch_size=ns.batch_size, show_progress_bar=False, session=session)
    docs32 = np.empty((len(order), index.dim), dtype=np.float32)
    docs32[order] = index.reconstruct_all()
    fp32_corpus_s = time.perf_counter() - t0
    q32 = encode_texts(model, qtexts, kind="query", batch_size=ns.batch_size)
    s32 = q32 @ docs32.T
    k = min(ns.depth, len(ids) - 1)
    top = np.argpartition(-s32, k, axis=1)[:, : k + 1]  # the top k+1 (the k+1-th bounds what is left out)
    top_sorted = np.take_along_axis(top, np.argsort(-np.take_along_axis(s32, top, 1), axis=1), 1)
    cand = np.asarray(sorted(set(top_sorted[:, :k].ravel().tolist())))
    print(f"{ns.corpus}: {len(qids)} queries, {len(ids)} documents, {len(cand)} bf16 candidates (fp32 top {k})")

    t1 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q16 = encode_texts(model, qtexts, kind="query", batch_size=ns.batch_size)
        d16 = encode_texts(model, [texts[i] for i in cand], kind="document", batch_size=ns.batch_size)
    bf16_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    d32c = encode_texts(model, [texts[i] for i in cand], kind="document", batch_size=ns.batch_size)
    fp32_cand_s = time.perf_counter() - t2

    s16 = q16 @ d16.T  # queries x candidates
    delta = float(np.abs(s16 - s32[:, cand]).max())
    cos = (d16 * d32c).sum(1) / np.linalg.norm(d16, axis=1) / np.linalg.norm(d32c, axis=1)
    tenth16 = -np.sort(-s16, axis=1)[:, 9]
    outside = s32[np.arange(len(qids))[:, None], top_sorted[:, k : k + 1]][:, 0]  # fp32 score of the (k+1)-th
    certified = int((tenth16 > outside + 2 * delta).sum())

    run32 = {q: {ids[j]: float(s32[i, j]) for j in top_sorted[i, :100]} for i, q in enumerate(qids)}
    order16 = np.argsort(-s16, axis=1)[:, :100]
    run16 = {q: {ids[cand[j]]: float(s16[i, j]) for j in order16[i]} for i, q in enumerate(qids)}
    m32, pq32 = compute_metrics(data.qrels, run32, (10,), per_query=True)
    m16, pq16 = compute_metrics(data.qrels, run16, (10,), per_query=True)
    judged = sorted(pq32)
    diff, se = _paired([pq16[q]["ndcg@10"] for q in judged], [pq32[q]["ndcg@10"] for q in judged])
    row = {
        "model": ns.model,
        "corpus": ns.corpus,
        "split": ns.split,
        "queries": len(qids),
        "documents": len(ids),
        "candidates": int(len(cand)),
        "depth": k,
        "ndcg@10_fp32": round(m32["ndcg@10"], 5),
        "ndcg@10_bf16": round(m16["ndcg@10"], 5),
        "bf16_minus_fp32": round(diff, 5),
        "paired_se": round(se, 5),
        "queries_certified": certified,
        "max_abs_score_delta": round(delta, 6),
        "doc_cosine_min": round(float(cos.min()), 6),
        "doc_cosine_mean": round(float(cos.mean()), 6),
        "bf16_docs_per_s": round(len(cand) / bf16_s, 3),
        "fp32_docs_per_s": round(len(cand) / fp32_cand_s, 3),
        "fp32_corpus_s": round(fp32_corpus_s, 1),
        "fp32_corpus_source": [r["source"] for r in session.record],
        "native_bf16": native_bf16(),
        "cpu": platform.processor() or platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"nDCG@10 fp32 {row['ndcg@10_fp32']:.4f}  bf16 {row['ndcg@10_bf16']:.4f}  "
        f"diff {diff:+.5f} ± {se:.5f}  certified {certified}/{len(qids)}  delta {delta:.2e}  "
        f"doc cosine min {row['doc_cosine_min']}  bf16 {row['bf16_docs_per_s']} doc/s, fp32 {row['fp32_docs_per_s']}"
    )
    out = ns.output or os.path.join("reports", "benchmarks", f"bench_encode_bf16_{ns.corpus}.json")
    atomic_write_json(out, row)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
