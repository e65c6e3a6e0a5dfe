"""Loading and validating BEIR-format folders (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).

Every line is checked once; a bad line raises :class:`BEIRFormatError` naming the file and the line. The
validated corpus and queries are written to an Arrow file in a cache (keyed by path, size and modification
time) and memory-mapped as a :class:`datasets.Dataset`, so a multi-gigabyte corpus never sits in Python lists
and a second load is instant. A damaged cache file is rebuilt with a warning naming it, a write that fails leaves
nothing, and the cache file of a corpus file that changed replaces the one of its earlier contents.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BEIRFormatError, ConfigError  # defined with the other input errors (re-exported)
from ..rundir.file_hash import file_sha256
from ..rundir.run_record import CORPUS_FILE, QRELS_DIR, QUERIES_FILE, jsonl_file  # the files a fingerprint covers
from ..storage import cache_dir, remove_entry, staged_file
from .sources import data_label, resolve_data

logger = logging.getLogger(__name__)

_BATCH_ROWS = 8192
_CACHE_VERSION = "2"  # 2: the row count is in the schema metadata (a truncated file is rebuilt)


@dataclass
class BEIRData:
    """A BEIR split: ``corpus`` and ``queries`` are Arrow-backed datasets, ``qrels`` maps query → doc → grade."""

    corpus: object  # datasets.Dataset with columns _id, title, text, metadata (JSON string)
    queries: object  # datasets.Dataset with columns _id, text, metadata (JSON string)
    qrels: dict[str, dict[str, int]]
    folder: Path
    split: str | None
    num_empty_docs: int = 0

    def __iter__(self):  # allows ``corpus, queries, qrels = load_beir(...)``
        return iter((self.corpus, self.queries, self.qrels))


def _cache_dir() -> Path:
    return cache_dir("beir")


def _cache_key(path: Path, kind: str) -> str:
    """``<where>-<contents>``: a hash of the file's place (and the cache version), then of its contents (every byte:
    :func:`~hf_cocodr.rundir.file_hash.file_sha256`, memoized), so a file rewritten in place at the same size and
    time is read again."""
    where = f"{_CACHE_VERSION}|{kind}|{path.resolve()}"
    return (
        hashlib.sha256(where.encode()).hexdigest()[:12]
        + "-"
        + hashlib.sha256(f"{where}|{file_sha256(path)}".encode()).hexdigest()[:12]
    )


def _prune_older_entries(cache_file: Path) -> None:
    """Remove the cache files of the same corpus or queries file built from its earlier contents, and those of the
    earlier naming (one 24-digit key; no version reads them any more)."""
    kind, where, _ = cache_file.stem.split("-")
    for p in cache_file.parent.iterdir():
        older = p.name.startswith(f"{kind}-{where}-") and p.name != cache_file.name
        legacy = re.fullmatch(r"(corpus|queries)-[0-9a-f]{24}(\.arrow|\.\d+\.tmp)", p.name)
        if older or legacy:
            remove_entry(p)
            logger.info("removed the cache file %s (an earlier version of the data or of the cache)", p)


def _decode_line(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BEIRFormatError(
            f"not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 4]!r}); re-encode the file as UTF-8.",
            path,
            lineno,
        ) from None


def open_jsonl(path: Path):
    """A JSONL file opened for reading bytes; ``.gz`` files are decompressed on the fly (how BEIR's downloads come)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def check_text_field(value, field: str, path: Path, lineno: int) -> str:
    """A text field of a JSONL record as a string (``None`` reads as empty); anything else, or text that cannot be
    written as UTF-8 (a lone surrogate from a ``\\ud800`` escape), is refused naming the file and the line."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BEIRFormatError(
            f"{field!r} must be a string, got {type(value).__name__} ({str(value)[:40]!r}).", path, lineno
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BEIRFormatError(
            f"{field!r} holds a lone surrogate at character {e.start} (an unpaired \\u escape); "
            "fix or drop that character.",
            path,
            lineno,
        ) from None
    return value


def iter_jsonl_records(path: Path, kind: str):
    """Yield ``(line_number, record)`` for every non-blank line, with clear errors."""
    try:
        f = open_jsonl(path)
    except OSError as e:
        raise BEIRFormatError(f"cannot read the {kind} file ({e.strerror or e}).", path) from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            line = _decode_line(raw, path, lineno).strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                snippet = line[:80] + ("..." if len(line) > 80 else "")
                raise BEIRFormatError(
                    f"malformed JSON ({e.msg} at column {e.colno}): {snippet!r}. Each line of a BEIR {kind} file "
                    'must be one JSON object such as {"_id": "d1", "title": "", "text": "..."}.',
                    path,
                    lineno,
                ) from None
            if not isinstance(rec, dict):
                raise BEIRFormatError(f"expected a JSON object, got {type(rec).__name__}.", path, lineno)
            yield lineno, rec


def _build_table(path: Path, kind: str) -> pa.Table:
    """Validate a corpus/queries JSONL file and return it as an Arrow table (built in record batches)."""
    with_title = kind == "corpus"
    names = ["_id", "title", "text", "metadata", "line"] if with_title else ["_id", "text", "metadata", "line"]
    schema = pa.schema([(n, pa.int64() if n == "line" else pa.string()) for n in names])
    batches: list[pa.RecordBatch] = []
    cols: dict[str, list] = {n: [] for n in names}

    def flush():
        if cols["_id"]:
            batches.append(pa.RecordBatch.from_pydict(cols, schema=schema))
            for v in cols.values():
                v.clear()

    for lineno, rec in iter_jsonl_records(path, kind):
        for field in ("_id", "text"):
            if field not in rec:
                alt = [k for k in ("id", "doc_id", "docid", "query_id", "contents", "body", "abstract") if k in rec]
                hint = f" (found {alt!r}: rename to '_id'/'text')" if alt else ""
                raise BEIRFormatError(
                    f"missing required field {field!r}{hint}; keys present: {sorted(rec)}.", path, lineno
                )
        _id = rec["_id"]
        if isinstance(_id, int) and not isinstance(_id, bool):
            _id = str(_id)
        if not isinstance(_id, str) or not _id.strip():
            raise BEIRFormatError(f"'_id' must be a non-empty string, got {rec['_id']!r}.", path, lineno)
        text = check_text_field(rec["text"], "text", path, lineno)
        _id = check_text_field(_id, "_id", path, lineno)
        cols["_id"].append(_id)
        if with_title:
            cols["title"].append(check_text_field(rec.get("title"), "title", path, lineno))
        cols["text"].append(text)
        meta = rec.get("metadata")
        cols["metadata"].append(json.dumps(meta, ensure_ascii=False) if meta else "{}")
        cols["line"].append(lineno)
        if len(cols["_id"]) >= _BATCH_ROWS:
            flush()
    flush()
    table = pa.Table.from_batches(batches, schema=schema)
    if table.num_rows == 0:
        raise BEIRFormatError(
            f"the {kind} file is empty (no JSON lines). A BEIR folder needs at least one record.", path
        )
    ids = table.column("_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        seen: dict[str, int] = {}
        for _id, line in zip(ids.to_pylist(), table.column("line").to_pylist()):
            if _id in seen:
                raise BEIRFormatError(
                    f"duplicate _id {_id!r} (first seen on line {seen[_id]}); ids must be unique.", path, line
                )
            seen[_id] = line
    return table


def _load_jsonl_dataset(path: Path, kind: str):
    """Validated, cached, memory-mapped dataset for a corpus or queries file."""
    import datasets

    if not path.is_file():
        raise BEIRFormatError(
            f"{kind} file not found. A BEIR folder holds corpus.jsonl, queries.jsonl and qrels/.", path
        )
    cache_file = _cache_dir() / f"{kind}-{_cache_key(path, kind)}.arrow"
    ds = _read_cache(cache_file, path)
    if ds is None:
        table = _build_table(path, kind)
        schema = table.schema.with_metadata({b"num_rows": str(table.num_rows).encode()})
        with (
            staged_file(cache_file) as tmp,
            pa.OSFile(str(tmp), "wb") as sink,
            pa.ipc.new_stream(sink, schema) as writer,
        ):
            writer.write_table(table.replace_schema_metadata(schema.metadata), max_chunksize=_BATCH_ROWS)
        del table
        _prune_older_entries(cache_file)
        ds = datasets.Dataset.from_file(str(cache_file))
    return ds


def _read_cache(cache_file: Path, source: Path):
    """The cached dataset, or None when there is no cache file or it is truncated or corrupt (it is then rebuilt)."""
    import datasets

    if not cache_file.exists():
        return None
    try:
        with pa.memory_map(str(cache_file)) as f:
            expected = int(pa.ipc.open_stream(f).schema.metadata[b"num_rows"])
        ds = datasets.Dataset.from_file(str(cache_file))
        if ds.num_rows == expected:
            return ds
        problem = f"{ds.num_rows} of {expected} rows"
    except (pa.ArrowException, OSError, KeyError, TypeError, ValueError) as e:
        problem = " ".join(str(e).split()) or type(e).__name__
    logger.warning("cache file %s is truncated or corrupt (%s); rebuilding it from %s", cache_file, problem, source)
    remove_entry(cache_file)
    return None


def _check_folder(folder) -> Path:
    """The BEIR folder of a source: a local folder, or the cached folder of a Hub dataset id or a ``DatasetDict``
    (:func:`~hf_cocodr.data.sources.resolve_data`)."""
    folder = Path(resolve_data(folder)).expanduser()
    if not folder.is_dir():
        raise BEIRFormatError(
            "BEIR folder not found (expected a directory with corpus.jsonl, queries.jsonl and qrels/<split>.tsv).",
            folder,
        )
    check_not_datasets_folder(folder)
    return folder


def check_not_datasets_folder(path: str | os.PathLike, flag: str | None = None) -> None:
    """Refuse a folder written by ``datasets``' ``save_to_disk`` (it has no ``corpus.jsonl``) with the way to convert
    it, so the mistake surfaces before any model loads rather than as "corpus.jsonl not found"."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or jsonl_file(folder, CORPUS_FILE).is_file():
        return
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file() and any(folder.glob("*.arrow")):
        given = f"given as {flag}, this" if flag else "this"
        raise BEIRFormatError(
            f"{given} is a `datasets` folder (written by save_to_disk), not a BEIR folder. hf_cocodr reads BEIR folders "
            "(corpus.jsonl, queries.jsonl, qrels/<split>.tsv) and JSONL files; write one with "
            "`datasets.load_from_disk(...).to_json('corpus.jsonl')` (columns _id, title, text).",
            folder,
        )


def load_corpus(folder):
    """The validated corpus of a BEIR folder as a memory-mapped dataset (``_id``, ``title``, ``text``, ...)."""
    folder = _check_folder(folder)
    return _load_jsonl_dataset(jsonl_file(folder, CORPUS_FILE), "corpus")


def load_queries(folder):
    """The validated queries of a BEIR folder as a memory-mapped dataset (``_id``, ``text``, ...)."""
    folder = _check_folder(folder)
    return _load_jsonl_dataset(jsonl_file(folder, QUERIES_FILE), "queries")


def available_splits(folder: str | os.PathLike) -> list[str]:
    qdir = Path(folder) / QRELS_DIR
    return sorted(p.stem for p in qdir.glob("*.tsv")) if qdir.is_dir() else []


def _parse_qrels(path: Path) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], int]]:
    """Parse a qrels TSV; returns the qrels and the line number of each pair (for later error messages)."""
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    duplicates: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = _decode_line(raw, path, lineno).rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) == 4:  # TREC style: qid 0 docid score
                parts = [parts[0], parts[2], parts[3]]
            if len(parts) != 3:
                raise BEIRFormatError(
                    f"expected 3 tab-separated fields (query-id, corpus-id, score), got {len(parts)}: {line[:80]!r}.",
                    path,
                    lineno,
                )
            qid, did, score = (p.strip() for p in parts)
            try:
                value = float(score)
            except ValueError:
                if lineno == 1:  # the header line
                    continue
                raise BEIRFormatError(f"score {score!r} is not a number.", path, lineno) from None
            if not math.isfinite(value) or value != int(value):
                raise BEIRFormatError(
                    f"score {score!r} is not a whole number; relevance grades are integers "
                    "(0 = not relevant, 1, 2, ... = relevant).",
                    path,
                    lineno,
                )
            grade = int(value)
            if not qid or not did:
                raise BEIRFormatError("empty query-id or corpus-id.", path, lineno)
            first = lines.get((qid, did))
            if first is not None:
                if qrels[qid][did] != grade:
                    raise BEIRFormatError(
                        f"query-id {qid!r} and corpus-id {did!r} are judged {qrels[qid][did]} on "
                        f"line {first} and {grade} here; keep one row per pair.",
                        path,
                        lineno,
                    )
                duplicates.append(lineno)
                continue
            qrels.setdefault(qid, {})[did] = grade
            lines[(qid, did)] = lineno
    if not qrels:
        raise BEIRFormatError("the qrels file has no judgement rows.", path)
    if not any(grade > 0 for judged in qrels.values() for grade in judged.values()):
        logger.warning(
            "%s: every judgement has grade 0 (not relevant), so no query has a relevant document and "
            "every retrieval metric of this split is 0",
            path,
        )
    if duplicates:
        logger.warning(
            "%s: %d duplicate (query-id, corpus-id) row(s) with the same grade ignored (first on line %d)",
            path,
            len(duplicates),
            duplicates[0],
        )
    return qrels, lines


