"""Fusion of a dense and a BM25 ranking for one query, with label-free rules (the hybrid retriever's core).

- ``"convex"``: each system's scores are z-normalised over its own candidates for the query, and a candidate's fused
  score is ``w · z_dense + (1 − w) · z_bm25``; a candidate one system did not return sits one standard deviation
  below that system's last candidate (so ``w = 1`` is the dense ranking and ``w = 0`` the BM25 ranking). With
  ``normalize=False`` the raw scores are combined instead (``w = 1`` then gives the dense scores themselves, which a
  distillation teacher needs to equal its student exactly).
- ``"rrf"``: weighted reciprocal-rank fusion, ``w / (rrf_k + rank_dense) + (1 − w) / (rrf_k + rank_bm25)`` (ranks from
  1; a system that did not return the candidate adds nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

FUSION_RULES = ("convex", "rrf")


@dataclass
class FusionConfig:
    """How the dense and the BM25 ranking of one query are fused (see the module docstring).

    Args:
        rule: ``"convex"`` (per-query z-normalised scores, weighted sum) or ``"rrf"`` (weighted reciprocal ranks).
        dense_weight: ``w``, the dense system's weight in [0, 1] (1: dense alone, 0: BM25 alone).
        depth: candidates taken from each system per query (at least the ``k`` asked for).
        rrf_k: the rank offset of ``"rrf"``.
        normalize: ``"convex"`` only: z-normalise each system's scores per query (the default) or combine raw scores.
    """

    rule: str = "convex"
    dense_weight: float = 0.5
    depth: int = 100
    rrf_k: int = 60
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.rule not in FUSION_RULES:
            raise ConfigError(f"fusion rule must be one of {FUSION_RULES}, got {self.rule!r}")
        w = self.dense_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
            raise ConfigError(f"fusion dense_weight must be a number in [0, 1], got {w!r}")
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
