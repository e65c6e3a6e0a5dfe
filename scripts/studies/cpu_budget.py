"""The CPU-budget study (issue 39): the 15-minute recipe with unlabelled target queries, on one core, from a cold
start, as a new user runs it: full-model distillation against query-side distillation.

Each row is one ``hf-cocodr recipe`` command, timed from its start, in a subprocess pinned to one core
(``taskset -c CORE``, ``OMP_NUM_THREADS=1``) with a fresh, empty ``HF_COCODR_CACHE`` and a fresh output folder:
all-MiniLM-L6-v2, target corpora SciFact and NFCorpus, source SQuAD, ``--max-minutes 15``, the target queries of
the distillation study (SciFact: the even-id half of the ``train`` claims; NFCorpus: ``train`` less the 4 queries
whose text is a ``dev`` query), less any query whose text is also a dev query's (:func:`distinct_pools`; the
recipe refuses to train on a query it evaluates), and its dev splits (SciFact: the odd-id half; NFCorpus: ``dev``), made by
``distill_study.prepare_data``. The recipe's own evaluation gives each row: the adapted dense model, its hybrid
with BM25 and the starting model's, at the model's own 256 tokens.

Arms: ``full`` (today's default: the whole model, candidates encoded in every step) and ``query``
(``--distill-side query``: the query side alone against the starting model's frozen vectors; an asymmetric model);
``query-kK`` (K = 8, 16, 32, 64) is the query side with the teacher's top K as each query's candidates (8 is the
default: ``query-k8`` is ``query`` run by the code of the other ``-kK`` rows, their paired baseline).
An arm named ``ARM-warm`` is the same command as a repeated run makes it: its cache starts as a copy of one
built beforehand (the starting model's encodings of both corpora and the teacher's indexes, :func:`warm_cache`), so
it compares what the steps buy once the corpora are encoded. ``ARM@STEPS`` trains that many steps without a budget
(teacher cached): what a budget buys on an idle core, computed from step times measured elsewhere, trained on a
loaded machine where a budget would buy fewer. A refused run is a row too (its refusal message). The machine is shared: each row records the load average before,
during (sampled every 30 s) and after its command. Rows are cached under ``--work`` (a row whose command did not
finish is run again from a cold start); the report is rewritten after every row.

    python scripts/studies/cpu_budget.py --arms full,query --seeds 42
    python scripts/studies/cpu_budget.py --arms query-warm,full-warm --seeds 42,43,44
    python scripts/studies/cpu_budget.py --arms query@240 --seeds 42,43,44   # fixed steps, teacher cached
    python scripts/studies/cpu_budget.py --arms query-k32@500 --seeds 42,43,44
    python scripts/studies/cpu_budget.py --report-only

The arms that pass a retired option (``--distill-corpus-weight``, ``--distill-swa``) need hf_cocodr at commit
123371a9ca5c017ea45ef09586cd2a3075201c7f, the last where their code lived; today's recipe refuses them by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
ARMS = {
    "full": (
        [],
        "today's default: the whole model distilled, its 8 candidates encoded (forward and backward) per query",
    ),
    "query": (  # (3 passes, the cap these rows were measured at; 5 became the default after them)
        ["--distill-side", "query", "--distill-max-passes", "3"],
        "query side only, against the starting model's frozen document vectors (asymmetric Router model)",
    ),
}
ARMS.update(  # the candidates' count on the query side, where frozen vectors make candidates nearly free
    {
        f"query-k{k}": (
            ["--distill-side", "query", "--distill-k", str(k), "--distill-max-passes", "3"],
            f"query side only, the teacher's top {k} as each query's candidates (the default: 8)",
        )
        for k in (8, 16, 32, 64)
    }
)
ARMS["query-p5"] = (  # issue 49: the student under-fits its own queries (distill_ceiling_fit.md); more passes
    ["--distill-side", "query", "--distill-max-passes", "5"],
    "query side only, at most 5 passes over the target queries (the default since issue 49; 3 before)",
)
ARMS["query-p5-corpus"] = (  # issue 49: the student's top 10 drifts from its teacher's; the KL over the whole corpus
    ["--distill-side", "query", "--distill-max-passes", "5", "--distill-corpus-weight", "1"],
    "the `query-p5` row with the whole-corpus term at weight 1 (the listwise KL over the whole corpus)",
)
ARMS["query-p5-swa"] = (  # issue 49: the soup of the seeds' students lifted SciFact (distill_wise.md); within one run
    ["--distill-side", "query", "--distill-max-passes", "5", "--distill-swa", "0.5"],
    "the `query-p5` row with its weights averaged over the last half of the steps (SWA)",
)
EVALS = [("scifact", "SciFact dev"), ("nfcorpus", "NFCorpus dev")]
BATCH = 16  # the distillation's queries a step (DISTILL_BATCH_SIZE)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="full,query")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--budget-minutes", type=float, default=15.0)
    ap.add_argument("--core", default="0", help="the core the commands are pinned to (taskset -c)")
    ap.add_argument("--work", default="outputs/cpu_budget")
    ap.add_argument(
        "--report", default=None, help="report path without suffix (default: reports/studies/cpu_budget[_Nmin])"
    )
    ap.add_argument("--findings", default="reports/studies/cpu_budget_findings.md")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument(
        "--teacher-mass",
        action="store_true",
        help="only measure how the teacher's softmax spreads over its top 64 (the warm cache's teacher; JSON beside the report)",
    )
    ns = ap.parse_args()
    if ns.report is None:  # one report per budget: the 15-minute one keeps its name
        ns.report = "reports/studies/cpu_budget" + ("" if ns.budget_minutes == 15 else f"_{ns.budget_minutes:g}min")
    return ns


def parse_arm(arm: str) -> tuple[str, int | None, bool]:
    """``BASE[@STEPS][-warm]`` → (base arm, fixed steps or None, warm cache)."""
    warm = arm.endswith(WARM)
    name = arm.removesuffix(WARM)
    base, _, steps = name.partition("@")
    if base not in ARMS:
        raise SystemExit(f"unknown arm {arm!r}: {', '.join(ARMS)}, optionally @STEPS and/or -warm")
    return base, int(steps) if steps else None, warm or bool(steps)


def command(arm: str, seed: int, ns, data: Path, model: str, out: Path) -> list[str]:
    base, steps, _ = parse_arm(arm)
    budget = ["--max-minutes", f"{ns.budget_minutes:g}"] if steps is None else ["--distill-steps", str(steps)]
    cmd = [
        "taskset", "-c", ns.core, sys.executable, "-m", "hf_cocodr", "recipe",
        "--model", model, "--target-corpus", str(data / "scifact"), "--target-corpus", str(data / "nfcorpus"),
        "--source-data", str(data / "squad-v1.1"), "--output_dir", str(out),
        *budget, "--seed", str(seed),
        "--eval", f"{data / 'scifact'}:dev", "--eval", f"{data / 'nfcorpus'}:dev",
        "--target-queries", f"{data / 'scifact'}:{POOL}", "--target-queries", f"{data / 'nfcorpus'}:{POOL}",
    ]  # fmt: skip
    return cmd + ARMS[base][0]


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every`` seconds while a command runs."""

    def __init__(self, every: float = 30.0):
        super().__init__(daemon=True)
        self.every, self.samples, self.stop = every, [], threading.Event()

    def run(self):
        while not self.stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])


