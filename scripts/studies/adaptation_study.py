"""The adaptation study: which recipe settings make all-MiniLM-L6-v2 better on SciFact and NFCorpus without labels?

Every arm is ``hf_cocodr.run_recipe`` with some settings changed, at the same training budget (``--budget-minutes``
of wall clock, planned by the recipe itself), evaluated on the development splits only (SciFact ``train`` claims,
NFCorpus ``dev``; documents cut to ``--doc-max-length`` tokens for every row alike). WiSE-FT arms (``name+wiseA``)
reuse the trained arm they extend and cost one weight interpolation and one evaluation; ``name@STAGE`` evaluates the
model that one stage of a trained arm left behind (``paper@coco``: the paper's COCO stage without its fine-tuning).
The starting model's row is measured in the same run with the same evaluation.

Everything is cached and resumable under ``--work`` (default ``outputs/adaptation_study``): a killed arm resumes
from its last complete checkpoint (the recipe's plan is kept in ``plan.json``), a finished arm is never re-run, and
``reports/studies/adaptation_study.md`` / ``.json`` are rewritten after every row, so the report can be committed as rows
arrive.

    python scripts/studies/adaptation_study.py --budget-minutes 8              # screen every arm, seed 42
    python scripts/studies/adaptation_study.py --arms start,default,source-only --seeds 42,43,44   # confirm with seeds
    python scripts/studies/adaptation_study.py --report-only                   # rewrite the report from the cache

The arms of the target pseudo pairs (``title-body*``, ``ict``, ``source+title-body``, ``joint``,
``contrast-pairs-split-target``, and those built on ``CONTRAST_PAIRS``) need hf_cocodr at commit
123371a9ca5c017ea45ef09586cd2a3075201c7f, the last where that stage lived (``target_pairs`` is retired); their rows
stay in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVALS = [("scifact", "train", "SciFact dev"), ("nfcorpus", "dev", "NFCorpus dev")]
# Source data as in the demo: 1,000 SQuAD questions, a mining pool of positives + BM25 top-2.
# (pseudo_queries 0: the arms of this study are COCO and fine-tuning arms; a head-less start would otherwise get the
# corpus-only distillation that issue 53 made its default, scripts/studies/corpus_only.py)
# (guard: record: an arm's model is what it trained, the guard's verdict recorded beside it; before the guard read
# held-out clozes it read nothing in these arms, which hold out no pseudo-query)
BASE = {"max_queries": 1000, "corpus_pool": 2, "save_hybrid": False, "pseudo_queries": 0, "guard": "record"}
NO_EXTRAS = {"wise_alpha": None}
# the COCO soup spelled out (the no_mlm_head schedule since session 6), so its rows keep their meaning
SOUP = {"skip_finetune": True, "coco_mlm_weight": 1.0, "coco_runs": "budget", "coco_run_steps": 76, **NO_EXTRAS}
# The recipe's automatic schedule for head-less models before session 4, spelled out so its rows keep their meaning.
CONTRAST_PAIRS = {
    "coco_mlm_weight": 0.0,
    "target_pairs": "title_body",
    "target_schedule": "sequential",
    "coco_share": 0.3,
    "finetune_share": 0.3,
    "target_share": 0.4,
    "skip_finetune": False,
    "coco_runs": 1,
}
# Arms that fine-tune on the source task pin it (the automatic schedule for head-less models no longer does since
# session 6), and arms run as "the default" of sessions 4-5 pin the paper's stages, so every row keeps its meaning.
SOURCE = {"skip_finetune": False}
# name -> (recipe settings on top of BASE, what it tests). "auto" settings follow the recipe's schedule rule.
ARMS: dict[str, tuple[dict, str]] = {
    "default": (
        {},
        "the recipe's automatic schedule for a model without MLM head (rows up to session 5: the paper's "
        "stages; since session 6: the COCO soup)",
    ),
    "paper": ({"schedule": "paper"}, "COCO with MLM (fresh head, warmed up) -> iDRO: COCO-DR's stages"),
    # the automatic schedule of sessions 2-3, pinned (its rows were run when it was the default)
    "contrast-pairs": (
        {**CONTRAST_PAIRS, "wise_alpha": None},
        "contrast-only COCO -> iDRO -> title -> body pairs (the earlier default without WiSE-FT)",
    ),
    "contrast-pairs-wise": (
        {**CONTRAST_PAIRS, "wise_alpha": 0.5},
        "contrast-only COCO -> iDRO -> title -> body pairs -> WiSE-FT 0.5 (the earlier default)",
    ),
    "source-only": ({"skip_coco": True, **SOURCE, **NO_EXTRAS}, "iDRO fine-tuning on SQuAD alone (no target data)"),
    "source-uniform": (
        {"skip_coco": True, **SOURCE, **NO_EXTRAS, "finetune": {"idro_preset": "uniform"}},
        "plain contrastive fine-tuning on SQuAD alone",
    ),
    "coco-mlm0": (
        {"skip_finetune": True, "coco_mlm_weight": 0.0, **NO_EXTRAS},
        "contrast-only COCO on the target corpora, nothing else",
    ),
    "coco-mlm0.1": ({"skip_finetune": True, "coco_mlm_weight": 0.1, **NO_EXTRAS}, "COCO, MLM weight 0.1"),
    "coco-mlm1": ({"skip_finetune": True, "coco_mlm_weight": 1.0, **NO_EXTRAS}, "COCO, MLM weight 1 (paper)"),
    # the budget spent on a larger contrastive batch instead of more steps (3x the documents, ~1/3 of the steps)
    "coco-mlm1-b96": (
        {"skip_finetune": True, "coco_mlm_weight": 1.0, "coco": {"per_device_train_batch_size": 96}, **NO_EXTRAS},
        "COCO, MLM weight 1, 96 documents per step (instead of 32)",
    ),
    # the whole budget on COCO with about the learning-rate mass (sum of the step sizes) of the 76 steps at 2e-5 that
    # helped: ~2e-5 * 76 / 2 against ~8e-6 * 214 / 2 (linear decay), so more documents seen for the same drift
    "coco-mlm1-lr8e-6": (
        {"skip_finetune": True, "coco_mlm_weight": 1.0, "coco_learning_rate": 8e-6, **NO_EXTRAS},
        "COCO alone for the whole budget, MLM weight 1, lr 8e-6 (instead of 2e-5)",
    ),
    # the default's COCO stage as it helped at 15 minutes (default@coco: 76 steps, then stopped), alone: what one run
    # of it gives, and the ingredients of the soup arms
    "coco76": (
        {"skip_finetune": True, "coco_mlm_weight": 1.0, "coco_steps": 76, **NO_EXTRAS},
        "COCO alone, MLM weight 1, 76 steps (the length of one run of the COCO soup)",
    ),
    # the whole budget on COCO as several runs of about 76 steps (the length of coco76), whose weights are averaged
    "coco-soup": (SOUP, "COCO soup: as many 76-step COCO runs (MLM weight 1) as the budget affords, weights averaged"),
    # the soup with COCO spans of up to 128 tokens instead of 64 (the 256-token evaluation gains less on NFCorpus)
    "coco-soup-span128": (
        {**SOUP, "coco": {"max_span_length": 128}},
        "COCO soup with spans of up to 128 tokens (instead of 64)",
    ),
    # the soup trained under bf16 autocast (a native-bf16 CPU times a step ~1.45x faster: more runs in the budget)
    "coco-soup-bf16": (
        {**SOUP, "coco": {"bf16": True}},
        "COCO soup trained in bf16 autocast (more runs for the same minutes)",
    ),
    "coco-mlm0-lr1e-5": (
        {"skip_finetune": True, "coco_mlm_weight": 0.0, "coco_learning_rate": 1e-5, **NO_EXTRAS},
        "contrast-only COCO, lr 1e-5",
    ),
    "coco-mlm0-lr5e-5": (
        {"skip_finetune": True, "coco_mlm_weight": 0.0, "coco_learning_rate": 5e-5, **NO_EXTRAS},
        "contrast-only COCO, lr 5e-5",
    ),
    "coco-mlm0+source": (
        {"coco_mlm_weight": 0.0, "coco_runs": 1, **SOURCE, **NO_EXTRAS},
        "contrast-only COCO -> iDRO (sequential)",
    ),
    "title-body": (
        {"skip_coco": True, "skip_finetune": True, "target_pairs": "title_body", "wise_alpha": None},
        "target title -> body pseudo pairs alone",
    ),
    "title-body-lr5e-5": (
        {
            "skip_coco": True,
            "skip_finetune": True,
            "target_pairs": "title_body",
            "wise_alpha": None,
            "target": {"learning_rate": 5e-5},
        },
        "target title -> body pairs alone, lr 5e-5",
    ),
    "title-body-lr1e-4": (
        {
            "skip_coco": True,
            "skip_finetune": True,
            "target_pairs": "title_body",
            "wise_alpha": None,
            "target": {"learning_rate": 1e-4},
        },
        "target title -> body pairs alone, lr 1e-4",
    ),
    "title-body-3neg": (
        {
            "skip_coco": True,
            "skip_finetune": True,
            "target_pairs": "title_body",
            "wise_alpha": None,
            "target": {"num_negatives": 3},
        },
        "target title -> body pairs alone, 3 BM25 negatives",
    ),
    "ict": (
        {"skip_coco": True, "skip_finetune": True, "target_pairs": "ict", "wise_alpha": None},
        "target sentence -> rest of document pseudo pairs alone",
    ),
    "source+title-body": (
        {
            "skip_coco": True,
            **SOURCE,
            "target_pairs": "title_body",
            "wise_alpha": None,
            "finetune_share": 0.3,
            "target_share": 0.4,
        },
        "iDRO on SQuAD, then target title -> body pairs",
    ),
    "joint": (
        {**CONTRAST_PAIRS, "target_schedule": "joint", "wise_alpha": None},
        "contrast-only COCO -> iDRO on SQuAD with target title -> body pairs as a term of every step",
    ),
    "default-len256": (
        {"schedule": "paper", "train_max_length": 256},
        "the paper's stages (the default of sessions 4-5) with 256-token training texts",
    ),
    "default-split-coco": (
        {"schedule": "paper", "coco_share": 0.7, "finetune_share": 0.3},
        "the paper's stages (the default of sessions 4-5) with 70% of the budget on COCO (instead of 40%)",
    ),
    "contrast-pairs-split-target": (
        {**CONTRAST_PAIRS, "wise_alpha": None, "coco_share": 0.1, "finetune_share": 0.2, "target_share": 0.7},
        "the earlier default without WiSE-FT, 70% of the budget on target pairs",
    ),
}
# COCO-DR in its own setting (--start splade-tiny): a model trained on a source task only, with a trained MLM head. The
# paper's Table 2 ablation (base size), each arm pinned so its rows keep their meaning when the recipe's default moves.
PAPER_STAGES = {"schedule": "paper", "skip_coco": False, "skip_finetune": False, **NO_EXTRAS}
UNIFORM = {"finetune": {"idro_preset": "uniform"}}
ARMS.update(
    {
        "neither": (
            {"skip_coco": True, "skip_finetune": False, **NO_EXTRAS, **UNIFORM},
            "plain contrastive fine-tune on SQuAD (the paper's 'Condenser' column: neither COCO nor iDRO)",
        ),
        "no-coco": (
            {"skip_coco": True, "skip_finetune": False, **NO_EXTRAS},
            "iDRO fine-tune on SQuAD alone (the paper's '-COCO' column)",
        ),
        "no-idro": (
            {**PAPER_STAGES, **UNIFORM},
            "COCO on the target corpora + source passages, then a plain fine-tune on SQuAD (the paper's '-iDRO')",
        ),
        "full": (
            PAPER_STAGES,
            "COCO, then iDRO on SQuAD: COCO-DR's stages (the paper's 'Full'; the mlm_head schedule)",
        ),
        # iDRO with the reference code's weight rule (cosine of the cluster gradients, w <- w^0.1 exp(e), floor 0.01):
        # bounded steps, where the paper's rule at the recipe's tau moves log w by ~40 nats in one step on splade-tiny
        # (reports/studies/probe_idro_scale.json) and puts all the weight on one cluster
        "no-coco-ref": (
            {"skip_coco": True, "skip_finetune": False, **NO_EXTRAS, "finetune": {"idro_preset": "reference"}},
            "iDRO with the reference code's weight rule on SQuAD alone",
        ),
        "full-ref": (
            {**PAPER_STAGES, "finetune": {"idro_preset": "reference"}},
            "COCO, then iDRO with the reference code's weight rule",
        ),
        "full-share0.2": (
            {**PAPER_STAGES, "coco_share": 0.2, "finetune_share": 0.8},
            "COCO-DR's stages with 20% of the budget on COCO (instead of 40%)",
        ),
        "full-share0.6": (
            {**PAPER_STAGES, "coco_share": 0.6, "finetune_share": 0.4},
            "COCO-DR's stages with 60% of the budget on COCO (instead of 40%)",
        ),
        "full-targets-only": (
            {**PAPER_STAGES, "include_source_corpus": False},
            "COCO-DR's stages, COCO on the target corpora only (no SQuAD passages)",
        ),
        # the paper's rule with the gradient Gram over its mean diagonal (idro_gram_normalization "diag"): tau 50 moves
        # log w at the speed tau 100 moves it for all-MiniLM-L6-v2 (whose mean diagonal is 2.15), whatever the encoder's
        # gradient scale; the reference rule's per-cluster backwards cost 12.4 s per splade-tiny step (36 steps in budget)
        "no-coco-gnorm": (
            {
                "skip_coco": True,
                "skip_finetune": False,
                **NO_EXTRAS,
                "finetune": {"idro_gram_normalization": "diag", "idro_tau": 50.0},
            },
            "iDRO on SQuAD alone, the Gram normalised by its mean diagonal, tau 50",
        ),
        "full-gnorm": (
            {**PAPER_STAGES, "finetune": {"idro_gram_normalization": "diag", "idro_tau": 50.0}},
            "COCO, then iDRO with the Gram normalised by its mean diagonal, tau 50",
        ),
        # the same at tau 500: the paper's rule has no pull back to uniform, so log w drifts by the sum of its steps;
        # at tau 50 w_max reached 0.55 (weight perplexity 0.09) by step 430 of full-gnorm
        "full-gnorm-tau500": (
            {**PAPER_STAGES, "finetune": {"idro_gram_normalization": "diag", "idro_tau": 500.0}},
            "COCO, then iDRO with the Gram normalised by its mean diagonal, tau 500",
        ),
        "no-coco-gnorm-tau500": (
            {
                "skip_coco": True,
                "skip_finetune": False,
                **NO_EXTRAS,
                "finetune": {"idro_gram_normalization": "diag", "idro_tau": 500.0},
            },
            "iDRO on SQuAD alone, the Gram normalised by its mean diagonal, tau 500",
        ),
        # levers of the measured mlm_head schedule (COCO, then the plain fine-tune): COCO's share of the budget and
        # its corpus
        "no-idro-share0.2": (
            {**PAPER_STAGES, **UNIFORM, "coco_share": 0.2, "finetune_share": 0.8},
            "COCO with 20% of the budget (instead of 40%), then a plain fine-tune on SQuAD",
        ),
        "no-idro-share0.6": (
            {**PAPER_STAGES, **UNIFORM, "coco_share": 0.6, "finetune_share": 0.4},
            "COCO with 60% of the budget (instead of 40%), then a plain fine-tune on SQuAD",
        ),
        "no-idro-targets-only": (
            {**PAPER_STAGES, **UNIFORM, "include_source_corpus": False},
            "COCO on the target corpora only (no SQuAD passages), then a plain fine-tune on SQuAD",
        ),
        # the paper's COCO learning rate for base models (1e-4, DESIGN.md section 3) instead of the recipe's 2e-5
        "no-idro-lr1e-4": (
            {**PAPER_STAGES, **UNIFORM, "coco_learning_rate": 1e-4},
            "COCO at lr 1e-4 (the paper's), then a plain fine-tune on SQuAD",
        ),
        "full-ref-lr1e-4": (
            {**PAPER_STAGES, "coco_learning_rate": 1e-4, "finetune": {"idro_preset": "reference"}},
            "COCO at lr 1e-4 (the paper's), then iDRO with the reference code's weight rule",
        ),
    }
)
# The paper's Table 2 (COCO-DR base, nDCG@10 on the test sets), printed beside the paper-setting rows.
PAPER_TABLE2 = {
    "full": (0.709, 0.355),
    "no-idro": (0.688, 0.354),
    "no-coco": (0.615, 0.333),
    "neither": (0.581, 0.282),
}
# The starting models the study runs from (hf_cocodr.modeling.bundled), each with its own arms, cache and report.
STARTS = {
    "all-MiniLM-L6-v2": {
        "work": "outputs/adaptation_study",
        "report": "reports/studies/adaptation_study",
        "findings": "reports/studies/adaptation_study_findings.md",
        "doc_max_length": 128,
        "base": BASE,
        "describe": "all-MiniLM-L6-v2 (mean pooling, cosine)",
    },
    # splade-tiny is ~25x cheaper per token than MiniLM: 15 minutes buy thousands of steps, which would cycle 1,000
    # questions many times, so it reads 20,000 SQuAD questions (COCO-DR's source is MS MARCO's 500k).
    "splade-tiny": {
        "work": "outputs/paper_setting",
        "report": "reports/paper_setting",
        "findings": "reports/paper_setting_findings.md",
        "doc_max_length": 256,
        "base": {"max_queries": 20000, "corpus_pool": 2, "save_hybrid": False},
        "describe": "splade-tiny (2 layers, hidden 128, trained MLM head; MS MARCO SPLADE only; CLS "
        "pooling, dot product)",
    },
}
PAPER_SCREEN = ["neither", "no-idro", "no-coco", "full"]
WISE_ALPHAS = (0.25, 0.5, 0.75)
STAGES = ("coco", "finetune")  # ARM@STAGE: the model that stage of ARM left behind
# screening order: the most informative first (each WiSE-FT arm right after the arm it extends)
SCREEN = [
    "title-body",
    "title-body-lr1e-4",
    "contrast-pairs",
    "source-only",
    "paper",
    "coco-mlm0",
    "joint",
    "source+title-body",
    "ict",
    "coco-mlm0+source",
    "coco-mlm1",
    "coco-mlm1-b96",
    "coco-mlm1-lr8e-6",
    "coco-mlm0.1",
    "coco-mlm0-lr5e-5",
    "coco-mlm0-lr1e-5",
    "source-uniform",
    "default-len256",
    "default-split-coco",
    "contrast-pairs-split-target",
    "title-body-lr5e-5",
    "title-body-3neg",
]
SCREEN_WISE = {
    "title-body",
    "title-body-lr1e-4",
    "contrast-pairs",
    "source-only",
    "paper",
    "coco-mlm0",
    "joint",
    "source+title-body",
}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--start",
        default="all-MiniLM-L6-v2",
        choices=sorted(STARTS),
        help="the bundled starting model (its own arms' cache, report and evaluation length)",
    )
    ap.add_argument(
        "--arms",
        default=None,
        help="comma-separated arm names (name+wiseA: a WiSE-FT arm; name@STAGE: the model after one stage of an arm)",
    )
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--budget-minutes", type=float, default=15.0, help="training budget of every arm")
    ap.add_argument(
        "--doc-max-length",
        type=int,
        default=None,
        help="document token limit of the evaluation (default: the start's, 128 or 256)",
    )
    ap.add_argument("--work", default=None, help="cache folder (default: the start's)")
    ap.add_argument("--report", default=None, help="report path without suffix (default: the start's)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument(
        "--plan-from-seed",
        type=int,
        default=42,
        help="other seeds train the steps this seed's wall-clock plan bought (-1: plan every seed anew)",
    )
    ap.add_argument(
        "--findings",
        default=None,
        help="hand-written conclusions placed under the title of the report (skipped if absent)",
    )
    ns = ap.parse_args()
    for key in ("work", "report", "findings", "doc_max_length"):
        if getattr(ns, key) is None:
            setattr(ns, key, STARTS[ns.start][key])
    return ns


def arm_list(ns) -> list[str]:
    if ns.arms:
        names = [a.strip() for a in ns.arms.split(",") if a.strip()]
    else:
        names = ["start"]
        for a in PAPER_SCREEN if getattr(ns, "start", None) == "splade-tiny" else SCREEN:
            names += [a] + ([f"{a}+wise{w:g}" for w in WISE_ALPHAS] if a in SCREEN_WISE else [])
    for n in names:
        base, stage, wise = split_arm(n)
        if n != "start" and base not in ARMS:
            sys.exit(f"unknown arm {n!r}; known: start, {', '.join(ARMS)} (+wiseA, @STAGE)")
        if stage and stage not in STAGES:
            sys.exit(f"unknown stage in {n!r}; known: {', '.join(STAGES)}")
        if stage and wise:
            sys.exit(f"{n!r}: an arm is either name@STAGE or name+wiseA, not both")
    return names


def split_arm(name: str) -> tuple[str, str, str]:
    """``(base, stage, wise)`` of an arm name: ``paper@coco`` -> ("paper", "coco", ""), ``title-body+wise0.5`` ->
    ("title-body", "", "0.5")."""
    rest, _, wise = name.partition("+wise")
    base, _, stage = rest.partition("@")
    return base, stage, wise


def arm_dir(work: Path, budget: float, arm: str, seed: int) -> Path:
    return work / f"budget{budget:g}" / arm / f"seed{seed}"


def eval_file(out: Path, doc_max_length: int) -> Path:
    """Where the evaluation of one row at one document length is cached (``dev_eval.json`` at 128 tokens, the
    study's length; ``dev_eval_len256.json`` etc. beside it, so one trained row can be evaluated at several)."""
    return out / ("dev_eval.json" if doc_max_length == 128 else f"dev_eval_len{doc_max_length}.json")


def evaluate(model, out: Path, root: Path, doc_max_length: int) -> dict:
    """The dev-split metrics of ``model``, cached in :func:`eval_file`."""
    from hf_cocodr import evaluate_retrieval, load_encoder

    path = eval_file(out, doc_max_length)
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("doc_max_length") == doc_max_length:
            return cached["metrics"]
    st = load_encoder(str(model)) if isinstance(model, (str, Path)) else model
    metrics, t0 = {}, time.time()
    for folder, split, label in EVALS:
        r = evaluate_retrieval(st, root / folder, split, doc_max_length=doc_max_length, show_progress_bar=False)
        metrics[label] = {"ndcg@10": r["ndcg@10"], "recall@100": r["recall@100"]}
    from hf_cocodr.utils import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        path, {"doc_max_length": doc_max_length, "metrics": metrics, "eval_seconds": round(time.time() - t0, 1)}
    )
    return metrics


