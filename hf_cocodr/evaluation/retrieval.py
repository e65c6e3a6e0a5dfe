"""Exact dense retrieval evaluation on a BEIR folder: encode, index, search top-k, score with pytrec_eval."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..data.beir import BEIRData, column_array, column_numpy, corpus_texts, doc_text, load_beir
from ..errors import ConfigError
from ..fusion import FusionConfig, fit_fusion, fuse
from ..index import BM25Index, DenseIndex
from ..modeling.limits import check_lengths
from ..modeling.loading import load_encoder
from ..modeling.precision import check_encode_precision, encoding_precision
from ..run_record import model_fingerprint
from ..utils import atomic_write_json
from .metrics import compute_metrics

logger = logging.getLogger(__name__)

SUPPORTED_SIMILARITIES = ("dot", "cosine")


def model_similarity(model) -> str:
    """The similarity a SentenceTransformer declares (``dot`` or ``cosine``); other metrics are refused."""
    name = getattr(model, "similarity_fn_name", None) or "cosine"
    name = str(getattr(name, "value", name))
    if name not in SUPPORTED_SIMILARITIES:
        raise ValueError(
            f"the model's similarity is {name!r}; exact inner-product retrieval supports {SUPPORTED_SIMILARITIES}."
        )
    return name


def _processing_kwargs(max_length: int | None) -> dict[str, Any]:
    return {"processing_kwargs": {"text": {"max_length": int(max_length), "truncation": True}}} if max_length else {}


def encode_texts(
    model,
    texts: list[str],
    *,
    kind: str,
    batch_size: int = 64,
    max_length: int | None = None,
    normalize: bool | None = None,
) -> np.ndarray:
    """Encode queries (``kind="query"``) or documents (``kind="document"``) with the model's own prompts/lengths."""
    if normalize is None:
        normalize = model_similarity(model) == "cosine"
    fn = getattr(model, "encode_query" if kind == "query" else "encode_document", None) or model.encode
    emb = fn(
        texts,
        batch_size=batch_size,
        convert_to_numpy=True,
        show_progress_bar=False,
        normalize_embeddings=normalize,
        **_processing_kwargs(max_length),
    )
    return np.asarray(emb, dtype=np.float32)


def length_sorted_order(corpus) -> np.ndarray:
    """Corpus row order by decreasing ``title + text`` length, computed in Arrow (no Python strings)."""
    lengths = pc.utf8_length(column_array(corpus, "text")).to_numpy()
    if "title" in corpus.column_names:
        lengths = lengths + pc.utf8_length(column_array(corpus, "title")).to_numpy()
    return np.argsort(-lengths, kind="stable")


# Corpus encodings kept while :func:`reuse_corpus_encodings` is active: (model weights, corpus, settings) -> the index
_REUSE: dict[tuple, tuple[DenseIndex, np.ndarray]] | None = None
REUSE_MAX_BYTES = 1 << 30  # what the kept indexes may hold in all


@contextlib.contextmanager
def reuse_corpus_encodings():
    """Within the block, :func:`build_index` encodes a corpus once per model: a second call with the same weights
    (their SHA-256), the same corpus dataset and the same settings returns the index the first built (up to
    :data:`REUSE_MAX_BYTES` of vectors in all). The recipe evaluates its final model and then builds that model's
    hybrid retrievers over the target corpora, which are often the evaluation corpora too."""
    global _REUSE
    outer, _REUSE = _REUSE, {} if _REUSE is None else _REUSE
    try:
        yield
    finally:
        if outer is None:
            _REUSE = None


def _reuse_key(model, corpus, max_length, backend, normalize) -> tuple | None:
    fp = getattr(corpus, "_fingerprint", None)
    if _REUSE is None or fp is None:
        return None
    return (model_fingerprint(model)["weights_sha256"], fp, len(corpus), max_length, backend, normalize)


def build_index(
    model,
    corpus,
    *,
    batch_size: int = 64,
    max_length: int | None = None,
    chunk_docs: int = 4096,
    backend: str = "auto",
    show_progress_bar: bool = True,
    on_chunk=None,
) -> tuple[DenseIndex, np.ndarray]:
    """Encode a corpus dataset in length-sorted chunks and stream the vectors into an exact index.

    Returns the index and ``order``: index row ``r`` holds corpus row ``order[r]``. Peak memory is the index plus
    one chunk of embeddings, never a second full copy. ``on_chunk(n_done)`` is called after every chunk.
    """
    from tqdm.auto import tqdm

    normalize = model_similarity(model) == "cosine"
    key = _reuse_key(model, corpus, max_length, backend, normalize)
    if key is not None and key in _REUSE:
        logger.info("corpus of %d documents: its encoding by this model is reused", len(corpus))
        return _REUSE[key]
    order = length_sorted_order(corpus)
    dim = model.get_embedding_dimension()
    index = DenseIndex(dim, backend=backend, capacity=len(order))
    bar = tqdm(total=len(order), desc="Encoding corpus", unit="doc", disable=not show_progress_bar)
    for s in range(0, len(order), chunk_docs):
        rows = order[s : s + chunk_docs]
        b = corpus[rows]
        titles = b.get("title") or [""] * len(rows)
        texts = [doc_text(t, x) for t, x in zip(titles, b["text"])]
        index.add(
            encode_texts(
                model, texts, kind="document", batch_size=batch_size, max_length=max_length, normalize=normalize
            )
        )
        bar.update(len(rows))
        if on_chunk is not None:
            on_chunk(s + len(rows))
    bar.close()
    if key is not None and 4 * dim * (len(order) + sum(len(o) for _, o in _REUSE.values())) <= REUSE_MAX_BYTES:
        _REUSE[key] = (index, order)
    return index, order


