"""Can the label-free guard choose among students? (issue 49's last generalisation lever, read after the fact.)

Every finished study run of the query-side distillation (``RUNS/<arm>/seed<N>/``: ``row.json`` with the dev gains the
labels give, ``run/recipe.json`` with the guard's readings, taken before export without labels) is one candidate a
guard could choose: a run of another length is the checkpoint at another pass (3, 5, 10, 15 passes), a run of
another setting another candidate. For each of the guard's readings (the held-out pseudo-queries' nDCG@10 gain over
the start, pooled and per corpus; the held-out real queries' agreement with the teacher), this reports:

- its rank correlation (Spearman) with each corpus's dev gain over every run;
- per seed (with at least 3 runs), the run it would choose (the highest reading) against the best run the labels
  know and the runs' mean;
- along the pass caps of seed 42 (the runs that differ only in length), the pass it would stop at.

No training and no encoding: it reads the runs' files. ``--runs`` may be given more than once.

    python scripts/studies/guard_choice.py --runs outputs/corpus_only_screen/budget30 \\
        --runs outputs/corpus_only_screen/budget60 --out reports/studies/guard_choice
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from hf_cocodr.utils import atomic_write_json, atomic_write_text

CORPORA = {"scifact": "SciFact dev", "nfcorpus": "NFCorpus dev"}
# the guard's readings: name -> how to read it from recipe.json's "guard" (a difference adapted − start)
READINGS = {
    "pseudo-queries (pooled)": ("readings", "pseudo_queries"),
    "pseudo-queries (SciFact)": ("corpora", "scifact", "pseudo_queries"),
    "pseudo-queries (NFCorpus)": ("corpora", "nfcorpus", "pseudo_queries"),
    "held-out queries' agreement (pooled)": ("readings", "queries"),
    "held-out queries' agreement (NFCorpus)": ("corpora", "nfcorpus", "queries"),
}
MIN_CANDIDATES = 3  # a seed with fewer finished runs offers no choice worth reading
DECIDES = "pseudo-queries (pooled)"  # what the recipe's guard decides on
# the runs that differ only in their cap on passes (the checkpoints of one schedule, seed 42)
PASSES = {"queries-fit": 3, "queries-fit-p5": 5, "queries-fit-p10": 10, "queries-fit-p15": 15}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", action="append", required=True, help="a folder of ARM/seedN/{row.json,run/recipe.json}")
    ap.add_argument("--lead", default="scifact=0.0556,nfcorpus=0.0312", help="the fitted hybrid's lead per corpus")
    ap.add_argument("--out", default="reports/studies/guard_choice")
    return ap.parse_args()


def dig(data, path):
    for key in path:
        data = data[key]
    return data


def read_runs(folders: list[str]) -> list[dict]:
    """One record per finished run: arm, seed, dev gains per corpus, the guard's readings (and their SE)."""
    runs = []
    for folder in folders:
        for row_file in sorted(Path(folder).glob("*/seed*/row.json")):
            recipe = row_file.parent / "run" / "recipe.json"
            if not recipe.exists():
                continue
            row, guard = json.loads(row_file.read_text()), json.loads(recipe.read_text()).get("guard") or {}
            metrics = row.get("metrics") or {}
            if not guard.get("readings") or any(name not in metrics for name in CORPORA.values()):
                continue
            gains = {c: metrics[m]["ndcg@10"] - metrics[m]["start_ndcg@10"] for c, m in CORPORA.items()}
            readings, se = {}, {}
            for name, path in READINGS.items():
                try:
                    cell = dig(guard, path)
                except (KeyError, TypeError):
                    continue
                readings[name], se[name] = cell["difference"], cell.get("se")
            runs.append({"arm": row["arm"], "seed": row["seed"], "gains": gains, "readings": readings, "se": se})
    return runs


