"""The label-free fit of a fusion (:mod:`~hf_cocodr.retrieval.fusion`): the dense weight and the normalisation
chosen for a corpus from pseudo-queries drawn from it, no judgment of any kind read.

Pseudo-queries are drawn from the corpus in the inverse-cloze way (:func:`pseudo_queries`: one sentence of a document
is the query, the rest of that document, which no longer holds the sentence, is its one relevant document), both
systems rank the corpus for them, and of the pairs (normalisation, weight) on a grid whose mean nDCG@10 of the fused
ranking over the pseudo-queries stays within one standard error of the best on the way from the best toward equal
weights, the one nearest equal weights is kept (:func:`fit_choice`), so the fusion follows how well each system, and
their fusion, find a document from a passage it no longer holds, and leaves equal weights only for a difference beyond
the pseudo-queries' noise. Given the real queries (unlabelled: ``evaluate --hybrid`` and ``mteb --hybrid`` pass the
ones they rank), the pseudo-queries are first made as easy for BM25 as those queries are: a share of the sentence's
words (:data:`KEEP_SHARES`) stays in its document, the smallest share whose pseudo-queries' median BM25 top-score z
(:func:`~hf_cocodr.retrieval.pseudo_queries.bm25_top_z`) reaches the real queries' (or the one nearest it), so a corpus
whose queries copy its words (SQuAD's questions copy a sentence of their passage) is not fitted to pseudo-queries that
share none. Either the weight or the normalisation can be given by hand; only the other is then fitted (a rule that
reads no normalisation, such as ``"rrf"``, has only its weight fitted). Every registered rule is fitted alike: its
fused score is linear in the weight, so each pseudo-query's two parts score every weight of the grid at once. How the
fusion was found is kept in :attr:`~hf_cocodr.retrieval.fusion.FusionConfig.fit`; how the fit scores on dev splits is
in docs/hybrid.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from .fusion import FIT, FusionConfig, candidate_parts, rule_settings
from .held_out import paired
from .pseudo_queries import bm25_top_z, inverse_cloze
from .vectors import MappedIndex

logger = logging.getLogger(__name__)

# the normalisations a fit chooses among, in the order equal pseudo-query means are broken ("none" mixes the two
# systems' scales, which only a weight of 0 or 1 makes sense of)
FIT_NORMALIZATIONS = ("z", "minmax", "dbsf")
FIT_METHOD = (
    "inverse-cloze pseudo-queries from the corpus, as easy for BM25 as the queries ranked (their text only; no labels)"
)
FIT_GRID = tuple(round(0.05 * i, 2) for i in range(21))
# the shares of a pseudo-query's words that may stay in its document, tried in this order until its pseudo-queries
# are as easy for BM25 as the real queries (0: the plain inverse cloze)
FIT_PSEUDO_QUERIES = 400  # the pseudo-queries a fit draws from a corpus (at most: one per document of 2+ sentences)
KEEP_SHARES = (0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0)
DEPTH = 10  # the top documents whose agreement between the two systems is read
# Given the queries: where the two systems agree on less than AGREEMENT_FLOOR of the share of their top documents they
# agree on for the pseudo-queries (and that share is at least AGREEMENT_MIN, so that it says anything), the dense
# model ranks alone (docs/hybrid.md, "When one system ranks alone")
AGREEMENT_FLOOR = 0.75
AGREEMENT_MIN = 0.05
# a system that alone scores less than this share of the other's on the pseudo-queries adds nothing the fit can
# see: the other ranks alone (the walk toward equal weights would otherwise hand it a weight within the noise)
ALONE_MIN_SHARE = 0.25
# what a fit checks beyond its curves, recorded with it: a fit recorded without it (made before these checks, e.g. a
# cached teacher's) is fitted again rather than reused (is_fit_of)
FIT_CHECKS = f"ranks alone: share {ALONE_MIN_SHARE:g}, agreement {AGREEMENT_FLOOR:g} over {AGREEMENT_MIN:g}"

# the fit's pseudo-queries: the inverse cloze of the corpus's pseudo-query module (one module draws every kind)
pseudo_queries = inverse_cloze


def is_fit_of(fitted: FusionConfig, asked: FusionConfig) -> bool:
    """Whether ``fitted`` is ``asked`` with what ``asked`` leaves to ``"fit"`` fitted (its other settings the same,
    and fitted with today's checks, :data:`FIT_CHECKS`), so a fit made earlier (a cached retriever's) can stand for
    fitting ``asked`` again on the same corpus and model."""
    if fitted.fit is None or fitted.needs_fit or not asked.needs_fit or fitted.fit.get("checks") != FIT_CHECKS:
        return False
    fields = fitted.fit.get("fitted", ["dense_weight"])  # earlier versions fitted the weight alone
    unfitted = replace(fitted, fit=None, dense_weight=FIT, **({"normalize": FIT} if "normalize" in fields else {}))
    return unfitted == replace(asked, fit=None)


def keep_share_for(medians: dict[float, float], target: float) -> float:
    """The share whose pseudo-queries' median BM25 top-score z is nearest ``target`` (the real queries'), among the
    shares tried in order until one reached it (``medians``: share → median, in that order); equal distances go to
    the smaller share."""
    shares = list(medians)
    return min(shares, key=lambda f: (abs(medians[f] - target), f))


def fit_choice(
    rankings: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]],
    fusion: FusionConfig,
    grid: tuple[float, ...] = FIT_GRID,
    within_one_se: bool = True,
    details: dict[str, Any] | None = None,
) -> tuple[str, float, dict[str, dict[float, float]]]:
    """The normalisation and dense weight chosen by the mean nDCG@10 of their fused ranking over pseudo-queries with
    one relevant document each: ``(normalize, weight, {normalize: {weight: mean nDCG@10}})``.

    The *peak* is the pair with the best mean. With ``within_one_se`` (the default) the choice walks from the peak's
    weight toward 0.5, one grid weight at a time, while at the next weight some normalisation's mean is below the
    peak's by at most one standard error of the per-query difference (paired over the pseudo-queries; the
    one-standard-error rule), and stops before the first weight where none is; at each step the peak's normalisation
    is kept if it qualifies, else the first one in :data:`FIT_NORMALIZATIONS` that does. Pseudo-queries are a noisy
    proxy for the real ones: a difference within their noise is no reason to stay away from equal weights, and a weight
    separated from the peak by a step beyond the noise is never reached. Without it the peak is the choice. ``details``
    receives the peak (``"peak"``) and the pairs within one standard error of it (``"within_one_se"``).

    What ``fusion`` gives is kept, what it leaves to ``"fit"`` is searched: the weights of ``grid``, and (a rule that
    reads ``normalize`` only, such as ``"convex"``) the normalisations of :data:`FIT_NORMALIZATIONS`. ``rankings``:
    one ``(dense_rows, dense_scores, bm25_rows, bm25_scores, target_row)`` per pseudo-query (each system's
    candidates, best first, as :func:`~hf_cocodr.retrieval.fusion.fuse` takes them). A target at fused rank
    ``r <= 10`` scores ``1 / log2(r + 1)``, else 0. Equal means (up to float noise) go to the normalisation first in
    :data:`FIT_NORMALIZATIONS`, then to the weight nearest 0.5 (then the lower one)."""
    if not rankings:
        raise ConfigError("fitting the fusion needs at least one pseudo-query")
    if "normalize" in rule_settings(fusion.rule) and fusion.normalize == FIT:
        norms: tuple[str, ...] = FIT_NORMALIZATIONS
    else:
        norms = (fusion.normalize,)  # given (or irrelevant: a rule such as "rrf" normalises nothing)
    weights = grid if fusion.dense_weight == FIT else (float(fusion.dense_weight),)
    curves: dict[str, dict[float, float]] = {}
    per_query: dict[str, np.ndarray] = {}  # normalisation -> (pseudo-query, weight) nDCG@10
    for norm in norms:
        cfg = replace(fusion, dense_weight=0.5, normalize=norm if norm != FIT else "z", fit=None)
        gains = grid_gains(rankings, cfg, weights)
        per_query[norm] = gains
        curves[norm] = {float(w): float(g) for w, g in zip(weights, gains.mean(axis=0))}
    best = max(v for curve in curves.values() for v in curve.values())
    tied = [(i, n, w) for i, (n, curve) in enumerate(curves.items()) for w, v in curve.items() if v >= best - 1e-12]
    _, norm, w = min(tied, key=lambda t: (t[0], abs(t[2] - 0.5), t[2]))
    if details is not None:
        details["peak"] = {"normalize": norm, "dense_weight": w, "ndcg_at_10": round(curves[norm][w], 4)}
    if not within_one_se or len(rankings) < 2:
        return norm, w, curves
    peak = per_query[norm][:, list(weights).index(w)]
    close: dict[float, list[str]] = {x: [] for x in weights}  # weight -> normalisations within one SE of the peak
    for n, gains in per_query.items():
        diff = peak[:, None] - gains  # per query, per weight
        se = diff.std(axis=0, ddof=1) / np.sqrt(len(rankings))
        for x, m, e in zip(weights, diff.mean(axis=0), se):
            if m <= e + 1e-12:
                close[x].append(n)
    if details is not None:
        details["within_one_se"] = {n: [float(x) for x in weights if n in close[x]] for n in per_query}
    # walk from the peak toward 0.5, one grid weight at a time, while some normalisation stays within one SE
    ordered = sorted(weights)
    j = ordered.index(w)
    step = 1 if w < 0.5 else -1
    while 0 <= j + step < len(ordered) and abs(ordered[j + step] - 0.5) < abs(ordered[j] - 0.5):
        nxt = ordered[j + step]
        if not close[nxt]:
            break
        j += step
        norm = norm if norm in close[nxt] else close[nxt][0]
    return norm, float(ordered[j]), curves


def grid_gains(rankings: list[tuple], fusion: FusionConfig, weights: tuple[float, ...]) -> np.ndarray:
    """Each pseudo-query's nDCG@10 of its one relevant row (``rankings``: as :func:`fit_choice` takes them) in the
    ranking ``fusion`` fuses at each of ``weights``: a ``(pseudo-queries, weights)`` array (a target at fused rank
    ``r <= 10`` scores ``1 / log2(r + 1)``, else 0; ties as :func:`~hf_cocodr.retrieval.fusion.fuse` breaks them)."""
    at = np.asarray(weights, np.float64)[:, None]
    gains = np.zeros((len(rankings), len(weights)))
    for q, (d_rows, d_scores, b_rows, b_scores, target) in enumerate(rankings):
        cand, dense_part, bm25_part, dense_rank = candidate_parts(d_rows, d_scores, b_rows, b_scores, fusion)
        hit = np.flatnonzero(cand == target)
        if not hit.size:
            continue
        t = hit[0]
        # every weight at once, as fuse computes each: the target's rank is the candidates fuse puts first
        fused = at * dense_part + (1.0 - at) * bm25_part
        tied_first = (dense_rank < dense_rank[t]) | ((dense_rank == dense_rank[t]) & (cand < cand[t]))
        rank = ((fused > fused[:, t : t + 1]) | ((fused == fused[:, t : t + 1]) & tied_first)).sum(axis=1)
        gains[q] = np.where(rank < 10, 1.0 / np.log2(rank + 2.0), 0.0)
    return gains


def lead_gains(
    fusion: FusionConfig,
    texts: list[str],
    embeddings: np.ndarray,
    encode_queries: Callable[[list[str]], np.ndarray],
    encode_documents: Callable[[list[str]], np.ndarray],
    *,
    n_queries: int = FIT_PSEUDO_QUERIES,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Each of the fit's inverse-cloze pseudo-queries' nDCG@10 of its document by the dense ranking and by the fused
    ranking of a fitted (or given) ``fusion``: ``(dense, hybrid)`` (see :func:`lead_over_dense`)."""
    if fusion.needs_fit:
        raise ConfigError("the lead over the dense model needs a fusion with its weight fitted or given")
    share = float(fusion.fit.get("keep_share", 0.0)) if isinstance(fusion.fit, dict) else 0.0
    picks = pseudo_queries(texts, n_queries, seed, keep_share=share)
    if not picks:
        return np.zeros(0), np.zeros(0)
    depth = min(fusion.depth, len(texts))
    side = _bm25_side(picks, texts, depth)
    rankings = _pseudo_rankings(picks, depth, embeddings, encode_queries, encode_documents, side)
    gains = grid_gains(rankings, fusion, (1.0, float(fusion.dense_weight)))
    return gains[:, 0], gains[:, 1]


