"""The distillation study: does distilling the hybrid teacher (the starting model + the corpus's BM25) into
all-MiniLM-L6-v2 on unlabelled target queries make the dense model better on SciFact and NFCorpus?

Dev splits only, no test set is read:

- **NFCorpus**: the unlabelled pool is the ``train`` split's queries (4 whose text is also a ``dev`` query are left
  out of the pool), evaluated on ``dev``.
- **SciFact**: its ``train`` claims are split into two fixed halves by a documented rule: a claim whose id is an even
  number is in the pool, an odd one in the dev half (415 pool / 394 dev claims). The start is measured on the same
  dev half.

The split is written as two BEIR folders under ``--work``/``data`` (links to the shared ``corpus.jsonl`` and
``queries.jsonl``, plus ``qrels/pool.tsv`` and ``qrels/dev.tsv``), so the recipe reads the pool as
``--target-queries DIR:pool`` (query ids only, as for any user) and refuses any overlap with the dev split itself.
The target corpora are the same two folders; the source task is SQuAD, as in the adaptation study.

Every arm is :func:`hf_cocodr.run_recipe` at the same wall-clock budget, evaluated at the model's own 256 tokens;
seeds after the first train the steps the first seed's plan bought. Each arm is cached and resumable under
``--work`` (default ``outputs/distill_study``); ``reports/studies/distill_study.md`` / ``.json`` are rewritten after every
row.

    python scripts/studies/distill_study.py --arms start,default,distill --budget-minutes 15
    python scripts/studies/distill_study.py --arms distill --seeds 43,44 --budget-minutes 15
    python scripts/studies/distill_study.py --report-only --budget-minutes 15
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import adaptation_study as A  # noqa: E402  (the adaptation study's runner, cache and evaluation)

EVALS = [("scifact", "dev", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]
POOL = ["scifact:pool", "nfcorpus:pool"]  # relative to the study's data folder
BASE = {"max_queries": 1000, "corpus_pool": 2, "save_hybrid": False}
# the recipe's schedule for a head-less model before distillation existed (the COCO soup), spelled out
SOUP = dict(A.SOUP)
NO_DISTILL = {"skip_distill": True}
DISTILL_ONLY = {"skip_coco": True, "skip_finetune": True, **A.NO_EXTRAS}
ARMS: dict[str, tuple[dict, str]] = {
    "soup": ({**SOUP, **NO_DISTILL}, "the COCO soup alone, no target queries read (the default before this study)"),
    "default": (
        {},
        "the recipe's automatic schedule with the target queries given (since this study: the distillation alone; "
        "seed 42 ran before its bf16 default, in fp32, as distill-lr5e-5)",
    ),
    "distill": (
        {**DISTILL_ONLY, "distill": {"learning_rate": 2e-5}},
        "hybrid-teacher distillation alone (k 8, teacher T 1, lr 2e-5, in-batch 1)",
    ),
    "distill-v0": (
        {**DISTILL_ONLY},
        "as distill, run at commit 8079eaa, whose loss multiplied the KL term by T_s² = 0.0025 (in effect the in-batch "
        "contrast on the teacher's first candidate alone)",
    ),
    "distill-k4": ({**DISTILL_ONLY, "distill_k": 4}, "distillation, 4 candidates per query (about twice the steps)"),
    "distill-k16": ({**DISTILL_ONLY, "distill_k": 16}, "distillation, 16 candidates per query"),
    "distill-T0.5": ({**DISTILL_ONLY, "distill_teacher_temperature": 0.5}, "distillation, teacher temperature 0.5"),
    "distill-T2": ({**DISTILL_ONLY, "distill_teacher_temperature": 2.0}, "distillation, teacher temperature 2"),
    "distill-lr5e-5": (
        {**DISTILL_ONLY, "distill": {"learning_rate": 5e-5}},
        "distillation, learning rate 5e-5 (the recipe's default since this study)",
    ),
    "distill-lr1e-5": ({**DISTILL_ONLY, "distill": {"learning_rate": 1e-5}}, "distillation, learning rate 1e-5"),
    "distill-kl-only": ({**DISTILL_ONLY, "distill_in_batch_weight": 0.0}, "distillation, no in-batch term"),
    "distill-ib3": (
        {**DISTILL_ONLY, "distill_in_batch_weight": 3.0},
        "distillation, in-batch term weighted 3 (between distill-v0, in effect the in-batch term alone, and distill)",
    ),
    "distill-pseudo": (
        {**DISTILL_ONLY, "target_queries": ["@pseudo"]},
        "distillation on pseudo queries (each document's title or first sentence) instead of real ones",
    ),
    "distill-pseudo42": (
        {**DISTILL_ONLY, "target_queries": ["@pseudo"]},
        "distillation on pseudo queries (each document's title or first sentence) instead of real ones, the steps of "
        "distill-lr5e-5",
    ),
    "distill-T2-42": (
        {**DISTILL_ONLY, "distill_teacher_temperature": 2.0},
        "distillation, teacher temperature 2 (a flatter teacher), the steps of distill-lr5e-5",
    ),
    "distill-T0.5-42": (
        {**DISTILL_ONLY, "distill_teacher_temperature": 0.5},
        "distillation, teacher temperature 0.5 (a sharper teacher), the steps of distill-lr5e-5",
    ),
    "distill-tw0.3-42": (
        {**DISTILL_ONLY, "distill_teacher_weight": 0.3},
        "distillation, teacher fusion weight 0.3 (more BM25), the steps of distill-lr5e-5",
    ),
    "distill-tw0.7-42": (
        {**DISTILL_ONLY, "distill_teacher_weight": 0.7},
        "distillation, teacher fusion weight 0.7 (more of the starting model), the steps of distill-lr5e-5",
    ),
    "distill-lr1e-4-42": (
        {**DISTILL_ONLY, "distill": {"learning_rate": 1e-4}},
        "distillation, learning rate 1e-4, the steps of distill-lr5e-5",
    ),
    "distill-T0.25-42": (
        {**DISTILL_ONLY, "distill_teacher_temperature": 0.25},
        "distillation, teacher temperature 0.25 (sharper still), the steps of distill-lr5e-5",
    ),
    "distill-kl-only-42": (
        {**DISTILL_ONLY, "distill_in_batch_weight": 0.0},
        "distillation, the listwise KL alone (no in-batch term), the steps of distill-lr5e-5",
    ),
    "distill-bf16-42": (
        {**DISTILL_ONLY, "distill": {"bf16": True}},
        "distillation under bf16 autocast, the steps of distill-lr5e-5 (does bf16 itself cost quality?)",
    ),
    "distill-steps4x": (
        {**DISTILL_ONLY},
        "distillation, 168 steps (4 × distill-lr5e-5's 42: about an hour on one core; what more steps give)",
    ),
    # budgeted arms run on the AMD EPYC machine of this project that has native bf16 (avx512_bf16, no AMX): compared
    # with distill-epyc, the same settings as distill-lr5e-5 budgeted on that machine
    "distill-epyc": (
        {**DISTILL_ONLY},
        "as distill-lr5e-5, budgeted on an AMD EPYC with avx512_bf16 (the reference of the budgeted arms below)",
    ),
    "distill-bf16": (
        {**DISTILL_ONLY, "distill": {"bf16": True}},
        "distillation under bf16 autocast, budgeted on the AMD EPYC (the steps bf16 buys)",
    ),
    "distill-nodocgrad": (
        {**DISTILL_ONLY, "distill_document_gradients": False},
        "distillation, the candidates encoded without back-propagation (forward only), budgeted on the AMD EPYC",
    ),
    "distill-bf16-nodocgrad": (
        {**DISTILL_ONLY, "distill_document_gradients": False, "distill": {"bf16": True}},
        "distillation under bf16, the candidates forward only, budgeted on the AMD EPYC",
    ),
    "distill-bf16-third": (
        {**DISTILL_ONLY, "distill": {"bf16": True}},
        "distillation under bf16, a third of distill-bf16's steps: its +soup row is a soup of three runs within one "
        "budget",
    ),
    "soup+distill": (
        {**SOUP, "skip_coco": False, "skip_distill": False, "coco_share": 1.0, "distill_share": 1.0},
        "the COCO soup, then distillation, half the budget each (its seed 42 was run as the default before the "
        "study set it)",
    ),
}


# Every arm but the default trains in the precision it names, fp32 unless it names bf16: the arms that ran before the
# distillation's bf16 default (on machines with native bf16) trained in fp32, and further seeds must too.
for _name, (_cfg, _what) in ARMS.items():
    if _name not in ("default", "soup"):
        _cfg["distill"] = {"bf16": False, **_cfg.get("distill", {})}

# arms that train the steps another arm's seed-42 plan bought (whatever this machine's speed): a lever that leaves
# the cost of a step as it is is compared at the same steps
# (and the number of times as many steps)
STEPS_FROM = {
    **{arm: ("distill-lr5e-5", 1) for arm in ARMS if arm.endswith("-42") or arm == "distill-pseudo42"},
    "distill-steps4x": ("distill-lr5e-5", 4),
    "distill-bf16-third": ("distill-bf16", 1 / 3),
}


def prepare_data(work: Path, root: Path) -> Path:
    """The study's data folder (see the module docstring); returns it. Idempotent."""
    from hf_cocodr.data.target_queries import _norm, judged_query_ids

    data = work / "data"
    for name in ("scifact", "nfcorpus"):
        (data / name / "qrels").mkdir(parents=True, exist_ok=True)
        for f in ("corpus.jsonl", "queries.jsonl"):
            link = data / name / f
            if not link.exists():
                link.symlink_to((root / name / f).resolve())
    if not (data / "squad-v1.1").is_symlink() and not (data / "squad-v1.1").exists():
        (data / "squad-v1.1").symlink_to((root / "squad-v1.1").resolve())

    def rows(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines()[1:] if line.strip()]

    def write(path: Path, lines: list[str]) -> None:
        if not path.is_file():
            path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{x}\n" for x in lines))

    sci = rows(root / "scifact" / "qrels" / "train.tsv")
    write(data / "scifact" / "qrels" / "pool.tsv", [r for r in sci if int(r.split("\t")[0]) % 2 == 0])
    write(data / "scifact" / "qrels" / "dev.tsv", [r for r in sci if int(r.split("\t")[0]) % 2 == 1])
    texts = {}
    for line in (root / "nfcorpus" / "queries.jsonl").read_text().splitlines():
        rec = json.loads(line)
        texts[rec["_id"]] = rec["text"]
    dev_texts = {_norm(texts[q]) for q in judged_query_ids(root / "nfcorpus", "dev")}
    nf = rows(root / "nfcorpus" / "qrels" / "train.tsv")
    write(data / "nfcorpus" / "qrels" / "pool.tsv", [r for r in nf if _norm(texts[r.split("\t")[0]]) not in dev_texts])
    write(data / "nfcorpus" / "qrels" / "dev.tsv", rows(root / "nfcorpus" / "qrels" / "dev.tsv"))
    if not (data / "nfcorpus-pseudo" / "queries.jsonl").is_file():
        write_pseudo_queries(data)
    return data


