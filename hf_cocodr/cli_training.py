"""Training sub-commands of ``hf-cocodr``: ``finetune`` (iDRO), ``pretrain`` (COCO) and ``recipe``.

Each accepts its own flags, ``--config FILE.yaml`` (any of its flags and any TrainingArguments field) and every
TrainingArguments flag after them (``--max_steps``, ``--learning_rate``, ...). Command-line values win over the
config file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from .cli import UsageError, register
from .config_types import check_field_types
from .data.beir import parse_eval_spec  # noqa: F401  (re-exported: part of the CLI's API)
from .recipe import RecipeConfig, run_recipe
from .utils import resolve_inside

logger = logging.getLogger("hf_cocodr.cli")


def load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--config {path}: file not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values")
    return {k.replace("-", "_"): v for k, v in data.items()}


def parse_training_args(cls, rest: list[str], defaults: dict[str, Any], prog: str, config: str | None = None):
    """TrainingArguments from ``defaults`` (config + our flags) overridden by the remaining command-line flags.

    The config values become the parser's defaults, so any flag given wins. Not ``HfArgumentParser.parse_yaml_file``:
    it takes no command line to override the file, names neither the file nor our flags for an unknown key ("Some
    keys are not used by the HfArgumentParser: ['learning_rat']") and took ``max_queries: abc`` without a word
    (checked with transformers 5.23).
    """
    from transformers import HfArgumentParser

    names = {f.name for f in fields(cls)}
    unknown = sorted(k for k in defaults if k not in names)
    if unknown:
        where = f" in --config {config}" if config else ""
        raise UsageError(f"unknown option(s) {unknown}{where} (not a flag of {prog} nor a {cls.__name__} field)")
    try:
        check_field_types(cls, defaults, f"--config {config}" if config else prog)
    except ValueError as e:
        raise UsageError(str(e)) from None

    class _Parser(HfArgumentParser):
        def error(self, message):  # one line instead of usage + traceback-free exit
            raise UsageError(f"{message} (see `{prog} --help`)")

    parser = _Parser(cls, prog=prog)
    parser.set_defaults(**{"report_to": "none", "logging_steps": 10, "logging_first_step": True, **defaults})
    (args, leftover) = parser.parse_args_into_dataclasses(args=rest, return_remaining_strings=True)
    if leftover:
        raise UsageError(f"unrecognized arguments: {' '.join(leftover)}")
    if not args.output_dir:
        raise UsageError("--output_dir is required")
    _check_config_paths(defaults, args.output_dir)
    return args


def _check_config_paths(config: dict[str, Any], output_dir: str) -> None:
    """Directories named in a config file (``logging_dir``, ...) must stay inside ``output_dir``."""
    for key, value in config.items():
        if key != "output_dir" and key.endswith("_dir") and isinstance(value, str) and value:
            try:
                resolve_inside(output_dir, value, what=f"config option {key}")
            except ValueError as e:
                raise UsageError(str(e)) from None


def _split_config(config: dict[str, Any], own: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values of our own flags, checked for their flag's type; the rest: TrainingArguments / recipe options)."""
    mine = {k: _own_value(k, v) for k, v in config.items() if k in own}
    return mine, {k: v for k, v in config.items() if k not in own}


_LIST_FLAGS = {"corpus", "eval", "eval_corpus", "method", "target_corpus", "target_queries"}
_INT_FLAGS = {"num_clusters", "refresh_negatives_every", "max_queries", "n_head_layers", "skip_from"}


def _own_value(key: str, value: Any) -> Any:
    """A config value of one of our flags: a path or list of paths (repeatable flags), a whole number or a name."""
    if key in _LIST_FLAGS:
        value = [value] if isinstance(value, str) else value
        ok, kind = isinstance(value, list) and all(isinstance(v, str) and v for v in value), "a path or a list of them"
    elif key in _INT_FLAGS:
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    elif key in ("tau", "max_minutes"):
        ok, kind = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    else:
        ok, kind = isinstance(value, str) and bool(value), "a non-empty string"
    if not ok:
        raise UsageError(f"--config option {key} must be {kind}, got {value!r}")
    return value


def _apply_own(ns: argparse.Namespace, own_config: dict[str, Any], parser_defaults: dict[str, Any]) -> None:
    """Config values for our own flags, unless the flag was given on the command line."""
    for k, v in own_config.items():
        if getattr(ns, k, None) == parser_defaults.get(k):
            setattr(ns, k, v)


# ------------------------------------------------------------------------------------------------------ finetune
FINETUNE_FLAGS = {"model", "train_data", "train_split", "idro_preset", "num_clusters", "tau", "negatives",
                  "refresh_negatives_every", "max_queries", "method", "config", "eval", "target_corpus",
                  "target_queries", "eval_during_training"}


def _add_finetune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="starting encoder (directory or Hub id)")
    p.add_argument("--train-data", dest="train_data", default=None, help="BEIR folder with labelled source data")
    p.add_argument("--train-split", dest="train_split", default="train")
    p.add_argument("--idro-preset", dest="idro_preset", default=None, choices=["paper", "reference", "groupdro", "uniform"])
    p.add_argument("--num-clusters", dest="num_clusters", type=int, default=None)
    p.add_argument("--tau", type=float, default=None)
    p.add_argument("--negatives", choices=["bm25", "none"], default="bm25")
    p.add_argument("--refresh-negatives-every", dest="refresh_negatives_every", type=int, default=None)
    p.add_argument("--max-queries", dest="max_queries", type=int, default=None, help="train on a random subset")
    p.add_argument("--method", action="append", default=None, metavar="NAME",
                   help="extra method(s) combined with the loss: a name registered in hf_cocodr.methods.registry "
                        "(built in: modir, berm, rmsc); repeatable")
    p.add_argument("--target-corpus", dest="target_corpus", action="append", default=None,
                   help="unlabelled target corpus (BEIR folder or JSONL) for MoDIR / RMSC; repeatable")
    p.add_argument("--target-queries", dest="target_queries", action="append", default=None,
                   help="unlabelled target queries for MoDIR (BEIR folder: its queries.jsonl, never its qrels; or a "
                        "JSONL file with a text field); repeatable. The model card records that they were read")
    p.add_argument("--eval", action="append", default=None, metavar="DIR:SPLIT",
                   help="evaluate the final model on this BEIR split (repeatable)")
    p.add_argument("--eval-during-training", dest="eval_during_training", default=None, metavar="DIR:SPLIT",
                   help="nDCG@10 (and Recall, MRR, MAP) on this labelled BEIR split every --eval_steps during "
                        "training (eval_strategy steps unless given); keep the split small")
    p.add_argument("--config", default=None, help="YAML file with any of these flags and TrainingArguments fields")


