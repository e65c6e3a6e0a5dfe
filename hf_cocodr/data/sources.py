"""Hub datasets and ``datasets`` objects wherever a BEIR folder is taken.

A data source is one of:

* a local BEIR folder or JSONL file, used as it is;
* a Hub dataset id ``org/name`` with an optional ``@revision``, in the **mteb layout** (configs ``corpus``,
  ``queries`` and ``default``, the qrels, one split per qrels split: ``mteb/scifact``) or the **BEIR layout**
  (``BeIR/scifact`` with configs ``corpus`` and ``queries``, its qrels in ``BeIR/scifact-qrels``); a local folder laid
  out as such a repository (data files per config, as the Hub serves them) is read the same way;
* in Python, a ``datasets.DatasetDict`` with the splits ``corpus``, ``queries`` and one per qrels split (columns
  ``query-id``, ``corpus-id``, ``score``), or a ``datasets.Dataset`` of documents (``_id``, ``text``, ``title``).

A Hub dataset loads through ``datasets.load_dataset`` (its cache, its offline mode: offline and not cached is one line
saying so). Every row is checked as the BEIR loader checks a line (an id and a text; an error names the repository,
the config, the split and the row), and the source is written once as a BEIR folder in the cache
(``$HF_COCODR_CACHE/hub-data/<key>/<name>``), keyed by the dataset's revision and fingerprints, beside
``hf_cocodr_source.json`` (what it was read from), which :func:`~hf_cocodr.rundir.run_record.data_fingerprint`
covers: a changed revision is another folder, so every cache keyed by a folder's fingerprint stays exact. Everything
downstream reads that folder, so a Hub dataset scores as its BEIR folder does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

from ..errors import BEIRFormatError
from ..rundir.run_record import (
    CORPUS_FILE,
    QRELS_DIR,
    QUERIES_FILE,
    SOURCE_FILE,
    digest,
    fingerprint,
    is_data_folder,
)
from ..storage import cache_dir, staged_directory
from ..utils import atomic_write_json, hub_id_problem

logger = logging.getLogger(__name__)

_FORMAT = 1
_BATCH_ROWS = 8192
# org/name with an optional @revision (a branch, tag or commit; "hf://datasets/" in front is allowed)
_HUB_SPEC = re.compile(r"^(?:hf://datasets/)?(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<revision>[\w./-]+))?$")
_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".tsv", ".txt", ".gz")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ID_COLUMNS = ("_id", "id")  # mteb's newer datasets name the id column "id"
_QRELS_COLUMNS = ("query-id", "corpus-id", "score")
_BUILDER_NAMES = {"json", "csv", "parquet", "text", "arrow", "pandas", "generator"}  # datasets' packaged builders
_RESOLVED: dict[Any, Path] = {}  # (source, its local fingerprint) -> the folder, within one process


def hub_dataset_spec(value: Any) -> tuple[str, str | None] | None:
    """``(repo, revision)`` when ``value`` names a Hub dataset (``org/name[@revision]``, no local path of that name,
    not a file name), else None."""
    if not isinstance(value, str) or os.path.exists(os.path.expanduser(value)) or value.endswith(_FILE_SUFFIXES):
        return None
    m = _HUB_SPEC.match(value)
    if m is None or hub_id_problem(m["repo"]) is not None:
        return None
    return m["repo"], m["revision"]


def is_hub_layout(path: str | os.PathLike) -> bool:
    """Whether a local folder is laid out as a Hub dataset repository (not a BEIR folder): a ``README.md`` whose front
    matter declares ``configs``, or data files (parquet, JSON lines, CSV) in config folders beside no
    ``corpus.jsonl``."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or is_data_folder(folder) or (folder / "dataset_dict.json").is_file():
        return False
    readme = folder / "README.md"
    if readme.is_file() and re.search(r"^configs:", _front_matter(readme), re.MULTILINE):
        return True
    return any(folder.glob("corpus/*.parquet")) or any(folder.glob("corpus/*.jsonl"))


