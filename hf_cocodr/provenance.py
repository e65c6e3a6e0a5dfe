"""Where an hf_cocodr model came from and how it was made: ``hf_cocodr_provenance.json`` in every output.

Every output folder (export, convert, pretrain, finetune, recipe) holds one JSON file with:

* ``base_model`` (a Hub id when the starting model is one, or a local copy of one), ``base_model_revision`` (when
  known) and ``base_model_source`` (the local folder it was read from and its fingerprint);
* ``stages`` / ``methods`` / ``datasets``: every training stage the model went through, in order (a stage of a later
  run is appended to those of the model it started from);
* ``stage_runs``: per stage, the run that made it (run id, fingerprints of its starting model and data, the settings
  that change its trajectory), read from the output folder's owner record (:mod:`hf_cocodr.rundir.run_record`);
* ``settings`` (pooling, similarity, lengths), ``versions`` (the libraries that wrote it), ``start_vs_adapted``
  (starting model vs this model, when a run measured both) and ``model_name`` (the user's name for it).

The model card (:mod:`hf_cocodr.model_card`) and the MTEB ``ModelMeta`` (:mod:`hf_cocodr.evaluation.mteb`) are read
from it; export, convert and push carry it over. Older outputs hold the same record as ``hf_cocodr_training.json``,
which is still read.
"""

from __future__ import annotations

import json
import logging
import os
import re
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from .rundir.run_record import PROVENANCE_FILE, fingerprint, read_record
from .utils import atomic_write_json, import_mteb, is_hub_id

logger = logging.getLogger(__name__)

LEGACY_TRAINING_INFO_FILE = "hf_cocodr_training.json"
FORMAT_VERSION = 1

# hf_cocodr commands whose owner record describes a training stage, and the stage type each writes
_COMMAND_STAGE = {"finetune": "finetune", "pretrain": "coco"}
_USAGE_ID_RE = re.compile(r"""(?:SentenceTransformer|from_pretrained)\(\s*["']([A-Za-z0-9][\w.\-]*/[\w.\-]+)["']""")
_COCODR_BASE_RE = re.compile(r"(^|/)(cocodr|coco-dr)", re.IGNORECASE)


def read_provenance(directory: str | os.PathLike | None) -> dict[str, Any]:
    """The provenance record of a model folder (``{}`` when it has none or it is unreadable)."""
    if directory is None:
        return {}
    for name in (PROVENANCE_FILE, LEGACY_TRAINING_INFO_FILE):
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            logger.warning("%s is not valid JSON; the model's provenance cannot be read from it.", path)
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def is_hub_model_id(value: Any) -> bool:
    """``value`` is a Hub model id (``org/name``) and not a local path (:func:`hf_cocodr.utils.is_hub_id`)."""
    return is_hub_id(value)


def start_path(model) -> str | None:
    """The folder or Hub id a SentenceTransformer's weights were loaded from (its transformers ``_name_or_path``)."""
    try:
        auto = getattr(model[0], "auto_model", None) or getattr(model[0], "model", None)
        name = getattr(getattr(auto, "config", None), "_name_or_path", None)
    except Exception:  # not a sentence-transformers model
        return None
    return str(name) if name else None


