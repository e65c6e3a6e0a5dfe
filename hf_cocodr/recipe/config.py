"""The settings of :func:`~hf_cocodr.recipe.run_recipe`: :class:`RecipeConfig`, its checks and its command-line flags.

This module imports neither torch nor transformers, so ``hf-cocodr recipe --help`` and input errors answer at once.
Each field carries its help text in ``metadata["help"]``, as for ``transformers.HfArgumentParser``; the recipe
command builds its flags from the fields with :func:`add_config_arguments` rather than with ``HfArgumentParser``
itself, which would import transformers at every start of the command line and takes no union of a number and a
word (``--coco-runs 3`` / ``--coco-runs budget``, ``--wise-alpha 0.5`` / ``--wise-alpha none``).
"""

from __future__ import annotations

import argparse
import math
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from enum import Enum
from typing import Any

from ..config_types import check_training_values
from ..data.pseudo_pairs import PSEUDO_PAIR_MODES
from ..errors import ConfigError


class Auto(str, Enum):
    """A setting the recipe resolves itself: ``AUTO`` by the schedule of the starting model (see
    :func:`~hf_cocodr.recipe.choose_schedule`), ``BUDGET`` (``coco_runs`` only) by the time budget. Members equal,
    print and serialise as their strings (``Auto.AUTO == "auto"``), so configs and records read as before."""

    AUTO = "auto"
    BUDGET = "budget"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


AUTO = Auto.AUTO
# the losses of the source fine-tune (hf_cocodr.finetuning.losses.PRESETS, named here to keep this module torch-free)
FINETUNE_PRESETS = ("paper", "reference", "groupdro", "uniform")
STAGE_OPTIONS = ("coco", "finetune", "target", "distill")  # the mappings of training arguments, one per training stage


# the distillation's default cap on passes over the target queries (docs/adaptation.md says why)
DISTILL_MAX_PASSES = 3.0


