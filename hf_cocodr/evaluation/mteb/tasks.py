"""MTEB tasks: a local BEIR folder as an ``AbsTaskRetrieval``, and mteb's built-in tasks by name.

Documents are read as ``title + " " + text``, exactly as :func:`hf_cocodr.evaluate_retrieval` encodes them; the content
hash of the split's files is the task's dataset revision, so results of different data never merge.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...data.beir import jsonl_file, load_beir
from ...data.sources import resolve_data
from ...utils import import_mteb
from .common import DEFAULT_LANGUAGES, MAIN_SCORE, check_task_name


def _hash_files(paths: Iterable[Path], root: Path | None = None, prefix: str = "") -> str:
    h = hashlib.sha256(prefix.encode())
    for path in paths:
        h.update(str(path.relative_to(root) if root else path.name).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:40]


def beir_revision(folder: str | os.PathLike, split: str) -> str:
    """A content hash of a BEIR split (corpus, queries and ``qrels/<split>.tsv``): the task's dataset revision."""
    folder = Path(folder)
    files = [
        jsonl_file(folder, "corpus.jsonl"),
        jsonl_file(folder, "queries.jsonl"),
        folder / "qrels" / f"{split}.tsv",
    ]
    return _hash_files([p for p in files if p.is_file()], folder)


@lru_cache(maxsize=1)
def _beir_task_base():
    """The ``AbsTaskRetrieval`` subclass behind :func:`beir_task` (built on first use: mteb is a heavy import)."""
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.abstasks import AbsTaskRetrieval

    class BEIRFolderRetrieval(AbsTaskRetrieval):
        """A retrieval task read from a local BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).

        Documents are ``title`` + ``text`` (MTEB joins them with one space, like :func:`hf_cocodr.data.doc_text`);
        only queries judged in the split are evaluated; documents with an empty title and text are left out, as in
        :func:`hf_cocodr.evaluate_retrieval`.
        """

        def __init__(self, folder: str | os.PathLike, split: str, data=None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.folder = Path(folder)
            self.split = split
            self._preloaded = data

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            """Fill ``self.dataset = {"default": {split: {corpus, queries, relevant_docs, top_ranked}}}``."""
            if self.data_loaded:
                return
            data = self._preloaded if self._preloaded is not None else load_beir(self.folder, self.split)
            self._preloaded = None
            self.dataset = {"default": {self.split: beir_split_data(data)}}
            self.data_loaded = True

    return BEIRFolderRetrieval


def beir_split_data(data) -> dict[str, Any]:
    """MTEB's ``RetrievalSplitData`` for a loaded :class:`~hf_cocodr.data.BEIRData`.

    ``corpus`` is a ``datasets.Dataset`` with columns ``id``, ``title``, ``text``; ``queries`` one with ``id``,
    ``text``; ``relevant_docs`` is ``{query_id: {doc_id: grade}}``; ``top_ranked`` is ``None`` (full retrieval).
    The Arrow-backed datasets are renamed and column-selected, not copied.
    """
    corpus = data.corpus.select_columns(["_id", "title", "text"]).rename_column("_id", "id")
    queries = data.queries.select_columns(["_id", "text"]).rename_column("_id", "id")
    return {
        "corpus": corpus,
        "queries": queries,
        "relevant_docs": {q: dict(docs) for q, docs in data.qrels.items()},
        "top_ranked": None,
    }


def beir_task(
    folder: str | os.PathLike,
    split: str = "test",
    task_name: str | None = None,
    *,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    description: str | None = None,
    revision: str | None = None,
    reference: str | None = None,
    license: str | None = None,
    bibtex_citation: str | None = None,
):
    """An MTEB 2.x retrieval task for a BEIR folder and split.

    The folder is validated now (:func:`hf_cocodr.load_beir`, clear errors naming file and line) and its content
    hash becomes the dataset revision stored in the results, so results of different data never merge.

    Args:
        folder: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``), a Hub dataset id
            (``mteb/scifact``, ``BeIR/scifact``) or a ``DatasetDict`` (:func:`~hf_cocodr.data.sources.resolve_data`).
        split: the qrels split to evaluate.
        task_name: the task name (the results file is ``{task_name}.json``); default ``<folder name>-<split>``.
            Must not be the name of a built-in MTEB task.
        languages: ISO 639-3 + script codes of the data, e.g. ``["eng-Latn"]``.
        description / reference / license / bibtex_citation: optional metadata of the data.
        revision: the dataset revision (default: a content hash of the split's files).

    Returns:
        An instance of a ``mteb.abstasks.AbsTaskRetrieval`` subclass, ready for ``mteb.evaluate``.

    Raises:
        BEIRFormatError: the folder or split is missing or malformed.
        ValueError: bad task name or language code.
    """
    import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
    from mteb.abstasks.task_metadata import TaskMetadata  # heavy: imported on first use only

    folder = Path(resolve_data(folder, "DATA_DIR")).expanduser()  # a Hub dataset: its cached BEIR folder
    data = load_beir(folder, split)  # validates the folder and split, with clear messages
    folder = folder.resolve()
    task_name = check_task_name(task_name or f"{folder.name}-{split}")
    metadata = TaskMetadata(
        name=task_name,
        description=description or f"Local BEIR folder {folder.name!r}, split {split!r} (hf_cocodr).",
        dataset={"path": str(folder), "revision": revision or beir_revision(folder, split)},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        reference=reference,
        eval_splits=[split],
        eval_langs=list(languages),
        main_score=MAIN_SCORE,
        license=license,
        bibtex_citation=bibtex_citation,
        sample_creation="found",
    )
    base = _beir_task_base()
    # One class per task: MTEB reads ``metadata`` from the class (unload_data drops instance overrides).
    cls = type(f"BEIRFolderRetrieval_{re.sub(r'[^0-9A-Za-z_]', '_', task_name)}", (base,), {"metadata": metadata})
    return cls(folder, split, data=data)


def _builtin_tasks(names: Sequence[str], languages: Sequence[str] | None = None) -> list:
    """mteb's built-in tasks ``names`` (restricted to ``languages`` when given), with one clear error per bad name.

    Raises:
        ValueError: a name mteb does not know, or a task without a subset in ``languages``.
    """
    mteb = import_mteb()  # heavy: imported on first use only

    tasks = []
    for name in names:
        try:
            found = mteb.get_tasks(tasks=[name], languages=list(languages) if languages else None)
        except KeyError as e:
            raise ValueError(f"unknown MTEB task {name!r}: {e.args[0] if e.args else e}") from None
        if not found:
            raise ValueError(f"MTEB task {name!r} has no subset in the languages {list(languages or [])}.")
        tasks.extend(found)
    return tasks
