"""Pushing a finished model directory to the Hugging Face Hub: encoder, Condenser head, card and results together.

The push is one commit of the model's own files, chosen by an allow-list (:func:`push_plan`): what a
sentence-transformers save writes (configuration, weights, tokenizer, the card ``README.md``, the module folders
``modules.json`` names), the Condenser head, the provenance record, the MTEB leaderboard files and the card's
evaluations as huggingface_hub 2.x reads them (``.eval_results/*.yaml``). Everything else
stays local and is named in the log: the user's own files, entries the owner record lists as there before
hf_cocodr wrote the folder, symbolic links (never followed), and the records that hold this machine's paths and
training state (owner record, lock, ``eval.json``, ``recipe.json``, checkpoints, logs, hybrid indexes, ...).
The token comes from the usual Hugging Face sources (``HF_TOKEN``, ``huggingface-cli login``) or the ``token``
argument; it is never written to a file, a card or a log line. The local directory is only read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import HubPushError  # raised here; defined with the other input errors (re-exported)
from .model_card import collect_evaluations, eval_results_files
from .rundir.run_record import EVAL_RESULTS, LOCK, RECORD
from .utils import hub_id_problem, public_text, public_value

logger = logging.getLogger(__name__)

# What a push uploads (an allow-list; everything else stays local). Files, at the top of the folder and inside the
# module folders that modules.json names: what SentenceTransformer.save / save_pretrained write (configuration,
# weights, tokenizer, card), the Condenser head, the model's provenance and its MTEB ModelMeta.
MODEL_FILES = frozenset(
    {
        "modules.json",
        "router_config.json",  # an asymmetric model's routes (a sentence-transformers Router)
        "config.json",
        "config_sentence_transformers.json",
        "sentence_bert_config.json",
        "README.md",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tokenizer.model",
        "chat_template.jinja",
        "chat_template.json",
        "condenser_head.safetensors",
        "condenser_head.json",
        "hf_cocodr_provenance.json",
        "hf_cocodr_training.json",
        "mteb_model_meta.json",
    }
)
# weight shards: model-00001-of-00003.safetensors, pytorch_model-00001-of-00003.bin
MODEL_SHARD = re.compile(r"^(model-\d+-of-\d+\.safetensors|pytorch_model-\d+-of-\d+\.bin)$")
WEIGHT_FILES = re.compile(r"^(model(-\d+-of-\d+)?\.safetensors|pytorch_model(-\d+-of-\d+)?\.bin)$")
# the MTEB leaderboard files hf-cocodr mteb writes (results/ORG__NAME/REVISION/*.json): every .json file below it
MTEB_FOLDER = "mteb_results"
# provenance files are uploaded with this machine's folder paths reduced to their last component
_PROVENANCE_FILES = ("hf_cocodr_provenance.json", "hf_cocodr_training.json")
# The tokenizer's JSON files: their strings are tokens ("</s>", "/>" are no paths), so only the values of the keys
# that name a file or folder are reduced there; every other JSON file uploaded (hf_cocodr's records, the MTEB results,
# the model's configuration) goes up with every local path reduced, as the provenance does.
_TOKENIZER_JSON = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "chat_template.json",
    }
)
_PATH_KEYS = frozenset({"name_or_path", "_name_or_path", "tokenizer_file", "vocab_file", "merges_file"})
# why the records hf_cocodr writes beside a model stay local (for the log; the allow-list alone decides)
_LOCAL_RECORDS = {
    "eval.json": "evaluation record keyed by this machine's data paths (the card shows its results)",
    "start_eval.json": "evaluation record keyed by this machine's data paths",
    "recipe.json": "the recipe's run record (local paths)",
    "plan.json": "the recipe's plan (local paths)",
    "idro_weights.json": "training record",
    "trainer_state.json": "training state",
    "training_args.bin": "training state (pickled)",
    "runs": "training logs",
    "hybrid": "retrieval indexes of the local corpus",
}


def validate_repo_id(repo_id: str) -> None:
    """Raise ``ValueError`` unless ``repo_id`` is a valid ``org/name`` Hub repository id."""
    problem = hub_id_problem(repo_id)
    if problem:
        raise ValueError(f"repository id {repo_id!r} is not valid: {problem}")


def check_push_possible(repo_id: str | None, token: str | None = None) -> None:
    """Before any training with ``push_to_hub``: a valid ``org/name``, the Hub not switched off (``HF_HUB_OFFLINE``)
    and a token to push with, so the push cannot fail for these reasons after the work is done."""
    from huggingface_hub import constants

    if not repo_id:
        raise ValueError("push_to_hub=True needs hub_model_id='org/name'")
    validate_repo_id(repo_id)
    if constants.is_offline_mode():
        raise HubPushError(
            f"push_to_hub to {repo_id} needs the Hub, but offline mode is on (HF_HUB_OFFLINE=1); unset "
            "it, or train without --push_to_hub and run `hf-cocodr push` afterwards"
        )
    if not (token or _current_token()):
        raise HubPushError(
            f"push_to_hub to {repo_id} needs a Hugging Face token: set HF_TOKEN, run `hf auth login` "
            "or pass --hub_token"
        )


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _without_local_paths(obj: Any) -> Any:
    """A copy of a JSON value in which every string that is a path on this machine, absolute or relative, keys
    included, is reduced to its last component (``:SPLIT`` kept; :func:`hf_cocodr.utils.public_label`): what the model
    was made from, without where it lay."""
    return public_value(obj)


def _path_keys_reduced(obj: Any) -> Any:
    """A copy of a tokenizer's JSON value with :func:`_without_local_paths` applied to the values of the keys that
    name a file or folder (:data:`_PATH_KEYS`, at any depth), every other string (tokens) as it is."""
    if isinstance(obj, dict):
        return {k: public_value(v) if k in _PATH_KEYS else _path_keys_reduced(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_path_keys_reduced(v) for v in obj]
    return obj


def _public_json(path: Path) -> str | bytes | None:
    """What a push uploads for the JSON file ``path``: the file itself when it names no local path, else its content
    with each local path reduced to its last component (:func:`_without_local_paths`; in the tokenizer's files, the
    values of the keys that name a file or folder); None when it is not readable JSON."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    public = _path_keys_reduced(record) if path.name in _TOKENIZER_JSON else _without_local_paths(record)
    if public == record and path.name not in _PROVENANCE_FILES:
        return str(path)
    return (json.dumps(public, indent=2, ensure_ascii=False) + "\n").encode()


