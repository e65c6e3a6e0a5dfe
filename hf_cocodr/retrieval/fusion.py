"""Fusion of a dense and a BM25 ranking for one query, with label-free rules (the hybrid retriever's core).

- ``"convex"``: each system's scores are z-normalised over its own candidates for the query, and a candidate's fused
  score is ``w · z_dense + (1 − w) · z_bm25``; a candidate one system did not return sits one standard deviation
  below that system's last candidate (so ``w = 1`` is the dense ranking and ``w = 0`` the BM25 ranking). With
  ``normalize=False`` the raw scores are combined instead (``w = 1`` then gives the dense scores themselves, which a
  distillation teacher needs to equal its student exactly).
- ``"rrf"``: weighted reciprocal-rank fusion, ``w / (rrf_k + rank_dense) + (1 − w) / (rrf_k + rank_bm25)`` (ranks from
  1; a system that did not return the candidate adds nothing).

The dense weight is by default *fitted to the corpus without labels* (``dense_weight="fit"``, :func:`fit_fusion`):
pseudo-queries are drawn from the corpus in the inverse-cloze way (one sentence of a document is the query, the rest
of that document, which no longer holds the sentence, is its one relevant document), both systems rank the corpus
for them, and the weight on a grid that gives the best mean nDCG@10 of the fused ranking over the pseudo-queries is
kept, so the weight follows how well each system, and their fusion, find a document from a passage it no longer
holds. No judgment of any kind is read. How the weight was found is kept in :attr:`FusionConfig.fit`; the study of
the rule on dev splits is ``scripts/studies/hybrid_fit_study.py`` (``reports/studies/hybrid_fit.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError

FUSION_RULES = ("convex", "rrf")
FIT = "fit"
FIT_METHOD = "inverse-cloze pseudo-queries from the corpus (no labels)"
FIT_GRID = tuple(round(0.05 * i, 2) for i in range(21))


@dataclass
class FusionConfig:
    """How the dense and the BM25 ranking of one query are fused (see the module docstring).

    Args:
        rule: ``"convex"`` (per-query z-normalised scores, weighted sum) or ``"rrf"`` (weighted reciprocal ranks).
        dense_weight: ``w``, the dense system's weight in [0, 1] (1: dense alone, 0: BM25 alone), or ``"fit"`` (the
            default): fitted to the corpus without labels when the retriever is built (:func:`fit_fusion`).
        depth: candidates taken from each system per query (at least the ``k`` asked for).
        rrf_k: the rank offset of ``"rrf"``.
        normalize: ``"convex"`` only: z-normalise each system's scores per query (the default) or combine raw scores.
        fit: how a fitted weight was found (method, pseudo-queries, seed, the mean nDCG@10 over the pseudo-queries at
            each weight of the grid); ``None`` for a weight given by hand.
    """

    rule: str = "convex"
    dense_weight: float | str = FIT
    depth: int = 100
    rrf_k: int = 60
    normalize: bool = True
    fit: dict[str, Any] | None = None

    @property
    def needs_fit(self) -> bool:
        """Whether the weight still has to be fitted (``dense_weight == "fit"``); false once it is a number."""
        return self.dense_weight == FIT

    def __post_init__(self) -> None:
        if self.rule not in FUSION_RULES:
            raise ConfigError(f"fusion rule must be one of {FUSION_RULES}, got {self.rule!r}")
        w = self.dense_weight
        if w != FIT and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0):
            raise ConfigError(f"fusion dense_weight must be a number in [0, 1] or {FIT!r}, got {w!r}")
        if self.fit is not None and not isinstance(self.fit, dict):
            raise ConfigError(f"fusion fit must be a mapping (how the weight was fitted) or null, got {self.fit!r}")
        for name in ("depth", "rrf_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"fusion {name} must be a whole number >= 1, got {v!r}")
        if not isinstance(self.normalize, bool):
            raise ConfigError(f"fusion normalize must be true or false, got {self.normalize!r}")


def _zscore(scores: np.ndarray) -> np.ndarray:
    if scores.size == 0:
        return scores
    std = scores.std()
    return (scores - scores.mean()) / std if std > 0 else np.zeros_like(scores)


def _gap(scores: np.ndarray) -> float:
    """How far below a system's last candidate one it did not return sits: one standard deviation (1 if none)."""
    std = float(scores.std()) if scores.size else 0.0
    return std if std > 0 else 1.0