def _opt(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    cli: bool = True,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    default_factory: Any = MISSING,
) -> Any:
    """A field with its command-line flag: ``help`` for ``--help``; ``flag`` the flag's name when it is not
    ``--field-name`` (``aliases``: more names); ``cli=False`` for a field only a ``--config`` file sets;
    ``choices`` the names a string field takes."""
    metadata = {"help": help, "flag": flag, "aliases": aliases, "cli": cli, "choices": choices, "metavar": metavar}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RecipeConfig:
    """Settings of :func:`~hf_cocodr.recipe.run_recipe`. ``coco``, ``target`` and ``finetune`` hold extra
    ``CocoPretrainingArguments`` / ``IDROTrainingArguments`` fields for the three training stages (they win over the
    recipe's defaults).

    Stages, in order (each can be switched off; :data:`Auto.AUTO` settings are resolved by
    :func:`~hf_cocodr.recipe.choose_schedule` from the starting model and logged, written to ``recipe.json`` and to
    the model card):

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

    source_split: str = _opt("train", "split of --source-data whose qrels are the labelled source task")
    include_source_corpus: bool = _opt(True, "do not also train COCO on the (restricted) source corpus")
    max_queries: int | None = _opt(
        None, "source queries used for fine-tuning (default: all, or as many as the budget's steps use)"
    )
    corpus_pool: int | None = _opt(5, "restrict the source corpus to the positives + BM25 top-k of the kept queries")
    coco_steps: int | None = _opt(None, "steps of each COCO run (default: planned from --max-minutes, or 500)")
    finetune_steps: int | None = _opt(None, "steps of the source fine-tuning (default: planned, or 500)")
    target_steps: int | None = _opt(None, "steps of the target pseudo pairs (default: planned, or 500)")
    refreshes: int | None = _opt(None, "self-negative refreshes, each re-clusters (default: as the budget affords)")
    schedule: str = _opt(
        AUTO,
        "auto: settings chosen by the starting model (README, 'How the recipe chooses its "
        "schedule'); paper: COCO -> iDRO",
        choices=("auto", "paper"),
    )
    coco_mlm_weight: float | Auto = _opt(AUTO, "weight of COCO's MLM terms; 0 = contrast-only (no MLM forward)")
    coco_learning_rate: float | Auto = _opt(AUTO, "COCO learning rate", flag="--coco-lr")
    coco_runs: int | Auto = _opt(
        AUTO,
        "COCO runs (seeds seed, seed+1, ...) averaged into one encoder, a model soup; "
        "'budget': as many runs of about --coco-run-steps steps as the budget affords",
    )
    coco_run_steps: int = _opt(76, "with --coco-runs budget: the length of one run")
    target_pairs: str = _opt(
        AUTO,
        "fine-tune on pseudo pairs of the target corpora (title or sentence vs. the rest)",
        choices=("auto", "none", *PSEUDO_PAIR_MODES),
    )
    target_schedule: str = _opt(
        AUTO,
        "target pairs as a stage after the source fine-tuning (sequential) or a term of its steps (joint)",
        choices=("auto", "sequential", "joint"),
    )
    joint_weight: float = _opt(1.0, "weight of the target-pairs term under the joint schedule")
    finetune_preset: str = _opt(
        AUTO,
        "the source fine-tune's loss: iDRO (paper, reference), GroupDRO, or the plain contrastive loss (uniform); "
        "auto: by the starting model. A finetune: {idro_preset: ...} in --config sets it too",
        choices=("auto", *FINETUNE_PRESETS),
    )
    skip_distill: bool | Auto = _opt(
        AUTO,
        "leave the distill stage out (true), run it when --target-queries are given (false), or as the schedule "
        "says (auto)",
    )
    distill_steps: int | None = _opt(None, "steps of the distillation (default: planned, or 500)")
    distill_share: float | Auto = _opt(AUTO, "the distillation's share of the training budget")
    distill_k: int = _opt(8, "distillation: the teacher's candidates per query (its top-k)")
    distill_teacher_weight: float = _opt(
        0.5, "distillation: the dense weight of the teacher's fusion (1: the starting model alone, 0: BM25 alone)"
    )
    distill_teacher_temperature: float = _opt(
        1.0, "distillation: temperature of the teacher's (z-normalised, fused) scores"
    )
    distill_in_batch_weight: float = _opt(
        1.0, "distillation: weight of the in-batch contrastive term on the teacher's first candidate (0: off)"
    )
    distill_document_gradients: bool = _opt(
        True,
        "distillation: encode the candidates without back-propagating through them (a forward pass only: cheaper "
        "steps; the queries' side of the loss trains the model)",
    )
    distill_max_passes: float | None = _opt(
        DISTILL_MAX_PASSES,
        "distillation: at most this many passes over the target queries, however many steps the budget buys "
        "('none': no cap; --distill-steps fixes the steps instead)",
    )
    wise_alpha: float | Auto | None = _opt(
        AUTO, "WiSE-FT: final weights = (1-a) x start + a x adapted; 'none' or 1 to skip"
    )
    coco_share: float | Auto = _opt(
        AUTO, "COCO's share of the training budget (renormalised over the stages that run)"
    )
    finetune_share: float | Auto = _opt(AUTO, "the source fine-tuning's share of the training budget")
    target_share: float | Auto = _opt(AUTO, "the target pseudo pairs' share of the training budget")
    train_max_length: int = _opt(128, "token limit of training texts (documents and spans)")
    evaluate_start: bool = _opt(
        True, "do not evaluate the starting model on the --eval splits", flag="--no-start-eval"
    )
    save_hybrid: bool = _opt(
        True, "do not save a hybrid retriever (final model + BM25) for each target corpus in OUT/hybrid"
    )
    skip_coco: bool | Auto = _opt(
        AUTO, "leave the coco stage out (true), run it (false), or as the schedule says (auto)"
    )
    skip_finetune: bool | Auto = _opt(
        AUTO, "leave the finetune stage out (true), run it (false), or as the schedule says (auto)"
    )
    seed: int = _opt(42, "seed of the data draws and of the first COCO run")
    eval_batch_size: int = _opt(64, "batch size of the evaluations")
    methods: list[str] = _opt(
        help="extra method(s) for the fine-tuning stage, e.g. COCO -> iDRO + BERM: a name "
        "registered in hf_cocodr.methods.registry (built in: modir, berm, rmsc); repeatable",
        flag="--method",
        metavar="NAME",
        default_factory=list,
    )
    target_queries: list[str] = _opt(
        help="unlabelled target queries (DIR:SPLIT: the split's queries, its labels unread; a BEIR folder; a "
        "JSONL file) for the distillation stage and MoDIR; repeatable",
        metavar="DIR:SPLIT|DIR|FILE",
        default_factory=list,
    )
    coco: dict[str, Any] = _opt(
        help="CocoPretrainingArguments fields of the COCO stage", cli=False, default_factory=dict
    )
    finetune: dict[str, Any] = _opt(
        help="IDROTrainingArguments fields of the source fine-tuning", cli=False, default_factory=dict
    )
    target: dict[str, Any] = _opt(
        help="IDROTrainingArguments fields of the target pseudo pairs", cli=False, default_factory=dict
    )
    distill: dict[str, Any] = _opt(
        help="IDROTrainingArguments fields of the distillation", cli=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # "auto" (and coco_runs' "budget") given as strings become the enum members
            value = getattr(self, f.name)
            if type(value) is str and (value == AUTO or (f.name == "coco_runs" and value == Auto.BUDGET)):
                setattr(self, f.name, Auto(value))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecipeConfig:
        """A checked config from a mapping (a ``--config`` file, a Python dict); unknown names are refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown recipe option(s) {unknown}; known: {sorted(known)}")
        for stage in STAGE_OPTIONS:
            sub = data.get(stage) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments, got {sub!r}")
            bad = [k for k in sub if k.endswith("_dir")]
            if bad:
                raise ConfigError(
                    f"recipe option {stage}.{bad[0]}: the recipe places every stage inside --output_dir; remove it"
                )
        cfg = cls(**{k: v for k, v in data.items() if k not in STAGE_OPTIONS or v is not None})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Refuse out-of-range settings by name (before any model is loaded)."""

        def number(name, lo, hi, allow_auto=True, allow_none=False):
            v = getattr(self, name)
            if (allow_auto and v == AUTO) or (allow_none and v is None):
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                raise ConfigError(
                    f"recipe option {name} must be a number in [{lo}, {hi}]"
                    f"{' or auto' if allow_auto else ''}, got {v!r}"
                )

        number("coco_mlm_weight", 0, 100)
        number("coco_learning_rate", 1e-8, 1)
        number("wise_alpha", 0, 1, allow_none=True)
        number("distill_teacher_weight", 0, 1, allow_auto=False)
        number("distill_teacher_temperature", 1e-3, 100, allow_auto=False)
        number("distill_in_batch_weight", 0, 100, allow_auto=False)
        number("distill_max_passes", 0.01, 1000, allow_auto=False, allow_none=True)
        for share in ("coco_share", "finetune_share", "target_share", "distill_share"):
            number(share, 0, 1)

        def whole(name, lo, allow_none=True, hint=""):
            v = getattr(self, name)
            if (v is None and not allow_none) or (
                v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo)
            ):
                raise ConfigError(
                    f"recipe option {name} must be a whole number >= {lo}"
                    f"{' (or unset)' if allow_none else ''}, got {v!r}{hint}"
                )

        for steps, switch in (
            ("coco_steps", "skip_coco: true"),
            ("finetune_steps", "skip_finetune: true"),
            ("target_steps", "target_pairs: none"),
            ("distill_steps", "skip_distill: true"),
        ):
            whole(steps, 1, hint=f"; to leave the stage out set {switch}")
        whole("refreshes", 0)
        whole("distill_k", 2, allow_none=False)
        if self.distill_k > 64:  # the candidates are the rows' document columns (negative_1 ... negative_63)
            raise ConfigError(f"recipe option distill_k must be at most 64, got {self.distill_k!r}")
        whole("coco_run_steps", 1, allow_none=False)
        if self.coco_runs not in (Auto.AUTO, Auto.BUDGET):
            whole("coco_runs", 1, allow_none=False, hint=" (or auto / budget)")
        whole("max_queries", 1)
        whole("corpus_pool", 1)
        whole("eval_batch_size", 1, allow_none=False)
        whole("seed", 0, allow_none=False)
        if not isinstance(self.source_split, str) or not self.source_split:
            raise ConfigError(f"recipe option source_split must be a split name, got {self.source_split!r}")
        for flag in ("include_source_corpus", "evaluate_start", "save_hybrid", "distill_document_gradients"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"recipe option {flag} must be true or false, got {getattr(self, flag)!r}")
        for name in ("methods", "target_queries"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ConfigError(f"recipe option {name} must be a list of names, got {v!r}")
        self._check_stage_arguments()
        if self.target_pairs not in ("auto", "none", *PSEUDO_PAIR_MODES):
            raise ConfigError(
                f"recipe option target_pairs must be auto, none, {' or '.join(PSEUDO_PAIR_MODES)}; "
                f"got {self.target_pairs!r}"
            )
        if self.finetune_preset not in ("auto", *FINETUNE_PRESETS):
            raise ConfigError(
                f"recipe option finetune_preset must be auto or one of {', '.join(FINETUNE_PRESETS)}, "
                f"got {self.finetune_preset!r}"
            )
        if self.target_schedule not in ("auto", "sequential", "joint"):
            raise ConfigError(
                f"recipe option target_schedule must be auto, sequential or joint, got {self.target_schedule!r}"
            )
        number("joint_weight", 0, 100, allow_auto=False)
        if self.schedule not in ("auto", "paper"):
            raise ConfigError(f"recipe option schedule must be 'auto' or 'paper', got {self.schedule!r}")
        for flag in ("skip_coco", "skip_finetune", "skip_distill"):
            if getattr(self, flag) not in (True, False, AUTO):
                raise ConfigError(f"recipe option {flag} must be true, false or auto, got {getattr(self, flag)!r}")
        if self.skip_distill is False and not self.target_queries:
            raise ConfigError(
                "recipe option skip_distill is false but no target queries are given: the distillation trains on "
                "unlabelled target queries (--target-queries DIR:SPLIT, a BEIR folder or a JSONL file)"
            )
        if not isinstance(self.train_max_length, int) or self.train_max_length < 8:
            raise ConfigError(
                f"recipe option train_max_length must be a whole number >= 8, got {self.train_max_length!r}"
            )

    def _check_stage_arguments(self) -> None:
        """``coco`` / ``finetune`` / ``target``: known fields of the stage's arguments class, values of their types,
        and the class's own range checks (run by building it), so a bad value fails before any model is loaded."""
        if all(getattr(self, stage) == {} for stage in STAGE_OPTIONS):
            return  # nothing to check (and no trainer to import)
        from ..finetuning import IDROTrainingArguments
        from ..pretraining import CocoPretrainingArguments

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

        for stage, cls in (
            ("coco", CocoPretrainingArguments),
            ("finetune", IDROTrainingArguments),
            ("target", IDROTrainingArguments),
            ("distill", IDROTrainingArguments),
        ):
            sub = getattr(self, stage)
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments, got {sub!r}")
            if "max_steps" in sub:
                raise ConfigError(
                    f"recipe option {stage}.max_steps: the recipe sets each stage's steps; use {stage}_steps instead"
                )
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
                built = cls(
                    **{"output_dir": "unused", "report_to": "none", "use_cpu": no_gpu(), **sub, "max_steps": 1}
                )
            except (TypeError, ValueError) as e:
                raise ConfigError(f"recipe option {stage}: {' '.join(str(e).split())}") from None
            try:  # values the class takes but training cannot use (a batch of 0, a scheduler's unknown option)
                check_training_values(built, f"recipe option {stage}")
            except ValueError as e:
                raise ConfigError(str(e)) from None