def _run_finetune(ns: argparse.Namespace, rest: list[str]) -> int:
    from .finetuning import IDROTrainingArguments

    config = load_config(ns.config)
    own_cfg, ta_cfg = _split_config(config, FINETUNE_FLAGS)
    _apply_own(ns, own_cfg, {"train_split": "train", "negatives": "bm25"})
    if not ns.model:
        raise UsageError("--model is required")
    if not ns.train_data:
        raise UsageError("--train-data is required (a BEIR folder with qrels/<split>.tsv)")
    mapped = {"idro_preset": ns.idro_preset, "num_clusters": ns.num_clusters, "idro_tau": ns.tau,
              "refresh_negatives_every_steps": ns.refresh_negatives_every}
    defaults = {**ta_cfg, **{k: v for k, v in mapped.items() if v is not None}}
    if ns.negatives == "none" and "num_negatives" not in defaults:
        defaults["num_negatives"] = 0
    if ns.eval_during_training:
        parse_eval_spec(ns.eval_during_training, "--eval-during-training")
        defaults.setdefault("eval_strategy", "steps")  # the command line's --eval_strategy still wins
    if not any(a == "--output_dir" or a.startswith("--output_dir=") or a == "--output-dir"
               or a.startswith("--output-dir=") for a in rest) and "output_dir" not in defaults:
        raise UsageError("--output_dir is required (the folder the fine-tuned model and its checkpoints go to)")
    args = parse_training_args(IDROTrainingArguments, rest, defaults, "hf-cocodr finetune", ns.config)
    from .training_api import run_finetune

    result = run_finetune(
        model=ns.model, train_data=ns.train_data, train_split=ns.train_split, args=args, negatives=ns.negatives,
        max_queries=ns.max_queries, methods=ns.method or [], evals=ns.eval or [],
        target_corpora=ns.target_corpus or [], target_queries=ns.target_queries or [],
        eval_during_training=ns.eval_during_training,
    )
    print(json.dumps(result))
    return 0


register("finetune", "iDRO fine-tuning on labelled source data (K-Means clusters, BM25 + self-mined negatives)",
         _add_finetune, _run_finetune, passthrough=True)


# ------------------------------------------------------------------------------------------------------ pretrain
PRETRAIN_FLAGS = {"model", "corpus", "n_head_layers", "skip_from", "config", "eval_corpus"}