def _public_markdown(path: Path) -> str | bytes:
    """What a push uploads for the text file ``path`` (the card): the file itself when it names no local path, else
    its text with each one reduced to its last component (:func:`hf_cocodr.utils.public_text`: ``file://``
    addresses, absolute and home paths, relative ones that exist here, inside sentences too)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return str(path)
    public = public_text(text)
    return str(path) if public == text else public.encode("utf-8")


def _inside(rel: Any) -> str | None:
    """The first component of a relative path that stays inside the folder; None otherwise."""
    if isinstance(rel, str) and rel and not os.path.isabs(rel) and ".." not in Path(rel).parts:
        return Path(rel).parts[0]
    return None


def _module_folders(model_dir: Path) -> set[str]:
    """The sub-folders ``modules.json`` names (``1_Pooling``, ``2_Dense``, ...), and those of a ``Router`` module
    (an asymmetric model: ``query_0_Transformer``, ``document_1_Pooling``, ... as its ``router_config.json`` lists
    them): relative, inside the folder."""
    out: set[str] = set()
    for name in ("modules.json", "router_config.json"):
        if (model_dir / name).is_symlink():
            continue
        try:
            data = json.loads((model_dir / name).read_text())
        except (OSError, ValueError):
            continue
        if name == "modules.json":
            paths = [m.get("path") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        else:  # {"structure": {"query": ["query_0_Transformer", ...], "document": [...]}, "types": {...}}
            structure = data.get("structure") if isinstance(data, dict) else None
            routes = structure.values() if isinstance(structure, dict) else []
            paths = [p for route in routes if isinstance(route, list) for p in route]
        out |= {f for f in map(_inside, paths) if f}
    return out


def _record_entries(model_dir: Path) -> tuple[set[str], set[str]]:
    """From the folder's owner record: the entries that were there before hf_cocodr wrote it (the user's), and the
    entries hf_cocodr wrote."""
    try:
        rec = json.loads((model_dir / RECORD).read_text())
    except (OSError, ValueError):
        return set(), set()
    if not isinstance(rec, dict):
        return set(), set()

    def names(key: str) -> set[str]:
        value = rec.get(key)
        return {v for v in value if isinstance(v, str)} if isinstance(value, list) else set()

    return names("preexisting"), names("files") | names("expected")


def _log_skipped(model_dir: Path, skipped: dict[str, str]) -> None:
    """Name every entry a push leaves local: a warning for each one hf_cocodr did not write (the user's files,
    links), one info line for hf_cocodr's own records and training state."""
    _, own = _record_entries(model_dir)
    ours = {k: v for k, v in skipped.items() if k.split("/")[0] in own | {RECORD, LOCK} and "symbolic link" not in v}
    for name, why in skipped.items():
        if name not in ours and why != "hidden":
            logger.warning("push: not uploading %s: %s", os.path.join(model_dir, name), why)
    if ours:
        logger.info(
            "push: keeping local what hf_cocodr wrote for this machine (records, evaluations, training state): %s",
            ", ".join(sorted(ours)),
        )