def main() -> int:
    ns = parse()
    lead = {k: float(v) for k, v in (part.split("=") for part in ns.lead.split(","))}
    runs = read_runs(ns.runs)
    if len(runs) < 3:
        raise SystemExit(f"guard_choice: {len(runs)} finished runs with a guard reading under {ns.runs}: too few")

    correlations = {}
    for name in READINGS:
        have = [r for r in runs if name in r["readings"]]
        x = [r["readings"][name] for r in have]
        correlations[name] = {
            c: dict(zip(("rho", "p"), (round(float(v), 3) for v in spearmanr(x, [r["gains"][c] for r in have]))))
            for c in CORPORA
        }
        correlations[name]["runs"] = len(have)

    choices = []
    for seed in sorted({r["seed"] for r in runs}):
        mine = [r for r in runs if r["seed"] == seed]
        if len(mine) < MIN_CANDIDATES:
            continue
        for name in (DECIDES, "pseudo-queries (NFCorpus)", "held-out queries' agreement (pooled)"):
            chosen = max(mine, key=lambda r: r["readings"].get(name, -np.inf))
            choices.append({
                "seed": seed, "reading": name, "candidates": len(mine), "chosen": chosen["arm"],
                "chosen_gains": chosen["gains"],
                "best_nfcorpus": max(mine, key=lambda r: r["gains"]["nfcorpus"])["arm"],
                "oracle": {c: max(r["gains"][c] for r in mine) for c in CORPORA},
                "mean": {c: float(np.mean([r["gains"][c] for r in mine])) for c in CORPORA},
            })  # fmt: skip

    curve = sorted((r for r in runs if r["seed"] == 42 and r["arm"] in PASSES), key=lambda r: PASSES[r["arm"]])

    def share(c: str, v: float) -> str:
        return f"{v:+.4f} ({v / lead[c]:.0%})"

    lines = [
        "# Can the label-free guard choose among the query-side students? (issue 49)",
        "",
        "Each finished run of the query-side distillation study (`row.json`: dev gains from the labels; "
        "`run/recipe.json`: the guard's readings, label-free, before export) is a candidate. One AVX2 core per run, "
        "fp32. The guard's readings are differences adapted − start: nDCG@10 of the held-out pseudo-queries "
        "(their source document the one relevant), and of the held-out share of the user's queries against the "
        "teacher's top 10. Share: of the fitted hybrid's dev lead over the start "
        f"(SciFact {lead['scifact']}, NFCorpus {lead['nfcorpus']}).",
        "",
        f"Command: `python scripts/studies/guard_choice.py {' '.join('--runs ' + f for f in ns.runs)} --out {ns.out}`",
        "",
        f"## Rank correlation of each reading with the dev gain ({len(runs)} runs, every arm and seed)",
        "",
        "| reading | runs | ρ with SciFact dev gain (p) | ρ with NFCorpus dev gain (p) | the reading's SE (median) |",
        "|---|---|---|---|---|",
    ]
    for name, cell in correlations.items():
        ses = [r["se"][name] for r in runs if r["se"].get(name) is not None]
        lines.append(
            f"| {name} | {cell['runs']} | {cell['scifact']['rho']:+.3f} ({cell['scifact']['p']:.3f}) | "
            f"{cell['nfcorpus']['rho']:+.3f} ({cell['nfcorpus']['p']:.3f}) | {np.median(ses):.4f} |"
        )
    lines += [
        "",
        "## The run each reading would choose, per seed",
        "",
        "| seed | reading | candidates | chosen | its SciFact gain | its NFCorpus gain | best NFCorpus run (labels) | "
        "best SciFact / NFCorpus | mean of the candidates |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ch in choices:
        lines.append(
            f"| {ch['seed']} | {ch['reading']} | {ch['candidates']} | `{ch['chosen']}` | "
            f"{share('scifact', ch['chosen_gains']['scifact'])} | {share('nfcorpus', ch['chosen_gains']['nfcorpus'])} | "
            f"`{ch['best_nfcorpus']}` | {ch['oracle']['scifact']:+.4f} / {ch['oracle']['nfcorpus']:+.4f} | "
            f"{ch['mean']['scifact']:+.4f} / {ch['mean']['nfcorpus']:+.4f} |"
        )
    if curve:
        lines += [
            "",
            "## Along the passes (seed 42, the runs that differ only in their cap on passes)",
            "",
            "| passes | SciFact dev gain | NFCorpus dev gain | " + " | ".join(f"{n} (± SE)" for n in READINGS) + " |",
            "|---|---|---|" + "---|" * len(READINGS),
        ]
        for r in curve:
            cells = [f"{r['readings'][n]:+.4f} ± {r['se'][n]:.4f}" if n in r["readings"] else "" for n in READINGS]
            lines.append(
                f"| {PASSES[r['arm']]} | {share('scifact', r['gains']['scifact'])} | "
                f"{share('nfcorpus', r['gains']['nfcorpus'])} | " + " | ".join(cells) + " |"
            )
    lines += ["", "Runs:", "", "| arm | seed | SciFact dev gain | NFCorpus dev gain | " + " | ".join(READINGS) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(READINGS))
    for r in sorted(runs, key=lambda r: (r["arm"], r["seed"])):
        cells = [f"{r['readings'][n]:+.4f}" if n in r["readings"] else "" for n in READINGS]
        lines.append(
            f"| `{r['arm']}` | {r['seed']} | {r['gains']['scifact']:+.4f} | {r['gains']['nfcorpus']:+.4f} | "
            + " | ".join(cells)
            + " |"
        )
    findings = Path(ns.out + "_findings.md")
    if findings.exists():
        lines = [
            lines[0],
            "",
            f"Findings (written once, beside this table): [{findings.name}]({findings.name})",
            "",
            *lines[1:],
        ]
    atomic_write_text(Path(ns.out + ".md"), "\n".join(lines) + "\n")
    atomic_write_json(
        Path(ns.out + ".json"),
        {"runs": runs, "correlations": correlations, "choices": choices, "lead": lead, "command_runs": ns.runs},
    )
    print("\n".join(lines[:40]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