def _add_pretrain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="starting encoder: sentence-transformers dir, checkpoint or Hub id")
    p.add_argument("--corpus", action="append", default=None,
                   help="BEIR folder or JSONL file of documents (repeatable; corpora are mixed)")
    p.add_argument("--eval-corpus", dest="eval_corpus", action="append", default=None, metavar="PATH",
                   help="held-out BEIR folder or JSONL file: eval contrastive and MLM losses every --eval_steps "
                        "(eval_strategy steps unless given); repeatable")
    p.add_argument("--n_head_layers", "--n-head-layers", dest="n_head_layers", type=int, default=None)
    p.add_argument("--skip_from", "--skip-from", dest="skip_from", type=int, default=None)
    p.add_argument("--config", default=None, help="YAML file with any of these flags and TrainingArguments fields")


def _run_pretrain(ns: argparse.Namespace, rest: list[str]) -> int:
    from .pretraining import CocoPretrainingArguments

    config = load_config(ns.config)
    own_cfg, ta_cfg = _split_config(config, PRETRAIN_FLAGS)
    for key in ("corpus", "eval_corpus"):
        if key in own_cfg and isinstance(own_cfg[key], str):
            own_cfg[key] = [own_cfg[key]]
    _apply_own(ns, own_cfg, {})
    if not ns.model:
        raise UsageError("--model is required")
    if not ns.corpus:
        raise UsageError("at least one --corpus is required (a BEIR folder or a JSONL file of documents)")
    if ns.n_head_layers is not None:
        ta_cfg["n_head_layers"] = ns.n_head_layers
    if ns.skip_from is not None:
        ta_cfg["skip_from"] = ns.skip_from
    for path in ns.eval_corpus or []:
        if not os.path.exists(os.path.expanduser(path)):
            raise UsageError(f"--eval-corpus {path}: no such file or folder (a BEIR folder or a JSONL file)")
    if ns.eval_corpus:
        ta_cfg.setdefault("eval_strategy", "steps")  # the command line's --eval_strategy still wins
    args = parse_training_args(CocoPretrainingArguments, rest, ta_cfg, "hf-cocodr pretrain", ns.config)
    from .training_api import run_pretrain

    print(json.dumps(run_pretrain(ns.model, ns.corpus, args=args, eval_corpora=ns.eval_corpus or [])))
    return 0


register("pretrain", "COCO continuous contrastive pretraining on target corpora (Condenser head, span contrast)",
         _add_pretrain, _run_pretrain, passthrough=True)


# ------------------------------------------------------------------------------------------------------ recipe
def _add_recipe(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="starting encoder")
    p.add_argument("--target-corpus", dest="target_corpus", action="append", default=None,
                   help="target-domain BEIR folder or JSONL file (repeatable); only documents are read")
    p.add_argument("--source-data", dest="source_data", default=None, help="BEIR folder with labelled source qrels")
    p.add_argument("--source-split", dest="source_split", default=None)
    p.add_argument("--output_dir", "--output-dir", dest="output_dir", default=None)
    p.add_argument("--eval", action="append", default=None, metavar="DIR:SPLIT")
    p.add_argument("--max-minutes", dest="max_minutes", type=float, default=None,
                   help="size the stages to finish in this many minutes of training on this machine (a stage "
                        "that runs slower than measured stops at its deadline; evaluations come on top)")
    p.add_argument("--resume_from_checkpoint", "--resume-from-checkpoint", dest="resume", default="true",
                   help="true (default): skip the finished stages whose inputs are unchanged and resume the "
                        "unfinished one; false: start over (with --overwrite_output_dir when OUT holds a run)")
    p.add_argument("--overwrite_output_dir", "--overwrite-output-dir", dest="overwrite_output_dir",
                   action="store_true", help="write into an OUT holding files hf_cocodr did not write (they stay "
                                             "untouched); with --resume_from_checkpoint false, replace its earlier run")
    p.add_argument("--method", action="append", default=None, metavar="NAME",
                   help="extra method(s) for the fine-tuning stage, e.g. COCO -> iDRO + BERM: a name registered in "
                        "hf_cocodr.methods.registry (built in: modir, berm, rmsc); repeatable")
    p.add_argument("--target-queries", dest="target_queries", action="append", default=None,
                   help="unlabelled target queries for MoDIR (BEIR folder or JSONL file); repeatable")
    p.add_argument("--schedule", default=None, choices=["auto", "paper"],
                   help="auto (default): settings chosen by the starting model (README, 'How the recipe chooses its "
                        "schedule'); paper: COCO -> iDRO")
    p.add_argument("--coco-mlm-weight", dest="coco_mlm_weight", type=float, default=None,
                   help="weight of COCO's MLM terms; 0 = contrast-only (no MLM forward)")
    p.add_argument("--coco-lr", dest="coco_learning_rate", type=float, default=None, help="COCO learning rate")
    p.add_argument("--coco-runs", dest="coco_runs", default=None, metavar="N|budget",
                   help="COCO runs (seeds seed, seed+1, ...) averaged into one encoder, a model soup; 'budget': as "
                        "many runs of about --coco-run-steps steps as the budget affords")
    p.add_argument("--coco-run-steps", dest="coco_run_steps", type=int, default=None,
                   help="with --coco-runs budget: the length of one run (default 76)")
    for stage in ("coco", "finetune"):
        p.add_argument(f"--skip-{stage}", dest=f"skip_{stage}", default=None, choices=["true", "false", "auto"],
                       help=f"leave the {stage} stage out (true), run it (false), or as the schedule says (auto)")
    p.add_argument("--target-pairs", dest="target_pairs", default=None, choices=["title_body", "ict", "none"],
                   help="fine-tune on pseudo pairs of the target corpora (title or sentence vs. the rest)")
    p.add_argument("--target-schedule", dest="target_schedule", default=None, choices=["sequential", "joint"],
                   help="target pairs as a stage after the source fine-tuning (sequential) or a term of its steps")
    p.add_argument("--wise-alpha", dest="wise_alpha", default=None,
                   help="WiSE-FT: final weights = (1-a) x start + a x adapted; 'none' or 1 to skip")
    p.add_argument("--train-max-length", dest="train_max_length", type=int, default=None,
                   help="token limit of training texts (default 128)")
    p.add_argument("--no-start-eval", dest="evaluate_start", action="store_false", default=None,
                   help="do not evaluate the starting model on the --eval splits")
    p.add_argument("--no-save-hybrid", dest="save_hybrid", action="store_false", default=None,
                   help="do not save a hybrid retriever (final model + BM25) for each target corpus in OUT/hybrid")
    p.add_argument("--config", default=None, help="YAML: recipe options, plus `coco:`, `finetune:` and `target:` "
                                                  "mappings of CocoPretrainingArguments / IDROTrainingArguments fields")


