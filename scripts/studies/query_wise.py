"""Regularisation toward the start for a query-side student (issue 49's generalisation lever), measured after the
fact: the query route of each trained student interpolated with the starting model's weights (WiSE-FT of the query
route only: ``start + alpha * (student - start)``), its document route (the starting model's, frozen) unchanged, so
the corpus is encoded once for every alpha. Scored on the dev splits of the corpus-only study (SciFact: the odd-id
half of the train claims; NFCorpus: dev), dense nDCG@10 at the model's 256 tokens, in the precision the recipe uses on
this machine.

Reads the students the corpus-only study saved (``outputs/corpus_only/budget15/<arm>/seed<N>/run/model``); alpha 1 is
the student as trained, alpha 0 the starting model. Cached per (arm, seed, alpha) under ``--work``; the report is
rewritten after every student.

    python scripts/studies/query_wise.py --arms queries,pq-mix --alphas 0,0.25,0.5,0.75,1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPORA = {"scifact": "SciFact", "nfcorpus": "NFCorpus"}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="queries,pq-mix")
    ap.add_argument("--alphas", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--study", default="outputs/corpus_only", help="the corpus-only study's --work")
    ap.add_argument("--budget-minutes", type=float, default=15.0)
    ap.add_argument("--work", default="outputs/query_wise")
    ap.add_argument("--report", default="reports/studies/query_wise")
    ap.add_argument("--findings", default="reports/studies/query_wise_findings.md")
    ap.add_argument(
        "--splits",
        default="dev",
        help="labelled splits to score: dev (where alpha is chosen), and for students that never saw a real query, "
        "pool-distinct (the `queries` arm's training queries: SciFact's even-id half, NFCorpus train) to confirm it",
    )
    return ap.parse_args()


def interpolate(student, start, alpha: float, saved: dict) -> None:
    """Set the student's query route to ``start + alpha * (saved - start)`` (``saved``: its trained weights), module
    by module with the library's WiSE-FT interpolation (:func:`hf_cocodr.modeling.wise.interpolate_state_dicts`)."""
    from hf_cocodr.modeling.asymmetric import query_modules
    from hf_cocodr.modeling.wise import interpolate_state_dicts

    for i, (mine, theirs) in enumerate(zip(query_modules(student), list(start))):
        mine.load_state_dict(interpolate_state_dicts(theirs.state_dict(), saved[i], alpha))


def measure(ns, arm: str, seed: int, alphas: list[float], start, session) -> dict:
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.evaluation.retrieval import evaluate_retrieval
    from hf_cocodr.modeling.asymmetric import query_modules

    folder = Path(ns.work) / arm / f"seed{seed}"
    out_file = folder / "row.json"
    row = json.loads(out_file.read_text()) if out_file.is_file() else {}
    # the `queries` arms trained on pool-distinct: it confirms nothing for them
    splits = [s for s in ns.splits.split(",") if not (s == "pool-distinct" and arm.startswith("queries"))]
    todo = [
        a
        for a in alphas
        if any(f"{label} {split}" not in row.get(str(a), {}) for label in CORPORA.values() for split in splits)
    ]
    if not todo:
        return row
    model_dir = Path(ns.study) / f"budget{ns.budget_minutes:g}" / arm / f"seed{seed}" / "run" / "model"
    student = SentenceTransformer(str(model_dir), device="cpu")
    saved = [{k: v.clone() for k, v in m.state_dict().items()} for m in query_modules(student)]
    data = Path(ns.study) / "data"
    for alpha in todo:
        interpolate(student, start, alpha, saved)
        t0 = time.perf_counter()
        scores = dict(row.get(str(alpha), {}))
        for name, label in CORPORA.items():
            for split in splits:
                if f"{label} {split}" in scores:
                    continue
                res = evaluate_retrieval(
                    student, data / name, split=split, session=session, show_progress_bar=False, k_values=(10,)
                )
                scores[f"{label} {split}"] = res["ndcg@10"]
        row[str(alpha)] = {**scores, "seconds": round(time.perf_counter() - t0, 1)}
        folder.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(row, indent=2) + "\n")
        print(f"{arm} seed {seed} alpha {alpha}: {scores}", flush=True)
    return row


def write_report(ns, rows: dict, alphas: list[float]) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    lines = ["# WiSE-FT of the query route: a query-side student interpolated toward the start", ""]
    findings = Path(ns.findings)
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        f"Command: `python scripts/studies/query_wise.py --arms {ns.arms} --alphas {ns.alphas} --splits {ns.splits}`. "
        "Students: the "
        f"corpus-only study's rows ({ns.budget_minutes:g} minutes on one core, [corpus_only.md](corpus_only.md)); "
        "alpha 1 is the student as trained, alpha 0 the starting model. Dense nDCG@10 on the dev splits; gain over "
        "alpha 0, mean ± half-range over the seeds. pool-distinct: the `queries` arm's training queries (SciFact's "
        "even-id half of the train claims, NFCorpus train), labelled queries the pseudo-query students never saw "
        "(not scored for the `queries` arm, which trained on them). One core of an Intel Xeon with native bf16.",
        "",
        "| arm | alpha | seeds | "
        + " | ".join(f"{label} {split} gain" for split in ns.splits.split(",") for label in CORPORA.values())
        + " |",
        "|---|---|---|" + "---|" * (len(CORPORA) * len(ns.splits.split(","))),
    ]
    summary: dict = {}
    for arm, by_seed in rows.items():
        for alpha in alphas:
            cells = []
            for label in [f"{c} {split}" for split in ns.splits.split(",") for c in CORPORA.values()]:
                gains = [
                    r[str(alpha)][label] - r["0.0"][label]
                    for r in by_seed.values()
                    if label in r.get(str(alpha), {}) and label in r.get("0.0", {})
                ]
                if not gains:
                    cells.append("")
                    continue
                mean, half = statistics.mean(gains), (max(gains) - min(gains)) / 2
                summary.setdefault(arm, {}).setdefault(str(alpha), {})[label] = [mean, half, len(gains)]
                cells.append(f"{mean:+.4f} ± {half:.4f}")
            lines.append(f"| {arm} | {alpha:g} | {len(by_seed)} | " + " | ".join(cells) + " |")
    Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(f"{ns.report}.md"), "\n".join(lines) + "\n")
    atomic_write_json(Path(f"{ns.report}.json"), {"rows": rows, "summary": summary})


def main() -> int:
    ns = parse()
    os.environ.setdefault("HF_COCODR_CACHE", str(Path(ns.work).absolute() / "cache"))
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.utils import native_bf16

    alphas = sorted({0.0, *[float(a) for a in ns.alphas.split(",")]})
    start = load_encoder(bundled_model_path("all-MiniLM-L6-v2"))
    session = EncodingSession(precision="bf16" if native_bf16() else "fp32", cache=True)
    rows: dict = {}
    for arm in ns.arms.split(","):
        base = Path(ns.study) / f"budget{ns.budget_minutes:g}" / arm
        for seed_dir in sorted(base.glob("seed*")):
            if not (seed_dir / "row.json").is_file() or not (seed_dir / "run" / "model").is_dir():
                continue
            seed = int(seed_dir.name[4:])
            rows.setdefault(arm, {})[seed] = measure(ns, arm, seed, alphas, start, session)
            write_report(ns, rows, alphas)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
