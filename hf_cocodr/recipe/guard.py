"""The label-free guard (:func:`guard_run`): before the recipe exports, the adapted model and the starting model rank
queries neither trained on, and the starting model is kept where the adapted one reads worse.

The guard is a function of the run and its two candidates (:class:`Candidates`: the starting and the adapted model)
that returns its verdict (:class:`GuardVerdict`: the model to export and the record); the runner acts on it.

Its reading, pooled over the target corpora (per-corpus figures are recorded beside), is ``pseudo_queries``: the
held-out pseudo-queries of ``OUT/queries/<corpus>.guard.jsonl`` (:mod:`.queries`: every kind alike, whatever mix
trained, from documents no trained pseudo-query comes from), each with its source document as its one relevant
document: nDCG@10 of the model's dense ranking of the corpus (a label the corpus gave for free); the reading of each
kind is recorded beside. The user's target queries all train (none is held out).

The per-query difference adapted − start gives a mean and its standard error; the reading is ``worse`` where the mean
is below −1 SE, ``better`` above +1 SE, else ``no difference``. The verdict rests on it (:data:`DECIDES`).

A reading the run's own training shaped cannot vouch for it (:func:`shaped_readings`): where the distillation trained
the document side (``distill_side: full``) on pseudo-queries, the model learnt the very task the held-out
pseudo-queries test (find the document a crop, a keyword set or a title came from), of every kind, held out or not,
and their reading says ``better`` whatever the labels say. Such a reading is recorded and not decided on, and a
verdict left with no reading to rest on is ``unverified``.

Verdicts: ``worse``, ``unverified`` or ``not worse``. With ``guard: on`` (the default) the recipe keeps the starting
model unless the verdict is ``not worse``; ``guard: record`` reads and records only. The reading lands in
``recipe.json`` (``guard``) and on the model card, whatever it decides.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..modeling.loading import load_encoder
from ..retrieval.session import EncodingSession
from .queries import corpus_dataset
from .settings import encode_batch_size
from .stages.distill import DistillStage

if TYPE_CHECKING:
    from .context import RecipeRun

logger = logging.getLogger("hf_cocodr.recipe")

DEPTH = 10  # nDCG@10
READINGS = ("pseudo_queries",)
DECIDES = ("pseudo_queries",)  # the readings the verdict rests on


def ndcg_at_10(ranked: list[str], relevant: set[str] | list[str]) -> float:
    """nDCG@10 of ``ranked`` (best first) for binary ``relevant`` documents."""
    relevant = set(relevant)
    if not relevant:
        return 0.0
    dcg = sum(1.0 / math.log2(r + 2) for r, d in enumerate(ranked[:DEPTH]) if d in relevant)
    ideal = sum(1.0 / math.log2(r + 2) for r in range(min(DEPTH, len(relevant))))
    return dcg / ideal


def paired_reading(start: list[float], adapted: list[float]) -> dict[str, Any]:
    """Mean per-query scores of both models, the mean difference adapted − start, its standard error and the
    verdict (``worse`` below −1 SE, ``better`` above +1 SE, else ``no difference``)."""
    s, a = np.asarray(start, np.float64), np.asarray(adapted, np.float64)
    d = a - s
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    mean = float(d.mean()) if n else 0.0
    verdict = "worse" if mean < -se else "better" if mean > se else "no difference"
    return {
        "queries": n,
        "start": round(float(s.mean()), 4) if n else None,
        "adapted": round(float(a.mean()), 4) if n else None,
        "difference": round(mean, 4),
        "se": round(se, 4) if math.isfinite(se) else None,
        "verdict": verdict,
    }


def decide(readings: dict[str, dict[str, Any]], shaped: dict[str, str] | None = None) -> str:
    """``worse`` where a reading the verdict rests on (:data:`DECIDES`, less the ``shaped`` ones) is ``worse``;
    ``unverified`` where each such reading read was shaped by the training (:func:`shaped_readings`); else ``not
    worse`` (no reading to decide on included: the corpus gave no held-out pseudo-query)."""
    shaped = shaped or {}
    deciding = [r for r in DECIDES if r not in shaped]
    if any(readings.get(r, {}).get("verdict") == "worse" for r in deciding):
        return "worse"
    unvouched = any(r in readings for r in DECIDES if r in shaped) and not any(r in readings for r in deciding)
    return "unverified" if unvouched else "not worse"


def shaped_readings(cfg, counts: list[dict[str, Any]]) -> dict[str, str]:
    """The guard's readings the run's training shaped, each with why (recorded, not decided on): the pseudo-queries'
    where the distillation trained the document side (``distill_side: full``) on pseudo-queries (``counts``: each
    target corpus's query counts, :class:`~hf_cocodr.recipe.queries.CorpusQueries`)."""
    pseudo = sum(int(c.get("train_pseudo_queries", 0)) for c in counts)
    if pseudo and cfg.distill_side == "full" and DistillStage().enabled(cfg):
        return {
            "pseudo_queries": "the distillation trained the document side on pseudo-queries drawn from the corpus, "
            'the task the held-out pseudo-queries test (docs/adaptation.md, "The label-free guard")'
        }
    return {}


def _read_rows(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class _Ranker:
    """Dense rankings of one corpus by the guard's models: the corpus is indexed once per document encoder (a
    query-side model's documents go through its starting model's route: the start's index serves both), from the
    run's encoding cache where it was encoded before."""

    def __init__(self, corpus_ds, batch_size: int, session: EncodingSession):
        self.ds, self.batch_size, self.session = corpus_ds, batch_size, session
        self.doc_ids = [str(x) for x in corpus_ds["_id"]]
        self.indexes: dict[str, tuple] = {}

    def top(self, model, texts: list[str]) -> list[list[str]]:
        """Each text's top :data:`DEPTH` documents by ``model``'s dense ranking."""
        from ..retrieval.encoding import build_index, encode_texts, model_similarity  # (torch)
        from ..retrieval.encoding_cache import document_encoder_key

        key = document_encoder_key(model)
        if key not in self.indexes:
            self.indexes[key] = build_index(
                model, self.ds, batch_size=self.batch_size, show_progress_bar=False, session=self.session
            )
        index, order = self.indexes[key]
        normalize = model_similarity(model) == "cosine"
        q = encode_texts(
            model, texts, kind="query", batch_size=self.batch_size, normalize=normalize, session=self.session
        )
        _, rows = index.search(q, DEPTH)
        return [[self.doc_ids[order[r]] for r in row if r >= 0] for row in rows]


def _why(readings: dict[str, dict[str, Any]], verdict: str, shaped: dict[str, str]) -> tuple[str, str]:
    """The readings in one line, and why the verdict is what it is."""
    said = "; ".join(
        f"{r}: {v['difference']:+.4f} ± {v['se'] if v['se'] is not None else 'n/a'} ({v['queries']} queries, "
        f"{v['verdict']})"
        for r, v in readings.items()
    )
    why = (
        f"the adapted model reads worse than the starting model beyond one standard error ({said})"
        if verdict == "worse"
        else f"no reading can vouch for the adapted model: {'; '.join(shaped.values())} ({said})"
    )
    return said, why


@dataclass(frozen=True)
class Candidates:
    """The two models the guard chooses between: the starting model and the one the stages left."""

    start: str
    adapted: str


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard decided: ``keep``, the model the run exports (the adapted one, or the starting one where
    ``guard: on`` and the verdict is not ``not worse``), and ``record``, the reading and the verdict that
    ``recipe.json`` and the model card keep."""

    keep: str
    record: dict[str, Any]

    @property
    def kept_start(self) -> bool:
        """Whether the starting model is kept."""
        return self.record.get("kept") == "start"


def guard_run(run: RecipeRun, candidates: Candidates) -> GuardVerdict | None:
    """Read the guard (see the module docstring) for ``candidates.adapted`` against ``candidates.start``, with the
    run's settings, held-out queries and encoding session; returns the verdict (None where nothing trained, the
    guard is off or no query was held out). It changes nothing of the run: the runner acts on the verdict."""

    cfg = run.cfg
    entries = [q for q in run.queries if q.guard is not None]
    if cfg.guard == "off" or not entries or str(candidates.adapted) == str(candidates.start):
        return None
    t0 = time.perf_counter()
    batch = encode_batch_size(cfg)
    start, adapted = load_encoder(candidates.start), load_encoder(str(candidates.adapted))
    per_query: dict[str, dict[str, list[float]]] = {r: {"start": [], "adapted": []} for r in READINGS}
    corpora: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, dict[str, list[float]]] = {}  # the held-out pseudo-queries by kind (recorded, not decided on)
    for entry in entries:
        pseudo = [r for r in _read_rows(entry.guard) if r.get("doc_id")]
        ranker = _Ranker(corpus_dataset(entry.corpus), batch, run.encodings)
        corpora[entry.name] = {}
        if pseudo:
            texts = [r["text"] for r in pseudo]
            scores = {}
            for name, model in (("start", start), ("adapted", adapted)):
                tops = ranker.top(model, texts)
                scores[name] = [ndcg_at_10(t, {r["doc_id"]}) for t, r in zip(tops, pseudo)]
                per_query["pseudo_queries"][name] += scores[name]
                for r, v in zip(pseudo, scores[name]):
                    by_kind.setdefault(r.get("kind", "?"), {"start": [], "adapted": []})[name].append(v)
            corpora[entry.name]["pseudo_queries"] = paired_reading(scores["start"], scores["adapted"])
    readings = {r: paired_reading(v["start"], v["adapted"]) for r, v in per_query.items() if v["start"]}
    kinds = {k: paired_reading(v["start"], v["adapted"]) for k, v in by_kind.items()}
    # the decision rests on the pseudo-queries' reading (their labels are the corpus's own) where the training did not
    # shape it
    shaped = shaped_readings(cfg, [q.counts for q in run.queries])
    verdict = decide(readings, shaped)
    worse = verdict != "not worse"
    keep_start = worse and cfg.guard == "on"
    record = {
        "mode": cfg.guard,
        "readings": readings,
        "corpora": corpora,
        "pseudo_query_kinds": kinds,
        "decided_on": [r for r in DECIDES if r in readings and r not in shaped],
        **({"not_decided": shaped} if shaped else {}),
        "verdict": verdict,
        "kept": "start" if keep_start else "adapted",
        "seconds": round(time.perf_counter() - t0, 1),
    }
    said, why = _why(readings, verdict, shaped)
    if keep_start:
        record["why"] = why
        logger.warning("guard: the starting model is kept: %s (guard: record keeps the adapted one)", why)
    elif worse:
        logger.warning("guard (record only): %s", why)
    else:
        logger.info("guard: the adapted model is kept (%s)", said)
    return GuardVerdict(keep=str(candidates.start) if keep_start else str(candidates.adapted), record=record)