def write_pseudo_queries(data: Path) -> None:
    """Pseudo queries for the ``@pseudo`` arm, one BEIR folder per corpus (``NAME-pseudo``: a link to the corpus and
    its own ``queries.jsonl``): each document's title, or its first sentence when it has none, for one in 4
    documents (as many queries as the real pools hold, within a factor of 2)."""
    for name in ("scifact", "nfcorpus"):
        folder = data / f"{name}-pseudo"
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "corpus.jsonl").exists():
            (folder / "corpus.jsonl").symlink_to((data / name / "corpus.jsonl").resolve())
        out = []
        for i, line in enumerate((data / name / "corpus.jsonl").read_text().splitlines()):
            rec = json.loads(line)
            text = (rec.get("title") or "").strip() or rec.get("text", "").split(". ")[0].strip()
            if i % 4 == 0 and text:
                out.append(json.dumps({"_id": f"pseudo-{rec['_id']}", "text": text}) + "\n")
        (folder / "queries.jsonl").write_text("".join(out))


def planned_steps(ns, base: str, seed: int) -> dict:
    """The steps seed ``--plan-from-seed`` of ``base`` trained (each stage), for a further seed; for an arm of
    :data:`STEPS_FROM`, the steps its reference arm's seed ``--plan-from-seed`` trained. From the cached run, or,
    where the cache is gone (a fresh checkout), from the report's record of it."""
    ref_arm, times = STEPS_FROM.get(base, (base, 1))
    ref = A.arm_dir(Path(ns.work), ns.budget_minutes, ref_arm, ns.plan_from_seed) / "run"
    kept = recorded_rows(ns).get(ref_arm, {}).get(ns.plan_from_seed, {})
    if (ref / "recipe.json").is_file():
        plan = json.loads((ref / "plan.json").read_text())
        trained = json.loads((ref / "recipe.json").read_text()).get("steps_trained", {})
    elif "plan" in kept:
        plan, trained = kept["plan"], kept.get("steps_trained") or {}
    else:
        sys.exit(f"{base} seed {seed}: run {ref_arm} seed {ns.plan_from_seed} first ({ref / 'recipe.json'} not found)")
    plan = {**plan, **{f"{stage}_steps": n for stage, n in trained.items()}}
    out = {"refreshes": plan["refreshes"]}
    if plan.get("coco_steps", 0) > 0:
        out["coco_runs"] = int(plan.get("coco_runs", 1))
    for key in ("coco_steps", "finetune_steps", "target_steps", "distill_steps"):
        if plan.get(key, 0) > 0:
            out[key] = max(1, round(plan[key] * times))
    return out