def stage_losses(run: Path) -> dict:
    """First and last logged training loss of every stage that trained (how much signal each stage had)."""
    out = {}
    for stage, key in (("coco", "contrastive_loss"), ("finetune", "loss"), ("target", "loss")):
        path = run / stage / "trainer_state.json"
        if path.is_file():
            vals = [
                h[key] for h in json.loads(path.read_text())["log_history"] if key in h and "train_runtime" not in h
            ]
            if vals:
                out[stage] = [round(vals[0], 4), round(vals[-1], 4)]
    return out


def run_arm(arm: str, seed: int, ns, root: Path, model: str) -> dict:
    from hf_cocodr import run_recipe

    out = arm_dir(Path(ns.work), ns.budget_minutes, arm, seed)
    if arm == "start":
        return {"metrics": evaluate(model, out, root, ns.doc_max_length)}
    base, stage, wise = split_arm(arm)
    if stage:  # the model one stage of a trained arm left behind (e.g. paper@coco): one evaluation
        trained = run_arm(base, seed, ns, root, model)
        stage_dir = Path(trained["model_dir"]).parent / stage
        if not (stage_dir / "modules.json").is_file():
            sys.exit(f"{arm} seed {seed}: {base} has no stage {stage!r} with a model ({stage_dir})")
        return {**trained, "metrics": evaluate(stage_dir, out, root, ns.doc_max_length)}
    if wise:  # WiSE-FT of a trained arm: one interpolation + one evaluation
        trained = run_arm(base, seed, ns, root, model)
        if eval_file(out, ns.doc_max_length).is_file():
            return {**trained, "metrics": evaluate(None, out, root, ns.doc_max_length)}
        from hf_cocodr import load_encoder
        from hf_cocodr.modeling.wise import wise_ensemble

        st = wise_ensemble(load_encoder(model), load_encoder(str(trained["model_dir"])), float(wise))
        return {**trained, "metrics": evaluate(st, out, root, ns.doc_max_length)}
    cfg = {
        **STARTS[getattr(ns, "start", "all-MiniLM-L6-v2")]["base"],
        **ARMS[base][0],
        "seed": seed,
        "evaluate_start": False,
        **getattr(ns, "overrides", {}),
    }
    max_minutes = ns.budget_minutes
    if getattr(ns, "fixed_steps", None):  # a step budget instead of a wall-clock one (tests, exact comparisons)
        cfg.update(coco_steps=ns.fixed_steps, finetune_steps=ns.fixed_steps)
        max_minutes = None
    elif getattr(ns, "plan_from_seed", None) is not None and (
        seed != ns.plan_from_seed or base in getattr(ns, "steps_from", {})
    ):  # a further seed, or an arm that trains the steps another arm's plan bought
        cfg.update(planned_steps(ns, base, seed))
        max_minutes = None
    if not (out / "run" / "recipe.json").is_file():
        run_recipe(
            model,
            [str(root / "scifact"), str(root / "nfcorpus")],
            str(root / "squad-v1.1"),
            out / "run",
            config=cfg,
            max_minutes=max_minutes,
        )
    record = json.loads((out / "run" / "recipe.json").read_text())
    metrics = evaluate(out / "run" / "model", out, root, ns.doc_max_length)
    return {
        "metrics": metrics,
        "model_dir": str(out / "run" / "model"),
        "plan": record["plan"],
        "losses": stage_losses(out / "run"),
        "stage_seconds": record["stage_seconds"],
        "train_seconds": record["train_seconds"],
        "schedule": record["schedule"],
        "steps_trained": record.get("steps_trained"),
    }