def read_card(folder: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The front matter (as a dict) and the Markdown text of a folder's ``README.md``, read by ``huggingface_hub``'s
    ``ModelCard`` (the Hub's own parser); ``({}, "")`` without a card, ``({}, text)`` for a card without front matter,
    ``({}, "")`` for one that cannot be parsed."""
    readme = Path(folder) / "README.md"
    if not readme.is_file():
        return {}, ""
    from huggingface_hub import ModelCard  # 0.5 s to import: only a folder with a card needs it

    hub_logger = logging.getLogger("huggingface_hub.repocard")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # a card without front matter is normal here, not worth its warning
    try:
        card = ModelCard.load(readme, ignore_metadata_errors=True)  # a Path: never looked up on the Hub
    except Exception:  # malformed YAML or not UTF-8: a bad card does not stop anything
        return {}, ""
    finally:
        hub_logger.setLevel(level)
    return card.data.to_dict(), card.text


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@lru_cache(maxsize=64)
def _resolve_hub_id(folder: str) -> tuple[str | None, str | None, str]:
    path = Path(folder)
    parts = path.parts
    for i, part in enumerate(parts):  # the Hugging Face cache: .../models--org--name/snapshots/<commit>
        if (
            part.startswith("models--")
            and part.count("--") >= 2
            and i + 2 < len(parts)
            and parts[i + 1] == "snapshots"
        ):
            return part[len("models--") :].replace("--", "/", 1), parts[i + 2], "Hugging Face cache layout"
    meta, body = read_card(path)
    title = next((line[2:].strip() for line in body.splitlines() if line.startswith("# ")), "")
    names = {_norm(n) for n in (title, path.name) if n}

    def named(candidate: str) -> bool:
        return _norm(candidate.split("/", 1)[1]) in names or _norm(candidate) in names

    for candidate in dict.fromkeys(_USAGE_ID_RE.findall(body)):  # the card's own usage example names the model
        if named(candidate):
            return candidate, None, "the model card's usage example"
    config = path / "config.json"
    if config.is_file():
        try:
            name_or_path = json.loads(config.read_text()).get("_name_or_path")
        except (OSError, ValueError):
            name_or_path = None
        if is_hub_model_id(name_or_path) and named(name_or_path):
            return name_or_path, None, "config.json _name_or_path"
    if title:  # a card that names a model mteb knows
        try:
            import_mteb()  # (the random states kept: hf_cocodr.utils.import_mteb)
            from mteb.models.get_model_meta import MODEL_REGISTRY  # 9 s to import: only a titled card needs it

            hits = [
                n for n in MODEL_REGISTRY if _norm(n.split("/", 1)[-1]) == _norm(title) or _norm(n) == _norm(title)
            ]
        except Exception:
            hits = []
        if len(hits) == 1:
            return hits[0], None, "the mteb model registry (by the card's title)"
    base = meta.get("base_model")
    base = base[0] if isinstance(base, list) and len(base) == 1 else base
    if is_hub_model_id(base):  # a local fine-tune of a Hub model: its nearest Hub ancestor
        return base, None, "the model card's base_model"
    return None, None, ""


def resolve_hub_id(folder: str | os.PathLike) -> tuple[str | None, str | None]:
    """The Hub id (and revision, when known) of a local copy of a Hub model, else ``(None, None)``.

    Read, in this order, from the Hugging Face cache layout (``models--org--name/snapshots/<commit>``), the card's
    usage example (``SentenceTransformer("org/name")`` whose name is the card's title or the folder's name),
    ``config.json``'s ``_name_or_path`` (when it names this model rather than its base), the mteb model registry (a
    single model named as the card's title), and last the card's ``base_model`` (the nearest Hub ancestor).
    """
    hub_id, revision, how = _resolve_hub_id(str(Path(folder).expanduser().resolve()))
    if hub_id:
        logger.debug("%s is a copy of %s (from %s)", folder, hub_id, how)
    return hub_id, revision


def source_info(source: str | os.PathLike | None) -> dict[str, Any]:
    """What a model made from ``source`` inherits: its provenance (stages, methods, data sets, base model) and, for a
    folder hf_cocodr did not train, the Hub model it is a copy of (``base_model``, ``base_model_revision``) and the
    folder itself (``base_model_source``: path and fingerprint)."""
    if source is None:
        return {}
    name = str(source)
    path = Path(name).expanduser()
    if path.name.startswith("."):  # a staging folder of an export or a save: not where a model comes from
        return {}
    if path.is_dir():
        info = read_provenance(path)
        if not info.get("stages") and not info.get("base_model_source"):
            info["base_model_source"] = {
                "path": str(path.resolve()),
                "fingerprint": fingerprint(str(path.resolve())),  # (its files' hashes, memoized)
            }
        if not info.get("base_model") and not info.get("stages"):  # a trained model keeps its own (local) base
            hub_id, revision = resolve_hub_id(path)
            if hub_id:
                info["base_model"] = hub_id
                if revision:
                    info["base_model_revision"] = revision
        return info
    if is_hub_model_id(name):
        return {"base_model": name}
    return {}


def is_cocodr_model(info: dict[str, Any]) -> bool:
    """A COCO-DR model: a COCO stage ran, or the base is a COCO-DR checkpoint (``OpenMatch/cocodr-*``)."""
    stages = [s for s in info.get("stages") or [] if isinstance(s, dict)]
    if any(s.get("type") == "coco" or s.get("method") == "coco" for s in stages) or "coco" in (
        info.get("methods") or []
    ):
        return True
    base = info.get("base_model")
    return isinstance(base, str) and bool(_COCODR_BASE_RE.search(base))


def versions() -> dict[str, str]:
    """Versions of hf_cocodr and the libraries that shape a model file."""
    from . import __version__

    out = {"hf_cocodr": __version__}
    for dist in ("torch", "transformers", "sentence-transformers", "huggingface-hub", "mteb"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _stages_continue(earlier: list, later: list) -> bool:
    return len(earlier) <= len(later) and list(later[: len(earlier)]) == list(earlier)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def update_provenance(
    directory: str | os.PathLike,
    model,
    given: dict[str, Any],
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance of the model being written to ``directory``: what the folder already records, the fields
    ``given`` by the writer (a trainer's card data, an export's source), what the starting model's folder records
    (when this model continues its stages) and this run's owner record (fingerprints and settings of the stage).

    Returns the record; :func:`write_provenance` stores it.
    """
    directory = Path(directory)
    prov = {**read_provenance(directory), **_jsonable({k: v for k, v in given.items() if v is not None})}
    start = start_path(model)
    if start and Path(start).expanduser().is_dir() and Path(start).resolve() != directory.resolve():
        inherited = source_info(start)
        if _stages_continue(inherited.get("stages") or [], prov.get("stages") or []):
            same_base = not prov.get("base_model") or prov.get("base_model") == inherited.get("base_model")
            for key, value in _jsonable(inherited).items():
                if key.startswith("base_model") and not same_base:
                    continue
                if key in ("base_model", "base_model_revision", "base_model_source", "stage_runs"):
                    prov.setdefault(key, value)
    elif start and not prov.get("base_model") and is_hub_model_id(start):
        prov["base_model"] = start
    stages = prov.get("stages") or []
    record = read_record(directory)
    if record and isinstance(record.get("identity"), dict) and stages:
        runs = list(prov.get("stage_runs") or [])
        if _COMMAND_STAGE.get(record.get("command")) == stages[-1].get("type") and len(runs) < len(stages):
            identity = record["identity"]
            runs += [None] * (len(stages) - 1 - len(runs))
            runs.append(
                _jsonable(
                    {
                        "command": record.get("command"),
                        "run_id": record.get("run_id"),
                        "started": record.get("started"),
                        "start_model": identity.get("model"),
                        "data_fingerprint": identity.get("data"),
                        "settings": identity.get("settings"),
                    }
                )
            )
        prov["stage_runs"] = runs
    prov["format"] = FORMAT_VERSION
    if settings:
        prov["settings"] = _jsonable(settings)
    prov["versions"] = versions()
    return prov


def write_provenance(directory: str | os.PathLike, provenance: dict[str, Any]) -> Path:
    """Store ``provenance`` as ``hf_cocodr_provenance.json`` (atomically); it is read before an older
    ``hf_cocodr_training.json`` of the folder, which is left as it is."""
    path = Path(directory) / PROVENANCE_FILE
    atomic_write_json(path, _jsonable(provenance))
    return path