def warm_teacher(ns, data: Path, model: str) -> None:
    """Build the teacher's indexes of both corpora once, before any arm (``OUT/teacher.json`` records the seconds),
    so every arm starts with them cached: the arms then differ by what they train, not by which came first."""
    from hf_cocodr.retrieval.teacher import teacher_rankings
    from hf_cocodr.rundir.run_record import fingerprint
    from hf_cocodr.utils import atomic_write_json

    path = Path(ns.work) / "teacher.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    for name in ("scifact", "nfcorpus"):
        t0 = time.time()
        cached = teacher_rankings(model, fingerprint(model), str(data / name), [], 2)[-1]
        if not cached:
            record[name] = {"build_seconds": round(time.time() - t0, 1)}
            atomic_write_json(path, record)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="start,distill", help="comma-separated arm names: " + ", ".join(ARMS))
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--budget-minutes", type=float, default=15.0)
    ap.add_argument("--work", default="outputs/distill_study")
    ap.add_argument("--report", default="reports/studies/distill_study")
    ap.add_argument("--findings", default="reports/studies/distill_study_findings.md")
    ap.add_argument("--plan-from-seed", type=int, default=42)
    ap.add_argument("--report-only", action="store_true")
    ns = ap.parse_args()
    ns.start, ns.doc_max_length = "all-MiniLM-L6-v2", 256
    return ns


