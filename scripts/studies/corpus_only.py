"""The corpus-only study (issue 53): what the recipe gains from the target corpora alone, no query of the user's,
on one core from a cold cache, and how often its label-free guard reads what the labels read.

Each row is one ``hf-cocodr recipe`` command, timed from its start, in a subprocess pinned to one core
(``taskset -c CORE``, ``OMP_NUM_THREADS=1``) with a fresh, empty ``HF_COCODR_CACHE`` and output folder: all-MiniLM-L6-v2,
target corpora SciFact and NFCorpus, source SQuAD, ``--max-minutes`` (15 on a core with native bf16, 30 without:
the row records which), ``--guard record`` (the guard reads and records, the adapted model is kept, so each row
scores the adapted model whatever the guard says), the dev splits of the distillation study (SciFact: the odd-id
half of the train claims; NFCorpus: dev; ``distill_study.prepare_data``). The recipe's own evaluation gives each
row: the adapted dense model and its hybrid with BM25, and the starting model's, at the model's own 256 tokens.

Arms (:data:`ARMS`): ``soup`` (today's no-queries default: the COCO soup), ``pq-KIND`` (the query-side distillation
on ``--pseudo-queries N`` of one kind: span, keywords, title, ict), ``pq-mix`` (the default mix), ``coco-pq`` (the
COCO soup, then the distillation on the default mix, the whole model), and for reference ``queries`` (the
distillation on the real train queries, the study's pools). Rows are cached under ``--work`` (a row whose command
did not finish runs again from a cold start); the report is rewritten after every row.

    python scripts/studies/corpus_only.py --arms pq-mix,pq-span,pq-keywords,pq-title,soup,queries --seeds 42 --core 1
    python scripts/studies/corpus_only.py --report-only

The arms that pass a retired option (``--distill-deep``, ``--distill-margin-weight``, ``--distill-corpus-weight``,
``--distill-swa``, ``--distill-l2sp``; ``queries-pq``'s mix calibrated to the user's queries) need hf_cocodr at
commit 123371a9ca5c017ea45ef09586cd2a3075201c7f, the last where their code lived; today's recipe refuses them by name.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from cpu_budget import (  # noqa: E402
    EVALS,
    HALF,
    POOL,
    arm_gains,
    cached_rows,
    gain_cell,
    load_text,
    pinned_run,
    row_folder,
    start_line,
    study_inputs,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "configs"  # recipe --config files of the arms that need one
N_PSEUDO = 8000  # pseudo-queries over the two corpora (split by their sizes): 3 passes fill about 15 minutes here
# the pseudo-query arms as they ran before the corpus-only schedule ended with WiSE-FT (the pq-mix-wise arm)
NO_WISE = ["--wise-alpha", "none"]
ARMS = {
    "soup": ([], "today's no-queries default: the COCO soup (MLM through a fresh Condenser head, averaged runs)"),
    **{
        f"pq-{kind}": (
            ["--pseudo-queries", str(N_PSEUDO), "--pseudo-query-mix", kind, *NO_WISE],
            f"query-side distillation on {N_PSEUDO} {kind} pseudo-queries",
        )
        for kind in ("span", "keywords", "title", "ict")
    },
    "pq-mix": (
        ["--pseudo-queries", str(N_PSEUDO), *NO_WISE],
        f"query-side distillation on {N_PSEUDO} pseudo-queries of the default mix (span, keywords, title: equal)",
    ),
    "pq-mix-wise": (
        ["--pseudo-queries", str(N_PSEUDO), "--wise-alpha", "0.75"],
        "the `pq-mix` row with its query route interpolated toward the start (WiSE-FT 0.75): the corpus-only default",
    ),
    "pq-mix4": (
        ["--pseudo-queries", str(N_PSEUDO), "--pseudo-query-mix", "span,keywords,title,ict", *NO_WISE],
        f"query-side distillation on {N_PSEUDO} pseudo-queries of every kind alike (span, keywords, title, ict)",
    ),
    "pq-mix-16k": (
        ["--pseudo-queries", str(2 * N_PSEUDO), *NO_WISE],
        f"query-side distillation on {2 * N_PSEUDO} pseudo-queries of the default mix (more than 3 passes' steps)",
    ),
    "coco-pq": (
        ["--pseudo-queries", str(N_PSEUDO), "--skip-coco", "false", "--distill-side", "full", *NO_WISE],
        f"the COCO soup, then the whole model distilled on {N_PSEUDO} pseudo-queries of the default mix",
    ),
    "queries": ("@queries", "reference: query-side distillation on the real train queries (the study's pools)"),
    # issue 49's lever for a teacher that caps its student (NFCorpus): the fusion fitted to each corpus as the teacher
    "queries-fit": (
        "@queries --distill-teacher-weight fit",
        "the `queries` row with the teacher's fusion fitted to each corpus (the saved hybrid's) instead of fixed",
    ),
    # issue 49's lever for a student that fits its training queries better than unseen ones (SciFact): more and more
    # varied queries, the corpus's pseudo-queries added to the user's
    "queries-pq": (
        f"@queries --pseudo-queries {N_PSEUDO // 2}",
        f"the `queries` row with {N_PSEUDO // 2} pseudo-queries of the mix calibrated to the user's queries added",
    ),
    # issue 49's lever for a signal that teaches only the order of the top 8: sampled deeper candidates (ranks 9-200,
    # rows of the frozen vectors: free on the query side) in the listwise loss
    "queries-deep": (
        "@queries --distill-deep 8",
        "the `queries` row with 8 candidates sampled from the teacher's ranks 9-200 added to each query's top 8",
    ),
    # both levers at once: the teacher that caps NFCorpus fitted, the signal that caps SciFact deepened
    "queries-fit-deep": (
        "@queries --distill-teacher-weight fit --distill-deep 8",
        "the `queries` row with the fitted teacher and 8 sampled deeper candidates (both levers above together)",
    ),
    # the signal that caps SciFact (the student fits its own training queries to less than half of what the loss
    # reaches with free vectors): the learning rate doubled, on top of both levers
    "queries-fit-deep-lr": (
        f"@queries --distill-teacher-weight fit --distill-deep 8 --config {CONFIGS / 'distill_lr1e-4.yaml'}",
        "the `queries-fit-deep` row at twice the learning rate (1e-4)",
    ),
    # the signal again: a Margin-MSE term beside the listwise KL, so the order of the candidates the teacher ranks low
    # (the sampled deeper ones) counts as much as that of its top (weight 0.1: the term starts near the KL's size)
    "queries-fit-deep-margin": (
        "@queries --distill-teacher-weight fit --distill-deep 8 --distill-margin-weight 0.1",
        "the `queries-fit-deep` row with a Margin-MSE term (weight 0.1) on the margins to the teacher's first candidate",
    ),
    # between the two: the fitted teacher (NFCorpus in every seed, SciFact untouched) at a learning rate between the
    # recipe's and the one that gained NFCorpus and lost SciFact
    "queries-fit-lr7": (
        f"@queries --distill-teacher-weight fit --config {CONFIGS / 'distill_lr7e-5.yaml'}",
        "the `queries-fit` row at a learning rate of 7e-5",
    ),
    # the learning rate again, for WiSE-FT after the fact (scripts/studies/distill_wise.py): interpolating the query
    # route toward the start gave SciFact back what 1e-4 cost it
    "queries-fit-lr1": (
        f"@queries --distill-teacher-weight fit --config {CONFIGS / 'distill_lr1e-4.yaml'}",
        "the `queries-fit` row at twice the learning rate (1e-4)",
    ),
    "queries-fit-lr2": (
        f"@queries --distill-teacher-weight fit --config {CONFIGS / 'distill_lr2e-4.yaml'}",
        "the `queries-fit` row at four times the learning rate (2e-4)",
    ),
    # the signal: a sharper teacher (its fused z-scores at temperature 0.5, the stage's 1 halved)
    "queries-fit-t05": (
        "@queries --distill-teacher-weight fit --distill-teacher-temperature 0.5",
        "the `queries-fit` row with the teacher's temperature at 0.5",
    ),
    # fitting: the fitted-teacher student takes about 3/4 of the teacher's lead on its own training queries as on dev
    # (distill_ceiling_fit.md), so it under-fits rather than over-fits NFCorpus: more passes than the cap of 3
    "queries-fit-p5": (
        "@queries --distill-teacher-weight fit --distill-max-passes 5",
        "the `queries-fit` row with the cap on passes at 5 (855 steps)",
    ),
    # the signal that moves the student's top 10 away from its teacher's (its agreement falls below the start's
    # while the labels read it better): every document of the corpus the teacher did not pick pushed below its
    # candidates (the KL over the whole corpus against the frozen vectors), not only the in-batch first candidates
    "queries-fit-corpus": (
        "@queries --distill-teacher-weight fit --distill-corpus-weight 1",
        "the `queries-fit` row with the whole-corpus term at weight 1 (the listwise KL over the whole corpus)",
    ),
    # the other way: the whole-corpus term (more negatives) cost NFCorpus, whose queries share many relevant
    # documents (another query's first candidate may be one of this query's): no in-batch negatives at all
    "queries-fit-ib0": (
        "@queries --distill-teacher-weight fit --distill-in-batch-weight 0",
        "the `queries-fit` row without the in-batch contrastive term (the listwise KL over the top 8 alone)",
    ),
    # between the two directions: no in-batch negatives cost NFCorpus 0.010 and every document of the corpus 0.005;
    # the in-batch InfoNCE (the other queries' first candidates) at twice its weight
    "queries-fit-ib2": (
        "@queries --distill-teacher-weight fit --distill-in-batch-weight 2",
        "the `queries-fit` row with the in-batch contrastive term at weight 2",
    ),
    # generalisation: the uniform soup of a row's three seeds' students gained SciFact in every arm (+0.003 to +0.012)
    # and NFCorpus a little (distill_wise.md); within one run, the weights averaged over the last half of the steps
    "queries-fit-swa": (
        "@queries --distill-teacher-weight fit --distill-swa 0.5",
        "the `queries-fit` row with its weights averaged over the last half of the steps (SWA)",
    ),
    "queries-fit-p5-swa": (
        "@queries --distill-teacher-weight fit --distill-max-passes 5 --distill-swa 0.5",
        "the `queries-fit-p5` row (the default's 5 passes) with its weights averaged over the last half of the steps",
    ),
    "queries-fit-lr1-swa": (
        f"@queries --distill-teacher-weight fit --distill-swa 0.5 --config {CONFIGS / 'distill_lr1e-4.yaml'}",
        "the `queries-fit-lr1` row (lr 1e-4) with its weights averaged over the last half of the steps (SWA)",
    ),
    # generalisation, the last regulariser: the weights pulled toward the start after each step (L2-SP,
    # decoupled), at the default's 5 passes; a deviation forgets itself in 1/(lr·α) steps: 200 at α 100, 50 at 400
    **{
        f"queries-fit-p5-l2sp{a}": (
            f"@queries --distill-teacher-weight fit --distill-max-passes 5 --distill-l2sp {a}",
            f"the `queries-fit-p5` row with the weights pulled toward the start at weight {a} (L2-SP, decoupled)",
        )
        for a in (100, 400)
    },
    # where the student over-fits (10 passes: NFCorpus dev 81% -> 69% of the lead, the pool 85% -> 87%), the pull
    "queries-fit-p10-l2sp100": (
        "@queries --distill-teacher-weight fit --distill-max-passes 10 --distill-l2sp 100",
        "the `queries-fit-p10` row with the weights pulled toward the start at weight 100 (L2-SP, decoupled)",
    ),
    # the fitting curve: does the student keep gaining as it fits its training queries harder (10 and 15 passes,
    # 1710 and 2565 steps; past what 30 minutes of one AVX2 core buy after a cold teacher, so run warm at 60 minutes)
    **{
        f"queries-fit-p{p}": (
            f"@queries --distill-teacher-weight fit --distill-max-passes {p}",
            f"the `queries-fit` row with the cap on passes at {p} ({171 * p} steps)",
        )
        for p in (10, 15)
    },
    # issue 49's held-out half: the recipe's default trained on half the pool's query texts (cpu_budget.half_pools),
    # its agreement with the teacher then read on the other half (distill_agreement.py --trained-split pool-half)
    "half": ("@half", "the recipe's default on half of the pool (by query text): the other half is never trained on"),
    "half-fit": (
        "@half --distill-teacher-weight fit",
        "the `half` row with the teacher's fusion fitted to each corpus",
    ),
    "half-fit-p5": (
        "@half --distill-teacher-weight fit --distill-max-passes 5",
        "the `half-fit` row with the cap on passes at 5 (the default since issue 49's last round)",
    ),
    "pq-mix-fit": (
        ["--pseudo-queries", str(N_PSEUDO), "--distill-teacher-weight", "fit", *NO_WISE],
        f"the `pq-mix` row ({N_PSEUDO} pseudo-queries) with the teacher's fusion fitted to each corpus",
    ),
}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="pq-mix,pq-span,pq-keywords,pq-title,soup,queries")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--budget-minutes", type=float, default=None, help="default: 15 with native bf16, else 30")
    ap.add_argument("--core", default="1", help="the core the commands are pinned to (taskset -c)")
    ap.add_argument("--work", default="outputs/corpus_only")
    ap.add_argument("--report", default="reports/studies/corpus_only")
    ap.add_argument("--findings", default="reports/studies/corpus_only_findings.md")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--title", default="Adaptation from the corpus alone", help="the report's heading")
    ap.add_argument(
        "--shared-cache",
        default=None,
        help="one HF_COCODR_CACHE for every row instead of a fresh one each: after the first row the teacher's "
        "indexes are warm, so a row costs its training and evaluation alone. A screen at the steps the cap on "
        "passes fixes (what the `queries` rows train), not the cold-start timing the study otherwise measures",
    )
    ns = ap.parse_args()
    if ns.budget_minutes is None:
        from hf_cocodr.utils import native_bf16

        ns.budget_minutes = 15.0 if native_bf16() else 30.0
    return ns


def command(arm: str, seed: int, ns, data: Path, model: str, out: Path) -> list[str]:
    extra, _ = ARMS[arm]
    cmd = [
        "taskset", "-c", ns.core, sys.executable, "-m", "hf_cocodr", "recipe",
        "--model", model, "--target-corpus", str(data / "scifact"), "--target-corpus", str(data / "nfcorpus"),
        "--source-data", str(data / "squad-v1.1"), "--output_dir", str(out),
        "--max-minutes", f"{ns.budget_minutes:g}", "--seed", str(seed), "--guard", "record",
        "--eval", f"{data / 'scifact'}:dev", "--eval", f"{data / 'nfcorpus'}:dev",
    ]  # fmt: skip
    if isinstance(extra, str) and extra.startswith(("@queries", "@half")):  # the study's pools as the user's queries
        pool = HALF if extra.startswith("@half") else POOL
        given = extra.split()[1:]
        # the passes these rows were screened at (3) unless the arm sets them: 5 became the default after them
        passes = [] if "--distill-max-passes" in given else ["--distill-max-passes", "3"]
        return cmd + [
            "--target-queries",
            f"{data / 'scifact'}:{pool}",
            "--target-queries",
            f"{data / 'nfcorpus'}:{pool}",
            *given,
            *passes,
        ]
    return cmd + extra


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def run_row(arm: str, seed: int, ns, data: Path, model: str) -> dict:
    folder, done = row_folder(ns, arm, seed)
    if done is not None:
        return done
    out = (folder / "run").absolute()  # the command runs in the repository root (pinned_run), not here
    cache = Path(ns.shared_cache).absolute() if ns.shared_cache else folder / "cache"
    cmd = command(arm, seed, ns, data, model, out)
    from hf_cocodr.utils import native_bf16

    row = {
        "arm": arm,
        "seed": seed,
        **pinned_run(folder, cmd, cache),
        "cpu": cpu_model(),
        "native_bf16": native_bf16(),
        **({"shared_cache": True} if ns.shared_cache else {}),
    }
    row["commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    if row["returncode"] == 0:
        row.update(read_run(out, data))
    (folder / "row.json").write_text(json.dumps(row, indent=2) + "\n")
    # the row keeps what it needs: the run's caches and checkpoints go (the models stay for a later look)
    if not ns.shared_cache:
        shutil.rmtree(cache, ignore_errors=True)
    return row


def read_run(out: Path, data: Path) -> dict:
    """What a finished run recorded: each dev split's dense and hybrid nDCG@10 of the adapted and the starting model
    , the steps, the guard's reading, the seconds."""
    ev = json.loads((out / "eval.json").read_text())
    rec = json.loads((out / "recipe.json").read_text())
    metrics = {}
    for name, label in EVALS:
        r = ev[f"{data / name}:dev"]
        metrics[label] = {
            "ndcg@10": r["ndcg@10"],
            "start_ndcg@10": r["start"]["ndcg@10"],
            "hybrid_ndcg@10": r["hybrid"]["ndcg@10"],
            "start_hybrid_ndcg@10": r["start"]["hybrid"]["ndcg@10"],
            "bm25_ndcg@10": r["bm25"]["ndcg@10"],
        }
    return {
        "metrics": metrics,
        "steps_trained": rec.get("steps_trained", {}),
        "capped_at_passes": rec.get("capped_at_passes", {}),
        "stopped_by_deadline": rec.get("stopped_by_deadline", {}),
        "schedule": rec.get("schedule", {}).get("kind"),
        "distill": distill_settings(rec),
        "queries": rec.get("queries"),
        "guard": rec.get("guard"),
        "stage_seconds": rec.get("stage_seconds"),
        "train_seconds": rec.get("train_seconds"),
        "wall_seconds": rec.get("wall_seconds"),
        "fixed_costs": (rec.get("plan") or {}).get("fixed_costs"),
        "precision": rec.get("precision"),
    }


