"""Exact inner-product search and K-Means: faiss when installed; otherwise torch (search) and scikit-learn (K-Means).

Both backends give the same results on the same inputs (up to float rounding and tie order): the tests check it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..errors import ConfigError
from ..utils import faiss_available

logger = logging.getLogger(__name__)


def _want_faiss(backend: str) -> bool:
    if backend not in ("auto", "faiss", "torch"):
        raise ValueError(f"backend must be 'auto', 'faiss' or 'torch', got {backend!r}")
    if backend == "torch":
        return False
    ok = faiss_available()
    if backend == "faiss" and not ok:
        raise ImportError("backend='faiss' needs faiss: pip install 'hf-cocodr[faiss-cpu]' (or [faiss-gpu]).")
    return ok


_LOGGED: set[str] = set()


def _log_backend(what: str, backend: str) -> None:
    if (what, backend) not in _LOGGED:
        _LOGGED.add((what, backend))
        logger.info("%s backend: %s", what, backend)


def _faiss_gpu_count() -> int:
    import faiss

    try:
        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except Exception:  # pragma: no cover - GPU builds only
        return 0


class DenseIndex:
    """An exact inner-product index that embeddings are streamed into.

    Args:
        dim: embedding dimension.
        backend: ``"auto"`` (faiss ``IndexFlatIP`` when installed, else torch), ``"faiss"`` or ``"torch"``.
        capacity: optional number of vectors to pre-allocate (both backends): the index then never re-allocates, so
            its memory stays at the raw size of the embeddings instead of peaking at up to twice that while it grows.
        use_gpu: move the faiss index to the GPUs when faiss-gpu and a GPU are present (logged either way).
    """

    def __init__(self, dim: int, backend: str = "auto", capacity: int | None = None, use_gpu: bool = True):
        self.dim = dim
        self.use_faiss = _want_faiss(backend)
        self.ntotal = 0
        if self.use_faiss:
            import faiss

            index = faiss.IndexFlatIP(dim)
            if capacity:  # reserve the vectors' storage once: growing it by doubling peaked at up to 2x their size
                index.codes.resize(int(capacity) * dim * 4)
                index.codes.resize(0)  # (a std::vector keeps its capacity when it shrinks)
            if use_gpu and _faiss_gpu_count() > 0:  # pragma: no cover - needs a GPU
                index = faiss.index_cpu_to_all_gpus(index)
                _log_backend("exact search", f"faiss on {_faiss_gpu_count()} GPU(s)")
            else:
                _log_backend("exact search", "faiss on CPU" + (" (no GPU found)" if use_gpu else ""))
            self._index = index
        else:
            _log_backend("exact search", "torch (faiss not installed)" if backend == "auto" else "torch")
            self._buf = torch.empty((capacity or 1024, dim), dtype=torch.float32)

    @property
    def backend(self) -> str:
        return "faiss" if self.use_faiss else "torch"

    def add(self, embeddings: np.ndarray | torch.Tensor) -> None:
        x = _as_f32_numpy(embeddings)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (n, {self.dim}), got {x.shape}")
        if self.use_faiss:
            self._index.add(x)
        else:
            need = self.ntotal + len(x)
            if need > self._buf.shape[0]:
                new = torch.empty((max(need, int(self._buf.shape[0] * 1.5)), self.dim), dtype=torch.float32)
                new[: self.ntotal] = self._buf[: self.ntotal]
                self._buf = new
            self._buf[self.ntotal : need] = torch.from_numpy(x)
        self.ntotal += len(x)

    def search(
        self, queries: np.ndarray | torch.Tensor, k: int, query_batch: int = 1024
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores, indices)`` of shape ``(n_queries, min(k, ntotal))``, best first;
        equal scores in row order (:func:`ties_by_row`)."""
        q = _as_f32_numpy(queries)
        k = min(k, self.ntotal)
        if k == 0:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        if self.use_faiss:
            scores, idx = self._index.search(q, k)
            return ties_by_row(scores, idx.astype(np.int64))
        # torch.topk, not sentence_transformers.util.semantic_search: on 1,109 x 5,183 x 384 (SciFact size, 1 core)
        # semantic_search took 1.07 s at k=100 and 6.45 s at k=1000 vs 0.52 s / 0.78 s here (its per-query heaps)
        docs = self._buf[: self.ntotal]
        out_s = np.empty((len(q), k), np.float32)
        out_i = np.empty((len(q), k), np.int64)
        for s in range(0, len(q), query_batch):
            sims = torch.from_numpy(q[s : s + query_batch]) @ docs.T
            top = torch.topk(sims, k, dim=1)
            out_s[s : s + query_batch] = top.values.numpy()
            out_i[s : s + query_batch] = top.indices.numpy()
        return ties_by_row(out_s, out_i)

    def reconstruct_all(self) -> np.ndarray:
        if self.use_faiss:
            return self._index.reconstruct_n(0, self.ntotal)
        return self._buf[: self.ntotal].numpy().copy()