def recorded_rows(ns) -> dict:
    """``{arm: {seed: row}}`` of the committed report (``--report``.json) for this budget: they stand in for rows
    whose cache under ``--work`` is gone (``outputs/`` is not committed); the start's row is kept for every budget."""
    path = Path(f"{ns.report}.json")
    if not path.is_file():
        return {}
    report = json.loads(path.read_text())
    same = report.get("budget_minutes") == ns.budget_minutes and report.get("doc_max_length") == 256
    return {
        arm: {int(seed): row for seed, row in runs.items()}
        for arm, runs in report.get("runs", {}).items()
        if same or arm == "start"
    }


def cached(ns, arm: str, seed: int) -> bool:
    budget = 15 if arm == "start" else ns.budget_minutes
    return A.eval_file(A.arm_dir(Path(ns.work), budget, arm, seed), 256).is_file()


def run_arm(arm: str, seed: int, ns, data: Path, model: str) -> dict:
    """One row; the start is evaluated once for every budget (kept under ``budget15``). A row the report records
    whose cache is gone is taken from the report, not trained again."""
    kept = recorded_rows(ns).get(arm, {}).get(seed)
    if kept is not None and not cached(ns, arm, seed):
        return kept
    if arm == "start":
        ns = argparse.Namespace(**{**vars(ns), "budget_minutes": 15.0})
    if arm.endswith(SOUP_SUFFIX):
        return soup_row(arm, seed, ns, data, model)
    ns = argparse.Namespace(**{**vars(ns), "steps_from": STEPS_FROM})
    return A.run_arm(arm, seed, ns, data, model)


