"""A hybrid retriever: a dense encoder and BM25 over the same corpus, fused per query.

The lexical channel of a corpus is the largest gain a strong dense model can take without labels: BM25 ranks by the
corpus's own words, which a model trained elsewhere never saw weighted that way. :class:`HybridRetriever` keeps both
indexes and fuses their rankings per query with a label-free rule (:class:`~hf_cocodr.retrieval.fusion.FusionConfig`:
normalised scores in a convex combination, the default, or weighted reciprocal-rank fusion). By default the
normalisation (z-scores, min-max or dbsf) and the dense weight are fitted to the corpus when the retriever is built,
from pseudo-queries drawn from the corpus itself (no labels; :func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`);
what was chosen and how are saved with the retriever (``hybrid.fusion.normalize``, ``hybrid.fusion.dense_weight``,
``hybrid.fusion.fit``). A weight given by hand is used as is (with z-scores unless a normalisation is given too).

Example::

    from hf_cocodr import HybridRetriever

    hybrid = HybridRetriever.build("path/to/model", "data/scifact")   # a BEIR folder, corpus.jsonl or Dataset
    ids, scores = hybrid.search(["aspirin lowers the risk of stroke"], k=10)
    hybrid.save("scifact-hybrid")
    hybrid = HybridRetriever.load("scifact-hybrid")                     # the model it was built with

A saved retriever holds the dense vectors, the bm25s index, the fusion settings, and the fingerprints of the model
(its weights and its document encoder) and the corpus (its ids and texts): loading it with a model that encodes
documents otherwise, or checking it against a corpus that changed, is refused by name; a model sharing its document
encoder (a query-side model and its start) loads it. Its parts are checked against each other (the number of ids,
vectors and documents, a hash of the ids in order, every ``hybrid.json`` field's type, finite vectors) before the
model loads, so a damaged or edited folder is refused naming the file. A model given as a local folder (a Router
model's too) is recorded relative to the retriever's folder, so a copied or moved run still loads.

The vectors are a ``.npy`` file in the precision they were encoded in (float16 for bf16; ``vectors_dtype``), written
a block at a time (:mod:`~hf_cocodr.retrieval.vectors`). A retriever of more than :data:`MAPPED_MIN_DOCS` documents
loads them memory-mapped, in constant time (the file's header and size checked, a truncated file refused naming it),
and searches them in blocks (:class:`~hf_cocodr.retrieval.vectors.MappedIndex`: each block checked finite as it is
read, so a damaged one is refused at its first search, never ranked); a smaller one reads them into memory (checked
finite at load) and searches them with the exact index. Both give the same rankings. The BM25 index loads
memory-mapped (bm25s).

Documents with no text are indexed but never returned (no query can match them); empty or blank queries get no
results, with a warning that counts them.
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

from ..data.beir import _load_jsonl_dataset, corpus_texts, load_corpus
from ..data.sources import data_label, resolve_data
from ..errors import ConfigError
from ..modeling.asymmetric import document_modules, is_asymmetric, query_modules
from ..modeling.loading import load_encoder
from ..rundir.run_record import CORPUS_FILE, jsonl_file, model_fingerprint
from ..storage import carry_over
from ..utils import atomic_directory, atomic_write_text, redact_secrets, refuse_linked_destination, resolved_path
from .ann import APPROXIMATE_KINDS, ApproximateIndex, IndexChoice, build_approximate, index_choice, read_approximate
from .encoding_cache import corpus_fingerprint, current_precision, document_encoder_key, fit_fusion_once
from .fusion import FusionConfig, fuse
from .fusion_fit import log_fit
from .session import EncodingSession
from .vectors import MappedIndex, VectorWriter, as_stored, open_vectors, storage_dtype

logger = logging.getLogger(__name__)

HYBRID_FILE = "hybrid.json"
FORMAT_VERSION = 1
EMBEDDINGS_FILE = "dense_embeddings.npy"
DOC_IDS_FILE = "doc_ids.json"
BM25_FOLDER = "bm25"
ANN_FILE = (
    "dense_index.faiss"  # an approximate dense index (faiss.write_index); an exact one is rebuilt from the vectors
)
# the entries save() writes; anything else in a saved retriever's folder is the user's and is carried over
HYBRID_ENTRIES = (EMBEDDINGS_FILE, DOC_IDS_FILE, BM25_FOLDER, ANN_FILE, HYBRID_FILE)
# a saved retriever of more documents than this is searched where its vectors lie (memory-mapped, in blocks) and
# loads in constant time; a smaller one is read into memory (exact search there is faster; the results are the same)
MAPPED_MIN_DOCS = 100_000
# the fields of hybrid.json that record paths (or a Hub id) as data: written as they are, never redacted (a model
# folder whose name has the shape of a Hub token must still be found), as the document ids are
DATA_FIELDS = ("model", "corpus", "corpus_file")


def doc_ids_digest(doc_ids: list[str]) -> str:
    """A hash of the document ids in order (what ties the saved vectors' rows to their ids)."""
    h = hashlib.sha256()
    for doc_id in doc_ids:
        h.update(doc_id.encode("utf-8", "surrogatepass") + b"\x1e")
    return h.hexdigest()[:32]


def check_k(k) -> int:
    """``k`` as a whole number >= 1 (numpy integers too); anything else is a :class:`ConfigError`."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"search: k must be a whole number >= 1, got {k!r}")
    return int(k)


def _corpus_ids_texts(corpus) -> tuple[list[str], list[str]]:
    """Ids and ``title + text`` of a corpus: a BEIR folder, a ``corpus.jsonl`` file or a dataset with ``_id`` /
    ``text`` (and optionally ``title``) columns; a Hub dataset id or a ``DatasetDict`` is read through its cached
    BEIR folder (:func:`~hf_cocodr.data.sources.resolve_data`)."""
    corpus = resolve_data(corpus, "corpus")
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
        self,
        model,
        doc_ids: list[str],
        embeddings: np.ndarray,
        bm25,
        fusion: FusionConfig,
        meta: dict[str, Any],
        session: EncodingSession | None = None,
        dense_index: ApproximateIndex | MappedIndex | None = None,
    ):
        from .index import DenseIndex

        self.model = model
        self.doc_ids = list(doc_ids)
        self._embeddings = embeddings
        if dense_index is not None:  # an approximate or mapped index over the embeddings (their rows, in order)
            self.dense_index = dense_index
        else:
            self.dense_index = DenseIndex(embeddings.shape[1], capacity=len(embeddings))
            if len(embeddings):
                self.dense_index.add(embeddings)
        self._order: np.ndarray | None = None  # index row -> document row (None: the same)
        self.bm25 = bm25
        self.fusion = fusion
        self.meta = meta
        # rows of documents without text: indexed (the rows stay aligned) but never returned
        self.empty_rows = np.asarray(meta.get("empty_rows") or [], np.int64)
        # the corpus's texts and the encoding batch size, kept by build while the fusion is left to fit
        self._texts: list[str] | None = None
        self._batch_size = 64
        # how its queries (and a fit's texts) are encoded: the run's precision and fits (default: fp32, none kept)
        self.session = session if session is not None else EncodingSession()

    @classmethod
    def from_index(
        cls,
        model,
        doc_ids,
        dense_index,
        order,
        bm25,
        fusion: FusionConfig,
        meta: dict[str, Any] | None = None,
        session: EncodingSession | None = None,
    ) -> HybridRetriever:
        """A retriever over a dense index already built, without a copy of its vectors: index row ``r`` holds the
        document ``doc_ids[order[r]]`` (as :func:`~hf_cocodr.retrieval.encoding.build_index` returns it), ``bm25``
        indexes the documents in ``doc_ids`` order. :func:`~hf_cocodr.evaluation.evaluate_retrieval` ranks its hybrid
        with one."""
        self = cls.__new__(cls)
        self.model, self.doc_ids, self.dense_index, self.bm25 = model, list(doc_ids), dense_index, bm25
        self._embeddings, self._order = None, np.asarray(order, dtype=np.int64)
        self.fusion, self.meta = fusion, dict(meta or {})
        self.empty_rows = np.asarray(self.meta.get("empty_rows") or [], np.int64)
        self._texts, self._batch_size = None, 64
        self.session = session if session is not None else EncodingSession()
        return self

    @property
    def embeddings(self) -> np.ndarray:
        """The documents' dense vectors, in :attr:`doc_ids` order."""
        if self._embeddings is None:  # a retriever over a built index: its vectors, back to the documents' order
            in_index_order = self.dense_index.reconstruct_all()
            self._embeddings = np.empty_like(in_index_order)
            self._embeddings[self._order] = in_index_order
        return self._embeddings

    # ------------------------------------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        model,
        corpus,
        *,
        fusion: FusionConfig | dict | None = None,
        queries: list[str] | None = None,
        fit: bool = True,
        batch_size: int = 64,
        doc_max_length: int | None = None,
        show_progress_bar: bool = False,
        session: EncodingSession | None = None,
        index: IndexChoice | str = "auto",
    ) -> HybridRetriever:
        """Encode ``corpus`` with ``model`` (a ``SentenceTransformer`` or a path / Hub id) and index it for BM25.

        ``corpus``: also a Hub dataset id or a ``DatasetDict`` (:func:`~hf_cocodr.data.sources.resolve_data`).

        ``doc_max_length``: the document token limit (default: the model's own). The model's similarity is honoured
        (a cosine model's vectors are normalised). ``fusion``: default :class:`~hf_cocodr.retrieval.fusion.
        FusionConfig` with its normalisation and dense weight fitted here to the corpus without labels
        (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`; the build log and ``hybrid.fusion.fit`` say how); a number
        as ``dense_weight`` is used as is. ``queries``: the queries it will rank, if known (their text only; no
        judgments): the fit makes its pseudo-queries as easy for BM25 as they are. ``fit=False`` leaves a fusion
        still to fit unfitted, for :meth:`fit_fusion` to fit once the queries are known (search refuses until then).
        ``session``: the run's :class:`~hf_cocodr.retrieval.session.EncodingSession` (its precision, cache and fits).
        ``index``: the dense index (:mod:`~hf_cocodr.retrieval.ann`): ``auto`` (exact up to 1,000,000 documents, HNSW
        beyond), ``exact``, ``hnsw``, ``ivf`` or an :class:`~hf_cocodr.retrieval.ann.IndexChoice`; an approximate
        one's kind, parameters and measured recall@100 are ``meta["index"]``, saved and loaded with it."""
        from .encoding import model_similarity
        from .index import BM25Index

        choice = index_choice(index)  # a bad choice is refused before any work
        fusion = _fusion(fusion)
        corpus = resolve_data(corpus, "corpus")  # (a Hub dataset or a DatasetDict: before the model loads)
        # a model held in memory only (an unsaved Router model) has no reference: None, and load asks for model=
        model_ref = str(model) if isinstance(model, (str, os.PathLike)) else _model_ref(model)
        if model_ref is not None and Path(model_ref).expanduser().exists():  # a local folder: where it is
            model_ref = str(resolved_path(model_ref))
        st = load_encoder(str(model)) if isinstance(model, (str, os.PathLike)) else model
        source = corpus_file_record(corpus)  # (before it is read: a change while it is read is seen at load)
        dataset = _read_corpus(corpus)
        ids, texts = _corpus_ids_texts(dataset)
        if not ids:
            raise ConfigError(f"the corpus {corpus!r} has no documents")
        # BM25 first: a corpus with no word to index is refused before a document is encoded
        t1 = time.perf_counter()
        bm25 = BM25Index(texts, name=str(corpus) if isinstance(corpus, (str, os.PathLike)) else None)
        bm25_s = time.perf_counter() - t1
        t0 = time.perf_counter()
        embeddings, dense_index = _dense_part(
            st, dataset, batch_size, doc_max_length, show_progress_bar, session, choice
        )
        dense_s = time.perf_counter() - t0
        empty_rows = _empty_rows(texts, corpus)
        meta = {
            "model": model_ref,
            "model_fingerprint": model_fingerprint(st)["weights_sha256"],
            # what the saved vectors depend on: a query-side model shares it with its start (load accepts either)
            "document_encoder": document_encoder_key(st),
            "similarity": model_similarity(st),
            "doc_max_length": doc_max_length,
            "encode_precision": current_precision(st, session),  # of the document vectors (the session's precision)
            "corpus": data_label(corpus) if isinstance(corpus, (str, os.PathLike)) else "dataset",
            "corpus_fingerprint": corpus_fingerprint(ids, texts),
            **({"corpus_file": source} if source is not None else {}),
            "num_docs": len(ids),
            "doc_ids_sha256": doc_ids_digest(ids),
            "empty_rows": empty_rows,
            "build_seconds": {"dense": round(dense_s, 2), "bm25": round(bm25_s, 2)},
        }
        if dense_index is not None:
            meta["index"] = dense_index.record
        logger.info("hybrid retriever over %d documents: dense %.1f s, BM25 %.1f s", len(ids), dense_s, bm25_s)
        built = cls(st, ids, embeddings, bm25, fusion, meta, session, dense_index=dense_index)
        built._texts, built._batch_size = texts, batch_size
        if fit:
            built.fit_fusion(queries)
        return built

    def fit_fusion(self, queries: list[str] | None = None) -> FusionConfig:
        """Fit what the fusion leaves to ``"fit"`` to the corpus without labels, calibrated to ``queries`` (their
        text only) when given (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`); a fusion already fitted, or given
        by hand, stays as it is. Only a retriever built here (:meth:`build`) holds the corpus's texts this needs."""
        if not self.fusion.needs_fit:
            self._texts = None  # nothing left to fit: the corpus's texts are not kept
            return self.fusion
        texts = self._texts
        if texts is None:
            raise ConfigError("fit_fusion needs the corpus's texts, which only a retriever made by build holds")
        from .encoding import encode_documents, encode_texts

        st, batch_size, doc_max_length = self.model, self._batch_size, self.meta.get("doc_max_length")
        session = self.session
        t0 = time.perf_counter()
        self.fusion = fit_fusion_once(
            st,
            self.fusion,
            texts,
            self.embeddings,
            lambda q: encode_texts(st, q, kind="query", batch_size=batch_size, session=session),
            lambda d: encode_documents(st, d, batch_size=batch_size, max_length=doc_max_length, session=session),
            # (precision, query and document token limits, batch size)
            settings=(session.precision, None, doc_max_length, batch_size),
            queries=queries,
            bm25=self.bm25,
            session=session,
        )
        self._texts = None  # a fitted fusion is not fitted again
        seconds = time.perf_counter() - t0
        self.meta.setdefault("build_seconds", {})["fusion_fit"] = round(seconds, 2)
        log_fit(self.fusion, f"hybrid retriever over {self.meta.get('corpus', 'the corpus')}", seconds)
        return self.fusion

    # ------------------------------------------------------------------------------------------------ search
    def encode_queries(self, queries: list[str], batch_size: int = 64) -> np.ndarray:
        from .encoding import encode_texts

        return encode_texts(self.model, list(queries), kind="query", batch_size=batch_size, session=self.session)

    def search_dense(
        self, queries: list[str], k: int, *, query_embeddings: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dense top-``k``: ``(scores, rows)`` arrays of shape ``(n_queries, k)`` (rows index :attr:`doc_ids`)."""
        from .index import check_finite

        if query_embeddings is None:
            q = self.encode_queries(queries)
        else:  # given: NaN or inf would rank nonsense
            q = check_finite(query_embeddings, "search: the query_embeddings given")
        scores, rows = self.dense_index.search(q, k)
        if self._order is not None:
            rows = np.where(rows >= 0, self._order[np.maximum(rows, 0)], -1)
        return scores, rows

    def search_bm25(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-``k``: ``(scores, rows)``."""
        return self.bm25.search(list(queries), k)

    def search(
        self,
        queries: list[str],
        k: int = 10,
        *,
        query_embeddings: np.ndarray | None = None,
        depth: int | None = None,
    ) -> tuple[list[list[str]], list[list[float]]]:
        """The fused top-``k`` of each query: ``(ids, scores)``, one list per query, best first.

        ``query_embeddings``: the queries' vectors if already encoded. ``depth``: the candidates taken from each
        system (default: the fusion's ``depth``, at least ``k``); a ``k`` of ``2 * depth`` returns every candidate.
        ``k``: a whole number >= 1 (anything else is a :class:`~hf_cocodr.errors.ConfigError`). An empty or blank
        query gets an empty list (a warning counts them); documents without text are never returned."""
        if isinstance(queries, str):
            raise ConfigError("search takes a list of queries, got one string; wrap it in a list")
        k = check_k(k)
        queries = list(queries)
        bad = [i for i, q in enumerate(queries) if not isinstance(q, str)]
        if bad:
            raise ConfigError(
                f"search: query {bad[0]} is a {type(queries[bad[0]]).__name__}, not a string "
                f"({len(bad)} of {len(queries)} queries are not strings)"
            )
        live = [i for i, q in enumerate(queries) if q.strip()]
        if len(live) < len(queries):
            logger.warning(
                "search: %d of %d queries are empty or blank: no results for them",
                len(queries) - len(live),
                len(queries),
            )
        ids: list[list[str]] = [[] for _ in queries]
        scores: list[list[float]] = [[] for _ in queries]
        if not live:
            return ids, scores
        asked = [queries[i] for i in live]
        q_emb = None if query_embeddings is None else np.asarray(query_embeddings)[live]
        depth = max(self.fusion.depth, k) if depth is None else depth
        depth += len(self.empty_rows)  # room for the empty documents dropped below
        ds, di = self.search_dense(asked, depth, query_embeddings=q_emb)
        bs, bi = self.search_bm25(asked, depth)
        for j, i in enumerate(live):
            dense_keep = (di[j] >= 0) & ~np.isin(di[j], self.empty_rows)  # (a missing dense row is -1)
            # BM25's list as the index returns it (fuse keeps its zero-score entries out of the candidates)
            keep = ~np.isin(bi[j], self.empty_rows)
            rows, fused = fuse(di[j][dense_keep], ds[j][dense_keep], bi[j][keep], bs[j][keep], self.fusion, k)
            ids[i] = [self.doc_ids[r] for r in rows]
            scores[i] = fused.astype(float).tolist()
        return ids, scores

    # ------------------------------------------------------------------------------------------------ saving
    def save(self, path: str | os.PathLike) -> None:
        """Write the retriever into the folder ``path`` atomically (a reader sees the old or the new one, never a
        half-written one). The path is resolved first (``X/new/..`` is ``X``); one that is itself a symbolic link is
        refused (the folder is replaced as a whole, never one a link points to). A folder that exists and is not a saved
        hybrid retriever is refused; saving over a saved retriever replaces only its own entries
        (:data:`HYBRID_ENTRIES`): anything else in the folder is carried over. A model that is a local folder is
        recorded relative to ``path``."""

        if self.fusion.needs_fit:
            raise ConfigError(
                f"save {path}: the fusion is not fitted yet (built with fit=False): call fit_fusion first"
            )
        out = refuse_linked_destination(path)  # (the folders above resolved; a link itself is refused)
        if out.exists() and not (out / HYBRID_FILE).is_file():
            where = "" if str(out) == str(path) else f" ({path} resolves to it)"
            raise FileExistsError(
                f"{out}{where} exists and is not a saved hybrid retriever ({HYBRID_FILE} missing); "
                "give a new folder (hf_cocodr never replaces files it did not write)"
            )
        record = {
            "format_version": FORMAT_VERSION,
            "fusion": asdict(self.fusion),
            **self.meta,
            "bm25": self.bm25.config(),
        }
        approximate = isinstance(self.dense_index, ApproximateIndex)
        record.pop("index", None)
        if approximate:  # what the saved faiss index is, and its measured recall
            record["index"] = self.dense_index.record
        record["doc_ids_sha256"] = doc_ids_digest(self.doc_ids)
        vectors_dtype = storage_dtype(str(self.meta.get("encode_precision") or "fp32"))
        record["vectors_dtype"] = vectors_dtype.name
        record["empty_rows"] = [int(r) for r in self.empty_rows]
        record.pop("model_relative_to_folder", None)
        model = Path(str(self.meta.get("model") or ""))
        if model.is_absolute() and model.exists():
            record["model"] = os.path.relpath(model, out)
            record["model_relative_to_folder"] = True
        # secrets redacted, but not the paths recorded as data (DATA_FIELDS): a retriever must find its model
        redacted = redact_secrets({k: v for k, v in record.items() if k not in DATA_FIELDS})
        record = {k: record[k] if k in DATA_FIELDS else redacted[k] for k in record}
        with atomic_directory(out) as tmp:
            _write_vectors(tmp / EMBEDDINGS_FILE, self.embeddings, vectors_dtype)
            # written as is (not through atomic_write_json's secret redaction: an id is data, whatever its shape);
            # the folder as a whole is atomic
            (tmp / DOC_IDS_FILE).write_text(json.dumps(self.doc_ids, ensure_ascii=False), encoding="utf-8")
            self.bm25.save(tmp / BM25_FOLDER)
            if approximate:
                self.dense_index.write(tmp / ANN_FILE)
            atomic_write_text(tmp / HYBRID_FILE, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
            if out.is_dir():  # the user's entries beside a saved retriever stay
                for entry in out.iterdir():
                    if entry.name not in HYBRID_ENTRIES:
                        carry_over(entry, tmp / entry.name)

    @staticmethod
    def _read_parts(folder: Path) -> tuple[dict[str, Any], list[str], np.ndarray]:
        """``(hybrid.json, doc ids, vectors)`` of a saved retriever, checked against each other (counts, the ids'
        hash, the vectors' shape); any damaged part is a :class:`ConfigError` naming its file."""
        info_file = folder / HYBRID_FILE
        if not info_file.is_file():
            raise ConfigError(f"{folder} is not a saved hybrid retriever ({HYBRID_FILE} not found)")

        def damaged(file: Path, why: str) -> ConfigError:
            return ConfigError(f"{file}: {why}; this saved hybrid retriever is damaged: build it again")

        try:
            info = json.loads(info_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise damaged(info_file, f"not readable JSON ({e})") from None
        if not isinstance(info, dict):
            raise damaged(info_file, "not a JSON object")
        if "format_version" in info and not _whole(info["format_version"]):
            raise _wrong_type(info_file, "format_version", info["format_version"], "a whole number")
        if info.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"{info_file}: format version {info.get('format_version')!r}, this hf_cocodr reads {FORMAT_VERSION}"
            )
        missing = [k for k in ("model", "model_fingerprint", "num_docs", "bm25", "fusion") if k not in info]
        if missing:
            raise damaged(info_file, f"missing {', '.join(missing)}")
        _check_record(info_file, info)  # every field of the type it must have, before anything reads one
        ids_file = folder / DOC_IDS_FILE
        try:
            doc_ids = json.loads(ids_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise damaged(ids_file, "missing") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise damaged(ids_file, f"not readable JSON ({e})") from None
        if not isinstance(doc_ids, list) or not all(isinstance(i, str) for i in doc_ids):
            raise damaged(ids_file, "not a list of document ids")
        if len(doc_ids) != info["num_docs"]:
            raise damaged(ids_file, f"{len(doc_ids)} ids, {HYBRID_FILE} records {info['num_docs']} documents")
        if "doc_ids_sha256" in info and doc_ids_digest(doc_ids) != info["doc_ids_sha256"]:
            raise damaged(ids_file, f"the ids (or their order) are not those {HYBRID_FILE} records")
        emb_file = folder / EMBEDDINGS_FILE
        try:  # memory-mapped: its header, its size and its rows checked, nothing read yet
            embeddings = open_vectors(emb_file, len(doc_ids), dtype=info.get("vectors_dtype"))
        except ConfigError as e:
            raise damaged(emb_file, str(e).removeprefix(f"{emb_file}: ")) from None
        bm25_num = info["bm25"]["num_docs"]
        if bm25_num != len(doc_ids):
            raise damaged(info_file, f"the BM25 index records {bm25_num} documents, not {len(doc_ids)}")
        if len(doc_ids) > MAPPED_MIN_DOCS:  # searched on disk in blocks, each checked finite when it is read
            return info, doc_ids, embeddings
        embeddings = np.array(embeddings, dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(embeddings).all(axis=1))
        if bad.size:  # NaN or inf: no ranking may come from them
            raise damaged(
                emb_file,
                f"{bad.size} of {len(doc_ids)} vectors are not finite (NaN or inf; first: row {int(bad[0])}, "
                f"document {doc_ids[int(bad[0])]!r})",
            )
        return info, doc_ids, embeddings

    @classmethod
    def load(
        cls, path: str | os.PathLike, model=None, *, corpus=None, session: EncodingSession | None = None
    ) -> HybridRetriever:
        """Load a saved retriever. ``model``: the encoder for the queries (default: the one it was built with); its
        document encoder must be the one the documents were encoded with: the model it was built with, or one that
        shares its document encoder (a query-side model and its start, either way round;
        :func:`~hf_cocodr.retrieval.encoding_cache.document_encoder_key`). ``corpus``: if given, it must be the corpus
        the retriever was built from (same ids and texts), else a :class:`~hf_cocodr.errors.ConfigError` names the
        difference. The saved parts are checked against each other before the model loads (a damaged one is a
        ``ConfigError`` naming its file). ``session``: how its queries are encoded (default: fp32)."""
        from .index import BM25Index

        folder = resolved_path(path)
        info, doc_ids, embeddings = cls._read_parts(folder)
        try:  # a part of the saved retriever: read (and so checked) before the model loads; memory-mapped
            bm25 = BM25Index.load(folder / BM25_FOLDER, info["bm25"], mmap=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{folder / BM25_FOLDER}: the BM25 index cannot be read ({' '.join(str(e).split())[:200]}); this "
                "saved hybrid retriever is damaged: build it again"
            ) from None
        if "index" in info:
            dense_index = _read_dense_index(folder, info, embeddings.shape[1])
        elif isinstance(embeddings, np.memmap):  # a large one: searched where it lies (MAPPED_MIN_DOCS)
            dense_index = MappedIndex(embeddings, name=str(folder / EMBEDDINGS_FILE))
        else:
            dense_index = None
        if corpus is not None:
            _check_saved_corpus(folder, info, corpus)
        else:
            _check_recorded_corpus(folder, info)
        st = _saved_query_model(folder, info, model)
        meta = {
            k: v
            for k, v in info.items()
            if k not in ("format_version", "fusion", "bm25", "model_relative_to_folder", "vectors_dtype")
        }
        if info.get("model_relative_to_folder"):
            meta["model"] = str(resolved_path(folder / info["model"]))
        fp = model_fingerprint(st)["weights_sha256"]
        if fp != info["model_fingerprint"]:
            if not _shares_document_encoder(st, info):
                raise ConfigError(
                    f"the model's weights ({fp}) are not those {folder} was built with "
                    f"({info['model_fingerprint']}, {info['model']}), nor is its document encoder: its query vectors "
                    "would not match the saved document vectors; pass that model (or a query-side model of it) or "
                    "build the retriever again"
                )
            # another model with the documents' encoder (a query-side model, its start): recorded as the model now,
            # so a save of this retriever names the model that encodes its queries
            if model is None:
                ref = meta["model"]  # the recorded folder, which holds this model now
            elif isinstance(model, (str, os.PathLike)):
                ref = str(resolved_path(model)) if Path(model).expanduser().exists() else str(model)
            else:
                ref = _model_ref(st)
            meta.update(
                model=ref,
                model_fingerprint=fp,
                document_encoder=document_encoder_key(st),
            )
        return cls(st, doc_ids, embeddings, bm25, _saved_fusion(info), meta, session, dense_index=dense_index)


def _check_saved_corpus(folder: Path, info: dict[str, Any], corpus) -> None:
    """Refuse a ``corpus`` that is not the one the saved retriever in ``folder`` was built from."""
    ids, texts = _corpus_ids_texts(corpus)
    got = corpus_fingerprint(ids, texts)
    if "corpus_fingerprint" not in info:
        raise ConfigError(f"{folder / HYBRID_FILE} records no corpus fingerprint to check {corpus!s} against")
    if got != info["corpus_fingerprint"]:
        raise ConfigError(
            f"the corpus {corpus!s} is not the one {folder} was built from ({len(ids)} documents, fingerprint "
            f"{got} against {info['num_docs']} documents, {info['corpus_fingerprint']}): build the retriever "
            "again for this corpus"
        )


def corpus_file_record(corpus) -> dict[str, Any] | None:
    """Where a corpus given as a path lies and how its file looked (``{"path", "size", "mtime_ns"}``: the corpus file
    the loader reads, resolved), for a saved retriever to tell at load, in the time of a ``stat``, whether it may have
    changed since; None for a dataset or a path that is not there."""
    if not isinstance(corpus, (str, os.PathLike)):
        return None
    path = resolved_path(corpus)
    file = path if path.is_file() else jsonl_file(path, CORPUS_FILE)
    try:
        st = file.stat()
    except OSError:
        return None
    return {"path": str(file), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _check_recorded_corpus(folder: Path, info: dict[str, Any]) -> None:
    """Refuse a saved retriever whose corpus file, where it was read from and still lies, has changed since
    (``corpus_file`` in ``hybrid.json``): its size and modification time as recorded mean unchanged (a ``stat``);
    otherwise its ids and texts are read and their fingerprint must be the recorded one. A corpus that is no longer
    there, one given as a dataset, and a retriever saved before this was recorded are not checked (pass
    ``corpus=``)."""
    recorded = info.get("corpus_file")
    if recorded is None:
        return
    file = Path(recorded["path"])
    try:
        st = file.stat()
    except OSError:
        return  # moved or deleted since: nothing to compare with
    if (st.st_size, st.st_mtime_ns) == (recorded["size"], recorded["mtime_ns"]):
        return
    ids, texts = _corpus_ids_texts(file)
    got = corpus_fingerprint(ids, texts)
    if got != info.get("corpus_fingerprint"):
        raise ConfigError(
            f"{folder} indexes {file} as it was when it was built ({info['num_docs']} documents, fingerprint "
            f"{info.get('corpus_fingerprint')}); the file has changed since ({len(ids)} documents, fingerprint {got}): "
            "build the retriever again for this corpus"
        )


def _saved_query_model(folder: Path, info: dict[str, Any], model):
    """The encoder a loaded retriever encodes its queries with: ``model`` (an object, a folder or a Hub id), or the
    model it was saved with; a model that cannot be loaded is a :class:`~hf_cocodr.errors.ConfigError` naming it."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        return model
    if model is None and info["model"] is None:
        raise ConfigError(
            f"{folder} was built with a model held in memory only (never saved to a folder or the Hub): pass "
            "HybridRetriever.load(..., model=<that model, or one sharing its document encoder>)"
        )
    ref = str(model) if model is not None else _saved_model_ref(folder, info)
    try:
        return load_encoder(ref)
    except (OSError, ValueError) as e:
        given = "the model= you passed" if model is not None else f"the model {folder} was built with"
        raise ConfigError(
            f"{folder}: cannot load {given} ({ref}): {' '.join(str(e).split())[:200]}; pass "
            "HybridRetriever.load(..., model=<that model's folder or Hub id>)"
        ) from None


def _whole(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def _wrong_type(info_file: Path, field: str, value, expected: str) -> ConfigError:
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return ConfigError(
        f"{info_file}: {field} is {shown}, expected {expected}; this saved hybrid retriever is damaged or was edited: "
        "build it again"
    )


def _check_record(info_file: Path, info: dict[str, Any]) -> None:
    """Refuse, naming ``hybrid.json`` and the field, a field of the wrong type or out of range (a hand-edited or
    damaged record), before any model loads; the fields a version did not write may be absent."""
    from .encoding import SUPPORTED_SIMILARITIES

    num_docs = info["num_docs"]
    string = (lambda v: isinstance(v, str) and bool(v), "a string")
    checks: dict[str, tuple] = {
        "model": (
            lambda v: v is None or (isinstance(v, str) and bool(v)),
            "a string (a model folder or Hub id) or null",
        ),
        "model_fingerprint": string,
        "document_encoder": string,
        "num_docs": (_whole, "a whole number >= 0"),
        "doc_ids_sha256": string,
        "corpus_fingerprint": string,
        "corpus": string,
        "corpus_file": (
            lambda v: (
                isinstance(v, dict)
                and isinstance(v.get("path"), str)
                and bool(v["path"])
                and _whole(v.get("size"))
                and _whole(v.get("mtime_ns"))
            ),
            "a mapping of path (a string), size and mtime_ns (whole numbers)",
        ),
        "encode_precision": string,
        "similarity": (lambda v: v in SUPPORTED_SIMILARITIES, f"one of {SUPPORTED_SIMILARITIES}"),
        "doc_max_length": (lambda v: v is None or _whole(v, 1), "a whole number >= 1 or null"),
        "model_relative_to_folder": (lambda v: isinstance(v, bool), "true or false"),
        "build_seconds": (lambda v: isinstance(v, dict), "a mapping"),
        "vectors_dtype": (lambda v: v in ("float32", "float16"), "float32 or float16"),
        "bm25": (lambda v: isinstance(v, dict), "a mapping"),
        "fusion": (lambda v: isinstance(v, dict), "a mapping"),
    }
    for field, (ok, expected) in checks.items():
        if field in info and not ok(info[field]):
            raise _wrong_type(info_file, field, info[field], expected)
    if info.get("model_relative_to_folder") and info["model"] is None:
        raise _wrong_type(info_file, "model", None, "a folder (model_relative_to_folder is true)")
    rows = info.get("empty_rows", [])
    if not isinstance(rows, list) or not all(_whole(r) and r < num_docs for r in rows):
        raise _wrong_type(info_file, "empty_rows", rows, f"a list of row numbers below num_docs ({num_docs})")
    bm25 = info["bm25"]
    for field, ok, expected in (
        ("k1", lambda v: _number(v, 0.0, float("inf")), "a number >= 0"),
        ("b", lambda v: _number(v, 0.0, 1.0), "a number in [0, 1]"),
        ("language", lambda v: isinstance(v, str) and bool(v), "a string"),
        ("num_docs", _whole, "a whole number >= 0"),
    ):
        if field not in bm25:
            raise ConfigError(f"{info_file}: bm25.{field} is missing; this saved hybrid retriever is damaged")
        if not ok(bm25[field]):
            raise _wrong_type(info_file, f"bm25.{field}", bm25[field], expected)
    if "index" in info:
        _check_index_record(info_file, info["index"])
    unknown = sorted(set(info["fusion"]) - set(FusionConfig.__dataclass_fields__))
    if unknown:
        raise _wrong_type(
            info_file,
            "fusion",
            info["fusion"],
            f"only the fields {sorted(FusionConfig.__dataclass_fields__)} (unknown: {unknown})",
        )
    try:
        _saved_fusion(info)
    except ConfigError as e:
        raise ConfigError(
            f"{info_file}: {e}; this saved hybrid retriever is damaged or was edited: build it again"
        ) from None


def _check_index_record(info_file: Path, record) -> None:
    """Refuse, naming the field, an approximate index's record that is not ``{kind, params, recall@100, sample}``."""
    if not isinstance(record, dict):
        raise _wrong_type(info_file, "index", record, "a mapping")
    if record.get("kind") not in APPROXIMATE_KINDS:
        raise _wrong_type(info_file, "index.kind", record.get("kind"), f"one of {APPROXIMATE_KINDS}")
    params = record.get("params")
    needed = {"hnsw": ("ef_search",), "ivf": ("nprobe",)}[record["kind"]]
    if not isinstance(params, dict) or not all(_whole(params.get(p), 1) for p in needed):
        raise _wrong_type(
            info_file, "index.params", params, f"a mapping with {', '.join(needed)} (whole numbers >= 1)"
        )


def _read_dense_index(folder: Path, info: dict[str, Any], dim: int) -> ApproximateIndex:
    """The approximate index a retriever was saved with, checked against its vectors (count, dimension)."""
    file = folder / ANN_FILE
    kind = info["index"]["kind"]
    index_choice(kind)  # faiss installed, or one line naming the extra
    if not file.is_file():
        raise ConfigError(f"{file}: missing ({HYBRID_FILE} records a {kind} index); this saved hybrid is damaged")
    try:
        index = read_approximate(file, info["index"])
    except (RuntimeError, OSError, AttributeError) as e:
        raise ConfigError(f"{file}: not a readable {kind} faiss index ({' '.join(str(e).split())[:200]})") from None
    if index.ntotal != info["num_docs"] or index.dim != dim:
        raise ConfigError(
            f"{file}: {index.ntotal} vectors of dimension {index.dim}, expected {info['num_docs']} of dimension {dim}; "
            "this saved hybrid retriever is damaged: build it again"
        )
    return index


def _saved_fusion(info: dict[str, Any]) -> FusionConfig:
    # a fusion saved before BM25's zeros were normalised with its hits fuses as it did then
    return FusionConfig(**{"bm25_zeros": False, **info["fusion"]})


def _shares_document_encoder(st, info: dict[str, Any]) -> bool:
    """Whether ``st`` encodes documents as the model a saved retriever was built with: the same document encoder
    key, or (a retriever saved before the key was recorded) a document route whose weights are that model's."""
    if "document_encoder" in info:
        return document_encoder_key(st) == info["document_encoder"]
    from torch import nn

    # the modules of a plain model are named 0, 1, ... as in a Sequential of the document route's
    return is_asymmetric(st) and (
        model_fingerprint(nn.Sequential(*document_modules(st)))["weights_sha256"] == info["model_fingerprint"]
    )


def _saved_model_ref(folder: Path, info: dict[str, Any]) -> str:
    """The model a saved retriever records: relative to its folder (this version), else as recorded (a Hub id, an
    absolute path, or a path relative to where an earlier version ran, tried from here and from the folder)."""
    ref = str(info["model"])
    if info.get("model_relative_to_folder"):
        return str(resolved_path(folder / ref))
    if not Path(ref).is_absolute() and not Path(ref).exists() and (folder / ref).exists():
        return str(resolved_path(folder / ref))
    return ref


def _dense_part(st, dataset, batch_size, doc_max_length, show_progress_bar, session, choice: IndexChoice):
    """The documents' vectors in corpus order, and the approximate index over them that ``choice`` makes (None: exact
    search, which the retriever builds from the vectors), its recall measured against the exact index built here."""
    from .encoding import build_index

    exact, order = build_index(
        st,
        dataset,
        batch_size=batch_size,
        max_length=doc_max_length,
        show_progress_bar=show_progress_bar,
        session=session,
    )
    in_index_order = exact.reconstruct_all()
    embeddings = np.empty_like(in_index_order)
    embeddings[order] = in_index_order  # back to corpus order
    del in_index_order
    kind = choice.resolve(len(embeddings))
    if kind == "exact":
        return embeddings, None
    return embeddings, build_approximate(embeddings, kind, choice, exact=exact, exact_order=order)


def _write_vectors(path: Path, embeddings, dtype: np.dtype, block: int = 1 << 16) -> None:
    """Write ``embeddings`` to the ``.npy`` file ``path`` as ``dtype`` a block at a time (never a second copy)."""
    out = VectorWriter(path, len(embeddings), embeddings.shape[1], dtype)
    try:
        for s in range(0, len(embeddings), block):
            out.write(slice(s, s + block), as_stored(np.asarray(embeddings[s : s + block], np.float32), dtype))
    except BaseException:
        out.discard()
        raise
    out.commit()


def _empty_rows(texts: list[str], corpus) -> list[int]:
    """The rows of the documents without text (indexed, so the rows stay aligned, but never returned), with a
    warning that counts them."""
    rows = [i for i, text in enumerate(texts) if not text.strip()]
    if rows:
        logger.warning(
            "%d of %d documents of %s have no text: indexed, but never returned by a search",
            len(rows),
            len(texts),
            corpus,
        )
    return rows


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


def _model_ref(st) -> str | None:
    """Where a loaded SentenceTransformer came from (its folder or Hub id), for the saved record; None for a model
    with no folder of its own (built in memory and never saved), which :meth:`HybridRetriever.load` then asks for.

    A Router model (a query-side model) is found through its query route's first module, which names the folder the
    model was loaded from; a route copied in memory from a plain model names that model's folder instead, which is
    not this model's (its query encoder differs): a local folder counts only when it holds a Router model."""
    for attr in ("model_name_or_path", "_model_name_or_path"):
        v = getattr(st, attr, None)
        if v:
            return str(v)
    asymmetric = is_asymmetric(st)
    try:
        ref = str((query_modules(st) if asymmetric else list(st))[0].auto_model.config._name_or_path)
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    if not ref:
        return None
    if asymmetric and Path(ref).expanduser().exists() and not _holds_router_model(Path(ref).expanduser()):
        return None
    return ref


def _holds_router_model(folder: Path) -> bool:
    """Whether ``folder`` holds a sentence-transformers model whose first module is a Router."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        return str(modules[0]["type"]).rsplit(".", 1)[-1] == "Router"
    except (OSError, ValueError, LookupError, TypeError):
        return False


def _read_corpus(corpus):
    """``corpus`` as a dataset: a BEIR folder's or a JSONL file's documents read, a dataset as it is."""
    if not isinstance(corpus, (str, os.PathLike)):
        return corpus
    path = Path(corpus)
    return _load_jsonl_dataset(path, "corpus") if path.is_file() else load_corpus(path)
