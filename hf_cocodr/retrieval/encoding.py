"""Encoding and dense search: the model's query/document encodings, the corpus streamed into an exact index in
length-sorted chunks (in a run's :class:`~hf_cocodr.retrieval.session.EncodingSession`: read from the encoding cache, or
kept for reuse; an approximate one built from it beyond a size, :mod:`~hf_cocodr.retrieval.ann`), and a search's
top-``k`` as a run."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.compute as pc

from .. import distributed as D
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
CHUNK_DOCS = 4096  # documents a chunk of a corpus encoding (the unit the ranks share, see encode_sharded)


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


def _reuse_key(model, corpus, max_length, backend, normalize, batch_size, session: EncodingSession) -> tuple | None:
    fp = getattr(corpus, "_fingerprint", None)
    if not session.reuse or fp is None:
        return None
    weights = model_fingerprint(model)["weights_sha256"]
    # the precision as the disk cache keys it: the session's bf16 or the caller's own autocast
    precision = encoding_cache.current_precision(model, session)
    return (weights, fp, len(corpus), max_length, backend, normalize, precision, batch_size)


def build_index(
    model,
    corpus,
    *,
    batch_size: int = 64,
    max_length: int | None = None,
    chunk_docs: int | None = None,
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

    Under ``torch.distributed`` (``torchrun``) the ranks share the encoding (:func:`encode_sharded`: each encodes
    its chunks of the length-sorted order, ``chunk_docs`` documents each, default :data:`CHUNK_DOCS`) and each holds
    the whole index, equal to the one a single process builds; every rank must call it. The disk cache is served
    only where every rank can read it, and written by rank 0.
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
    """:func:`build_index`'s exact index and order (encoded through :func:`encode_sharded`)."""
    session = session if session is not None else EncodingSession()
    t0 = time.perf_counter()
    normalize = model_similarity(model) == "cosine"
    key = _reuse_key(model, corpus, max_length, backend, normalize, batch_size, session)
    disk_key = (
        encoding_cache.encoding_key(model, corpus, max_length, normalize, batch_size=batch_size, session=session)
        if session.cache
        else None
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
    cached = _load_cached(disk_key)
    if cached is not None:  # the same exact index a fresh encoding builds: the vectors in length-sorted order
        step = int(chunk_docs or CHUNK_DOCS)
        for s in range(0, len(order), step):  # read from the memory-mapped file a chunk at a time
            index.add(cached[order[s : s + step]])
        logger.info("corpus of %d documents: its encoding by this model is read from the cache", len(corpus))
        encoding_cache.record(session, disk_key, "disk cache", time.perf_counter() - t0)
        if on_chunk is not None:
            on_chunk(len(order))
        session.keep(key, index, order, dim)
        return index, order
    # the vectors as the cache keeps them (float16 for bf16: vectors.as_stored), streamed into its file as encoded
    # (by rank 0 alone: every rank holds the same vectors)
    stored = storage_dtype(encoding_cache.current_precision(model, session))
    sink = encoding_cache.writer(disk_key, dim) if disk_key is not None and D.is_main() else None

    def encode_rows(rows: np.ndarray) -> np.ndarray:
        b = corpus[rows]
        titles = b.get("title") or [""] * len(rows)
        texts = [doc_text(t, x) for t, x in zip(titles, b["text"])]
        vectors = encode_texts(
            model,
            texts,
            kind="document",
            batch_size=batch_size,
            max_length=max_length,
            normalize=normalize,
            session=session,
        )
        return as_stored(vectors, stored)

    def add(vectors: np.ndarray, done: int) -> None:
        index.add(vectors)
        if sink is not None:
            sink.write(order[done - len(vectors) : done], vectors)  # (corpus row order)
        if on_chunk is not None:
            on_chunk(done)

    encode_sharded(encode_rows, order, dim, add, chunk_docs=chunk_docs, show_progress_bar=show_progress_bar)
    if disk_key is not None:
        seconds = time.perf_counter() - t0
        if sink is not None:
            encoding_cache.commit(disk_key, sink, seconds)
        encoding_cache.record(session, disk_key, "encoded", seconds)
    session.keep(key, index, order, dim)
    return index, order


def _load_cached(disk_key: dict | None) -> np.ndarray | None:
    """The cached vectors for ``disk_key`` where every rank can read them (a cache on a disk the ranks share), else
    None on every rank (then all encode): the ranks never split between a cached and a fresh encoding."""
    cached = encoding_cache.load(disk_key) if disk_key is not None else None
    if disk_key is not None and not D.agree(cached is not None):
        return None
    return cached


def encode_sharded(
    encode_rows: Callable[[np.ndarray], np.ndarray],
    order: np.ndarray,
    dim: int,
    emit: Callable[[np.ndarray, int], None],
    *,
    chunk_docs: int | None = None,
    show_progress_bar: bool = False,
) -> None:
    """The one path every corpus encoding takes: ``order`` (the rows to encode, in the order their vectors are
    wanted) is cut into chunks of ``chunk_docs`` (default :data:`CHUNK_DOCS`), each chunk's rows are encoded by
    ``encode_rows(rows)`` into a ``(len(rows), dim)`` float32 array, and ``emit(vectors, n_done)`` receives the chunks
    in order.

    Under ``torch.distributed`` each rank encodes its own chunks (dealt by :func:`~hf_cocodr.distributed.
    chunk_owner`: whole contiguous slices of ``order``, so a chunk is batched exactly as one process batches it) and
    every chunk is then broadcast from its rank, so every rank's ``emit`` receives the same vectors in the same order:
    the same index everywhere, equal to one process's. A rank may have no chunk (a corpus of fewer chunks than ranks).
    It is a collective: every rank must call it, with the same ``order`` and ``chunk_docs``. A rank that fails to
    encode makes every rank raise (:func:`~hf_cocodr.distributed.raise_together`). In one process it encodes and emits
    chunk by chunk (peak memory: one chunk)."""
    from tqdm.auto import tqdm

    chunk = int(chunk_docs or CHUNK_DOCS)
    if chunk < 1:
        raise ValueError(f"chunk_docs must be >= 1, got {chunk_docs!r}")
    spans = [(s, min(s + chunk, len(order))) for s in range(0, len(order), chunk)]
    size, rank = D.world()
    bar = tqdm(total=len(order), desc="Encoding corpus", unit="doc", disable=not show_progress_bar or rank != 0)
    if size == 1:
        for s, e in spans:
            emit(_checked(encode_rows(order[s:e]), e - s, dim), e)
            bar.update(e - s)
        bar.close()
        return
    mine: dict[int, np.ndarray] = {}
    error: BaseException | None = None
    try:
        for i, (s, e) in enumerate(spans):
            if D.chunk_owner(i, size) == rank:
                mine[i] = _checked(encode_rows(order[s:e]), e - s, dim)
                bar.update(size * (e - s))  # (rank 0's view: the ranks advance together)
    except Exception as e:  # every rank must hear of it before the broadcasts
        error = e
    bar.close()
    D.raise_together(error)
    for i, (_, e) in enumerate(spans):
        emit(D.broadcast_array(mine.pop(i, None), src=D.chunk_owner(i, size)), e)


def _checked(vectors: np.ndarray, rows: int, dim: int) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.shape != (rows, dim):
        raise RuntimeError(
            f"a chunk of {rows} documents was encoded into vectors of shape {vectors.shape}, expected ({rows}, {dim})"
        )
    return vectors


def encode_documents(
    model,
    texts: list[str],
    *,
    batch_size: int = 64,
    max_length: int | None = None,
    normalize: bool | None = None,
    session: EncodingSession | None = None,
    chunk_docs: int | None = None,
) -> np.ndarray:
    """:func:`encode_texts` of documents given as texts (``kind="document"``), through :func:`encode_sharded`: under
    ``torch.distributed`` the ranks share the chunks (contiguous slices of ``texts``) and each returns all the
    vectors, in ``texts`` order (a collective: every rank calls it with the same texts). The fusion fit encodes its
    documents with it."""
    dim = model.get_embedding_dimension()
    out = np.empty((len(texts), dim), dtype=np.float32)
    at = [0]

    def encode_rows(rows: np.ndarray) -> np.ndarray:
        return encode_texts(
            model,
            [texts[i] for i in rows],
            kind="document",
            batch_size=batch_size,
            max_length=max_length,
            normalize=normalize,
            session=session,
        )

    def emit(vectors: np.ndarray, done: int) -> None:
        out[at[0] : done] = vectors
        at[0] = done

    encode_sharded(encode_rows, np.arange(len(texts)), dim, emit, chunk_docs=chunk_docs)
    return out


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