def lead_over_dense(fusion: FusionConfig, texts, embeddings, encode_queries, encode_documents, **kw) -> dict[str, Any]:
    """How far the fused ranking of a fitted (or given) ``fusion`` leads the dense model's alone, without labels: on
    the fit's inverse-cloze pseudo-queries (:func:`pseudo_queries`, with the share of each sentence's words left in
    its document that the fit calibrated, ``fusion.fit["keep_share"]``, else 0), each pseudo-query's nDCG@10 of its
    document by the fusion and by the dense ranking (the fusion at weight 1), paired (hybrid − dense):
    ``{"queries", "dense", "hybrid", "difference", "se", "verdict"}`` (``better`` beyond one standard error,
    ``worse`` below minus one, else ``no difference``; ``no reading`` with fewer than two pseudo-queries). The
    arguments are :func:`fit_fusion`'s (``n_queries``, ``seed``)."""
    return lead_reading(*lead_gains(fusion, texts, embeddings, encode_queries, encode_documents, **kw))


def lead_reading(dense, hybrid) -> dict[str, Any]:
    """The paired reading hybrid − dense of two per-query score lists, its sides named ``dense`` and ``hybrid``."""
    out = paired(dense, hybrid)
    if "start" in out:
        out["dense"], out["hybrid"] = out.pop("start"), out.pop("adapted")
    return out