def planned_steps(ns, base: str, seed: int) -> dict:
    """The steps the recipe planned for ``base`` with seed ``--plan-from-seed``: a further seed trains exactly as many
    steps of each stage, whatever else the machine does meanwhile (a wall-clock plan made on a busy machine buys
    fewer steps and would not be the same budget)."""
    ref = arm_dir(Path(ns.work), ns.budget_minutes, base, ns.plan_from_seed) / "run" / "plan.json"
    kept = recorded_rows(ns).get(base, {}).get(ns.plan_from_seed, {})
    if ref.is_file():
        plan = json.loads(ref.read_text())
        record = ref.parent / "recipe.json"
        trained = json.loads(record.read_text()).get("steps_trained", {}) if record.is_file() else {}
    elif "plan" in kept:  # the cache is gone (a fresh checkout): the report kept the plan and the steps trained
        plan, trained = kept["plan"], kept.get("steps_trained") or {}
    else:
        sys.exit(
            f"{base} seed {seed}: run seed {ns.plan_from_seed} first (its plan fixes the steps of every seed): "
            f"{ref} not found"
        )
    # a stage the clock stopped before its planned steps: the further seeds train the steps it actually ran
    plan = {**plan, **{f"{stage}_steps": n for stage, n in trained.items()}}
    out = {"refreshes": plan["refreshes"]}
    if plan["coco_steps"] > 0:
        out["coco_runs"] = int(plan.get("coco_runs", 1))
    if plan.get("target_steps", 0) > 0:
        raise SystemExit(f"{base}: its plan trains the retired target pseudo pairs (see the module docstring)")
    for key, skip in (("coco_steps", "skip_coco"), ("finetune_steps", "skip_finetune")):
        if plan[key] > 0:
            out[key] = plan[key]
        else:
            out[skip] = True
    return out


