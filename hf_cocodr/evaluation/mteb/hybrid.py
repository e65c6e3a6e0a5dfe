"""The package's hybrid retriever (a dense model + bm25s, fused per query) as an MTEB search model.

:class:`HybridSearchModel` follows mteb 2's search protocol (``index(corpus, ...)`` then ``search(queries, ...)``):
``index`` builds a :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever` over the task's corpus; ``search`` fits the
normalisation and the dense weight to that corpus without labels, calibrated to the task's queries (their text only;
the default, :func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`), or uses the weight given, and fuses each system's top
``fusion.depth`` per query exactly as ``hf-cocodr evaluate --hybrid`` does, so the task's scores equal the evaluation's
on the same data. :func:`hybrid_model_meta` turns the dense model's ``ModelMeta`` into the
hybrid's: ``model_type=["hybrid"]``, the two parts, the fusion and how it is fitted in ``loader_kwargs``, the dense
model as ``adapted_from`` (by name, never by local path), its training data unchanged (the hybrid trains on nothing).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np

from ...retrieval.fusion import FIT, FusionConfig, fuse, rule_settings
from ...retrieval.fusion_fit import FIT_METHOD, FIT_NORMALIZATIONS
from ...retrieval.hybrid import HybridRetriever
from ...utils import import_mteb, public_label

logger = logging.getLogger(__name__)

LEXICAL_PART = "bm25s (lucene BM25, k1 1.5, b 0.75, English stop words and Snowball stemmer)"


def _fusion_config(fusion) -> FusionConfig:
    if fusion is None:
        return FusionConfig()
    return fusion if isinstance(fusion, FusionConfig) else FusionConfig(**fusion)


def describe_fusion(fusion: FusionConfig) -> dict[str, Any]:
    """The fusion as the hybrid's ``ModelMeta`` states it: the rule, the settings it reads (the normalisation, or
    how it is fitted), the weight (or how it is fitted), the depth."""
    out: dict[str, Any] = {"rule": fusion.rule, "depth": fusion.depth}
    for name in rule_settings(fusion.rule):  # the settings the rule reads ("convex": normalize, bm25_zeros)
        if name == "normalize" and fusion.normalize == FIT:
            out[name] = f"fitted per task corpus, one of {', '.join(FIT_NORMALIZATIONS)}"
        else:
            out[name] = getattr(fusion, name)
    if fusion.needs_fit:
        out["dense_weight"] = "fitted per task corpus"
        out["fit"] = FIT_METHOD
    else:
        out["dense_weight"] = float(fusion.dense_weight)
    return out


class HybridSearchModel:
    """mteb's search protocol over :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever` (see the module docstring).

    Args:
        model: a loaded SentenceTransformer (the dense part).
        meta: the hybrid's ``ModelMeta`` (:func:`hybrid_model_meta`), used by mteb for the results path.
        fusion: a :class:`~hf_cocodr.retrieval.fusion.FusionConfig` or its fields; default: the package's (normalisation and
            weight fitted per corpus). After each task, :attr:`fusions` maps its name to the fusion used (what was
            fitted and how).
        index: the dense index (:mod:`~hf_cocodr.retrieval.ann`); :attr:`indexes` maps a task searched with an
            approximate one to its record (kind, parameters, recall@100).
    """

    def __init__(
        self, model, meta=None, fusion=None, batch_size: int = 64, doc_max_length: int | None = None, index="auto"
    ):
        self.model = model
        self.index_choice = index
        self.mteb_model_meta = meta
        self.fusion = _fusion_config(fusion)
        self.batch_size = batch_size
        self.doc_max_length = doc_max_length
        self.retriever = None
        self.fusions: dict[str, dict[str, Any]] = {}
        self.indexes: dict[str, dict[str, Any]] = {}

    def index(self, corpus, *, task_metadata, hf_split: str, hf_subset: str, encode_kwargs, num_proc=None, **kwargs):
        """Encode the task's corpus and index it for BM25; the fusion (unless a weight was given) is fitted to it when
        the queries arrive (:meth:`search`), calibrated to them."""
        columns = [c for c in ("id", "title", "text") if c in corpus.column_names]
        docs = corpus.select_columns(columns).rename_column("id", "_id")
        self.retriever = HybridRetriever.build(
            self.model,
            docs,
            fusion=self.fusion,
            fit=False,
            batch_size=int((encode_kwargs or {}).get("batch_size", self.batch_size)),
            doc_max_length=self.doc_max_length,
            index=self.index_choice,
        )

    def search(
        self,
        queries,
        *,
        task_metadata,
        hf_split: str,
        hf_subset: str,
        top_k: int,
        encode_kwargs,
        top_ranked=None,
        num_proc=None,
        **kwargs,
    ) -> dict[str, dict[str, float]]:
        """Each query's fused ranking ``{query_id: {doc_id: score}}`` over each system's top ``fusion.depth``."""
        if self.retriever is None:
            raise RuntimeError("HybridSearchModel.search before index: mteb indexes the corpus first")
        qids = list(queries["id"])
        texts = list(queries["text"])
        if "instruction" in queries.column_names:  # as mteb's own models read an instruction task's queries
            texts = [t if i is None else f"{t} {i}" for t, i in zip(texts, queries["instruction"])]
        if self.retriever.fusion.needs_fit:  # once per indexed corpus, with the queries of its first search
            self.retriever.fit_fusion(texts)
        name = getattr(task_metadata, "name", None) or "task"
        fusion = self.retriever.fusion
        self.fusions[name] = asdict(fusion)
        if "index" in self.retriever.meta:  # an approximate dense index: its kind, parameters and recall@100
            self.indexes[name] = self.retriever.meta["index"]
        logger.info(
            "%s: hybrid fusion %s (%s), dense weight %s", name, fusion.rule, fusion.normalize, fusion.dense_weight
        )
        depth = fusion.depth
        q_emb = self.retriever.encode_queries(texts, batch_size=int((encode_kwargs or {}).get("batch_size", 64)))
        ds, di = self.retriever.search_dense(texts, depth, query_embeddings=q_emb)
        bs, bi = self.retriever.search_bm25(texts, depth)
        doc_ids = np.asarray(self.retriever.doc_ids, dtype=object)
        out: dict[str, dict[str, float]] = {}
        for i, qid in enumerate(qids):
            valid = di[i] >= 0
            # BM25's list as the index returns it (fuse keeps its zero-score entries out of the candidates)
            rows, fused = fuse(di[i][valid], ds[i][valid], bi[i], bs[i], fusion, min(top_k, 2 * depth))
            ranked = dict(zip(doc_ids[rows].tolist(), fused.astype(float).tolist()))
            if top_ranked is not None and qid in top_ranked:
                allowed = set(top_ranked[qid])
                ranked = {d: s for d, s in ranked.items() if d in allowed}
            out[qid] = ranked
        return out


# Self-contained apart from hf_cocodr: the loader named in the hybrid's model_meta.json.
def cocodr_hybrid_loader(
    model_name: str,
    revision: str | None = None,
    dense_model: str | None = None,
    fusion: dict[str, Any] | None = None,
    device: str | None = None,
    **kwargs: Any,
):
    """Load the hybrid of ``dense_model`` (a sentence-transformers model) and bm25s as an mteb search model; the
    normalisation and the dense weight are fitted to each task's corpus unless ``fusion`` gives them."""
    from hf_cocodr import load_encoder
    from hf_cocodr.evaluation.mteb.hybrid import HybridSearchModel

    fields = dict(fusion or {})
    if not isinstance(fields.get("dense_weight"), (int, float)):
        fields.pop("dense_weight", None)
    if str(fields.get("normalize", "")).startswith("fitted"):  # as describe_fusion states a fitted one
        fields.pop("normalize")
    fields.pop("fit", None)
    return HybridSearchModel(load_encoder(dense_model or model_name, device=device), fusion=fields)


