"""The ``hf-cocodr`` command line.

Each sub-command's last printed line is one JSON object (where it has a result), so scripts can parse it.
Errors in the input print one clear line (``hf-cocodr: error: ...``) and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import USER_ERRORS, OtherRankFailed, describe_os_error
from ..export import export_sentence_transformer
from ..modeling.limits import check_lengths
from ..modeling.loading import check_model_source, load_encoder
from ..utils import setup_logging

logger = logging.getLogger("hf_cocodr.cli")


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


@dataclass
class Command:
    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    passthrough: bool = False  # accepts any TrainingArguments flag after its own


COMMANDS: dict[str, Command] = {}


def register(name: str, help: str, add_args, run, passthrough: bool = False) -> None:
    COMMANDS[name] = Command(name, help, add_args, run, passthrough)


# --------------------------------------------------------------------------------------------------- evaluate
def _add_evaluate(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="sentence-transformers directory, raw transformers checkpoint, or Hub id")
    p.add_argument("data_dir", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
    p.add_argument("--split", default="test")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--query-max-length", type=int, default=None)
    p.add_argument("--doc-max-length", type=int, default=None)
    p.add_argument("--top-k", type=int, default=1000)
    p.add_argument("--backend", choices=["auto", "faiss", "torch"], default="auto")
    add_index_flags(p, "")
    p.add_argument(
        "--encode-precision",
        dest="encode_precision",
        choices=["fp32", "bf16", "int8"],
        default="fp32",
        help="fp32 (exact), bf16 (autocast; fast only with native bf16) or int8 (dynamic, CPU)",
    )
    p.add_argument("--output", default=None, help="also write the JSON result and the run (top-100 per query) here")
    p.add_argument("--trust-remote-code", action="store_true", help="run modelling code shipped with the checkpoint")
    p.add_argument(
        "--hybrid",
        action="store_true",
        help="evaluate the hybrid of the model and BM25 (top-level metrics; dense and bm25 beside them)",
    )
    add_fusion_flags(
        p,
        "with --hybrid: the dense system's weight in [0, 1] (default: fitted to the corpus without labels, "
        "from pseudo-queries drawn from it and made as easy for BM25 as the evaluated queries; the JSON's fusion says "
        "which weight and how)",
    )


def _run_evaluate(args, _rest) -> int:
    from ..evaluation.retrieval import evaluate_retrieval, print_result_line, write_result

    _positive("--batch-size", args.batch_size)
    _positive("--top-k", args.top_k)
    _output_file("--output", args.output)
    from ..data.beir import load_beir
    from ..retrieval.ann import IndexChoice

    index = IndexChoice(**index_flags(args)).check(args.backend)  # faiss for an approximate kind, before any work

    given = (("rule", args.fusion), ("dense_weight", args.dense_weight), ("normalize", args.fusion_normalize))
    fusion = {k: v for k, v in given if v is not None}
    if fusion and not args.hybrid:
        raise UsageError("--fusion / --dense-weight / --fusion-normalize need --hybrid")
    if args.hybrid:
        from ..retrieval.fusion import FusionConfig

        FusionConfig(**fusion)  # a bad weight fails before any work
    data = load_beir(args.data_dir, args.split)  # bad data fails before the model is loaded
    check_model_source(args.model)
    check_lengths(args.model, {"--query-max-length": args.query_max_length, "--doc-max-length": args.doc_max_length})
    model = load_encoder(args.model, trust_remote_code=args.trust_remote_code)
    result = evaluate_retrieval(
        model,
        data,
        args.split,
        batch_size=args.batch_size,
        query_max_length=args.query_max_length,
        doc_max_length=args.doc_max_length,
        top_k=args.top_k,
        backend=args.backend,
        return_run=True,
        encode_precision=args.encode_precision,
        hybrid=args.hybrid,
        fusion=fusion or None,
        index=index,
    )
    run = result.pop("run")
    print_result_line(result)  # before --output is written: a failing write never loses the metrics
    if args.output and _writes_outputs():
        write_result(args.output, result, run)
    return 0


register("evaluate", "exact dense retrieval evaluation of a model on a BEIR split", _add_evaluate, _run_evaluate)


# ------------------------------------------------------------------------------------------------------- bm25
def _add_bm25(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", help="BEIR folder")
    p.add_argument("--split", default="test")
    p.add_argument("--top-k", type=int, default=1000)
    p.add_argument("--output", default=None)


def _run_bm25(args, _rest) -> int:
    from ..evaluation.bm25 import evaluate_bm25
    from ..evaluation.retrieval import print_result_line

    _positive("--top-k", args.top_k)
    _output_file("--output", args.output)
    print_result_line(evaluate_bm25(args.data_dir, args.split, top_k=args.top_k, output=args.output))
    return 0


register("bm25", "BM25 baseline (bm25s, English stemmer and stop words) on a BEIR split", _add_bm25, _run_bm25)


# ----------------------------------------------------------------------------------------------------- export
def _add_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="SentenceTransformer directory, raw transformers checkpoint, or Hub id")
    p.add_argument("out", help="output directory (replaced atomically)")
    p.add_argument("--pooling", choices=["cls", "mean"], default="cls")
    p.add_argument("--similarity", choices=["dot", "cosine"], default="dot")
    p.add_argument("--max-seq-length", type=int, default=None)
    p.add_argument("--legacy-format", action="store_true", help="write the sentence-transformers 5.x module layout")
    add_overwrite_flag(p)


class FusionRules:
    """The registered fusion rules' names (:data:`hf_cocodr.retrieval.fusion.RULES`) as ``--fusion``'s choices, read
    from the registry each time argparse checks a value or prints the command's help, so building the parser imports
    no numpy and a rule registered later is offered."""

    def names(self) -> list[str]:
        from ..retrieval.fusion import RULES

        return list(RULES)

    def __iter__(self):
        return iter(self.names())

    def __contains__(self, value) -> bool:
        return value in self.names()


def add_fusion_flags(p: argparse.ArgumentParser, dense_weight_help: str) -> None:
    """``--fusion``, ``--fusion-normalize`` and ``--dense-weight``: the hybrid's fusion, as ``evaluate`` and ``mteb``
    take it (``--fusion``: any registered rule, :class:`FusionRules`)."""
    p.add_argument(
        "--fusion",
        choices=FusionRules(),
        metavar="RULE",  # argparse would list the choices when the parser is built
        default=None,
        help="with --hybrid: the fusion rule, one of %(choices)s",
    )
    p.add_argument(
        "--fusion-normalize",
        dest="fusion_normalize",
        choices=["z", "minmax", "dbsf", "none"],
        default=None,
        help="with --hybrid, convex rule: how each system's scores are normalised per query (default: fitted with the "
        "weight, z-scores beside a --dense-weight)",
    )
    p.add_argument("--dense-weight", dest="dense_weight", type=float, default=None, help=dense_weight_help)


INDEX_KINDS = ("exact", "hnsw", "ivf", "auto")  # hf_cocodr.retrieval.ann's (not imported: it loads numpy)


def add_index_flags(p: argparse.ArgumentParser, scope: str) -> None:
    """``--index`` and ``--index-exact-max-docs``: the dense index, as ``evaluate`` and ``mteb --hybrid`` take it
    (:mod:`hf_cocodr.retrieval.ann`); ``scope`` prefixes their help (``"with --hybrid: "``)."""
    p.add_argument(
        "--index",
        default="auto",
        help=f"{scope}the dense index, one of {', '.join(INDEX_KINDS)} (default auto: exact search up to "
        "--index-exact-max-docs documents, HNSW beyond; an approximate index's recall@100 against exact search is "
        "measured and recorded in the JSON's index)",
    )
    p.add_argument(
        "--index-exact-max-docs",
        dest="index_exact_max_docs",
        type=int,
        default=1_000_000,
        help=f"{scope}the largest corpus --index auto searches exactly (default 1000000)",
    )


def index_flags(args) -> dict[str, object]:
    """The :class:`~hf_cocodr.retrieval.ann.IndexChoice` fields ``--index`` and ``--index-exact-max-docs`` give,
    refused with one line (naming the flag) before any work when wrong."""
    if args.index not in INDEX_KINDS:
        raise UsageError(f"--index must be one of {', '.join(INDEX_KINDS)}, got {args.index!r}")
    _positive("--index-exact-max-docs", args.index_exact_max_docs)
    return {"kind": args.index, "exact_max_docs": args.index_exact_max_docs}


def add_overwrite_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite_output_dir",
        "--overwrite-output-dir",
        dest="overwrite_output_dir",
        action="store_true",
        help="write into a folder holding files hf_cocodr did not write (they stay "
        "untouched) and replace what an earlier run recorded there as its own",
    )


def _run_export(args, _rest) -> int:

    check_lengths(args.src, {"--max-seq-length": args.max_seq_length})  # before the model is loaded
    model = export_sentence_transformer(
        args.src,
        args.out,
        pooling=args.pooling,
        similarity=args.similarity,
        max_seq_length=args.max_seq_length,
        legacy_format=args.legacy_format,
        overwrite_output_dir=args.overwrite_output_dir,
    )
    print(
        json.dumps(
            {
                "output_dir": os.path.abspath(args.out),
                "pooling": args.pooling,
                "similarity": str(model.similarity_fn_name),
                "max_seq_length": model.max_seq_length,
            }
        )
    )
    return 0


register("export", "write a correct sentence-transformers directory (CLS/dot by default)", _add_export, _run_export)


# ------------------------------------------------------------------------------------------------------ helpers
def _writes_outputs() -> bool:
    """Whether this process writes the command's files: one process, or rank 0 of a ``torchrun`` launch."""
    if not _launched_distributed():
        return True
    from ..distributed import is_main

    return is_main()