@dataclass
class RecipeArguments:
    """What ``hf-cocodr recipe`` runs :func:`~hf_cocodr.recipe.run_recipe` on: the command's flags beside the
    :class:`RecipeConfig` ones (a ``--config`` file may hold them too, the command line wins)."""

    model: str | None = _opt(None, "starting encoder")
    target_corpus: list[str] = _opt(
        help="target-domain BEIR folder or JSONL file (repeatable); only documents are read", default_factory=list
    )
    source_data: str | None = _opt(None, "BEIR folder with labelled source qrels")
    output_dir: str | None = _opt(None, "the output folder OUT", flag="--output_dir", aliases=("--output-dir",))
    eval: list[str] = _opt(
        help="evaluate the final (and the starting) model on this BEIR split (repeatable)",
        metavar="DIR:SPLIT",
        default_factory=list,
    )
    max_minutes: float | None = _opt(
        None,
        "size the stages to finish in this many minutes of training on this "
        "machine (a stage that runs slower than measured stops at its deadline; "
        "evaluations come on top)",
    )
    resume_from_checkpoint: str = _opt(
        "true",
        "true (default): skip the finished stages whose inputs are unchanged "
        "and resume the unfinished one; false: start over (with "
        "--overwrite_output_dir when OUT holds a run)",
        flag="--resume_from_checkpoint",
        aliases=("--resume-from-checkpoint",),
    )
    overwrite_output_dir: bool = _opt(
        False,
        "write into an OUT holding files hf_cocodr did not write (they stay "
        "untouched); with --resume_from_checkpoint false, replace its earlier "
        "run",
        flag="--overwrite_output_dir",
        aliases=("--overwrite-output-dir",),
    )
    config: str | None = _opt(
        None,
        "YAML: recipe options, plus `coco:`, `finetune:` and `target:` mappings of "
        "CocoPretrainingArguments / IDROTrainingArguments fields",
    )

    @property
    def resume(self) -> bool:
        """Whether to resume (``--resume_from_checkpoint`` other than false / no / 0)."""
        return str(self.resume_from_checkpoint).lower() not in ("false", "no", "0")