def load_qrels(folder, split: str) -> dict[str, dict[str, int]]:
    """Parse ``qrels/<split>.tsv`` (no id validation; :func:`load_beir` checks ids against the corpus)."""
    folder = _check_folder(folder)
    return _parse_qrels(_qrels_path(folder, split))[0]


def _qrels_path(folder: Path, split: str) -> Path:
    path = folder / QRELS_DIR / f"{split}.tsv"
    if not path.is_file():
        avail = available_splits(folder)
        label = data_label(folder)
        raise BEIRFormatError(
            f"split {split!r} not found; available splits: {avail or 'none (the qrels/ folder is missing or empty)'}.",
            path if label == str(folder) else f"{label} (its qrels)",
        )
    return path


def _id_set(ds) -> set[str]:
    return set(ds.data.column("_id").to_pylist())


def load_beir(folder, split: str | None = "test", *, keep_all_queries: bool = False) -> BEIRData:
    """Load and validate a BEIR folder.

    Args:
        folder: A directory with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv`` (header line); or a
            Hub dataset id in the mteb or BEIR layout (``mteb/scifact``, ``BeIR/scifact``; ``@revision`` optional), a
            local folder laid out as one, or a ``datasets.DatasetDict`` with ``corpus``, ``queries`` and qrels splits,
            read through ``datasets`` into a cached BEIR folder (:mod:`hf_cocodr.data.sources`).
        split: The qrels split to load; ``None`` loads corpus and queries only.
        keep_all_queries: Keep every query instead of only those judged in ``split`` (BEIR's behaviour).

    Returns:
        :class:`BEIRData` with ``corpus`` (documents whose title and text are both empty are removed and
        counted in a log line), ``queries`` and ``qrels`` (``{query_id: {doc_id: grade}}``). It unpacks as
        ``corpus, queries, qrels = load_beir(...)``.

    Raises:
        BEIRFormatError: naming the file and the line of the first problem found.
    """
    folder = _check_folder(folder)
    corpus = load_corpus(folder)
    queries = load_queries(folder)
    qrels: dict[str, dict[str, int]] = {}
    if split is not None:
        qpath = _qrels_path(folder, split)
        qrels, lines = _parse_qrels(qpath)
        qids, dids = _id_set(queries), _id_set(corpus)
        for (qid, did), lineno in sorted(lines.items(), key=lambda kv: kv[1]):
            if qid not in qids:
                raise BEIRFormatError(
                    f"query-id {qid!r} is not in {folder / QUERIES_FILE}; every judged query must exist.",
                    qpath,
                    lineno,
                )
            if did not in dids:
                raise BEIRFormatError(
                    f"corpus-id {did!r} is not in {folder / CORPUS_FILE}; every judged document must exist.",
                    qpath,
                    lineno,
                )
        if not keep_all_queries:
            keep = pc.is_in(column_array(queries, "_id"), value_set=pa.array(sorted(qrels), pa.string()))
            queries = queries.select(keep.to_numpy(zero_copy_only=False).nonzero()[0])
    empty_mask = pc.and_(
        pc.equal(pc.utf8_trim_whitespace(corpus.data.column("text")), ""),
        pc.equal(pc.utf8_trim_whitespace(corpus.data.column("title")), ""),
    )
    num_empty = pc.sum(empty_mask).as_py() or 0
    if num_empty:
        keep = pc.invert(empty_mask).to_numpy(zero_copy_only=False).nonzero()[0]
        corpus = corpus.select(keep)
        logger.info("%s: %d documents with empty title and text were left out of the index.", folder.name, num_empty)
    if len(corpus) == 0:
        raise BEIRFormatError("every document has empty text; there is nothing to index.", folder / CORPUS_FILE)
    return BEIRData(corpus=corpus, queries=queries, qrels=qrels, folder=folder, split=split, num_empty_docs=num_empty)


