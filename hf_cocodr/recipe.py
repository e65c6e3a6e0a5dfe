"""The adaptation recipe in one call: COCO on the target corpora, fine-tuning on the source labels, target pseudo pairs,
WiSE-FT, then export, card and evaluation of the adapted and the starting model.

Stages write into ``OUT/coco``, ``OUT/finetune``, ``OUT/target`` and ``OUT/wise``; the final model is ``OUT/model``,
the evaluation ``OUT/eval.json`` (each split's metrics with the starting model's under ``"start"``) and the run
record ``OUT/recipe.json`` (settings, the schedule choice and why, the plan, the seconds of every stage). Each stage
is resumable (the latest complete checkpoint) and a finished stage (``hf_cocodr_stage.json`` present) is skipped on a
re-run. ``max_minutes`` is a training budget: :func:`plan_budget` sizes the stages from step times measured on this
machine (``OUT/plan.json``), and each stage ends by a wall-clock deadline (:func:`stage_deadlines`) even when its
steps run slower than measured.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .data.beir import BEIRFormatError, load_corpus, parse_eval_spec
from .data.pseudo_pairs import PSEUDO_PAIR_MODES, target_pseudo_pairs
from .data.spans import SpanCorpus
from .data.target_queries import refuse_eval_overlap
from .data.training import RetrievalTrainingData
from .errors import ConfigError
from .export import export_sentence_transformer
from .hybrid import HybridRetriever
from .model_card import TRAINING_INFO_FILE, write_model_card
from .modeling.loading import load_encoder, pooling_mode
from .modeling.precision import encoding_precision
from .recipe_checks import check_budget_buys_steps, check_budget_floor, check_recipe_lengths
from .run_record import LOCK, RECORD, RunFolder, digest, fingerprint
from .utils import atomic_directory, atomic_write_json, native_bf16

logger = logging.getLogger(__name__)

STAGE_MARKER = "hf_cocodr_stage.json"


@dataclass
class RecipeConfig:
    """Settings of :func:`run_recipe`. ``coco``, ``target`` and ``finetune`` hold extra ``CocoPretrainingArguments`` /
    ``IDROTrainingArguments`` fields for the three training stages (they win over the recipe's defaults).

    Stages, in order (each can be switched off; ``"auto"`` settings are resolved by :func:`choose_schedule` from the
    starting model and logged, written to ``recipe.json`` and to the model card):

    1. COCO on the target corpora (``skip_coco``). ``coco_mlm_weight`` weighs both masked-LM terms: 0 trains the
       span contrast alone (no masking, no MLM forward). A model without a trained MLM head gets a fresh one that
       trains alone for the first 30% of the steps. ``coco_runs`` > 1 trains that many COCO runs from the starting
       model (seeds ``seed``, ``seed + 1``, ...) and averages their weights into one encoder (a uniform model soup);
       ``"budget"`` trains as many runs of about ``coco_run_steps`` steps as COCO's share of the budget affords (3
       without a budget). ``coco_steps`` is then the steps of each run.
    2. Fine-tuning on the labelled source task (``skip_finetune``), iDRO by default.
    3. Fine-tuning on pseudo pairs of the target corpora (``target_pairs``: ``"title_body"``, ``"ict"`` or
       ``"none"``): a title (or one sentence) against the rest of its document, BM25 negatives from the target
       corpus. No labels are read.
    4. WiSE-FT (``wise_alpha``): ``θ = (1 − α)·θ_start + α·θ_adapted``; ``None``/1 skips it.

    ``max_minutes`` budgets (training only; the evaluations asked for are reported apart) are split between the
    stages by ``coco_share`` / ``finetune_share`` / ``target_share`` (renormalised over the stages that run; a stage
    switched on with an automatic share of 0 gets the mean of the others'). ``coco_steps`` / ``finetune_steps`` /
    ``target_steps`` fix a stage's optimizer steps instead (a whole number >= 1; None: planned). 0 is refused rather
    than read as "skip": a stage is left out with ``skip_coco`` / ``skip_finetune`` / ``target_pairs: none``. The
    ``coco`` / ``finetune`` / ``target`` mappings are checked against their arguments class (names, types, ranges)
    before anything is loaded; their ``max_steps`` is the recipe's to set (use the ``*_steps`` options).
    """

    source_split: str = "train"
    include_source_corpus: bool = True
    max_queries: int | None = None  # source queries used for fine-tuning (None: all)
    corpus_pool: int | None = 5  # restrict the source corpus to positives + BM25 top-k of the kept queries
    coco_steps: int | None = None  # steps of each COCO run; None: planned from max_minutes (or 500)
    finetune_steps: int | None = None  # None: planned from max_minutes (or 500)
    target_steps: int | None = None  # None: planned from max_minutes (or 500)
    refreshes: int | None = None  # self-negative refreshes (each re-clusters); None: as many as the budget affords
    schedule: str = "auto"  # "auto": chosen by the starting model (see choose_schedule); "paper": COCO-DR's stages
    coco_mlm_weight: float | str = "auto"  # weight of both MLM terms; 0 = contrast-only continued pretraining
    coco_learning_rate: float | str = "auto"
    coco_runs: int | str = "auto"  # COCO runs averaged into one encoder (a model soup); "budget": as the budget affords
    coco_run_steps: int = 76  # with coco_runs "budget": the length of one run the budget is divided into
    target_pairs: str = "auto"  # "title_body" | "ict" | "none"
    target_schedule: str = "auto"  # "sequential" (a stage after the source one) or "joint" (a term of every step)
    joint_weight: float = 1.0  # weight of the target-pairs term under the joint schedule
    wise_alpha: float | str | None = "auto"  # WiSE-FT interpolation with the starting model (None or 1: off)
    coco_share: float | str = "auto"  # shares of the training budget (renormalised over the stages that run)
    finetune_share: float | str = "auto"
    target_share: float | str = "auto"
    train_max_length: int = 128  # token limit of training texts (documents and spans)
    evaluate_start: bool = True  # also evaluate the starting model on the --eval splits (reported side by side)
    save_hybrid: bool = True  # save a hybrid retriever (final model + BM25) for each target corpus in OUT/hybrid
    skip_coco: bool | str = "auto"
    skip_finetune: bool | str = "auto"
    seed: int = 42
    eval_batch_size: int = 64
    methods: list[str] = field(default_factory=list)  # extra fine-tuning methods: "modir", "berm", "rmsc"
    target_queries: list[str] = field(default_factory=list)  # unlabelled target queries for MoDIR (optional)
    coco: dict[str, Any] = field(default_factory=dict)
    finetune: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecipeConfig:
        known = {f for f in cls.__dataclass_fields__}

        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown recipe option(s) {unknown}; known: {sorted(known)}")
        for stage in ("coco", "finetune", "target"):
            sub = data.get(stage) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments, got {sub!r}")
            bad = [k for k in sub if k.endswith("_dir")]
            if bad:
                raise ConfigError(f"recipe option {stage}.{bad[0]}: the recipe places every stage inside --output_dir; "
                                  "remove it")
        cfg = cls(**{k: v for k, v in data.items() if k not in ("coco", "finetune", "target") or v is not None})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse out-of-range settings by name (before any model is loaded)."""

        def number(name, lo, hi, allow_auto=True, allow_none=False):
            v = getattr(self, name)
            if (allow_auto and v == "auto") or (allow_none and v is None):
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                raise ConfigError(f"recipe option {name} must be a number in [{lo}, {hi}]"
                                  f"{' or auto' if allow_auto else ''}, got {v!r}")

        number("coco_mlm_weight", 0, 100)
        number("coco_learning_rate", 1e-8, 1)
        number("wise_alpha", 0, 1, allow_none=True)
        for share in ("coco_share", "finetune_share", "target_share"):
            number(share, 0, 1)

        def whole(name, lo, allow_none=True, hint=""):
            v = getattr(self, name)
            if (v is None and not allow_none) or (v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                                                     or v < lo)):
                raise ConfigError(f"recipe option {name} must be a whole number >= {lo}"
                                  f"{' (or unset)' if allow_none else ''}, got {v!r}{hint}")

        for steps, switch in (("coco_steps", "skip_coco: true"), ("finetune_steps", "skip_finetune: true"),
                              ("target_steps", "target_pairs: none")):
            whole(steps, 1, hint=f"; to leave the stage out set {switch}")
        whole("refreshes", 0)
        whole("coco_run_steps", 1, allow_none=False)
        if self.coco_runs not in ("auto", "budget"):
            whole("coco_runs", 1, allow_none=False, hint=" (or auto / budget)")
        whole("max_queries", 1)
        whole("corpus_pool", 1)
        whole("eval_batch_size", 1, allow_none=False)
        whole("seed", 0, allow_none=False)
        if not isinstance(self.source_split, str) or not self.source_split:
            raise ConfigError(f"recipe option source_split must be a split name, got {self.source_split!r}")
        for flag in ("include_source_corpus", "evaluate_start", "save_hybrid"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"recipe option {flag} must be true or false, got {getattr(self, flag)!r}")
        for name in ("methods", "target_queries"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ConfigError(f"recipe option {name} must be a list of names, got {v!r}")
        self._check_stage_arguments()
        if self.target_pairs not in ("auto", "none", *PSEUDO_PAIR_MODES):
            raise ConfigError(f"recipe option target_pairs must be auto, none, {' or '.join(PSEUDO_PAIR_MODES)}; "
                              f"got {self.target_pairs!r}")
        if self.target_schedule not in ("auto", "sequential", "joint"):
            raise ConfigError(f"recipe option target_schedule must be auto, sequential or joint, got "
                              f"{self.target_schedule!r}")
        number("joint_weight", 0, 100, allow_auto=False)
        if self.schedule not in ("auto", "paper"):
            raise ConfigError(f"recipe option schedule must be 'auto' or 'paper', got {self.schedule!r}")
        for flag in ("skip_coco", "skip_finetune"):
            if getattr(self, flag) not in (True, False, "auto"):
                raise ConfigError(f"recipe option {flag} must be true, false or auto, got {getattr(self, flag)!r}")
        if not isinstance(self.train_max_length, int) or self.train_max_length < 8:
            raise ConfigError(f"recipe option train_max_length must be a whole number >= 8, got "
                              f"{self.train_max_length!r}")

    def _check_stage_arguments(self) -> None:
        """``coco`` / ``finetune`` / ``target``: known fields of the stage's arguments class, values of their types,
        and the class's own range checks (run by building it), so a bad value fails before any model is loaded."""

        from .finetuning import IDROTrainingArguments
        from .pretraining import CocoPretrainingArguments

        def fits(value, hint) -> bool:
            origin = typing.get_origin(hint)
            if origin in (typing.Union, types.UnionType):
                return any(fits(value, h) for h in typing.get_args(hint))
            if hint is type(None):
                return value is None
            if hint is bool:
                return isinstance(value, bool)
            if hint in (int, float):
                return isinstance(value, int if hint is int else int | float) and not isinstance(value, bool)
            if hint in (str, list, dict) or origin in (list, dict):
                return isinstance(value, origin or hint)
            return True  # enums, callables, ...: left to the class

        for stage, cls in (("coco", CocoPretrainingArguments), ("finetune", IDROTrainingArguments),
                           ("target", IDROTrainingArguments)):
            sub = getattr(self, stage)
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments, got {sub!r}")
            if "max_steps" in sub:
                raise ConfigError(f"recipe option {stage}.max_steps: the recipe sets each stage's steps; use "
                                  f"{stage}_steps instead")
            hints = typing.get_type_hints(cls)
            unknown = sorted(k for k in sub if k not in hints)
            if unknown:
                raise ConfigError(f"recipe option {stage}: unknown field(s) {unknown}, not {cls.__name__} fields")
            for key, value in sub.items():
                if not fits(value, hints[key]):
                    expected = getattr(hints[key], "__name__", str(hints[key]))
                    raise ConfigError(f"recipe option {stage}.{key} must be of type {expected}, got {value!r}")
            try:
                # on the device the stage will use (bf16 on a CPU is refused unless use_cpu is set)
                cls(**{"output_dir": "unused", "report_to": "none", "use_cpu": _no_gpu(), **sub, "max_steps": 1})
            except (TypeError, ValueError) as e:
                raise ConfigError(f"recipe option {stage}: {' '.join(str(e).split())}") from None


# COCO-DR's own stages: COCO with masked-LM through the Condenser head, then iDRO on the source task.
PAPER_SCHEDULE: dict[str, Any] = dict(
    skip_coco=False, coco_mlm_weight=1.0, coco_learning_rate=2e-5, coco_runs=1, skip_finetune=False,
    target_pairs="none", target_schedule="sequential", wise_alpha=None, coco_share=0.4, finetune_share=0.6,
    target_share=0.0)

# What the adaptation study (reports/adaptation_study.md) found best for each kind of starting model, at the demo's
# budget on 2 CPU cores. A value the user sets explicitly always wins over these.
SCHEDULES: dict[str, dict[str, Any]] = {
    # A model without MLM head (all-MiniLM-L6-v2 and most sentence-transformers models: already a trained retriever):
    # COCO alone, spent as a soup of runs of about 76 steps (MLM through a fresh Condenser head that trains alone for
    # the first 30% of each run, MLM_HEAD_WARMUP_SHARE), no source fine-tuning. In the adaptation study at 15 minutes
    # (reports/adaptation_study_15min.md) every single 76-step COCO run beat the start on both dev sets; fine-tuning on
    # SQuAD after COCO took NFCorpus back down in every seed, and longer COCO runs (243 steps) lost 0.014 on SciFact.
    # Averaging several runs keeps what they learn in common and averages their noise away.
    "no_mlm_head": dict(PAPER_SCHEDULE, coco_runs="budget", skip_finetune=True, coco_share=1.0, finetune_share=0.0),
    # A checkpoint with a trained MLM head (BERT, Condenser, COCO-DR): the paper's stages as published (not measured
    # here: no such model is available offline). A raw language model needs the fine-tuning to become a retriever.
    "mlm_head": dict(PAPER_SCHEDULE),
}
# The share of COCO's steps a fresh MLM head (a model without one) trains before MLM gradients reach the encoder.
MLM_HEAD_WARMUP_SHARE = 0.3


# Everything run_recipe writes into its output folder (declared in its record before any stage starts).
RECIPE_ENTRIES = ("coco-runs", "coco", "finetune", "target", "wise", "model", "hybrid", "plan.json",
                  "start_eval.json", "eval.json", "recipe.json", "idro_weights.json")


def choose_schedule(cfg: RecipeConfig, has_mlm_head: bool | None) -> tuple[RecipeConfig, dict[str, Any]]:
    """Resolve every ``"auto"`` setting of ``cfg`` from :data:`SCHEDULES` by the kind of starting model.

    Returns the resolved config and a record of the choice (the kind, why, and which settings were chosen vs set by
    the user) for the log, ``recipe.json`` and the model card. ``schedule="paper"`` resolves "auto" to COCO-DR's
    stages for every kind (COCO with MLM -> iDRO; no pseudo pairs, no WiSE-FT).
    """
    kind = "mlm_head" if has_mlm_head else "no_mlm_head"
    why = ("the starting model has a trained MLM head" if has_mlm_head else
           "the starting model has no MLM head" if has_mlm_head is False else
           "the starting model's MLM head could not be inspected (treated as absent)")
    preset = SCHEDULES[kind] if cfg.schedule == "auto" else PAPER_SCHEDULE
    chosen, user = {}, {}
    values = asdict(cfg)
    for key, default in preset.items():
        if values[key] == "auto":
            values[key] = default
            chosen[key] = default
        else:
            user[key] = values[key]
    resolved = RecipeConfig(**values)
    _share_switched_on_stages(resolved, chosen)
    record = {"kind": kind, "why": why, "schedule": cfg.schedule, "chosen": chosen, "set_by_user": user}
    if has_mlm_head is not True:  # absent, or not inspectable (a Hub id): treated as absent, so warmed up
        record["mlm_head"] = (f"fresh: it trains alone for the first {MLM_HEAD_WARMUP_SHARE:.0%} of COCO's steps when "
                              "COCO uses MLM")
    return resolved, record


def _share_switched_on_stages(cfg: RecipeConfig, chosen: dict[str, Any]) -> None:
    """Give a budget share to a stage the user switched on that the schedule leaves out.

    The schedule's share for a stage it does not run is 0 (the default gives no share to target pseudo pairs); a user
    who asks for them (``target_pairs: ict``) without a share would get 2 steps. A stage that runs with an automatic
    share of 0 gets the mean of the other running stages' shares (1 when it runs alone); the value is recorded as
    chosen. A share of 0 the user gave to a stage that runs and has no fixed step count is refused."""
    planned = [f"{name}_share" for name, (on, steps) in stage_switches(cfg).items() if on and steps is None]
    for key in planned:
        if float(getattr(cfg, key)) == 0.0 and key not in chosen:
            stage = key.removesuffix("_share")
            raise ConfigError(f"recipe option {key} is 0 but the {stage} stage runs: it would get no budget; give it "
                              f"a share > 0, fix its steps ({stage}_steps), or switch the stage off")
    others = [float(getattr(cfg, k)) for k in planned if float(getattr(cfg, k)) > 0]
    for key in planned:
        if float(getattr(cfg, key)) == 0.0:
            share = round(sum(others) / len(others), 6) if others else 1.0
            setattr(cfg, key, share)
            chosen[key] = share


def _stage_done(path: Path, identity: str | None = None) -> dict | None:
    """The stage's completion marker; with ``identity``, only if the stage finished with those inputs."""
    marker = path / STAGE_MARKER
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
        except ValueError:
            return None
        return info if identity is None or info.get("identity") == identity else None
    return None


def _log_rerun(stage_dir: Path) -> None:
    if (stage_dir / STAGE_MARKER).is_file():
        logger.info("stage %s: its inputs changed since it finished; running it again", stage_dir.name)


def _fixed_plan(cfg: RecipeConfig) -> dict[str, Any]:
    """The plan without a time budget: the steps given (or the defaults)."""
    soup = cfg.coco_runs == "budget"
    return {"coco_steps": _given(cfg.coco_steps if cfg.coco_steps or not soup else cfg.coco_run_steps, cfg.skip_coco),
            "coco_runs": NO_BUDGET_COCO_RUNS if soup else int(cfg.coco_runs),
            "finetune_steps": _given(cfg.finetune_steps, cfg.skip_finetune),
            "target_steps": _given(cfg.target_steps, cfg.target_pairs == "none"),
            "refreshes": 1 if cfg.refreshes is None else cfg.refreshes}


def _saved_plan(out: Path, plan_id: str) -> dict[str, Any] | None:
    """``OUT/plan.json`` if it was made for these inputs (a resumed run keeps the plan it started with)."""
    path = out / "plan.json"
    try:
        plan = json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None
    if plan is not None and plan.get("identity") != plan_id:
        logger.info("the inputs or the budget changed since %s was made: planning again", path)
        return None
    return plan


_NOT_TRAJECTORY = ("output_dir", "logging_steps", "logging_first_step", "save_strategy", "save_steps",
                   "save_total_limit", "disable_tqdm", "report_to", "use_cpu")


def _stage_ids(plan, cfg: RecipeConfig, fps, coco_kw, ft_kw, target_kw) -> dict[str, str]:
    """Each stage's identity: what it starts from (the stage before it), the data it reads, its settings, steps."""

    def settings(kw):
        return {k: v for k, v in sorted(kw.items()) if k not in _NOT_TRAJECTORY}

    ids, current = {}, digest(fps["model"])
    source = {"data": fps["source"], "split": cfg.source_split,
              "max_queries": plan.get("source_queries", cfg.max_queries),
              "corpus_pool": cfg.corpus_pool, "seed": cfg.seed}
    if not cfg.skip_coco and plan["coco_steps"] > 0:
        runs = int(plan.get("coco_runs", 1))
        current = ids["coco"] = digest({"stage": "coco", "start": current, "targets": fps["targets"],
                                        "source": source if cfg.include_source_corpus else None,
                                        "settings": settings(coco_kw), "steps": plan["coco_steps"],
                                        **({"runs": runs} if runs > 1 else {})})
    if not cfg.skip_finetune and plan["finetune_steps"] > 0:
        joint = ({"pairs": cfg.target_pairs, "weight": cfg.joint_weight, "targets": fps["targets"],
                  "settings": settings(target_kw)} if is_joint(cfg) else None)
        current = ids["finetune"] = digest({
            "stage": "finetune", "start": current, "source": source, "settings": settings(ft_kw),
            "steps": plan["finetune_steps"], "refreshes": plan["refreshes"], "methods": list(cfg.methods),
            "targets": fps["targets"] if cfg.methods else None, "target_queries": list(cfg.target_queries),
            "joint": joint})
    if cfg.target_pairs != "none" and not is_joint(cfg) and plan["target_steps"] > 0:
        current = ids["target"] = digest({"stage": "target", "start": current, "targets": fps["targets"],
                                          "pairs": cfg.target_pairs, "seed": cfg.seed,
                                          "settings": settings(target_kw), "steps": plan["target_steps"]})
    if uses_wise(cfg):
        ids["wise"] = digest({"stage": "wise", "start": fps["model"], "adapted": current, "alpha": cfg.wise_alpha})
    return ids


def _mark_done(path: Path, info: dict) -> None:
    atomic_write_json(path / STAGE_MARKER, info)


def _model_similarity(model_path: str) -> tuple[str, str]:
    """(pooling, similarity) the starting model declares; raw checkpoints follow COCO-DR (cls, dot)."""

    st = load_encoder(model_path)
    return pooling_mode(st) or "cls", str(st.similarity_fn_name or "dot")


# ---------------------------------------------------------------------------------------------- planning
# Timed training steps per stage (after a warm-up step), their median planned by. One timed step was 30-40% off in
# either direction: a 128-token-span COCO step probed at 5.4 s ran at 3.8, iDRO steps probed 11.8-19.3 s ran at 10.9.
STEP_TIMINGS = 3


def _time_it(fn, repeats: int = 1) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _timing_optimizer(model):
    """An AdamW over ``model``'s parameters, so a timed step includes the update the Trainer makes (the model timed
    is a throwaway copy: its weights may change)."""
    import torch

    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-8)