def fit_fusion(
    fusion: FusionConfig,
    texts: list[str],
    embeddings: np.ndarray,
    encode_queries: Callable[[list[str]], np.ndarray],
    encode_documents: Callable[[list[str]], np.ndarray],
    *,
    queries: list[str] | None = None,
    bm25=None,
    n_queries: int = FIT_PSEUDO_QUERIES,
    seed: int = 0,
    min_queries: int = 8,
) -> FusionConfig:
    """``fusion`` with what it leaves to ``"fit"`` (the dense weight, the normalisation) fitted to the corpus without
    labels (a copy; returned as is when nothing is left to fit).

    ``texts``: the corpus as the BM25 side indexes it (``title + text``, in row order); ``embeddings``: its dense
    vectors in the same order (scored by inner product, as the dense index does); ``encode_queries`` /
    ``encode_documents``: the dense model's encoders. :func:`pseudo_queries` draws the pseudo-queries; each one's
    source document is replaced, in a BM25 index over the corpus and in a copy of the vectors, by the document
    without the sentence, and :func:`fit_choice` picks the normalisation and the weight. ``queries``: the real
    queries the hybrid will rank (their text only, no judgments), if known: the share of each pseudo-query's words
    left in its document is then chosen among :data:`KEEP_SHARES` so the pseudo-queries' median BM25 top-score z
    (:func:`~hf_cocodr.retrieval.pseudo_queries.bm25_top_z`) meets the queries' (:func:`keep_share_for`); without
    them the share is 0. ``bm25``: a BM25 index over ``texts`` already built, which then ranks those queries
    (otherwise one is built). With fewer than
    ``min_queries`` pseudo-queries (a corpus of one-sentence documents) the weight is 0.5, the normalisation z-scores,
    and ``fit`` says why."""
    if not fusion.needs_fit:
        return fusion
    picks = pseudo_queries(texts, n_queries, seed)
    record: dict[str, Any] = {"method": FIT_METHOD, "checks": FIT_CHECKS, "pseudo_queries": len(picks), "seed": seed}
    record["fitted"] = [n for n in ("normalize", "dense_weight") if getattr(fusion, n) == FIT]
    if "normalize" not in rule_settings(fusion.rule):  # a rule such as "rrf" normalises nothing
        record["fitted"] = [n for n in record["fitted"] if n != "normalize"]
    if len(picks) < min_queries:
        record["fallback"] = (
            f"only {len(picks)} pseudo-queries could be drawn from the corpus, fewer than the {min_queries} the fit "
            "needs (each is a sentence of a document of two sentences or more); weight 0.5, z-scores instead"
        )
        fallback = {"dense_weight": 0.5, "normalize": "z"}
        return replace(fusion, **{k: fallback[k] for k in record["fitted"]}, fit=record)
    depth = min(fusion.depth, len(texts))
    bm25_side = _bm25_side(picks, texts, depth)
    real = [q for q in (queries or []) if isinstance(q, str) and q.strip()]
    record["keep_share"] = 0.0
    real_bm25 = None
    if real:
        if bm25 is None:
            from .index import BM25Index

            bm25 = BM25Index(texts)
        real_bm25 = bm25.search(real, depth)
        picks, bm25_side = _calibrate_share(picks, bm25_side, real_bm25, texts, n_queries, seed, depth, record)
        record["real_queries"] = len(real)
    rankings = _pseudo_rankings(picks, depth, embeddings, encode_queries, encode_documents, bm25_side)
    details: dict[str, Any] = {}
    norm, w, curves = fit_choice(rankings, fusion, details=details)
    if "dense_weight" in record["fitted"]:
        alone = _side_of_no_use(curves[norm], record)
        if alone is None and real and _queries_disagree(real, real_bm25, rankings, embeddings, encode_queries, record):
            alone = 1.0
        w = w if alone is None else alone
    record["grid_ndcg_at_10"] = {n: {f"{k:g}": round(v, 4) for k, v in c.items()} for n, c in curves.items()}
    record.update(details, choice="from the peak toward 0.5 while within one standard error of it")
    any_curve = next(iter(curves.values()))  # at w = 1 (0) every normalisation gives the dense (BM25) ranking
    record.update(
        dense_alone=round(any_curve[1.0], 4) if 1.0 in any_curve else None,
        bm25_alone=round(any_curve[0.0], 4) if 0.0 in any_curve else None,
    )
    return replace(fusion, dense_weight=w, normalize=norm, fit=record)