def _front_matter(readme: Path) -> str:
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    parts = text.split("---", 2)
    return parts[1] if text.startswith("---") and len(parts) == 3 else ""


def is_dataset_object(value: Any) -> bool:
    """A ``datasets.Dataset`` or ``datasets.DatasetDict`` (told without importing ``datasets``)."""
    return type(value).__name__ in ("Dataset", "DatasetDict") and type(value).__module__.startswith("datasets")


def resolve_data(source: Any, flag: str | None = None) -> Any:
    """The local BEIR folder of a data source (see the module docstring): a Hub dataset id, a local Hub-layout
    folder, a ``DatasetDict`` or a ``datasets.Dataset`` of documents with an ``_id`` column is validated and written
    once into the cache (its folder is returned); anything else (a BEIR folder, a JSONL file, a dataset of plain
    texts, a missing path) is returned as it is, for its reader to take or refuse.

    Raises:
        BEIRFormatError: one line naming the repository, config, split and row of the first bad row, or a config the
            layout needs and the repository lacks.
        FileNotFoundError: offline (``HF_HUB_OFFLINE=1``) and not in the ``datasets`` cache, or no such dataset.
    """
    if type(source).__name__ == "DatasetDict" and is_dataset_object(source):
        return _from_dataset_dict(source)
    if is_dataset_object(source) and "_id" in source.column_names:  # documents with ids: searchable, as a folder
        return _from_dataset_dict({"corpus": source})
    if not isinstance(source, (str, os.PathLike)):
        return source
    text = str(source)
    if is_hub_layout(text):
        path = Path(text).expanduser().resolve()
        qrels = path.with_name(path.name + "-qrels")
        local = fingerprint([str(path), str(qrels) if qrels.is_dir() else None])  # datasets' cache may be stale
        return _cached((str(path), digest(local)), lambda: _from_repo(str(path), None, text, local, flag))
    spec = hub_dataset_spec(text)
    if spec is None:
        return source
    return _cached((text, None), lambda: _from_repo(spec[0], spec[1], text, None, flag))


def _cached(key, build) -> Path:
    folder = _RESOLVED.get(key)
    if folder is None or not (folder / SOURCE_FILE).is_file():
        folder = _RESOLVED[key] = build()
    return folder


def source_record(folder: str | os.PathLike) -> dict[str, Any] | None:
    """What a folder :func:`resolve_data` wrote was read from (its ``hf_cocodr_source.json``), else None."""
    path = Path(folder).expanduser() / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def data_label(value: Any) -> Any:
    """How records name a data source: the Hub id (with its revision) or ``DatasetDict`` a cached folder was written
    from, else the value itself (a path as a string)."""
    if isinstance(value, (str, os.PathLike)):
        record = source_record(value) if Path(value).expanduser().is_dir() else None
        return record["source"] if record else str(value)
    return value


