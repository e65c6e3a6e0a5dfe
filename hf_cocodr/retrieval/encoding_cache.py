"""One encoding per model per corpus: a disk cache of corpus encodings, and the record of every encoding a run did.

With a caching :class:`~hf_cocodr.retrieval.session.EncodingSession` (the recipe's run has one),
:func:`~hf_cocodr.retrieval.encoding.build_index` first looks for the corpus's vectors in ``<cache>/encodings``, under a
key made of

* the fingerprint of the model's **document encoder** (:func:`document_encoder_key`): the modules a document goes
  through (the ``document`` route of a :class:`~sentence_transformers.base.modules.Router` model, every module of a
  plain one), their classes, configurations and weights (names, shapes, dtypes, bytes), the document prompt and the
  token limit;
* the **corpus's content** (its ids and ``title + text`` in order, :func:`~hf_cocodr.retrieval.hybrid.corpus_fingerprint`);
* the **token limit** the documents were cut at, the **precision** they were encoded in (fp32, bf16 autocast or
  an int8 copy, whose quantized weights have their own fingerprint), the **batch size** they were encoded in (a
  batch is padded to its longest text: another batch size gives other float roundings) and whether the vectors are
  normalised.

A changed model, corpus, length, precision or batch size is a different key, so it is never served a stale encoding. A hit is
served as the same exact index a fresh encoding builds (the vectors in the corpus's length-sorted order). The vectors
are streamed into a memory-mapped ``.npy`` chunk by chunk as they are encoded, in the encoding's precision (float16
for bf16, :mod:`~hf_cocodr.retrieval.vectors`), and a hit is read back a chunk at a time: neither holds a second
copy of the corpus's vectors in memory. So the
recipe's starting model encodes each target corpus once, for its teacher, its evaluation and its hybrid; a resumed or
repeated run encodes none again; and the document route of a query-side model (its starting encoder) reuses the
starting model's vectors. Each encoding (``"encoded"``) or reuse (``"disk cache"``, ``"memory"``) is recorded in the
session's ``record``, with its seconds (the recipe writes it into ``recipe.json``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..data.beir import corpus_texts
from ..errors import ConfigError
from ..modeling.asymmetric import document_modules, query_modules
from ..storage import cache_dir
from ..utils import atomic_directory, atomic_write_json
from . import fusion_fit
from .session import EncodingSession
from .vectors import VectorWriter, open_vectors, storage_dtype

logger = logging.getLogger(__name__)

__all__ = ["document_encoder_key", "document_route", "fit_fusion_once", "query_encoder_key"]

ENCODINGS_KIND = "encodings"  # the cache sub-folder
ENCODINGS_FILE = "embeddings.npy"  # the vectors in corpus row order (float16 for a bf16 encoding)
META_FILE = "encoding.json"
FORMAT = 2  # 2: the vectors in the precision of the encoding (float16 for bf16), memory-mapped
CACHE_MAX_BYTES = 4 << 30  # larger encodings are not written to the cache (they are recorded all the same)


def document_route(model) -> list:
    """The modules a document goes through (:func:`hf_cocodr.modeling.asymmetric.document_modules`)."""
    return document_modules(model)


def _module_config(module) -> str:
    get = getattr(module, "get_config_dict", None)
    try:
        config = get() if get is not None else {}
    except Exception:  # a third-party module whose config cannot be read: its class and weights still count
        config = {}
    return json.dumps(config, sort_keys=True, default=str)


def document_encoder_key(model) -> str:
    """A fingerprint of what turns a document into a vector: the document route's modules (class, configuration,
    weights: names, shapes, dtypes and bytes), the document prompt and the model's token limit. The same weights in a
    plain model and in a Router model's document route have the same key."""
    return _encoder_key(model, document_route(model), "document")


def query_encoder_key(model) -> str:
    """:func:`document_encoder_key` of the query side: the query route's modules and the query prompt."""
    return _encoder_key(model, query_modules(model), "query")