def _positive(flag: str, value: int | float) -> None:
    if value is None or value <= 0:
        raise UsageError(f"{flag} must be positive, got {value}")


def _output_file(flag: str, path: str | None) -> None:
    """An output file is checked before the work: not a folder, and its folder (created if missing) writable."""
    if path is None:
        return

    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a folder; expected a file path such as {p / 'result.json'}")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:  # missing folders are created on writing
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the folder {parent} is not writable")
    if p.is_symlink() or (p.exists() and not _is_result_file(p)):
        raise UsageError(
            f"{flag} {path} exists and is not a result file hf-cocodr wrote; hf_cocodr never replaces "
            "files it did not write: give a new path"
        )


def _is_result_file(path: Path) -> bool:
    """Whether ``path`` holds a result an evaluation command wrote (a JSON object with metrics and a run)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(64 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "run" in data and "ndcg@10" in data


def _load_more_commands() -> None:
    """Commands defined next to their feature register themselves on import."""

    for mod in ("hf_cocodr.cli.training", "hf_cocodr.cli.hub", "hf_cocodr.cli.mteb"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


class _Parser(argparse.ArgumentParser):
    """Argument errors become one line (``hf-cocodr CMD: error: ...``, exit 2) instead of usage + message."""

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the ``argv`` it will parse, a command defined in this module (``evaluate``,
    ``bm25``, ``export``) skips importing the other commands' modules (0.3-0.6 s of a short evaluation)."""
    command = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if command not in COMMANDS:
        _load_more_commands()
    from .. import __version__

    parser = _Parser(
        prog="hf-cocodr",
        description="COCO-DR domain adaptation for dense retrievers: pretrain, fine-tune, evaluate, export, push.",
    )
    parser.add_argument("--version", action="version", version=f"hf-cocodr {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and the result line")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an input error instead of one line (or HF_COCODR_DEBUG=1)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cmd in COMMANDS.values():
        sp = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_args(sp)
    return parser


