"""Small shared helpers: logging, atomic writes, data location, environment checks."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import stat
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError, as_disk_fault, disk_faults
from .storage import (  # noqa: F401
    ENTRIES_FILE,
    _listed_entries,
    bounded_name,
    carry_over,
    check_not_source,
    remove_entry,
    staging_path,
    sweep_stale,
)

logger = logging.getLogger("hf_cocodr")

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def get_data_root() -> Path:
    """The folder holding BEIR-format datasets: ``$HF_COCODR_DATA`` or ``../shared/data``."""
    env = os.environ.get("HF_COCODR_DATA")
    if env:
        return Path(env).expanduser().resolve()
    # Relative to the current directory first (the documented default), then to the checkout.
    cwd_default = Path("..", "shared", "data").resolve()
    return cwd_default if cwd_default.is_dir() else DEFAULT_DATA_DIR


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (it may be replaced, e.g. by test capture)."""

    @property
    def stream(self):

        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; ignore
        pass


class _RedactingFilter(logging.Filter):
    """Takes strings with the shape of a Hub token out of every log line (the message and its arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def setup_logging(level: int = logging.INFO) -> None:
    """Configure the ``hf_cocodr`` logger for command-line use (idempotent)."""
    root = logging.getLogger("hf_cocodr")
    if not any(getattr(h, "_hf_cocodr", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._hf_cocodr = True  # type: ignore[attr-defined]
        handler.addFilter(_RedactingFilter())
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where ``/proc/self/status`` tells it (Linux), else by setting
    and at once restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def honour_umask(*paths: str | os.PathLike) -> None:
    """Give files and folders hf_cocodr wrote the modes a plain ``open`` / ``mkdir`` gives them, as
    ``save_pretrained`` does: files ``0o666 & ~umask``, folders ``0o777 & ~umask`` and, inside a folder, everything
    below it. Writers that stage through private temporary files (``tempfile.mkstemp``, safetensors) leave ``0600``,
    which another account (a model server) cannot read. Symbolic links are never followed; a path that is gone is
    skipped. Only ever called on entries this process wrote."""
    umask = current_umask()
    for path in paths:
        for root, dirs, files in _walk_no_links(Path(path)):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(root / name, 0o666 & ~umask)
            for name in dirs:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(root / name, 0o777 & ~umask)


def _walk_no_links(path: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """``(folder, [sub-folder names], [file names])`` for ``path`` (as a one-entry listing of its parent) and, for a
    folder, everything below it; symbolic links and special files are left out."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        yield path.parent, [], [path.name]
    elif stat.S_ISDIR(st.st_mode):
        yield path.parent, [path.name], []
        for root, dirs, files in os.walk(path, followlinks=False):
            base = Path(root)
            yield (
                base,
                [d for d in dirs if not (base / d).is_symlink()],
                [f for f in files if (base / f).is_file() and not (base / f).is_symlink()],
            )


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers never see half a file. The file
    gets the mode a plain ``open`` would give it (``0o666 & ~umask``). The temporary file is a staging sibling
    (:func:`~hf_cocodr.storage.staging_path`): one a kill left is removed by the next sweep of its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_path(path)  # (named as hf_cocodr's, with this process's id: what a kill leaves is swept)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (the umask applies, as for a plain open)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        fault = as_disk_fault(e, path) if isinstance(e, Exception) else None
        if fault is not None:
            raise fault from e  # a write() on a full disk names no file: this names the one being written
        raise


SECRET_KEYS = frozenset({"hub_token", "token", "hf_token", "api_key", "password", "secret", "access_token"})
_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
REDACTED = "<redacted>"


def redact_text(text: str) -> str:
    """``text`` with every string that has the shape of a Hugging Face token (``hf_...``) replaced."""
    return _TOKEN_SHAPE.sub(REDACTED, text)


