"""Soups of finished adaptation-study runs: the uniform weight average of an arm's seeds, evaluated like a study row.

A check of the soup that needs no training: e.g. three 76-step COCO runs of the ``coco76`` arm (seeds 42, 43, 44)
averaged and evaluated on the dev splits, beside the recipe's own ``coco-soup`` arm. Results are cached under
``--work`` (``BUDGET/ARM-soup-SEEDS/dev_eval.json``) and printed as one JSON line per soup.

    python scripts/studies/soup_rows.py --arm coco76 --groups 42,43,44 45,46,47 48,49,50
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adaptation_study import arm_dir, evaluate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", required=True)
    ap.add_argument("--groups", nargs="+", required=True, help="comma-separated seeds, one group per soup")
    ap.add_argument("--budget-minutes", type=float, default=15.0)
    ap.add_argument("--doc-max-length", type=int, default=128)
    ap.add_argument("--work", default="outputs/adaptation_study")
    ns = ap.parse_args()

    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.wise import soup
    from hf_cocodr.utils import get_data_root

    for group in ns.groups:
        seeds = [int(s) for s in group.split(",")]
        models = [arm_dir(Path(ns.work), ns.budget_minutes, ns.arm, s) / "run" / "model" for s in seeds]
        missing = [str(m) for m in models if not (m / "modules.json").is_file()]
        if missing:
            sys.exit(
                f"not trained yet: {', '.join(missing)} (run the arm's seeds with scripts/studies/adaptation_study.py)"
            )
        out = Path(ns.work) / f"budget{ns.budget_minutes:g}" / f"{ns.arm}-soup-{'-'.join(map(str, seeds))}"
        metrics = evaluate(soup([load_encoder(str(m)) for m in models]), out, get_data_root(), ns.doc_max_length)
        print(json.dumps({"arm": ns.arm, "seeds": seeds, "metrics": metrics}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
