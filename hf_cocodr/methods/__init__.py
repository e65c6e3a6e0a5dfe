"""The other seed methods, as composable options of the same trainers.

* :class:`MoDIRObjective` (momentum adversarial domain-invariant representations) and :class:`BERMObjective`
  (balanced and extractable representations) are auxiliary terms of :class:`~hf_cocodr.IDROLoss`
  (``IDROLoss(model, auxiliary=[...])``), so they combine with any preset (paper iDRO, GroupDRO, uniform).
* RMSC (domain / relevance soft tokens) changes the data and the tokenizer: :class:`RMSCTrainingData`,
  :func:`add_rmsc_tokens`; the IDROTrainer keeps every batch to one token combination.

:func:`configure_methods` wires them from names, as ``hf-cocodr finetune --method modir --method berm`` does.
"""

from __future__ import annotations

from .berm import BERMObjective, BM25Scorer, balance_loss, extraction_loss
from .modir import MoDIRObjective, confusion_loss, domain_classifier_accuracy, domain_classifier_probe
from .rmsc import GroupedBatchSampler, RMSCTrainingData, add_rmsc_tokens, set_rmsc_template, weak_pairs

METHODS = ("modir", "berm", "rmsc")

__all__ = [
    "BERMObjective", "BM25Scorer", "GroupedBatchSampler", "METHODS", "MoDIRObjective", "RMSCTrainingData",
    "add_rmsc_tokens", "balance_loss", "configure_methods", "confusion_loss", "domain_classifier_accuracy",
    "domain_classifier_probe", "extraction_loss", "set_rmsc_template", "target_query_texts", "validate_methods",
    "weak_pairs",
]


def target_texts(target_corpora, max_texts: int = 50_000, seed: int = 0) -> list[str]:
    """Unlabelled target texts for MoDIR: documents of the target corpora (a random sample if very large)."""
    import numpy as np

    from ..data.spans import corpus_source

    texts = [t for c in target_corpora for t in corpus_source(c).texts() if t.strip()]
    if len(texts) > max_texts:
        idx = np.random.default_rng(seed).choice(len(texts), max_texts, replace=False)
        texts = [texts[i] for i in sorted(idx)]
    return texts


def target_query_texts(sources) -> tuple[list[str], list[str]]:
    """Unlabelled target queries for MoDIR: ``(texts, names)`` from BEIR folders (their ``queries.jsonl``; qrels are
    never read) or JSONL files with a ``text`` field."""
    from pathlib import Path

    from ..data.beir import load_queries
    from ..data.spans import corpus_source
    from ..errors import ConfigError

    texts, names = [], []
    for spec in sources:
        path = Path(str(spec)).expanduser()
        if path.is_dir():
            texts += [t for t in load_queries(path)["text"] if t and t.strip()]
            names.append(path.name)
        elif path.is_file():
            texts += [t for t in corpus_source(path).texts() if t.strip()]
            names.append(path.name)
        else:
            raise ConfigError(f"target queries {spec!r}: no such BEIR folder or JSONL file")
    if sources and not texts:
        raise ConfigError(f"target queries {list(map(str, sources))}: no non-empty query text found")
    return texts, names


def validate_methods(methods, target_corpora=(), target_queries=()) -> list[str]:
    """The method names, lower-cased; a ConfigError for an unknown name, MoDIR/RMSC without a target stream, or
    target queries without MoDIR (the only method that reads them)."""
    from ..errors import ConfigError

    methods = [str(m).lower() for m in methods]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if ("modir" in methods or "rmsc" in methods) and not target_corpora:
        raise ConfigError(f"{' and '.join(m for m in ('modir', 'rmsc') if m in methods)} need(s) a target stream "
                          "(the target corpora): pass --target-corpus DIR (unlabelled target documents)")
    if target_queries and "modir" not in methods:
        raise ConfigError("target queries are only read by MoDIR: add --method modir or drop --target-queries")
    return methods