def _calibrate_share(picks, bm25_side, real_bm25, texts, n_queries, seed, depth, record) -> tuple[list, tuple]:
    """The pseudo-queries and their BM25 side at the share of words kept (:data:`KEEP_SHARES`) whose median BM25
    top-score z meets the queries' (``real_bm25``: BM25's rankings of them); ``record`` gets the share and the
    medians."""
    target = float(np.median(bm25_top_z(real_bm25[0])))
    medians = {0.0: float(np.median(bm25_top_z(bm25_side[0])))}
    sides = {0.0: bm25_side}
    for share in KEEP_SHARES[1:]:
        if max(medians.values()) >= target:
            break
        picks_at = pseudo_queries(texts, n_queries, seed, keep_share=share)
        sides[share] = _bm25_side(picks_at, texts, depth)
        medians[share] = float(np.median(bm25_top_z(sides[share][0])))
    share = keep_share_for(medians, target)
    if share:
        picks, bm25_side = pseudo_queries(texts, n_queries, seed, keep_share=share), sides[share]
    record.update(
        keep_share=share,
        bm25_top_z_median={"queries": round(target, 4), **{f"{f:g}": round(m, 4) for f, m in medians.items()}},
    )
    return picks, bm25_side


def _side_of_no_use(curve: dict[float, float], record: dict[str, Any]) -> float | None:
    """The weight at which one system ranks alone (1.0: the dense model, 0.0: BM25) where the other alone scores
    less than :data:`ALONE_MIN_SHARE` of its mean nDCG@10 on the pseudo-queries (``curve``: the chosen
    normalisation's, weight → mean), else None; ``record`` says why (``ranks_alone``)."""
    dense_alone, bm25_alone = curve.get(1.0), curve.get(0.0)
    if dense_alone is None or bm25_alone is None:
        return None
    for side, w, strong, weak, other in (
        ("the dense model", 1.0, dense_alone, bm25_alone, "BM25"),
        ("BM25", 0.0, bm25_alone, dense_alone, "the dense model"),
    ):
        if strong > 0 and weak < ALONE_MIN_SHARE * strong:
            record["ranks_alone"] = (
                f"{other} alone scores {weak:.3f} nDCG@10 on the pseudo-queries, under {ALONE_MIN_SHARE:g} of "
                f"{side}'s {strong:.3f}: it adds nothing the fit can see, and {side} ranks alone"
            )
            return w
    return None