def _encoder_key(model, modules, task: str) -> str:
    import torch

    h = hashlib.sha256()
    prompts = getattr(model, "prompts", None) or {}
    h.update(json.dumps({"prompt": prompts.get(task), "max_seq_length": model.max_seq_length}).encode())
    with torch.no_grad():
        for i, module in enumerate(modules):
            h.update(f"{i}:{type(module).__module__}.{type(module).__name__}:{_module_config(module)}".encode())
            for name, t in sorted(module.state_dict().items()):
                if not isinstance(t, torch.Tensor):  # (quantized modules keep packing parameters beside tensors)
                    h.update(f"{name}:{t!r}".encode())
                    continue
                t = t.detach().cpu().contiguous()
                if t.is_quantized:
                    t = t.int_repr()
                h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def current_precision(model, session: EncodingSession | None = None) -> str:
    """How the documents are encoded right now: ``bf16`` / ``fp16`` under autocast (the caller's, or the ``session``'s
    precision), ``int8`` for a dynamically quantized copy, the weights' dtype otherwise (``fp32``)."""
    import torch

    device = getattr(model, "device", torch.device("cpu"))
    kind = torch.device(device).type
    if torch.is_autocast_enabled(kind):
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(torch.get_autocast_dtype(kind), "autocast")
    if any("quantized" in type(m).__module__ for m in model.modules()):
        return "int8"
    if session is not None and session.precision == "bf16":  # encode_texts will autocast
        return "bf16"
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    return {torch.float32: "fp32", torch.bfloat16: "bf16-weights", torch.float16: "fp16-weights"}.get(
        dtype, str(dtype)
    )