def _finetune_step_seconds(st, data, ft_args) -> float:
    """Seconds of one fine-tuning step (forward + backward of the loss the stage uses) on ``data``."""
    import torch

    from .finetuning.losses.idro import IDROLoss

    st.train()
    # A batch like the stage's: random rows (the first rows of a dataset can be atypically short), cluster labels
    # drawn from the stage's clusters (iDRO's cost grows with the clusters present in a batch: about 24 of 50 in 32
    # rows), and the optimizer update.
    gen = np.random.default_rng(0)
    k = max(1, int(getattr(ft_args, "num_clusters", 0) or 50))
    loss = IDROLoss(st, preset=ft_args.idro_preset, num_clusters=k, tau=1.0, scale=ft_args.idro_scale)
    rows = np.sort(gen.choice(len(data), min(len(data), ft_args.per_device_train_batch_size), replace=False))
    labels = torch.as_tensor(gen.integers(0, k, len(rows)))
    opt = _timing_optimizer(st)

    def step():
        cols, dk, pk = data.sample(rows, step=0, seed=0, num_negatives=ft_args.num_negatives)
        kw = {"max_length": ft_args.max_length} if ft_args.max_length else {}
        feats = [st.preprocess(c, **kw) for c in cols]
        # in the precision the stage's Trainer runs its forward in, so the probed step costs what its steps will
        with encoding_precision(st, "bf16" if ft_args.bf16 else "fp32"):
            value = loss(feats, labels, doc_keys=torch.as_tensor(dk), pos_keys=torch.as_tensor(pk))
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = _time_it(step, repeats=STEP_TIMINGS)
    st.eval()
    return out