def _queries_disagree(real, real_bm25, rankings, embeddings, encode_queries, record) -> bool:
    """Whether the dense model should rank alone because the queries do not look like the pseudo-queries to the two
    systems: they agree on far fewer of the queries' top documents than of the pseudo-queries' (:func:`top_agreement`
    below :data:`AGREEMENT_FLOOR` of it, that at least :data:`AGREEMENT_MIN`). The pseudo-queries' words are the
    documents' own: a mismatch of the queries' words with the documents' is what they cannot show, and it is BM25's
    to suffer. ``record`` gets ``agreement`` (and ``ranks_alone`` where it holds)."""
    from .index import check_finite  # (torch: the index module's)

    n = len(embeddings)
    real_dense = MappedIndex(embeddings, name="the corpus's vectors the fusion is fitted to").search(
        check_finite(np.asarray(encode_queries(real), np.float32), "the queries' vectors"), min(DEPTH, n)
    )
    agreement = {
        "queries": round(top_agreement(real_dense[1], real_bm25[1], real_bm25[0], n), 4),
        "pseudo_queries": round(
            top_agreement([r[0] for r in rankings], [r[2] for r in rankings], [r[3] for r in rankings], n), 4
        ),
        "floor": AGREEMENT_FLOOR,
    }
    record["agreement"] = agreement
    if not (
        agreement["pseudo_queries"] >= AGREEMENT_MIN
        and agreement["queries"] < AGREEMENT_FLOOR * agreement["pseudo_queries"]
    ):
        return False
    record["ranks_alone"] = (
        f"the dense model and BM25 agree on {agreement['queries']:.0%} of the queries' top {DEPTH} and on "
        f"{agreement['pseudo_queries']:.0%} of the pseudo-queries': below {AGREEMENT_FLOOR:g} of it, the "
        "pseudo-queries do not speak for the queries, and the dense model ranks alone"
    )
    return True


