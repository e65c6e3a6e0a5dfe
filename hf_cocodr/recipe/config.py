"""The settings of :func:`~hf_cocodr.recipe.run_recipe`: :class:`RecipeConfig`, its checks and its command-line flags.

This module imports neither torch nor transformers, so ``hf-cocodr recipe --help`` and input errors answer at once.
Each field carries its help text in ``metadata["help"]``, as for ``transformers.HfArgumentParser``; the recipe
command builds its flags from the fields with :func:`add_config_arguments` rather than with ``HfArgumentParser``
itself, which would import transformers at every start of the command line and takes no union of a number and a
word (``--coco-runs 3`` / ``--coco-runs budget``, ``--wise-alpha 0.5`` / ``--wise-alpha none``).
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import typing
from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any, Literal

from ..errors import ConfigError
from ..retired import RETIRED_DISTILL_FIELDS, refuse_retired
from .settings import AUTO, Auto, check_flag, check_training_arguments, check_whole, no_gpu  # noqa: F401
from .settings import option as _opt
from .stage import Stage
from .stages import STAGE_SETTINGS, STAGES
from .stages.distill import DISTILL_MAX_PASSES, DistillSettings  # noqa: F401  (re-exported)
from .stages.finetune import FINETUNE_PRESETS, FinetuneSettings  # noqa: F401  (re-exported)
from .stages.wise import WiseSettings

logger = logging.getLogger("hf_cocodr.recipe")

# what --encode-precision takes (hf_cocodr.modeling.precision.CORPUS_PRECISIONS; not imported here: this module
# loads no model code)
ENCODE_PRECISIONS = ("auto", "fp32", "bf16")

# the mappings of training arguments, one per training stage
STAGE_OPTIONS = tuple(s.training_options for s in STAGE_SETTINGS if hasattr(s, "training_options"))


# RecipeConfig's bases: the settings of STAGES, the last stage's first (so the first stage's fields come first,
# as dataclasses order the fields of the bases from the last in the MRO)
CONFIG_BASES: tuple[type, ...] = tuple(reversed(STAGE_SETTINGS))


@dataclass
class RecipeConfig(*CONFIG_BASES):
    """Settings of :func:`~hf_cocodr.recipe.run_recipe`: the options every stage shares (below) and each stage's
    own, inherited from the settings class of each stage of :data:`~hf_cocodr.recipe.stages.STAGES`
    (:class:`~hf_cocodr.recipe.stages.coco.CocoSettings`,
    :class:`~hf_cocodr.recipe.stages.finetune.FinetuneSettings`, :class:`~hf_cocodr.recipe.stages.distill.
    DistillSettings`, :class:`~hf_cocodr.recipe.stages.wise.WiseSettings`). ``coco``, ``finetune`` and ``distill``
    hold extra training-arguments fields for the three training stages (``CocoPretrainingArguments`` for ``coco``,
    ``IDROTrainingArguments`` for ``finetune``, ``DistillationTrainingArguments`` for ``distill``; they win over the
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
    3. Distillation of the hybrid teacher (the starting model + BM25) on unlabelled ``target_queries`` or on
       pseudo-queries drawn from the target corpora (``skip_distill``; ``pseudo_queries``), at most
       ``distill_max_passes`` passes.
    4. WiSE-FT (``wise_alpha``): ``θ = (1 − α)·θ_start + α·θ_adapted``; ``None``/1 skips it.

    ``max_minutes`` budgets (training only; the evaluations asked for are reported apart) are split between the
    stages by ``coco_share`` / ``finetune_share`` / ``distill_share`` (renormalised over the stages that run; a
    stage switched on with an automatic share of 0 gets the mean of the others'). ``coco_steps`` /
    ``finetune_steps`` / ``distill_steps`` fix a stage's optimizer steps instead (a whole number >= 1; None:
    planned). 0 is refused rather than read as "skip": a stage is left out with its switch (``skip_coco``,
    ``skip_finetune``, ``skip_distill``). The stage mappings are
    checked against their arguments class (names, types, ranges) before anything is loaded; their ``max_steps`` is
    the recipe's to set (use the ``*_steps`` options).
    """

    source_split: str = _opt("train", "split of --source-data whose qrels are the labelled source task")
    max_queries: int | None = _opt(
        None, "source queries used for fine-tuning (default: all, or as many as the budget's steps use)"
    )
    corpus_pool: int | None = _opt(5, "restrict the source corpus to the positives + BM25 top-k of the kept queries")
    schedule: str = _opt(
        AUTO,
        "auto: settings chosen by the starting model (docs/adaptation.md, 'How the recipe chooses its "
        "schedule'); paper: COCO -> iDRO",
        choices=("auto", "paper"),
    )
    train_max_length: int = _opt(128, "token limit of training texts (documents and spans)")
    evaluate_start: bool = _opt(
        True, "do not evaluate the starting model on the --eval splits", flag="--no-start-eval"
    )
    save_hybrid: bool = _opt(
        True, "do not save a hybrid retriever (final model + BM25) for each target corpus in OUT/hybrid"
    )
    seed: int = _opt(42, "seed of the data draws and of the first COCO run")
    eval_batch_size: int | None = _opt(
        None,
        "batch size of the evaluations and of the corpus encodings (default: 16 on a CPU, where smaller batches "
        "encode faster, 64 on a GPU)",
    )
    encode_precision: str = _opt(
        AUTO,
        "precision of the run's corpus encodings (the teacher's, the evaluations', the hybrids'): auto is bf16 "
        "where the machine computes bf16 natively (a CUDA GPU from Ampere on, a CPU with AVX-512 BF16 or AMX) and "
        "fp32 elsewhere (docs/precision.md: bf16 kept nDCG@10 on the dev splits)",
        choices=ENCODE_PRECISIONS,
    )
    guard: str = _opt(
        "on",
        "the label-free guard: before the export, the adapted and the starting model rank clozes of target "
        "documents held out from training (the user's --target-queries all train); on: export the adapted "
        "model only where it finds the held-out clozes' documents better beyond one standard error and neither its "
        "dense nor its hybrid reading is worse beyond two, else keep the starting model (also where its training "
        "shaped the readings: a document side distilled on pseudo-queries); record: read and record only; off",
        choices=("on", "record", "off"),
    )
    guard_queries: int = _opt(200, "held-out pseudo-queries per target corpus the guard reads")
    target_queries: list[str] = _opt(
        help="unlabelled target queries (DIR:SPLIT: the split's queries, its labels unread; a BEIR folder; a "
        "JSONL file) for the distillation stage and MoDIR; repeatable",
        metavar="DIR:SPLIT|DIR|FILE",
        default_factory=list,
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
        data = _without_retired(data, known)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown recipe option(s) {unknown}; known: {sorted(known)}")
        options = [s.training_options for s in cls.settings_classes() if hasattr(s, "training_options")]
        for stage in options:
            sub = data.get(stage) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments, got {sub!r}")
            bad = [k for k in sub if k.endswith("_dir")]
            if bad:
                raise ConfigError(
                    f"recipe option {stage}.{bad[0]}: the recipe places every stage inside --output_dir; remove it"
                )
        cfg = cls(**{k: v for k, v in data.items() if k not in options or v is not None})
        cfg.validate()
        return cfg

    @classmethod
    def settings_classes(cls) -> list[type]:
        """The stages' settings classes this config inherits (each with its ``check``)."""
        return [base for base in cls.__mro__[1:] if "check" in base.__dict__]

    def validate(self) -> None:
        """Refuse out-of-range settings by name (before any model is loaded): the shared options, then each stage's
        (its settings' ``check``), then the stages' mappings of training arguments."""
        check_whole(self, "max_queries", 1)
        check_whole(self, "corpus_pool", 1)
        check_whole(self, "eval_batch_size", 1)
        check_whole(self, "seed", 0, allow_none=False)
        if not isinstance(self.source_split, str) or not self.source_split:
            raise ConfigError(f"recipe option source_split must be a split name, got {self.source_split!r}")
        for flag in ("evaluate_start", "save_hybrid"):
            check_flag(self, flag)
        for name in ("methods", "target_queries"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ConfigError(f"recipe option {name} must be a list of names, got {v!r}")
        for settings in self.settings_classes():
            settings.check(self)
        self._check_stage_arguments()
        if self.encode_precision not in ENCODE_PRECISIONS:
            raise ConfigError(
                f"recipe option encode_precision must be 'auto', 'fp32' or 'bf16', got {self.encode_precision!r}"
            )
        if self.schedule not in ("auto", "paper"):
            raise ConfigError(f"recipe option schedule must be 'auto' or 'paper', got {self.schedule!r}")
        if self.skip_distill is False and not self.target_queries and getattr(self, "pseudo_queries", 0) == 0:
            raise ConfigError(
                "recipe option skip_distill is false but no target queries are given: the distillation trains on "
                "unlabelled target queries (--target-queries DIR:SPLIT, a BEIR folder or a JSONL file) or on "
                "pseudo-queries drawn from the target corpora (--pseudo-queries N)"
            )
        if self.guard not in ("on", "record", "off"):
            raise ConfigError(f"recipe option guard must be 'on', 'record' or 'off', got {self.guard!r}")
        check_whole(self, "guard_queries", 10, allow_none=False)
        if not isinstance(self.train_max_length, int) or self.train_max_length < 8:
            raise ConfigError(
                f"recipe option train_max_length must be a whole number >= 8, got {self.train_max_length!r}"
            )

    def _check_stage_arguments(self) -> None:
        """Each stage's mapping (``coco``, ``finetune``, ...): known fields of the stage's arguments class, values of
        their types, and the class's own range checks (run by building it), so a bad value fails before any model
        is loaded."""
        for settings in self.settings_classes():
            option = getattr(settings, "training_options", None)
            if option is not None and getattr(self, option) != {}:  # (nothing to check: no trainer to import)
                check_training_arguments(option, getattr(self, option), settings.arguments_class())


def _without_retired(data: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """``data`` less the retired options (:mod:`hf_cocodr.retired`) and the retired fields of its ``distill:``
    mapping: one that acted is refused by name, one at the value at which it did nothing is left out and said so."""
    ignored = refuse_retired({k: v for k, v in data.items() if k not in known})
    distill = data.get("distill")
    fields_ignored = []
    if isinstance(distill, dict):
        fields_ignored = refuse_retired(distill, "recipe option distill.", RETIRED_DISTILL_FIELDS)
    if ignored or fields_ignored:
        logger.warning(
            "recipe options %s: retired, at the value at which they did nothing; ignored",
            ", ".join([*ignored, *(f"distill.{name}" for name in fields_ignored)]),
        )
        data = {k: v for k, v in data.items() if k not in ignored}
        if fields_ignored:
            data["distill"] = {k: v for k, v in distill.items() if k not in fields_ignored}
    return data


@dataclass
class RecipeArguments:
    """What ``hf-cocodr recipe`` runs :func:`~hf_cocodr.recipe.run_recipe` on: the command's flags beside the
    :class:`RecipeConfig` ones (a ``--config`` file may hold them too, the command line wins)."""

    model: str | None = _opt(None, "starting encoder")
    target_corpus: list[str] = _opt(
        help="target-domain BEIR folder, JSONL file or Hub dataset id (repeatable); only documents are read",
        default_factory=list,
    )
    source_data: str | None = _opt(
        None, "BEIR folder or Hub dataset id with labelled source qrels (only where the schedule fine-tunes on it)"
    )
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
        "YAML: recipe options, those of every stage ("
        + ", ".join(stage.name for stage in STAGES)
        + ") among them, plus "
        + ", ".join(f"`{name}:`" for name in STAGE_OPTIONS)
        + " mappings of each stage's training arguments (CocoPretrainingArguments for coco, "
        "IDROTrainingArguments for finetune, DistillationTrainingArguments for distill)",
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


def uses_wise(cfg: WiseSettings) -> bool:
    """Whether the recipe ends with a WiSE-FT interpolation (α of None or 1 means none)."""
    return WiseSettings.uses_wise(cfg)


# --------------------------------------------------------------------------------------------- command-line flags
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def config_class(settings: list[type]) -> type[RecipeConfig]:
    """:class:`RecipeConfig` with the options of stages it does not know yet (their ``settings`` classes): the
    config of a run with added stages, whose options are then recipe options like the built-in ones."""
    extra = tuple(s for s in dict.fromkeys(settings) if s is not None and not issubclass(RecipeConfig, s))
    if not extra:
        return RecipeConfig
    return dataclass(type("RecipeConfig", (RecipeConfig, *extra), {"__module__": __name__}))


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_stages(stages: tuple[Stage, ...], reserved: Iterable[str] = ()) -> tuple[Stage, ...]:
    """``stages``, checked before any work: a list a run cannot keep apart is refused (``ConfigError`` naming the
    stage). A name that is not a plain identifier (it is the stage's folder ``OUT/<name>`` and the stem of its
    options), two stages of one name, a name of a built-in stage other than that stage (or a subclass of it), a name
    of an entry the run writes into ``OUT`` itself (``reserved``); names are compared case-folded (one folder on a
    case-insensitive disk). A stage's settings add options of their own: a field another stage's settings or the
    recipe's own options already have (a different field of that name) is refused, and so is a name whose options
    (``<name>_steps``, ``<name>_share``) are another stage's. Entries that are not stages are refused by
    :func:`~hf_cocodr.recipe.stages.instantiate`."""
    builtin = {cls.name.casefold(): cls for cls in STAGES}
    written = {entry.casefold(): entry for entry in reserved}
    seen: dict[str, str] = {}
    for stage in stages:
        name = stage.name
        if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):
            raise ConfigError(
                f"stage {name!r}: a stage's name must be a plain identifier (ASCII letters, digits and _, not starting "
                "with a digit): it names the stage's folder OUT/<name> and its options <name>_steps, <name>_share"
            )
        key = name.casefold()
        if key in seen:
            same = "" if seen[key] == name else f" (as {seen[key]!r})"
            raise ConfigError(
                f"stage {name!r}: the stage list names it twice{same}; give each stage a name of its own"
            )
        seen[key] = name
        if key in written:
            raise ConfigError(
                f"stage {name!r}: {written[key]!r} is an entry the recipe writes into OUT itself; give the stage "
                "another name"
            )
        if key in builtin and not isinstance(stage, builtin[key]):
            cls = builtin[key]
            raise ConfigError(
                f"stage {name!r}: the name of the built-in stage {cls.__name__}; give the stage another name (or "
                f"subclass {cls.__name__})"
            )
    # every option, with its field and who has it: the recipe's own, the built-in stages', then the list's stages'
    options = {f.name: (f, "the recipe itself") for f in fields(RecipeConfig)}
    options.update({f.name: (f, f"the built-in stage {cls.name!r}") for cls in STAGES for f in fields(cls.settings)})
    for stage in stages:
        if stage.settings is None:
            continue
        if not is_dataclass(stage.settings):
            raise ConfigError(f"stage {stage.name!r}: its settings {stage.settings!r} are not a dataclass")
        for f in fields(stage.settings):
            field, owner = options.setdefault(f.name, (f, f"stage {stage.name!r}"))
            if field is not f:  # (an inherited field is the same field: nothing shadowed)
                raise ConfigError(
                    f"stage {stage.name!r}: its settings field {f.name!r} is already an option of {owner}, which would "
                    f"shadow one of the two; rename the field (e.g. {stage.name}_{f.name})"
                )
    for stage in stages:
        own = {f.name: f for f in fields(stage.settings)} if stage.settings is not None else {}
        for option in (f"{stage.name}_steps", f"{stage.name}_share"):
            if option in options and options[option][0] is not own.get(option):
                raise ConfigError(
                    f"stage {stage.name!r}: its name makes {option!r} its option, which is an option of "
                    f"{options[option][1]}; give the stage another name"
                )
    return stages


_NUMBER_OR_WORD = {
    float | Auto: "X|auto",
    float | Auto | None: "A|none",
    int | Auto: "N|budget",
    float | None: "X|none",
    float | Literal["fit"] | Auto: "X|fit|auto",
}


def _flag(f: Field, hint: Any) -> str:
    if f.metadata.get("flag"):
        return f.metadata["flag"]
    if hint is bool and f.default is True:
        return "--no-" + f.name.replace("_", "-")
    return "--" + f.name.replace("_", "-")


def _cli_fields(cls: type) -> list[tuple[Field, Any]]:
    return [(f, _hints(cls)[f.name]) for f in fields(cls) if f.metadata.get("cli", True)]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type = RecipeConfig) -> None:
    """One flag per field of ``cls`` (:class:`RecipeConfig` or :class:`RecipeArguments`) a command line can set
    (not the ``coco`` / ``finetune`` / ``distill`` mappings): ``--field-name`` or the field's ``flag``, with its help
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
            value = _number_or_word(value, _flag(f, hint), hint, f.metadata.get("metavar"))
        out[f.name] = value
    return out


def _number_or_word(value: str, flag: str, hint: Any, metavar: str | None = None) -> Any:
    text = value.strip().lower()
    if hint == int | Auto and metavar == "N|auto":  # a count or auto (no 'budget')
        if text == Auto.AUTO:
            return AUTO
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{flag} must be a whole number >= 0 or 'auto', got {value!r}") from None
    if hint in (float | Auto | None, float | None) and text in ("none", "off"):
        return None
    if hint == float | Auto | None and metavar == "X|none|auto":  # a positive number, none or auto (passes)
        try:
            return AUTO if text == Auto.AUTO else float(value)
        except ValueError:
            raise ConfigError(f"{flag} must be a number > 0, 'none' or 'auto', got {value!r}") from None
    if hint == float | Literal["fit"] | Auto:  # a number, fitted or auto (the distillation teacher's weight)
        try:
            return {"fit": "fit", "auto": AUTO}[text] if text in ("fit", "auto") else float(value)
        except ValueError:
            raise ConfigError(f"{flag} must be a number in [0, 1], 'fit' or 'auto', got {value!r}") from None
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
