"""Who wrote an output folder, for which run, and who is writing it now.

Every hf_cocodr command that writes a folder keeps two small files in it:

* ``hf_cocodr_run.json``, the owner record: the command, a run id, the version, when it started, the *identity* of
  the run (fingerprints of its inputs and the settings that change its trajectory), the entries that were in the
  folder before it (``preexisting``: never touched) and the entries it wrote (``files``: its own artifacts, the only
  ones it may ever replace or remove).
* ``hf_cocodr_run.lock`` while it runs: pid, host and start of the writer (with the process's start time and the
  boot id, so that a pid given later to another process is not taken for the writer). A second writer gets a
  one-line error naming the lock file and the first writer's pid; a lock left by a process that is gone (same
  host) is taken over with a warning, by exactly one of the processes that find it (see :func:`acquire_lock`).

:meth:`RunFolder.claim` applies the rules before any work:

* a folder holding entries no hf_cocodr record lists is refused unless ``overwrite`` (then they are written beside,
  never touched);
* resuming checks that the folder's run has this run's identity, else a one-line :class:`RunMismatchError` names
  what differs (with ``overwrite`` the old run's own artifacts are removed and the run starts over);
* a fresh start into the folder of an earlier run is refused unless ``overwrite`` or the command *replaces* its own
  output by nature (export, convert, mteb); the earlier run's own artifacts are removed first.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..storage import is_staging_name, refuse_links, sweep_stale
from ..utils import atomic_write_json, check_not_precious
from .file_hash import file_fingerprint as _file_fingerprint
from .locks import LOCK, RunLockedError, acquire_lock, release_lock  # noqa: F401  (re-exported)

logger = logging.getLogger(__name__)

RECORD = "hf_cocodr_run.json"
PROVENANCE_FILE = "hf_cocodr_provenance.json"  # where a model came from (hf_cocodr.provenance reads and writes it)
EVAL_RESULTS = ".eval_results"  # a model card's evaluations in huggingface_hub 2.x's format (hf_cocodr.model_card)
# The files of a BEIR folder the loader reads (hf_cocodr.data.beir takes these names from here, so that a folder's
# fingerprint covers exactly what is read of it): corpus, queries, qrels/<split>.tsv.
CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_DIR = "qrels"
# Beside a BEIR folder written from a Hub dataset or a ``datasets`` object (hf_cocodr.data.sources): what it was read
# from (repository, revision, the datasets' fingerprints); a folder's fingerprint covers it.
SOURCE_FILE = "hf_cocodr_source.json"


# The entries a training command (finetune, pretrain, a recipe stage) may write into its output folder: the model,
# its tokenizer, card and records, and the trainer's own files. A user's entry of one of these names is never
# written beside, even with overwrite: it would be replaced.
TRAINER_ENTRIES = frozenset(
    {
        "README.md",
        "config.json",
        "config_sentence_transformers.json",
        "modules.json",
        "sentence_bert_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "spiece.model",
        "sentencepiece.bpe.model",
        "chat_template.jinja",
        "0_Transformer",
        "1_Pooling",
        "2_Normalize",
        "2_Dense",
        "3_Normalize",
        "condenser_head.safetensors",
        "condenser_head.json",
        "hf_cocodr_provenance.json",
        "hf_cocodr_training.json",
        "training_args.bin",
        "trainer_state.json",
        "eval.json",
        EVAL_RESULTS,
        "runs",
    }
)


class RunMismatchError(ValueError):
    """The output folder belongs to another run (different inputs or settings)."""


# ----------------------------------------------------------------------------------------------------- fingerprints
def fingerprint(obj: Any) -> Any:
    """A JSON-able fingerprint of an input: a file (its size and the SHA-256 of all of it, memoized:
    :func:`~hf_cocodr.rundir.file_hash.file_sha256`), a BEIR folder (the same
    for each file the loader reads of it: :func:`data_fingerprint`), any other folder (the same for each of its files,
    hidden entries, checkpoints, our own run files and the output folders of runs inside it left out), a
    ``datasets.Dataset`` (its datasets fingerprint), an object with a ``fingerprint()`` method, a Hub id or any other
    value (itself), lists of these."""
    if isinstance(obj, (list, tuple)):
        return [fingerprint(o) for o in obj]
    if hasattr(obj, "fingerprint") and callable(obj.fingerprint):
        return obj.fingerprint()
    if hasattr(obj, "_fingerprint") and hasattr(obj, "column_names"):  # datasets.Dataset
        return {"dataset": obj._fingerprint, "rows": len(obj)}
    if isinstance(obj, (str, os.PathLike)) and os.path.exists(obj):
        p = Path(obj)
        if p.is_file():
            return _file_fingerprint(p)
        return data_fingerprint(p) if is_data_folder(p) else _tree_fingerprint(p)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    for inner in ("human", "data", "dataset"):  # wrappers around training data
        if hasattr(obj, inner) and getattr(obj, inner) is not obj:
            return {"type": type(obj).__name__, inner: fingerprint(getattr(obj, inner))}
    return {"type": type(obj).__name__, "rows": len(obj) if hasattr(obj, "__len__") else None}


def jsonl_file(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/name.gz`` when only the compressed file is there (the file the loader reads)."""
    plain, packed = folder / name, folder / f"{name}.gz"
    return packed if not plain.exists() and packed.is_file() else plain