WARM = "-warm"  # an arm run with the starting model's encodings and the teacher's indexes already cached


def warm_cache(ns, data: Path, model: str) -> Path:
    """The cache a repeated run starts with: the starting model's encodings of both corpora and the teacher's indexes
    (built once, on every core; ``build.json`` records the seconds). Each warm row gets a fresh copy."""
    path = Path(ns.work) / "warm_cache"
    record = path / "build.json"
    if record.is_file():
        return path
    os.environ["HF_COCODR_CACHE"] = str(path)
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.retrieval.teacher import teacher_rankings
    from hf_cocodr.rundir.run_record import fingerprint

    seconds = {}
    session = EncodingSession(cache=True)
    for name, _ in EVALS:
        t0 = time.time()
        teacher_rankings(model, fingerprint(model), str(data / name), [], 2, session=session)
        seconds[name] = round(time.time() - t0, 1)
    record.write_text(json.dumps({"seconds": seconds, "encodings": session.record}, indent=2) + "\n")
    return path


def pinned_run(folder: Path, cmd: list[str], cache: Path) -> dict:
    """Run one row's command (pinned by its ``taskset``, one thread, ``cache`` as ``HF_COCODR_CACHE``), its output in
    ``folder/log.txt``; the command, its return code and seconds, the load average around it, and the log's last lines
    where it did not finish."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_COCODR_CACHE": str(cache),
        "PYTHONPATH": str(ROOT),
    }
    sampler = LoadSampler()
    load_before = os.getloadavg()[0]
    t0 = time.time()
    sampler.start()
    with open(folder / "log.txt", "w") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.time() - t0
    sampler.stop.set()
    row = {
        "command": " ".join(cmd),
        "returncode": rc,
        "command_seconds": round(wall, 1),
        "load": {
            "before": round(load_before, 2),
            "during_mean": round(statistics.mean(sampler.samples), 2) if sampler.samples else None,
            "during_max": round(max(sampler.samples), 2) if sampler.samples else None,
            "after": round(os.getloadavg()[0], 2),
        },
    }
    if rc != 0:
        tail = (folder / "log.txt").read_text().strip().splitlines()[-3:]
        row["refused_or_failed"] = " ".join(tail)[-1500:]
    return row


def row_folder(ns, arm: str, seed: int) -> tuple[Path, dict | None]:
    """The folder of one row (``WORK/budget<minutes>/<arm>/seed<seed>``) and its finished row, if it has one; else
    the folder emptied and made again for a cold start (no output folder, an empty cache: the study wrote it all)."""
    folder = Path(ns.work) / f"budget{ns.budget_minutes:g}" / arm / f"seed{seed}"
    row_file = folder / "row.json"
    if row_file.is_file():
        return folder, json.loads(row_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder, None


def run_row(arm: str, seed: int, ns, data: Path, model: str) -> dict:
    folder, done = row_folder(ns, arm, seed)
    if done is not None:
        return done
    # absolute: the command runs in the repository root (pinned_run), which need not be where the study was started
    out, cache = (folder / "run").absolute(), (folder / "cache").absolute()
    if parse_arm(arm)[2]:  # a repeated run's cache (and every fixed-steps row's): a copy of the warm one
        shutil.copytree(warm_cache(ns, data, model), cache)
    cmd = command(arm, seed, ns, data, model, out)
    row = {"arm": arm, "seed": seed, **pinned_run(folder, cmd, cache)}
    if row["returncode"] == 0:
        row.update(read_run(out, data))
    (folder / "row.json").write_text(json.dumps(row, indent=2) + "\n")
    return row


def read_run(out: Path, data: Path) -> dict:
    """What a finished run recorded: the metrics of the adapted and starting model (dense and hybrid), the steps,
    passes, the plan's fixed costs and share for optimizer steps, the corpus encodings and the seconds."""
    ev = json.loads((out / "eval.json").read_text())
    rec = json.loads((out / "recipe.json").read_text())
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else rec["plan"]
    marker = json.loads((out / "distill" / "hf_cocodr_stage.json").read_text())
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
    steps = int(rec["steps_trained"].get("distill", 0))
    encodings = rec.get("corpus_encodings", [])
    return {
        "metrics": metrics,
        "steps": steps,
        "planned_steps": plan.get("distill_steps"),
        "rows": marker.get("rows"),
        "passes": round(steps * BATCH / max(1, marker.get("rows") or 1), 2),
        "stopped_by_deadline": rec.get("stopped_by_deadline", {}),
        "capped_at_passes": rec.get("capped_at_passes", {}),
        "planned_optimizer_share": plan.get("planned_optimizer_share"),
        "fixed_seconds": plan.get("fixed_seconds"),
        "fixed_costs": plan.get("fixed_costs"),
        "throughput": plan.get("throughput"),
        "stage_seconds": rec.get("stage_seconds"),
        "train_seconds": rec.get("train_seconds"),
        "wall_seconds": rec.get("wall_seconds"),
        "corpus_encodings": encodings,
        "encoded": sum(1 for e in encodings if e["source"] == "encoded"),
        "encoding_seconds": round(sum(e["seconds"] for e in encodings if e["source"] == "encoded"), 1),
    }


