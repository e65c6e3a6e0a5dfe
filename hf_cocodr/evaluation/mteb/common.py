"""What the MTEB modules share: constants, name validation, MTEB name lookup and a quiet context for mteb calls."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from ...utils import hub_id_problem, import_mteb

MAIN_SCORE = "ndcg_at_10"
RESULTS_REPO = "https://github.com/embeddings-benchmark/results"
MTEB_REPO = "https://github.com/embeddings-benchmark/mteb"
TRAINING_CODE_URL = "https://github.com/hf-cocodr/hf_cocodr"
DEFAULT_LANGUAGES = ("eng-Latn",)

_TASK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")

# BEIR folder names whose MTEB task is not the same word (the others match case-insensitively, e.g. scifact/SciFact).
_BEIR_TO_MTEB = {
    "fiqa": "FiQA2018",
    "webis-touche2020": "Touche2020",
    "touche2020": "Touche2020",
    "dbpedia-entity": "DBPedia",
    "quora": "QuoraRetrieval",
    "cqadupstack": "CQADupstackRetrieval",
    "msmarco": "MSMARCO",
}


# --------------------------------------------------------------------------------------------------- validation
def check_model_name(model_name: str | None) -> str:
    """Validate an MTEB model name (``ORG/NAME``, as on the Hub) and return it.

    Checked here rather than left to ``mteb.ModelMeta`` so the message names the CLI option and comes before the model
    is loaded.

    Raises:
        ValueError: if the name is missing or not of the form ``organization/model_name``.
    """
    if hub_id_problem(model_name) is not None:
        raise ValueError(
            f"--model-name must look like ORG/NAME (e.g. 'my-org/cocodr-base-scifact'), got {model_name!r}: MTEB "
            "stores results under results/ORG__NAME/REV/ and refuses model names without an organisation."
        )
    return str(model_name)


def check_revision(revision: str) -> str:
    """Validate a revision label (a Hub commit SHA or any folder-safe label) and return it."""
    if not revision or not _REVISION_RE.match(str(revision)):
        raise ValueError(
            f"--revision must be a Hub commit SHA or a label of letters, digits, '.', '_' and '-', got {revision!r}."
        )
    return str(revision)


def check_task_name(task_name: str) -> str:
    """Validate a local task name: a file name (``{TASK}.json``) that does not shadow a built-in MTEB task."""
    if not task_name or not _TASK_NAME_RE.match(str(task_name)):
        raise ValueError(
            f"--task-name must be letters, digits, '.', '_' and '-' (it becomes the file name {{TASK}}.json), "
            f"got {task_name!r}."
        )
    builtin = mteb_task_names().get(normalize_task_name(task_name))
    if builtin is not None:
        raise ValueError(
            f"task name {task_name!r} is the built-in MTEB task {builtin!r}: results of a local folder under that name "
            f"would be mistaken for the official task. Use --tasks {builtin} for the official task, or another name "
            f"for the local folder (e.g. {task_name}-local)."
        )
    return str(task_name)


# ------------------------------------------------------------------------------------------------- MTEB names
def normalize_task_name(name: str) -> str:
    """``"SciFact"``, ``"sci-fact"`` → ``"scifact"``: the key names are compared by."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@lru_cache(maxsize=1)
def mteb_task_names() -> dict[str, str]:
    """Normalised name → MTEB task name, for every task in the installed mteb (no network)."""
    mteb = import_mteb()  # heavy (about 9 s): imported on first use only

    return {normalize_task_name(t.metadata.name): t.metadata.name for t in mteb.get_tasks()}


@lru_cache(maxsize=1)
def mteb_retrieval_task_names() -> dict[str, str]:
    """Normalised name → MTEB task name, for the retrieval tasks of the installed mteb (no network)."""
    mteb = import_mteb()  # heavy: imported on first use only

    return {normalize_task_name(t.metadata.name): t.metadata.name for t in mteb.get_tasks(task_types=["Retrieval"])}


def _dataset_label(spec: str) -> str:
    """``"../data/scifact"`` → ``"scifact"``, ``"squad-v1.1:train"`` → ``"squad-v1.1"``."""
    spec = str(spec).strip().rstrip("/\\")
    if ":" in spec and not re.match(r"^[A-Za-z]:[\\/]", spec):  # "name:split", not a Windows drive
        spec = spec.rsplit(":", 1)[0]
    name = Path(spec).name or spec
    for suffix in (".jsonl", ".json", ".tsv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def mteb_dataset_name(spec: str) -> str:
    """The MTEB name of a training data set when MTEB has it (``scifact`` → ``SciFact``), else its own label."""
    label = _dataset_label(spec)
    known = mteb_retrieval_task_names()
    alias = _BEIR_TO_MTEB.get(label.lower())
    if alias and normalize_task_name(alias) in known:
        return known[normalize_task_name(alias)]
    return known.get(normalize_task_name(label), label)


# -------------------------------------------------------------------------------------------------------- quiet
@contextlib.contextmanager
def warnings_quiet() -> Iterator[None]:
    """Silence mteb's INFO logs, ``datasets`` progress bars and deprecation chatter for the duration of a call."""
    import datasets  # pulls in pyarrow and pandas: only when mteb runs

    loggers = [logging.getLogger(n) for n in ("mteb", "sentence_transformers", "datasets")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if not bars_were_disabled:
            datasets.enable_progress_bars()