# -------------------------------------------------------------------------------------------- loading the configs
def is_offline_error(exc: BaseException | None) -> bool:
    """``exc`` (or an exception it was raised from) says the Hub or the network could not be reached."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ConnectionError) or type(exc).__name__ in {
            "OfflineModeIsEnabled",
            "LocalEntryNotFoundError",
            "ConnectError",
            "ConnectTimeout",
        }:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _unavailable(label: str, repo: str, flag: str | None, e: BaseException) -> FileNotFoundError:
    given = f"{flag} {label}" if flag else label
    if is_offline_error(e):
        offline = " (HF_HUB_OFFLINE=1)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
        return FileNotFoundError(
            f"{given}: no such local folder, and the Hub dataset {repo} is not in the datasets cache while the Hub "
            f"cannot be reached{offline}; load it once with network access, or pass a local BEIR folder"
        )
    detail = " ".join(str(e).split())[:200]
    return FileNotFoundError(f"{given}: no such local folder, and the Hub dataset {repo} cannot be read ({detail})")


def _configs(path: str, revision: str | None, label: str, flag: str | None) -> list[str]:
    import datasets

    try:
        return list(datasets.get_dataset_config_names(path, revision=revision))
    except Exception as e:  # offline, missing, private: one line
        raise _unavailable(label, path, flag, e) from None


def _load_config(path: str, config: str, revision: str | None, local: bool, label: str, flag: str | None):
    """Every split of ``config`` (a ``DatasetDict``); a local folder is read afresh (``datasets`` keys the cache of a
    folder whose README declares its configs by file patterns, not by their contents)."""
    import datasets

    mode = "force_redownload" if local else None
    try:
        return datasets.load_dataset(path, config, revision=revision, download_mode=mode)
    except Exception as e:
        if is_offline_error(e) or type(e).__name__ in ("DatasetNotFoundError", "FileNotFoundError"):
            raise _unavailable(label, path, flag, e) from None
        raise BEIRFormatError(
            f"cannot be read with datasets.load_dataset ({' '.join(str(e).split())[:200]})",
            f"{label} (config {config!r})",
        ) from None


def _one_split(dd, where: str, kind: str):
    """The one split of a corpus or queries config (``corpus`` / ``queries`` where it has several)."""
    splits = list(dd)
    if len(splits) == 1:
        return splits[0], dd[splits[0]]
    if kind in dd:
        return kind, dd[kind]
    raise BEIRFormatError(f"the {kind} config has the splits {splits}; expected one (or one named {kind!r})", where)


def _from_repo(path: str, revision: str | None, label: str, local: Any, flag: str | None) -> Path:
    """A Hub repository (or a local folder laid out as one) in the mteb or the BEIR layout, as a cached BEIR folder."""
    configs = _configs(path, revision, label, flag)
    for needed in ("corpus", "queries"):
        if needed not in configs:
            raise BEIRFormatError(
                f"no {needed!r} config (configs: {configs}); a dataset in the mteb layout has the configs corpus, "
                f"queries and default (the qrels), one in the BEIR layout corpus and queries, its qrels in "
                f"{Path(path).name}-qrels",
                label,
            )
    parts = {
        kind: _load_config(path, kind, revision, local is not None, label, flag) for kind in ("corpus", "queries")
    }
    qrels_path, qrels_config = path, "default" if "default" in configs else "qrels" if "qrels" in configs else None
    note = None
    if qrels_config is None:  # the BEIR layout: the qrels in a repository of their own
        qrels_path = f"{path}-qrels"
        try:
            qrels_config = "default" if "default" in _configs(qrels_path, revision, label, flag) else None
        except FileNotFoundError as e:
            note = str(e)
    qrels = _load_config(qrels_path, qrels_config, revision, local is not None, label, flag) if qrels_config else {}
    qrels = {_beir_split(qrels_path, qrels_config, revision, s): ds for s, ds in dict(qrels).items()}
    repo = None if local is not None else path
    layout = "mteb" if qrels_path == path and qrels_config else "beir"
    splits = {kind: _one_split(dd, f"{label} (config {kind!r})", kind) for kind, dd in parts.items()}
    record = {
        "format": _FORMAT,
        "source": label,
        "repo": repo,
        "revision": revision,
        "resolved_revision": _commit(splits["corpus"][1]),
        "layout": layout,
        "local_files": local,
        "configs": {
            kind: {"config": kind, "split": split, "fingerprint": ds._fingerprint, "rows": len(ds)}
            for kind, (split, ds) in splits.items()
        },
        "qrels": {
            "repo": None if local is not None else qrels_path,
            "config": qrels_config,
            "splits": {s: {"fingerprint": ds._fingerprint, "rows": len(ds)} for s, ds in qrels.items()},
            **({"unavailable": note} if note else {}),
        },
    }
    where = {kind: f"{label} (config {kind!r}, split {split!r})" for kind, (split, _) in splits.items()}
    qrels_where = {
        s: f"{label if qrels_path == path else qrels_path} (config {qrels_config!r}, split {s!r})" for s in qrels
    }
    tables = {"corpus": splits["corpus"][1], "queries": splits["queries"][1], "qrels": qrels}
    return _write_folder(Path(path).name, record, tables, {**where, "qrels": qrels_where})


def _beir_split(path: str, config: str, revision: str | None, split: str) -> str:
    """A qrels split by its BEIR name: ``datasets`` names the split of a file ``dev.tsv`` (BEIR's development qrels,
    as ``BeIR/<name>-qrels`` holds them) ``validation``; it stays ``dev`` here."""
    if split != "validation":
        return split
    import datasets

    with contextlib.suppress(Exception):
        files = datasets.load_dataset_builder(path, config, revision=revision).config.data_files[split]
        if files and all(Path(str(f)).name.split(".")[0].split("-")[0] == "dev" for f in files):
            return "dev"
    return split


def _commit(ds) -> str | None:
    """The Hub commit a loaded dataset was read at: the module hash ``datasets`` names its cache folder by (a Hub
    dataset's is its commit), else None."""
    for entry in getattr(ds, "cache_files", None) or []:
        name = Path(entry.get("filename", "")).parent.name
        if _COMMIT.match(name):
            return name
    return None


def _from_dataset_dict(dd) -> Path:
    """A ``DatasetDict`` with ``corpus``, ``queries`` and qrels splits (or ``{"corpus": dataset}``: documents alone),
    as a cached BEIR folder."""
    alone = list(dd) == ["corpus"]
    for needed in ("corpus",) if alone else ("corpus", "queries"):
        if needed not in dd:
            raise BEIRFormatError(
                f"the DatasetDict has no {needed!r} split (splits: {list(dd)}); give corpus, queries and one split "
                "per qrels split (columns query-id, corpus-id, score)"
            )
    parts = [k for k in ("corpus", "queries") if k in dd]
    qrels = {s: ds for s, ds in dd.items() if s not in ("corpus", "queries")}
    name = dd["corpus"].info.dataset_name
    name = "dataset" if not name or name in _BUILDER_NAMES else name
    record = {
        "format": _FORMAT,
        "source": f"Dataset({name})" if alone else f"DatasetDict({name})",
        "layout": "datasets",
        "configs": {k: {"fingerprint": dd[k]._fingerprint, "rows": len(dd[k])} for k in parts},
        "qrels": {"splits": {s: {"fingerprint": ds._fingerprint, "rows": len(ds)} for s, ds in qrels.items()}},
    }
    key = ("DatasetDict", digest(record))
    where = {k: f"{record['source']} split {k!r}" for k in parts}
    where["qrels"] = {s: f"DatasetDict split {s!r}" for s in qrels}
    tables = {"corpus": dd["corpus"], "queries": dd["queries"] if not alone else None, "qrels": qrels}
    return _cached(key, lambda: _write_folder(name, record, tables, where))


# -------------------------------------------------------------------------------------- validating and writing
def _write_folder(name: str, record: dict[str, Any], tables: dict[str, Any], where: dict[str, Any]) -> Path:
    """The BEIR folder of ``tables`` in the cache (``hub-data/<key>/<name>``): reused when it was written before,
    else validated row by row and written beside its ``hf_cocodr_source.json`` (staged, renamed into place)."""
    key = digest({k: v for k, v in record.items() if k != "source"})
    dest = cache_dir("hub-data") / key / (re.sub(r"[^\w.-]+", "_", name) or "dataset")
    if (dest / SOURCE_FILE).is_file():
        return dest
    with staged_directory(dest) as tmp:
        doc_ids = _write_rows(tables["corpus"], tmp / CORPUS_FILE, where["corpus"], "corpus")
        queries = tables["queries"]
        query_ids = _write_rows(queries, tmp / QUERIES_FILE, where["queries"], "queries") if queries else set()
        (tmp / QRELS_DIR).mkdir()
        for split, ds in tables["qrels"].items():
            _write_qrels(ds, tmp / QRELS_DIR / f"{split}.tsv", where["qrels"][split], query_ids, doc_ids)
        atomic_write_json(tmp / SOURCE_FILE, record)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / SOURCE_FILE).is_file():  # (another process wrote it meanwhile: that one is used)
                raise
    logger.info("%s: read through datasets.load_dataset and written as the BEIR folder %s", record["source"], dest)
    return dest


