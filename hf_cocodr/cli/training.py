"""Training sub-commands of ``hf-cocodr``: ``finetune`` (iDRO), ``pretrain`` (COCO) and ``recipe``.

Each accepts its own flags, ``--config FILE.yaml`` (any of its flags and any TrainingArguments field) and every
TrainingArguments flag after them (``--max_steps``, ``--learning_rate``, ...). Command-line values win over the
config file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..config_types import check_field_types, check_training_values
from ..errors import ConfigError
from ..recipe.config import (
    RecipeArguments,
    RecipeConfig,
    add_config_arguments,
    check_max_minutes,
    config_from_flags,
)
from ..retired import RETIRED_OPTIONS, retired_message
from ..utils import resolve_inside
from .main import UsageError, register

logger = logging.getLogger("hf_cocodr.cli")


MAX_CONFIG_NODES = 100_000  # values a --config may hold once its aliases are expanded (a real one holds < 1,000)


def load_config(path: str | None) -> dict[str, Any]:
    """A ``--config`` YAML file as a mapping of option names, refused in one line (naming the file, and the line
    where one is known) when it is not UTF-8, not YAML, not a mapping, has a key that is not a string, or expands
    (through aliases) to more than :data:`MAX_CONFIG_NODES` values: an alias bomb is refused before anything walks
    or copies it."""
    if not path:
        return {}
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--config {path}: file not found")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UsageError(f"--config {path}: line {line}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not valid YAML ({' '.join(str(e).split())})") from None
    _check_config_shape(data, path)
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values")
    return {k.replace("-", "_"): v for k, v in data.items()}


def _check_config_shape(data: Any, path: str) -> None:
    """Refuse a loaded config whose values, aliases expanded, number more than :data:`MAX_CONFIG_NODES` (counted on
    the shared structure, so a bomb costs as little as its file), or with a mapping key that is not a string."""
    sizes: dict[int, int] = {}

    def size(obj: Any, where: str, depth: int = 0) -> int:
        if not isinstance(obj, (dict, list)):
            return 1
        if id(obj) in sizes:
            return sizes[id(obj)]
        if depth > 100:
            raise UsageError(f"--config {path}: nested more than 100 levels deep (at {where})")
        total = 1
        if isinstance(obj, dict):
            for key, value in obj.items():
                if not isinstance(key, str):
                    raise UsageError(
                        f"--config {path}: the key {key!r}{f' under {where}' if where else ''} is not a name "
                        "(YAML reads 1, true, null, ... as numbers, booleans, null: quote it, or remove it)"
                    )
                total += size(value, f"{where}.{key}" if where else key, depth + 1)
        else:
            for i, value in enumerate(obj):
                total += size(value, f"{where}[{i}]", depth + 1)
        sizes[id(obj)] = total
        if total > MAX_CONFIG_NODES:
            raise UsageError(
                f"--config {path}: expands to more than {MAX_CONFIG_NODES:,} values through its aliases "
                f"(at {where or 'the top'}); a configuration is a short mapping of options"
            )
        return total

    size(data, "")


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
    try:
        check_training_values(args, f"--config {config}" if config else prog)
    except ValueError as e:
        raise UsageError(str(e)) from None
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
FINETUNE_FLAGS = {
    "model",
    "train_data",
    "train_split",
    "idro_preset",
    "num_clusters",
    "tau",
    "negatives",
    "refresh_negatives_every",
    "max_queries",
    "method",
    "config",
    "eval",
    "target_corpus",
    "target_queries",
    "eval_during_training",
}


def _add_finetune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="starting encoder (directory or Hub id)")
    p.add_argument("--train-data", dest="train_data", default=None, help="BEIR folder with labelled source data")
    p.add_argument("--train-split", dest="train_split", default="train")
    p.add_argument(
        "--idro-preset", dest="idro_preset", default=None, choices=["paper", "reference", "groupdro", "uniform"]
    )
    p.add_argument("--num-clusters", dest="num_clusters", type=int, default=None)
    p.add_argument("--tau", type=float, default=None)
    p.add_argument("--negatives", choices=["bm25", "none"], default="bm25")
    p.add_argument("--refresh-negatives-every", dest="refresh_negatives_every", type=int, default=None)
    p.add_argument("--max-queries", dest="max_queries", type=int, default=None, help="train on a random subset")
    p.add_argument(
        "--method",
        action="append",
        default=None,
        metavar="NAME",
        help="extra method(s) combined with the loss: a name registered in hf_cocodr.methods.registry "
        "(built in: modir, berm, rmsc); repeatable",
    )
    p.add_argument(
        "--target-corpus",
        dest="target_corpus",
        action="append",
        default=None,
        help="unlabelled target corpus (BEIR folder or JSONL) for MoDIR / RMSC; repeatable",
    )
    p.add_argument(
        "--target-queries",
        dest="target_queries",
        action="append",
        default=None,
        help="unlabelled target queries for MoDIR (BEIR folder: its queries.jsonl, never its qrels; or a "
        "JSONL file with a text field); repeatable. The model card records that they were read",
    )
    p.add_argument(
        "--eval",
        action="append",
        default=None,
        metavar="DIR:SPLIT",
        help="evaluate the final model on this BEIR split (repeatable)",
    )
    p.add_argument(
        "--eval-during-training",
        dest="eval_during_training",
        default=None,
        metavar="DIR:SPLIT",
        help="nDCG@10 (and Recall, MRR, MAP) on this labelled BEIR split every --eval_steps during "
        "training (eval_strategy steps unless given); keep the split small",
    )
    p.add_argument("--config", default=None, help="YAML file with any of these flags and TrainingArguments fields")


def _run_finetune(ns: argparse.Namespace, rest: list[str]) -> int:
    from ..finetuning import IDROTrainingArguments

    config = load_config(ns.config)
    own_cfg, ta_cfg = _split_config(config, FINETUNE_FLAGS)
    _apply_own(ns, own_cfg, {"train_split": "train", "negatives": "bm25"})
    if not ns.model:
        raise UsageError("--model is required")
    if not ns.train_data:
        raise UsageError("--train-data is required (a BEIR folder with qrels/<split>.tsv)")
    mapped = {
        "idro_preset": ns.idro_preset,
        "num_clusters": ns.num_clusters,
        "idro_tau": ns.tau,
        "refresh_negatives_every_steps": ns.refresh_negatives_every,
    }
    defaults = {**ta_cfg, **{k: v for k, v in mapped.items() if v is not None}}
    if ns.negatives == "none" and "num_negatives" not in defaults:
        defaults["num_negatives"] = 0
    if ns.eval_during_training:
        from ..data.beir import parse_eval_spec  # pyarrow and numpy: not for --help

        parse_eval_spec(ns.eval_during_training, "--eval-during-training")
        defaults.setdefault("eval_strategy", "steps")  # the command line's --eval_strategy still wins
    if (
        not any(
            a == "--output_dir"
            or a.startswith("--output_dir=")
            or a == "--output-dir"
            or a.startswith("--output-dir=")
            for a in rest
        )
        and "output_dir" not in defaults
    ):
        raise UsageError("--output_dir is required (the folder the fine-tuned model and its checkpoints go to)")
    args = parse_training_args(IDROTrainingArguments, rest, defaults, "hf-cocodr finetune", ns.config)
    from ..training_api import run_finetune

    result = run_finetune(
        model=ns.model,
        train_data=ns.train_data,
        train_split=ns.train_split,
        args=args,
        negatives=ns.negatives,
        max_queries=ns.max_queries,
        methods=ns.method or [],
        evals=ns.eval or [],
        target_corpora=ns.target_corpus or [],
        target_queries=ns.target_queries or [],
        eval_during_training=ns.eval_during_training,
    )
    print(json.dumps(result))
    return 0


register(
    "finetune",
    "iDRO fine-tuning on labelled source data (K-Means clusters, BM25 + self-mined negatives)",
    _add_finetune,
    _run_finetune,
    passthrough=True,
)


# ------------------------------------------------------------------------------------------------------ pretrain
PRETRAIN_FLAGS = {"model", "corpus", "n_head_layers", "skip_from", "config", "eval_corpus"}


def _add_pretrain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="starting encoder: sentence-transformers dir, checkpoint or Hub id")
    p.add_argument(
        "--corpus",
        action="append",
        default=None,
        help="BEIR folder or JSONL file of documents (repeatable; corpora are mixed)",
    )
    p.add_argument(
        "--eval-corpus",
        dest="eval_corpus",
        action="append",
        default=None,
        metavar="PATH",
        help="held-out BEIR folder or JSONL file: eval contrastive and MLM losses every --eval_steps "
        "(eval_strategy steps unless given); repeatable",
    )
    p.add_argument("--n_head_layers", "--n-head-layers", dest="n_head_layers", type=int, default=None)
    p.add_argument("--skip_from", "--skip-from", dest="skip_from", type=int, default=None)
    p.add_argument("--config", default=None, help="YAML file with any of these flags and TrainingArguments fields")


def _run_pretrain(ns: argparse.Namespace, rest: list[str]) -> int:
    from ..pretraining import CocoPretrainingArguments

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
    from ..training_api import run_pretrain

    print(json.dumps(run_pretrain(ns.model, ns.corpus, args=args, eval_corpora=ns.eval_corpus or [])))
    return 0


register(
    "pretrain",
    "COCO continuous contrastive pretraining on target corpora (Condenser head, span contrast)",
    _add_pretrain,
    _run_pretrain,
    passthrough=True,
)


# ------------------------------------------------------------------------------------------------------ recipe
def _add_recipe(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, RecipeArguments)  # what the recipe runs on, then its settings
    add_config_arguments(p, RecipeConfig)


def _run_recipe(ns: argparse.Namespace, rest: list[str]) -> int:
    from ..recipe.runner import run_recipe  # torch, transformers, datasets: only a recipe that runs needs them

    for token in rest:  # a retired option's flag, by name (rather than as an unknown argument)
        name = token.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if token.startswith("--") and name in RETIRED_OPTIONS:
            raise ConfigError(retired_message(name, token.split("=", 1)[0]))
    if rest:
        raise UsageError(
            f"unrecognized arguments: {' '.join(rest)} (training arguments go in the --config file "
            "under `coco:` / `finetune:` / `distill:`)"
        )
    given = config_from_flags(ns, RecipeArguments)
    config = load_config(given.get("config"))
    run_level = {f.name for f in fields(RecipeArguments)} - {
        "config",
        "resume_from_checkpoint",
        "overwrite_output_dir",
    }
    own, config = _split_config(config, run_level)
    a = RecipeArguments(**{**own, **given})
    targets = [a.target_corpus] if isinstance(a.target_corpus, str) else list(a.target_corpus)
    evals = [a.eval] if isinstance(a.eval, str) else list(a.eval)
    for flag, value in (("--model", a.model), ("--output_dir", a.output_dir)):  # (--source-data: where needed)
        if not value:
            raise UsageError(f"{flag} is required")
    max_minutes = check_max_minutes(a.max_minutes, "--max-minutes")
    cfg = RecipeConfig.from_dict({**config, **config_from_flags(ns, RecipeConfig)})
    result = run_recipe(
        a.model,
        targets,
        a.source_data,
        a.output_dir,
        evals=evals,
        config=cfg,
        max_minutes=max_minutes,
        resume=a.resume,
        overwrite_output_dir=a.overwrite_output_dir,
    )
    print(json.dumps(result))
    return 0


register(
    "recipe",
    "COCO on target corpora -> fine-tuning on source labels -> distillation on unlabelled target queries -> export, "
    "card, evaluation (resumable)",
    _add_recipe,
    _run_recipe,
    passthrough=True,
)