def doc_text(title: str | None, text: str | None) -> str:
    """The text encoded for a document: ``title + " " + text`` (BEIR's convention), stripped."""
    title = title or ""
    text = text or ""
    return f"{title} {text}".strip() if title else text.strip()


def corpus_texts(corpus, batch_size: int = 10_000):
    """Yield ``(ids, texts)`` batches of a corpus dataset, each text being ``title + " " + text``."""
    n = len(corpus)
    for start in range(0, n, batch_size):
        b = corpus[start : start + batch_size]
        titles = b.get("title") or [""] * len(b["_id"])
        yield b["_id"], [doc_text(t, x) for t, x in zip(titles, b["text"])]


def column_array(ds, name: str) -> pa.ChunkedArray:
    """An Arrow column of a dataset, honouring a ``select``/``filter`` view, without Python objects."""
    col = ds.data.column(name)
    if getattr(ds, "_indices", None) is not None:
        col = col.take(ds._indices.column(0))
    return col


def column_numpy(ds, name: str) -> np.ndarray:
    """A dataset column as a NumPy array (object dtype for strings)."""
    return column_array(ds, name).to_numpy()


def parse_eval_spec(spec: str, flag: str = "--eval") -> tuple[str, str]:
    """``DIR:SPLIT`` → (DIR, SPLIT); the split defaults to ``test`` when omitted. DIR may be a Hub dataset id
    (``mteb/scifact@REV:test``), whose cached BEIR folder is returned (:func:`~hf_cocodr.data.sources.resolve_data`).
    Errors name ``flag``."""
    if ":" in spec and not os.path.isdir(spec):
        folder, split = spec.rsplit(":", 1)
    else:
        folder, split = spec, "test"
    given = folder
    folder = str(resolve_data(folder, flag))
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {spec!r}: {folder} is not a directory")
    if not os.path.isfile(os.path.join(folder, QRELS_DIR, f"{split}.tsv")):
        where = folder if given == folder else f"{given} (its qrels)"
        raise ConfigError(
            f"{flag} {spec!r}: split {split!r} not found in {where}; available splits: "
            f"{available_splits(folder) or 'none (no qrels/<split>.tsv)'}"
        )
    return folder, split