def measure_throughput(model_path: str, coco_args, ft_args, spans, train_data, pooling: str, *,
                       target_args=None, target_data=None) -> dict[str, float]:
    """Seconds per COCO step, per source / target fine-tuning step, and per encoded document and query, measured
    on this machine with the settings the stages will use."""

    out: dict[str, float] = {}
    if spans is not None:
        from transformers import AutoTokenizer

        from .modeling.condenser import CondenserForPretraining, _transformer_dir
        from .pretraining.collator import SpanPairBuilder

        cond = CondenserForPretraining.from_pretrained(model_path, n_head_layers=coco_args.n_head_layers,
                                                       skip_from=coco_args.skip_from)
        tok = AutoTokenizer.from_pretrained(_transformer_dir(model_path))
        builder = SpanPairBuilder(spans, tok, mlm_probability=coco_args.mlm_probability,
                                  max_length=coco_args.max_span_length, mask=coco_args.uses_mlm)
        docs = np.sort(np.random.default_rng(0).choice(len(spans), min(len(spans),
                                                                       coco_args.per_device_train_batch_size),
                                                       replace=False))
        opt = _timing_optimizer(cond)
        # Train mode (dropout on), as the Trainer runs the step. Timed in eval mode, the probe measured 3.3 s per
        # step where the 15-minute default's COCO stage took 4.3 s.
        cond.train()

        def coco_step():
            batch = builder.build(docs, step=0, seed=0)
            with encoding_precision(cond, "bf16" if coco_args.bf16 else "fp32"):
                o = cond(**batch, pooling=pooling)
                total = o["embedding"].square().sum()
                if "mlm_sum" in o:
                    total = total + o["mlm_sum"] / o["num_masked"] + o["head_mlm_sum"] / o["num_masked"]
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["coco_step_s"] = _time_it(coco_step, repeats=STEP_TIMINGS)
        del cond
    st = load_encoder(model_path)
    if train_data is not None:
        out["finetune_step_s"] = _finetune_step_seconds(st, train_data, ft_args)
        rows = np.random.default_rng(0).choice(len(train_data.corpus), min(128, len(train_data.corpus)), replace=False)
        texts = train_data.doc_texts(rows)
        kw = {"processing_kwargs": {"text": {"max_length": ft_args.max_length}}} if ft_args.max_length else {}
        out["encode_doc_s"] = _time_it(lambda: st.encode_document(texts, batch_size=64, **kw), repeats=1) / len(texts)
        queries = train_data.query_texts[:128]
        out["encode_query_s"] = _time_it(lambda: st.encode_query(queries, batch_size=64), repeats=1) / len(queries)
    if target_data is not None:
        out["target_step_s"] = _finetune_step_seconds(st, target_data, target_args)
    return out


