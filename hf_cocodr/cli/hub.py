"""Hub sub-commands of ``hf-cocodr``: ``push`` and ``convert``."""

from __future__ import annotations

import argparse
import json
import os

from ..export import convert_checkpoint
from ..hub import push_directory
from ..modeling.limits import check_lengths
from .main import add_overwrite_flag, register


def _add_push(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model_dir",
        help="a sentence-transformers directory; only the model's own files go up (encoder, "
        "tokenizer, card, head, provenance, MTEB results), never links, your other files or local records",
    )
    p.add_argument("repo_id", help="org/name on the Hub")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", default=None, help="branch to push to (created if missing)")
    p.add_argument("--commit-message", dest="commit_message", default=None)


def _run_push(ns, _rest) -> int:

    url = push_directory(
        ns.model_dir, ns.repo_id, private=ns.private, revision=ns.revision, commit_message=ns.commit_message
    )
    print(json.dumps({"repo_id": ns.repo_id, "revision": ns.revision or "main", "commit_url": url}))
    return 0


register(
    "push",
    "push a model directory (encoder, Condenser head, card, MTEB results) to the Hub in one commit",
    _add_push,
    _run_push,
)


def _add_convert(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="a raw COCO-DR / Condenser / BERT checkpoint (directory or Hub id)")
    p.add_argument("out", help="output sentence-transformers directory (replaced atomically)")
    p.add_argument(
        "--name", default=None, help="the model's Hub name for the card and ModelMeta, e.g. org/cocodr-base"
    )
    p.add_argument(
        "--query-length",
        dest="query_length",
        type=int,
        default=None,
        help="query token limit (default 64, at most the model's position limit)",
    )
    p.add_argument(
        "--document-length",
        dest="document_length",
        type=int,
        default=None,
        help="document token limit (default 256, at most the model's position limit)",
    )
    p.add_argument("--legacy-format", action="store_true", help="also loadable by sentence-transformers 5.x")
    add_overwrite_flag(p)


def _run_convert(ns, _rest) -> int:
    check_lengths(ns.src, {"--query-length": ns.query_length, "--document-length": ns.document_length})
    model = convert_checkpoint(
        ns.src,
        ns.out,
        name=ns.name,
        query_length=ns.query_length,
        document_length=ns.document_length,
        legacy_format=ns.legacy_format,
        overwrite_output_dir=ns.overwrite_output_dir,
    )
    print(
        json.dumps(
            {
                "output_dir": os.path.abspath(ns.out),
                "pooling": "cls",
                "similarity": str(model.similarity_fn_name),
                "query_length": model[0].query_length,
                "document_length": model[0].document_length,
            }
        )
    )
    return 0


register(
    "convert",
    "turn a raw COCO-DR checkpoint into a correct CLS/dot sentence-transformers directory",
    _add_convert,
    _run_convert,
)