def label_reading(rows: list[dict], label: str) -> tuple[float, float, str]:
    """The labels' reading of an arm on one dev split: the mean gain over seeds, its half-range, and the verdict
    (``better`` / ``worse`` beyond the spread, else ``no difference``)."""
    vals = [r["metrics"][label]["ndcg@10"] - r["metrics"][label]["start_ndcg@10"] for r in rows]
    mean = statistics.mean(vals)
    half = (max(vals) - min(vals)) / 2 if len(vals) > 1 else 0.0
    verdict = "better" if mean > half and mean > 0 else "worse" if mean < -half and mean < 0 else "no difference"
    if len(vals) < 2:
        verdict = "one seed"
    return mean, half, verdict


def distill_settings(rec: dict) -> dict:
    """The resolved settings of a run's ``recipe.json`` that decide which guard readings its training shaped."""
    cfg = rec.get("config") or {}
    return {k: cfg.get(k) for k in ("distill_side", "skip_distill", "pseudo_queries", "target_queries")}


def guard_verdict(r: dict, corpus: str) -> str:
    """The guard's verdict of one row on one corpus: its held-out pseudo-queries' reading, or ``unverified`` where
    the run's training shaped that reading (:func:`hf_cocodr.recipe.guard.shaped_readings`: the guard rests nothing
    on it, and ``guard: on`` keeps the start). A row written before the guard knew this rule is re-read under it
    from its recorded settings (marked ``*``; its reading is unchanged, in the Rows table)."""
    from types import SimpleNamespace

    from hf_cocodr.recipe.guard import shaped_readings

    g = r.get("guard") or {}
    reading = g.get("corpora", {}).get(corpus, {}).get("pseudo_queries")
    if not reading:
        return "–"
    if "decided_on" in g:
        return "unverified" if "pseudo_queries" in (g.get("not_decided") or {}) else reading["verdict"]
    settings = r.get("distill")
    if settings is None:
        return reading["verdict"]
    shaped = shaped_readings(SimpleNamespace(**settings), list((r.get("queries") or {}).values()))
    return "unverified*" if "pseudo_queries" in shaped else reading["verdict"]