def arm_gains(by_seed: dict) -> tuple[dict, list[dict]]:
    """An arm's seeds (finished and not) and the gain of each dev split's dense and hybrid nDCG@10 over the start
    (mean, half-range and values over the finished seeds); and the finished rows."""
    done = [r for r in by_seed.values() if "metrics" in r]
    s = {"seeds": sorted(by_seed), "finished": len(done), "refused": len(by_seed) - len(done)}
    for _, label in EVALS:
        for key in ("ndcg@10", "hybrid_ndcg@10"):
            vals = [r["metrics"][label][key] - r["metrics"][label][f"start_{key}"] for r in done]
            if vals:
                s[f"{label} gain {key}"] = {
                    "mean": round(statistics.mean(vals), 4),
                    "half_range": round((max(vals) - min(vals)) / 2, 4),
                    "values": [round(v, 4) for v in vals],
                }
    return s, done


def summarize(rows: dict) -> dict:
    out = {}
    for arm, by_seed in rows.items():
        s, done = arm_gains(by_seed)
        for key in ("steps", "passes", "planned_optimizer_share", "fixed_seconds", "command_seconds"):
            vals = [r[key] for r in done if r.get(key) is not None]
            if vals:
                s[key] = round(statistics.mean(vals), 3)
        out[arm] = s
    return out


