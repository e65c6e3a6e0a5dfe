"""Publish a correct ``cocodr-base`` for SentenceTransformer users: convert + evaluate + push.

The public ``OpenMatch/cocodr-base-msmarco`` / ``cocodr-large-msmarco`` checkpoints are plain BERT; loaded in
sentence-transformers they silently get mean pooling. This converts one into a CLS/dot sentence-transformers
directory (query 64 / document 256 tokens, as the paper evaluates), evaluates it on the given BEIR splits
(``eval.json`` and MTEB leaderboard files under ``mteb_results/``), regenerates the card, and pushes the model, its
card and the MTEB files in one commit (``eval.json`` stays local: its results are in the card). Offline (as here) it works on any local raw checkpoint and an ``HF_ENDPOINT`` stand-in.

    python scripts/tools/publish_cocodr.py --src OpenMatch/cocodr-base-msmarco --out outputs/cocodr-base \\
        --repo-id myorg/cocodr-base --eval $HF_COCODR_DATA/scifact:train --eval $HF_COCODR_DATA/nfcorpus:dev [--no-push]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="OpenMatch/cocodr-base-msmarco", help="raw checkpoint (Hub id or directory)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo-id", required=True, help="where to publish, e.g. myorg/cocodr-base")
    ap.add_argument("--eval", action="append", default=[], metavar="DIR:SPLIT")
    ap.add_argument("--no-push", action="store_true")
    ap.add_argument("--private", action="store_true")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)

    from hf_cocodr.data.beir import parse_eval_spec
    from hf_cocodr.evaluation.mteb import model_revision, run_mteb
    from hf_cocodr.export import convert_checkpoint
    from hf_cocodr.hub import push_directory, validate_repo_id
    from hf_cocodr.model_card import write_model_card
    from hf_cocodr.training_api import evaluate_all
    from hf_cocodr.utils import setup_logging

    setup_logging()
    validate_repo_id(args.repo_id)
    out = Path(args.out)
    model = convert_checkpoint(args.src, out, name=args.repo_id)
    results = evaluate_all(model, args.eval, out, batch_size=args.batch_size)
    revision = model_revision(model)
    for spec in args.eval:
        folder, split = parse_eval_spec(spec)
        task = f"{Path(folder).name}-{split}".replace("_", "-")
        run_mteb(
            model,
            folder,
            split,
            task_name=task,
            model_name=args.repo_id,
            revision=revision,
            output_folder=out / "mteb_results",
            batch_size=args.batch_size,
        )
    write_model_card(
        out, model, {"model_name": args.repo_id, "base_model": args.src if not Path(args.src).exists() else None}
    )
    summary = {
        "output_dir": str(out),
        "repo_id": args.repo_id,
        "evaluation": {k: {m: v[m] for m in ("ndcg@10", "recall@100")} for k, v in results.items()},
    }
    if not args.no_push:
        summary["commit_url"] = push_directory(
            out,
            args.repo_id,
            private=args.private,
            commit_message=f"CLS/dot sentence-transformers version of {args.src}",
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