def guard_reading(rows: list[dict], corpus: str) -> str:
    """The guard's verdicts of an arm's rows on one corpus (:func:`guard_verdict`), seed by seed."""
    return ", ".join(guard_verdict(r, corpus) for r in rows)


CORPUS_OF = {"SciFact dev": "scifact", "NFCorpus dev": "nfcorpus"}


def agreement_lines(rows: dict) -> list[str]:
    """The guard against the labels, arm by arm and corpus by corpus: where the labels' mean gain over the seeds is
    beyond its spread (better or worse), does each seed's guard reading of that corpus (its held-out pseudo-queries)
    say the same: not worse where the labels read better, worse where they read worse?"""
    out = [
        "The guard against the labels (where the labels see a difference beyond the spread; the guard's verdict on the "
        "corpus, seed by seed: agrees when it keeps the adapted model (not `worse`, not `unverified`) for a model the "
        "labels read better, and keeps the start (`worse` or `unverified`) for one they read worse; `*`: a row written "
        "before the guard's current rule, re-read under it from its recorded settings):",
        "",
        "| arm | corpus | labels: mean gain ± half-range (seeds) | labels say | guard per seed | agrees |",
        "|---|---|---|---|---|---|",
    ]
    agree = total = 0
    for arm, by_seed in rows.items():
        done = [r for _, r in sorted(by_seed.items()) if "metrics" in r]
        if len(done) < 2:
            continue
        for _, label in EVALS:
            mean, half, says = label_reading(done, label)
            verdicts = [guard_verdict(r, CORPUS_OF[label]) for r in done]
            if says in ("better", "worse"):
                ok = [(v.rstrip("*") in ("worse", "unverified")) == (says == "worse") for v in verdicts if v != "–"]
                agree, total = agree + sum(ok), total + len(ok)
                agrees = f"{sum(ok)} of {len(ok)}"
            else:
                agrees = "(no difference: not counted)"
            out.append(
                f"| {arm} | {label} | {mean:+.4f} ± {half:.4f} ({len(done)}) | {says} | {', '.join(verdicts)} | {agrees} |"
            )
    out += ["", f"Agreement where the labels see a difference: {agree} of {total} seed readings."]
    return out


