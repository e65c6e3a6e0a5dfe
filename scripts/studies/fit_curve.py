"""The fitting curve of the query-side distillation (issue 49): does the student keep gaining as it fits its
training queries harder?

Reads the rows ``corpus_only.py`` trained on one shared, warm cache (the fitted teacher, the study's pools as the
user's queries) at caps of 3, 5, 10 and 15 passes, and, where ``distill_ceiling.py`` read a student, its nDCG@10 on
the pool queries it trained on beside dev, each as a share of the fitted teacher's lead over the start on the same
queries. Writes ``OUT.md`` and ``OUT.json``; nothing is trained here.

    python scripts/studies/fit_curve.py --out reports/studies/distill_fit_curve \\
        --readings 3:42=reports/studies/distill_ceiling_fit.json,15:42=outputs/fit_curve_readings/p15_seed42.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

CORPORA = (("scifact", "SciFact dev"), ("nfcorpus", "NFCorpus dev"))
# passes -> the arm and the budget folder its rows ran under (15 and 10 passes need more than 30 warm minutes)
ARMS = {3: ("queries-fit", 30), 5: ("queries-fit-p5", 30), 10: ("queries-fit-p10", 60), 15: ("queries-fit-p15", 60)}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="outputs/corpus_only_screen")
    ap.add_argument("--out", default="reports/studies/distill_fit_curve")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument(
        "--lead",
        default="scifact=0.0556,nfcorpus=0.0312",
        help="the fitted hybrid's lead over the start on dev per corpus (distill_fit_screen.md)",
    )
    ap.add_argument(
        "--readings",
        default="",
        help="PASSES:SEED=JSON,... distill_ceiling.py's JSON for the student of that row (the pool-distinct split)",
    )
    return ap.parse_args()


def spread(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), (max(values) - min(values)) / 2


def collect(ns) -> dict:
    lead = {k: float(v) for k, v in (x.split("=") for x in ns.lead.split(","))}
    seeds = [int(s) for s in ns.seeds.split(",")]
    rows: dict = {}
    for passes, (arm, budget) in ARMS.items():
        for seed in seeds:
            path = Path(ns.work) / f"budget{budget}" / arm / f"seed{seed}" / "row.json"
            if not path.is_file():
                continue
            row = json.loads(path.read_text())
            if row.get("returncode") != 0:
                continue
            entry = {
                "arm": arm,
                "steps": row["steps_trained"]["distill"],
                "distill_seconds": row["stage_seconds"]["distill"],
                "load_during": row.get("load", {}).get("during_mean"),
            }
            for key, label in CORPORA:
                m = row["metrics"][label]
                entry[key] = round(m["ndcg@10"] - m["start_ndcg@10"], 4)
            rows.setdefault(passes, {})[seed] = entry
    summary: dict = {}
    for passes, by_seed in rows.items():
        s: dict = {"seeds": sorted(by_seed), "steps": sorted({e["steps"] for e in by_seed.values()})}
        for key, _ in CORPORA:
            mean, half = spread([e[key] for e in by_seed.values()])
            s[key] = {"mean": round(mean, 4), "half_range": round(half, 4), "share": round(mean / lead[key], 3)}
            base = rows.get(3, {})
            paired = [e[key] - base[sd][key] for sd, e in by_seed.items() if sd in base]
            if passes != 3 and paired:
                pm, ph = spread(paired)
                s[key]["paired_vs_3"] = {
                    "mean": round(pm, 4), "half_range": round(ph, 4), "per_seed": [round(p, 4) for p in paired]
                }  # fmt: skip
        summary[passes] = s
    readings: dict = {}
    for spec in filter(None, ns.readings.split(",")):
        key, path = spec.split("=", 1)
        passes, seed = (int(x) for x in key.split(":"))
        got = json.loads(Path(path).read_text())
        per: dict = {}
        for corpus, splits in got["corpora"].items():
            per[corpus] = {}
            for split, e in splits.items():
                teacher_lead = e["teacher"] - e["start"]
                per[corpus][split] = {
                    "queries": e["queries"], "start": e["start"], "student": e["student"], "teacher": e["teacher"],
                    "share": round((e["student"] - e["start"]) / teacher_lead, 3) if teacher_lead else None,
                }  # fmt: skip
        readings[f"{passes}:{seed}"] = {"passes": passes, "seed": seed, "json": path, "corpora": per}
    return {"lead": lead, "rows": rows, "summary": summary, "readings": readings}


def render(ns, out: dict) -> str:
    lead = out["lead"]
    lines = ["# The fitting curve of the query-side distillation: 3, 5, 10 and 15 passes over the user's queries", ""]
    findings = Path(ns.out + "_findings.md")
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        "all-MiniLM-L6-v2, the recipe's query-side distillation of the fitted teacher, the study's pools as the user's "
        "queries (SciFact's even-id half of the train claims, NFCorpus train), one shared warm cache (every row trains "
        "the steps its cap on passes fixes), one AVX2 core per row, fp32. nDCG@10 gain over the start on the dev "
        f"splits; mean ± half-range over seeds; share: of the fitted hybrid's lead over the start (SciFact "
        f"{lead['scifact']}, NFCorpus {lead['nfcorpus']}); paired: the gain minus the 3-pass row's of the same seed.",
        "",
        "| passes (cap) | steps | seeds | SciFact dev Δ | share | paired − 3 passes | NFCorpus dev Δ | share | "
        "paired − 3 passes | distill s (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for passes in sorted(out["summary"], key=int):
        s = out["summary"][passes]
        rows = out["rows"][passes]
        secs = np.mean([e["distill_seconds"] for e in rows.values()])
        cells = []
        for key, _ in CORPORA:
            c = s[key]
            p = c.get("paired_vs_3")
            one = len(s["seeds"]) == 1  # one seed: no spread to show
            cells += [
                f"{c['mean']:+.4f}" + ("" if one else f" ± {c['half_range']:.4f}"),
                f"{100 * c['share']:.0f}%",
                ""
                if not p
                else f"{p['mean']:+.4f}"
                if one
                else f"{p['mean']:+.4f} ± {p['half_range']:.4f} ("
                + ", ".join(f"{x:+.4f}" for x in p["per_seed"])
                + ")",
            ]
        steps = "/".join(str(x) for x in s["steps"])
        seeds = ",".join(str(x) for x in s["seeds"])
        lines.append(f"| {passes} | {steps} | {seeds} | " + " | ".join(cells) + f" | {secs:.0f} |")
    lines += ["", "Rows:", "", "| passes | seed | steps | SciFact dev Δ | NFCorpus dev Δ | distill s | load during |"]
    lines.append("|---|---|---|---|---|---|---|")
    for passes in sorted(out["rows"], key=int):
        for seed, e in sorted(out["rows"][passes].items()):
            lines.append(
                f"| {passes} | {seed} | {e['steps']} | {e['scifact']:+.4f} | {e['nfcorpus']:+.4f} | "
                f"{e['distill_seconds']:.0f} | {e['load_during']} |"
            )
    if out["readings"]:
        lines += [
            "",
            "The students on the queries they trained on and on dev (`distill_ceiling.py` with `--steps 0 "
            "--reachable-queries 1`: its student columns only; the 3-pass row's reading is the ceiling study's), share of the fitted teacher's lead over the start on "
            "the same queries:",
            "",
            "| passes | seed | corpus | pool (trained) start / student / teacher | share | dev start / student / "
            "teacher | share |",
            "|---|---|---|---|---|---|---|",
        ]
        for key in sorted(out["readings"], key=lambda k: tuple(int(x) for x in k.split(":"))):
            r = out["readings"][key]
            for corpus, per in r["corpora"].items():
                pool, dev = per["pool-distinct"], per["dev"]
                lines.append(
                    f"| {r['passes']} | {r['seed']} | {corpus} | {pool['start']:.4f} / {pool['student']:.4f} / "
                    f"{pool['teacher']:.4f} | {100 * pool['share']:.0f}% | {dev['start']:.4f} / {dev['student']:.4f} "
                    f"/ {dev['teacher']:.4f} | {100 * dev['share']:.0f}% |"
                )
    lines += [
        "",
        "Commands (`HF_COCODR_DATA` pointing at the shared data; each row is kept and skipped on a re-run):",
        "",
        "    python scripts/studies/corpus_only.py --arms queries-fit,queries-fit-p5 --seeds 42,43,44 --core 0 \\",
        "        --work outputs/corpus_only_screen --shared-cache outputs/corpus_only_screen/cache --budget-minutes 30",
        "    python scripts/studies/corpus_only.py --arms queries-fit-p10,queries-fit-p15 --seeds 42,43,44 --core 1 \\",
        "        --work outputs/corpus_only_screen --shared-cache outputs/corpus_only_screen/cache --budget-minutes 60",
        "    python scripts/studies/distill_ceiling.py --student outputs/corpus_only_screen/budget60/queries-fit-p15/"
        "seed42/run \\",
        "        --teacher fit --steps 0 --reachable-queries 1 --data outputs/corpus_only_screen/data \\",
        "        --cache outputs/corpus_only_screen/cache --work outputs/fit_curve_readings "
        "--out outputs/fit_curve_readings/p15_seed42",
        f"    python scripts/studies/fit_curve.py --out {ns.out}"
        + (f" --readings {ns.readings}" if ns.readings else ""),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    ns = parse()
    out = collect(ns)
    if not out["rows"]:
        raise SystemExit(f"fit_curve: no finished rows under {ns.work}")
    atomic_write_json(Path(ns.out + ".json"), out)
    atomic_write_text(Path(ns.out + ".md"), render(ns, out))
    print(render(ns, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