def check_max_minutes(value: Any, name: str = "max_minutes") -> float | None:
    """``value`` as a training budget in minutes: None (no budget) or a positive finite number; ``name`` is what
    the error calls it (``--max-minutes`` on the command line)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return value


def is_joint(cfg: RecipeConfig) -> bool:
    """Whether the target pseudo pairs train as a term of the source steps (rather than as a stage of their own)."""
    return cfg.target_schedule == "joint" and cfg.target_pairs != "none" and not cfg.skip_finetune


def uses_wise(cfg: RecipeConfig) -> bool:
    """Whether the recipe ends with a WiSE-FT interpolation (α of None or 1 means none)."""
    return cfg.wise_alpha not in (None, 1, 1.0)


def no_gpu() -> bool:
    """Whether this machine has no CUDA device (the stages then train with ``use_cpu``)."""
    import torch

    return not torch.cuda.is_available()


# --------------------------------------------------------------------------------------------- command-line flags
_HINTS = {cls: typing.get_type_hints(cls) for cls in (RecipeConfig, RecipeArguments)}
_NUMBER_OR_WORD = {
    float | Auto: "X|auto",
    float | Auto | None: "A|none",
    int | Auto: "N|budget",
    float | None: "X|none",
}


def _flag(f: Field, hint: Any) -> str:
    if f.metadata.get("flag"):
        return f.metadata["flag"]
    if hint is bool and f.default is True:
        return "--no-" + f.name.replace("_", "-")
    return "--" + f.name.replace("_", "-")


def _cli_fields(cls: type) -> list[tuple[Field, Any]]:
    return [(f, _HINTS[cls][f.name]) for f in fields(cls) if f.metadata.get("cli", True)]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type = RecipeConfig) -> None:
    """One flag per field of ``cls`` (:class:`RecipeConfig` or :class:`RecipeArguments`) a command line can set
    (not the ``coco`` / ``finetune`` / ``target`` mappings): ``--field-name`` or the field's ``flag``, with its help
    text and type from the field. A flag not given leaves the attribute unset, so a ``--config`` file's value
    stands; :func:`config_from_flags` reads them back."""
    for f, hint in _cli_fields(cls):
        helptext = f.metadata.get("help", "")
        kw: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "help": helptext,
            "metavar": f.metadata.get("metavar"),
        }
        if hint is bool:  # a switch that turns the default off
            kw.update(action="store_false" if f.default is True else "store_true")
            del kw["metavar"]
        elif hint == list[str]:
            kw.update(action="append")
        elif hint == bool | Auto:
            kw.update(choices=["true", "false", "auto"])
        elif f.metadata.get("choices"):
            kw.update(choices=list(f.metadata["choices"]))
        elif hint in (int, int | None):
            kw.update(type=int)
        elif hint is float:
            kw.update(type=float)
        elif hint in _NUMBER_OR_WORD:  # a number or a word: read by config_from_flags, which names the flag
            kw.update(metavar=f.metadata.get("metavar") or _NUMBER_OR_WORD[hint])
        if hint is not bool and f.default not in (MISSING, None, AUTO):
            kw["help"] = f"{helptext} (default {f.default})"
        parser.add_argument(_flag(f, hint), *f.metadata.get("aliases", ()), **kw)


def config_from_flags(ns: argparse.Namespace, cls: type = RecipeConfig) -> dict[str, Any]:
    """The values of ``cls``'s fields given as flags (see :func:`add_config_arguments`), typed; a value of the
    wrong kind is refused naming its flag."""
    out: dict[str, Any] = {}
    for f, hint in _cli_fields(cls):
        if not hasattr(ns, f.name):
            continue
        value = getattr(ns, f.name)
        if hint == bool | Auto:
            value = {"true": True, "false": False}.get(value, AUTO)
        elif hint == list[str]:
            value = list(value)
        elif hint in _NUMBER_OR_WORD:
            value = _number_or_word(value, _flag(f, hint), hint)
        out[f.name] = value
    return out


def _number_or_word(value: str, flag: str, hint: Any) -> Any:
    text = value.strip().lower()
    if hint in (float | Auto | None, float | None) and text in ("none", "off"):
        return None
    if hint == float | None:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{flag} must be a number or 'none', got {value!r}") from None
    if text == Auto.AUTO or (hint == int | Auto and text == Auto.BUDGET):
        return Auto(text)
    try:
        return int(value) if hint == int | Auto else float(value)
    except ValueError:
        pass
    if hint == int | Auto:
        raise ConfigError(f"{flag} must be a whole number >= 1, 'budget' or 'auto', got {value!r}")
    if hint == float | Auto | None:
        raise ConfigError(f"{flag} must be a number in [0, 1] or 'none', got {value!r}")
    raise ConfigError(f"{flag} must be a number or 'auto', got {value!r}")
