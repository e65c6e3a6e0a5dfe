"""The dense index chosen by size: exact search up to a number of documents the user sets, an approximate faiss index
(HNSW or IVF) beyond it, its recall@100 against exact search measured when it is built and recorded beside its
parameters.

``--index exact|hnsw|ivf|auto`` (``evaluate``, ``mteb --hybrid``) and ``index=`` (:func:`~hf_cocodr.evaluation.
evaluate_retrieval`, :meth:`HybridRetriever.build <hf_cocodr.retrieval.hybrid.HybridRetriever.build>`) take an
:class:`IndexChoice` (or its kind as a string). ``auto`` is exact search (:class:`~hf_cocodr.retrieval.index.
DenseIndex`, the same scores and ids as ever) up to :attr:`IndexChoice.exact_max_docs` documents (default 1,000,000),
HNSW beyond it (exact, with a warning, where faiss is not installed). An approximate index records
``{kind, params, recall@100, sample}``: the share of the exact top-100 it returns, averaged over a seeded sample of
the documents' own vectors used as queries. The approximate kinds need faiss; they are built on the CPU (the same
parameters and vectors give the same index), exact search uses the GPUs faiss finds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..utils import faiss_available

logger = logging.getLogger(__name__)

INDEX_KINDS = ("exact", "hnsw", "ivf", "auto")
APPROXIMATE_KINDS = ("hnsw", "ivf")
DEFAULT_EXACT_MAX_DOCS = 1_000_000
RECALL_K = 100
FAISS_HINT = "pip install 'hf-cocodr[faiss-cpu]'"


@dataclass(frozen=True)
class IndexChoice:
    """Which dense index a search uses (see the module docstring); ``None`` parameters are set from the number of
    documents (:meth:`params`).

    Args:
        kind: ``exact``, ``hnsw``, ``ivf`` or ``auto`` (exact up to ``exact_max_docs`` documents, else HNSW).
        exact_max_docs: the largest corpus ``auto`` searches exactly.
        hnsw_m / hnsw_ef_construction / hnsw_ef_search: HNSW's links per node and its build and search breadths
            (a search of ``k`` documents looks at least ``k`` wide).
        ivf_nlist / ivf_nprobe: IVF's clusters (default ``4 * sqrt(n)``, at most ``n / 39``) and the clusters a query
            scans (default ``max(16, nlist / 32)``).
        recall_sample: documents whose vectors are the queries of the recall measurement; ``seed`` draws them.
    """

    kind: str = "auto"
    exact_max_docs: int = DEFAULT_EXACT_MAX_DOCS
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    ivf_nlist: int | None = None
    ivf_nprobe: int | None = None
    recall_sample: int = 1000
    seed: int = 0

    def check(self, backend: str = "auto") -> IndexChoice:
        """Itself, or one :class:`~hf_cocodr.errors.ConfigError` line naming ``--index`` (or the parameter): an
        unknown kind, a parameter that is not a whole number >= 1, an approximate kind without faiss or with the
        torch backend."""
        if self.kind not in INDEX_KINDS:
            raise ConfigError(f"--index must be one of {', '.join(INDEX_KINDS)}, got {self.kind!r}")
        for name, value in asdict(self).items():
            if name in ("kind", "seed") or (value is None and name.startswith("ivf_")):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                flag = "--index-exact-max-docs" if name == "exact_max_docs" else f"the --index parameter {name}"
                raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}")
        if self.kind in APPROXIMATE_KINDS:
            if backend == "torch":
                raise ConfigError(f"--index {self.kind} is a faiss index; it cannot run on --backend torch")
            if not faiss_available():
                raise ConfigError(f"--index {self.kind} needs faiss: {FAISS_HINT}")
        return self

    def resolve(self, num_docs: int, backend: str = "auto") -> str:
        """The kind an index over ``num_docs`` documents is: ``auto`` made ``exact`` or ``hnsw``."""
        if self.kind != "auto":
            return self.kind
        if num_docs <= self.exact_max_docs:
            return "exact"
        if backend == "torch" or not faiss_available():
            logger.warning(
                "--index auto: %d documents are more than --index-exact-max-docs %d, but HNSW needs faiss (%s): "
                "exact search",
                num_docs,
                self.exact_max_docs,
                FAISS_HINT if backend != "torch" else "not --backend torch",
            )
            return "exact"
        return "hnsw"

    def params(self, kind: str, num_docs: int) -> dict[str, int]:
        """The parameters an index of ``kind`` over ``num_docs`` documents is built and searched with."""
        if kind == "hnsw":
            return {"m": self.hnsw_m, "ef_construction": self.hnsw_ef_construction, "ef_search": self.hnsw_ef_search}
        if kind == "ivf":
            nlist = self.ivf_nlist or max(1, min(round(4 * math.sqrt(num_docs)), num_docs // 39))
            nprobe = self.ivf_nprobe or max(16, nlist // 32)
            nlist = min(nlist, max(1, num_docs))  # (k-means needs a document per cluster)
            return {"nlist": int(nlist), "nprobe": int(min(nprobe, nlist))}
        return {}


def index_choice(index: IndexChoice | str | None, backend: str = "auto") -> IndexChoice:
    """``index`` as a checked :class:`IndexChoice` (a string is its kind; ``None`` is ``auto``)."""
    if index is None:
        index = IndexChoice()
    elif isinstance(index, str):
        index = IndexChoice(kind=index)
    elif not isinstance(index, IndexChoice):
        raise ConfigError(f"index must be one of {', '.join(INDEX_KINDS)} or an IndexChoice, got {index!r}")
    return index.check(backend)


class ApproximateIndex:
    """A faiss HNSW or IVF index over inner products, searched like :class:`~hf_cocodr.retrieval.index.DenseIndex`
    (``(scores, rows)``, ``-1`` where it finds fewer than ``k``); :attr:`record` is what it was built with and its
    measured recall."""

    backend = "faiss"

    def __init__(self, faiss_index, kind: str, params: dict[str, int], record: dict[str, Any]):
        self._index = faiss_index
        self.kind, self.params, self.record = kind, dict(params), dict(record)
        self.dim, self.ntotal = faiss_index.d, faiss_index.ntotal
        _set_search_params(faiss_index, kind, params)

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores, rows)`` of shape ``(n_queries, min(k, ntotal))``."""
        q = _f32(queries)
        k = min(k, self.ntotal)
        if k == 0:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        scores, rows = self._index.search(q, k)
        return scores, rows.astype(np.int64)

    def reconstruct_all(self) -> np.ndarray:
        if self.kind == "ivf":
            self._index.make_direct_map()
        return self._index.reconstruct_n(0, self.ntotal)

    def write(self, path) -> None:
        """Write the faiss index to ``path`` (:func:`read_approximate` reads it back, searching identically)."""
        import faiss  # an optional extra

        faiss.write_index(self._index, str(path))