def hybrid_model_meta(dense_meta, model_name: str, fusion, dense_model: str, dense_revision: str | None = None):
    """The hybrid's ``ModelMeta`` from the dense model's (``dense_meta``, e.g. :func:`model_meta_for`): named
    ``model_name``, ``model_type=["hybrid"]``, loader :func:`cocodr_hybrid_loader` with ``loader_kwargs`` naming the
    dense part (``dense_model``: mteb's registry name where mteb knows the model; a local path is reduced to its last
    component, as every path leaving the machine), its revision (``dense_revision``: only when the dense part has
    one of its own; never the hybrid's), the lexical part (bm25s) and the fusion (:func:`describe_fusion`);
    ``adapted_from`` the dense model; everything else (revision, sizes, languages, training data, license) is the
    dense meta's, since BM25 adds no parameters and nothing is trained on the task."""
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.models.model_meta import ModelMeta

    dense_model = public_label(str(dense_model))
    fields = {k: getattr(dense_meta, k) for k in ModelMeta.model_fields}
    loader_kwargs: dict[str, Any] = {"dense_model": dense_model}
    if dense_revision:
        loader_kwargs["dense_revision"] = str(dense_revision)
    loader_kwargs.update(lexical_model=LEXICAL_PART, fusion=describe_fusion(_fusion_config(fusion)))
    fields.update(
        name=model_name,
        model_type=["hybrid"],
        loader=cocodr_hybrid_loader,
        loader_kwargs=loader_kwargs,
        adapted_from=dense_model,
    )
    return ModelMeta(**fields)
