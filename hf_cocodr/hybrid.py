"""A hybrid retriever: a dense encoder and BM25 over the same corpus, fused per query.

The lexical channel of a corpus is the largest gain a strong dense model can take without labels: BM25 ranks by the
corpus's own words, which a model trained elsewhere never saw weighted that way. :class:`HybridRetriever` keeps both
indexes and fuses their rankings per query with a label-free rule (:class:`~hf_cocodr.fusion.FusionConfig`:
z-normalised scores in a convex combination, the default, or weighted reciprocal-rank fusion). By default the dense
weight is fitted to the corpus when the retriever is built, from pseudo-queries drawn from the corpus itself (no
labels; :func:`~hf_cocodr.fusion.fit_fusion`); the weight and how it was found are saved with the retriever
(``hybrid.fusion.dense_weight``, ``hybrid.fusion.fit``). A weight given by hand is used as is.

Example::

    from hf_cocodr import HybridRetriever

    hybrid = HybridRetriever.build("path/to/model", "data/scifact")   # a BEIR folder, corpus.jsonl or Dataset
    ids, scores = hybrid.search(["aspirin lowers the risk of stroke"], k=10)
    hybrid.save("scifact-hybrid")
    hybrid = HybridRetriever.load("scifact-hybrid")                     # the model it was built with

A saved retriever holds the dense vectors, the bm25s index, the fusion settings, and the fingerprints of the model
(its weights) and the corpus (its ids and texts): loading it with another model, or checking it against a corpus
that changed, is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .fusion import FusionConfig, fit_fusion, fuse
from .modeling.loading import load_encoder
from .run_record import model_fingerprint
from .utils import atomic_directory, atomic_write_json

logger = logging.getLogger(__name__)

HYBRID_FILE = "hybrid.json"
FORMAT_VERSION = 1


def corpus_fingerprint(doc_ids: list[str], texts: list[str]) -> str:
    """A content hash of a corpus as the hybrid indexes it (its ids and its ``title + text`` in order)."""
    h = hashlib.sha256()
    for doc_id, text in zip(doc_ids, texts):
        h.update(doc_id.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()[:32]


def _corpus_ids_texts(corpus) -> tuple[list[str], list[str]]:
    """Ids and ``title + text`` of a corpus: a BEIR folder, a ``corpus.jsonl`` file or a dataset with ``_id`` /
    ``text`` (and optionally ``title``) columns."""
    from .data.beir import _load_jsonl_dataset, corpus_texts, load_corpus

    if isinstance(corpus, (str, os.PathLike)):
        path = Path(corpus)
        corpus = _load_jsonl_dataset(path, "corpus") if path.is_file() else load_corpus(path)
    ids, texts = [], []
    for batch_ids, batch_texts in corpus_texts(corpus):
        ids += list(batch_ids)
        texts += batch_texts
    return ids, texts


class HybridRetriever:
    """Dense + BM25 retrieval over one corpus, fused per query (see the module docstring). Build it with
    :meth:`build`, or :meth:`load` a saved one."""

    def __init__(
        self, model, doc_ids: list[str], embeddings: np.ndarray, bm25, fusion: FusionConfig, meta: dict[str, Any]
    ):
        from .index import DenseIndex

        self.model = model
        self.doc_ids = list(doc_ids)
        self.embeddings = embeddings
        self.dense_index = DenseIndex(embeddings.shape[1], capacity=len(embeddings))
        if len(embeddings):
            self.dense_index.add(embeddings)
        self.bm25 = bm25
        self.fusion = fusion
        self.meta = meta

    # ------------------------------------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        model,
        corpus,
        *,
        fusion: FusionConfig | dict | None = None,
        batch_size: int = 64,
        doc_max_length: int | None = None,
        show_progress_bar: bool = False,
    ) -> HybridRetriever:
        """Encode ``corpus`` with ``model`` (a ``SentenceTransformer`` or a path / Hub id) and index it for BM25.

        ``doc_max_length``: the document token limit (default: the model's own). The model's similarity is honoured
        (a cosine model's vectors are normalised). ``fusion``: default :class:`~hf_cocodr.fusion.FusionConfig` with
        its dense weight fitted here to the corpus without labels (:func:`~hf_cocodr.fusion.fit_fusion`; the build
        log and ``hybrid.fusion.fit`` say how); a number as ``dense_weight`` is used as is."""
        from .data.beir import _load_jsonl_dataset, load_corpus
        from .evaluation.retrieval import build_index, encode_texts, model_similarity
        from .index import BM25Index

        fusion = _fusion(fusion)
        model_ref = str(model) if isinstance(model, (str, os.PathLike)) else _model_ref(model)
        st = load_encoder(str(model)) if isinstance(model, (str, os.PathLike)) else model
        dataset = corpus
        if isinstance(corpus, (str, os.PathLike)):
            path = Path(corpus)
            dataset = _load_jsonl_dataset(path, "corpus") if path.is_file() else load_corpus(path)
        t0 = time.perf_counter()
        ids, texts = _corpus_ids_texts(dataset)
        if not ids:
            raise ConfigError(f"the corpus {corpus!r} has no documents")
        index, order = build_index(
            st, dataset, batch_size=batch_size, max_length=doc_max_length, show_progress_bar=show_progress_bar
        )
        in_index_order = index.reconstruct_all()
        del index
        embeddings = np.empty_like(in_index_order)
        embeddings[order] = in_index_order  # back to corpus order
        del in_index_order
        dense_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        bm25 = BM25Index(texts)
        bm25_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        fusion = fit_fusion(
            fusion,
            texts,
            embeddings,
            lambda q: encode_texts(st, q, kind="query", batch_size=batch_size),
            lambda d: encode_texts(st, d, kind="document", batch_size=batch_size, max_length=doc_max_length),
        )
        fit_s = time.perf_counter() - t2
        meta = {
            "model": model_ref,
            "model_fingerprint": model_fingerprint(st)["weights_sha256"],
            "similarity": model_similarity(st),
            "doc_max_length": doc_max_length,
            "corpus": str(corpus) if isinstance(corpus, (str, os.PathLike)) else "dataset",
            "corpus_fingerprint": corpus_fingerprint(ids, texts),
            "num_docs": len(ids),
            "build_seconds": {"dense": round(dense_s, 2), "bm25": round(bm25_s, 2), "fusion_fit": round(fit_s, 2)},
        }
        logger.info(
            "hybrid retriever over %d documents: dense %.1f s, BM25 %.1f s; fusion %s",
            len(ids),
            dense_s,
            bm25_s,
            asdict(fusion),
        )
        return cls(st, ids, embeddings, bm25, fusion, meta)

    # ------------------------------------------------------------------------------------------------ search
    def encode_queries(self, queries: list[str], batch_size: int = 64) -> np.ndarray:
        from .evaluation.retrieval import encode_texts

        return encode_texts(self.model, list(queries), kind="query", batch_size=batch_size)

    def search_dense(
        self, queries: list[str], k: int, *, query_embeddings: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dense top-``k``: ``(scores, rows)`` arrays of shape ``(n_queries, k)`` (rows index :attr:`doc_ids`)."""
        q = self.encode_queries(queries) if query_embeddings is None else query_embeddings
        return self.dense_index.search(q, k)

    def search_bm25(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-``k``: ``(scores, rows)``."""
        return self.bm25.search(list(queries), k)

    def search(
        self, queries: list[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
    ) -> tuple[list[list[str]], list[list[float]]]:
        """The fused top-``k`` of each query: ``(ids, scores)``, one list per query, best first."""
        if isinstance(queries, str):
            raise ConfigError("search takes a list of queries, got one string; wrap it in a list")
        queries = list(queries)
        if not queries:
            return [], []
        depth = max(self.fusion.depth, k)
        ds, di = self.search_dense(queries, depth, query_embeddings=query_embeddings)
        bs, bi = self.search_bm25(queries, depth)
        ids, scores = [], []
        for i in range(len(queries)):
            # BM25 gives zero to a document without any query term: not a candidate
            keep = bs[i] > 0
            rows, fused = fuse(di[i], ds[i], bi[i][keep], bs[i][keep], self.fusion, k)
            ids.append([self.doc_ids[r] for r in rows])
            scores.append(fused.astype(float).tolist())
        return ids, scores

    # ------------------------------------------------------------------------------------------------ saving
    def save(self, path: str | os.PathLike) -> None:
        """Write the retriever into the folder ``path`` atomically (a reader sees the old or the new one, never a
        half-written one). A folder that exists and is not a saved hybrid retriever is refused."""

        out = Path(path)
        if out.exists() and not (out / HYBRID_FILE).is_file():
            raise FileExistsError(
                f"{out} exists and is not a saved hybrid retriever ({HYBRID_FILE} missing); "
                "give a new folder (hf_cocodr never replaces files it did not write)"
            )
        with atomic_directory(out) as tmp:
            np.save(tmp / "dense_embeddings.npy", self.embeddings)
            # written as is (not through atomic_write_json's secret redaction: an id is data, whatever its shape);
            # the folder as a whole is atomic
            (tmp / "doc_ids.json").write_text(json.dumps(self.doc_ids, ensure_ascii=False), encoding="utf-8")
            self.bm25.save(tmp / "bm25")
            atomic_write_json(
                tmp / HYBRID_FILE,
                {
                    "format_version": FORMAT_VERSION,
                    "fusion": asdict(self.fusion),
                    **self.meta,
                    "bm25": self.bm25.config(),
                },
            )

    @classmethod
    def load(cls, path: str | os.PathLike, model=None, *, corpus=None) -> HybridRetriever:
        """Load a saved retriever. ``model``: the encoder for the queries (default: the one it was built with); its
        weights must be the ones the documents were encoded with. ``corpus``: if given, it must be the corpus the
        retriever was built from (same ids and texts), else a :class:`~hf_cocodr.errors.ConfigError` names the
        difference."""
        from .index import BM25Index

        folder = Path(path)
        info_file = folder / HYBRID_FILE
        if not info_file.is_file():
            raise ConfigError(f"{folder} is not a saved hybrid retriever ({HYBRID_FILE} not found)")
        info = json.loads(info_file.read_text())
        if info.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"{info_file}: format version {info.get('format_version')!r}, this hf_cocodr reads {FORMAT_VERSION}"
            )
        doc_ids = json.loads((folder / "doc_ids.json").read_text(encoding="utf-8"))
        if corpus is not None:
            ids, texts = _corpus_ids_texts(corpus)
            got = corpus_fingerprint(ids, texts)
            if got != info["corpus_fingerprint"]:
                raise ConfigError(
                    f"the corpus {corpus!s} is not the one {folder} was built from ({len(ids)} documents, fingerprint "
                    f"{got} against {info['num_docs']} documents, {info['corpus_fingerprint']}): build the retriever "
                    "again for this corpus"
                )
        st = (
            model
            if model is not None and not isinstance(model, (str, os.PathLike))
            else load_encoder(str(model if model is not None else info["model"]))
        )
        fp = model_fingerprint(st)["weights_sha256"]
        if fp != info["model_fingerprint"]:
            raise ConfigError(
                f"the model's weights ({fp}) are not those {folder} was built with "
                f"({info['model_fingerprint']}, {info['model']}): its query vectors would not match "
                "the saved document vectors; pass that model or build the retriever again"
            )
        embeddings = np.load(folder / "dense_embeddings.npy")
        bm25 = BM25Index.load(folder / "bm25", info["bm25"])
        meta = {k: v for k, v in info.items() if k not in ("format_version", "fusion", "bm25")}
        return cls(st, doc_ids, embeddings, bm25, FusionConfig(**info["fusion"]), meta)


def _fusion(fusion) -> FusionConfig:
    if fusion is None:
        return FusionConfig()
    if isinstance(fusion, FusionConfig):
        return fusion
    if isinstance(fusion, dict):
        unknown = sorted(set(fusion) - set(FusionConfig.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"unknown fusion option(s) {unknown}; known: {sorted(FusionConfig.__dataclass_fields__)}"
            )
        return FusionConfig(**fusion)
    raise ConfigError(f"fusion must be a FusionConfig or a mapping, got {fusion!r}")


def _model_ref(st) -> str:
    """Where a loaded SentenceTransformer came from (its folder or Hub id), for the saved record."""
    for attr in ("model_name_or_path", "_model_name_or_path"):
        v = getattr(st, attr, None)
        if v:
            return str(v)
    try:
        return str(st[0].auto_model.config._name_or_path)
    except (AttributeError, IndexError, TypeError):
        return "unknown"