def plan_budget(budget_s: float, tp: dict[str, float], cfg: RecipeConfig, *, overhead_s: float, pool_docs: int,
                n_queries: int, idro: bool) -> dict[str, Any]:
    """Spend ``budget_s`` on optimizer steps: fixed costs first (``overhead_s``: loading, exports; K-Means over the
    source queries), then self-negative refreshes only while they cost at most 10% of the budget, the rest split
    between the stages that run by their shares. Evaluation is not part of the budget."""
    refresh_s = tp.get("encode_doc_s", 0.0) * pool_docs + (tp.get("encode_query_s", 0.0) * n_queries if idro else 0.0)
    kmeans_s = tp.get("encode_query_s", 0.0) * n_queries if idro else 0.0
    refreshes = cfg.refreshes
    if refreshes is None:
        refreshes = 0 if cfg.skip_finetune else int(min(2, (0.1 * budget_s) // refresh_s) if refresh_s > 0 else 0)
    fixed = overhead_s + kmeans_s + refreshes * refresh_s
    train_s = max(0.0, budget_s - fixed)
    joint = is_joint(cfg)
    step_s = stage_step_seconds(tp, cfg)
    stages = stage_switches(cfg)
    share = {"coco": cfg.coco_share, "finetune": float(cfg.finetune_share) + (float(cfg.target_share) if joint else 0.0),
             "target": cfg.target_share}
    shares = {k: float(share[k]) for k, (on, _) in stages.items() if on}
    total = sum(shares.values()) or 1.0
    plan: dict[str, Any] = {}
    for name, (on, given) in stages.items():
        if not on:
            plan[f"{name}_steps"] = 0
        elif given is not None:
            plan[f"{name}_steps"] = given
        else:
            plan[f"{name}_steps"] = max(2, int(train_s * shares[name] / total / step_s[name]))
    runs = 1
    if stages["coco"][0]:  # COCO runs averaged into one encoder: each run after the first costs a load + export more
        runs, steps = coco_runs_for(train_s * shares["coco"] / total, step_s["coco"], cfg, stages["coco"][1])
        plan["coco_steps"] = steps if steps is not None else plan["coco_steps"]
    plan["coco_runs"] = runs
    optimizer_s = sum(plan[f"{n}_steps"] * step_s[n] * (runs if n == "coco" else 1) for n in stages)
    plan.update(refreshes=refreshes, budget_seconds=round(budget_s, 1), fixed_seconds=round(fixed, 1),
                refresh_seconds_each=round(refresh_s, 1), kmeans_seconds=round(kmeans_s, 1),
                planned_optimizer_seconds=round(optimizer_s, 1),
                planned_optimizer_share=round(optimizer_s / budget_s, 3) if budget_s else None)
    return plan


# Source queries drawn to time the fine-tuning step when the budget sizes the draw (max_queries unset).
SIZE_PROBE_QUERIES = 1000


def size_source_queries(budget_s: float, tp: dict[str, float], cfg: RecipeConfig, *, overhead_s: float,
                        available: int, pool_docs_per_query: float, max_pool_docs: int, mining_s_per_query: float,
                        batch: int, idro: bool) -> int:
    """How many source queries a budgeted run draws (when ``max_queries`` is unset): the largest ``q`` whose plan
    trains at least ``q / batch`` source steps, so every drawn query is seen once, and never more than ``available``.

    Everything that grows with the queries is charged before the steps are split, as :func:`plan_budget` charges it:
    BM25 mining (``q x mining_s_per_query``), the first K-Means encoding of the queries, and the self-negative
    refreshes over the mining pool (``min(max_pool_docs, q x pool_docs_per_query)`` documents). A source task of
    87,599 questions under a 2-minute budget is then drawn to the few hundred its steps can use instead of being mined
    and clustered whole inside a stage planned for a minute."""

    def fits(q: int) -> bool:
        plan = plan_budget(budget_s, tp, cfg, overhead_s=overhead_s + q * mining_s_per_query,
                           pool_docs=int(min(max_pool_docs, round(q * pool_docs_per_query))), n_queries=q, idro=idro)
        return plan["finetune_steps"] * batch >= q

    lo, hi = min(batch, available), available
    if fits(hi):
        return hi
    if not fits(lo):
        return lo
    while hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def coco_runs_for(coco_s: float, step_s: float, cfg: RecipeConfig, given_steps: int | None) -> tuple[int, int | None]:
    """``(runs, steps of each run)`` for ``coco_s`` seconds of COCO (steps None: as planned for one run).

    ``coco_runs: "budget"``: as many runs of about ``coco_run_steps`` steps (``coco_steps`` when given) as fit, at
    least one; the seconds are then shared out evenly, so a run may come out somewhat shorter or longer than
    ``coco_run_steps`` and the budget is spent. A whole number of runs shares the seconds between that many. Every
    run after the first costs a model load + export (:data:`STAGE_LOAD_SECONDS`) of the COCO seconds."""
    step_s = max(step_s, 1e-9)
    if cfg.coco_runs == "budget":
        per_run = (given_steps or cfg.coco_run_steps) * step_s + STAGE_LOAD_SECONDS
        runs = max(1, round((coco_s + STAGE_LOAD_SECONDS) / per_run))
    else:
        runs = int(cfg.coco_runs)
    if given_steps is not None:
        return runs, given_steps
    if runs == 1:
        return 1, None
    return runs, max(2, int((coco_s - (runs - 1) * STAGE_LOAD_SECONDS) / (runs * step_s)))


def stage_switches(cfg: RecipeConfig) -> dict[str, tuple[bool, int | None]]:
    """Whether each training stage runs, and its fixed step count (None: planned from the budget). In the joint
    schedule the target pairs train inside the source steps, so the target stage does not run on its own."""
    return {"coco": (not cfg.skip_coco, cfg.coco_steps),
            "finetune": (not cfg.skip_finetune, cfg.finetune_steps),
            "target": (cfg.target_pairs != "none" and not is_joint(cfg), cfg.target_steps)}


def stage_step_seconds(tp: dict[str, float], cfg: RecipeConfig) -> dict[str, float]:
    """Measured seconds of one optimizer step of each stage. In the joint schedule the target pairs are a term of
    every source step, so their cost goes to that stage (and the target stage has no steps of its own)."""
    joint = is_joint(cfg)
    return {"coco": tp.get("coco_step_s", 0.0),
            "finetune": tp.get("finetune_step_s", 0.0) + (tp.get("target_step_s", 0.0) if joint else 0.0),
            "target": 0.0 if joint else tp.get("target_step_s", 0.0)}


def uses_wise(cfg: RecipeConfig) -> bool:
    """Whether the recipe ends with a WiSE-FT interpolation (α of None or 1 means none)."""
    return cfg.wise_alpha not in (None, 1, 1.0)


STAGE_LOAD_SECONDS = 20.0  # a model load + export on 2 CPU cores (the planner charges it per load)
NO_BUDGET_COCO_RUNS = 3  # coco_runs "budget" without a budget: this many runs of coco_run_steps steps


def stage_deadlines(plan: dict[str, Any], cfg: RecipeConfig, t_start: float) -> dict[str, float]:
    """The clock reading (``time.perf_counter()``, started at ``t_start``) by which each training stage must end.

    The last stage that trains must end when the budget does, less the final export (and the WiSE-FT interpolation
    when one follows). Each earlier stage must end early enough to leave the stages after it the seconds the plan gave
    them (their steps x their measured step time, and for the source stage its refreshes and K-Means): a stage that
    runs slower than measured is cut short, and a later stage keeps its steps unless it overruns too. Planned
    seconds come from ``plan["throughput"]``; a plan without it (fixed steps, no budget) has no deadlines."""
    tp = plan.get("throughput")
    if not tp or plan.get("budget_seconds") is None:
        return {}
    step_s = stage_step_seconds(tp, cfg)
    seconds = {stage: plan[f"{stage}_steps"] * step_s[stage] for stage in step_s}
    runs = int(plan.get("coco_runs", 1))
    seconds["coco"] = seconds["coco"] * runs + (runs - 1) * STAGE_LOAD_SECONDS
    if plan["finetune_steps"]:
        seconds["finetune"] += plan["refreshes"] * plan.get("refresh_seconds_each", 0.0) + plan.get(
            "kmeans_seconds", 0.0)
    tail = STAGE_LOAD_SECONDS * (1 + uses_wise(cfg))
    end = t_start + float(plan["budget_seconds"]) - tail
    out: dict[str, float] = {}
    for stage in ("target", "finetune", "coco"):  # backwards from the end of the budget
        if plan[f"{stage}_steps"] > 0:  # (a joint plan gives the target stage no steps of its own)
            out[stage] = end
            end -= seconds[stage]
    return out


def is_joint(cfg: RecipeConfig) -> bool:
    """Whether the target pseudo pairs train as a term of the source steps (rather than as a stage of their own)."""
    return cfg.target_schedule == "joint" and cfg.target_pairs != "none" and not cfg.skip_finetune


def _run_start_eval(model: str, evals: list[str], out: Path, batch_size: int) -> dict[str, dict]:
    """The starting model on the ``--eval`` splits, cached in ``OUT/start_eval.json`` (keyed by spec)."""
    from .evaluation.retrieval import evaluate_retrieval

    path = out / "start_eval.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if cached.get("model") != model:
        cached = {"model": model, "results": {}}
    todo = [s for s in evals if "hybrid" not in cached["results"].get(s, {})]
    if todo:

        st = load_encoder(model)
        for spec in todo:
            folder, split = parse_eval_spec(spec)
            res = evaluate_retrieval(st, folder, split, show_progress_bar=False, batch_size=batch_size, hybrid=True)
            cached["results"][spec] = split_hybrid(res)
            atomic_write_json(path, cached)
    return {s: cached["results"][s] for s in evals}


SUMMARY_KEYS = ("ndcg@10", "recall@100", "mrr@10", "num_queries", "num_docs")
CHANNEL_KEYS = ("ndcg@10", "recall@100", "mrr@10")


def split_hybrid(result: dict[str, Any]) -> dict[str, Any]:
    """A hybrid evaluation as the recipe reports it: the dense model's metrics at the top level (the model is what
    the recipe trains), with ``"bm25"`` and ``"hybrid"`` beside them."""
    return {**{k: result["dense"][k] for k in SUMMARY_KEYS}, "bm25": {k: result["bm25"][k] for k in CHANNEL_KEYS},
            "hybrid": {**{k: result[k] for k in CHANNEL_KEYS}, "fusion": result["fusion"]}}


# ---------------------------------------------------------------------------------------------- the recipe
def run_recipe(
    model: str,
    target_corpora: list[str],
    source_data: str,
    output_dir: str | os.PathLike,
    *,
    evals: list[str] | tuple[str, ...] = (),
    config: RecipeConfig | dict | None = None,
    max_minutes: float | None = None,
    resume: bool = True,
    overwrite_output_dir: bool = False,
) -> dict[str, Any]:
    """Run COCO → source fine-tuning → target pseudo pairs → WiSE-FT → export → card → evaluation.

    Returns ``{eval_spec: {"ndcg@10", "recall@100", ..., "start": {...}}}``: each split's metrics for the adapted
    model, with the starting model's beside them (``"start"``, unless ``evaluate_start`` is off).

    Args:
        model: starting encoder (sentence-transformers directory, raw checkpoint or Hub id). Its pooling and
            similarity are kept (raw checkpoints: CLS + dot, the COCO-DR convention).
        target_corpora: BEIR folders / JSONL files of the target domain (only their documents are read).
        source_data: a BEIR folder with labelled ``qrels/<source_split>.tsv``.
        output_dir: ``OUT``; stages go to ``OUT/coco``, ``OUT/finetune``, ``OUT/target`` and ``OUT/wise``, the final
            model to ``OUT/model``.
        evals: ``DIR:SPLIT`` specifications evaluated on the final model (and on the starting model).
        max_minutes: the training budget: the stages are sized so that the run, apart from the evaluations asked
            for, takes this long on this machine, and a stage whose steps run slower than measured stops at its
            deadline with fewer steps (``OUT/plan.json`` has the plan and its measured inputs, ``OUT/recipe.json``
            the actual time and steps of each stage and which stages a deadline stopped). A resumed run gets the
            budget anew for what is left.
        resume: continue unfinished stages from their latest complete checkpoint and skip the finished stages
            whose inputs (model, data, settings, plan, the stage before) are unchanged; a stage whose inputs changed
            runs again, and so does every stage after it. ``False`` starts over, which needs
            ``overwrite_output_dir`` when ``OUT`` holds an earlier run.
        overwrite_output_dir: write into an ``OUT`` that holds files hf_cocodr did not write (they stay untouched),
            and, with ``resume=False``, replace an earlier run's files. ``OUT`` is claimed before any work (owner
            record ``hf_cocodr_run.json`` and a lock, see :mod:`hf_cocodr.run_record`).
    """
    from .methods import validate_methods
    from .modeling.condenser import checkpoint_has_mlm_head

    t_start = time.perf_counter()
    cfg = config if isinstance(config, RecipeConfig) else RecipeConfig.from_dict(dict(config or {}))
    cfg.validate()
    evals = list(evals)
    for spec in evals:
        parse_eval_spec(spec)  # fail early on a bad --eval
    if max_minutes is not None and not (math.isfinite(max_minutes) and max_minutes > 0):

        raise ConfigError(f"max_minutes must be a positive number, got {max_minutes!r}")
    has_mlm = checkpoint_has_mlm_head(model) if os.path.exists(str(model)) else None
    cfg, choice = choose_schedule(cfg, has_mlm)
    if not target_corpora:
        if cfg.skip_coco is False and "skip_coco" in choice["set_by_user"]:

            raise ConfigError("at least one target corpus is needed for COCO (or set skip_coco)")
        cfg.skip_coco, cfg.target_pairs = True, "none"  # nothing of the target domain to read
        if cfg.skip_finetune is True and "skip_finetune" in choice["chosen"]:  # the schedule left it out, not you
            cfg.skip_finetune, cfg.finetune_share = False, 1.0
            choice["chosen"].update(skip_finetune=False, finetune_share=1.0)
        logger.warning("no target corpus given: no COCO and no target pseudo pairs, only the source fine-tuning")
    if not any(on for on, _ in stage_switches(cfg).values()):
        raise ConfigError("nothing to train: COCO, the source fine-tuning and the target pseudo pairs are all off "
                          f"(skip_coco={cfg.skip_coco}, skip_finetune={cfg.skip_finetune}, target_pairs="
                          f"{cfg.target_pairs}); switch one on")
    check_recipe_lengths(model, cfg)  # token lengths against the model's position limit (its config.json only)
    if max_minutes is not None:  # a budget the fixed model loads + exports alone use up
        check_budget_floor(max_minutes, STAGE_LOAD_SECONDS, coco=not cfg.skip_coco, wise=uses_wise(cfg))
    methods = validate_methods(cfg.methods, target_corpora, cfg.target_queries)  # fail before any stage runs
    refuse_eval_overlap(cfg.target_queries, evals)  # no run trains on the queries it is evaluated on
    logger.info("recipe schedule for %s: %s (%s); chosen: %s; set by you: %s", model, choice["kind"], choice["why"],
                choice["chosen"] or "nothing", choice["set_by_user"] or "nothing")

    fps = {"model": fingerprint(model), "targets": fingerprint([str(t) for t in target_corpora]),
           "source": fingerprint(str(source_data))}
    run = RunFolder.claim(output_dir, "recipe", None if resume else fps, resume=resume,
                          overwrite=overwrite_output_dir, writes=RECIPE_ENTRIES)
    run.expect(RECIPE_ENTRIES)
    try:
        return _run_stages(model, list(target_corpora), source_data, Path(output_dir), evals, cfg, choice, has_mlm,
                           methods, max_minutes, resume, t_start, fps)
    finally:
        run.release()


def _run_stages(model, target_corpora, source_data, out: Path, evals, cfg: RecipeConfig, choice, has_mlm, methods,
                max_minutes, resume, t_start, fps) -> dict[str, Any]:
    """The stages of :func:`run_recipe` in its claimed output folder."""
    run = _RecipeRun(model, list(target_corpora), source_data, out, evals, cfg, choice, has_mlm, methods,
                     max_minutes, resume, t_start, fps)
    run.load_data()
    run.make_plan()
    run.stage("coco", not cfg.skip_coco and run.plan["coco_steps"] > 0, run.train_coco)
    run.stage("finetune", not cfg.skip_finetune and run.plan["finetune_steps"] > 0, run.train_finetune)
    run.stage("target", cfg.target_pairs != "none" and not is_joint(cfg) and run.plan["target_steps"] > 0,
              run.train_target)
    run.stage("wise", uses_wise(cfg) and run.current != model, run.interpolate)
    return run.finish()


class _RecipeRun:
    """The state one :func:`run_recipe` call carries from stage to stage: settings, plan, data, the current model."""

    def __init__(self, model, target_corpora, source_data, out: Path, evals, cfg: RecipeConfig, choice, has_mlm,
                 methods, max_minutes, resume, t_start, fps):
        self.model, self.target_corpora, self.source_data, self.out = model, target_corpora, source_data, out
        self.evals, self.cfg, self.choice, self.has_mlm, self.methods = evals, cfg, choice, has_mlm, methods
        self.max_minutes, self.resume, self.t_start, self.fps = max_minutes, resume, t_start, fps
        self.pooling, self.similarity = _model_similarity(model)
        logger.info("recipe: starting model %s (%s pooling, %s similarity); targets %s; source %s:%s",
                    model, self.pooling, self.similarity, ", ".join(map(str, target_corpora)), source_data,
                    cfg.source_split)
        self.dirs = {s: out / s for s in ("coco", "finetune", "target", "wise")}
        self.final_dir = out / "model"
        self.stage_seconds: dict[str, float] = {}  # a stage skipped on a re-run keeps the seconds its marker recorded
        self.coco_kw, self.ft_kw, self.target_kw = self._stage_kwargs()
        # The plan (kept in OUT/plan.json for the inputs it was made for) and each stage's identity: a finished stage
        # is skipped only when its identity (its inputs, settings, steps and the stage before it) is unchanged.
        self.plan_id = digest({"inputs": fps, "max_minutes": max_minutes, "config": {
            k: v for k, v in asdict(cfg).items() if k not in ("wise_alpha", "evaluate_start", "eval_batch_size",
                                                             "save_hybrid")}})
        self.plan = _fixed_plan(cfg) if max_minutes is None else _saved_plan(out, self.plan_id)
        self.ids = self._ids() if self.plan else {}
        self.train_data = self.target_data = self.spans = None
        self.coco_corpora: list = []
        self.current = model
        self.precision = _precision_choice(cfg)
        self.deadlines: dict[str, float] = {}  # stage -> perf_counter reading it must end by (budgeted runs only)
        logger.info("recipe precision: %s (%s)", self.precision["training"], self.precision["why"])

    def _stage_kwargs(self) -> tuple[dict, dict, dict]:
        """The training arguments of the COCO, source fine-tuning and target pseudo-pair stages (the user's
        ``coco`` / ``finetune`` / ``target`` options over the recipe's defaults)."""
        cfg, similarity, dirs = self.cfg, self.similarity, self.dirs
        coco = dict(output_dir=str(dirs["coco"]), seed=cfg.seed, report_to="none", logging_steps=10,
                    logging_first_step=True, save_strategy="steps", save_steps=100, save_total_limit=1,
                    per_device_train_batch_size=32, pooling=self.pooling, contrastive_similarity=similarity,
                    contrastive_temperature=0.05 if similarity == "cosine" else 1.0,
                    learning_rate=float(cfg.coco_learning_rate), mlm_weight=float(cfg.coco_mlm_weight),
                    head_mlm_weight=float(cfg.coco_mlm_weight), use_cpu=_no_gpu(), disable_tqdm=True,
                    max_span_length=min(64, cfg.train_max_length))
        ft = dict(output_dir=str(dirs["finetune"]), seed=cfg.seed, report_to="none", logging_steps=5,
                  logging_first_step=True, save_strategy="steps", save_steps=50, save_total_limit=1,
                  per_device_train_batch_size=32, num_clusters=50, learning_rate=2e-5, use_cpu=_no_gpu(),
                  disable_tqdm=True, idro_scale=20.0 if similarity == "cosine" else 1.0, num_negatives=1,
                  dataloader_drop_last=True, warmup_steps=0.1, max_length=cfg.train_max_length,
                  # tau sets how fast the cluster weights move; the gradient inner products scale with the
                  # similarity (cosine x 20 vs raw dot products), see reports/reproduction.md for the sweep
                  idro_tau=100.0 if similarity == "cosine" else 3000.0)
        # Pseudo pairs have no query types to rebalance: plain contrastive loss, BM25 negatives from the target corpus
        target = {**ft, "output_dir": str(dirs["target"]), "idro_preset": "uniform"}
        return {**coco, **cfg.coco}, {**ft, **cfg.finetune}, {**target, **cfg.target}

    def _ids(self) -> dict[str, str]:
        return _stage_ids(self.plan, self.cfg, self.fps, self.coco_kw, self.ft_kw, self.target_kw)

    def done(self, stage: str) -> bool:
        return stage in self.ids and _stage_done(self.dirs[stage], self.ids[stage]) is not None

    # ------------------------------------------------------------------------------------------- data and plan
    def load_data(self) -> None:
        """The source training data and the target pseudo pairs, for the stages that still have to run."""

        cfg, t0 = self.cfg, time.perf_counter()
        need_source = (not cfg.skip_finetune and not self.done("finetune")) or (
            not cfg.skip_coco and cfg.include_source_corpus and not self.done("coco"))
        if need_source:
            self.train_data = self._draw_source(self._source_queries())
        if cfg.target_pairs != "none" and not self.done("finetune" if is_joint(cfg) else "target"):
            self.target_data = self._target_pairs()
        self.coco_corpora = list(self.target_corpora)
        if cfg.include_source_corpus and self.train_data is not None:
            self.coco_corpora.append(_source_pool_dataset(self.train_data))
        self.stage_seconds["data"] = round(time.perf_counter() - t0, 1)

    def _sizes_source(self) -> bool:
        """Whether the budget sizes the source draw: a budgeted run whose fine-tuning still has to run, with
        ``max_queries`` unset."""
        cfg = self.cfg
        return (self.max_minutes is not None and cfg.max_queries is None and not cfg.skip_finetune
                and not self.done("finetune"))

    def _source_queries(self) -> int | None:
        """The source queries to draw now: ``max_queries``; or the count a saved plan sized; or, before a sized
        plan exists, :data:`SIZE_PROBE_QUERIES` to time the steps on."""
        if not self._sizes_source():
            return self.cfg.max_queries
        if self.plan is not None and "source_queries" in self.plan:
            return int(self.plan["source_queries"])
        return SIZE_PROBE_QUERIES

    def _draw_source(self, max_queries: int | None) -> RetrievalTrainingData:
        cfg = self.cfg
        return RetrievalTrainingData.from_beir(self.source_data, cfg.source_split, negatives="bm25",
                                               max_queries=max_queries, seed=cfg.seed, corpus_pool=cfg.corpus_pool)

    def _target_pairs(self):
        return target_pseudo_pairs(list(self.target_corpora), self.cfg.target_pairs, seed=self.cfg.seed)

    def make_plan(self) -> None:
        """Measure this machine's step times and size the stages to the budget (unless ``plan.json`` holds the plan
        for these inputs, or the steps are fixed)."""
        from .finetuning import IDROTrainingArguments
        from .pretraining import CocoPretrainingArguments

        cfg = self.cfg
        if not cfg.skip_coco and not self.done("coco"):
            self.spans = self._span_corpus()
        if self.plan is None:
            t0 = time.perf_counter()
            tp = measure_throughput(self.model, CocoPretrainingArguments(**{**self.coco_kw, "max_steps": 1}),
                                    IDROTrainingArguments(**{**self.ft_kw, "max_steps": 1}), self.spans,
                                    self.train_data if not cfg.skip_finetune else None, self.pooling,
                                    target_args=IDROTrainingArguments(**{**self.target_kw, "max_steps": 1}),
                                    target_data=self.target_data)
            measured_s = time.perf_counter() - t0
            # spent so far, plus about 20 s (2 CPU cores) per model load + export: the final one, COCO's, WiSE-FT's
            overhead = (time.perf_counter() - self.t_start) + STAGE_LOAD_SECONDS * (
                1 + (not cfg.skip_coco) + uses_wise(cfg))
            data, sized = self.train_data, {}
            idro = self.ft_kw.get("idro_preset", "paper") != "uniform"
            pool_docs, n_queries = (len(data.corpus), len(data)) if data is not None else (0, 0)
            if data is not None and self._sizes_source():
                # the draw the steps can use; mining it again is charged at the probe draw's seconds per query
                mining = data.mining_seconds / max(1, len(data))
                q = size_source_queries(
                    self.max_minutes * 60.0, tp, cfg, overhead_s=overhead, available=data.available_queries,
                    pool_docs_per_query=len(data.corpus) / max(1, len(data)), max_pool_docs=data.full_corpus_docs,
                    mining_s_per_query=mining,
                    batch=self.ft_kw["per_device_train_batch_size"] * self.ft_kw.get("gradient_accumulation_steps", 1),
                    idro=idro)
                redraw = q != len(data)
                pool_docs = int(min(data.full_corpus_docs, round(q * len(data.corpus) / max(1, len(data)))))
                n_queries, overhead = q, overhead + (q * mining if redraw else 0.0)
                sized = {"source_queries": q, "source_queries_available": data.available_queries,
                         "mining_seconds_per_query": round(mining, 6)}
            plan = plan_budget(self.max_minutes * 60.0, tp, cfg, overhead_s=overhead, pool_docs=pool_docs,
                               n_queries=n_queries, idro=idro)
            plan.update(sized)
            plan.update(max_minutes=self.max_minutes, throughput={k: round(v, 4) for k, v in tp.items()},
                        measure_seconds=round(measured_s, 1), identity=self.plan_id)
            on = stage_switches(cfg)  # a budget below one step of each stage is refused before any training
            check_budget_buys_steps(plan, {s: v for s, v in stage_step_seconds(tp, cfg).items() if on[s][0]},
                                    load_s=STAGE_LOAD_SECONDS)
            logger.info("recipe plan for %.0f minutes of training: measured %s; COCO %d run(s) of %d steps, source "
                        "fine-tuning %d steps with %d negative refresh(es), target pairs %d steps; %.0f%% of the budget "
                        "planned for optimizer steps (evaluation not included)", self.max_minutes, plan["throughput"],
                        plan["coco_runs"], plan["coco_steps"], plan["finetune_steps"], plan["refreshes"],
                        plan["target_steps"], 100 * (plan["planned_optimizer_share"] or 0))
            atomic_write_json(self.out / "plan.json", plan)
            self.plan = plan
            self.ids = self._ids()
            if "source_queries" in plan and plan["source_queries"] != len(self.train_data):
                logger.info("recipe: the budget's steps use %d of %d source queries: drawing them", plan["source_queries"],
                            plan["source_queries_available"])
                self.train_data = self._draw_source(plan["source_queries"])
                self.coco_corpora = list(self.target_corpora)
                if cfg.include_source_corpus:
                    self.coco_corpora.append(_source_pool_dataset(self.train_data))
                if not cfg.skip_coco and not self.done("coco") and cfg.include_source_corpus:
                    self.spans = self._span_corpus()
        if self.max_minutes is not None:
            self.deadlines = stage_deadlines(self.plan, cfg, self.t_start)
        self.stage_seconds["planning"] = round(
            time.perf_counter() - self.t_start - sum(self.stage_seconds.values()), 1)

    def _span_corpus(self):
        from transformers import AutoTokenizer

        from .modeling.condenser import _transformer_dir
        from .pretraining import CocoPretrainingArguments

        probe = CocoPretrainingArguments(**{**self.coco_kw, "max_steps": 1})
        return SpanCorpus.build(self.coco_corpora, AutoTokenizer.from_pretrained(_transformer_dir(self.model)),
                                mode=probe.span_mode, span_max_tokens=probe.span_max_tokens,
                                span_break_prob=probe.span_break_prob, seed=self.cfg.seed)

    # ------------------------------------------------------------------------------------------- stages
    def stage(self, name: str, enabled: bool, train: Callable[[], None]) -> None:
        """Run stage ``name`` (skipped when it finished with the same inputs); the next stage starts from it."""
        if not enabled:
            return
        t0 = time.perf_counter()
        if self.done(name):
            logger.info("stage %s: already finished (%s) with the same inputs, skipped", name, self.dirs[name])
        else:
            _log_rerun(self.dirs[name])
            train()
        self.current = str(self.dirs[name])
        self.stage_seconds[name] = _stage_seconds(self.dirs[name], t0)

    def train_coco(self) -> None:
        runs = int(self.plan.get("coco_runs", 1))
        if runs == 1:
            marker = self._coco_run(self.dirs["coco"], self.cfg.seed, self.deadlines.get("coco"))
            _mark_done(self.dirs["coco"], {**marker, "identity": self.ids["coco"]})
            return
        # A soup: `runs` COCO runs from the starting model with seeds seed, seed + 1, ..., each in its own folder
        # (resumable, skipped once finished), then the uniform average of their weights is the stage's model.
        run_dirs, markers = [], []
        per_run_s = self._coco_run_seconds()
        for i in range(runs):
            run_dir, identity = self.out / "coco-runs" / f"run-{i}", digest({"coco": self.ids["coco"], "run": i})
            marker = _stage_done(run_dir, identity)
            if marker is None:
                _log_rerun(run_dir)
                end = self.deadlines.get("coco")
                # each run ends early enough to leave the runs after it their planned seconds
                marker = self._coco_run(run_dir, self.cfg.seed + i,
                                        None if end is None else end - (runs - 1 - i) * per_run_s)
                marker = {**marker, "identity": identity}
                _mark_done(run_dir, marker)
            else:
                logger.info("COCO run %d of %d: already finished (%s), skipped", i + 1, runs, run_dir)
            run_dirs.append(run_dir)
            markers.append(marker)
        _soup_stage(run_dirs, self.dirs["coco"], [self.cfg.seed + i for i in range(runs)])
        stopped = [m["stopped_by_deadline_at_step"] for m in markers if "stopped_by_deadline_at_step" in m]
        run_steps = [m["steps"] for m in markers]
        _mark_done(self.dirs["coco"], {"steps": min(run_steps), "run_steps": run_steps, "identity": self.ids["coco"],
                                       **({"stopped_by_deadline_at_step": min(stopped)} if stopped else {})})

    def _coco_run_seconds(self) -> float:
        """Planned seconds of one COCO run (its steps at the measured step time, and its load + export)."""
        tp = self.plan.get("throughput") or {}
        return self.plan["coco_steps"] * tp.get("coco_step_s", 0.0) + STAGE_LOAD_SECONDS

    def _coco_run(self, run_dir: Path, seed: int, end: float | None) -> dict[str, Any]:
        """One COCO run from the starting model into ``run_dir`` (ending by the clock reading ``end`` if given);
        returns its marker (steps trained, and the step a deadline stopped it at)."""
        from .pretraining import CocoPretrainer, CocoPretrainingArguments

        kw = {**self.coco_kw, "output_dir": str(run_dir), "seed": seed, "max_steps": self.plan["coco_steps"],
              "overwrite_output_dir": True}
        if (self.has_mlm is not True and "mlm_head_warmup_steps" not in self.cfg.coco
                and CocoPretrainingArguments(**{**kw, "max_steps": 1}).uses_mlm):
            kw["mlm_head_warmup_steps"] = int(MLM_HEAD_WARMUP_SHARE * self.plan["coco_steps"])
            logger.info("the starting model has no MLM head (or it could not be inspected): its head is warmed up "
                        "for %d steps before MLM gradients reach the encoder", kw["mlm_head_warmup_steps"])
        trainer = CocoPretrainer(self.model, CocoPretrainingArguments(**kw), corpora=self.coco_corpora)
        guard = self._deadline(trainer, "coco", end)
        trainer.train(resume_from_checkpoint=True if self.resume else None)
        trainer.finalize()
        return {"steps": trainer.state.global_step, "seed": seed, **_stopped(guard)}

    def _deadline(self, trainer, stage: str, end: float | None = None):
        """Give ``trainer`` the stage's wall-clock deadline (or ``end``; budgeted runs only); returns the callback or
        None."""
        if stage not in self.deadlines:
            return None
        from .finetuning.callbacks import WallClockDeadline

        guard = WallClockDeadline(self.deadlines[stage] if end is None else end, name=f"recipe stage {stage}")
        logger.info("stage %s: must end within %.0f s (its share of the budget)", stage, guard.seconds_left())
        trainer.add_callback(guard)
        return guard

    def train_finetune(self) -> None:
        from .finetuning import IDROTrainingArguments

        cfg, steps, refreshes = self.cfg, self.plan["finetune_steps"], self.plan["refreshes"]
        every = max(1, steps // (refreshes + 1)) if refreshes else 0
        args = IDROTrainingArguments(**{"refresh_negatives_every_steps": every, **self.ft_kw, "max_steps": steps,
                                        "overwrite_output_dir": True})
        joint = None
        if is_joint(cfg):
            from .methods.joint import TargetPairsObjective

            kw = self.target_kw
            joint = TargetPairsObjective(self.target_data, cfg.joint_weight,
                                         batch_size=kw["per_device_train_batch_size"],
                                         num_negatives=kw["num_negatives"], similarity=self.similarity,
                                         scale=kw["idro_scale"], max_length=kw["max_length"], seed=cfg.seed)
        _train_finetune_stage(self.current, args, self.train_data, self.dirs["finetune"], methods=self.methods,
                              target_corpora=list(self.target_corpora), negatives_label="bm25",
                              target_queries=list(cfg.target_queries), resume=self.resume, joint=joint,
                              identity=self.ids["finetune"], deadline=lambda t: self._deadline(t, "finetune"))

    def train_target(self) -> None:
        from .finetuning import IDROTrainingArguments

        args = IDROTrainingArguments(**{"refresh_negatives_every_steps": 0, **self.target_kw,
                                        "max_steps": self.plan["target_steps"], "overwrite_output_dir": True})
        _train_finetune_stage(self.current, args, self.target_data, self.dirs["target"],
                              negatives_label="bm25 (within the target corpora)", identity=self.ids["target"],
                              deadline=lambda t: self._deadline(t, "target"))

    def interpolate(self) -> None:
        _wise_stage(self.model, self.current, self.dirs["wise"], float(self.cfg.wise_alpha), self.ids["wise"])

    # ------------------------------------------------------------------------------------------- export + evaluation
    def finish(self) -> dict[str, Any]:
        """Export the final model, evaluate it (and the starting model), write the card, ``eval.json`` and
        ``recipe.json``; returns the summary."""
        from .training_api import evaluate_all

        t0 = time.perf_counter()
        if self.current == self.model:
            export_sentence_transformer(self.model, self.final_dir, pooling=self.pooling,
                                        similarity=self.similarity, run_record=False)
        else:
            _export_final(Path(self.current), self.final_dir)
        seconds = self.stage_seconds
        seconds["export"] = round(time.perf_counter() - t0, 1)
        train_seconds = round(sum(seconds.values()), 1)  # data + planning + stages + export
        t0 = time.perf_counter()
        final = load_encoder(str(self.final_dir))
        results = evaluate_all(final, self.evals, self.final_dir, batch_size=self.cfg.eval_batch_size, hybrid=True)
        summary = {spec: split_hybrid(r) for spec, r in results.items()}
        seconds["evaluation"] = round(time.perf_counter() - t0, 1)
        if self.evals and self.cfg.evaluate_start:
            self._add_start(summary)
        if self.cfg.save_hybrid and self.target_corpora:
            t0 = time.perf_counter()
            self._save_hybrids(final)
            seconds["hybrid_retrievers"] = round(time.perf_counter() - t0, 1)
        self._write_records(summary, train_seconds)
        logger.info("recipe finished: training %.1f minutes%s, evaluation %.1f minutes", train_seconds / 60,
                    f" (budget {self.max_minutes:g})" if self.max_minutes is not None else "",
                    (seconds["evaluation"] + seconds.get("start_evaluation", 0.0)) / 60)
        return summary

    def _save_hybrids(self, model) -> None:
        """A hybrid retriever (the final model + BM25) for each target corpus in ``OUT/hybrid/<corpus name>``."""
        names: dict[str, int] = {}
        for corpus in self.target_corpora:
            path = Path(str(corpus))
            name = path.name if path.name != "corpus.jsonl" else path.parent.name
            names[name] = names.get(name, 0) + 1
            folder = self.out / "hybrid" / (name if names[name] == 1 else f"{name}-{names[name]}")
            try:
                hybrid = HybridRetriever.build(model, corpus, batch_size=self.cfg.eval_batch_size)
            except BEIRFormatError as e:  # a plain text corpus (no document ids) trains COCO but cannot be searched
                logger.warning("no hybrid retriever for %s: %s", corpus, e)
                continue
            hybrid.save(folder)
            logger.info("hybrid retriever for %s saved in %s (HybridRetriever.load)", corpus, folder)

    def _add_start(self, summary: dict) -> None:
        t0 = time.perf_counter()
        for spec, start in _run_start_eval(self.model, self.evals, self.out, self.cfg.eval_batch_size).items():
            summary[spec]["start"] = start
            logger.info("%s: nDCG@10 %.4f adapted vs %.4f starting model (%+.4f)", spec, summary[spec]["ndcg@10"],
                        start["ndcg@10"], summary[spec]["ndcg@10"] - start["ndcg@10"])
        self.stage_seconds["start_evaluation"] = round(time.perf_counter() - t0, 1)

    def _steps_trained(self) -> dict[str, Any]:
        """The steps each training stage ran (from its completion marker) and, where a wall-clock deadline ended a
        stage before its planned steps, the step it stopped at."""
        markers = {s: _stage_done(self.dirs[s], self.ids[s]) for s in ("coco", "finetune", "target") if s in self.ids}
        markers = {s: m for s, m in markers.items() if m is not None and "steps" in m}
        return {"steps_trained": {s: m["steps"] for s, m in markers.items()},
                "stopped_by_deadline": {s: m["stopped_by_deadline_at_step"] for s, m in markers.items()
                                        if "stopped_by_deadline_at_step" in m}}

    def _write_records(self, summary: dict, train_seconds: float) -> None:
        record = {"model": self.model, "target_corpora": list(map(str, self.target_corpora)),
                  "source_data": str(self.source_data), "evals": self.evals, "config": asdict(self.cfg),
                  "schedule": self.choice, "precision": self.precision, "plan": self.plan,
                  "stage_seconds": self.stage_seconds, **self._steps_trained(),
                  "train_seconds": train_seconds, "wall_seconds": round(time.perf_counter() - self.t_start, 1)}
        if self.max_minutes is not None:
            record["budget_seconds"] = round(self.max_minutes * 60.0, 1)
            record["train_over_budget_seconds"] = round(train_seconds - self.max_minutes * 60.0, 1)
        keys = ("ndcg@10", "recall@100")

        def row(v: dict) -> dict:
            return {**{k: v[k] for k in keys}, **{ch: {k: v[ch][k] for k in keys} for ch in ("bm25", "hybrid")
                                                 if ch in v}}

        write_model_card(self.final_dir, load_encoder(str(self.final_dir)), {
            "recipe_schedule": self.choice,
            "start_vs_adapted": {s: {"adapted": row(v), "start": row(v["start"])}
                                 for s, v in summary.items() if "start" in v}})
        atomic_write_json(self.out / "eval.json", summary)
        atomic_write_json(self.out / "recipe.json", record)


def _precision_choice(cfg: RecipeConfig) -> dict[str, Any]:
    """The training precision of the stages and why (logged and kept in ``recipe.json``). bf16 is only ever the
    user's choice (``bf16: true`` in a stage's options): where this machine has no native bf16 kernels it is many
    times slower (docs/precision.md), and where it has them no measurement here has yet
    shown the >= 1.2x speed-up without quality loss that a default would need."""
    asked = sorted(stage for stage in ("coco", "finetune", "target") if getattr(cfg, stage).get("bf16"))
    native = native_bf16()
    if asked:
        why = "set in the options of " + ", ".join(asked) + ("" if native else
                                                             "; this machine has no native bf16: expect it slower")
        return {"training": "bf16 (" + ", ".join(asked) + ")", "native_bf16": native, "why": why}
    why = ("this machine has native bf16, but it is not measured here to pay: set bf16: true in a stage's options to "
           "use it" if native else "this machine has no native bf16 kernels, where bf16 runs many times slower")
    return {"training": "fp32", "native_bf16": native, "why": why}


def _stage_seconds(stage_dir: Path, t0: float) -> float:
    """Seconds the stage took: measured now, or (a stage finished by an earlier run) as its marker recorded them."""
    marker = _stage_done(stage_dir) or {}
    if "seconds" not in marker:
        marker = {**marker, "seconds": round(time.perf_counter() - t0, 1)}
        _mark_done(stage_dir, marker)
    return float(marker["seconds"])


def _given(steps: int | None, skipped: bool) -> int:
    return 0 if skipped else (500 if steps is None else steps)


def _train_finetune_stage(start: str, args, data, stage_dir: Path, *, methods=(), target_corpora=(),
                          negatives_label: str = "bm25", target_queries=(), resume: bool = True,
                          joint=None, identity: str | None = None,
                          deadline: Callable[[Any], Any] | None = None) -> None:
    from .training_api import build_idro_trainer

    trainer = build_idro_trainer(load_encoder(start), args, data, methods=methods, target_corpora=target_corpora,
                                 negatives_label=negatives_label, target_queries=target_queries)
    if joint is not None:  # joint schedule: target pseudo pairs as a term of every step
        trainer.idro_loss.auxiliary.append(joint)
        trainer.extra_methods.append("pseudo-pairs")
        trainer.target_corpora_read = list(dict.fromkeys(trainer.target_corpora_read + list(joint.pairs.corpora)))
    guard = deadline(trainer) if deadline is not None else None
    trainer.train(resume_from_checkpoint=True if resume else None)
    trainer.finalize()
    _save_weight_history(trainer, stage_dir)
    _mark_done(stage_dir, {"steps": trainer.state.global_step, "identity": identity, **_stopped(guard)})


def _stopped(guard) -> dict[str, Any]:
    """The stage marker's note that a deadline ended the stage early (nothing when it ran all its steps)."""
    if guard is None or guard.stopped_at_step is None:
        return {}
    return {"stopped_by_deadline_at_step": guard.stopped_at_step}


def _wise_stage(start: str, adapted: str, stage_dir: Path, alpha: float, identity: str | None = None) -> None:
    """WiSE-FT of the last stage's model with the starting model, written as a complete model directory."""
    from .modeling.wise import wise_ensemble
    from .training_api import previous_training_info

    st = wise_ensemble(load_encoder(start), load_encoder(adapted), alpha)
    prev = previous_training_info(adapted)
    stage = {"type": "wise", "method": "wise-ft", "title": "WiSE-FT weight-space ensemble with the starting model",
             "alpha": alpha, "weights": f"{1 - alpha:g} x starting model + {alpha:g} x adapted model"}
    card = {"stages": list(prev.get("stages", [])) + [stage],
            "methods": list(dict.fromkeys(list(prev.get("methods", [])) + ["wise-ft"])),
            "datasets": list(prev.get("datasets", [])), "base_model": prev.get("base_model")}
    with atomic_directory(stage_dir) as tmp:
        st.save(str(tmp))
        for name in (TRAINING_INFO_FILE,):
            if (Path(adapted) / name).is_file():
                shutil.copy2(Path(adapted) / name, tmp / name)
        write_model_card(tmp, st, card)
        _mark_done(tmp, {"alpha": alpha, "start": start, "adapted": adapted, "identity": identity})


def _soup_stage(run_dirs: list[Path], stage_dir: Path, seeds: list[int]) -> None:
    """The uniform weight average of the COCO runs in ``run_dirs``, written to ``stage_dir`` as a complete model
    directory whose card lists the first run's stages and the soup."""
    from .modeling.wise import soup
    from .training_api import previous_training_info

    st = soup([load_encoder(str(d)) for d in run_dirs])
    prev = previous_training_info(str(run_dirs[0]))
    stage = {"type": "soup", "method": "model-soup",
             "title": f"uniform weight average (model soup) of {len(run_dirs)} COCO runs",
             "runs": len(run_dirs), "seeds": seeds,
             "weights": f"the mean of the {len(run_dirs)} runs' weights; each run as the COCO stage above, "
                        "with its own seed"}
    card = {"stages": list(prev.get("stages", [])) + [stage],
            "methods": list(dict.fromkeys(list(prev.get("methods", [])) + ["model-soup"])),
            "datasets": list(prev.get("datasets", [])), "base_model": prev.get("base_model")}
    with atomic_directory(stage_dir) as tmp:
        st.save(str(tmp))
        if (run_dirs[0] / TRAINING_INFO_FILE).is_file():
            shutil.copy2(run_dirs[0] / TRAINING_INFO_FILE, tmp / TRAINING_INFO_FILE)
        write_model_card(tmp, st, card)


def _export_final(src: Path, dst: Path) -> None:
    """Copy the model files of the last stage (not its checkpoints) to ``dst``, atomically."""

    skip = {"trainer_state.json", "training_args.bin", STAGE_MARKER, "eval.json", "idro_weights.json", RECORD, LOCK}
    with atomic_directory(dst) as tmp:
        for p in src.iterdir():
            if p.name.startswith("checkpoint-") or p.name in skip or p.name.startswith("."):
                continue
            if p.is_dir():
                shutil.copytree(p, tmp / p.name)
            else:
                shutil.copy2(p, tmp / p.name)


def _save_weight_history(trainer, out: Path) -> None:
    atomic_write_json(out / "idro_weights.json", {
        "weights": trainer.weight_history,
        "clusterings": trainer.kmeans_callback.history if trainer.kmeans_callback else [],
        "log_history": trainer.state.log_history,
    })


def _source_pool_dataset(train_data):
    """The (restricted) source corpus as a dataset with title/text columns, for COCO."""
    ds = train_data.corpus.select_columns([c for c in ("title", "text") if c in train_data.corpus.column_names])
    ds.info.dataset_name = train_data.name.split(":")[0]
    return ds


def _corpus_size(folder: str) -> int:

    return len(load_corpus(folder))


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()