def all_arm_names() -> list[str]:
    return ["start"] + [
        n for a in ARMS for n in [a] + [f"{a}+wise{w:g}" for w in WISE_ALPHAS] + [f"{a}@{stage}" for stage in STAGES]
    ]


def recorded_rows(ns) -> dict:
    """The rows of the report at ``--report`` (``{arm: {seed: row}}``) if it was written for this budget and
    evaluation length; empty otherwise. They stand in for rows whose cache under ``--work`` is gone (``outputs/`` is
    not committed, so a fresh checkout has the report but not the runs)."""
    path = Path(f"{getattr(ns, 'report', '')}.json")
    if not getattr(ns, "report", None) or not path.is_file():
        return {}
    report = json.loads(path.read_text())
    if report.get("budget_minutes") != ns.budget_minutes or report.get("doc_max_length") != ns.doc_max_length:
        return {}
    return {arm: {int(seed): row for seed, row in runs.items()} for arm, runs in report.get("runs", {}).items()}


def cached_rows(ns, root: Path, model: str) -> dict:
    """Every finished (arm, seed) under ``--work`` for this budget, in a stable order (nothing is computed), and the
    rows the report already holds whose cache is gone: a row computed here replaces the recorded one."""
    rows, kept = {}, recorded_rows(ns)
    for arm in all_arm_names():
        folder = Path(ns.work) / f"budget{ns.budget_minutes:g}" / arm
        seeds = sorted(int(p.name[4:]) for p in folder.glob("seed*") if eval_file(p, ns.doc_max_length).is_file())
        per_seed = dict(kept.get(arm, {}))
        per_seed.update({seed: run_arm(arm, seed, ns, root, model) for seed in seeds})
        if per_seed:
            rows[arm] = dict(sorted(per_seed.items()))
    return rows


