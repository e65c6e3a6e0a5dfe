"""MTEB 2.x integration: any BEIR folder as an MTEB retrieval task, a generated ``ModelMeta``, leaderboard-layout results.

One module per concern:

* :mod:`.tasks` — :func:`beir_task` turns a BEIR folder and split into a local ``mteb.abstasks.AbsTaskRetrieval``
  (documents are read as ``title + " " + text``, exactly as :func:`hf_cocodr.evaluate_retrieval` encodes them).
* :mod:`.model` — :func:`mteb_model` wraps a loaded model in mteb's ``SentenceTransformerEncoderWrapper`` with the
  generated meta attached; :func:`cocodr_sentence_transformer_loader` loads a raw checkpoint with CLS/dot.
* :mod:`.meta` — :func:`model_meta_for` builds the ``mteb.ModelMeta`` of a model directory: pooling and similarity
  read from the model, parameter counts, embedding size, and the training data and base model declared in
  ``hf_cocodr_provenance.json``; a model mteb already knows (or its adaptation) starts from mteb's registered meta,
  any other from mteb's ``ModelMeta.from_sentence_transformer_model``.
* :mod:`.run` — :func:`run_mteb` runs ``mteb.evaluate`` offline into a ``mteb.ResultCache``, the layout the MTEB
  results repository expects: ``OUT/results/ORG__NAME/REV/{TASK}.json`` next to ``model_meta.json``.
* :mod:`.results` — that layout (:func:`results_dir`) and the steps of a results submission.
* :mod:`.snippet` — :func:`mteb_meta_snippet` prints the ``ModelMeta(...)`` for an mteb model-implementation PR.
* :mod:`.common` — constants, name checks, MTEB name lookup, :func:`warnings_quiet`.

Offline runs: the model is loaded locally (:func:`hf_cocodr.load_encoder`) and handed to ``mteb.evaluate`` wrapped in
mteb's ``SentenceTransformerEncoderWrapper`` with the generated ``ModelMeta`` attached, so mteb never resolves the
model name on the Hub, and ``model_meta.json`` holds the same metadata (and loader) as the model-implementation PR.

Importing this package does not import ``mteb`` (about 9 s): every module imports it inside the functions that use it.
"""

from __future__ import annotations

from .common import (
    DEFAULT_LANGUAGES,
    MAIN_SCORE,
    MTEB_REPO,
    RESULTS_REPO,
    TRAINING_CODE_URL,
    check_model_name,
    check_revision,
    check_task_name,
    mteb_dataset_name,
    mteb_retrieval_task_names,
    mteb_task_names,
    normalize_task_name,
    warnings_quiet,
)
from .meta import declared_training_datasets, model_meta_for, model_revision, read_training_info
from .model import cocodr_sentence_transformer_loader, mteb_model
from .results import results_dir, results_submission_steps
from .run import MTEBDataUnavailableError, run_mteb
from .snippet import mteb_meta_snippet
from .tasks import beir_revision, beir_split_data, beir_task

__all__ = [
    "DEFAULT_LANGUAGES",
    "mteb_retrieval_task_names",
    "mteb_task_names",
    "normalize_task_name",
    "MAIN_SCORE",
    "MTEB_REPO",
    "MTEBDataUnavailableError",
    "RESULTS_REPO",
    "TRAINING_CODE_URL",
    "beir_revision",
    "beir_split_data",
    "beir_task",
    "check_model_name",
    "check_revision",
    "check_task_name",
    "cocodr_sentence_transformer_loader",
    "declared_training_datasets",
    "model_meta_for",
    "model_revision",
    "mteb_dataset_name",
    "mteb_meta_snippet",
    "mteb_model",
    "read_training_info",
    "results_dir",
    "results_submission_steps",
    "run_mteb",
    "warnings_quiet",
]