SOUP_SUFFIX = "+soup"


def soup_row(arm: str, seed: int, ns, data: Path, model: str) -> dict:
    """``ARM+soup``: the uniform weight average of the models of every trained seed of ``ARM`` (at least 2), as one
    row under the first seed's number: no training, one evaluation; it costs the seeds' budgets together."""
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.wise import soup

    base = arm.removesuffix(SOUP_SUFFIX)
    out = A.arm_dir(Path(ns.work), ns.budget_minutes, arm, seed)
    folder = Path(ns.work) / f"budget{ns.budget_minutes:g}" / base
    seeds = sorted(int(p.name[4:]) for p in folder.glob("seed*") if (p / "run" / "model" / "modules.json").is_file())
    if len(seeds) < 2 or seeds[0] != seed:
        sys.exit(f"{arm} seed {seed}: needs at least 2 trained seeds of {base} starting with {seed}, found {seeds}")
    rows = [
        A.run_arm(base, s, argparse.Namespace(**{**vars(ns), "steps_from": STEPS_FROM}), data, model) for s in seeds
    ]
    if A.eval_file(out, ns.doc_max_length).is_file():
        metrics = A.evaluate(None, out, data, ns.doc_max_length)
    else:
        metrics = A.evaluate(soup([load_encoder(r["model_dir"]) for r in rows]), out, data, ns.doc_max_length)
    return {**rows[0], "metrics": metrics, "soup_of_seeds": seeds}


def summary_rows(ns, data: Path, model: str) -> dict:
    """{arm: {seed: row}} of every finished row under ``--work`` for this budget, and the report's recorded rows whose
    cache is gone (a row computed here replaces the recorded one)."""
    rows, kept = {}, recorded_rows(ns)
    derived = sorted(  # WiSE-FT and soup rows of trained arms
        p.name
        for p in (Path(ns.work) / f"budget{ns.budget_minutes:g}").glob("*+*")
        if A.split_arm(p.name.removesuffix(SOUP_SUFFIX))[0] in ARMS
    )
    for arm in ["start", *ARMS, *derived, *(a for a in kept if "+" in a and a not in derived)]:
        budget = 15 if arm == "start" else ns.budget_minutes
        folder = Path(ns.work) / f"budget{budget:g}" / arm
        seeds = sorted(int(p.name[4:]) for p in folder.glob("seed*") if A.eval_file(p, 256).is_file())
        per_seed = dict(kept.get(arm, {}))
        per_seed.update({seed: run_arm(arm, seed, ns, data, model) for seed in seeds})
        if per_seed:
            rows[arm] = dict(sorted(per_seed.items()))
    return rows


def describe(arm: str) -> str:
    if arm.endswith(SOUP_SUFFIX):
        base = arm.removesuffix(SOUP_SUFFIX)
        return f"the uniform weight soup of {base}'s seeds (no training; the seeds' budgets together)"
    base, _, wise = A.split_arm(arm)
    if wise:
        return f"WiSE-FT of {base}: (1 − {wise}) × the start + {wise} × its model (one interpolation, no training)"
    return ARMS[base][1]