# the commands whose corpus encodings the ranks of a ``torchrun`` launch share (retrieval.encoding.encode_sharded)
DISTRIBUTED_COMMANDS = ("evaluate", "mteb", "recipe")  # (mteb: its hybrid's corpus; recipe: its trainers too)


def _launched_distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def _run_distributed(cmd: Command, args, rest: list[str]) -> int:
    """``cmd`` on one rank of a ``torchrun`` launch: it joins the process group (gloo on CPU, NCCL on CUDA) unless
    one is initialised, every rank computes the same result (sharing the corpus encodings), and only rank 0 prints
    it and writes the outputs: its output is exactly one process's. The other ranks log warnings only."""
    from .. import distributed as D

    created, ok = D.init_from_env(), False
    try:
        given = {k: v for k, v in vars(args).items() if v is None or isinstance(v, (str, int, float, bool, list))}
        D.same_settings({**given, "passed on": list(rest)}, "arguments")  # (before any work, on every rank)
        if D.is_main():
            setup_logging(logging.WARNING if args.quiet else logging.INFO)
            code = cmd.run(args, rest)
        else:
            setup_logging(logging.WARNING)
            with open(os.devnull, "w") as devnull:
                stdout, sys.stdout = sys.stdout, devnull
                try:
                    code = cmd.run(args, rest)
                finally:
                    sys.stdout = stdout
        ok = True
        return code
    finally:
        if created:
            D.destroy(wait=ok)  # (a rank that failed leaves at once: torchrun then stops the others)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)

    command = "hf-cocodr"
    first_command = next((i for i, a in enumerate(argv) if a in COMMANDS), len(argv))
    debug = bool(os.environ.get("HF_COCODR_DEBUG")) or "--debug" in argv[:first_command]
    try:
        args, rest = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        command = f"hf-cocodr {args.command}"
        cmd = COMMANDS[args.command]
        if rest and not cmd.passthrough:
            raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
        if args.command in DISTRIBUTED_COMMANDS and _launched_distributed():
            return _run_distributed(cmd, args, rest)
        setup_logging(logging.WARNING if args.quiet else logging.INFO)
        return cmd.run(args, rest)
    except OtherRankFailed as e:  # (torchrun: another rank's line, with its exit code)
        if debug:
            raise
        print(f"{command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return e.exit_code
    except (UsageError, *USER_ERRORS) as e:
        if debug:
            raise
        msg = " ".join((str(e) or type(e).__name__).split())  # one line, whatever the library wrote
        print(f"{command}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # a fault of the machine, not of the input: disk full, read-only, cross-device, ...
        if debug:
            raise
        print(f"{command}: error: {describe_os_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(
            f"{command}: interrupted; outputs are left as their last complete write (resume a training command "
            "with --resume_from_checkpoint true)",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