def push_plan(model_dir: str | os.PathLike) -> tuple[dict[str, Path], dict[str, str]]:
    """What a push of ``model_dir`` uploads and what it leaves local, and why.

    Returns ``(upload, skipped)``: ``upload`` maps each path in the repository to its regular file here; ``skipped``
    maps each entry left out (a folder as ``name/``) to the reason. The rules:

    * only regular files are uploaded; a symbolic link (to a file or a folder, at any depth) is never followed;
    * at the top of the folder: the model files of :data:`MODEL_FILES` and weight shards; inside the module folders
      ``modules.json`` names, the same files; below ``mteb_results/``, the ``.json`` result files; in
      ``.eval_results/``, the card's evaluations as huggingface_hub 2.x reads them (``*.yaml``);
    * an entry the owner record (``hf_cocodr_run.json``) lists under ``preexisting`` is the user's: never uploaded;
    * hidden entries, the owner record and lock, and everything else (``eval.json``, ``recipe.json``, checkpoints,
      ``runs/``, trainer state, ``hybrid/`` indexes, stage folders, the user's own files) stay local.
    """
    model_dir = Path(model_dir)
    modules = _module_folders(model_dir)
    preexisting, _ = _record_entries(model_dir)
    upload: dict[str, Path] = {}
    skipped: dict[str, str] = {}

    def model_file(name: str) -> bool:
        return name in MODEL_FILES or bool(MODEL_SHARD.match(name))

    # (which files of a folder go up, and the rules for each of its sub-folders: None = the sub-folder stays local)
    in_module = (model_file, lambda _: in_module)
    in_mteb = (lambda name: name.endswith(".json"), lambda _: in_mteb)
    in_eval = (lambda name: name.endswith(".yaml") and not name.startswith("."), lambda _: None)
    folders = {MTEB_FOLDER: in_mteb, EVAL_RESULTS: in_eval}
    top = (model_file, lambda d: in_module if d in modules else folders.get(d))

    def walk(folder: Path, rel: str, rules) -> None:
        files_ok, folder_rules = rules
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            name = rel + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            shown = f"{name}/" if is_dir else name
            if entry.is_symlink():
                skipped[name] = f"a symbolic link (to {os.readlink(entry.path)}); push never follows links"
            elif not rel and entry.name in preexisting:
                skipped[shown] = f"not hf_cocodr's: there before hf_cocodr wrote the folder ({RECORD})"
            elif entry.name.startswith(".") and not (not rel and is_dir and entry.name == EVAL_RESULTS):
                skipped[shown] = "hidden"
            elif entry.name in (RECORD, LOCK):
                skipped[name] = "hf_cocodr's owner record of the folder (local paths)"
            elif is_dir:
                sub = folder_rules(entry.name)
                if sub is None:
                    skipped[shown] = _local_reason(entry.name) if not rel else "not part of the model"
                else:
                    walk(Path(entry.path), shown, sub)
            elif not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                skipped[name] = "not a regular file"
            elif files_ok(entry.name):
                upload[name] = Path(entry.path)
            else:
                skipped[name] = _local_reason(entry.name) if not rel else "not a model file"

    walk(model_dir, "", top)
    return upload, skipped