def top_agreement(dense_rows, bm25_rows, bm25_scores, num_docs: int, k: int = DEPTH) -> float:
    """How much more each query's dense top ``k`` and BM25's (its hits alone: entries scoring 0 hold no query term)
    share than two rankings drawn at random would, as a share of the most they could: per query ``(shared −
    chance) / (most − chance)``, with ``chance = k · hits / num_docs`` and ``most = min(k, hits)`` (0 where BM25 has
    no hit), averaged; 0 for no query. Chance-corrected, so that a corpus of a few documents, or a system ranking at
    random, reads about 0 whatever the number of BM25's hits."""
    out = []
    for d, b, s in zip(dense_rows, bm25_rows, bm25_scores):
        hits = {int(x) for x, v in zip(np.asarray(b)[:k], np.asarray(s)[:k]) if v > 0}
        most = min(k, len(hits))
        chance = k * len(hits) / max(1, num_docs)
        shared = len({int(x) for x in np.asarray(d)[:k]} & hits)
        out.append((shared - chance) / (most - chance) if most > chance else 0.0)
    return float(np.mean(out)) if out else 0.0


def fit_outcome(fusion: FusionConfig) -> str:
    """How the label-free fit of ``fusion`` ended, in words for the log: ``"fitted without labels: ..."`` (with why
    one system ranks alone, where it does), or ``"not fitted: <reason>"`` where the fit took its fallback (too few
    pseudo-queries), or ``"given by hand: ..."``."""
    fit = fusion.fit if isinstance(fusion.fit, dict) else None
    normalizes = "normalize" in rule_settings(fusion.rule)
    rule = f"{fusion.normalize if normalizes else fusion.rule}, dense weight {fusion.dense_weight}"
    if fit is None:
        return f"given by hand: {rule}"
    if fit.get("fallback"):
        return f"not fitted: {fit['fallback']}"
    alone = f"; {fit['ranks_alone']}" if fit.get("ranks_alone") else ""
    return f"fitted without labels: {rule} ({fit.get('pseudo_queries', '?')} pseudo-queries{alone})"


