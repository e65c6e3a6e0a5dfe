"""Unlabelled target queries (a search log, or the queries of a BEIR split), and the guard that keeps a run from
training on the queries it is evaluated on.

``--target-queries`` takes three forms:

- ``DIR:SPLIT``: the queries judged in ``DIR/qrels/SPLIT.tsv``. Only the query-id column of that file is read: the
  documents and grades (the labels) are never parsed.
- ``DIR``: every query of the BEIR folder's ``queries.jsonl``.
- ``FILE``: a JSONL file with a ``text`` field (and optionally ``_id``), e.g. a search log.

``DIR`` may also be a Hub dataset id (``mteb/scifact``, ``BeIR/scifact``; :mod:`hf_cocodr.data.sources`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..utils import normalize_query
from .beir import (
    QUERIES_FILE,
    BEIRFormatError,
    check_text_field,
    iter_jsonl_records,
    jsonl_file,
    load_queries,
    parse_eval_spec,
)
from .sources import resolve_data

logger = logging.getLogger(__name__)

_SPEC = re.compile(r"^(?P<folder>.+):(?P<split>[A-Za-z0-9_.-]+)$")


@dataclass
class TargetQueries:
    """Query texts (and ids where the source has them) from one ``--target-queries`` source."""

    name: str
    texts: list[str]
    ids: list[str] = field(default_factory=list)
    folder: Path | None = None  # the BEIR folder they come from, if any (ids are comparable within one folder)


def _split_spec(spec: str) -> tuple[Path, str | None]:
    """``DIR:SPLIT`` -> (DIR, SPLIT) when DIR is a folder (or a Hub dataset: its cached BEIR folder, see
    :func:`~hf_cocodr.data.sources.resolve_data`); anything else -> (path, None)."""
    m = _SPEC.match(str(spec))
    if m and not Path(str(spec)).expanduser().exists():
        folder = Path(resolve_data(m["folder"], "--target-queries")).expanduser()
        if folder.is_dir():
            return folder, m["split"]
    return Path(resolve_data(str(spec), "--target-queries")).expanduser(), None


def target_query_folder(spec: str | os.PathLike) -> Path | None:
    """The BEIR folder a ``--target-queries`` source reads (``DIR`` or ``DIR:SPLIT``), resolved; ``None`` for a
    JSONL file."""
    path, _ = _split_spec(str(spec))
    return path.resolve() if path.is_dir() else None


def judged_query_ids(folder: Path, split: str) -> list[str]:
    """The query ids of ``qrels/SPLIT.tsv`` in file order, reading the first column only (the labels are never
    parsed)."""
    path = folder / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise ConfigError(f"target queries {folder}:{split}: {path} not found")
    seen: dict[str, None] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            first = raw.split(b"\t", 1)[0].strip()
            if lineno == 1 and first.lower() in (b"query-id", b"query_id", b"qid"):
                continue
            if first:
                seen.setdefault(first.decode("utf-8", "replace"), None)
    return list(seen)


def read_target_queries(spec: str | os.PathLike) -> TargetQueries:
    """The queries of one ``--target-queries`` source (see the module docstring); empty and blank texts are dropped,
    and a query repeated (compared by :func:`normalize_query`) is kept once, with a warning counting the copies."""
    return _dedupe(_read_target_queries(spec))


def _read_target_queries(spec: str | os.PathLike) -> TargetQueries:
    path, split = _split_spec(str(spec))
    if split is not None:
        qids = judged_query_ids(path, split)
        queries = load_queries(path)
        text_of = dict(zip(queries["_id"], queries["text"]))
        missing = [q for q in qids if q not in text_of]
        if missing:
            raise ConfigError(
                f"target queries {spec}: {len(missing)} judged query ids are not in "
                f"{jsonl_file(path, QUERIES_FILE)} (e.g. {missing[0]!r})"
            )
        keep = [q for q in qids if text_of[q] and text_of[q].strip()]
        return TargetQueries(f"{path.name}:{split}", [text_of[q] for q in keep], keep, path.resolve())
    if path.is_dir():
        queries = load_queries(path)
        pairs = [(i, t) for i, t in zip(queries["_id"], queries["text"]) if t and t.strip()]
        return TargetQueries(path.name, [t for _, t in pairs], [i for i, _ in pairs], path.resolve())
    if path.is_file():
        texts, ids = [], []
        for lineno, rec in iter_jsonl_records(path, "queries"):
            if "text" not in rec:
                raise BEIRFormatError(f"missing field 'text' (found {sorted(rec)}).", path, lineno)
            text = check_text_field(rec["text"], "text", path, lineno)
            if text.strip():
                texts.append(text)
                ids.append(str(rec.get("_id", "")))
        return TargetQueries(path.name, texts, ids if all(ids) else [], None)
    raise ConfigError(f"target queries {spec!r}: no such BEIR folder or JSONL file (nor a DIR:SPLIT)")


_norm = normalize_query
_WARNED: set[tuple[str, int, int]] = set()


def _dedupe(source: TargetQueries) -> TargetQueries:
    """``source`` with each query kept once (the first; compared by :func:`normalize_query`): copies of a query in one
    batch would be each other's in-batch negatives. A warning counts the copies dropped."""
    seen: set[str] = set()
    keep, blank = [], 0
    for i, text in enumerate(source.texts):
        key = normalize_query(text)
        if not key:  # only invisible characters: a blank query, dropped as those are
            blank += 1
        elif key not in seen:
            seen.add(key)
            keep.append(i)
    if len(keep) + blank < len(source.texts):
        said = (source.name, len(source.texts) - blank, len(keep))
        if said not in _WARNED:  # a source is read by several checks: one warning
            _WARNED.add(said)
            logger.warning(
                "target queries %s: %d of %d queries repeat an earlier one (case, punctuation, spacing and "
                "invisible characters ignored) and were dropped; %d distinct queries",
                source.name,
                len(source.texts) - blank - len(keep),
                len(source.texts) - blank,
                len(keep),
            )
    if len(keep) < len(source.texts):
        source.texts = [source.texts[i] for i in keep]
        source.ids = [source.ids[i] for i in keep] if source.ids else []
    return source


