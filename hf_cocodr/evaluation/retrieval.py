"""Dense retrieval evaluation on a BEIR folder: encode, index (exact, or approximate beyond a size), search top-k, score
with pytrec_eval."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..data.beir import BEIRData, column_numpy, corpus_texts, load_beir
from ..errors import ConfigError
from ..modeling.limits import check_lengths
from ..modeling.loading import load_encoder
from ..modeling.precision import check_encode_precision, encoding_precision
from ..retrieval.ann import ApproximateIndex, IndexChoice, index_choice
from ..retrieval.encoding import build_index, encode_documents, encode_texts, search_run
from ..retrieval.encoding_cache import fit_fusion_once
from ..retrieval.fusion import FusionConfig
from ..retrieval.fusion_fit import log_fit
from ..retrieval.hybrid import HybridRetriever
from ..retrieval.index import BM25Index, DenseIndex
from ..retrieval.session import EncodingSession
from ..utils import atomic_write_json
from .metrics import compute_metrics

logger = logging.getLogger(__name__)


# over 80 lines: the Python twin of `hf-cocodr evaluate`, one documented keyword argument per flag (a 75-line body)
def evaluate_retrieval(
    model,
    folder: str | os.PathLike | BEIRData,
    split: str = "test",
    *,
    batch_size: int = 64,
    query_max_length: int | None = None,
    doc_max_length: int | None = None,
    top_k: int = 1000,
    k_values: tuple[int, ...] = (1, 3, 5, 10, 100, 1000),
    backend: str = "auto",
    output: str | os.PathLike | None = None,
    show_progress_bar: bool = True,
    return_run: bool = False,
    encode_precision: str = "fp32",
    hybrid: bool = False,
    fusion: FusionConfig | dict | None = None,
    session: EncodingSession | None = None,
    index: IndexChoice | str = "auto",
) -> dict[str, Any]:
    """Evaluate a SentenceTransformer on a BEIR split with exact search (or, beyond a size, approximate: ``index``).

    The corpus is encoded as ``title + " " + text`` in length-sorted batches and streamed into an exact
    inner-product index (faiss ``IndexFlatIP`` when installed, torch otherwise); the model's own similarity is
    honoured (cosine models are normalised). Metrics come from pytrec_eval.

    Args:
        model: a ``SentenceTransformer`` (or a path / Hub id, loaded with :func:`hf_cocodr.load_encoder`).
        folder: a BEIR folder or an already loaded :class:`~hf_cocodr.data.BEIRData`.
        split: the qrels split.
        query_max_length / doc_max_length: token limits (default: the model's own query/document lengths).
        top_k: documents retrieved per query.
        output: also write the result JSON and the run (top-100 per query) to this file (atomically).
        encode_precision: ``fp32`` (exact, default), ``bf16`` or ``int8`` (see :mod:`hf_cocodr.modeling.precision`);
            with a ``session`` whose precision is ``bf16`` (a recipe run that encodes in bf16), ``fp32`` means the
            run's bf16, and the result says ``bf16``.
        hybrid: evaluate the hybrid of the model and BM25 over the same corpus (:mod:`hf_cocodr.retrieval.fusion`): the
            top-level metrics are the hybrid's, with the dense model's under ``"dense"`` and BM25's under ``"bm25"``
            (and the BM25 index and fusion seconds apart). The hybrid ranks the union of each system's top
            ``fusion.depth`` (default 200): its cut-offs beyond that are over those candidates only.
        fusion: a :class:`~hf_cocodr.retrieval.fusion.FusionConfig` (or its fields as a mapping); default: the package's,
            its normalisation and dense weight fitted to the corpus without labels
            (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`; no qrels are read); the result's ``"fusion"`` gives
            the normalisation and weight used and, when fitted, how (``"fit"``).
        session: the run's :class:`~hf_cocodr.retrieval.session.EncodingSession` (its precision, its encoding cache,
            its fits); default: a fresh one (fp32, nothing cached or kept).
        index: ``auto`` (exact search up to 1,000,000 documents, HNSW beyond), ``exact``, ``hnsw``, ``ivf`` or an
            :class:`~hf_cocodr.retrieval.ann.IndexChoice`; an approximate index's kind, parameters and recall@100
            against exact search are the result's ``"index"``.

    Returns:
        A dict with ``ndcg@10``, ``recall@100``, ``mrr@10`` (and the other cut-offs), ``num_queries``,
        ``num_docs``, ``encode_seconds``, ``search_seconds``.
    """

    check_encode_precision(encode_precision)
    choice = index_choice(index, backend)
    session = session if session is not None else EncodingSession()
    if encode_precision == "fp32" and session.precision == "bf16":
        encode_precision = "bf16"  # inside a run whose corpus encodings are bf16 (the recipe's encode_precision)
    check_lengths(model, {"query_max_length": query_max_length, "doc_max_length": doc_max_length})
    if isinstance(model, (str, os.PathLike)):
        model = load_encoder(str(model))
    data = folder if isinstance(folder, BEIRData) else load_beir(folder, split)
    corpus, queries, qrels = data.corpus, data.queries, data.qrels

    t0 = time.perf_counter()
    with encoding_precision(model, encode_precision) as encoder:
        index, order = build_index(
            encoder,
            corpus,
            batch_size=batch_size,
            max_length=doc_max_length,
            backend=backend,
            show_progress_bar=show_progress_bar,
            session=session,
            index=choice,
        )
        qids = list(queries["_id"])
        q_emb = encode_texts(
            encoder,
            list(queries["text"]),
            kind="query",
            batch_size=batch_size,
            max_length=query_max_length,
            session=session,
        )
    encode_seconds = time.perf_counter() - t0

    t1 = time.perf_counter()
    run = search_run(index, order, column_numpy(corpus, "_id"), qids, q_emb, top_k)
    search_seconds = time.perf_counter() - t1

    result = summarize(qrels, run, k_values=k_values)
    result.update(
        num_queries=len(qids),
        num_docs=len(corpus),
        encode_seconds=round(encode_seconds, 3),
        search_seconds=round(search_seconds, 3),
        index_backend=index.backend,
        encode_precision=encode_precision,
    )
    if isinstance(index, ApproximateIndex):
        result["index"] = index.record
    if hybrid:

        def encode_for_fit(texts: list[str], kind: str) -> np.ndarray:
            with encoding_precision(model, encode_precision) as enc:
                if kind == "document":  # (shared by the ranks under torch.distributed, as the corpus is)
                    return encode_documents(
                        enc, texts, batch_size=batch_size, max_length=doc_max_length, session=session
                    )
                return encode_texts(
                    enc, texts, kind=kind, batch_size=batch_size, max_length=query_max_length, session=session
                )

        result, run = _hybrid_result(
            result,
            model,
            index,
            order,
            corpus,
            qids,
            list(queries["text"]),
            q_emb,
            qrels,
            fusion,
            top_k,
            k_values,
            encode_for_fit,
            fit_settings=(encode_precision, query_max_length, doc_max_length, batch_size),
            corpus_name=str(data.folder),
            session=session,
        )
    if output is not None:
        write_result(output, result, run)
    if return_run:
        result["run"] = run
    return result


def _hybrid_result(
    dense_result,
    model,
    index: DenseIndex | ApproximateIndex,
    order,
    corpus,
    qids,
    query_texts,
    q_emb,
    qrels,
    fusion,
    top_k: int,
    k_values,
    encode_for_fit=None,
    fit_settings: tuple = ("fp32", None, None, 64),
    corpus_name: str | None = None,
    session: EncodingSession | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The hybrid of the dense index already built and BM25 over the same corpus: its metrics at the top level, the
    dense and BM25 metrics beside them; returns the result and the hybrid's run. The fused ranking is
    :meth:`HybridRetriever.search <hf_cocodr.retrieval.hybrid.HybridRetriever.search>`'s over the index (every
    candidate of each system's top ``min(fusion.depth, top_k)``)."""
    fusion = fusion if isinstance(fusion, FusionConfig) else FusionConfig(**(fusion or {}))
    doc_ids = np.asarray(column_numpy(corpus, "_id"), dtype=object)
    t0 = time.perf_counter()
    texts = [t for _, batch in corpus_texts(corpus) for t in batch]  # the texts evaluate_bm25 indexes
    bm25 = BM25Index(texts, name=corpus_name)
    index_s = time.perf_counter() - t0
    fit_s = 0.0
    if fusion.needs_fit:
        if encode_for_fit is None:
            raise ConfigError('the fusion weight is "fit" but no encoder was given to fit it')
        t_fit = time.perf_counter()
        in_index_order = index.reconstruct_all()
        embeddings = np.empty_like(in_index_order)
        embeddings[order] = in_index_order
        del in_index_order
        # once per model, corpus, queries and settings within the recipe's run; the queries' text only: the
        # pseudo-queries are made as easy for BM25 as they are
        encoders = (lambda q: encode_for_fit(q, "query"), lambda d: encode_for_fit(d, "document"))
        fusion = fit_fusion_once(
            model, fusion, texts, embeddings, *encoders, fit_settings, list(query_texts), bm25, session=session
        )
        del embeddings
        fit_s = time.perf_counter() - t_fit
        log_fit(fusion, f"hybrid over {corpus_name or 'the corpus'}", fit_s)
    del texts
    hybrid = HybridRetriever.from_index(model, doc_ids.tolist(), index, order, bm25, fusion, session=session)
    t1 = time.perf_counter()
    b_scores, b_rows = hybrid.search_bm25(query_texts, top_k)
    bm25_s = time.perf_counter() - t1
    bm25_run = {
        q: {doc_ids[j]: float(sc) for j, sc in zip(b_rows[i], b_scores[i]) if sc > 0} for i, q in enumerate(qids)
    }
    t2 = time.perf_counter()
    depth = min(fusion.depth, top_k)
    ids, scores = hybrid.search(query_texts, 2 * depth, query_embeddings=q_emb, depth=depth)
    run = {qid: dict(zip(i, s)) for qid, i, s in zip(qids, ids, scores)}
    fuse_s = time.perf_counter() - t2
    keys = [k for k in dense_result if k not in ("run",)]
    out = summarize(qrels, run, k_values=k_values)
    out.update(
        num_queries=dense_result["num_queries"],
        num_docs=dense_result["num_docs"],
        fusion=asdict(fusion),
        encode_seconds=dense_result["encode_seconds"],
        bm25_index_seconds=round(index_s, 3),
        fusion_fit_seconds=round(fit_s, 3),
        search_seconds=round(dense_result["search_seconds"] + bm25_s + fuse_s, 3),
        dense={k: dense_result[k] for k in keys},
        bm25={
            **summarize(qrels, bm25_run, k_values=k_values),
            "index_seconds": round(index_s, 3),
            "search_seconds": round(bm25_s, 3),
        },
    )
    if "index" in dense_result:  # the dense index the hybrid searched: approximate
        out["index"] = dense_result["index"]
    return out, run


def summarize(qrels, run, k_values=(1, 3, 5, 10, 100, 1000)) -> dict[str, Any]:
    metrics = compute_metrics(qrels, run, k_values)
    return {k: round(v, 6) for k, v in metrics.items()}


def write_result(output: str | os.PathLike, result: Mapping[str, Any], run: Mapping[str, Mapping[str, float]]) -> None:
    """Write the metrics plus the run (top-100 per query, rounded scores) as one JSON file, atomically."""
    top = {
        q: dict(sorted(((d, round(s, 6)) for d, s in docs.items()), key=lambda x: -x[1])[:100])
        for q, docs in run.items()
    }
    atomic_write_json(Path(output), {**result, "run": top})


def print_result_line(result: Mapping[str, Any]) -> None:
    """The contract of the CLI: the last printed line is one JSON object."""
    print(json.dumps({k: v for k, v in result.items() if k != "run"}, sort_keys=False), flush=True)