def _f32(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (any precision)
        x = x.detach().to("cpu").float().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def _set_search_params(index, kind: str, params: dict[str, int]) -> None:
    if kind == "hnsw":
        index.hnsw.efSearch = int(params["ef_search"])
    else:
        index.nprobe = int(params["nprobe"])


def build_approximate(vectors, kind: str, choice: IndexChoice, exact=None, exact_order=None) -> ApproximateIndex:
    """An approximate index of ``kind`` over ``vectors`` (its row ``i`` is ``vectors[i]``), its recall@100 against
    exact search measured on ``choice.recall_sample`` of the vectors (seeded by ``choice.seed``) as queries.
    ``exact``: an exact :class:`~hf_cocodr.retrieval.index.DenseIndex` over the same vectors already built (``exact_order[r]``: the row of ``vectors`` its row
    ``r`` holds; default: the same rows), else one is built for the measurement."""
    import faiss  # an optional extra (IndexChoice.check refused its absence)

    x = _f32(vectors)
    n, dim = x.shape
    params = choice.params(kind, n)
    if kind == "hnsw":
        index = faiss.index_factory(dim, f"HNSW{params['m']},Flat", faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params["ef_construction"])
    else:
        index = faiss.index_factory(dim, f"IVF{params['nlist']},Flat", faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = choice.seed
        index.train(x)
    index.add(x)
    approx = ApproximateIndex(index, kind, params, {})
    if exact is None:
        from .index import DenseIndex  # torch: only where no exact index is given

        exact = DenseIndex(dim, capacity=n)
        exact.add(x)
    approx.record = measure_recall(approx, exact, x, choice, exact_order)
    logger.info(
        "dense index: %s over %d documents %s, recall@%d %.4f against exact search (%d sampled queries)",
        kind,
        n,
        params,
        RECALL_K,
        approx.record[f"recall@{RECALL_K}"],
        approx.record["sample"]["queries"],
    )
    return approx


def measure_recall(approx, exact, vectors, choice: IndexChoice, exact_order=None) -> dict[str, Any]:
    """``{kind, params, recall@100, sample}``: the mean share of each sampled query's exact top-100 (top-``n`` of a
    smaller corpus) that ``approx`` returns; the queries are ``choice.recall_sample`` rows of ``vectors`` drawn with
    ``choice.seed``."""
    n = len(vectors)
    take = min(choice.recall_sample, n)
    rows = np.sort(np.random.default_rng(choice.seed).choice(n, take, replace=False))
    queries = _f32(vectors[rows])
    k = min(RECALL_K, n)
    _, want = exact.search(queries, k)
    if exact_order is not None:
        want = np.asarray(exact_order)[want]
    _, got = approx.search(queries, k)
    recall = float(np.mean([np.intersect1d(w, g[g >= 0]).size / k for w, g in zip(want, got)])) if take else 1.0
    sample = {"queries": int(take), "from": "documents", "seed": choice.seed}
    return {
        "kind": approx.kind,
        "params": dict(approx.params),
        f"recall@{RECALL_K}": round(recall, 6),
        "sample": sample,
    }


def read_approximate(path, record: dict[str, Any]) -> ApproximateIndex:
    """The index :meth:`ApproximateIndex.write` wrote to ``path``, searched with the ``record`` it was saved with."""
    import faiss  # an optional extra

    return ApproximateIndex(faiss.read_index(str(path)), record["kind"], record["params"], record)