def run_all(ns, arms: list[str], seeds: list[int], root: Path, model: str) -> None:
    for arm in arms:
        for seed in seeds if arm != "start" else [0]:
            t0 = time.time()
            row = run_arm(arm, seed, ns, root, model)
            print(f"{arm} seed {seed}: {row['metrics']} ({(time.time() - t0) / 60:.1f} min)", flush=True)
            write_report(ns, cached_rows(ns, root, model))


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def summarize(rows: dict) -> dict:
    out = {}
    for arm, per_seed in rows.items():
        s = {}
        for _, _, label in EVALS:
            for metric in ("ndcg@10", "recall@100"):
                vals = [r["metrics"][label][metric] for r in per_seed.values()]
                mean, half_range = _stats(vals)
                s[f"{label} {metric}"] = {"mean": mean, "half_range": half_range, "values": vals}
        first = next(iter(per_seed.values()))
        s["seeds"] = sorted(per_seed)
        if first.get("losses"):
            s["losses"] = first["losses"]
        if "plan" in first:
            s["steps"] = {
                k: first["plan"].get(k) for k in ("coco_steps", "finetune_steps", "target_steps", "refreshes")
            }
            # a stage the clock stopped early: "trained of planned"
            for stage, n in (first.get("steps_trained") or {}).items():
                if n != s["steps"][f"{stage}_steps"]:
                    s["steps"][f"{stage}_steps"] = f"{n} of {s['steps'][f'{stage}_steps']}"
            runs = int(first["plan"].get("coco_runs", 1))
            if runs > 1:  # a soup: runs x steps of each run
                s["steps"]["coco_steps"] = f"{runs} × {s['steps']['coco_steps']}"
            # wall-clock time only where the recipe planned by the clock (the first seed; further seeds train its
            # steps, possibly while other work shares the cores, so their time says nothing about the budget)
            planned = [r for r in per_seed.values() if r["plan"].get("max_minutes")]
            minutes = statistics.fmean(r["train_seconds"] for r in planned) / 60 if planned else 0.0
            s["train_minutes"] = round(minutes, 1) if minutes >= 0.5 else None  # trained before stages kept time
            s["optimizer_share"] = next((r["plan"].get("planned_optimizer_share") for r in planned), None)
        out[arm] = s
    return out


