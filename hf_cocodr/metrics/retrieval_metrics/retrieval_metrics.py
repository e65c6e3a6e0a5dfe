"""Retrieval metrics (nDCG@k, Recall@k, MRR@k, MAP@k) as an `evaluate` module.

The maths is not re-implemented here: the module turns its Arrow-backed inputs back into qrels and a run and calls
:func:`hf_cocodr.evaluation.metrics.compute_metrics` (pytrec_eval underneath), the function behind
``hf-cocodr evaluate`` and :func:`hf_cocodr.evaluate_retrieval`, so both report identical numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

import datasets
import evaluate

from hf_cocodr.evaluation.metrics import DEFAULT_K_VALUES, compute_metrics

_CITATION = """\
@inproceedings{VanGysel2018pytreceval,
  title     = {Pytrec\\_eval: An Extremely Fast Python Interface to trec\\_eval},
  author    = {Van Gysel, Christophe and de Rijke, Maarten},
  booktitle = {The 41st International ACM SIGIR Conference on Research \\& Development in Information Retrieval},
  publisher = {ACM},
  year      = {2018},
  doi       = {10.1145/3209978.3210065}
}
@misc{trec_eval,
  title        = {trec\\_eval: the standard tool used by the TREC community for evaluating ad hoc retrieval runs},
  author       = {{National Institute of Standards and Technology}},
  howpublished = {\\url{https://github.com/usnistgov/trec_eval}}
}
"""

_DESCRIPTION = """\
Ranking metrics for a retrieval run against relevance judgements (qrels): nDCG@k (linear gains, as trec_eval,
BEIR and MTEB), Recall@k, MRR@k and MAP@k, averaged over the judged queries (queries with at least one document of
grade > 0). A judged query with no retrieved document counts as zero; queries without a positive judgement are
ignored. nDCG, Recall and MAP come from pytrec_eval (trec_eval's ``ndcg_cut``, ``recall`` and ``map_cut``); MRR@k is
the reciprocal rank of the first relevant document within the top k, with pytrec_eval's tie-breaking (score
descending, then document id descending). Each input row is one query.
"""

_KWARGS_DESCRIPTION = """
Args:
    query_ids (`list` of `str`): one id per row (query). Ids must be unique, except for rows repeated verbatim
        (as distributed samplers produce when they pad), which are counted once.
    predictions (`list` of `dict`): the run, one dict per query with
        `doc_ids` (`list` of `str`) and `scores` (`list` of `float`, higher is better, same length as `doc_ids`).
        The order of the lists does not matter: documents are ranked by score. An empty list means nothing was
        retrieved for that query.
    references (`list` of `dict`): the qrels, one dict per query with
        `doc_ids` (`list` of `str`) and `grades` (`list` of `int`, > 0 is relevant, same length as `doc_ids`).
    k_values (`list` of `int`, *optional*): the cut-offs. Defaults to the ones given to `evaluate.load`
        (`k_values=...`), else `[1, 3, 5, 10, 100, 1000]`.
    per_query (`bool`, *optional*, defaults to `False`): also return `per_query`, `{query_id: {metric: value}}`.

Returns:
    `dict` with the keys `ndcg@k`, `recall@k`, `mrr@k` and `map@k` for every cut-off k (floats in [0, 1]),
    exactly the keys of `hf_cocodr.evaluation.metrics.compute_metrics`; plus `per_query` if asked.

Examples:
    >>> import evaluate
    >>> from hf_cocodr.evaluation.evaluator import retrieval_metric_path
    >>> metric = evaluate.load(retrieval_metric_path())
    >>> results = metric.compute(
    ...     query_ids=["q1"],
    ...     predictions=[{"doc_ids": ["d3", "d1", "d4", "d2"], "scores": [0.9, 0.8, 0.7, 0.6]}],
    ...     references=[{"doc_ids": ["d1", "d2"], "grades": [1, 1]}],
    ...     k_values=[10],
    ... )
    >>> round(results["ndcg@10"], 4), results["mrr@10"], results["recall@10"]
    (0.6509, 0.5, 1.0)
"""

FEATURES = datasets.Features(
    {
        "query_ids": datasets.Value("string"),
        "predictions": {
            "doc_ids": datasets.Sequence(datasets.Value("string")),
            "scores": datasets.Sequence(datasets.Value("float64")),
        },
        "references": {
            "doc_ids": datasets.Sequence(datasets.Value("string")),
            "grades": datasets.Sequence(datasets.Value("int64")),
        },
    }
)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RetrievalMetrics(evaluate.Metric):
    """nDCG@k, Recall@k, MRR@k and MAP@k of a run against qrels, through ``hf_cocodr``'s pytrec_eval wrapper.

    Args:
        k_values: default cut-offs for :meth:`compute` (``evaluate.load(path, k_values=[10, 100])``).
        **kwargs: the usual :class:`evaluate.EvaluationModule` arguments.
    """

    def __init__(self, *args, k_values: Iterable[int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.k_values = _check_k_values(DEFAULT_K_VALUES if k_values is None else k_values)

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=FEATURES,
            reference_urls=[
                "https://github.com/usnistgov/trec_eval",
                "https://github.com/cvangysel/pytrec_eval",
                "https://doi.org/10.1145/582415.582418",
            ],
            codebase_urls=["https://github.com/cvangysel/pytrec_eval"],
            license="apache-2.0",
        )

    def _compute(
        self,
        query_ids: list[str],
        predictions: list[dict],
        references: list[dict],
        k_values: Iterable[int] | None = None,
        per_query: bool = False,
    ) -> dict:
        k_values = self.k_values if k_values is None else _check_k_values(k_values)
        qrels, run = inputs_to_qrels_and_run(query_ids, predictions, references)
        if per_query:
            agg, rows = compute_metrics(qrels, run, k_values, per_query=True)
            return {**agg, "per_query": rows}
        return compute_metrics(qrels, run, k_values)


def inputs_to_qrels_and_run(
    query_ids: list[str], predictions: list[dict], references: list[dict]
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """The metric's rows back to ``qrels`` (``{qid: {doc: grade}}``) and ``run`` (``{qid: {doc: score}}``).

    Raises:
        ValueError: on a row whose id and score (or grade) lists differ in length, a document listed twice in one
            row, or a query id given twice with different contents.
    """
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for qid, pred, ref in zip(query_ids, predictions, references):
        scores = _row_to_dict(qid, "predictions", pred["doc_ids"], pred["scores"])
        grades = _row_to_dict(qid, "references", ref["doc_ids"], ref["grades"])
        if qid in run:
            if run[qid] != scores or qrels[qid] != grades:
                raise ValueError(f"query id {qid!r} appears in several rows with different contents.")
            continue  # a verbatim repeat (e.g. padding of a distributed sampler) counts once
        run[qid], qrels[qid] = scores, grades
    return qrels, run


def _row_to_dict(qid: str, field: str, doc_ids: list[str], values: list) -> dict:
    doc_ids, values = list(doc_ids or []), list(values or [])
    if len(doc_ids) != len(values):
        kind = "scores" if field == "predictions" else "grades"
        raise ValueError(
            f"query {qid!r}: {field} has {len(doc_ids)} doc_ids but {len(values)} {kind}; they must be parallel lists."
        )
    out = dict(zip(doc_ids, values))
    if len(out) != len(doc_ids):
        raise ValueError(f"query {qid!r}: {field} lists a document more than once.")
    return out


def _check_k_values(k_values: Iterable[int]) -> list[int]:
    ks = sorted({int(k) for k in k_values})
    if not ks or ks[0] < 1:
        raise ValueError(f"k_values must be a non-empty list of positive integers, got {k_values!r}.")
    return ks