def minutes(summary: dict) -> str:
    return f"{summary['command_seconds'] / 60:.1f}" if "command_seconds" in summary else ""


def why(row: dict) -> str:
    """The refusal or error of a row that did not finish, from its message on."""
    text = row.get("refused_or_failed", "")
    return text[text.find("error:") :] if "error:" in text else text[-400:]


def describe(arm: str) -> str:
    base, steps, warm = parse_arm(arm)
    what = ARMS[base][1]
    if steps is not None:
        return f"{what}; {steps} steps fixed (no budget), teacher cached"
    return what + ("; a repeated run: the start's encodings and teacher indexes cached" if warm else "")


def start_line(start: dict) -> str:
    """The start's dense, hybrid and BM25 nDCG@10 on each dev split, in one line."""
    return "Start: " + "; ".join(
        f"{label} dense {m['start_ndcg@10']:.4f}, hybrid {m['start_hybrid_ndcg@10']:.4f}, BM25 {m['bm25_ndcg@10']:.4f}"
        for label, m in start.items()
    )


def gain_cell(summary: dict, key: str) -> str:
    """A gain's mean ± half-range over the seeds, or nothing."""
    m = summary.get(key)
    return f"{m['mean']:+.4f} ± {m['half_range']:.4f}" if m else ""


def load_text(row: dict) -> str:
    """The load average before / during (max) / after a row's command."""
    load = row.get("load")
    if not load:  # a row written afterwards from its run's own files (no readings)
        return "n/a"
    return f"{load['before']} / {load['during_mean']} (max {load['during_max']}) / {load['after']}"


