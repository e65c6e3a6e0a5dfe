"""Encoding and dense search: the model's query/document encodings, the corpus streamed into an exact index in
length-sorted chunks (in a run's :class:`~hf_cocodr.retrieval.session.EncodingSession`: read from the encoding cache, or
kept for reuse; an approximate one built from it beyond a size, :mod:`~hf_cocodr.retrieval.ann`), and a search's
top-``k`` as a run."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..data.beir import column_array, doc_text
from ..modeling.precision import encoding_autocast
from ..rundir.run_record import model_fingerprint
from . import encoding_cache
from .ann import ApproximateIndex, IndexChoice, build_approximate, index_choice
from .index import DenseIndex, check_finite
from .session import EncodingSession
from .vectors import as_stored, storage_dtype

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
    session: EncodingSession | None = None,
) -> np.ndarray:
    """Encode queries (``kind="query"``) or documents (``kind="document"``) with the model's own prompts/lengths, in
    the ``session``'s precision (bf16 autocast where it is bf16 and the caller set no autocast; default fp32).
    Vectors with a NaN or an infinite value (a broken model) are refused (:func:`~hf_cocodr.retrieval.index.
    check_finite`): nothing is indexed, ranked or fitted on them."""
    if normalize is None:
        normalize = model_similarity(model) == "cosine"
    fn = getattr(model, "encode_query" if kind == "query" else "encode_document", None) or model.encode
    with encoding_autocast(model, session.precision if session is not None else "fp32"):
        emb = fn(
            texts,
            batch_size=batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
            normalize_embeddings=normalize,
            **_processing_kwargs(max_length),
        )
    return check_finite(np.asarray(emb, dtype=np.float32), f"the model's {kind} vectors")


def length_sorted_order(corpus) -> np.ndarray:
    """Corpus row order by decreasing ``title + text`` length, computed in Arrow (no Python strings)."""
    lengths = pc.utf8_length(column_array(corpus, "text")).to_numpy()
    if "title" in corpus.column_names:
        lengths = lengths + pc.utf8_length(column_array(corpus, "title")).to_numpy()
    return np.argsort(-lengths, kind="stable")


def _reuse_key(model, corpus, max_length, backend, normalize, session: EncodingSession) -> tuple | None:
    fp = getattr(corpus, "_fingerprint", None)
    if not session.reuse or fp is None:
        return None
    weights = model_fingerprint(model)["weights_sha256"]
    # the precision as the disk cache keys it: the session's bf16 or the caller's own autocast
    precision = encoding_cache.current_precision(model, session)
    return (weights, fp, len(corpus), max_length, backend, normalize, precision)


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
    session: EncodingSession | None = None,
    index: IndexChoice | str = "exact",
) -> tuple[DenseIndex | ApproximateIndex, np.ndarray]:
    """Encode a corpus dataset in length-sorted chunks and stream the vectors into an exact index, in the
    ``session``'s precision (:func:`encode_texts`).

    Returns the index and ``order``: index row ``r`` holds corpus row ``order[r]``. Peak memory is the index plus
    one chunk of embeddings, never a second full copy (with a caching ``session``, each chunk is also streamed into the
    disk cache's memory-mapped file, and a cached encoding is served from it a chunk at a time instead of encoding
    again, :mod:`~hf_cocodr.retrieval.encoding_cache`; a bf16 encoding's vectors are rounded to the float16 the cache
    keeps them in, cached or not, :func:`~hf_cocodr.retrieval.vectors.as_stored`; with a reusing one, an index this
    session built for the same weights, corpus and settings is
    returned). ``on_chunk(n_done)`` is called after every chunk. ``index``: ``exact`` (default), or the
    :class:`~hf_cocodr.retrieval.ann.IndexChoice` that makes an approximate index from the exact one (its rows in the
    same order, its recall in ``.record``); a bad choice is refused before a document is encoded.
    """
    choice = index_choice(index, backend)
    exact, order = _build_exact_index(
        model, corpus, batch_size, max_length, chunk_docs, backend, show_progress_bar, on_chunk, session
    )
    kind = choice.resolve(len(order), backend)
    if kind == "exact":
        return exact, order
    return build_approximate(exact.reconstruct_all(), kind, choice, exact=exact), order


def _build_exact_index(
    model, corpus, batch_size, max_length, chunk_docs, backend, show_progress_bar, on_chunk, session
) -> tuple[DenseIndex, np.ndarray]:
    """:func:`build_index`'s exact index and order."""
    from tqdm.auto import tqdm

    session = session if session is not None else EncodingSession()
    t0 = time.perf_counter()
    normalize = model_similarity(model) == "cosine"
    key = _reuse_key(model, corpus, max_length, backend, normalize, session)
    disk_key = (
        encoding_cache.encoding_key(model, corpus, max_length, normalize, session=session) if session.cache else None
    )
    kept = session.kept(key)
    if kept is not None:
        logger.info("corpus of %d documents: its encoding by this model is reused", len(corpus))
        if disk_key is not None:
            encoding_cache.record(session, disk_key, "memory", time.perf_counter() - t0)
        return kept
    order = length_sorted_order(corpus)
    dim = model.get_embedding_dimension()
    index = DenseIndex(dim, backend=backend, capacity=len(order))
    cached = encoding_cache.load(disk_key) if disk_key is not None else None
    if cached is not None:  # the same exact index a fresh encoding builds: the vectors in length-sorted order
        for s in range(0, len(order), chunk_docs):  # read from the memory-mapped file a chunk at a time
            index.add(cached[order[s : s + chunk_docs]])
        logger.info("corpus of %d documents: its encoding by this model is read from the cache", len(corpus))
        encoding_cache.record(session, disk_key, "disk cache", time.perf_counter() - t0)
        if on_chunk is not None:
            on_chunk(len(order))
        session.keep(key, index, order, dim)
        return index, order
    # the vectors as the cache keeps them (float16 for bf16: vectors.as_stored), streamed into its file as encoded
    stored = storage_dtype(encoding_cache.current_precision(model, session))
    sink = encoding_cache.writer(disk_key, dim) if disk_key is not None else None
    bar = tqdm(total=len(order), desc="Encoding corpus", unit="doc", disable=not show_progress_bar)
    for s in range(0, len(order), chunk_docs):
        rows = order[s : s + chunk_docs]
        b = corpus[rows]
        titles = b.get("title") or [""] * len(rows)
        texts = [doc_text(t, x) for t, x in zip(titles, b["text"])]
        vectors = as_stored(
            encode_texts(
                model,
                texts,
                kind="document",
                batch_size=batch_size,
                max_length=max_length,
                normalize=normalize,
                session=session,
            ),
            stored,
        )
        index.add(vectors)
        if sink is not None:
            sink.write(rows, vectors)  # (corpus row order)
        bar.update(len(rows))
        if on_chunk is not None:
            on_chunk(s + len(rows))
    bar.close()
    if disk_key is not None:
        seconds = time.perf_counter() - t0
        if sink is not None:
            encoding_cache.commit(disk_key, sink, seconds)
        encoding_cache.record(session, disk_key, "encoded", seconds)
    session.keep(key, index, order, dim)
    return index, order


def search_run(
    index: DenseIndex | ApproximateIndex,
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
