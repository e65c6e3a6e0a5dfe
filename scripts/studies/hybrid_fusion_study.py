"""Which label-free fusion should the hybrid retriever use by default, and how much does its weight matter?

For each start model and dev split (SciFact ``train`` claims, NFCorpus ``dev``; documents at the model's own length),
the dense top-``depth`` and the BM25 top-``depth`` of every query are computed once and cached under ``--work``; then
every fusion rule (``convex``: z-normalised scores, ``rrf``: reciprocal ranks) is scored at every dense weight ``w``
(0 = BM25 alone, 1 = the dense model alone). The report gives nDCG@10 per rule and weight, each rule's best weight
and the spread of nDCG@10 over the weights 0.3-0.7 (how sensitive a user is to the choice), so the default is picked
on dev splits only.

    python scripts/studies/hybrid_fusion_study.py [--starts all-MiniLM-L6-v2,splade-tiny]

Writes ``reports/studies/hybrid_fusion.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALS = [("scifact", "train", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]
WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
RULES = ("convex", "rrf")
MIDDLE = (0.3, 0.4, 0.5, 0.6, 0.7)


def rankings(start: str, folder: Path, split: str, work: Path, depth: int, doc_max_length: int):
    """The dense and the BM25 top-``depth`` of every query (cached): ``(qids, doc_ids, dense, bm25, qrels)``."""
    import numpy as np

    from hf_cocodr.data.beir import column_numpy, doc_text, load_beir

    data = load_beir(folder, split)
    cache = work / f"{start}-{folder.name}-{split}-len{doc_max_length}-d{depth}.npz"
    if not cache.is_file():
        from hf_cocodr import load_encoder
        from hf_cocodr.modeling.bundled import bundled_model_path
        from hf_cocodr.retrieval.encoding import build_index, encode_texts
        from hf_cocodr.retrieval.index import BM25Index

        st = load_encoder(bundled_model_path(start))
        t0 = time.time()
        index, order = build_index(st, data.corpus, max_length=doc_max_length, show_progress_bar=False)
        q = encode_texts(st, list(data.queries["text"]), kind="query")
        ds, di = index.search(q, depth)
        dense_s = time.time() - t0
        titles = data.corpus["title"] if "title" in data.corpus.column_names else [""] * len(data.corpus)
        t1 = time.time()
        bm25 = BM25Index([doc_text(t, x) for t, x in zip(titles, data.corpus["text"])])
        bs, bi = bm25.search(list(data.queries["text"]), depth)
        work.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            dense_scores=ds,
            dense_rows=order[di],
            bm25_scores=bs,
            bm25_rows=bi,
            seconds=np.array([dense_s, time.time() - t1]),
        )
        os.replace(tmp, cache)
    z = np.load(cache)
    return list(data.queries["_id"]), np.asarray(column_numpy(data.corpus, "_id"), dtype=object), z, data.qrels


def score(qids, doc_ids, z, qrels, rule: str, w: float, depth: int) -> float:
    from hf_cocodr.evaluation.retrieval import summarize
    from hf_cocodr.retrieval.fusion import FusionConfig, fuse

    cfg = FusionConfig(rule=rule, dense_weight=w, depth=depth)
    run = {}
    for i, qid in enumerate(qids):
        keep = z["bm25_scores"][i] > 0
        rows, fused = fuse(
            z["dense_rows"][i],
            z["dense_scores"][i],
            z["bm25_rows"][i][keep],
            z["bm25_scores"][i][keep],
            cfg,
            2 * depth,
        )
        run[qid] = dict(zip(doc_ids[rows].tolist(), fused.astype(float).tolist()))
    return summarize(qrels, run, k_values=(10,))["ndcg@10"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", default="all-MiniLM-L6-v2,splade-tiny")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--doc-max-length", type=int, default=256)
    ap.add_argument("--work", default="outputs/hybrid_fusion")
    ap.add_argument("--report", default="reports/studies/hybrid_fusion")
    ns = ap.parse_args()

    from hf_cocodr.utils import atomic_write_json, atomic_write_text, get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    table: dict = {}
    for start in ns.starts.split(","):
        for folder, split, label in EVALS:
            qids, doc_ids, z, qrels = rankings(start, root / folder, split, Path(ns.work), ns.depth, ns.doc_max_length)
            row = {rule: {w: score(qids, doc_ids, z, qrels, rule, w, ns.depth) for w in WEIGHTS} for rule in RULES}
            table.setdefault(start, {})[label] = row
            for rule in RULES:
                print(
                    f"{start} {label} {rule}: " + " ".join(f"{w:g}:{v:.4f}" for w, v in row[rule].items()), flush=True
                )
    lines = [
        "# Hybrid retriever: fusion rule and weight on the dev splits",
        "",
        f"nDCG@10 of dense + BM25 fused per query over each system's top {ns.depth}, documents at "
        f"{ns.doc_max_length} tokens; w = the dense weight (0: BM25 alone, 1: the dense model alone). Spread = "
        "half the range of nDCG@10 over w in 0.3-0.7. Command: `python scripts/studies/hybrid_fusion_study.py "
        f"--starts {ns.starts}`.",
        "",
    ]
    summary: dict = {}
    for start, per in table.items():
        lines += [
            f"## {start}",
            "",
            "| split | rule | " + " | ".join(f"w={w:g}" for w in WEIGHTS) + " | best w | spread 0.3-0.7 |",
            "|---|---|" + "---|" * (len(WEIGHTS) + 2),
        ]
        for label, row in per.items():
            for rule in RULES:
                vals = row[rule]
                best = max(vals, key=vals.get)
                mid = [vals[w] for w in MIDDLE]
                spread = (max(mid) - min(mid)) / 2
                summary.setdefault(start, {}).setdefault(label, {})[rule] = {
                    "best_w": best,
                    "best": vals[best],
                    "w0.5": vals[0.5],
                    "spread_0.3_0.7": spread,
                    "dense": vals[1.0],
                    "bm25": vals[0.0],
                }
                lines.append(
                    f"| {label} | {rule} | "
                    + " | ".join(f"{v:.4f}" for v in vals.values())
                    + f" | {best:g} | ±{spread:.4f} |"
                )
        lines.append("")
    Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(f"{ns.report}.md", "\n".join(lines) + "\n")
    atomic_write_json(
        f"{ns.report}.json",
        {
            "depth": ns.depth,
            "doc_max_length": ns.doc_max_length,
            "weights": WEIGHTS,
            "table": {
                s: {lab: {r: {str(w): v for w, v in d.items()} for r, d in row.items()} for lab, row in per.items()}
                for s, per in table.items()
            },
            "summary": summary,
        },
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
