"""In-training BEIR evaluation for ``SentenceTransformerTrainer``, scored through the packaged `evaluate` metric.

:class:`BEIRRetrievalEvaluator` runs exactly what ``hf-cocodr evaluate`` runs (:func:`evaluate_retrieval`: exact
search over the whole corpus) and scores the run with the ``retrieval_metrics`` module shipped in
``hf_cocodr/metrics/``, which itself calls :func:`~hf_cocodr.evaluation.metrics.compute_metrics`. The numbers logged
during training are therefore the numbers of the CLI.

Example::

    from sentence_transformers import SentenceTransformerTrainer
    from hf_cocodr.evaluation.evaluator import BEIRRetrievalEvaluator

    evaluator = BEIRRetrievalEvaluator("data/scifact", "dev")  # logs eval_scifact_dev_ndcg@10, ...
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, loss=loss, evaluator=evaluator)

    # The metric on its own:
    metric = load_retrieval_metric()
    metric.compute(**run_to_metric_inputs(run, qrels), k_values=[10, 100])
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from sentence_transformers.base.evaluation import BaseEvaluator

from ..data.beir import BEIRData, load_beir
from .metrics import DEFAULT_K_VALUES
from .retrieval import evaluate_retrieval

logger = logging.getLogger(__name__)

METRIC_NAME = "retrieval_metrics"
# evaluate_retrieval (hence ``hf-cocodr evaluate``) reports metrics rounded to this many digits.
ROUND_DIGITS = 6
_METRIC_NAMES = ("ndcg", "recall", "mrr", "map")


def retrieval_metric_path() -> str:
    """Path of the packaged ``retrieval_metrics.py`` script, suitable for :func:`evaluate.load`."""
    path = resources.files("hf_cocodr") / "metrics" / METRIC_NAME / f"{METRIC_NAME}.py"
    if not path.is_file():
        raise FileNotFoundError(f"the packaged metric script is missing: {path}; reinstall hf_cocodr.")
    return str(path)


def load_retrieval_metric(**kwargs):
    """``evaluate.load`` of the packaged retrieval metric, without touching the network.

    The script is a local file, so `evaluate` only copies it into its modules cache (``HF_MODULES_CACHE``) and
    imports it from there; the copy imports ``hf_cocodr`` as an installed library.

    Args:
        **kwargs: forwarded to :func:`evaluate.load` (``k_values=[...]`` sets the default cut-offs,
            ``keep_in_memory=True`` avoids the Arrow cache files).

    Returns:
        The ``RetrievalMetrics`` :class:`evaluate.Metric`.
    """
    import evaluate
    from datasets import DownloadConfig

    kwargs.setdefault("download_config", DownloadConfig(local_files_only=True))
    return evaluate.load(retrieval_metric_path(), **kwargs)


def run_to_metric_inputs(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    query_ids: Iterable[str] | None = None,
) -> dict[str, list]:
    """Turn a run and qrels into the metric's inputs (one row per query).

    Args:
        run: ``{query_id: {doc_id: score}}``.
        qrels: ``{query_id: {doc_id: grade}}``.
        query_ids: the rows to emit; default: the judged queries, then the queries only present in the run. A judged
            query missing from the run becomes a row with no predictions (it counts as zero, as in
            :func:`compute_metrics`).

    Returns:
        ``{"query_ids": [...], "predictions": [{"doc_ids", "scores"}], "references": [{"doc_ids", "grades"}]}``,
        to be unpacked into ``metric.compute(**inputs)`` or ``metric.add_batch(**inputs)``.
    """
    if query_ids is None:
        query_ids = list(qrels) + [q for q in run if q not in qrels]
    out: dict[str, list] = {"query_ids": [], "predictions": [], "references": []}
    for qid in query_ids:
        docs = run.get(qid, {})
        judged = qrels.get(qid, {})
        out["query_ids"].append(str(qid))
        out["predictions"].append({"doc_ids": [str(d) for d in docs], "scores": [float(s) for s in docs.values()]})
        out["references"].append({"doc_ids": [str(d) for d in judged], "grades": [int(g) for g in judged.values()]})
    return out


class BEIRRetrievalEvaluator(BaseEvaluator):
    """Exact retrieval on a BEIR split, usable as ``evaluator=`` of a ``SentenceTransformerTrainer``.

    Each call encodes the corpus and the queries with the model, searches the top-``top_k`` documents of every query
    (:func:`~hf_cocodr.evaluation.retrieval.evaluate_retrieval`, the code behind ``hf-cocodr evaluate``) and scores
    the run with the packaged `evaluate` metric (:func:`load_retrieval_metric`). Metrics are named
    ``{name}_ndcg@10``, ``{name}_recall@100``, ... (the trainer adds ``eval_``); the primary metric is nDCG@10.

    Args:
        data: a BEIR folder or an already loaded :class:`~hf_cocodr.data.beir.BEIRData`.
        split: the qrels split (ignored when ``data`` is a ``BEIRData``, which carries its own).
        name: metric prefix; default ``"{folder name}_{split}"``, e.g. ``scifact_dev``.
        batch_size: encoding batch size.
        query_max_length: query token limit (default: the model's own).
        doc_max_length: document token limit (default: the model's own).
        top_k: documents retrieved per query.
        k_values: the cut-offs.
        backend: exact-search backend (``"auto"``, ``"faiss"`` or ``"torch"``).
        main_metric: the metric used for model selection, before prefixing.
        show_progress_bar: show the corpus-encoding progress bar.
        write_csv: append one line per call to ``{output_path}/BEIR-Retrieval_evaluation_{name}_results.csv``.
    """

    def __init__(
        self,
        data: str | os.PathLike | BEIRData,
        split: str = "test",
        *,
        name: str | None = None,
        batch_size: int = 64,
        query_max_length: int | None = None,
        doc_max_length: int | None = None,
        top_k: int = 1000,
        k_values: Iterable[int] = DEFAULT_K_VALUES,
        backend: str = "auto",
        main_metric: str = "ndcg@10",
        show_progress_bar: bool = False,
        write_csv: bool = True,
    ):
        super().__init__()
        self.data = data if isinstance(data, BEIRData) else load_beir(data, split)
        self.split = self.data.split or split
        self.name = name if name is not None else f"{Path(self.data.folder).name}_{self.split}"
        self.batch_size = batch_size
        self.query_max_length = query_max_length
        self.doc_max_length = doc_max_length
        self.top_k = int(top_k)
        self.k_values = tuple(sorted({int(k) for k in k_values}))
        self.backend = backend
        self.show_progress_bar = show_progress_bar
        self.write_csv = write_csv
        self.metric_keys = [f"{m}@{k}" for m in _METRIC_NAMES for k in self.k_values]
        if main_metric not in self.metric_keys:
            raise ValueError(f"main_metric {main_metric!r} is not computed; choose one of {self.metric_keys}.")
        self.main_metric = main_metric
        self.primary_metric = f"{self.name}_{main_metric}" if self.name else main_metric
        self.greater_is_better = True
        self.csv_file = "BEIR-Retrieval_evaluation" + (f"_{self.name}" if self.name else "") + "_results.csv"
        self.last_result: dict[str, Any] | None = None
        self._metric = None

    @property
    def metric(self):
        """The `evaluate` metric module (loaded on first use, kept in memory: no Arrow cache files)."""
        if self._metric is None:
            self._metric = load_retrieval_metric(keep_in_memory=True, k_values=self.k_values)
        return self._metric

    @property
    def description(self) -> str:
        return "BEIR Retrieval"

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        """Evaluate ``model``; returns ``{f"{name}_{metric}": value}`` and records it in the model card data."""
        where = ""
        if epoch != -1:
            where = f" after epoch {epoch}" if steps == -1 else f" in epoch {epoch} after {steps} steps"
        logger.info("BEIR retrieval evaluation on %s%s", self.name or self.split, where)

        result = evaluate_retrieval(
            model,
            self.data,
            self.split,
            batch_size=self.batch_size,
            query_max_length=self.query_max_length,
            doc_max_length=self.doc_max_length,
            top_k=self.top_k,
            k_values=self.k_values,
            backend=self.backend,
            show_progress_bar=self.show_progress_bar,
            return_run=True,
        )
        run = result.pop("run")
        scores = self.metric.compute(**run_to_metric_inputs(run, self.data.qrels), k_values=self.k_values)
        metrics = {key: round(float(scores[key]), ROUND_DIGITS) for key in self.metric_keys}
        differing = [key for key in self.metric_keys if key in result and abs(result[key] - metrics[key]) > 1e-9]
        if differing:  # both paths call compute_metrics: a difference means the metric module is out of date
            logger.warning("the evaluate metric and evaluate_retrieval disagree on %s", differing)
        self.last_result = {**result, **metrics}
        shown = [k for k in (self.main_metric, "ndcg@10", "recall@100", "mrr@10") if k in metrics]
        logger.info(
            "%s: %s (%d queries, %d docs)",
            self.name,
            ", ".join(f"{k}={metrics[k]:.4f}" for k in dict.fromkeys(shown)),
            result["num_queries"],
            result["num_docs"],
        )

        if output_path is not None and self.write_csv:
            self._write_csv(output_path, epoch, steps, metrics)

        metrics = self.prefix_name_to_metrics(metrics, self.name)
        self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
        return metrics

    def _write_csv(self, output_path: str, epoch: float, steps: int, metrics: Mapping[str, float]) -> None:
        os.makedirs(output_path, exist_ok=True)
        path = os.path.join(output_path, self.csv_file)
        new = not os.path.isfile(path)
        with open(path, "a", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["epoch", "steps", *self.metric_keys])
            writer.writerow([epoch, steps, *(metrics[k] for k in self.metric_keys)])

    def get_config_dict(self) -> dict[str, Any]:
        return {"split": self.split, "top_k": self.top_k, "k_values": list(self.k_values)}
