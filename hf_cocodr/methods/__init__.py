"""The other seed methods, as composable options of the same trainers.

Each method is a :class:`Method` (its own module: settings dataclass, hooks into the trainer, citation) registered
in :mod:`hf_cocodr.methods.registry`; adding one is a new module plus one registry line.

* :class:`MoDIRObjective` (momentum adversarial domain-invariant representations) and :class:`BERMObjective`
  (balanced and extractable representations) are auxiliary terms of :class:`~hf_cocodr.IDROLoss`
  (``IDROLoss(model, auxiliary=[...])``), so they combine with any preset (paper iDRO, GroupDRO, uniform).
* RMSC (domain / relevance soft tokens) changes the data and the tokenizer: :class:`RMSCTrainingData`,
  :func:`add_rmsc_tokens`; its hooks keep every batch of the IDROTrainer to one token combination.

:func:`configure_methods` wires them from names, as ``hf-cocodr finetune --method modir --method berm`` does.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import Method, check_number
from .berm import BERM, BERMObjective, BERMSettings, BM25Scorer, balance_loss, extraction_loss
from .modir import (
    MoDIR,
    MoDIRObjective,
    MoDIRSettings,
    confusion_loss,
    domain_classifier_accuracy,
    domain_classifier_probe,
    target_query_texts,
    target_texts,
)
from .registry import BUILTIN, get_method, register_method, registered_methods, unregister_method
from .rmsc import (
    RMSC,
    GroupedBatchSampler,
    RMSCSettings,
    RMSCTrainingData,
    add_rmsc_tokens,
    set_rmsc_template,
    weak_pairs,
)

METHODS = tuple(cls.name for cls in BUILTIN)  # the built-in methods; registered_methods() has plug-ins too

__all__ = [
    "BERM",
    "BERMObjective",
    "BERMSettings",
    "BM25Scorer",
    "GroupedBatchSampler",
    "METHODS",
    "Method",
    "MoDIR",
    "MoDIRObjective",
    "MoDIRSettings",
    "RMSC",
    "RMSCSettings",
    "RMSCTrainingData",
    "add_rmsc_tokens",
    "balance_loss",
    "check_number",
    "configure_methods",
    "confusion_loss",
    "domain_classifier_accuracy",
    "domain_classifier_probe",
    "extraction_loss",
    "get_method",
    "register_method",
    "registered_methods",
    "set_rmsc_template",
    "target_query_texts",
    "target_texts",
    "unregister_method",
    "validate_methods",
    "weak_pairs",
]


def _and(names: list[str]) -> str:
    return " and ".join(names)


def method_target_queries(methods, target_queries) -> list:
    """The target queries the named ``methods`` read: all of them when one of the methods reads target queries,
    none otherwise (they may be given for another reader, such as the recipe's distillation stage)."""
    known = registered_methods()
    reads = any(known[m].reads_target_queries for m in (str(x).lower() for x in methods) if m in known)
    return list(target_queries) if reads else []


def validate_methods(methods, target_corpora=(), target_queries=()) -> list[str]:
    """The method names, lower-cased; a ConfigError for an unknown name, a method that reads a target stream
    without one, or target queries without a method that reads them."""
    methods = [str(m).lower() for m in methods]
    known = registered_methods()
    unknown = sorted(set(methods) - set(known))
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; choose from {list(known)}")
    chosen = list(dict.fromkeys(m for m in known if m in methods))  # registry order
    needy = [m for m in chosen if known[m].reads_target_corpora]
    if needy and not target_corpora:
        raise ConfigError(
            f"{_and(needy)} need(s) a target stream "
            "(the target corpora): pass --target-corpus DIR (unlabelled target documents)"
        )
    readers = [known[m] for m in known if known[m].reads_target_queries]
    if target_queries and not any(cls.name in methods for cls in readers):
        names = [cls.label or cls.name for cls in readers]
        flags = " or ".join(f"--method {cls.name}" for cls in readers)
        raise ConfigError(
            f"target queries are only read by {_and(names) or 'no method'}: add {flags} or drop --target-queries"
        )
    return methods


def build_methods(methods, model, args, data, target_corpora=(), *, target_queries=(), **overrides):
    """The :class:`Method` instances for ``methods`` (names, in registry order, each once) and the training data
    after their ``prepare_data`` transforms. Every method is built from the untransformed ``data``."""
    methods = validate_methods(methods, target_corpora, target_queries)
    known = registered_methods()
    instances = [
        known[name].build(model, args, data, target_corpora=target_corpora, target_queries=target_queries, **overrides)
        for name in known
        if name in methods
    ]
    for method in instances:
        data = method.prepare_data(model, data)
    return instances, data


def configure_methods(
    methods,
    model,
    args,
    data,
    loss=None,
    target_corpora=(),
    *,
    target_queries=(),
    rmsc_k: int | None = None,
    weak_mode: str | None = None,
    weak_pairs_per_corpus: int | None = None,
):
    """Build the named methods for ``model`` / ``data`` and the trainer wiring.

    ``target_queries`` (BEIR folders or JSONL files) adds unlabelled target queries to MoDIR's target stream;
    the model card then says that the model read them. The methods' hyperparameters come from ``args``
    (``modir_*``, ``berm_*``, ``rmsc_*`` fields of :class:`~hf_cocodr.IDROTrainingArguments`); the keyword
    arguments override the RMSC ones.
    RMSC mixes three training sets; by default they are balanced: as many source weak pairs as labelled source
    queries (at most 20,000), and the same number of target weak pairs shared evenly by the target corpora
    (``weak_pairs_per_corpus`` / ``args.rmsc_weak_pairs`` sets a fixed count per corpus instead).

    Returns ``(loss, data, trainer_setup)``: ``loss`` as given (``None``: the trainer builds its
    :class:`~hf_cocodr.IDROLoss`), the training data after the methods' transforms, and ``trainer_setup(trainer)``
    which adds the methods to the :class:`~hf_cocodr.IDROTrainer` (their loss terms join its IDROLoss).
    """
    names = validate_methods(methods, target_corpora, target_queries)
    overrides = {
        "rmsc_k": rmsc_k,
        "rmsc_weak_mode": weak_mode or None,
        "rmsc_weak_pairs": weak_pairs_per_corpus or None,
    }
    instances, data = build_methods(
        names, model, args, data, target_corpora, target_queries=target_queries, **overrides
    )

    def setup(trainer):
        trainer.add_methods(instances, names=names)

    return loss, data, setup