def write_report(ns, rows: dict) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    summary = summarize(rows)
    start = next((r["metrics"] for rs in rows.values() for r in rs.values() if "metrics" in r), None)
    lines = [
        f"# A CPU budget that buys learning: the {ns.budget_minutes:g}-minute recipe on one core, from a cold start",
        "",
    ]
    findings = Path(ns.findings)
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        f"all-MiniLM-L6-v2, `--max-minutes {ns.budget_minutes:g}`, one core (`taskset -c {ns.core}`, "
        "`OMP_NUM_THREADS=1`), a fresh `HF_COCODR_CACHE` and output folder per row, timed from the command's start. "
        "Target corpora SciFact + NFCorpus, source SQuAD; target queries SciFact's even-id half of the train claims "
        "+ NFCorpus train; nDCG@10 on the dev splits (SciFact's odd-id half, NFCorpus dev) at 256 tokens, by the "
        "recipe's own evaluation. Gain = adapted − start; mean ± half-range over seeds. **The machine is shared** "
        "(2 cores, other agents' work): each row records the load average around its command, and the plan is made "
        "on the step and encoding times measured under that load.",
        "",
    ]
    if start:
        lines += [start_line(start), ""]
    lines += [
        "| arm | seeds (finished) | SciFact dense Δ | NFCorpus dense Δ | SciFact hybrid Δ | NFCorpus hybrid Δ | steps "
        "| passes | planned share for steps | fixed s | command min | what |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    cell = gain_cell
    for arm, s in summary.items():
        lines.append(
            f"| {arm} | {','.join(map(str, s['seeds']))} ({s['finished']}) | {cell(s, 'SciFact dev gain ndcg@10')} | "
            f"{cell(s, 'NFCorpus dev gain ndcg@10')} | {cell(s, 'SciFact dev gain hybrid_ndcg@10')} | "
            f"{cell(s, 'NFCorpus dev gain hybrid_ndcg@10')} | {s.get('steps', '')} | {s.get('passes', '')} | "
            f"{s.get('planned_optimizer_share', '')} | {s.get('fixed_seconds', '')} | "
            f"{minutes(s)} | {describe(arm)} |"
        )
    lines += [
        "",
        "Rows:",
        "",
        "| arm | seed | SciFact dense | NFCorpus dense | SciFact hybrid | NFCorpus hybrid | steps (planned) | passes "
        "| fixed costs (s) | encodings | load before / during / after | command s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in rows.items():
        for seed, r in sorted(by_seed.items()):
            load_txt = load_text(r)
            if "metrics" not in r:
                lines.append(
                    f"| {arm} | {seed} | refused or failed: {why(r)} | | | | | | | | "
                    f"{load_txt} | {r['command_seconds']} |"
                )
                continue
            m = r["metrics"]
            sci, nf = m["SciFact dev"], m["NFCorpus dev"]
            costs = ", ".join(f"{k} {v:g}" for k, v in (r.get("fixed_costs") or {}).items())
            lines.append(
                f"| {arm} | {seed} | {sci['ndcg@10']:.4f} ({sci['ndcg@10'] - sci['start_ndcg@10']:+.4f}) | "
                f"{nf['ndcg@10']:.4f} ({nf['ndcg@10'] - nf['start_ndcg@10']:+.4f}) | "
                f"{sci['hybrid_ndcg@10']:.4f} ({sci['hybrid_ndcg@10'] - sci['start_hybrid_ndcg@10']:+.4f}) | "
                f"{nf['hybrid_ndcg@10']:.4f} ({nf['hybrid_ndcg@10'] - nf['start_hybrid_ndcg@10']:+.4f}) | "
                f"{r['steps']} ({r['planned_steps']}) | {r['passes']} | {costs} | {r['encoded']} encoded, "
                f"{r['encoding_seconds']} s | {load_txt} | {r['command_seconds']} |"
            )
    lines += [
        "",
        f"Command: `python scripts/studies/cpu_budget.py --arms {','.join(rows) or ns.arms} --seeds "
        f"{','.join(sorted({str(s) for rs in rows.values() for s in rs})) or ns.seeds} --budget-minutes "
        f"{ns.budget_minutes:g}"
        + ("" if ns.work == "outputs/cpu_budget" else f" --work {ns.work}")
        + (
            ""
            if ns.report
            == "reports/studies/cpu_budget" + ("" if ns.budget_minutes == 15 else f"_{ns.budget_minutes:g}min")
            else f" --report {ns.report}"
        )
        + "` (each row's exact command is in the JSON); the data split is `prepare_data` of "
        "`scripts/studies/distill_study.py`.",
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


POOL = "pool-distinct"  # the distillation study's pools less any query whose text is a dev query's


def distinct_pools(data: Path) -> None:
    """``qrels/pool-distinct.tsv`` of each corpus: the distillation study's pool less the queries whose text is also
    a dev query's (case, spacing and invisible characters ignored, as the recipe compares them: it refuses to train
    on a query it evaluates). Idempotent."""
    from hf_cocodr.data.target_queries import _norm

    for name, _ in EVALS:
        folder = data / name
        target = folder / "qrels" / f"{POOL}.tsv"
        if target.is_file():
            continue
        texts = query_texts(folder)
        dev = {_norm(texts[r.split("\t")[0]]) for r in qrels_rows(folder, "dev")}
        kept = [r for r in qrels_rows(folder, "pool") if _norm(texts[r.split("\t")[0]]) not in dev]
        write_qrels_rows(target, kept)


def qrels_rows(folder: Path, split: str) -> list[str]:
    """The data lines of a BEIR folder's ``qrels/SPLIT.tsv`` (its header left out)."""
    return [x for x in (folder / "qrels" / f"{split}.tsv").read_text().splitlines()[1:] if x.strip()]


def write_qrels_rows(path: Path, rows: list[str]) -> None:
    """``rows`` (data lines of a qrels file) written to ``path`` under the BEIR header."""
    path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{r}\n" for r in rows))


HALF = "pool-half"  # a half of the distinct pool, split by query text (issue 49's held-out half)


def half_pools(data: Path) -> None:
    """``qrels/pool-half.tsv`` of each corpus: the distinct pool's rows of about half its query texts, those whose
    normalised text's SHA-1 is even, so that no text is in both halves (NFCorpus repeats some texts under several
    ids). A student trained on it is read on the other half, queries it never saw from the same pool. Idempotent."""
    from hf_cocodr.data.target_queries import _norm

    for name, _ in EVALS:
        folder = data / name
        target = folder / "qrels" / f"{HALF}.tsv"
        if target.is_file():
            continue
        texts = query_texts(folder)
        write_qrels_rows(target, [r for r in qrels_rows(folder, POOL) if in_half(_norm(texts[r.split("\t")[0]]))])


def in_half(norm_text: str) -> bool:
    """Whether a (normalised) query text falls in :data:`HALF`."""
    return hashlib.sha1(norm_text.encode()).digest()[-1] % 2 == 0


def query_texts(folder: Path) -> dict[str, str]:
    """A BEIR folder's queries: id -> text."""
    return {rec["_id"]: rec["text"] for rec in map(json.loads, (folder / "queries.jsonl").read_text().splitlines())}


MASS_K = (1, 8, 16, 32)  # the teacher's mass reported in its top 1, 8, 16, 32 of 64


def teacher_mass(ns, data: Path, model: str, n_queries: int = 300, depth: int = 64) -> dict:
    """How the distillation's teacher spreads its softmax (temperature 1, as the stage's loss takes it) over its top
    ``depth`` candidates, for the first ``n_queries`` pool queries of each corpus: the mean mass of its top k for
    each k of :data:`MASS_K`. The teacher is the stage's (``teacher_fusion`` of the defaults) over the warm
    cache's indexes (read from a copy, so the cache is not touched)."""
    import tempfile

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.recipe.config import RecipeConfig
    from hf_cocodr.recipe.stages.distill import teacher_fusion
    from hf_cocodr.retrieval.teacher import teacher_rankings
    from hf_cocodr.rundir.run_record import fingerprint

    fusion = teacher_fusion(RecipeConfig(distill_teacher_weight=0.5))
    out: dict = {"depth": depth, "temperature": 1.0, "fusion": dataclasses.asdict(fusion), "corpora": {}}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(warm_cache(ns, data, model), tmp, dirs_exist_ok=True)
        os.environ["HF_COCODR_CACHE"] = tmp
        encoder = SentenceTransformer(model)
        for name, _ in EVALS:
            texts = query_texts(data / name)
            pool = [r.split("\t")[0] for r in (data / name / "qrels" / f"{POOL}.tsv").read_text().splitlines()[1:]]
            asked = [texts[q] for q in dict.fromkeys(pool)][:n_queries]
            _, scores, _, _, cached = teacher_rankings(
                encoder, fingerprint(model), str(data / name), asked, depth, fusion=fusion
            )
            s = np.asarray([row[:depth] for row in scores], np.float64)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out["corpora"][name] = {
                "queries": len(s),
                "teacher_cached": cached,
                **{f"mass_top{k}": round(float(p[:, :k].sum(axis=1).mean()), 4) for k in MASS_K},
            }
    return out


def cached_rows(ns) -> dict:
    rows: dict = {}
    base = Path(ns.work) / f"budget{ns.budget_minutes:g}"
    for f in sorted(base.glob("*/seed*/row.json")):
        rows.setdefault(f.parent.parent.name, {})[int(f.parent.name[4:])] = json.loads(f.read_text())
    return rows


def study_inputs(ns) -> tuple[Path, str]:
    """The study's data folder (made by ``distill_study.prepare_data`` under ``ns.work``, with the distinct pools) and
    the bundled all-MiniLM-L6-v2."""
    from distill_study import prepare_data

    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.utils import get_data_root

    data = prepare_data(Path(ns.work).absolute(), get_data_root())
    distinct_pools(data)
    half_pools(data)
    return data, bundled_model_path("all-MiniLM-L6-v2")


def main() -> int:
    ns = parse()
    data, model = study_inputs(ns)
    if ns.teacher_mass:
        mass = teacher_mass(ns, data, model)
        from hf_cocodr.utils import atomic_write_json

        atomic_write_json(Path(ns.report + "_teacher_mass.json"), mass)
        print(json.dumps(mass["corpora"], indent=2))
        return 0
    if not ns.report_only:
        for seed in [int(s) for s in ns.seeds.split(",")]:
            for arm in ns.arms.split(","):  # (in the order given)
                t0 = time.time()
                row = run_row(arm, seed, ns, data, model)
                print(f"{arm} seed {seed}: rc {row['returncode']}, {(time.time() - t0) / 60:.1f} min", flush=True)
                write_report(ns, cached_rows(ns))
    write_report(ns, cached_rows(ns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