def redact_secrets(obj: Any) -> Any:
    """A copy of a JSON-able value with secrets taken out: the value of every key named like a credential
    (:data:`SECRET_KEYS`) and every string that has the shape of a Hugging Face token (``hf_...``)."""
    if isinstance(obj, dict):
        return {
            k: (REDACTED if str(k).lower() in SECRET_KEYS and v not in (None, "") else redact_secrets(v))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [redact_secrets(v) for v in obj]
    if isinstance(obj, str):
        return _TOKEN_SHAPE.sub(REDACTED, obj)
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON atomically, with secrets redacted (:func:`redact_secrets`): no record, plan, card
    config or result hf_cocodr writes ever holds a token."""
    atomic_write_text(path, json.dumps(redact_secrets(obj), indent=indent, sort_keys=False, ensure_ascii=False) + "\n")


def _written_entries(folder: Path) -> set[str] | None:
    """The entries the manifest of ``folder`` lists (:data:`ENTRIES_FILE`); None without a readable one."""
    return _listed_entries(folder)


def destination(path: str | os.PathLike) -> Path:
    """Where a write to ``path`` lands, its last component not followed: ``~`` expanded, made absolute, the folders
    above it resolved (``..`` and links), the entry itself as named (a link stays the link). ``X/new/..`` and ``.``
    name the folder they resolve to."""
    p = Path(os.path.expanduser(os.fspath(path))).absolute()
    if p.name in ("", ".", ".."):
        return p.resolve()
    return p.parent.resolve() / p.name


def refuse_linked_destination(path: str | os.PathLike) -> Path:
    """:func:`destination` of ``path``, refused in one line when it is a symbolic link: a folder hf_cocodr replaces
    as a whole is never one a link points to."""
    out = destination(path)
    if out.is_symlink():
        raise FileExistsError(
            f"{path} is a symbolic link (to {os.readlink(out)}); hf_cocodr replaces this folder as a whole and never "
            "writes through a link: remove the link, or give another folder"
        )
    return out


@contextlib.contextmanager
def atomic_directory(out_dir: str | os.PathLike, overwrite: bool = True, keep_others: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``out_dir`` in one rename.

    A crash or an exception leaves ``out_dir`` as it was (the temporary directory is removed; one a killed run left
    is swept by the next, see :mod:`hf_cocodr.storage`), so a half-written model directory is never visible under
    the final name. A write that fails because of the disk comes out as one ``OSError`` naming ``out_dir``. An
    ``out_dir`` that is a symbolic link is refused before anything is written: the folder it points to is not
    hf_cocodr's to replace.

    ``keep_others``: the folder keeps a list of the entries written into it (:data:`ENTRIES_FILE`); when it is
    replaced, every entry of the old folder that list does not name (the user's) is carried over into the new one;
    an old folder without that list has all its entries carried over that the new one does not write.
    """
    out_dir = refuse_linked_destination(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass overwrite=True to replace it.")
    sweep_stale(out_dir.parent)  # what a killed earlier run left beside it
    if out_dir.is_dir():
        sweep_stale(out_dir)  # and inside it (never carried over as the user's)
    tmp = staging_path(out_dir)
    tmp.mkdir()
    try:
        with disk_faults(out_dir):  # a full disk is one OSError naming the folder, whatever the serialiser said
            yield tmp
            if keep_others:
                _keep_others(out_dir, tmp)
            replace_directory(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def add_written_entries(folder: str | os.PathLike, names) -> None:
    """Add ``names`` to the list of entries hf_cocodr wrote into ``folder`` (:data:`ENTRIES_FILE`, written by
    :func:`atomic_directory` with ``keep_others``): files a command writes into such a folder after it was swapped
    into place (an evaluation, a card) are its own, replaced on a re-run, never carried over as the user's."""
    folder = Path(folder)
    ours = _written_entries(folder)
    if ours is not None:
        atomic_write_text(folder / ENTRIES_FILE, json.dumps(sorted(ours | set(names))) + "\n")


def _keep_others(old: Path, new: Path) -> None:
    """List ``new``'s entries in its :data:`ENTRIES_FILE`, then carry over into it the entries of ``old`` that
    ``old``'s list does not name (the user's). An old folder without a readable list (written by an earlier version,
    or its list lost) has every entry the new folder does not write carried over: what no list names as hf_cocodr's
    is never deleted."""
    mine = sorted(p.name for p in new.iterdir() if p.name != ENTRIES_FILE)
    atomic_write_text(new / ENTRIES_FILE, json.dumps(mine) + "\n")
    if not old.is_dir():
        return
    ours = _written_entries(old) or set()
    for entry in sorted(old.iterdir()):
        if entry.name not in ours and entry.name != ENTRIES_FILE and not (new / entry.name).exists():
            carry_over(entry, new / entry.name)


def resolved_path(path: str | os.PathLike) -> Path:
    """Where ``path`` lands: ``~`` expanded, made absolute, ``..`` and symbolic links resolved (parts that do not
    exist yet are kept as typed). Every check of a destination is made on this, never on the path as typed:
    ``X/new/..`` is ``X``, whether or not ``X/new`` exists."""
    return Path(os.path.expanduser(os.fspath(path))).resolve()


def path_name(path: str | os.PathLike) -> str:
    """The name of the folder or file ``path`` resolves to (``data/q/qrels/..`` is ``q``, ``.`` is the current
    folder's name), for naming a folder derived from it; never empty, ``.`` or ``..``."""
    name = resolved_path(path).name
    return name if name not in ("", ".", "..") else "root"


def check_not_precious(folder: str | os.PathLike) -> Path:
    """Refuse a file, the current folder, one of its parents, the home folder and ``/`` as an output folder."""
    out = Path(folder).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{folder} is a file; the output must be a folder (a new one, or one hf_cocodr wrote)")
    cwd = Path.cwd().resolve()
    if out == Path(out.anchor) or out == Path.home().resolve() or out == cwd or out in cwd.parents:
        raise FileExistsError(
            f"refusing to write into {folder} ({out}): it is the current folder, one of its "
            "parents, your home or the root; give a new folder, e.g. ./model"
        )
    return out


def replace_directory(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst``, replacing an existing ``dst`` with two renames."""
    src, dst = Path(src), Path(dst)
    backup = None
    if dst.exists():
        backup = staging_path(dst, backup=True)  # a kill before the second rename: the next run renames it back
        os.replace(dst, backup)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    if backup is not None:  # (a link moved aside is removed itself, never what it points to)
        with contextlib.suppress(OSError):
            remove_entry(backup)


def resolve_inside(base: str | os.PathLike, relative: str | os.PathLike, what: str = "path") -> Path:
    """Resolve ``relative`` under ``base`` and refuse anything that escapes it (``..``, absolute paths, links)."""
    base_p = Path(base).resolve()
    candidate = (base_p / relative).resolve()
    if candidate != base_p and base_p not in candidate.parents:
        raise ValueError(
            f"{what} {str(relative)!r} resolves to {candidate}, outside {base_p}; refusing to write there."
        )
    return candidate


_SPLIT_SUFFIX = re.compile(r"^(?P<head>.+):(?P<split>[A-Za-z0-9_.-]+)$", re.DOTALL)


def public_label(value: Any) -> Any:
    """A reference to local data as it may leave this machine (a card's text, an upload): a path, absolute or
    relative, reduced to its last component, with a ``:SPLIT`` suffix kept (``/home/me/acme/contracts:dev`` and
    ``data/contracts:dev`` are ``contracts:dev``). Hub ids (``org/name``, not a local path), URLs, sentences and
    non-strings are returned unchanged."""
    if not isinstance(value, str) or not value or "://" in value or any(ch.isspace() for ch in value):
        return value
    m = _SPLIT_SUFFIX.match(value)
    head, split = (m["head"], m["split"]) if m and len(m["head"]) > 1 else (value, None)
    pathlike = (
        os.path.isabs(head)
        or head.startswith(("~", "./", "../", ".\\", "..\\"))
        or (("/" in head or "\\" in head) and (split is not None or hub_id_problem(head) is not None))
        or (("/" in head or "\\" in head) and os.path.exists(head))
    )
    if not pathlike:
        return value
    name = Path(head.replace("\\", "/").rstrip("/")).name or head
    return f"{name}:{split}" if split is not None else name


# a path inside a text: a file:// address; an absolute path of two components or more, a home (~/...) or dotted
# relative (./..., ../...) one, a Windows one (C:\\...); not inside a URL (after ":" or "/") nor a word (and/or)
_PART = r"[^\s/\\\"'<>()\[\]{}|,;`]+"
_PATH_IN_TEXT = re.compile(
    r"file://[^\s\"'<>()\[\]{}`]*"
    rf"|(?<![\w:/.~\\-])(?:/{_PART}(?:/{_PART})+|(?:~|\.\.?)(?:/{_PART})+|[A-Za-z]:(?:\\{_PART})+)/?"
    rf"|(?<![\w:/.~\\-]){_PART}(?:/{_PART})+/?"  # a relative path: reduced only where it exists here
)
_TRAILING = ".,:;!?"  # sentence punctuation after a path is not part of it


def _reduced_path(match: re.Match) -> str:
    text = match[0]
    end = len(text.rstrip(_TRAILING))
    path, tail = text[:end], text[end:]
    if path.startswith("file://"):
        path = path[len("file://") :]
        return (Path(path.rstrip("/")).name or path) + tail
    if not path.startswith(("/", "~", ".")) and not re.match(r"[A-Za-z]:\\", path):
        m = _SPLIT_SUFFIX.match(path)
        if not os.path.exists(m["head"] if m else path):  # (a Hub id, a ratio, a word: not a path of this machine)
            return match[0]
    reduced = public_label(path)
    if reduced == path:  # (a form public_label keeps: its last component all the same)
        reduced = Path(path.replace("\\", "/").rstrip("/")).name or path
    return reduced + tail


def public_text(text: Any) -> Any:
    """``text`` as it may leave this machine: a whole string that is a local path reduced by :func:`public_label`,
    and in any other text every local path it holds (a ``file://`` address, an absolute path of two components or
    more, ``~/...``, ``./...``, ``../...``, ``C:\\...``) reduced to its last component, sentence punctuation and a
    ``:SPLIT`` suffix kept. URLs (``https://...``), Hub ids (``org/name``) and words with a slash (``and/or``) are
    left as they are; non-strings are returned unchanged."""
    whole = public_label(text)
    if whole != text or not isinstance(text, str):
        return whole
    return _PATH_IN_TEXT.sub(_reduced_path, text)


def public_value(obj: Any) -> Any:
    """A copy of a JSON-able value with :func:`public_text` applied to every string, mapping keys included."""
    if isinstance(obj, dict):
        return {public_text(k): public_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [public_value(v) for v in obj]
    return public_text(obj)


def hub_id_problem(value: Any, *, namespace: bool = True) -> str | None:
    """Why ``value`` is not a valid Hub repository id, or None when it is.

    The one check of repository ids in the package: ``huggingface_hub``'s own rules, and with ``namespace`` (models,
    pushes) also the ``org/name`` form; dataset ids may be a bare name (``squad``).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(value, str) or not value:
        return "it is not a non-empty string"
    if namespace and value.count("/") != 1:
        return "it must look like 'org/name'"
    try:
        validate_repo_id(value)
    except HFValidationError as e:
        return str(e)
    return None


def is_hub_id(value: Any, *, namespace: bool = True) -> bool:
    """True for a valid Hub repository id (see :func:`hub_id_problem`) that is not an existing local path."""
    return hub_id_problem(value, namespace=namespace) is None and not Path(value).expanduser().exists()


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except Exception:  # pragma: no cover - depends on the extra
        return False
    return True


NATIVE_BF16_ENV = "HF_COCODR_NATIVE_BF16"


def native_bf16() -> bool:
    """Whether this machine computes bf16 natively: a CUDA device with bf16 kernels (not emulated), or a CPU for which
    oneDNN has bf16 kernels (AVX-512 BF16 / AMX). Elsewhere bf16 autocast falls back to slow reference kernels
    (docs/precision.md).

    ``HF_COCODR_NATIVE_BF16=1`` (or ``0``) overrides the detection: every choice made from it (the corpus encodings'
    ``auto`` precision, bf16 training where the machine has it) then follows the variable, so one machine can take
    either path (the test suite pins it, and forces each path where it tests it)."""
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ConfigError(f"{NATIVE_BF16_ENV} must be 0 or 1 (or unset, to detect), got {forced!r}")
        return forced == "1"
    import torch

    if torch.cuda.is_available():  # compute capability 8 (Ampere) and later; earlier cards only emulate bf16
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@contextlib.contextmanager
def preserved_rng_state():
    """Restore the Python, NumPy and torch (CPU, CUDA) random states on exit."""
    import numpy as np
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    states = (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        (torch.cuda.get_rng_state_all() if cuda else None),
    )
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def import_mteb():
    """The ``mteb`` module, imported (on first use only: about 9 s) with the random states kept. Importing mteb
    seeds Python's, NumPy's and torch's global generators (its task objects are built at import time, each calling
    ``random.seed`` / ``np.random.seed`` / ``torch.manual_seed``): imported from a training step's save (a card that
    looks up mteb's model registry), it changed every step after the first checkpoint of a process, so a second run
    in the same process, or a run resumed in another, trained other weights. Every mteb import of the package goes
    through here first."""
    if "mteb" in sys.modules:
        return sys.modules["mteb"]
    with preserved_rng_state():
        import mteb
    return mteb


_APOSTROPHES = frozenset("'\u2019\u02bc")  # within a word: dropped, so "what's" and "whats" are one word


def normalize_query(text: str) -> str:
    """A query's words as the overlap guard, the pseudo-query exclusion and the de-duplication compare queries.

    Ignored: case (folded); punctuation (every Unicode punctuation character: ``. ? ! , ; : " ( ) [ ] - – — / …``
    and the like, anywhere in the query, separates words, so ``"query."``, ``"Query?"`` and ``"(query)"`` are one
    query, and so are ``"covid-19"`` and ``"covid 19"``); apostrophes (``'``, ``’``), which are dropped, so
    ``"what's"`` is ``"whats"``; spacing (runs of white space are one space, leading and trailing ones none);
    compatibility forms (Unicode NFKC: full-width letters, ligatures); format characters (zero-width spaces and
    joiners, soft hyphens, direction marks: the tokenizers drop them too).

    Kept: the words and their order, digits, accents (``"café"`` is not ``"cafe"``) and symbols (``+ $ % = <``:
    ``"c++"`` is not ``"c"``). A text of punctuation and invisible characters only has no words: ``""``.
    """
    text = unicodedata.normalize("NFKC", text)
    kept = []
    for ch in text:
        category = unicodedata.category(ch)
        if category == "Cf" or ch in _APOSTROPHES:
            continue
        kept.append(" " if category.startswith("P") else ch)
    return " ".join("".join(kept).casefold().split())