def _text(value, column: str, where: str, row: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BEIRFormatError(f"row {row}: {column!r} must be a string, got {type(value).__name__}", where)
    return value


def _write_rows(ds, out: Path, where: str, kind: str) -> set[str]:
    """Write a corpus or queries dataset as BEIR JSON lines (``_id``, ``title``, ``text``, ``metadata``); returns the
    ids. A missing id or text column, an empty or repeated id, a text that is not a string: one line naming the row."""
    columns = list(ds.column_names)
    id_column = next((c for c in _ID_COLUMNS if c in columns), None)
    if id_column is None or "text" not in columns:
        missing = "'_id'" if id_column is None else "'text'"
        raise BEIRFormatError(
            f"row 0: no {missing} column (columns: {columns}); every {kind} row needs _id and text", where
        )
    seen: dict[str, int] = {}
    with open(out, "w", encoding="utf-8") as f:
        for start in range(0, len(ds), _BATCH_ROWS):
            batch = ds[start : start + _BATCH_ROWS]
            titles = batch.get("title") or [None] * len(batch["text"])
            metadata = batch.get("metadata") or [None] * len(batch["text"])
            for j, (raw_id, title, text, meta) in enumerate(zip(batch[id_column], titles, batch["text"], metadata)):
                row = start + j
                _id = str(raw_id) if isinstance(raw_id, int) and not isinstance(raw_id, bool) else raw_id
                if not isinstance(_id, str) or not _id.strip():
                    raise BEIRFormatError(
                        f"row {row}: {id_column!r} must be a non-empty string, got {raw_id!r}", where
                    )
                if _id in seen:
                    raise BEIRFormatError(
                        f"row {row}: duplicate {id_column} {_id!r} (first in row {seen[_id]})", where
                    )
                seen[_id] = row
                rec = {"_id": _id, "title": _text(title, "title", where, row), "text": _text(text, "text", where, row)}
                if isinstance(meta, dict) and meta:
                    rec["metadata"] = meta
                f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
    if not seen:
        raise BEIRFormatError(f"the {kind} is empty", where)
    return set(seen)


def _write_qrels(ds, out: Path, where: str, query_ids: set[str], doc_ids: set[str]) -> None:
    """Write a qrels split as ``qrels/<split>.tsv``; a missing column, an unknown query or document, a grade that is
    not a whole number: one line naming the row."""
    missing = [c for c in _QRELS_COLUMNS if c not in ds.column_names]
    if missing:
        raise BEIRFormatError(
            f"row 0: no {missing[0]!r} column (columns: {list(ds.column_names)}); qrels rows need "
            "query-id, corpus-id and score",
            where,
        )
    with open(out, "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for start in range(0, len(ds), _BATCH_ROWS):
            batch = ds[start : start + _BATCH_ROWS]
            for j, (qid, did, score) in enumerate(zip(*(batch[c] for c in _QRELS_COLUMNS))):
                row = start + j
                qid, did = str(qid) if qid is not None else "", str(did) if did is not None else ""
                if qid not in query_ids:
                    raise BEIRFormatError(f"row {row}: query-id {qid!r} is not in the queries", where)
                if did not in doc_ids:
                    raise BEIRFormatError(f"row {row}: corpus-id {did!r} is not in the corpus", where)
                if (
                    not isinstance(score, (int, float))
                    or isinstance(score, bool)
                    or not math.isfinite(score)
                    or (score != int(score))
                ):
                    raise BEIRFormatError(f"row {row}: score {score!r} is not a whole number", where)
                f.write(f"{qid}\t{did}\t{int(score)}\n")