def ties_by_row(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A top-``k`` ``(scores, rows)`` (best first) with each run of equal scores put in row order, so that exact
    search gives one order whichever backend (faiss, torch, :class:`~hf_cocodr.retrieval.vectors.MappedIndex`) ran
    it; unchanged (no copy) where no two neighbouring scores are equal."""
    if scores.shape[1] < 2 or not (scores[:, 1:] == scores[:, :-1]).any():
        return scores, rows
    keep = np.lexsort((rows, -scores), axis=1)
    return np.take_along_axis(scores, keep, axis=1), np.take_along_axis(rows, keep, axis=1)


def _as_f32_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def kmeans(
    x: np.ndarray | torch.Tensor,
    k: int,
    *,
    niter: int = 20,
    seed: int = 42,
    max_points_per_centroid: int | None = None,
    spherical: bool = False,
    backend: str = "auto",
    init_centroids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's K-Means; returns ``(centroids (k, d), assignments (n,))``. ``faiss.Kmeans`` when faiss is installed
    (``backend="auto"`` / ``"faiss"``), else scikit-learn's ``KMeans`` (``backend="torch"``: the backend without
    faiss). The same seed gives the same clusters, bit for bit.

    Args:
        max_points_per_centroid: train on at most this many points per centroid (faiss's own default is 256,
            i.e. a 12,800-point sample for k=50). ``None`` means *all points*, which is what iDRO wants.
        spherical: normalise centroids after each iteration (for cosine geometry); faiss only.
        init_centroids: start from these centroids instead of a random sample (used to keep cluster identities
            stable when re-clustering).
    """
    x = _as_f32_numpy(x)
    n, d = x.shape
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k={k} clusters need at least k points, got {n}")
    if _want_faiss(backend):
        import faiss

        gpus = _faiss_gpu_count()
        _log_backend("K-Means", f"faiss on {gpus} GPU(s)" if gpus else "faiss on CPU")
        km = faiss.Kmeans(
            d,
            k,
            niter=niter,
            seed=seed,
            spherical=spherical,
            max_points_per_centroid=max_points_per_centroid if max_points_per_centroid else max(1, (n + k - 1) // k),
            min_points_per_centroid=1,
            gpu=gpus > 0,
            verbose=False,
        )
        km.train(x, init_centroids=None if init_centroids is None else _as_f32_numpy(init_centroids))
        _, assign = km.index.search(x, 1)
        return km.centroids.copy(), assign[:, 0].astype(np.int64)
    if spherical:
        raise ValueError(
            "spherical K-Means needs faiss (backend='auto' or 'faiss'): scikit-learn has no spherical mode"
        )
    _log_backend("K-Means", "scikit-learn")
    return _sklearn_kmeans(x, k, niter, seed, max_points_per_centroid, init_centroids)


def _sklearn_kmeans(x, k, niter, seed, max_points_per_centroid, init_centroids):
    """scikit-learn's Lloyd K-Means from a seeded random sample (or ``init_centroids``), on one thread: its threads
    sum partial centroids in arrival order, so more than two of them would not give bit-identical clusters."""
    from sklearn.cluster import KMeans

    gen = np.random.default_rng(seed)
    n = len(x)
    train = x
    if max_points_per_centroid and n > k * max_points_per_centroid:
        train = x[np.sort(gen.choice(n, k * max_points_per_centroid, replace=False))]
    if init_centroids is not None:
        init = _as_f32_numpy(init_centroids)
    else:
        init = train[gen.choice(len(train), k, replace=False)]
    with threadpool_limits(limits=1):
        km = KMeans(k, init=init, n_init=1, max_iter=niter, tol=0.0, algorithm="lloyd").fit(train)
        assign = km.predict(x)
    return km.cluster_centers_.astype(np.float32), assign.astype(np.int64)


def check_finite(vectors, what: str) -> np.ndarray:
    """``vectors`` as an array, refused with one :class:`~hf_cocodr.errors.ConfigError` line when any value is NaN or
    infinite (a broken model, a damaged file): ``what`` names them (``"the model's document vectors"``, a file)."""
    x = np.asarray(vectors)
    if x.dtype.kind == "f" and x.size and not np.isfinite(x).all():
        bad = ~np.isfinite(x).reshape(len(x), -1).all(axis=1) if x.ndim > 1 else ~np.isfinite(x)
        rows = np.flatnonzero(bad)
        raise ConfigError(
            f"{what}: {len(rows)} of {len(x)} vectors are not finite (NaN or inf; first: row {int(rows[0])}); a model "
            "that gives them is broken (or overflows at this precision), a file that holds them is damaged"
        )
    return x


class BM25Index:
    """A bm25s index over a list of texts; ``search`` returns ``(scores, row_indices)`` like :class:`DenseIndex`.
    ``name``: what the texts are (a corpus's path), for the one line that refuses texts with no word to index."""

    def __init__(
        self,
        texts: list[str] | None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        language: str = "english",
        show_progress: bool = False,
        name: str | None = None,
    ):
        import bm25s
        import Stemmer

        self._bm25s = bm25s
        self.k1, self.b, self.language = k1, b, language
        self.stemmer = Stemmer.Stemmer(language)
        self.stopwords = "en" if language == "english" else None
        self.show_progress = show_progress
        if texts is None:  # filled by load()
            return
        tokens = bm25s.tokenize(texts, stopwords=self.stopwords, stemmer=self.stemmer, show_progress=show_progress)
        if not tokens.vocab:  # (bm25s itself fails on an empty vocabulary with "max() arg is an empty sequence")
            raise ConfigError(
                f"{name or 'the corpus'}: no indexable word in its {len(texts)} documents (each is empty, or only "
                "stop words, one-character words and punctuation): BM25 has nothing to index"
            )
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(tokens, show_progress=show_progress)
        self.ntotal = len(texts)

    def config(self) -> dict[str, Any]:
        """The settings a saved index is loaded with."""
        return {"k1": self.k1, "b": self.b, "language": self.language, "num_docs": self.ntotal}

    def save(self, folder: str | os.PathLike) -> None:
        """Write the bm25s index (no texts) into ``folder``."""
        self.retriever.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: str | os.PathLike, config: dict[str, Any], *, mmap: bool = False) -> BM25Index:
        """An index written by :meth:`save`, with the :meth:`config` it was saved with; ``mmap``: its score matrix
        memory-mapped (bm25s's ``mmap=True``), read from the files as a search needs it, with the same results."""
        index = cls(None, k1=config["k1"], b=config["b"], language=config["language"])
        index.retriever = index._bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
        index.ntotal = int(config["num_docs"])
        return index

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.ntotal)
        q_tokens = self._bm25s.tokenize(
            queries,
            stopwords=self.stopwords,
            stemmer=self.stemmer,
            show_progress=False,
        )
        # A query made only of stop words has no tokens; bm25s then scores every document 0.
        idx, scores = self.retriever.retrieve(q_tokens, k=k, show_progress=self.show_progress, n_threads=0)
        return np.asarray(scores, np.float32), np.asarray(idx, np.int64)
