"""Is the gap between the fitted fusion and mteb's rsf the candidate depth? all-MiniLM-L6-v2 on SciFact dev.

``hybrid_fit_study.py`` runs mteb's ``HybridSearch`` with ``top_k = 2 * depth`` (200), so mteb asks its BM25 for
``max(top_k, sub_model_top_k)`` = 200 candidates while the dense list it is given holds the study's 100. This script
fuses, from the study's cached vectors (``outputs/hybrid_fit``; run the study first), the same two systems at matched
and unmatched depths: mteb's own ``fuse_relative_score_fusion`` (equal weights, its tie order) and the package's
``fuse`` (min-max and z-scores, BM25's zeros kept in its list as the index returns it).

    python scripts/studies/hybrid_fit_depth.py   # prints a table, writes reports/studies/hybrid_fit_depth.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEPTHS = ((100, 100), (100, 200), (200, 200))  # (dense, BM25)


def main() -> int:
    import numpy as np
    from mteb.models.hybrid_wrappers import fuse_relative_score_fusion

    from hf_cocodr.data.beir import column_numpy, corpus_texts, load_beir
    from hf_cocodr.evaluation.retrieval import summarize
    from hf_cocodr.retrieval.fusion import FusionConfig, fuse
    from hf_cocodr.retrieval.index import BM25Index, DenseIndex
    from hf_cocodr.utils import atomic_write_json, get_data_root

    work, start = Path("outputs/hybrid_fit"), "all-MiniLM-L6-v2"
    data = load_beir(get_data_root() / "scifact", "train")
    docs = np.load(work / f"{start}-scifact-len256-docs.npy")
    q = np.load(work / f"{start}-scifact-len256-train-queries.npy")
    qids = list(data.queries["_id"])
    doc_ids = np.asarray(column_numpy(data.corpus, "_id"), dtype=object)
    texts = [t for _, batch in corpus_texts(data.corpus) for t in batch]
    index = DenseIndex(docs.shape[1], capacity=len(docs))
    index.add(docs)
    ds, di = index.search(q, 200)
    bs, bi = BM25Index(texts).search(list(data.queries["text"]), 200)

    def ndcg(run) -> float:
        return round(summarize(data.qrels, run, k_values=(10,))["ndcg@10"], 4)

    def ours(norm: str, w: float, dd: int, bd: int) -> float:
        cfg = FusionConfig(dense_weight=w, normalize=norm)
        run = {}
        for i, qid in enumerate(qids):
            rows, fused = fuse(di[i][:dd], ds[i][:dd], bi[i][:bd], bs[i][:bd], cfg, 200)
            run[qid] = dict(zip(doc_ids[rows].tolist(), fused.astype(float).tolist()))
        return ndcg(run)

    def mteb_rsf(dd: int, bd: int) -> float:
        run = {}
        for i, qid in enumerate(qids):
            lists = [
                {doc_ids[j]: float(x) for j, x in zip(bi[i][:bd], bs[i][:bd])},
                {doc_ids[j]: float(x) for j, x in zip(di[i][:dd], ds[i][:dd])},
            ]
            fused = fuse_relative_score_fusion(lists, [0.5, 0.5])
            run[qid] = dict(sorted(fused.items(), key=lambda x: (x[1], x[0]), reverse=True)[:200])
        return ndcg(run)

    rows = []
    print("| dense depth | BM25 depth | mteb rsf | minmax 0.4 / 0.5 / 0.6 | z 0.4 (the fitted) / 0.5 |")
    print("|---|---|---|---|---|")
    for dd, bd in DEPTHS:
        r = {"dense_depth": dd, "bm25_depth": bd, "mteb_rsf": mteb_rsf(dd, bd)}
        r["minmax"] = {f"{w:g}": ours("minmax", w, dd, bd) for w in (0.4, 0.5, 0.6)}
        r["z"] = {f"{w:g}": ours("z", w, dd, bd) for w in (0.4, 0.5)}
        rows.append(r)
        mm, z = r["minmax"], r["z"]
        print(
            f"| {dd} | {bd} | {r['mteb_rsf']:.4f} | {mm['0.4']:.4f} / {mm['0.5']:.4f} / {mm['0.6']:.4f} | {z['0.4']:.4f} / {z['0.5']:.4f} |"
        )
    atomic_write_json("reports/studies/hybrid_fit_depth.json", {"start": start, "split": "SciFact dev", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