def write_report(ns, rows: dict) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    # (the adaptation study's summary knows the steps of its own stages only: the steps are written below)
    summary = A.summarize({a: {k: {**r, "steps_trained": None} for k, r in rs.items()} for a, rs in rows.items()})
    start = summary.get("start")
    lines = [
        "# Distillation from the hybrid teacher: all-MiniLM-L6-v2 on unlabelled target queries",
        "",
    ]
    findings = Path(ns.findings)
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        f"Budget {ns.budget_minutes:g} minutes of training per arm (one core, `taskset -c N`, `OMP_NUM_THREADS=1`); "
        "nDCG@10 on the dev splits at 256 tokens: SciFact's odd-id half of the `train` claims, NFCorpus `dev`. "
        "Mean ± half-range over seeds; Δ against the start.",
        "",
        "| arm | seeds | SciFact dev | Δ | NFCorpus dev | Δ | steps | train min | what |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        cells = []
        for label in ("SciFact dev", "NFCorpus dev"):
            m = s[f"{label} ndcg@10"]
            cells.append(f"{m['mean']:.4f} ± {m['half_range']:.4f}")
            cells.append(f"{m['mean'] - start[f'{label} ndcg@10']['mean']:+.4f}" if start and arm != "start" else "")
        steps_txt = ""
        first = next(iter(rows[arm].values()))
        if "plan" in first:  # the steps each stage trained (of the planned ones); a soup: runs x steps
            plan, trained = first["plan"], first.get("steps_trained") or {}
            parts = []
            for key, planned in plan.items():
                stage = key.removesuffix("_steps")
                if key.endswith("_steps") and planned:
                    done = trained.get(stage, planned)
                    runs = int(plan.get("coco_runs", 1)) if stage == "coco" else 1
                    txt = f"{done}" if done == planned else f"{done} of {planned}"
                    parts.append(f"{stage} {runs} × {txt}" if runs > 1 else f"{stage} {txt}")
            steps_txt = ", ".join(parts)
        what = "the starting model" if arm == "start" else describe(arm)
        lines.append(
            f"| {arm} | {','.join(map(str, s['seeds']))} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
            f"{steps_txt} | {A.train_min(s)} | {what} |"
        )
    lines += [
        "",
        f"Command: `taskset -c 0 python scripts/studies/distill_study.py --arms ARM --seeds SEEDS --budget-minutes "
        f"{ns.budget_minutes:g}`; the data split is made by `prepare_data` in the script.",
    ]
    atomic_write_text(Path(f"{ns.report}.md"), "\n".join(lines) + "\n")
    atomic_write_json(
        Path(f"{ns.report}.json"),
        {
            "budget_minutes": ns.budget_minutes,
            "doc_max_length": 256,
            "summary": summary,
            "runs": {a: {str(k): v for k, v in r.items()} for a, r in rows.items()},
        },
    )


def main() -> int:
    ns = parse()
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    data = prepare_data(Path(ns.work).absolute(), get_data_root())
    model = bundled_model_path(ns.start)
    # the adaptation study's runner with this study's splits, arms and queries
    A.EVALS[:] = EVALS
    pool = [str(data / p) for p in POOL]
    A.ARMS.clear()
    for name, (cfg, what) in ARMS.items():
        pseudo = [str(data / "scifact-pseudo"), str(data / "nfcorpus-pseudo")]
        queries = pseudo if cfg.get("target_queries") == ["@pseudo"] else pool
        if cfg.get("skip_distill") is True:  # an arm that reads no target queries is given none
            queries = []
        A.ARMS[name] = ({**cfg, "target_queries": queries}, what)
    A.STARTS[ns.start] = {**A.STARTS[ns.start], "base": BASE}
    A.planned_steps = planned_steps
    if ns.plan_from_seed is not None and ns.plan_from_seed < 0:
        ns.plan_from_seed = None
    if not ns.report_only:
        warm_teacher(ns, data, model)
        for arm in ns.arms.split(","):
            for seed in [0] if arm == "start" else [int(s) for s in ns.seeds.split(",")]:
                t0 = time.time()
                row = run_arm(arm, seed, ns, data, model)
                print(f"{arm} seed {seed}: {row['metrics']} ({(time.time() - t0) / 60:.1f} min)", flush=True)
                write_report(ns, summary_rows(ns, data, model))
    write_report(ns, summary_rows(ns, data, model))
    print(Path(f"{ns.report}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