def summarize(rows: dict) -> dict:
    out = {}
    for arm, by_seed in rows.items():
        s, done = arm_gains(by_seed)
        steps = [sum(r["steps_trained"].values()) for r in done]
        if steps:
            s["steps"] = round(statistics.mean(steps), 1)
        secs = [r["command_seconds"] for r in done]
        if secs:
            s["command_seconds"] = round(statistics.mean(secs), 1)
        out[arm] = s
    return out


def write_report(ns, rows: dict) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    summary = summarize(rows)
    any_row = next((r for rs in rows.values() for r in rs.values() if "metrics" in r), None)
    start_from = "a cache shared by the rows (a fixed-steps screen)" if ns.shared_cache else "a cold cache"
    lines = [f"# {ns.title}: {ns.budget_minutes:g} minutes on one core, from {start_from}", ""]
    findings = Path(ns.findings)
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    cpu = f"{any_row['cpu']} ({'native bf16' if any_row['native_bf16'] else 'no native bf16'})" if any_row else "?"
    lines += [
        f"all-MiniLM-L6-v2, `--max-minutes {ns.budget_minutes:g}`, one core of a {cpu} (`taskset -c {ns.core}`, "
        "`OMP_NUM_THREADS=1`), "
        + (
            "one `HF_COCODR_CACHE` shared by the rows (the teacher's indexes built by the first row, so every row "
            "trains the steps the cap on passes fixes) and a fresh output folder per row"
            if ns.shared_cache
            else "a fresh `HF_COCODR_CACHE` and output folder per row"
        )
        + ", `--guard record`. Target "
        "corpora SciFact + NFCorpus, source SQuAD; no query of the user's except in the `queries` row; nDCG@10 on "
        "the dev splits (SciFact's odd-id half of the train claims, NFCorpus dev) at 256 tokens, by the recipe's "
        "own evaluation. Gain = adapted − start; mean ± half-range over seeds. The guard's verdicts are per seed, "
        "from the held-out pseudo-queries of each corpus; the labels' verdict is the mean gain beyond its spread.",
        "",
    ]
    if any_row:
        start = any_row["metrics"]
        lines += [start_line(start), ""]
    lines += [
        "| arm | seeds (finished) | SciFact dense Δ | NFCorpus dense Δ | SciFact hybrid Δ | NFCorpus hybrid Δ | steps "
        "| command min | labels SciFact / NFCorpus | guard SciFact | guard NFCorpus | what |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    cell = gain_cell
    for arm, s in summary.items():
        done = [r for r in rows[arm].values() if "metrics" in r]
        labels = " / ".join(label_reading(done, label)[2] for _, label in EVALS) if done else ""
        lines.append(
            f"| {arm} | {','.join(map(str, s['seeds']))} ({s['finished']}) | {cell(s, 'SciFact dev gain ndcg@10')} | "
            f"{cell(s, 'NFCorpus dev gain ndcg@10')} | {cell(s, 'SciFact dev gain hybrid_ndcg@10')} | "
            f"{cell(s, 'NFCorpus dev gain hybrid_ndcg@10')} | {s.get('steps', '')} | "
            f"{s['command_seconds'] / 60:.1f} | {labels} | {guard_reading(done, 'scifact')} | "
            f"{guard_reading(done, 'nfcorpus')} | {ARMS[arm][1] if arm in ARMS else ''} |"
            if "command_seconds" in s
            else f"| {arm} | {','.join(map(str, s['seeds']))} (0) | | | | | | | | | | refused or failed |"
        )
    lines += [
        "",
        "Rows:",
        "",
        "| arm | seed | SciFact dense | NFCorpus dense | SciFact hybrid | NFCorpus hybrid | steps | guard (pseudo-queries:"
        " Δ ± SE, verdict) | queries trained | load before / during / after | command s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in rows.items():
        for seed, r in sorted(by_seed.items()):
            load_txt = load_text(r)
            if "metrics" not in r:
                why = r.get("refused_or_failed", "")
                lines.append(
                    f"| {arm} | {seed} | failed: {why[-300:]} | | | | | | | {load_txt} | {r['command_seconds']} |"
                )
                continue
            m = r["metrics"]
            sci, nf = m["SciFact dev"], m["NFCorpus dev"]
            guard = r.get("guard") or {}
            g = "; ".join(
                f"{c}: {v['pseudo_queries']['difference']:+.4f} ± {v['pseudo_queries']['se']}, "
                f"{v['pseudo_queries']['verdict']}"
                for c, v in (guard.get("corpora") or {}).items()
                if "pseudo_queries" in v
            )
            trained = ", ".join(
                f"{c}: {q.get('train_pseudo_queries', 0)} pseudo + {q.get('train_queries', 0)} real"
                for c, q in (r.get("queries") or {}).items()
            )
            lines.append(
                f"| {arm} | {seed} | {sci['ndcg@10']:.4f} ({sci['ndcg@10'] - sci['start_ndcg@10']:+.4f}) | "
                f"{nf['ndcg@10']:.4f} ({nf['ndcg@10'] - nf['start_ndcg@10']:+.4f}) | "
                f"{sci['hybrid_ndcg@10']:.4f} ({sci['hybrid_ndcg@10'] - sci['start_hybrid_ndcg@10']:+.4f}) | "
                f"{nf['hybrid_ndcg@10']:.4f} ({nf['hybrid_ndcg@10'] - nf['start_hybrid_ndcg@10']:+.4f}) | "
                f"{r['steps_trained']} | {g} | {trained} | {load_txt} | {r['command_seconds']} |"
            )
    lines += ["", *agreement_lines(rows)]
    lines += [
        "",
        f"Command: `python scripts/studies/corpus_only.py --arms {','.join(rows)} --seeds 42,43,44 --core 1` (each "
        "row's exact command is in the JSON); the data split is `prepare_data` of `scripts/studies/distill_study.py`.",
    ]
    atomic_write_text(Path(f"{ns.report}.md"), "\n".join(lines) + "\n")
    atomic_write_json(
        Path(f"{ns.report}.json"),
        {
            "budget_minutes": ns.budget_minutes,
            "core": ns.core,
            "summary": summary,
            "runs": {a: {str(k): v for k, v in r.items()} for a, r in rows.items()},
        },
    )


def study_rows(ns) -> dict:
    """The cached rows; a row written before rows kept their distillation settings reads them from its run's
    ``recipe.json`` (where the run folder is still there)."""
    rows = cached_rows(ns)
    base = Path(ns.work) / f"budget{ns.budget_minutes:g}"
    for arm, by_seed in rows.items():
        for seed, r in by_seed.items():
            rec = base / arm / f"seed{seed}" / "run" / "recipe.json"
            if "metrics" in r and "distill" not in r and rec.is_file():
                r["distill"] = distill_settings(json.loads(rec.read_text()))
    return rows


def main() -> int:
    ns = parse()
    data, model = study_inputs(ns)
    for arm in ns.arms.split(","):
        if arm not in ARMS:
            raise SystemExit(f"unknown arm {arm!r}: {', '.join(ARMS)}")
    if not ns.report_only:
        for seed in [int(s) for s in ns.seeds.split(",")]:
            for arm in ns.arms.split(","):
                t0 = time.time()
                row = run_row(arm, seed, ns, data, model)
                print(f"{arm} seed {seed}: rc {row['returncode']}, {(time.time() - t0) / 60:.1f} min", flush=True)
                write_report(ns, study_rows(ns))
    write_report(ns, study_rows(ns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