def _local_reason(name: str) -> str:
    if name in _LOCAL_RECORDS:
        return _LOCAL_RECORDS[name]
    if name.startswith("checkpoint-"):
        return "training checkpoint"
    if name.endswith(".log"):
        return "log"
    return "not a model file"


def _eval_results(model_dir: Path) -> dict[str, bytes]:
    """The folder's evaluations (its ``eval.json`` and MTEB results) as ``.eval_results/*.yaml``, computed now from
    what the folder holds (a folder whose card was written before these files existed pushes them too; the local
    folder is not changed)."""
    return {rel: text.encode() for rel, text in eval_results_files(collect_evaluations(model_dir)).items()}


def _push_contents(model_dir: Path) -> dict[str, str | bytes]:
    """What a push uploads, by path in the repository: the model's own files (:func:`push_plan`), every JSON file
    among them (the provenance, the MTEB results, the configuration) with local paths reduced to names
    (:func:`_public_json`); refuses, naming what and why, a push that would lack ``modules.json`` or the weights."""
    upload, skipped = push_plan(model_dir)
    contents: dict[str, str | bytes] = dict(_eval_results(model_dir))
    for rel, path in upload.items():
        if path.suffix == ".md":  # the card: every local path in its text reduced to its last component
            contents[rel] = _public_markdown(path)
        elif path.suffix != ".json":
            contents[rel] = str(path)
        elif (public := _public_json(path)) is None:  # unreadable: whether it names a path cannot be told
            skipped[rel] = "not readable JSON"
        else:
            contents[rel] = public
    _log_skipped(model_dir, skipped)
    missing = [] if "modules.json" in contents else ["modules.json"]
    if not any(WEIGHT_FILES.match(Path(rel).name) for rel in contents):
        missing.append("the model weights (model.safetensors)")
    if missing:
        why = "; ".join(
            f"{k}: {v}"
            for k, v in skipped.items()
            if Path(k).name in ("modules.json",) or WEIGHT_FILES.match(Path(k.rstrip("/")).name)
        )
        raise HubPushError(
            f"push of {model_dir}: {' and '.join(missing)} would not be uploaded"
            f"{f' ({why})' if why else ''}; push uploads only the model's own regular files: copy "
            "the model into a folder of real files (cp -rL) and push that"
        )
    return contents


def push_directory(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> str:
    """Upload a model directory to ``repo_id`` in one commit; returns the commit URL.

    Args:
        model_dir: a sentence-transformers directory (``modules.json``) written by hf_cocodr or any other tool.
        repo_id: ``org/name``.
        private: create the repository as private (an existing repository keeps its visibility).
        revision: a branch to push to (created from ``main`` if missing).
        commit_message: default ``"Upload <name> with hf_cocodr"``.
        token: a Hub token; default: the usual Hugging Face sources.
    """
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    validate_repo_id(repo_id)
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} not found")
    if not (model_dir / "modules.json").is_file():
        raise ValueError(
            f"{model_dir} is not a sentence-transformers directory (no modules.json); "
            "export it first with `hf-cocodr export` or `hf-cocodr convert`"
        )
    contents = _push_contents(model_dir)
    api = HfApi(token=token)
    tok = token or _current_token()
    message = commit_message or f"Upload {model_dir.name} with hf_cocodr"
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=src) for rel, src in sorted(contents.items())]
    logger.info("pushing %d files of %s to %s: %s", len(operations), model_dir, repo_id, ", ".join(sorted(contents)))
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.create_commit(
            repo_id=repo_id, operations=operations, commit_message=message, revision=revision, repo_type="model"
        )
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        raise HubPushError(
            _redact(
                f"push of {model_dir} to {repo_id} failed (HTTP {status}): "
                f"{str(e).splitlines()[0]}; nothing local was changed",
                tok,
            )
        ) from None
    except OSError as e:  # connection refused, DNS, timeouts
        raise HubPushError(
            _redact(
                f"push of {model_dir} to {repo_id} failed: cannot reach the Hub ({e}); nothing local was changed", tok
            )
        ) from None
    url = getattr(info, "commit_url", None) or str(info)
    logger.info("pushed %s to %s%s: %s", model_dir, repo_id, f"@{revision}" if revision else "", url)
    return url


def _current_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # pragma: no cover
        return None