def log_fit(fusion: FusionConfig, what: str, seconds: float | None = None) -> None:
    """Log how the fit of ``what``'s fusion ended (:func:`fit_outcome`): a warning where it was not fitted."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    outcome = fit_outcome(fusion)
    if outcome.startswith("not fitted"):
        logger.warning("%s: fusion %s%s", what, outcome, took)
    else:
        logger.info("%s: fusion %s%s", what, outcome, took)


def _bm25_side(picks, texts, depth) -> tuple[np.ndarray, np.ndarray]:
    """BM25's top ``depth`` ``(scores, rows)`` for each pseudo-query over the corpus with each source document
    replaced by its ``rest``."""
    from .index import BM25Index

    mod_texts = list(texts)
    for row, _, rest in picks:
        mod_texts[row] = rest
    bm25 = BM25Index(mod_texts)
    del mod_texts
    return bm25.search([p[1] for p in picks], depth)


def _pseudo_rankings(picks, depth, embeddings, encode_queries, encode_documents, bm25_side) -> list[tuple]:
    """Each pseudo-query's two candidate lists over the corpus with its source document replaced by its ``rest``
    (the form :func:`fit_choice` takes); ``bm25_side``: BM25's, from :func:`_bm25_side`. The dense list is exact
    search over ``embeddings`` read in blocks (:class:`~hf_cocodr.retrieval.vectors.MappedIndex`: a memory-mapped
    corpus is never read into memory whole, and no queries-by-corpus score matrix is made), each block checked
    finite; equal scores in row order."""
    from .index import check_finite

    rows = np.array([p[0] for p in picks], np.int64)
    queries = [p[1] for p in picks]
    rests = [p[2] for p in picks]
    b_scores, b_rows = bm25_side
    # NaN or inf vectors (a broken model, a damaged file) are refused: no rule is chosen from NaN rankings
    if not isinstance(embeddings, np.memmap):  # (a mapped corpus is checked a block at a time as it is searched)
        check_finite(embeddings, "the corpus's vectors the fusion is fitted to")
    rest_emb = check_finite(np.asarray(encode_documents(rests), np.float32), "the fit's document vectors")
    q_emb = check_finite(np.asarray(encode_queries(queries), np.float32), "the fit's pseudo-query vectors")
    # the source documents' vectors are those of their rests (a document picked twice: its last pick's rest)
    sources, last = np.unique(rows[::-1], return_index=True)
    last = len(rows) - 1 - last
    source_scores = q_emb @ rest_emb[last].T
    n = len(embeddings)
    found_s, found_r = MappedIndex(embeddings, name="the corpus's vectors the fusion is fitted to").search(
        q_emb, min(n, depth + len(sources))
    )
    rankings = []
    for i in range(len(picks)):
        other = ~np.isin(found_r[i], sources)
        cand_r = np.concatenate([found_r[i][other], sources])
        cand_s = np.concatenate([found_s[i][other], source_scores[i]])
        keep = np.lexsort((cand_r, -cand_s))[: min(depth, n)]
        rankings.append((cand_r[keep], cand_s[keep], b_rows[i], b_scores[i], int(rows[i])))
    return rankings
