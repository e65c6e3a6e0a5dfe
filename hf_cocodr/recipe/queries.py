"""The queries a recipe run trains and guards on, per target corpus (:func:`prepare_queries`).

For each target corpus the run writes two files into ``OUT/queries`` (JSONL, ``_id`` / ``text`` / ``kind``, and
``doc_id`` for a pseudo-query):

- ``<corpus>.train.jsonl``: what the distillation trains on: the user's target queries routed to this corpus (all of
  them) and ``pseudo_queries`` pseudo-queries drawn from its documents (:mod:`hf_cocodr.retrieval.pseudo_queries`;
  their count split among the corpora in proportion to their sizes);
- ``<corpus>.guard.jsonl``: what the label-free guard (:mod:`hf_cocodr.recipe.guard`) reads and nothing trains on:
  ``guard_queries`` pseudo-queries (at most one for every 4 documents) of every kind alike
  (:data:`~hf_cocodr.retrieval.pseudo_queries.GUARD_MIX`, whatever mix trains), from documents no trained pseudo-query
  comes from.

The draw is seeded by the run's ``seed``, so a resumed run writes the same files. No query of an ``--eval`` split is
ever drawn as a pseudo-query.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..utils import atomic_write_text, path_name, resolved_path

if TYPE_CHECKING:
    from .context import RecipeRun

logger = logging.getLogger("hf_cocodr.recipe")

QUERIES_DIR = "queries"
GUARD_DOC_SHARE = 4  # the guard's held-out pseudo-queries: at most one for every 4 documents of the corpus
CLOZE_DOCS = 500  # the guard's clozes: at most one for each of this many documents no training read


@dataclass
class CorpusQueries:
    """The query files of one target corpus (see the module docstring) and what they hold."""

    corpus: Any
    name: str
    train: Path | None = None
    guard: Path | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # what the training file holds: the user's sources by name, and the pseudo-queries


def wants_queries(cfg) -> bool:
    """Whether the run draws or holds out queries: the distillation runs, or the guard reads."""
    return bool(cfg.target_queries) or int(cfg.pseudo_queries or 0) > 0 or cfg.guard != "off"


def corpus_names(target_corpora) -> list[str]:
    """A file-name stem per target corpus (its folder's name; ``-2``, ``-3``, ... after a name already taken)."""
    names: dict[str, int] = {}
    out = []
    for corpus in target_corpora:
        if isinstance(corpus, (str, os.PathLike)):
            path = resolved_path(corpus)
            name = path_name(path.parent if path.name in ("corpus.jsonl", "corpus.jsonl.gz") else path)
        else:
            name = "dataset"
        names[name] = names.get(name, 0) + 1
        out.append(name if names[name] == 1 else f"{name}-{names[name]}")
    return out


def corpus_dataset(corpus):
    """A target corpus as a dataset: a BEIR folder's corpus, a ``corpus.jsonl`` file, or the dataset given."""
    from ..data.beir import _load_jsonl_dataset, load_corpus

    if isinstance(corpus, (str, os.PathLike)):
        path = Path(corpus)
        return _load_jsonl_dataset(path, "corpus") if path.is_file() else load_corpus(path)
    return corpus


def _columns(corpus) -> tuple[list[str], list[str], list[str]] | None:
    """``(ids, titles, bodies)`` of a target corpus, or None for one without document ids (plain texts)."""
    from ..data.beir import BEIRFormatError

    try:
        ds = corpus_dataset(corpus)
        if "_id" not in ds.column_names or "text" not in ds.column_names:
            return None
    except BEIRFormatError:
        return None
    ids = [str(x) for x in ds["_id"]]
    titles = list(ds["title"]) if "title" in ds.column_names else [""] * len(ids)
    return ids, [t or "" for t in titles], [t or "" for t in ds["text"]]


def _eval_texts(evals) -> list[str]:
    """The query texts of every ``--eval`` split (never drawn as pseudo-queries)."""
    from ..data.beir import load_queries, parse_eval_spec
    from ..data.target_queries import judged_query_ids

    out = []
    for spec in evals:
        folder, split = parse_eval_spec(spec)
        folder = Path(folder).expanduser()
        ids = set(judged_query_ids(folder, split))
        queries = load_queries(folder)
        out += [t for i, t in zip(queries["_id"], queries["text"]) if i in ids and t]
    return out


def _token_counter(model: str):
    """The starting model's token count of a text (special tokens left out), or None when it cannot be read."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model))
    except Exception as e:  # (a Hub id offline, an odd folder): words stand in for tokens
        logger.info("pseudo-queries: the model's tokenizer could not be loaded (%s); lengths are bounded in words", e)
        return None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def _records(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    text = _records(rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)


def split_counts(total: int, sizes: list[int]) -> list[int]:
    """``total`` split in proportion to ``sizes`` (largest remainders; earlier corpora first on ties)."""
    whole = sum(sizes)
    if total <= 0 or whole <= 0:
        return [0] * len(sizes)
    share = [total * s / whole for s in sizes]
    out = [math.floor(x) for x in share]
    for i in sorted(range(len(sizes)), key=lambda i: (-(share[i] - out[i]), i))[: total - sum(out)]:
        out[i] += 1
    return out


def prepare_queries(run: RecipeRun) -> list[CorpusQueries]:
    """Draw, hold out and write the run's queries (see the module docstring); returns each corpus's files."""
    from ..data.teacher import route_queries  # (numpy, pyarrow: loaded where a run starts)

    cfg = run.cfg
    if not run.target_corpora or not wants_queries(cfg):
        return []
    routed = route_queries(cfg.target_queries, run.target_corpora) if cfg.target_queries else []
    exclude = _eval_texts(run.evals)
    counter = _token_counter(run.model)
    columns = [_columns(c) for c in run.target_corpora]
    n_pseudo = split_counts(int(cfg.pseudo_queries or 0), [len(c[0]) if c else 0 for c in columns])
    out = []
    for corpus, name, cols, n_train in zip(run.target_corpora, corpus_names(run.target_corpora), columns, n_pseudo):
        mine = [src for c, src in routed if c is corpus]
        real = [
            {"_id": f"query:{src.name}:{i}", "text": t, "kind": "query"}
            for src in mine
            for i, t in enumerate(src.texts)
        ]
        if cols is None:  # plain texts: nothing to draw from, nothing to find
            if n_train or real:
                raise ConfigError(f"pseudo-queries and the distillation need document ids: {corpus} has none")
            continue
        entry = CorpusQueries(corpus, name, label=", ".join(src.name for src in mine))
        out.append(_corpus_queries(run, entry, cols, real, n_train, exclude, counter))
    return out


def _corpus_queries(run, entry: CorpusQueries, cols, real: list[dict], n_train: int, exclude, counter):
    """One target corpus's query files (see :func:`prepare_queries`): ``real`` the user's queries routed to it,
    ``n_train`` pseudo-queries to train on; the held-out ones beside."""
    from ..retrieval.pseudo_queries import GUARD_MIX, PseudoQueryDrawer, parse_mix

    cfg = run.cfg
    # the guard sets apart at most a quarter of the corpus's documents (a small corpus keeps the rest to train on)
    n_guard = min(int(cfg.guard_queries), len(cols[0]) // GUARD_DOC_SHARE) if cfg.guard != "off" else 0
    if cfg.guard != "off" and not n_guard:
        logger.warning(
            "guard: nothing of %s is held out (%s): the guard reads no query of it",
            entry.name,
            f"{len(cols[0])} documents, fewer than the {GUARD_DOC_SHARE} it holds one pseudo-query out of"
            if len(cols[0]) < GUARD_DOC_SHARE
            else "guard_queries 0",
        )
    pseudo_train, pseudo_guard = [], []
    if n_train or n_guard:
        drawer = PseudoQueryDrawer(*cols, seed=cfg.seed, count_tokens=counter)
        # the guard's first, every kind alike (so it reads more than what trains), from documents set apart
        pseudo_guard = drawer.draw(n_guard, GUARD_MIX, exclude=exclude, salt=1) if n_guard else []
        mix = None if cfg.pseudo_query_mix == "auto" else cfg.pseudo_query_mix
        held_docs, held_texts = {p.doc_id for p in pseudo_guard}, [p.text for p in pseudo_guard]
        if n_train:
            pseudo_train = drawer.draw(n_train, parse_mix(mix), exclude=[*exclude, *held_texts], skip_docs=held_docs)

    def row(p, i):
        return {"_id": f"pseudo:{p.kind}:{p.doc_id}:{i}", "text": p.text, "kind": p.kind, "doc_id": p.doc_id}

    clozes = _held_out_clozes(cols, {p.doc_id for p in pseudo_train}, cfg.seed) if n_guard else []
    train_rows = real + [row(p, i) for i, p in enumerate(pseudo_train)]
    guard_rows = [row(p, i) for i, p in enumerate(pseudo_guard)]
    guard_rows += [{"_id": f"cloze:{c.doc_id}", **c.as_row()} for c in clozes]
    folder = run.out / QUERIES_DIR
    if train_rows:
        entry.train = folder / f"{entry.name}.train.jsonl"
        _write(entry.train, train_rows)
    if guard_rows:
        entry.guard = folder / f"{entry.name}.guard.jsonl"
        _write(entry.guard, guard_rows)
    kinds: dict[str, int] = {}
    for p in pseudo_train:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    if pseudo_train:
        entry.label = f"{entry.label} + " * bool(entry.label) + f"{len(pseudo_train)} pseudo-queries of {entry.name}"
    entry.counts = {
        "train_queries": len(real),
        "train_pseudo_queries": len(pseudo_train),
        "train_pseudo_kinds": kinds,
        "guard_pseudo_queries": len(pseudo_guard),
        "guard_clozes": len(clozes),
    }
    logger.info(
        "queries for %s: %d of the user's and %d pseudo-queries (%s) to train on; %d pseudo-queries and %d clozes "
        "held out for the guard",
        entry.name,
        len(real),
        len(pseudo_train),
        ", ".join(f"{k} {v}" for k, v in kinds.items()) or "none",
        len(pseudo_guard),
        len(clozes),
    )
    return entry


def _held_out_clozes(cols, trained_docs: set[str], seed: int) -> list:
    """The guard's clozes (:func:`~hf_cocodr.retrieval.held_out.draw_clozes`): one for each of up to
    :data:`CLOZE_DOCS` documents no trained pseudo-query comes from, taken in a seeded order."""
    import numpy as np

    from ..data.beir import doc_text
    from ..retrieval.held_out import draw_clozes

    ids, titles, bodies = cols
    free = [r for r in np.random.default_rng([seed, 31]).permutation(len(ids)).tolist() if ids[r] not in trained_docs]
    texts = [doc_text(t, b) for t, b in zip(titles, bodies)]
    clozes = []
    for start in range(0, len(free), CLOZE_DOCS):  # (some documents give none: one sentence, too few words left)
        clozes += draw_clozes(ids, texts, free[start : start + CLOZE_DOCS], seed)
        if len(clozes) >= CLOZE_DOCS:
            break
    return clozes[:CLOZE_DOCS]


def guard_not_read(run: RecipeRun) -> dict[str, Any]:
    """The guard's state where it read nothing (:func:`~hf_cocodr.recipe.guard.guard_run` gave no reading), for the
    log and ``recipe.json``: ``{"mode", "verdict": "not read", "why"}``."""
    cfg = run.cfg
    if cfg.guard == "off":
        why = "guard: off"
    elif str(run.current) == str(run.model):
        why = "no stage changed the starting model: nothing to compare"
    elif not run.target_corpora:
        why = "no target corpus to hold queries out of"
    else:
        small = [
            q.name
            for q in run.queries
            if not q.counts.get("guard_pseudo_queries") and not q.counts.get("guard_queries")
        ]
        if int(cfg.guard_queries) == 0:
            why = "guard_queries 0: no query is held out"
        elif small or not run.queries:
            named = ", ".join(small) or ", ".join(corpus_names(run.target_corpora))
            why = (
                f"nothing could be held out of {named}: a corpus of fewer than {GUARD_DOC_SHARE} documents (or "
                "without document ids) holds none"
            )
        else:
            why = "no query was held out"
    return {"mode": cfg.guard, "verdict": "not read", "why": why}


def distill_sources(run: RecipeRun) -> list:
    """What the distillation trains on: each corpus's training file pinned to its corpus
    (:func:`~hf_cocodr.data.teacher.route_queries`); the user's ``--target-queries`` as given where the run wrote no
    files (no target corpus to route them to)."""
    files = [(str(q.train), q.corpus, q.label) for q in run.queries if q.train is not None]
    return files if run.queries else list(run.cfg.target_queries)


def hybrid_queries(corpus, specs) -> list[str] | None:
    """The ``--target-queries`` given from the BEIR folder of ``corpus`` (``DIR`` or ``DIR:SPLIT``): the queries its
    hybrid will rank, which its fusion fit is calibrated to (their text only); ``None`` when none were given (or the
    corpus is a dataset in memory: no folder of its own)."""
    from ..data.target_queries import read_target_queries, target_query_folder

    if not isinstance(corpus, (str, os.PathLike)):
        return None
    here = Path(corpus).expanduser().resolve()
    texts = [t for spec in specs or () if target_query_folder(spec) == here for t in read_target_queries(spec).texts]
    return texts or None
