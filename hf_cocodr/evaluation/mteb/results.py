"""The MTEB results-repository layout (``OUT/results/ORG__NAME/REV/{TASK}.json`` + ``model_meta.json``), a summary
of a task's scores, and the steps of a leaderboard submission."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import MTEB_REPO, RESULTS_REPO


def results_dir(output_folder: str | os.PathLike, model_name: str, revision: str) -> Path:
    """``OUT/results/ORG__NAME/REV``: where MTEB writes task results and ``model_meta.json``.

    For printing a path before anything runs; :func:`~hf_cocodr.evaluation.mteb.run_mteb` asks mteb's ``ResultCache``.
    """
    # The rule of mteb's ResultCache.get_task_result_path, not a call to it: ResultCache(path) creates the folder
    # (mteb 2.26.24, cache/result_cache.py __init__: cache_path.mkdir), and this only names a path.
    return Path(output_folder) / "results" / model_name.replace("/", "__").replace(" ", "_") / revision


def _summarise(task_result) -> dict[str, Any]:
    """Main score and headline metrics of a ``TaskResult`` (averaged over subsets when there are several)."""
    # Not TaskResult.get_score: it raises KeyError when a subset lacks the metric and skips subsets without a
    # "languages" entry; here a missing metric is None and every subset counts.
    keys = {"main_score": "main_score", "ndcg@10": "ndcg_at_10", "recall@100": "recall_at_100", "mrr@10": "mrr_at_10"}
    out: dict[str, Any] = {"splits": sorted(task_result.scores)}
    entries = [e for split in task_result.scores.values() for e in split]
    for label, key in keys.items():
        vals = [float(e[key]) for e in entries if e.get(key) is not None]
        out[label] = round(sum(vals) / len(vals), 6) if vals else None
    if len(entries) > 1:
        out["subsets"] = len(entries)
    return out


def results_submission_steps(
    model_name: str,
    revision: str,
    output_folder: str | os.PathLike = "mteb_results",
    tasks: Sequence[str] = ("SciFact", "NFCorpus"),
) -> list[str]:
    """Numbered steps to publish MTEB results for ``model_name`` at ``revision``."""
    rel = f"results/{model_name.replace('/', '__')}/{revision}"
    org_file = re.sub(r"\W+", "_", model_name.split("/", 1)[0]).lower() + "_models.py"
    out = str(output_folder)
    return [
        f"Push the model to the Hub as {model_name} and use the commit SHA of that upload as the revision "
        f"(here {revision}); the leaderboard keys results by name and revision.",
        f"Model implementation: fork {MTEB_REPO}, paste the ModelMeta above into "
        f"mteb/models/model_implementations/{org_file} (create it if needed), check that "
        f"`mteb.get_model_meta({model_name!r})` returns it, and open a pull request.",
        f"Evaluate on the official MTEB tasks (local BEIR folders are not leaderboard tasks): hf-cocodr mteb MODEL_DIR "
        f"--tasks {','.join(tasks)} --model-name {model_name} --revision {revision} --output-folder {out}",
        f"Fork and clone {RESULTS_REPO}, then copy the revision folder as it is, task files and model_meta.json: "
        f"mkdir -p results/{model_name.replace('/', '__')} && cp -r {out}/{rel} results/{model_name.replace('/', '__')}/",
        f"Commit, push to your fork and open a pull request against {RESULTS_REPO} (branch main), linking the model "
        "implementation PR; the results appear on the leaderboard once both are merged.",
    ]
