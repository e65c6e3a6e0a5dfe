"""Training rows for distillation from a retriever's ranking: ``(query, doc_1, ..., doc_k, label)``.

The teacher is any object with ``search(queries, k) -> (ids, scores)`` (a :class:`hf_cocodr.hybrid.HybridRetriever`
of the starting model and BM25, in the recipe). Each query's row holds the teacher's top-``k`` documents, best first,
and ``label`` their ``k`` teacher scores, the layout ``HybridDistillLoss`` and sentence-transformers'
``DistillKLDivLoss`` read. Queries for which the teacher returns fewer than ``k`` documents are left out and counted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..fusion import FusionConfig, fit_fusion
from ..hybrid import HYBRID_FILE, HybridRetriever, _corpus_ids_texts, corpus_fingerprint
from ..run_record import digest
from ..storage import cache_dir
from .beir import CORPUS_FILE, jsonl_file
from .target_queries import TargetQueries, read_target_queries

logger = logging.getLogger(__name__)

__all__ = ["distill_dataset", "route_queries", "teacher_rankings", "teacher_rows"]


def teacher_rows(teacher, queries: Sequence[str], doc_texts: Mapping[str, str], k: int, *, batch_size: int = 1024):
    """A ``datasets.Dataset`` with columns ``query``, ``doc_1`` … ``doc_k`` and ``label`` (a list of ``k`` floats).

    Args:
        teacher: the ranking to distil (``search(queries, k)``).
        queries: the (unlabelled) query texts.
        doc_texts: document id → the text the student encodes for it.
        k: candidates per query (at least 2: a softmax over one candidate carries nothing).
        batch_size: queries searched at once.
    """
    from datasets import Dataset

    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"teacher_rows: k must be a whole number >= 2, got {k!r}")
    columns: dict[str, list] = {"query": [], **{f"doc_{j}": [] for j in range(1, k + 1)}, "label": []}
    short = 0
    queries = list(queries)
    for start in range(0, len(queries), batch_size):
        chunk = queries[start : start + batch_size]
        ids, scores = teacher.search(chunk, k)
        for query, row_ids, row_scores in zip(chunk, ids, scores, strict=True):
            if len(row_ids) < k:
                short += 1
                continue
            columns["query"].append(query)
            for j, doc_id in enumerate(row_ids[:k], start=1):
                columns[f"doc_{j}"].append(doc_texts[doc_id])
            columns["label"].append([float(s) for s in row_scores[:k]])
    if short:
        logger.warning(
            "distillation: %d of %d queries got fewer than %d teacher candidates and were left out",
            short,
            len(queries),
            k,
        )
    if not columns["query"]:
        raise ValueError(
            f"distillation: none of the {len(queries)} queries got {k} teacher candidates; lower k or check the corpus"
        )
    return Dataset.from_dict(columns)


# ------------------------------------------------------------------------------------------ the recipe's teacher
def _corpus_file(corpus) -> Path | None:
    """The corpus file a target corpus or a query source's BEIR folder reads, links resolved (None: a dataset)."""

    if not isinstance(corpus, (str, os.PathLike)):
        return None
    path = Path(corpus).expanduser()
    if path.is_dir():
        path = jsonl_file(path, CORPUS_FILE)
    return path.resolve()


def route_queries(query_specs: Sequence[str], target_corpora: Sequence) -> list[tuple[Any, TargetQueries]]:
    """Each ``--target-queries`` source with the target corpus its teacher ranks: the corpus whose corpus file is
    the source folder's (links resolved), else the only target corpus. A source that matches none of several target
    corpora (a JSONL search log) is refused by name, before any work."""

    if not target_corpora:
        raise ConfigError("distillation needs a target corpus for the teacher to rank (--target-corpus)")
    files = [_corpus_file(c) for c in target_corpora]
    routed = []
    for spec in query_specs:
        src = read_target_queries(spec)
        own = _corpus_file(src.folder) if src.folder is not None else None
        match = [c for c, f in zip(target_corpora, files) if own is not None and f == own]
        if match:
            routed.append((match[0], src))
        elif src.folder is None and len(target_corpora) == 1:  # a search log: the one target corpus
            routed.append((target_corpora[0], src))
        elif src.folder is not None:
            raise ConfigError(
                f"--target-queries {spec}: these queries belong to the corpus of {src.folder}, which is not a target "
                f"corpus ({', '.join(str(c) for c in target_corpora)}); the teacher ranks them over their own "
                "corpus: add it with --target-corpus"
            )
        else:
            raise ConfigError(
                f"--target-queries {spec}: which target corpus are these queries for? A JSONL file names none and "
                f"there are {len(target_corpora)} target corpora ({', '.join(str(c) for c in target_corpora)}); "
                "give them as DIR:SPLIT of the corpus's BEIR folder, or distil one target corpus per run"
            )
    return routed


