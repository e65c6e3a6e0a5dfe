"""The label-free guard (:func:`guard_run`): before the recipe exports, the adapted model and the starting model rank
queries neither trained on, and the adapted model is exported only where the guard can show it is better.

The guard is a function of the run and its two candidates (:class:`Candidates`: the starting and the adapted model)
that returns its verdict (:class:`GuardVerdict`: the model to export and the record); the runner acts on it.

Its readings, pooled over the target corpora (per-corpus figures are recorded beside), are read on the held-out
documents of ``OUT/queries/<corpus>.guard.jsonl`` (:mod:`.queries`: documents no trained pseudo-query comes from):

- ``cloze`` (decided on): each held-out document's cloze (:mod:`~hf_cocodr.retrieval.held_out`), one of its sentences
  with about half of the content words its rest also holds left out, against the rest of the document (the corpus
  searched with that document replaced by its rest): nDCG@10 of the dense model's ranking. Not lexical by
  construction (BM25 and a model imitating it lose the shared words), and not shaped by the training (no trained
  pseudo-query comes from these documents, none is a sentence of this form);
- ``cloze_hybrid`` (decided on): the same clozes ranked by each model's hybrid with BM25 (each with the fusion its
  saved hybrid gets: the start's, fitted to the corpus without labels, which a query-side model keeps,
  :mod:`.fusions`): a user who serves the hybrid must not get a worse one;
- ``pseudo_queries`` (recorded, not decided on): the held-out pseudo-queries of every kind alike (spans, keywords,
  titles, sentences), each with its source document: they are made of the document's own words, the task the
  distillation trains toward, and read nearly every trained model ``better`` (docs/adaptation.md, "The guard").

For each reading the per-query difference adapted − start gives a mean and its standard error; the reading's own
verdict is ``worse`` where the mean is below −1 SE, ``better`` above +1 SE, else ``no difference``. The guard's
verdict: ``worse`` where a decided reading is below −:data:`VETO_SE` standard errors; ``better`` where ``cloze`` is
better (above +1 SE) and no decided reading is worse so; else ``unverified`` (the guard cannot tell: no difference
beyond the noise, or nothing held out). A veto needs two standard errors where a gain needs one because it is a second
test: two readings each vetoing at one standard error would, between two models that rank alike, keep the start in
about three runs of ten whatever ``cloze`` read. With ``guard: on`` (the default) the recipe exports the
adapted model only on ``better`` and keeps the starting model otherwise, saying why in one line; ``guard: record``
reads and records only. Where the training shaped the readings (:func:`shaped_readings`: the document side trained
on pseudo-queries of the corpus, the very task the held-out readings test) the verdict is ``unverified``. The
readings land in ``recipe.json`` (``guard``) and on the model card, whatever it decides.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..modeling.loading import load_encoder
from ..retrieval.held_out import Cloze, HeldOutView, paired
from ..retrieval.session import EncodingSession
from ..utils import preserved_rng_state
from .queries import corpus_dataset, hybrid_queries
from .settings import encode_batch_size
from .stages.distill import DistillStage

if TYPE_CHECKING:
    from .context import RecipeRun

logger = logging.getLogger("hf_cocodr.recipe")

DEPTH = 10  # nDCG@10
READINGS = ("cloze", "cloze_hybrid", "pseudo_queries")
DECIDES = ("cloze", "cloze_hybrid")  # the readings the verdict rests on (the pseudo-queries' is recorded beside)
VOUCHES = "cloze"  # the reading that must read the adapted model better for it to be exported
VETO_SE = 2.0  # a decided reading below −VETO_SE standard errors keeps the start (its own verdict is at one SE)


def ndcg_at_10(ranked: list[str], relevant: set[str] | list[str]) -> float:
    """nDCG@10 of ``ranked`` (best first) for binary ``relevant`` documents."""
    relevant = set(relevant)
    if not relevant:
        return 0.0
    dcg = sum(1.0 / math.log2(r + 2) for r, d in enumerate(ranked[:DEPTH]) if d in relevant)
    ideal = sum(1.0 / math.log2(r + 2) for r in range(min(DEPTH, len(relevant))))
    return dcg / ideal


# the per-query comparison of two models (adapted − start: mean, standard error, verdict at one standard error)
paired_reading = paired


def vetoes(reading: dict[str, Any]) -> bool:
    """Whether a decided reading keeps the start: its mean difference below −:data:`VETO_SE` standard errors."""
    return "difference" in reading and reading["difference"] < -VETO_SE * reading["se"]


def decide(readings: dict[str, dict[str, Any]], shaped: dict[str, str] | None = None) -> str:
    """``worse`` where a reading the verdict rests on (:data:`DECIDES`, less the ``shaped`` ones) vetoes
    (:func:`vetoes`); ``better`` where :data:`VOUCHES` reads the adapted model better (and it was not shaped); else
    ``unverified``: no difference beyond the noise, no reading (nothing held out), or only readings the training
    shaped (:func:`shaped_readings`)."""
    shaped = shaped or {}
    deciding = [r for r in DECIDES if r in readings and r not in shaped]
    if any(vetoes(readings[r]) for r in deciding):
        return "worse"
    if VOUCHES in deciding and readings[VOUCHES].get("verdict") == "better":
        return "better"
    return "unverified"


def shaped_readings(cfg, counts: list[dict[str, Any]]) -> dict[str, str]:
    """The guard's readings the run's training shaped, each with why (recorded, not decided on): every held-out
    reading where the distillation trained the document side (``distill_side: full``) on pseudo-queries
    (``counts``: each target corpus's query counts, :class:`~hf_cocodr.recipe.queries.CorpusQueries`): the model then
    learnt to find a document from a crop, a keyword set or a title of it, the very task the held-out readings test,
    and they read it ``better`` whatever the labels say."""
    pseudo = sum(int(c.get("train_pseudo_queries", 0)) for c in counts)
    if pseudo and cfg.distill_side == "full" and DistillStage().enabled(cfg):
        why = (
            "the distillation trained the document side on pseudo-queries drawn from the corpus, the task the "
            'held-out readings test (docs/adaptation.md, "The guard")'
        )
        return {r: why for r in READINGS}
    return {}


def read_rows(path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, split at newlines only: a document's text may hold a character ``str.splitlines``
    also breaks at (U+0085, U+2028, a form feed, ...), which JSON leaves unescaped when it writes non-ASCII text."""
    with open(path, encoding="utf-8", newline="") as f:
        return [json.loads(line) for line in f.read().split("\n") if line.strip()]


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


def _said(readings: dict[str, dict[str, Any]]) -> str:
    """The readings in one line."""
    return "; ".join(
        f"{r}: {v['difference']:+.4f} ± {v['se']} ({v['queries']} queries, {v['verdict']})"
        if "difference" in v
        else f"{r}: {v['verdict']} ({v.get('queries', 0)} queries)"
        for r, v in readings.items()
    )


def _why(readings: dict[str, dict[str, Any]], verdict: str, shaped: dict[str, str]) -> str:
    """Why the verdict is what it is, in one line."""
    said = _said(readings)
    if verdict == "worse":
        return f"the adapted model reads worse than the starting model beyond {VETO_SE:g} standard errors ({said})"
    if verdict == "better":
        return (
            "the adapted model reads better than the starting model on the held-out clozes, and no decided reading "
            f"worse beyond {VETO_SE:g} standard errors ({said})"
        )
    if shaped:
        return f"no reading can vouch for the adapted model: {next(iter(shaped.values()))} ({said})"
    if VOUCHES not in readings:
        return "no cloze could be held out of the target corpora: the guard cannot show a gain"
    return f"the guard cannot show a gain beyond one standard error on the held-out clozes ({said})"


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
    guard is off or nothing was held out). It changes nothing of the run, its random states included (what it
    encodes and fits draws from them): the runner acts on the verdict."""
    with preserved_rng_state():
        return _guard_run(run, candidates)


def _guard_run(run: RecipeRun, candidates: Candidates) -> GuardVerdict | None:

    cfg = run.cfg
    entries = [q for q in run.queries if q.guard is not None]
    if cfg.guard == "off" or not entries or str(candidates.adapted) == str(candidates.start):
        return None
    t0 = time.perf_counter()
    batch = encode_batch_size(cfg)
    models = {"start": load_encoder(candidates.start), "adapted": load_encoder(str(candidates.adapted))}
    pooled: dict[str, dict[str, list[float]]] = {r: {"start": [], "adapted": []} for r in READINGS}
    corpora: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, dict[str, list[float]]] = {}  # the held-out pseudo-queries by kind (recorded, not decided on)
    for entry in entries:
        rows = read_rows(entry.guard)
        pseudo = [r for r in rows if r.get("doc_id") and r.get("kind") != "cloze"]
        clozes = [Cloze.from_row(r) for r in rows if r.get("kind") == "cloze"]
        here: dict[str, dict[str, list[float]]] = {}
        if pseudo:
            ranker = _Ranker(corpus_dataset(entry.corpus), batch, run.encodings)
            texts = [r["text"] for r in pseudo]
            for name, model in models.items():
                scores = [ndcg_at_10(t, {r["doc_id"]}) for t, r in zip(ranker.top(model, texts), pseudo)]
                here.setdefault("pseudo_queries", {})[name] = scores
                for r, v in zip(pseudo, scores):
                    by_kind.setdefault(r.get("kind", "?"), {"start": [], "adapted": []})[name].append(v)
        if clozes:
            for reading, per_model in _cloze_scores(run, entry, clozes, models, batch).items():
                here[reading] = per_model
        corpora[entry.name] = {r: paired(v["start"], v["adapted"]) for r, v in here.items()}
        for r, v in here.items():
            for name in ("start", "adapted"):
                pooled[r][name] += v[name]
    readings = {r: paired(v["start"], v["adapted"]) for r, v in pooled.items() if v["start"]}
    kinds = {k: paired(v["start"], v["adapted"]) for k, v in by_kind.items()}
    shaped = shaped_readings(cfg, [q.counts for q in run.queries])
    verdict = decide(readings, shaped)
    keep_start = verdict != "better" and cfg.guard == "on"
    why = _why(readings, verdict, shaped)
    record = {
        "mode": cfg.guard,
        "readings": readings,
        "corpora": corpora,
        "pseudo_query_kinds": kinds,
        "decided_on": [r for r in DECIDES if r in readings and r not in shaped],
        "veto_se": VETO_SE,
        **({"not_decided": shaped} if shaped else {}),
        "verdict": verdict,
        "kept": "start" if keep_start else "adapted",
        "why": why,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if keep_start:
        logger.warning("guard: the starting model is kept: %s (guard: record keeps the adapted one)", why)
    elif verdict != "better":
        logger.warning("guard (record only): %s", why)
    else:
        logger.info("guard: the adapted model is kept: %s", why)
    return GuardVerdict(keep=str(candidates.start) if keep_start else str(candidates.adapted), record=record)


def _cloze_scores(run: RecipeRun, entry, clozes: list[Cloze], models: dict, batch: int) -> dict[str, dict]:
    """Each model's per-cloze nDCG@10 on one corpus: ``{"cloze": {model: [...]}, "cloze_hybrid": {model: [...]}}``,
    the clozes' dropped sentences ranked over the corpus with their documents replaced by their rests, dense and
    fused with BM25 (each model's hybrid as the run saves it: the start's fusion fitted to the corpus without labels,
    calibrated to the target queries given from its folder; a query-side model keeps it, :mod:`.fusions`). A
    query-side model's documents go through its starting model's route: the two share one view of the corpus."""
    from ..retrieval.encoding import encode_documents  # (the retrieval stack: torch, faiss, bm25s)
    from ..retrieval.encoding_cache import document_encoder_key
    from ..retrieval.hybrid import HybridRetriever, _corpus_ids_texts

    ids, texts = _corpus_ids_texts(entry.corpus)
    queries = [c.dropped for c in clozes]
    views: dict[str, HeldOutView] = {}
    out: dict[str, dict[str, list[float]]] = {"cloze": {}, "cloze_hybrid": {}}
    fusions: dict[str, Any] = {}
    for name, model in models.items():  # (the start first: a query-side model's hybrid keeps its fusion)
        key = document_encoder_key(model)
        hybrid = HybridRetriever.build(
            model,
            entry.corpus,
            fusion=fusions.get(key),
            queries=hybrid_queries(entry.corpus, run.cfg.target_queries),
            batch_size=batch,
            session=run.encodings,
        )
        fusions.setdefault(key, hybrid.fusion)
        if key not in views:
            docs = hybrid.meta.get("doc_max_length")

            def encode(rests, model=model, docs=docs):
                return encode_documents(model, rests, batch_size=batch, max_length=docs, session=run.encodings)

            views[key] = HeldOutView(texts, hybrid.embeddings, ids, clozes, encode)
        view = views[key]
        vectors = hybrid.encode_queries(queries, batch_size=batch)
        out["cloze"][name] = view.dense_scores(vectors)
        out["cloze_hybrid"][name] = view.hybrid_scores(queries, vectors, hybrid.fusion)
    return out
