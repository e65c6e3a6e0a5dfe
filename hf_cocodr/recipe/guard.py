"""The label-free guard (:func:`guard_run`): before the recipe exports, the adapted model and the starting model rank
queries neither trained on, and the starting model is kept where the adapted one reads worse.

Two readings, each pooled over the target corpora (per-corpus figures are recorded beside):

- ``pseudo_queries``: the held-out pseudo-queries of ``OUT/queries/<corpus>.guard.jsonl`` (:mod:`.queries`: every
  kind alike, whatever mix trained, from documents no trained pseudo-query comes from), each with its source document
  as its one relevant document: nDCG@10 of the model's dense ranking of the corpus (a label the corpus gave for
  free); the reading of each kind is recorded beside;
- ``queries``: where the user gave target queries, the held-out share of them, scored against the hybrid teacher's
  ranking (its top 10 as the relevant set; the teacher the distillation ranked with, read from its cache): nDCG@10
  of the model's ranking, i.e. how much of the teacher's judgement the model carries to queries it never saw.

For each reading, the per-query difference adapted − start gives a mean and its standard error; the reading is
``worse`` where the mean is below −1 SE, ``better`` above +1 SE, else ``no difference``. The verdict rests on the
pseudo-queries' reading (:data:`DECIDES`); the queries' reading is recorded beside it.

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
READINGS = ("pseudo_queries", "queries")
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


def _teacher_top(run: RecipeRun, start, corpus, texts: list[str]) -> list[list[str]] | None:
    """The hybrid teacher's top :data:`DEPTH` for each text, from the teacher's cached indexes of ``corpus``; None
    where they are not cached (the distillation did not rank this corpus)."""
    from ..retrieval.hybrid import HYBRID_FILE, _corpus_ids_texts  # (the retrieval stack: torch, faiss, bm25s)
    from ..retrieval.teacher import teacher_cache_path, teacher_retriever

    ids, doc_texts = _corpus_ids_texts(corpus)
    batch = encode_batch_size(run.cfg)  # (the distillation's teacher encoding's: its cache is keyed by it)
    if not (
        teacher_cache_path(run.fps["model"], ids, doc_texts, run.encodings, batch_size=batch) / HYBRID_FILE
    ).is_file():
        return None
    fusion = DistillStage._fusion(run.cfg)
    hybrid, *_ = teacher_retriever(
        start, run.fps["model"], corpus, fusion=fusion, batch_size=batch, session=run.encodings
    )
    found, _ = hybrid.search(texts, DEPTH)
    return [list(r) for r in found]


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


def guard_run(run: RecipeRun) -> dict[str, Any] | None:
    """Read the guard (see the module docstring) for the model the stages left (``run.current``) against the
    starting model; with ``guard: on`` and a ``worse`` reading, ``run.current`` becomes the starting model. Returns
    the record (None where nothing trained or no query was held out)."""

    cfg = run.cfg
    entries = [q for q in run.queries if q.guard is not None]
    if cfg.guard == "off" or not entries or str(run.current) == str(run.model):
        return None
    t0 = time.perf_counter()
    batch = encode_batch_size(cfg)
    start, adapted = load_encoder(run.model), load_encoder(str(run.current))
    per_query: dict[str, dict[str, list[float]]] = {r: {"start": [], "adapted": []} for r in READINGS}
    corpora: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, dict[str, list[float]]] = {}  # the held-out pseudo-queries by kind (recorded, not decided on)
    for entry in entries:
        rows = _read_rows(entry.guard)
        pseudo = [r for r in rows if r.get("doc_id")]
        real = [r for r in rows if not r.get("doc_id")]
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
        if real:
            texts = [r["text"] for r in real]
            teacher = _teacher_top(run, start, entry.corpus, texts)
            if teacher is None:
                corpora[entry.name]["queries"] = {"skipped": "the teacher's indexes of this corpus are not cached"}
                continue
            scores = {}
            for name, model in (("start", start), ("adapted", adapted)):
                tops = ranker.top(model, texts)
                scores[name] = [ndcg_at_10(t, set(ref)) for t, ref in zip(tops, teacher)]
                per_query["queries"][name] += scores[name]
            corpora[entry.name]["queries"] = paired_reading(scores["start"], scores["adapted"])
    readings = {r: paired_reading(v["start"], v["adapted"]) for r, v in per_query.items() if v["start"]}
    kinds = {k: paired_reading(v["start"], v["adapted"]) for k, v in by_kind.items()}
    # the decision rests on the pseudo-queries' reading (their labels are the corpus's own) where the training did not
    # shape it; the queries' reading is recorded beside it, not decided on: against the teacher's top 10 it read a
    # distilled model worse on held-out queries where the labels read it better (docs/adaptation.md, "The label-free
    # guard")
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
        run.current = run.model
    elif worse:
        logger.warning("guard (record only): %s", why)
    else:
        logger.info("guard: the adapted model is kept (%s)", said)
    return record