def configure_methods(methods, model, args, data, loss=None, target_corpora=(), *, target_queries=(),
                      rmsc_k: int | None = None, weak_mode: str | None = None,
                      weak_pairs_per_corpus: int | None = None):
    """Build the loss / data / trainer options for the named methods.

    ``target_queries`` (BEIR folders or JSONL files) adds unlabelled target queries to MoDIR's target stream;
    the model card then says that the model read them. The methods' hyperparameters come from ``args``
    (``modir_*``, ``berm_*``, ``rmsc_*`` fields of :class:`~hf_cocodr.IDROTrainingArguments`); the keyword
    arguments override the RMSC ones.
    RMSC mixes three training sets; by default they are balanced: as many source weak pairs as labelled source
    queries (at most 20,000), and the same number of target weak pairs shared evenly by the target corpora
    (``weak_pairs_per_corpus`` / ``args.rmsc_weak_pairs`` sets a fixed count per corpus instead).

    Returns ``(loss, data, trainer_setup)`` where ``trainer_setup(trainer)`` finishes the wiring (RMSC).
    """
    from ..data.spans import corpus_source
    from ..finetuning.losses.idro import IDROLoss

    methods = validate_methods(methods, target_corpora, target_queries)
    rmsc_k = rmsc_k if rmsc_k is not None else args.rmsc_k
    weak_mode = weak_mode or args.rmsc_weak_mode
    weak_pairs_per_corpus = weak_pairs_per_corpus or args.rmsc_weak_pairs
    aux = []
    query_texts, query_names = target_query_texts(target_queries) if target_queries else ([], [])
    if "modir" in methods:
        aux.append(MoDIRObjective(target_texts(target_corpora, seed=args.seed), model.get_embedding_dimension(),
                                  target_queries=query_texts,
                                  queue_batches=args.modir_queue_batches, lambda0=args.modir_lambda,
                                  half_life=args.modir_half_life, classifier_lr=args.modir_classifier_lr,
                                  seed=args.seed))
    if "berm" in methods:
        aux.append(BERMObjective(model.tokenizer, data.corpus_text_list(), alpha=args.berm_alpha, beta=args.berm_beta,
                                 max_length=args.max_length))
    if loss is None:
        loss = IDROLoss(model, preset=args.idro_preset, num_clusters=args.num_clusters, beta=args.idro_beta,
                        tau=args.idro_tau, grad_params=args.idro_grad_params if args.idro_preset != "reference" else None,
                        in_batch_negatives=args.in_batch_negatives, scale=args.idro_scale,
                        gather_across_devices=args.world_size > 1, auxiliary=aux)
    elif aux:
        loss.auxiliary.extend(aux)
        loss._token_states = any(getattr(a, "needs_token_states", False) for a in loss.auxiliary)

    # MoDIR and RMSC read the target documents while fine-tuning: the model card must disclose it
    readers = [m for m in methods if m in ("modir", "rmsc")]
    target_names = [corpus_source(c).name for c in target_corpora] if readers else []

    if "rmsc" in methods:
        add_rmsc_tokens(model, k=rmsc_k)
        n_source = weak_pairs_per_corpus or min(20_000, len(data))
        n_target = weak_pairs_per_corpus or max(1, -(-n_source // len(target_corpora)))
        source_weak = weak_pairs(data.corpus, weak_mode, n_source, seed=args.seed)
        target_weak = [p for i, c in enumerate(target_corpora)
                       for p in weak_pairs(c, weak_mode, n_target, seed=args.seed + 1 + i)]
        data = RMSCTrainingData(data, source_weak, target_weak)

    def setup(trainer):
        trainer.extra_methods = list(methods)
        trainer.target_corpora_read = target_names
        trainer.target_queries_read = query_names
        if "rmsc" in methods:
            trainer.rmsc_k = rmsc_k

    return loss, data, setup
