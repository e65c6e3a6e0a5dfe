"""Fusion of a dense and a BM25 ranking for one query: the rules, in a registry (the hybrid retriever's core).

A rule says what each system gives each candidate of a query; the fused score of a candidate at dense weight ``w`` is
then ``w · dense + (1 − w) · bm25`` for every rule (``w = 1``: the dense ranking, ``w = 0``: the BM25 ranking). Every
rule is one function of one signature, ``rule(dense_scores, bm25_scores, fusion) -> Parts``, registered by name with
:func:`fusion_rule` in :data:`RULES`; :class:`FusionConfig` accepts, the hybrid fuses with, the label-free fit
(:mod:`~hf_cocodr.retrieval.fusion_fit`) fits and the command line's ``--fusion`` offers every registered rule. The
built-in rules:

- ``"convex"``: each system's scores are normalised over its own candidates for the query. The normalisation
  (``normalize``, :data:`NORMALIZATIONS`):

  - ``"z"``: z-scores, ``(s − mean) / std``; a candidate one system did not return sits one standard deviation below
    that system's last candidate;
  - ``"minmax"``: ``(s − min) / (max − min)`` (mteb's *rsf*); a candidate one system did not return scores 0 there,
    as its last candidate does;
  - ``"dbsf"``: ``(s − (mean − 3 std)) / (6 std)`` clipped to [0, 1] (mteb's *dbsf*); a missing candidate scores 0;
  - ``"none"``: the raw scores (a missing candidate one standard deviation below the last); ``w = 1`` then gives the
    dense scores themselves, which a distillation teacher needs to equal its student exactly.

  A system whose candidates all score the same gives each of them 0 (``"z"``) or 0.5 (``"minmax"``, ``"dbsf"``).
- ``"rrf"``: weighted reciprocal-rank fusion, each system gives ``1 / (rrf_k + rank)`` (ranks from 1; a system that
  did not return the candidate gives nothing).

The dense weight and the normalisation are by default ``"fit"``: fitted to the corpus without labels by
:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion` before anything is fused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError

NORMALIZATIONS = ("z", "minmax", "dbsf", "none")
FIT = "fit"


@dataclass
class FusionConfig:
    """How the dense and the BM25 ranking of one query are fused (see the module docstring).

    Args:
        rule: the name of a registered rule (:data:`RULES`): ``"convex"`` (per-query normalised scores, weighted sum,
            the default) or ``"rrf"`` (weighted reciprocal ranks) unless more were registered.
        dense_weight: ``w``, the dense system's weight in [0, 1] (1: dense alone, 0: BM25 alone), or ``"fit"`` (the
            default): fitted to the corpus without labels when the retriever is built
            (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`).
        depth: candidates taken from each system per query (at least the ``k`` asked for); 200 by default, so a
            document one system ranks low is still normalised against the other's list rather than missing from it.
        rrf_k: the rank offset of ``"rrf"``.
        normalize: for a rule that reads it (``"convex"``): how each system's scores are normalised per query, one of
            :data:`NORMALIZATIONS`, or ``"fit"`` (the default): chosen by the fit together with a fitted weight; beside
            a weight given by hand it is ``"z"`` (the rule such weights were given for, and what a fusion saved without
            this field used). ``True`` / ``False`` (what earlier versions saved) read as ``"z"`` / ``"none"``.
        bm25_zeros: for a rule that reads it (``"convex"``): where a query has fewer than ``depth`` BM25 hits,
            normalise BM25's top ``depth`` as the index returns it, zero scores included (as mteb's hybrids see it),
            and give every document BM25 did not return the normalised value of 0, its BM25 score (the default);
            false: normalise the hits alone, a document not among them below the last (what a fusion saved without
            this field did).
        fit: how a fitted fusion was found (method, pseudo-queries, seed, the mean nDCG@10 over the pseudo-queries at
            each normalisation and weight of the grid); ``None`` for a fusion given by hand.
    """

    rule: str = "convex"
    dense_weight: float | str = FIT
    depth: int = 200
    rrf_k: int = 60
    normalize: str = FIT
    bm25_zeros: bool = True
    fit: dict[str, Any] | None = None

    @property
    def needs_fit(self) -> bool:
        """Whether the fusion still has to be fitted (``dense_weight == "fit"``; a ``normalize`` of ``"fit"`` is
        fitted with it); false once the weight is a number."""
        return self.dense_weight == FIT

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(f"fusion rule must be one of {tuple(RULES)}, got {self.rule!r}")
        w = self.dense_weight
        if w != FIT and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0):
            raise ConfigError(f"fusion dense_weight must be a number in [0, 1] or {FIT!r}, got {w!r}")
        if self.fit is not None and not isinstance(self.fit, dict):
            raise ConfigError(f"fusion fit must be a mapping (how the weight was fitted) or null, got {self.fit!r}")
        if not isinstance(self.bm25_zeros, bool):
            raise ConfigError(f"fusion bm25_zeros must be true or false, got {self.bm25_zeros!r}")
        for name in ("depth", "rrf_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"fusion {name} must be a whole number >= 1, got {v!r}")
        if isinstance(self.normalize, bool):  # a fusion saved by an earlier version: z-scores or raw scores
            self.normalize = "z" if self.normalize else "none"
        if self.normalize == FIT and w != FIT:
            self.normalize = "z"
        if self.normalize not in (*NORMALIZATIONS, FIT):
            raise ConfigError(
                f"fusion normalize must be one of {(*NORMALIZATIONS, FIT)} (or true / false), got {self.normalize!r}"
            )


# ------------------------------------------------------------------------------------------------------ the registry
class Parts(NamedTuple):
    """What each system gives the candidates of one query under a rule: ``dense`` has one value per dense candidate
    (in the order given), ``bm25`` one per BM25 hit (each entry scoring above 0, in order); ``dense_missing`` /
    ``bm25_missing``: what a system gives a candidate it did not return."""

    dense: np.ndarray
    dense_missing: float
    bm25: np.ndarray
    bm25_missing: float


Rule = Callable[[np.ndarray, np.ndarray, FusionConfig], Parts]
# the parameters every rule takes, in this order (tests/test_architecture.py checks each registered rule)
RULE_PARAMETERS = ("dense_scores", "bm25_scores", "fusion")


@dataclass(frozen=True)
class FusionRule:
    """A registered rule: its function (``parts(dense_scores, bm25_scores, fusion) -> Parts``: ``dense_scores``, the
    dense candidates' scores best first; ``bm25_scores``, BM25's top ``depth`` as the index returns it, zero scores
    included) and the :class:`FusionConfig` fields it reads besides the weight and the depth (``settings``: what the
    fit may choose and what a hybrid's description states)."""

    parts: Rule
    settings: tuple[str, ...] = ()


RULES: dict[str, FusionRule] = {}


def fusion_rule(name: str, settings: tuple[str, ...] = ()) -> Callable[[Rule], Rule]:
    """A decorator registering a rule under ``name`` in :data:`RULES` (see :class:`FusionRule`); the function is
    returned unchanged. A name registered already, or a setting that is no :class:`FusionConfig` field, is refused."""
    unknown = sorted(set(settings) - set(FusionConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"fusion rule {name!r}: {unknown} are no FusionConfig fields")

    def register(parts: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"a fusion rule named {name!r} is registered already")
        RULES[name] = FusionRule(parts, tuple(settings))
        return parts

    return register


def unregister_rule(name: str) -> None:
    """Remove the rule ``name`` from :data:`RULES` (a saved hybrid fused with it no longer loads)."""
    if name not in RULES:
        raise ValueError(f"no fusion rule named {name!r} is registered")
    del RULES[name]


def rule_settings(rule: str) -> tuple[str, ...]:
    """The :class:`FusionConfig` fields the registered rule ``rule`` reads besides the weight and the depth."""
    return RULES[rule].settings


# --------------------------------------------------------------------------------------------------- the built-ins
def _spread(scores: np.ndarray) -> float:
    """A system's standard deviation over its candidates (1 where it has none, or they all score the same)."""
    std = float(scores.std()) if scores.size else 0.0
    return std if std > 0 else 1.0


def normalized(scores: np.ndarray, how: str) -> tuple[np.ndarray, float]:
    """One system's candidate scores of one query normalised by ``how`` (one of :data:`NORMALIZATIONS`), and the
    value a candidate it did not return takes (see the module docstring)."""
    s = scores.astype(np.float64)
    if s.size == 0:
        return s, 0.0
    if how in ("minmax", "dbsf"):
        if how == "minmax":
            low, span = s.min(), s.max() - s.min()
        else:
            low, span = s.mean() - 3.0 * s.std(), 6.0 * s.std()
        if span <= 0 or (how == "dbsf" and s.std() < 1e-9):
            return np.full_like(s, 0.5), 0.0
        return np.clip((s - low) / span, 0.0, 1.0), 0.0
    if how == "z":
        std = s.std()
        s = (s - s.mean()) / std if std > 0 else np.zeros_like(s)
    elif how != "none":
        raise ConfigError(f"fusion normalize must be one of {NORMALIZATIONS} here, got {how!r}")
    return s, float(s.min() - _spread(s))


@fusion_rule("convex", settings=("normalize", "bm25_zeros"))
def convex(dense_scores: np.ndarray, bm25_scores: np.ndarray, fusion: FusionConfig) -> Parts:
    """Each system's scores normalised by ``fusion.normalize`` over its own candidates (BM25's zeros included with
    ``fusion.bm25_zeros``: a document BM25 did not return has no query term, its score is 0, normalised as the list's
    zeros)."""
    hits = bm25_scores > 0
    nd, missing_d = normalized(dense_scores, fusion.normalize)
    if fusion.bm25_zeros and not hits.all():
        padded, _ = normalized(bm25_scores, fusion.normalize)
        return Parts(nd, missing_d, padded[hits], float(padded[~hits][0]))
    nb, missing_b = normalized(bm25_scores[hits], fusion.normalize)
    return Parts(nd, missing_d, nb, missing_b)


@fusion_rule("rrf", settings=("rrf_k",))
def rrf(dense_scores: np.ndarray, bm25_scores: np.ndarray, fusion: FusionConfig) -> Parts:
    """Each system's reciprocal ranks ``1 / (rrf_k + rank)`` (ranks from 1); a candidate it did not return gets 0."""
    hits = int((bm25_scores > 0).sum())
    return Parts(
        1.0 / (fusion.rrf_k + np.arange(1, len(dense_scores) + 1)),
        0.0,
        1.0 / (fusion.rrf_k + np.arange(1, hits + 1)),
        0.0,
    )


# ------------------------------------------------------------------------------------------------------- the fusion
def candidate_parts(
    dense_rows: np.ndarray, dense_scores: np.ndarray, bm25_rows: np.ndarray, bm25_scores: np.ndarray, fusion
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One query's candidates and what each system gives them under ``fusion.rule``: ``(rows, dense_part, bm25_part,
    dense_rank)``, the fused score at weight ``w`` being ``w · dense_part + (1 − w) · bm25_part``."""
    hits = bm25_scores > 0
    cand = np.unique(np.concatenate([dense_rows, bm25_rows[hits]]))
    pos = {int(r): i for i, r in enumerate(cand)}
    d_idx = np.array([pos[int(r)] for r in dense_rows], np.int64)
    b_idx = np.array([pos[int(r)] for r in bm25_rows[hits]], np.int64)
    parts = RULES[fusion.rule].parts(dense_scores, bm25_scores, fusion)
    if len(parts.dense) != len(d_idx) or len(parts.bm25) != len(b_idx):
        raise ConfigError(
            f"fusion rule {fusion.rule!r} gave {len(parts.dense)} dense and {len(parts.bm25)} BM25 values for "
            f"{len(d_idx)} dense candidates and {len(b_idx)} BM25 hits"
        )
    dense_part = np.full(len(cand), parts.dense_missing)
    bm25_part = np.full(len(cand), parts.bm25_missing)
    dense_part[d_idx], bm25_part[b_idx] = parts.dense, parts.bm25
    dense_rank = np.full(len(cand), len(cand) + 1, np.int64)
    dense_rank[d_idx] = np.arange(len(d_idx))
    return cand, dense_part, bm25_part, dense_rank


def fuse(
    dense_rows: np.ndarray,
    dense_scores: np.ndarray,
    bm25_rows: np.ndarray,
    bm25_scores: np.ndarray,
    fusion: FusionConfig,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse one query's two rankings (rows and scores, best first) into its top-``k``: ``(rows, scores)``.

    ``bm25_rows`` / ``bm25_scores``: BM25's top ``depth`` as the index returns it; entries scoring 0 (no query term)
    are never candidates, but with ``fusion.bm25_zeros`` they are part of what is normalised (see
    :class:`FusionConfig`). Ties are broken by the dense rank, then by the row, so the result is deterministic."""
    if fusion.needs_fit:
        raise ConfigError('the fusion weight is "fit" and was not fitted yet: call fit_fusion (or give a weight)')
    w = float(fusion.dense_weight)
    cand, dense_part, bm25_part, dense_rank = candidate_parts(dense_rows, dense_scores, bm25_rows, bm25_scores, fusion)
    fused = w * dense_part + (1.0 - w) * bm25_part
    order = np.lexsort((cand, dense_rank, -fused))[:k]
    return cand[order], fused[order].astype(np.float32)
