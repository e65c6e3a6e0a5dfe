"""One-call Python API behind the CLI: fine-tune / pretrain a model, save it with its card, evaluate it."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

# the trainers and load_encoder are looked up on their modules at call time (tests replace them there)
from . import finetuning, pretraining
from .data.beir import check_not_datasets_folder, parse_eval_spec
from .data.target_queries import refuse_eval_overlap
from .data.training import RetrievalTrainingData
from .evaluation.evaluator import BEIRRetrievalEvaluator
from .evaluation.retrieval import evaluate_retrieval
from .finetuning.stage_info import finetune_stage_info  # noqa: F401  (re-exported: it lived here)
from .hub import check_push_possible
from .methods import build_methods, validate_methods
from .model_card import EVAL_FILE, write_model_card
from .modeling import loading
from .modeling.condenser import CondenserForPretraining, _transformer_dir
from .modeling.limits import check_lengths
from .modeling.loading import check_model_source
from .provenance import source_info
from .rundir.run_record import RunFolder
from .storage import check_before_work
from .trainer_common import TrainerMixin
from .utils import atomic_write_json, refuse_linked_destination

logger = logging.getLogger(__name__)


def previous_training_info(model_path: str | os.PathLike | None) -> dict[str, Any]:
    """The provenance of a starting model (so the card lists every stage), if it has one; for a local copy of a Hub
    model hf_cocodr did not train, the Hub id it is a copy of as ``base_model`` (see
    :func:`hf_cocodr.provenance.source_info`)."""
    return source_info(model_path)


def evaluate_all(model, evals: list[str], output_dir: str | os.PathLike | None, **kwargs) -> dict[str, dict]:
    """Evaluate on every ``DIR:SPLIT``; results keyed by the spec, written to ``output_dir/eval.json``. ``kwargs`` go
    to :func:`~hf_cocodr.evaluation.retrieval.evaluate_retrieval` (``hybrid=True``: the hybrid with BM25 at the top
    level, the dense and BM25 metrics beside it)."""
    results: dict[str, dict] = {}
    for spec in evals:
        folder, split = parse_eval_spec(spec)
        res = evaluate_retrieval(model, folder, split, show_progress_bar=False, **kwargs)
        results[spec] = res
        if "dense" in res:
            logger.info(
                "%s: nDCG@10 %.4f dense, %.4f BM25, %.4f hybrid",
                spec,
                res["dense"]["ndcg@10"],
                res["bm25"]["ndcg@10"],
                res["ndcg@10"],
            )
        else:
            logger.info("%s: nDCG@10 %.4f, Recall@100 %.4f", spec, res["ndcg@10"], res["recall@100"])
    if output_dir is not None and results:
        path = Path(output_dir) / EVAL_FILE
        prev = json.loads(path.read_text()) if path.is_file() else {}
        atomic_write_json(path, {**prev, **results})
    return results


def _check_inputs(model, paths: dict[str, Any], evals, args) -> None:
    """Everything that can be checked before data or a model is loaded: the model path (or cached Hub id when
    offline), input files, ``--eval`` specs and, with ``push_to_hub``, the repository id, the Hub and a token."""
    if isinstance(model, str | os.PathLike):
        check_model_source(model)
    for flag, values in paths.items():
        for value in [values] if isinstance(values, str | os.PathLike) else values or ():
            if isinstance(value, str | os.PathLike) and not os.path.exists(os.path.expanduser(value)):
                raise FileNotFoundError(f"{flag} {value}: no such file or folder")
            if isinstance(value, str | os.PathLike):
                check_not_datasets_folder(value, flag)
    for spec in evals:
        parse_eval_spec(spec)
    if args.push_to_hub:
        args.hub_token = TrainerMixin._prepare_hub_args(args)
        check_push_possible(args.hub_model_id, args.hub_token)


def check_output_dir(args, command: str) -> None:
    """Refuse, before any work, an ``output_dir`` that is not writable or holds files of someone else (see
    :mod:`hf_cocodr.rundir.run_record`); ``train()`` claims it for real."""
    if not args.should_save:
        return
    RunFolder.claim(
        args.output_dir,
        command,
        None,
        resume=True,
        overwrite=bool(args.overwrite_output_dir),
        trainer=True,
        dry_run=True,
    )
    parent = Path(args.output_dir).expanduser().resolve()
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output_dir {args.output_dir}: {parent} is not writable")


def run_finetune(
    model,
    train_data,
    *,
    train_split: str = "train",
    args=None,
    negatives: str = "bm25",
    max_queries: int | None = None,
    methods=(),
    evals=(),
    loss=None,
    target_corpora=(),
    target_queries=(),
    eval_during_training: str | None = None,
) -> dict[str, Any]:
    """iDRO fine-tuning end to end: load, mine BM25 negatives, train (resumable), save with card, evaluate.

    ``eval_during_training="DIR:SPLIT"`` evaluates retrieval on that labelled split every ``args.eval_steps``
    (:class:`~hf_cocodr.evaluation.evaluator.BEIRRetrievalEvaluator`: ``eval_{folder}_{split}_ndcg@10``, ...)."""
    if args is None:
        args = finetuning.IDROTrainingArguments(output_dir="outputs/finetune")
    _check_inputs(model, {"--target-corpus": target_corpora}, evals, args)
    check_lengths(model, {"max_length": args.max_length})  # the model's position limit, from its config.json
    refuse_eval_overlap(list(target_queries), list(evals))  # also reads (checks) every --target-queries source
    validate_methods(methods, target_corpora, target_queries)  # an unknown --method fails before any work
    evaluator = None
    if eval_during_training:
        folder, split = parse_eval_spec(eval_during_training, "--eval-during-training")
        evaluator = BEIRRetrievalEvaluator(folder, split)  # bad qrels fail before the model is loaded
    check_output_dir(args, "finetune")
    if args.should_save:
        check_before_work(args.output_dir, model)  # writable output and cache folders, room for checkpoints
    data = RetrievalTrainingData.from_beir(
        train_data, train_split, negatives=negatives, max_queries=max_queries, seed=args.seed
    )  # bad data fails before the model is loaded
    st = loading.load_encoder(str(model)) if isinstance(model, (str, os.PathLike)) else model
    trainer = build_idro_trainer(
        st,
        args,
        data,
        methods=methods,
        target_corpora=target_corpora,
        loss=loss,
        negatives_label=negatives,
        target_queries=target_queries,
        evaluator=evaluator,
    )
    push = args.push_to_hub
    args.push_to_hub = False  # push once, after the evaluation results are written
    train_out = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.finalize()
    result: dict[str, Any] = {
        "output_dir": os.path.abspath(args.output_dir),
        "global_step": trainer.state.global_step,
        "train_loss": round(float(train_out.training_loss), 6),
    }
    if evals and trainer.args.should_save:
        trainer._declare_outputs((EVAL_FILE, "README.md"))  # (a kill while they are written: still this run's)
        for spec, res in evaluate_all(trainer.model, list(evals), args.output_dir).items():
            result[spec] = {k: res[k] for k in ("ndcg@10", "recall@100", "mrr@10")}
        write_model_card(args.output_dir, trainer.model, trainer.card_data())
    trainer._record_outputs()  # the evaluation files are this run's too
    if push:
        args.push_to_hub = True
        result["commit_url"] = trainer.push_to_hub()
    return result


def build_idro_trainer(
    model,
    args,
    data,
    *,
    methods=(),
    target_corpora=(),
    loss=None,
    negatives_label="bm25",
    target_queries=(),
    evaluator=None,
    extra_methods=(),
):
    """An IDROTrainer for ``model`` on ``data`` with the named ``methods`` plugged in (their loss terms, data
    transforms and trainer hooks; see :func:`~hf_cocodr.methods.build_methods`), then the :class:`Method` instances
    of ``extra_methods`` (methods built by the caller)."""
    names, instances = [], []
    if methods:
        names = validate_methods(methods, target_corpora, target_queries)
        instances, data = build_methods(names, model, args, data, target_corpora, target_queries=target_queries)
    return finetuning.IDROTrainer(
        model=model,
        args=args,
        train_dataset=data,
        loss=loss,
        evaluator=evaluator,
        methods=[*instances, *extra_methods],
        card_methods=names,
        negatives_label=negatives_label,
    )


def run_pretrain(
    model, corpora, *, args=None, n_head_layers: int | None = None, skip_from: int | None = None, eval_corpora=()
) -> dict[str, Any]:
    """COCO pretraining end to end: build spans, train (resumable), export encoder + head + card to ``output_dir``;
    with ``eval_corpora`` (held-out documents) the eval losses every ``args.eval_steps``."""
    from transformers import AutoTokenizer

    if args is None:
        args = pretraining.CocoPretrainingArguments(output_dir="outputs/coco")
    if args.should_save:
        refuse_linked_destination(args.output_dir)  # (the final model replaces the folder as a whole)
    check_output_dir(args, "pretrain")
    if args.should_save:
        check_before_work(args.output_dir, model, staged_beside=True)  # the final model is swapped into place
    _check_inputs(model, {"--corpus": corpora, "--eval-corpus": eval_corpora}, (), args)
    check_lengths(model, {"max_span_length": args.max_span_length})  # the model's position limit, from config.json
    if n_head_layers is not None:
        args.n_head_layers = n_head_layers
    if skip_from is not None:
        args.skip_from = skip_from
    from transformers import set_seed

    set_seed(args.seed)  # the fresh Condenser head (and a missing MLM head) are initialised reproducibly
    cond = CondenserForPretraining.from_pretrained(
        str(model), n_head_layers=args.n_head_layers, skip_from=args.skip_from
    )
    if args.skip_from is None:
        logger.info(
            "skip_from not given: using layer %d of %d (%s)",
            cond.skip_from,
            cond.config.num_hidden_layers,
            "the paper's choice" if cond.skip_from == 6 else "half the depth",
        )
    tokenizer = AutoTokenizer.from_pretrained(_transformer_dir(str(model)))
    trainer = pretraining.CocoPretrainer(
        cond, args, corpora=list(corpora), tokenizer=tokenizer, eval_dataset=list(eval_corpora) or None
    )
    trainer.source_model = str(model)
    train_out = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.finalize()
    logged = [h for h in trainer.state.log_history if "contrastive_loss" in h]
    return {
        "output_dir": os.path.abspath(args.output_dir),
        "global_step": trainer.state.global_step,
        "train_loss": round(float(train_out.training_loss), 6),
        **{k: logged[-1][k] for k in ("mlm_loss", "head_mlm_loss", "contrastive_loss") if logged},
    }