def _as_fusion(fusion):

    return fusion if isinstance(fusion, FusionConfig) else FusionConfig(**(fusion or {}))


def teacher_cache_path(model_key: Any, doc_ids: Sequence[str], doc_texts: Sequence[str]) -> Path:
    """Where :func:`teacher_rankings` keeps the teacher's indexes of a corpus (a saved
    :class:`~hf_cocodr.hybrid.HybridRetriever`): by the model (``model_key``, what identifies its weights) and the
    corpus's content."""
    key = digest({"teacher": 2, "model": model_key, "corpus": corpus_fingerprint(list(doc_ids), list(doc_texts))})
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
) -> tuple[list[list[str]], list[list[float]], list[str], list[str], bool]:
    """The hybrid teacher's top-``k`` over ``corpus`` for each query: ``(ids, scores, doc_ids, doc_texts, cached)``.

    The teacher is :class:`~hf_cocodr.hybrid.HybridRetriever` of ``model`` (at its own document length) and BM25
    over ``corpus``, fused with ``fusion``. With ``cache``, its indexes are kept in ``<cache>/teacher`` (see
    :func:`teacher_cache_path`; ``cached`` says whether they were there), so a resumed or repeated run, another
    seed or other settings of the stage encode only the queries, not the corpus again."""
    fusion = _as_fusion(fusion)
    doc_ids, doc_texts = _corpus_ids_texts(corpus)
    path = teacher_cache_path(model_key, doc_ids, doc_texts) if cache else None
    hybrid, cached = None, False
    if path is not None and (path / HYBRID_FILE).is_file():
        try:
            hybrid, cached = (
                HybridRetriever.load(path, model if not isinstance(model, (str, os.PathLike)) else None),
                True,
            )
        except (ConfigError, OSError, ValueError, KeyError) as e:
            logger.warning("teacher cache %s cannot be used (%s): building it again", path, e)
    if hybrid is None:
        hybrid = HybridRetriever.build(model, corpus, fusion=fusion, batch_size=batch_size)
        if path is not None:
            try:
                hybrid.save(path)
            except OSError as e:  # the cache only saves time: a run goes on without it
                logger.warning("the teacher's indexes could not be cached in %s (%s); going on without", path, e)
    if fusion.needs_fit and hybrid.fusion.fit is not None:  # fitted when it was built: the same corpus and model
        fusion = replace(fusion, dense_weight=hybrid.fusion.dense_weight, fit=hybrid.fusion.fit)
    elif fusion.needs_fit:  # a cached teacher built with a weight given by hand
        from ..evaluation.retrieval import encode_texts

        fusion = fit_fusion(
            fusion,
            doc_texts,
            hybrid.embeddings,
            lambda q: encode_texts(hybrid.model, q, kind="query", batch_size=batch_size),
            lambda d: encode_texts(hybrid.model, d, kind="document", batch_size=batch_size),
        )
    hybrid.fusion = fusion
    ids, scores = [], []
    for start in range(0, len(queries), 1024):
        i, s = hybrid.search(list(queries[start : start + 1024]), k)
        ids += i
        scores += s
    return ids, scores, doc_ids, doc_texts, cached


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
):
    """The distillation rows of the recipe: each ``--target-queries`` source routed to its target corpus
    (:func:`route_queries`), ranked by the hybrid teacher (:func:`teacher_rankings`), as :func:`teacher_rows`.
    Returns ``(dataset, info)``: ``info`` names each source, its corpus, its queries and whether the teacher was
    cached."""
    from datasets import concatenate_datasets

    parts, info = [], []
    for corpus, src in route_queries(query_specs, target_corpora):
        ids, scores, doc_ids, doc_texts, cached = teacher_rankings(
            model, model_key, corpus, src.texts, k, fusion=fusion, batch_size=batch_size, cache=cache
        )
        parts.append(teacher_rows(_Ranked(ids, scores), src.texts, dict(zip(doc_ids, doc_texts)), k))
        info.append({"queries": src.name, "corpus": str(corpus), "num_queries": len(src.texts), "cached": cached})
    return concatenate_datasets(parts) if len(parts) > 1 else parts[0], info