def fuse(
    dense_rows: np.ndarray,
    dense_scores: np.ndarray,
    bm25_rows: np.ndarray,
    bm25_scores: np.ndarray,
    fusion: FusionConfig,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse one query's two rankings (rows and scores, best first) into its top-``k``: ``(rows, scores)``.

    Ties are broken by the dense rank, then by the row, so the result is deterministic."""
    if fusion.dense_weight == FIT:
        raise ConfigError('the fusion weight is "fit" and was not fitted yet: call fit_fusion (or give a weight)')
    w = float(fusion.dense_weight)
    cand = np.unique(np.concatenate([dense_rows, bm25_rows]))
    pos = {int(r): i for i, r in enumerate(cand)}
    fused = np.zeros(len(cand), np.float64)
    d_idx = np.array([pos[int(r)] for r in dense_rows], np.int64)
    b_idx = np.array([pos[int(r)] for r in bm25_rows], np.int64)
    if fusion.rule == "convex":
        zd, zb = dense_scores.astype(np.float64), bm25_scores.astype(np.float64)
        if fusion.normalize:
            zd, zb = _zscore(zd), _zscore(zb)
        # a candidate a system did not return sits one standard deviation below that system's last one
        dense_part = np.full(len(cand), zd.min() - _gap(zd) if zd.size else 0.0)
        bm25_part = np.full(len(cand), zb.min() - _gap(zb) if zb.size else 0.0)
        dense_part[d_idx], bm25_part[b_idx] = zd, zb
        fused = w * dense_part + (1.0 - w) * bm25_part
    else:
        fused[d_idx] += w / (fusion.rrf_k + np.arange(1, len(d_idx) + 1))
        fused[b_idx] += (1.0 - w) / (fusion.rrf_k + np.arange(1, len(b_idx) + 1))
    dense_rank = np.full(len(cand), len(cand) + 1, np.int64)
    dense_rank[d_idx] = np.arange(len(d_idx))
    order = np.lexsort((cand, dense_rank, -fused))[:k]
    return cand[order], fused[order].astype(np.float32)


# ---------------------------------------------------------------------------------------------------- label-free fit
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def pseudo_queries(texts: list[str], n: int = 400, seed: int = 0, min_words: int = 4) -> list[tuple[int, str, str]]:
    """Inverse-cloze pseudo-queries drawn from a corpus: ``(row, query, rest)`` for up to ``n`` documents taken at
    random (``seed``), where ``query`` is one sentence of the document (of at least ``min_words`` words) and ``rest``
    the document without it. Documents of one sentence are skipped (nothing would be left to find)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, str, str]] = []
    for row in rng.permutation(len(texts)).tolist():
        sentences = [x for x in _SENTENCE_END.split(texts[row].strip()) if x]
        if len(sentences) < 2:
            continue
        usable = [i for i, x in enumerate(sentences) if len(x.split()) >= min_words]
        if not usable:
            continue
        pick = usable[int(rng.integers(len(usable)))]
        rest = " ".join(x for i, x in enumerate(sentences) if i != pick)
        out.append((row, sentences[pick], rest))
        if len(out) == n:
            break
    return out