def search_run(
    index: DenseIndex,
    order: np.ndarray,
    doc_ids,
    query_ids: list[str],
    query_emb: np.ndarray,
    top_k: int,
) -> dict[str, dict[str, float]]:
    """``{query_id: {doc_id: score}}`` for the top-``k`` of each query."""
    scores, idx = index.search(query_emb, top_k)
    ids = np.asarray(doc_ids, dtype=object)
    run: dict[str, dict[str, float]] = {}
    for qi, qid in enumerate(query_ids):
        valid = idx[qi] >= 0
        rows = order[idx[qi][valid]]
        run[qid] = dict(zip(ids[rows].tolist(), scores[qi][valid].astype(float).tolist()))
    return run


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
) -> dict[str, Any]:
    """Evaluate a SentenceTransformer on a BEIR split with exact search.

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
        encode_precision: ``fp32`` (exact, default), ``bf16`` or ``int8`` (see :mod:`hf_cocodr.modeling.precision`).
        hybrid: evaluate the hybrid of the model and BM25 over the same corpus (:mod:`hf_cocodr.fusion`): the
            top-level metrics are the hybrid's, with the dense model's under ``"dense"`` and BM25's under ``"bm25"``
            (and the BM25 index and fusion seconds apart). The hybrid ranks the union of each system's top
            ``fusion.depth`` (default 100): its cut-offs beyond that are over those candidates only.
        fusion: a :class:`~hf_cocodr.fusion.FusionConfig` (or its fields as a mapping); default: the package's, its
            dense weight fitted to the corpus without labels (:func:`~hf_cocodr.fusion.fit_fusion`; no qrels are
            read); the result's ``"fusion"`` gives the weight used and, when fitted, how (``"fit"``).

    Returns:
        A dict with ``ndcg@10``, ``recall@100``, ``mrr@10`` (and the other cut-offs), ``num_queries``,
        ``num_docs``, ``encode_seconds``, ``search_seconds``.
    """

    check_encode_precision(encode_precision)
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
        )
        qids = list(queries["_id"])
        q_emb = encode_texts(
            encoder, list(queries["text"]), kind="query", batch_size=batch_size, max_length=query_max_length
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
    if hybrid:

        def encode_for_fit(texts: list[str], kind: str) -> np.ndarray:
            with encoding_precision(model, encode_precision) as enc:
                length = query_max_length if kind == "query" else doc_max_length
                return encode_texts(enc, texts, kind=kind, batch_size=batch_size, max_length=length)

        result, run = _hybrid_result(
            result,
            run,
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
        )
    if output is not None:
        write_result(output, result, run)
    if return_run:
        result["run"] = run
    return result


def _hybrid_result(
    dense_result,
    dense_run,
    index: DenseIndex,
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
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The hybrid of the dense index already built and BM25 over the same corpus: its metrics at the top level, the
    dense and BM25 metrics beside them; returns the result and the hybrid's run."""
    fusion = fusion if isinstance(fusion, FusionConfig) else FusionConfig(**(fusion or {}))
    doc_ids = np.asarray(column_numpy(corpus, "_id"), dtype=object)
    t0 = time.perf_counter()
    texts = [t for _, batch in corpus_texts(corpus) for t in batch]  # the texts evaluate_bm25 indexes
    bm25 = BM25Index(texts)
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
        fusion = fit_fusion(
            fusion,
            texts,
            embeddings,
            lambda q: encode_for_fit(q, "query"),
            lambda d: encode_for_fit(d, "document"),
        )
        del embeddings
        fit_s = time.perf_counter() - t_fit
        logger.info("hybrid: dense weight %s fitted without labels in %.1f s", fusion.dense_weight, fit_s)
    del texts
    t1 = time.perf_counter()
    b_scores, b_rows = bm25.search(query_texts, top_k)
    bm25_s = time.perf_counter() - t1
    bm25_run = {
        q: {doc_ids[j]: float(sc) for j, sc in zip(b_rows[i], b_scores[i]) if sc > 0} for i, q in enumerate(qids)
    }
    t2 = time.perf_counter()
    depth = min(fusion.depth, top_k)
    d_scores, d_idx = index.search(q_emb, depth)
    run: dict[str, dict[str, float]] = {}
    for i, qid in enumerate(qids):
        valid = d_idx[i] >= 0
        keep = b_scores[i][:depth] > 0  # BM25 gives zero to a document without any query term: not a candidate
        rows, fused = fuse(
            order[d_idx[i][valid]],
            d_scores[i][valid],
            b_rows[i][:depth][keep],
            b_scores[i][:depth][keep],
            fusion,
            2 * depth,
        )
        run[qid] = dict(zip(doc_ids[rows].tolist(), fused.astype(float).tolist()))
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
