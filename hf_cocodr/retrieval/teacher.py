"""The recipe's distillation teacher: the hybrid of the starting model and BM25 over a target corpus
(:class:`~hf_cocodr.retrieval.hybrid.HybridRetriever`, its indexes cached by model and corpus), its rankings of the
target queries, and the training rows built from them (a :class:`~hf_cocodr.data.teacher.TeacherRows`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import distributed as D
from ..data.teacher import (
    FrozenCandidateRows,
    TeacherRows,
    TeacherSource,
    frozen_candidate_rows,
    route_queries,
    teacher_rows,
)
from ..errors import ConfigError
from ..rundir.run_record import digest
from ..storage import cache_dir
from .encoding import encode_documents, encode_texts
from .fusion import FusionConfig
from .fusion_fit import fit_fusion, is_fit_of, lead_gains, lead_reading
from .hybrid import HYBRID_FILE, HybridRetriever, _corpus_ids_texts, corpus_fingerprint
from .session import EncodingSession

logger = logging.getLogger(__name__)

__all__ = ["distill_dataset", "query_side_dataset", "teacher_cache_path", "teacher_rankings", "teacher_retriever"]


def _as_fusion(fusion):

    return fusion if isinstance(fusion, FusionConfig) else FusionConfig(**(fusion or {}))


def teacher_cache_path(
    model_key: Any,
    doc_ids: Sequence[str],
    doc_texts: Sequence[str],
    session: EncodingSession | None = None,
    *,
    batch_size: int = 64,
) -> Path:
    """Where :func:`teacher_rankings` keeps the teacher's indexes of a corpus (a saved
    :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever`): by the model (``model_key``, what identifies its weights and
    their token limits), the corpus's content, the batch size of the corpus encoding (the same as
    :func:`teacher_rankings`'s) and its precision (the ``session``'s) when it is not fp32."""
    ident = {"teacher": 2, "model": model_key, "corpus": corpus_fingerprint(list(doc_ids), list(doc_texts))}
    precision = session.precision if session is not None else "fp32"
    if precision != "fp32":
        ident["encode_precision"] = precision
    if batch_size != 64:  # (named only when not the default, as the precision: the default's key is unchanged)
        ident["batch_size"] = int(batch_size)
    key = digest(ident)
    return cache_dir("teacher") / f"hybrid-{key}"


def teacher_rankings(
    model,
    model_key: Any,
    corpus,
    queries: Sequence[str],
    k: int,
    *,
    fusion=None,
    batch_size: int = 64,
    cache: bool = True,
    session: EncodingSession | None = None,
) -> tuple[list[list[str]], list[list[float]], list[str], list[str], bool]:
    """The hybrid teacher's top-``k`` over ``corpus`` for each query: ``(ids, scores, doc_ids, doc_texts, cached)``.

    The teacher is :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever` of ``model`` (at its own document length) and BM25
    over ``corpus``, fused with ``fusion``. With ``cache``, its indexes are kept in ``<cache>/teacher`` (see
    :func:`teacher_cache_path`; ``cached`` says whether they were there), so a resumed or repeated run, another
    seed or other settings of the stage encode only the queries, not the corpus again. ``session``: the run's
    :class:`~hf_cocodr.retrieval.session.EncodingSession` (the precision its corpus and queries are encoded in, the
    encoding cache); default: a fresh one (fp32)."""
    hybrid, doc_ids, doc_texts, cached = teacher_retriever(
        model, model_key, corpus, fusion=fusion, batch_size=batch_size, cache=cache, session=session
    )
    ids, scores = _Batched(hybrid).search(queries, k)
    return ids, scores, doc_ids, doc_texts, cached


def teacher_retriever(
    model,
    model_key: Any,
    corpus,
    *,
    fusion=None,
    batch_size: int = 64,
    cache: bool = True,
    session: EncodingSession | None = None,
) -> tuple[HybridRetriever, list[str], list[str], bool]:
    """The hybrid teacher over ``corpus`` with ``fusion`` set (see :func:`teacher_rankings`): ``(hybrid, doc_ids,
    doc_texts, cached)``; ``hybrid.embeddings`` are the starting model's vectors of the corpus in ``doc_ids``
    order; its queries are encoded in the ``session``'s precision."""
    session = session if session is not None else EncodingSession()
    fusion = _as_fusion(fusion)
    doc_ids, doc_texts = _corpus_ids_texts(corpus)
    path = teacher_cache_path(model_key, doc_ids, doc_texts, session, batch_size=batch_size) if cache else None
    hybrid, cached = None, False
    # (under torch.distributed: the cache is used only where every rank finds it, and rank 0 alone writes it)
    if path is not None and D.agree((path / HYBRID_FILE).is_file()):
        try:
            hybrid, cached = (
                HybridRetriever.load(
                    path, model if not isinstance(model, (str, os.PathLike)) else None, session=session
                ),
                True,
            )
            if hybrid.doc_ids != list(doc_ids):  # the rows must be this corpus's documents, in its order
                raise ConfigError(f"its document ids are not those of {corpus} in order")
        except (ConfigError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            logger.warning("teacher cache %s cannot be used (%s): building it again", path, e)
            hybrid, cached = None, False
        if not D.agree(hybrid is not None):  # a rank that could not read it: every rank builds it
            hybrid, cached = None, False
    if hybrid is None:
        hybrid = HybridRetriever.build(model, corpus, fusion=fusion, batch_size=batch_size, session=session)
        if path is not None and D.is_main():
            try:
                hybrid.save(path)
            except OSError as e:  # the cache only saves time: a run goes on without it
                logger.warning("the teacher's indexes could not be cached in %s (%s); going on without", path, e)
    if is_fit_of(hybrid.fusion, fusion):  # fitted when it was built: the same corpus, model and settings
        fusion = hybrid.fusion
    elif fusion.needs_fit:  # a cached teacher built with a weight given by hand, or fitted another way
        fusion = fit_fusion(
            fusion,
            doc_texts,
            hybrid.embeddings,
            lambda q: encode_texts(hybrid.model, q, kind="query", batch_size=batch_size, session=session),
            lambda d: encode_documents(hybrid.model, d, batch_size=batch_size, session=session),
        )
    hybrid.fusion = fusion
    return hybrid, doc_ids, doc_texts, cached


class _Ranked:
    """A teacher whose rankings are already known (``search`` returns them in query order)."""

    def __init__(self, ids, scores):
        self.ids, self.scores, self.at = ids, scores, 0

    def search(self, queries, k):
        n = len(queries)
        out = self.ids[self.at : self.at + n], self.scores[self.at : self.at + n]
        self.at += n
        return out


def distill_dataset(
    model,
    model_key: Any,
    target_corpora: Sequence,
    query_specs: Sequence[str],
    k: int,
    *,
    fusion=None,
    batch_size: int = 64,
    cache: bool = True,
    session: EncodingSession | None = None,
) -> TeacherRows:
    """The distillation rows of the recipe: each ``--target-queries`` source routed to its target corpus
    (:func:`route_queries`), ranked by the hybrid teacher (:func:`teacher_rankings`), as :func:`teacher_rows`; the
    :class:`~hf_cocodr.data.teacher.TeacherRows` name each source, its corpus, its queries and whether the teacher
    was cached. ``session``: the run's encoding session (:func:`teacher_rankings`)."""
    from datasets import concatenate_datasets

    parts, sources = [], []
    for corpus, src in route_queries(query_specs, target_corpora):
        ids, scores, doc_ids, doc_texts, cached = teacher_rankings(
            model, model_key, corpus, src.texts, k, fusion=fusion, batch_size=batch_size, cache=cache, session=session
        )
        parts.append(teacher_rows(_Ranked(ids, scores), src.texts, dict(zip(doc_ids, doc_texts)), k))
        sources.append(_source(src, corpus, cached))
    return TeacherRows(concatenate_datasets(parts) if len(parts) > 1 else parts[0], sources)


def _source(src, corpus, cached: bool) -> TeacherSource:
    return TeacherSource(queries=src.name, corpus=str(corpus), num_queries=len(src.texts), cached=cached)


def query_side_dataset(
    model,
    model_key: Any,
    target_corpora: Sequence,
    query_specs: Sequence[str],
    k: int,
    *,
    fusion=None,
    batch_size: int = 64,
    cache: bool = True,
    session: EncodingSession | None = None,
) -> TeacherRows:
    """The rows of query-side distillation: as :func:`distill_dataset`, but their rows are
    :class:`~hf_cocodr.data.teacher.FrozenCandidateRows`, each candidate its row in the starting model's vectors of
    the corpora (the teacher's dense index, the corpora one after the other; the rows' ``vectors``) instead of its
    text."""
    import numpy as np

    queries, scores, candidates, tables, sources, offset = [], [], [], [], [], 0
    for corpus, src in route_queries(query_specs, target_corpora):
        hybrid, doc_ids, _, cached = teacher_retriever(
            model, model_key, corpus, fusion=fusion, batch_size=batch_size, cache=cache, session=session
        )
        doc_rows = {d: offset + i for i, d in enumerate(doc_ids)}
        part = frozen_candidate_rows(_Batched(hybrid), src.texts, doc_rows, k, name=src.name)
        queries += part.query_texts
        scores.append(part.scores)
        candidates.append(part.candidates)
        tables.append(np.asarray(hybrid.embeddings, dtype=np.float32))
        offset += len(doc_ids)
        sources.append(_source(src, corpus, cached))
    rows = FrozenCandidateRows(
        queries,
        np.concatenate(scores),
        np.concatenate(candidates),
        name="teacher rows",
        vectors=np.concatenate(tables),
    )
    return TeacherRows(rows, sources)


class _Batched:
    """A teacher that searches in chunks of 1,024 queries (the hybrid's working memory)."""

    def __init__(self, hybrid):
        self.hybrid = hybrid

    def search(self, queries, k):
        ids, scores = [], []
        for start in range(0, len(queries), 1024):
            i, s = self.hybrid.search(list(queries[start : start + 1024]), k)
            ids += i
            scores += s
        return ids, scores


def teacher_lead(
    model,
    model_key: Any,
    target_corpora: Sequence,
    query_specs: Sequence[str],
    *,
    fusion=None,
    batch_size: int = 64,
    cache: bool = True,
    session: EncodingSession | None = None,
) -> dict[str, Any]:
    """Whether the hybrid teacher ranks better than the starting model alone, without labels: on each target corpus
    the queries are routed to, its fused ranking against the dense one on the fit's inverse-cloze pseudo-queries
    (:func:`~hf_cocodr.retrieval.fusion_fit.lead_gains`), pooled: the paired reading (hybrid − dense) with
    ``leads`` (its verdict is ``better``) and each corpus's reading under ``corpora``."""
    dense, hybrid, corpora = [], [], {}
    for corpus, _ in route_queries(query_specs, target_corpora):
        teacher, _, doc_texts, _ = teacher_retriever(
            model, model_key, corpus, fusion=fusion, batch_size=batch_size, cache=cache, session=session
        )
        st = teacher.model
        d, h = lead_gains(
            teacher.fusion,
            doc_texts,
            teacher.embeddings,
            lambda q, st=st: encode_texts(st, q, kind="query", batch_size=batch_size, session=session),
            lambda t, st=st: encode_documents(st, t, batch_size=batch_size, session=session),
        )
        corpora[str(corpus)] = lead_reading(d, h)
        dense += d.tolist()
        hybrid += h.tolist()
    pooled = lead_reading(dense, hybrid)
    return {**pooled, "leads": pooled["verdict"] == "better", "corpora": corpora}