def fit_dense_weight(
    rankings: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]],
    fusion: FusionConfig,
    grid: tuple[float, ...] = FIT_GRID,
) -> tuple[float, dict[float, float]]:
    """The dense weight of ``grid`` whose fused ranking gives the best mean nDCG@10 over pseudo-queries with one
    relevant document each: ``(weight, {weight: mean nDCG@10})``.

    ``rankings``: one ``(dense_rows, dense_scores, bm25_rows, bm25_scores, target_row)`` per pseudo-query (each
    system's candidates, best first, as :func:`fuse` takes them). A target at fused rank ``r <= 10`` scores
    ``1 / log2(r + 1)``, else 0. Equal means go to the weight nearest 0.5 (then the lower one)."""
    if not rankings:
        raise ConfigError("fitting the fusion weight needs at least one pseudo-query")
    curve: dict[float, float] = {}
    for w in grid:
        cfg = replace(fusion, dense_weight=float(w), fit=None)
        total = 0.0
        for d_rows, d_scores, b_rows, b_scores, target in rankings:
            rows, _ = fuse(d_rows, d_scores, b_rows, b_scores, cfg, 10)
            hit = np.flatnonzero(rows == target)
            total += 1.0 / np.log2(hit[0] + 2.0) if hit.size else 0.0
        curve[float(w)] = total / len(rankings)
    best = max(curve.values())
    # equal up to float noise: the same pseudo-queries ranked the same way
    tied = [w for w, v in curve.items() if v >= best - 1e-12]
    return min(tied, key=lambda w: (abs(w - 0.5), w)), curve


def fit_fusion(
    fusion: FusionConfig,
    texts: list[str],
    embeddings: np.ndarray,
    encode_queries: Callable[[list[str]], np.ndarray],
    encode_documents: Callable[[list[str]], np.ndarray],
    *,
    n_queries: int = 400,
    seed: int = 0,
    min_queries: int = 8,
) -> FusionConfig:
    """``fusion`` with its dense weight fitted to the corpus without labels (a copy; returned as is when its weight
    is a number already).

    ``texts``: the corpus as the BM25 side indexes it (``title + text``, in row order); ``embeddings``: its dense
    vectors in the same order (scored by inner product, as the dense index does); ``encode_queries`` /
    ``encode_documents``: the dense model's encoders. :func:`pseudo_queries` draws the pseudo-queries; each one's
    source document is replaced, in a BM25 index over the corpus and in a copy of the vectors, by the document
    without the sentence, and :func:`fit_dense_weight` picks the weight. With fewer than ``min_queries``
    pseudo-queries (a corpus of one-sentence documents) the weight is 0.5 and ``fit`` says why."""
    from .index import BM25Index

    if not fusion.needs_fit:
        return fusion
    picks = pseudo_queries(texts, n_queries, seed)
    record: dict[str, Any] = {"method": FIT_METHOD, "pseudo_queries": len(picks), "seed": seed}
    if len(picks) < min_queries:
        record["fallback"] = f"only {len(picks)} pseudo-queries (fewer than {min_queries}): weight 0.5"
        return replace(fusion, dense_weight=0.5, fit=record)
    rows = np.array([p[0] for p in picks], np.int64)
    queries = [p[1] for p in picks]
    rests = [p[2] for p in picks]
    mod_texts = list(texts)
    for r, rest in zip(rows.tolist(), rests):
        mod_texts[r] = rest
    bm25 = BM25Index(mod_texts)
    del mod_texts
    depth = min(fusion.depth, len(texts))
    b_scores, b_rows = bm25.search(queries, depth)
    del bm25
    emb = np.asarray(embeddings, np.float32)
    rest_emb = np.asarray(encode_documents(rests), np.float32)
    q_emb = np.asarray(encode_queries(queries), np.float32)
    sims = q_emb @ emb.T
    # the source documents' vectors are those of the documents without the sentence
    sims[:, rows] = q_emb @ rest_emb.T
    top = (
        np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
        if depth < sims.shape[1]
        else np.tile(np.arange(sims.shape[1]), (len(sims), 1))
    )
    rankings = []
    for i in range(len(picks)):
        cand = top[i][np.argsort(-sims[i, top[i]], kind="stable")]
        keep = b_scores[i] > 0
        rankings.append((cand, sims[i, cand], b_rows[i][keep], b_scores[i][keep], int(rows[i])))
    w, curve = fit_dense_weight(rankings, fusion)
    record.update(
        grid_ndcg_at_10={f"{k:g}": round(v, 4) for k, v in curve.items()},
        dense_alone=round(curve[1.0], 4) if 1.0 in curve else None,
        bm25_alone=round(curve[0.0], 4) if 0.0 in curve else None,
    )
    return replace(fusion, dense_weight=w, fit=record)