def texts_digest(texts: list[str]) -> str:
    """A content hash of a list of texts, in order."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8", "surrogatepass") + b"\x1e")
    return h.hexdigest()[:32]


def fit_fusion_once(
    model,
    fusion,
    texts: list[str],
    embeddings,
    encode_queries,
    encode_documents,
    settings: tuple,
    queries=None,
    bm25=None,
    *,
    session: EncodingSession | None = None,
):
    """:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion` of ``model`` over a corpus's ``texts`` (calibrated to the
    unlabelled ``queries`` when given), computed once per caching ``session`` for the same query encoder, document
    encoder, corpus, queries, fusion settings and encoding ``settings`` (precision, token limits); the documents the
    fit encodes are remembered by document encoder, so a model sharing its document route (a query-side model and its
    start) encodes them once. The recipe fits the hybrid's fusion for its final model twice per corpus (its
    evaluation, its saved retriever). ``bm25``: the BM25 index over ``texts`` the caller holds."""
    if session is None or not session.cache or not fusion.needs_fit:
        return fusion_fit.fit_fusion(
            fusion, texts, embeddings, encode_queries, encode_documents, queries=queries, bm25=bm25
        )
    doc_key = document_encoder_key(model)
    corpus = texts_digest(texts)

    def documents(batch: list[str]):
        return session.remembered(
            "fit documents", (doc_key, settings, texts_digest(batch)), lambda: encode_documents(batch)
        )

    asked = texts_digest(list(queries)) if queries else None
    key = (doc_key, query_encoder_key(model), corpus, asked, repr(fusion), settings)
    fitted = session.remembered(
        "fusion fit",
        key,
        lambda: fusion_fit.fit_fusion(
            fusion, texts, embeddings, encode_queries, documents, queries=queries, bm25=bm25
        ),
    )
    return copy.deepcopy(fitted)  # each caller its own (a FusionConfig can be changed in place)


def corpus_fingerprint(doc_ids: list[str], texts: list[str]) -> str:
    """A content hash of a corpus as the hybrid indexes it (its ids and its ``title + text`` in order)."""
    h = hashlib.sha256()
    _fingerprint_update(h, doc_ids, texts)
    return h.hexdigest()[:32]


def _fingerprint_update(h, doc_ids, texts) -> None:
    for doc_id, text in zip(doc_ids, texts):
        h.update(doc_id.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(text.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")


def corpus_key(corpus, session: EncodingSession | None = None) -> str:
    """The content fingerprint of a corpus dataset (ids and ``title + text`` in order), computed once per dataset
    in a caching ``session``."""
    memo_key = (getattr(corpus, "_fingerprint", None), len(corpus))
    memo = session.corpus_keys if session is not None and session.cache else {}
    if memo_key[0] is not None and memo_key in memo:
        return memo[memo_key]
    h = hashlib.sha256()  # (corpus_fingerprint's digest, a batch at a time: the texts are never all in memory)
    for batch_ids, batch_texts in corpus_texts(corpus):
        _fingerprint_update(h, batch_ids, batch_texts)
    fp = h.hexdigest()[:32]
    if memo_key[0] is not None:
        memo[memo_key] = fp
    return fp


def encoding_key(
    model,
    corpus,
    max_length: int | None,
    normalize: bool,
    *,
    batch_size: int,
    session: EncodingSession | None = None,
    corpus_fp: str | None = None,
    num_docs: int = 0,
) -> dict[str, Any]:
    """What the cached vectors of ``corpus`` by ``model`` depend on (see the module docstring), encoded in the
    ``session``'s precision ``batch_size`` documents at a time; ``corpus_fp`` and ``num_docs`` stand in for a corpus
    whose content fingerprint is known (``corpus`` None)."""
    return {
        "format": FORMAT,
        "document_encoder": document_encoder_key(model),
        "corpus": corpus_key(corpus, session) if corpus_fp is None else corpus_fp,
        "num_docs": len(corpus) if corpus_fp is None else int(num_docs),
        "max_length": int(max_length) if max_length else int(model.max_seq_length or 0),
        "precision": current_precision(model, session),
        "batch_size": int(batch_size),
        "normalize": bool(normalize),
    }


def _folder(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir(ENCODINGS_KIND) / digest


def load(key: dict[str, Any]) -> np.ndarray | None:
    """The cached vectors for ``key`` (corpus row order) memory-mapped (:func:`~hf_cocodr.retrieval.vectors.
    open_vectors`: float16 for a bf16 encoding, float32 otherwise), or None (absent, or damaged: then encoded
    again)."""
    folder = _folder(key)
    try:
        meta = json.loads((folder / META_FILE).read_text())
        if meta.get("key") != key:
            return None
        if not (folder / ENCODINGS_FILE).is_file():
            return None
        emb = open_vectors(folder / ENCODINGS_FILE, key["num_docs"], dtype=storage_dtype(key["precision"]))
        for s in range(0, len(emb), 1 << 16):  # every vector finite, read a block at a time
            bad = ~np.isfinite(emb[s : s + (1 << 16)]).all(axis=1)
            if bad.any():
                raise ValueError(f"{int(bad.sum())} of its vectors from row {s} are not finite")
        return emb
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ConfigError) as e:
        logger.warning("the cached corpus encoding in %s cannot be used (%s): encoding again", folder, e)
        return None


def writer(key: dict[str, Any], dim: int) -> VectorWriter | None:
    """A :class:`~hf_cocodr.retrieval.vectors.VectorWriter` the vectors of ``key``'s ``num_docs`` documents (corpus
    row order, in the dtype of its precision) are streamed into while they are encoded, for :func:`commit`; None when
    they would be over :data:`CACHE_MAX_BYTES` or the file cannot be made (logged; the encoding goes on uncached)."""
    dtype = storage_dtype(key["precision"])
    nbytes = int(key["num_docs"]) * int(dim) * dtype.itemsize
    if nbytes > CACHE_MAX_BYTES:
        logger.info("corpus encoding of %d bytes not cached (over %d)", nbytes, CACHE_MAX_BYTES)
        return None
    try:
        return VectorWriter(cache_dir(ENCODINGS_KIND) / f"{_folder(key).name}.npy", key["num_docs"], dim, dtype)
    except OSError as e:
        logger.warning("the corpus encoding could not be cached (%s); going on without", e)
        return None


def commit(key: dict[str, Any], vectors: VectorWriter, seconds: float) -> None:
    """Put the file ``vectors`` holds (every row written) under ``key``, with its record; a failure only costs the
    next run the encoding."""
    try:
        with atomic_directory(_folder(key)) as tmp:
            vectors.commit(tmp / ENCODINGS_FILE)
            atomic_write_json(tmp / META_FILE, {"key": key, "seconds": round(seconds, 2)})
    except OSError as e:
        vectors.discard()
        logger.warning("the corpus encoding could not be cached (%s); going on without", e)


def record(session: EncodingSession, key: dict[str, Any], source: str, seconds: float) -> None:
    """Append one encoding (``source``: ``"encoded"``, ``"disk cache"`` or ``"memory"``) to the ``session``'s record
    (a caching session's)."""
    session.note(
        {
            "document_encoder": key["document_encoder"],
            "corpus": key["corpus"],
            "num_docs": key["num_docs"],
            "max_length": key["max_length"],
            "precision": key["precision"],
            "source": source,
            "seconds": round(seconds, 2),
        }
    )
