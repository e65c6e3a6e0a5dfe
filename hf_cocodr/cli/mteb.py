"""MTEB sub-commands of ``hf-cocodr``: ``mteb`` (evaluate, leaderboard layout) and ``mteb-meta`` (PR snippet).

``hf-cocodr mteb MODEL DATA_DIR --split test --task-name NAME --model-name ORG/NAME --revision REV --output-folder OUT``
evaluates a local BEIR split as an MTEB task (or ``--tasks SciFact,NFCorpus`` for built-in tasks, which need the Hub
or a local datasets cache) and writes ``OUT/results/ORG__NAME/REV/{NAME}.json`` and ``model_meta.json``.
With ``--hybrid`` the task runs the hybrid of MODEL and bm25s (:mod:`hf_cocodr.evaluation.mteb.hybrid`), its
``model_meta.json`` with ``model_type`` ``["hybrid"]``.
``hf-cocodr mteb-meta MODEL_DIR --model-name ORG/NAME --revision SHA`` prints the ``ModelMeta`` for an mteb
model-implementation PR and the steps of a results submission.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ..data.sources import hub_dataset_spec, resolve_data
from ..rundir.run_record import RunFolder, fingerprint, read_record
from ..utils import atomic_write_text
from .main import UsageError, add_fusion_flags, add_index_flags, add_overwrite_flag, index_flags, register

logger = logging.getLogger("hf_cocodr.cli")


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


# ------------------------------------------------------------------------------------------------------- mteb
def _add_mteb(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="sentence-transformers directory, raw transformers checkpoint (CLS/dot) or Hub id")
    p.add_argument(
        "data_dir",
        nargs="?",
        default=None,
        help="BEIR folder or Hub dataset id (mteb/NAME, BeIR/NAME; @REVISION optional) to evaluate as a local MTEB "
        "task (omit when using --tasks)",
    )
    p.add_argument("--split", default="test", help="qrels split of DATA_DIR (default: test)")
    p.add_argument(
        "--task-name",
        default=None,
        help="name of the local task, the results file NAME.json (default: <folder>-<split>)",
    )
    p.add_argument(
        "--tasks",
        default=None,
        help="comma-separated built-in MTEB tasks, e.g. SciFact,NFCorpus (need the Hub or a local cache)",
    )
    p.add_argument("--model-name", required=True, help="model name as published, ORG/NAME")
    p.add_argument(
        "--revision", default=None, help="model revision, the Hub commit SHA (default: a content hash of the weights)"
    )
    p.add_argument(
        "--output-folder",
        default="mteb_results",
        help="MTEB results folder: OUT/results/ORG__NAME/REV/ (default: mteb_results)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--languages",
        default="eng-Latn",
        help="comma-separated ISO 639-3 + script codes of the model and the local data (default: eng-Latn)",
    )
    p.add_argument("--overwrite", action="store_true", help="re-run tasks that already have results in OUT")
    p.add_argument("--prediction-folder", default=None, help="also save the top-ranked documents per query here")
    p.add_argument("--device", default=None)
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="run the hybrid of MODEL and bm25s over each task's corpus (fusion fitted per corpus without "
        "labels) through mteb's search protocol; --model-name names the hybrid (model_type hybrid)",
    )
    add_fusion_flags(p, "with --hybrid: the dense system's weight in [0, 1] instead of the fitted one")
    add_index_flags(p, "with --hybrid: ")
    p.add_argument(
        "--dense-model-name",
        default=None,
        help="with --hybrid: the dense part's published name in model_meta.json (default: the Hub id given, or the "
        "base model mteb knows for an untrained local copy, else the folder)",
    )
    add_overwrite_flag(p)


def _claim_results_folder(args, tasks: list[str]) -> RunFolder:
    """The results folder, claimed like every output (owner record + lock). Results of earlier hf-cocodr mteb runs
    there are its own and stay (mteb adds a folder per model and revision); the record's ``results`` says what
    computed each file (the model's content hash, the data's revision, the system: :func:`run_mteb`'s
    ``provenance``), carried over from run to run, so that a file another model or other data left under this name
    and revision is computed again, never printed as this run's."""
    earlier = read_record(Path(args.output_folder).expanduser()) or {}
    computed = earlier.get("results") if earlier.get("command") == "mteb" else None
    run = RunFolder.claim(
        args.output_folder,
        "mteb",
        {"model": fingerprint(args.model), "tasks": tasks, "data": fingerprint(args.data_dir)},
        overwrite=args.overwrite_output_dir,
        replaces_own=True,
    )
    run.record["results"] = dict(computed) if isinstance(computed, dict) else {}
    return run