def train_min(s: dict) -> str:
    if "steps" not in s:
        return ""
    if s.get("train_minutes") is None:
        return "n/a"
    share = s.get("optimizer_share")
    return f"{s['train_minutes']}" + (f" ({share:.0%})" if share is not None else "")


def write_report(ns, rows: dict) -> None:
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    summary = summarize(rows)
    start = summary.get("start")
    work = ns.work if not Path(ns.work).is_absolute() else os.path.relpath(ns.work, Path(__file__).parents[2])
    noise = {
        label: max(
            [s[f"{label} ndcg@10"]["half_range"] for a, s in summary.items() if len(s["seeds"]) > 1], default=None
        )
        for _, _, label in EVALS
    }
    findings = ""
    if ns.findings and Path(ns.findings).is_file():  # (written once, beside the table: linked, never copied)
        link = (
            os.path.relpath(Path(ns.findings).resolve(), Path(ns.report).resolve().parent)
            if ns.report
            else ns.findings
        )
        findings = f"Findings (written once, beside this table): [{Path(ns.findings).name}]({link})"

    start_name = getattr(ns, "start", "all-MiniLM-L6-v2")
    start_opt = f"--start {start_name} " if start_name != "all-MiniLM-L6-v2" else ""

    def command(arm: str, seeds: list) -> str:
        return (
            f"python scripts/studies/adaptation_study.py {start_opt}--budget-minutes {ns.budget_minutes:g} --doc-max-length "
            f"{ns.doc_max_length} --arms {arm} --seeds {','.join(map(str, seeds))}"
        )

    lines = [
        "# Adaptation study" + (f" from {start_name}" if start_name != "all-MiniLM-L6-v2" else ""),
        "",
        f"Starting model {STARTS[start_name]['describe']}; target corpora SciFact + NFCorpus (documents only); "
        f"source SQuAD v1.1 train ({STARTS[start_name]['base']['max_queries']:,} questions, BM25 pool of top-2). Every arm is `run_recipe` with "
        f"`--max-minutes {ns.budget_minutes:g}` (training only, planned by the recipe on this machine), evaluated on "
        f"SciFact dev (`train` claims, never trained on) and NFCorpus `dev` with documents cut to "
        f"{ns.doc_max_length} tokens for every row alike. Spread = half the range over seeds (one seed: none). "
        "Further seeds of an arm train exactly the steps the first seed's plan bought (`--plan-from-seed`), so "
        "the seeds of an arm differ only in their seed, whatever else ran on the machine.",
        "",
        f"Every row is cached and resumable under `{work}` (not committed: a row whose cache is gone is kept from "
        "this report's JSON); the command that re-creates or continues it is listed under the table. A `+wiseA` row is the arm before it with WiSE-FT α=A applied (one interpolation with the "
        "starting weights, no training); an `ARM@STAGE` row evaluates the model that stage of ARM left behind. "
        "Verdicts (arms with at least 3 seeds): *better* / *worse* where the difference of the means to the start "
        "is beyond the arm's own spread (the issue's test: beats the start by more than the seeds' spread), *same* "
        "within it. The stricter column holds every arm to the largest spread of any arm run with several seeds ("
        + ", ".join(
            f"{label} ±{v:.4f}" if v is not None else f"{label}: not measured yet" for label, v in noise.items()
        )
        + "; a spread over more seeds is wider, so this bar rises with every seed added anywhere).",
        "",
        "Columns: Δ start = difference of the means to the starting model; steps as planned by the recipe for the "
        'budget ("76 of 89": the stage\'s wall-clock deadline stopped it early); train min = data + planning + '
        "stages + export as recorded for the seed whose plan the clock made "
        "(in brackets: the share of the budget that plan gave to optimizer steps; n/a: trained before the recipe "
        "kept stage times); loss first → last = the first and the last logged training loss of each stage (single "
        "logging windows, noisy): how much signal a stage had left.",
        "",
        "| arm | seeds | SciFact nDCG@10 | Δ start | NFCorpus nDCG@10 | Δ start | SciFact R@100 | NFCorpus R@100 | "
        "verdict SciFact / NFCorpus (own spread) | stricter: largest spread | steps COCO / source / target "
        "(refreshes) | train min | loss first → last | what it tests |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if findings:
        lines[2:2] = [findings, ""]
    for arm, s in summary.items():

        def cell(key, s=s):
            v = s[key]
            return f"{v['mean']:.4f}" + (f" ± {v['half_range']:.4f}" if len(v["values"]) > 1 else "")

        def delta(key, s=s, arm=arm):
            if not start or arm == "start":
                return ""
            return f"{s[key]['mean'] - start[key]['mean']:+.4f}"

        def verdict(label, strict=False, s=s, arm=arm):
            if not start or arm == "start" or noise[label] is None:
                return ""
            if len(s["seeds"]) < 3:  # one or two seeds say nothing about this arm's own spread
                return "n<3"
            d = s[f"{label} ndcg@10"]["mean"] - start[f"{label} ndcg@10"]["mean"]
            bar = noise[label] if strict else s[f"{label} ndcg@10"]["half_range"]
            return "better" if d > bar else "worse" if d < -bar else "same"

        def verdicts(strict=False):
            return " / ".join(
                dict.fromkeys(filter(None, (verdict("SciFact dev", strict), verdict("NFCorpus dev", strict))))
            )

        steps = s.get("steps")
        steps_txt = (
            (f"{steps['coco_steps']} / {steps['finetune_steps']} / {steps['target_steps']} ({steps['refreshes']})")
            if steps
            else ""
        )
        losses = ", ".join(f"{k} {v[0]:.3f} → {v[1]:.3f}" for k, v in s.get("losses", {}).items())
        base, stage, wise = split_arm(arm)
        what = (
            "evaluation only"
            if arm == "start"
            else ARMS[base][1]
            + (f", WiSE-FT α={wise}" if wise else "")
            + (f"; the model after its {stage} stage only" if stage else "")
        )
        lines.append(
            f"| {arm} | {len(s['seeds'])} | {cell('SciFact dev ndcg@10')} | {delta('SciFact dev ndcg@10')} | "
            f"{cell('NFCorpus dev ndcg@10')} | {delta('NFCorpus dev ndcg@10')} | "
            f"{cell('SciFact dev recall@100')} | {cell('NFCorpus dev recall@100')} | "
            f"{verdicts()} | {verdicts(strict=True)} | "
            f"{steps_txt} | "
            f"{train_min(s)} | {losses} | {what} |"
        )
    lines += paper_table(summary)
    lines += [
        "",
        "Commands (run from the repository root; a finished row is read from the cache, a killed one resumes):",
        "",
    ]
    lines += [f"- {arm}: `{command(arm, s['seeds'])}`" for arm, s in summary.items()]
    Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(f"{ns.report}.md", "\n".join(lines) + "\n")
    atomic_write_json(
        f"{ns.report}.json",
        {
            "budget_minutes": ns.budget_minutes,
            "doc_max_length": ns.doc_max_length,
            "commands": {a: command(a, s["seeds"]) for a, s in summary.items()},
            "noise_ndcg@10": noise,
            "arms": summary,
            "runs": {
                a: {str(k): {kk: vv for kk, vv in v.items() if kk != "model_dir"} for k, v in r.items()}
                for a, r in rows.items()
            },
        },
    )


def paper_table(summary: dict) -> list[str]:
    """The paper-setting arms beside COCO-DR's Table 2 (base size, test sets): absolute values and each arm's gain
    over "neither" (ours on the dev splits at laptop scale, so the gains are what compare, not the levels)."""
    arms = [a for a in PAPER_TABLE2 if a in summary]
    if not arms:
        return []
    ref = summary.get("neither")
    lines = [
        "",
        "Beside the paper (COCO-DR Table 2, base size, test sets; ours: dev splits, mean over seeds). "
        "Δ neither = the arm's gain over the plain fine-tune.",
        "",
        "| arm | seeds | ours SciFact | Δ neither | paper SciFact | Δ neither | ours NFCorpus | Δ neither | "
        "paper NFCorpus | Δ neither |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in reversed(list(PAPER_TABLE2)):
        if arm not in summary:
            continue
        s, (p_sf, p_nf) = summary[arm], PAPER_TABLE2[arm]
        cells = []
        for i, label in enumerate(("SciFact dev", "NFCorpus dev")):
            ours = s[f"{label} ndcg@10"]["mean"]
            d = f"{ours - ref[f'{label} ndcg@10']['mean']:+.4f}" if ref else ""
            paper = (p_sf, p_nf)[i]
            cells += [f"{ours:.4f}", d, f"{paper:.3f}", f"{paper - PAPER_TABLE2['neither'][i]:+.3f}"]
        lines.append(f"| {arm} | {len(s['seeds'])} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ns = parse()
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    model = bundled_model_path(ns.start)
    arms = arm_list(ns)
    seeds = [int(s) for s in ns.seeds.split(",")]
    if ns.plan_from_seed is not None and ns.plan_from_seed < 0:
        ns.plan_from_seed = None
    if not ns.report_only:
        run_all(ns, arms, seeds, root, model)
    write_report(ns, cached_rows(ns, root, model))
    print(Path(f"{ns.report}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