def is_data_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a BEIR folder: it holds the corpus file the loader reads (``corpus.jsonl[.gz]``)."""
    return jsonl_file(Path(folder).expanduser(), CORPUS_FILE).is_file()


def data_fingerprint(folder: str | os.PathLike, split: str | None = None) -> dict[str, Any]:
    """The fingerprint of what the BEIR loader (:mod:`hf_cocodr.data.beir`) reads of ``folder``, each file's under
    its path in the folder: the corpus file (``corpus.jsonl``, or ``corpus.jsonl.gz`` where only that is there), the
    queries file (the same) and ``qrels/<split>.tsv`` (with ``split`` None, every ``qrels/*.tsv``). Nothing else in
    the folder counts, however many files sort before these, and neither does a run's output folder inside it; a
    folder written from a Hub dataset also has its ``hf_cocodr_source.json`` (the dataset's revision and
    fingerprints) counted."""
    root = Path(folder).expanduser()
    qrels = root / QRELS_DIR
    files = [jsonl_file(root, CORPUS_FILE), jsonl_file(root, QUERIES_FILE), root / SOURCE_FILE]
    files += sorted(qrels.glob("*.tsv")) if split is None else [qrels / f"{split}.tsv"]
    return {f.relative_to(root).as_posix(): _file_fingerprint(f) for f in files if f.is_file()}


def _tree_fingerprint(root: Path) -> dict[str, Any]:
    """Every file of a folder that is not a BEIR folder (a model's), none left out for their number: hidden entries,
    checkpoints, logs and our run files are skipped, and so is a folder inside it holding a run record (an output
    folder, never an input)."""
    out = {}
    for here, dirs, files in os.walk(root):
        top = Path(here)
        dirs[:] = sorted(d for d in dirs if not _skip(top.relative_to(root) / d) and not (top / d / RECORD).is_file())
        for name in files:
            f = top / name
            if not _skip(f.relative_to(root)) and f.is_file():
                out[str(f.relative_to(root))] = _file_fingerprint(f)
    return dict(sorted(out.items()))


def model_fingerprint(module) -> dict[str, Any]:
    """SHA-256 of a torch module's parameters and buffers (names, shapes, dtypes and bytes)."""
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in sorted(module.state_dict().items()):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return {"weights_sha256": h.hexdigest()[:32]}


def _skip(rel: Path) -> bool:
    parts = rel.parts
    return any(x.startswith(".") or x.startswith("checkpoint-") or x == "runs" for x in parts) or rel.name in (
        RECORD,
        LOCK,
    )


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys (``a.b`` for one level down) whose values differ between two identities."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            sub = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            out += [f"{key}.{k}" for k in sub[:6]] + ([f"{key}.(+{len(sub) - 6} more)"] if len(sub) > 6 else [])
        else:
            out.append(key)
    return out


# ------------------------------------------------------------------------------------------------------ the record
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _entries(folder: Path) -> set[str]:
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if p.name not in (RECORD, LOCK) and not _is_staging(p.name)}


def _is_staging(name: str) -> bool:
    # atomic writes stage as hidden siblings: ".hf_cocodr-tmp-...", ".hf_cocodr-old-..." (hf_cocodr.storage), and
    # in earlier versions ".name.tmp-xxxx", ".name.old-xxxx", ".name.123.tmp"
    return is_staging_name(name) or (name.startswith(".") and (".tmp" in name or ".old-" in name))


def read_record(folder: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        raise RunMismatchError(
            f"{path} is not readable JSON; move it away (or the folder) to start a new run"
        ) from None
    return rec if isinstance(rec, dict) else None


class RunFolder:
    """An output folder claimed by one run (see the module docstring). Use :meth:`claim`, then :meth:`save` after
    writing (and whenever a checkpoint lands), then :meth:`release`."""

    def __init__(self, path: Path, record: dict[str, Any]):
        self.path = path
        self.record = record

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @classmethod
    def claim(
        cls,
        folder: str | os.PathLike,
        command: str,
        identity: dict[str, Any],
        *,
        resume: bool = False,
        overwrite: bool = False,
        replaces_own: bool = False,
        lock: bool = True,
        trainer: bool = False,
        dry_run: bool = False,
        writes: Iterable[str] = (),
        links: Iterable[str] = (),
    ) -> RunFolder | None:
        """Check ``folder`` against the rules, lock it and write this run's record (``dry_run``: only check, write
        nothing). ``trainer``: foreign ``checkpoint-*`` folders, and foreign entries named like a file a training
        command writes (:data:`TRAINER_ENTRIES`), are refused even with ``overwrite`` (a resume could take them for
        this run's, a save would replace them). ``writes``: more entry names this command will write; a foreign
        entry of one of those names is refused the same way. A symbolic link at or below an entry this command
        writes or may replace (its own, the earlier run's, ``writes``, checkpoints), at any depth, is refused in one
        line naming it (a write would go through it); ``links``: patterns of the links the command makes itself
        (replaced as links, never written through)."""
        out = check_not_precious(folder)
        if dry_run:
            lock = False
        else:
            out.mkdir(parents=True, exist_ok=True)
        if lock:
            acquire_lock(out)
        try:
            old = read_record(out)
            entries = _entries(out)
            own, foreign = _own_and_foreign(old, entries, command, identity, resume)
            written = set(writes) | (TRAINER_ENTRIES if trainer else set())
            _refuse_foreign(folder, foreign, trainer=trainer, overwrite=overwrite, writes=written)
            refuse_links(out, (own | written | {e for e in entries if e.startswith("checkpoint-")}) & entries, links)
            if not dry_run:
                sweep_stale(out)  # what a killed writer left (its temporary files) before anything is written
            run_id = _settle_earlier_run(
                folder,
                out,
                old,
                own & entries,
                command,
                identity,
                resume=resume,
                overwrite=overwrite,
                replaces_own=replaces_own,
                dry_run=dry_run,
            )
            if dry_run:
                return None
            if old and old.get("run_id") == run_id:
                record = old
            else:
                from .. import __version__

                preexisting = sorted((set(old.get("preexisting", [])) if old else set()) | set(foreign))
                record = {
                    "command": command,
                    "run_id": run_id,
                    "version": __version__,
                    "started": _now(),
                    "identity": identity,
                    "preexisting": preexisting,
                    "files": sorted(own & _entries(out)) if replaces_own else [],
                }
            rf = cls(out, record)
            rf.save()
            return rf
        except BaseException:
            if lock:
                release_lock(out)
            raise

    def expect(self, names: Iterable[str]) -> None:
        """Declare, before writing them, the entries this run will write (stage folders, ...): a run killed before
        its next :meth:`save` still owns them when it is resumed."""
        self.record["expected"] = sorted(
            (set(self.record.get("expected", [])) | set(names)) - set(self.record["preexisting"])
        )
        self.save()

    def save(self) -> None:
        """Record every entry written since the claim as this run's own artifact."""
        entries = _entries(self.path)
        self.record["files"] = sorted(entries - set(self.record["preexisting"]))
        self.record["updated"] = _now()
        atomic_write_json(self.path / RECORD, self.record)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.save()
        release_lock(self.path)


def _own_and_foreign(
    old: dict | None, entries: set[str], command: str, identity, resume: bool
) -> tuple[set[str], list[str]]:
    """The entries the earlier run recorded (or declared, see :meth:`RunFolder.expect`) as its own, and the entries
    no record lists. Resuming the same run, unrecorded ``checkpoint-*`` folders are its own (killed mid-save)."""
    if not old:
        return set(), sorted(entries)
    preexisting = set(old.get("preexisting", []))
    own = set(old["files"]) | ((set(old.get("expected", [])) & entries) - preexisting)
    foreign = sorted(entries - own - preexisting)
    same_run = resume and (
        identity is None or (old.get("command") == command and not identity_diff(old.get("identity", {}), identity))
    )
    if same_run:
        own |= {f for f in foreign if f.startswith("checkpoint-")}
        foreign = [f for f in foreign if not f.startswith("checkpoint-")]
    return own, foreign


def _refuse_foreign(
    folder, foreign: list[str], *, trainer: bool, overwrite: bool, writes: set[str] = frozenset()
) -> None:
    checkpoints = [f for f in foreign if f.startswith("checkpoint-")]
    if trainer and checkpoints:
        raise FileExistsError(
            f"{folder} holds checkpoint folders hf_cocodr did not record for it ({', '.join(checkpoints)}); a resume "
            "could take them for this run's: give a new folder"
        )
    clash = sorted(f for f in foreign if f in writes)
    if clash:
        shown = [
            f"{f} (a symbolic link to {os.readlink(Path(folder) / f)})" if (Path(folder) / f).is_symlink() else f
            for f in clash[:4]
        ]
        raise FileExistsError(
            f"{folder} holds {', '.join(shown)}{', ...' if len(clash) > 4 else ''}, which hf_cocodr did not write "
            "and this command would write (replacing it, or writing through it if it is a link); hf_cocodr never "
            "changes files it did not write: move it away or give a new folder"
        )
    if foreign and not overwrite:
        raise FileExistsError(
            f"{folder} holds files hf_cocodr did not write ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}"
            "); hf_cocodr never deletes or changes files it did not write: give a new or empty folder, or pass "
            "--overwrite_output_dir to write beside them (they stay untouched)"
        )


def _settle_earlier_run(
    folder,
    out: Path,
    old: dict | None,
    own_present: set[str],
    command: str,
    identity,
    *,
    resume: bool,
    overwrite: bool,
    replaces_own: bool,
    dry_run: bool,
) -> str:
    """Continue, replace or refuse the run that wrote ``out`` before; returns this run's id (the earlier one's when
    it is resumed). Removes the earlier run's own files when this run replaces it (never with ``dry_run``)."""
    if old and resume:
        diff = [] if identity is None else identity_diff(old.get("identity", {}), identity)
        if old.get("command") != command:
            diff = ["command"] + diff
        if not diff:
            if not dry_run:
                old.setdefault("resumed", []).append(_now())
            return old["run_id"]
        if not overwrite:
            raise RunMismatchError(
                f"{folder} holds another run ({old.get('command')}, started {old.get('started')}): "
                f"{', '.join(diff)} differ; pass --overwrite_output_dir to replace that run's files, or give a new "
                "folder"
            )
        if not dry_run:
            logger.warning(
                "%s: the earlier run differs in %s; replacing its files and starting over", folder, ", ".join(diff)
            )
            remove_own(out, own_present)
    elif old and own_present:
        if not (overwrite or (replaces_own and old.get("command") == command)):
            raise FileExistsError(
                f"{folder} holds an earlier run ({old.get('command')}, started {old.get('started')}); resume it "
                "(--resume_from_checkpoint true), pass --overwrite_output_dir to replace its files, or give a new "
                "folder"
            )
        if not dry_run and not replaces_own:
            remove_own(out, own_present)
    return uuid.uuid4().hex[:12]


def remove_own(folder: Path, names: Iterable[str]) -> None:
    """Remove the entries ``names`` of ``folder`` (only ever called with a run's own artifacts)."""
    for name in sorted(names):
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def note_written(folder: str | os.PathLike) -> None:
    """After a command that claimed ``folder`` wrote more into it: list those entries in its record as its own."""
    rec = read_record(folder)
    if rec is not None and "preexisting" in rec:
        RunFolder(Path(folder), rec).save()