def _rank_scratch(args) -> str | None:
    """Under ``torchrun``, a rank other than 0 computes what rank 0 computes (the hybrid's corpus encoding is
    shared, :func:`~hf_cocodr.retrieval.encoding.encode_sharded`) but writes into a scratch copy of the results
    folder, taken before rank 0 writes anything (so it skips or computes the same tasks); returns that scratch
    folder (None on rank 0 and in one process), which the caller removes."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "RANK" not in os.environ:
        return None
    from ..distributed import barrier, is_main

    scratch = None
    if not is_main():
        scratch = tempfile.mkdtemp(prefix="hf-cocodr-mteb-rank-")
        out = Path(scratch) / "results"
        if Path(args.output_folder).expanduser().is_dir():
            shutil.copytree(Path(args.output_folder).expanduser(), out, symlinks=True)
        args.output_folder = str(out)
        if args.prediction_folder:
            args.prediction_folder = str(Path(scratch) / "predictions")
    barrier()  # rank 0 writes only once the others hold their copy
    return scratch


def _drop_scratch(scratch: str | None) -> None:
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _data_dir(given: str) -> str:
    """DATA_DIR as the task reads it: a BEIR folder, or a Hub dataset id read into its cached BEIR folder (before any
    model loads)."""
    if not Path(given).expanduser().is_dir() and hub_dataset_spec(given) is None:
        raise FileNotFoundError(
            f"BEIR folder {given} not found (expected corpus.jsonl, queries.jsonl and qrels/<split>.tsv)."
        )
    return str(resolve_data(given, "DATA_DIR"))


def _run_mteb(args, _rest) -> int:
    from ..evaluation.mteb import check_model_name, check_revision, run_mteb  # numpy, pyarrow: not at CLI start

    check_model_name(args.model_name)
    if args.revision is not None:
        check_revision(args.revision)
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    given = (("rule", args.fusion), ("dense_weight", args.dense_weight), ("normalize", args.fusion_normalize))
    fusion = {k: v for k, v in given if v is not None}
    if (fusion or args.dense_model_name) and not args.hybrid:
        raise UsageError("--fusion / --dense-weight / --fusion-normalize / --dense-model-name need --hybrid")
    given_index = index_flags(args)
    index = None  # the default: results files keep the inputs earlier runs recorded
    if given_index != {"kind": "auto", "exact_max_docs": 1_000_000}:
        if not args.hybrid:
            raise UsageError("--index / --index-exact-max-docs need --hybrid (mteb searches the dense model itself)")
        from ..retrieval.ann import IndexChoice

        index = IndexChoice(**given_index).check()  # faiss for an approximate kind, before any work
    if args.hybrid:
        from ..retrieval.fusion import FusionConfig

        FusionConfig(**fusion)  # a bad weight fails before any work
    tasks = _csv(args.tasks)
    if args.data_dir is None and not tasks:
        raise UsageError("give a BEIR folder (DATA_DIR) or built-in MTEB tasks (--tasks SciFact,NFCorpus)")
    if args.data_dir is None and args.task_name:
        raise UsageError(
            "--task-name names a local BEIR folder task; give DATA_DIR too (built-in tasks keep their names)"
        )
    if args.data_dir is not None:
        args.data_dir = _data_dir(args.data_dir)
    model_path = Path(args.model).expanduser()
    if not model_path.exists() and "/" not in args.model:
        raise FileNotFoundError(
            f"model {args.model!r} not found: no such directory, and it is not a Hub id (org/name)."
        )
    scratch = _rank_scratch(args)
    run = _claim_results_folder(args, tasks)
    try:
        result = run_mteb(
            args.model,
            args.data_dir,
            args.split,
            args.task_name,
            args.model_name,
            args.revision,
            args.output_folder,
            tasks=tasks or None,
            batch_size=args.batch_size,
            languages=_csv(args.languages) or ["eng-Latn"],
            overwrite=args.overwrite,
            prediction_folder=args.prediction_folder,
            device=args.device,
            hybrid=args.hybrid,
            fusion=fusion or None,
            dense_model_name=args.dense_model_name,
            provenance=run.record["results"],
            index=index,
        )
    finally:
        run.release()
        _drop_scratch(scratch)
    for name, scores in result["tasks"].items():
        if "skipped" in scores:  # this run computed no score for it: none is printed as this run's
            logger.info("%s: skipped: %s; results in %s", name, scores["skipped"], scores["file"])
        else:
            logger.info(
                "%s: nDCG@10 %s, Recall@100 %s, MRR@10 %s",
                name,
                scores.get("ndcg@10"),
                scores.get("recall@100"),
                scores.get("mrr@10"),
            )
    logger.info("results: %s", result["results_folder"])
    print(json.dumps(result))
    return 0


register(
    "mteb",
    "run MTEB (local BEIR folder or built-in tasks) and write the leaderboard results layout",
    _add_mteb,
    _run_mteb,
)


# -------------------------------------------------------------------------------------------------- mteb-meta
def _add_mteb_meta(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="the model directory (sentence-transformers or raw checkpoint)")
    p.add_argument("--model-name", required=True, help="model name as published on the Hub, ORG/NAME")
    p.add_argument("--revision", required=True, help="Hub commit SHA of the published model")
    p.add_argument("--output-folder", default="mteb_results", help="the hf-cocodr mteb --output-folder, for the steps")
    p.add_argument("--languages", default="eng-Latn", help="comma-separated ISO 639-3 + script codes")
    p.add_argument("--license", default=None, help="default: the model card's license, else apache-2.0")
    p.add_argument(
        "--training-datasets",
        default=None,
        help="comma-separated extra training data sets (MTEB names), on top of hf_cocodr_training.json",
    )
    p.add_argument("--adapted-from", default=None, help="base model (default: base_model of the training info)")
    p.add_argument("--output", default=None, help="also write the snippet to this file")


def _run_mteb_meta(args, _rest) -> int:
    from ..evaluation.mteb import check_model_name, check_revision, mteb_meta_snippet, results_dir  # not at CLI start

    check_model_name(args.model_name)
    check_revision(args.revision)
    model_dir = Path(args.model_dir).expanduser()
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {args.model_dir} not found.")
    extra = _csv(args.training_datasets)
    snippet = mteb_meta_snippet(
        model_dir,
        args.model_name,
        args.revision,
        output_folder=args.output_folder,
        languages=_csv(args.languages) or ["eng-Latn"],
        license=args.license,
        training_datasets=extra or None,
        adapted_from=args.adapted_from,
    )
    if args.output:
        atomic_write_text(args.output, snippet)
    print(snippet, end="")
    rel = results_dir("", args.model_name, args.revision).as_posix()
    print(
        json.dumps(
            {
                "model_name": args.model_name,
                "revision": args.revision,
                "results_path": rel,
                "snippet_file": str(Path(args.output).resolve()) if args.output else None,
            }
        )
    )
    return 0


register(
    "mteb-meta",
    "print the mteb ModelMeta (model-implementation PR) and the results-submission steps",
    _add_mteb_meta,
    _run_mteb_meta,
)
