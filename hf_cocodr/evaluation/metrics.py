"""IR metrics over qrels and a run, computed by pytrec_eval (the same engine BEIR and MTEB use)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

DEFAULT_K_VALUES = (1, 3, 5, 10, 100, 1000)


def compute_metrics(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    k_values: Iterable[int] = DEFAULT_K_VALUES,
    *,
    per_query: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[str, dict[str, float]]]:
    """nDCG@k, Recall@k, MRR@k and MAP@k, averaged over the judged queries.

    Queries judged in ``qrels`` but missing from ``run`` count as zero (they are not silently dropped).
    Keys are lower-case: ``ndcg@10``, ``recall@100``, ``mrr@10``, ``map@100``, ...

    Args:
        qrels: ``{query_id: {doc_id: grade}}``; grade > 0 is relevant.
        run: ``{query_id: {doc_id: score}}``.
        k_values: the cut-offs.
        per_query: also return the per-query values.
    """
    import pytrec_eval

    k_values = sorted(set(int(k) for k in k_values))
    qrels = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items() if docs}
    judged = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    run = {q: {d: float(s) for d, s in run.get(q, {}).items()} for q in judged}
    ks = ",".join(map(str, k_values))
    evaluator = pytrec_eval.RelevanceEvaluator(
        {q: qrels[q] for q in judged}, {f"ndcg_cut.{ks}", f"recall.{ks}", f"map_cut.{ks}"}
    )
    scores = evaluator.evaluate({q: r for q, r in run.items() if r})
    per_q: dict[str, dict[str, float]] = {}
    for q in judged:
        s = scores.get(q, {})
        row = {}
        for k in k_values:
            row[f"ndcg@{k}"] = s.get(f"ndcg_cut_{k}", 0.0)
            row[f"recall@{k}"] = s.get(f"recall_{k}", 0.0)
            row[f"map@{k}"] = s.get(f"map_cut_{k}", 0.0)
            row[f"mrr@{k}"] = _mrr_at_k(qrels[q], run.get(q, {}), k)
        per_q[q] = row
    keys = [f"{m}@{k}" for m in ("ndcg", "recall", "mrr", "map") for k in k_values]
    agg = {key: float(np.mean([per_q[q][key] for q in judged])) if judged else 0.0 for key in keys}
    return (agg, per_q) if per_query else agg


def _mrr_at_k(qrel: Mapping[str, int], run: Mapping[str, float], k: int) -> float:
    # Same tie-breaking as pytrec_eval (score descending, then doc id descending).
    ranked = sorted(run.items(), key=lambda x: (x[1], x[0]), reverse=True)[:k]
    for rank, (doc, _) in enumerate(ranked, start=1):
        if qrel.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0