def _wise_alpha(value: str) -> float | None:
    if value.lower() in ("none", "off"):
        return None
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"--wise-alpha must be a number in [0, 1] or 'none', got {value!r}") from None


def _coco_runs(value: str) -> int | str:
    if value.lower() in ("budget", "auto"):
        return value.lower()
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--coco-runs must be a whole number >= 1, 'budget' or 'auto', got {value!r}") from None


def _run_recipe(ns: argparse.Namespace, rest: list[str]) -> int:

    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)} (training arguments go in the --config file "
                         "under `coco:` / `finetune:`)")
    config = load_config(ns.config)
    own, config = _split_config(config, {"model", "target_corpus", "source_data", "output_dir", "eval", "max_minutes"})
    model = ns.model or own.get("model")
    targets = ns.target_corpus or own.get("target_corpus") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    source = ns.source_data or own.get("source_data")
    out = ns.output_dir or own.get("output_dir")
    evals = ns.eval or own.get("eval") or []
    evals = [evals] if isinstance(evals, str) else list(evals)
    max_minutes = ns.max_minutes if ns.max_minutes is not None else own.get("max_minutes")
    for flag, value in (("--model", model), ("--source-data", source), ("--output_dir", out)):
        if not value:
            raise UsageError(f"{flag} is required")
    if ns.source_split:
        config["source_split"] = ns.source_split
    if ns.method:
        config["methods"] = list(ns.method)
    if ns.target_queries:
        config["target_queries"] = list(ns.target_queries)
    for key in ("schedule", "coco_mlm_weight", "coco_learning_rate", "target_pairs", "target_schedule",
                "train_max_length", "evaluate_start", "save_hybrid"):
        if getattr(ns, key) is not None:
            config[key] = getattr(ns, key)
    if ns.wise_alpha is not None:
        config["wise_alpha"] = _wise_alpha(ns.wise_alpha)
    if ns.coco_runs is not None:
        config["coco_runs"] = _coco_runs(ns.coco_runs)
    if ns.coco_run_steps is not None:
        config["coco_run_steps"] = ns.coco_run_steps
    for key in ("skip_coco", "skip_finetune"):
        if getattr(ns, key) is not None:
            config[key] = {"true": True, "false": False}.get(getattr(ns, key), "auto")
    if max_minutes is not None and not (isinstance(max_minutes, (int, float)) and math.isfinite(max_minutes)
                                        and max_minutes > 0):
        raise UsageError(f"--max-minutes must be a positive number, got {max_minutes!r}")
    cfg = RecipeConfig.from_dict(config)
    resume = str(ns.resume).lower() not in ("false", "no", "0")
    result = run_recipe(model, targets, source, out, evals=evals, config=cfg, max_minutes=max_minutes, resume=resume,
                        overwrite_output_dir=ns.overwrite_output_dir)
    print(json.dumps(result))
    return 0


register("recipe", "COCO on target corpora -> iDRO on source labels -> export, card, evaluation (resumable)",
         _add_recipe, _run_recipe, passthrough=True)