def refuse_eval_overlap(target_specs, eval_specs) -> None:
    """Refuse, before any work, target queries that are also queries of an ``--eval`` split: by id when both come
    from the same BEIR folder, by their words always, compared by :func:`normalize_query` (case, punctuation,
    apostrophes, spacing, compatibility forms and invisible format characters ignored). The error names the eval
    split and one shared query, so no run trains on the queries it is evaluated on."""
    sources = [read_target_queries(s) for s in target_specs or ()]  # a bad source fails here, evals or not
    if not sources or not eval_specs:
        return
    for spec in eval_specs:
        folder, split = parse_eval_spec(spec)
        folder = Path(folder).expanduser().resolve()
        eval_ids = judged_query_ids(folder, split)
        queries = load_queries(folder)
        text_of = dict(zip(queries["_id"], queries["text"]))
        eval_texts = {_norm(text_of[q]): q for q in eval_ids if q in text_of and text_of[q]}
        for src in sources:
            if src.folder is not None and src.folder == folder:
                shared = sorted(set(src.ids) & set(eval_ids))
                if shared:
                    raise ConfigError(
                        f"--target-queries {src.name} shares {len(shared)} queries with the --eval split "
                        f"{spec} (e.g. query {shared[0]!r}); a run must not train on its evaluation "
                        "queries: use another split of unlabelled queries"
                    )
            for text in src.texts:
                qid = eval_texts.get(_norm(text))
                if qid is not None:
                    raise ConfigError(
                        f"--target-queries {src.name} holds a query of the --eval split {spec} "
                        f"(query {qid!r}: {text[:60]!r}); a run must not train on its evaluation "
                        "queries: remove it or use another split"
                    )
