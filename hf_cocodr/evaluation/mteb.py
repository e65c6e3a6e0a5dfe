"""MTEB 2.x integration: any BEIR folder as an MTEB retrieval task, a generated ``ModelMeta``, leaderboard-layout results.

* :func:`beir_task` turns a BEIR folder and split into a local ``mteb.abstasks.AbsTaskRetrieval`` (documents are read
  as ``title + " " + text``, exactly as :func:`hf_cocodr.evaluate_retrieval` encodes them).
* :func:`model_meta_for` builds the ``mteb.ModelMeta`` of a model directory: pooling and similarity read from the
  model, parameter counts, embedding size, and the training data and base model declared in
  ``hf_cocodr_provenance.json``; a model mteb already knows (or its adaptation) starts from mteb's registered meta.
* :func:`run_mteb` runs ``mteb.evaluate`` offline and writes the layout the MTEB results repository expects:
  ``OUT/results/ORG__NAME/REV/{TASK}.json`` next to ``OUT/results/ORG__NAME/REV/model_meta.json``.
* :func:`mteb_meta_snippet` prints the ``ModelMeta(...)`` for an mteb model-implementation PR and the steps of a
  results submission.

Offline runs: the model is loaded locally (:func:`hf_cocodr.load_encoder`) and handed to ``mteb.evaluate`` wrapped in
mteb's ``SentenceTransformerEncoderWrapper`` with the generated ``ModelMeta`` attached, so mteb never resolves the
model name on the Hub, and ``model_meta.json`` holds the same metadata (and loader) as the model-implementation PR.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAIN_SCORE = "ndcg_at_10"
RESULTS_REPO = "https://github.com/embeddings-benchmark/results"
MTEB_REPO = "https://github.com/embeddings-benchmark/mteb"
TRAINING_CODE_URL = "https://github.com/hf-cocodr/hf_cocodr"
DEFAULT_LANGUAGES = ("eng-Latn",)

_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*/[A-Za-z0-9][A-Za-z0-9._\-]*$")
_TASK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")

# BEIR folder names whose MTEB task is not the same word (the others match case-insensitively, e.g. scifact/SciFact).
_BEIR_TO_MTEB = {
    "fiqa": "FiQA2018",
    "webis-touche2020": "Touche2020",
    "touche2020": "Touche2020",
    "dbpedia-entity": "DBPedia",
    "quora": "QuoraRetrieval",
    "cqadupstack": "CQADupstackRetrieval",
    "msmarco": "MSMARCO",
}

# Files of a model directory that describe it but are not part of the model (ignored by the content hash).
_NOT_MODEL_FILES = {"README.md", "eval.json", "hf_cocodr_provenance.json", "hf_cocodr_training.json", "trainer_state.json",
                    "training_args.bin"}


# --------------------------------------------------------------------------------------------------- validation
def check_model_name(model_name: str | None) -> str:
    """Validate an MTEB model name (``ORG/NAME``, as on the Hub) and return it.

    Raises:
        ValueError: if the name is missing or not of the form ``organization/model_name``.
    """
    if not model_name or not _MODEL_NAME_RE.match(str(model_name)):
        raise ValueError(
            f"--model-name must look like ORG/NAME (e.g. 'my-org/cocodr-base-scifact'), got {model_name!r}: MTEB "
            "stores results under results/ORG__NAME/REV/ and refuses model names without an organisation."
        )
    return str(model_name)


def check_revision(revision: str) -> str:
    """Validate a revision label (a Hub commit SHA or any folder-safe label) and return it."""
    if not revision or not _REVISION_RE.match(str(revision)):
        raise ValueError(
            f"--revision must be a Hub commit SHA or a label of letters, digits, '.', '_' and '-', got {revision!r}."
        )
    return str(revision)


def check_task_name(task_name: str) -> str:
    """Validate a local task name: a file name (``{TASK}.json``) that does not shadow a built-in MTEB task."""
    if not task_name or not _TASK_NAME_RE.match(str(task_name)):
        raise ValueError(
            f"--task-name must be letters, digits, '.', '_' and '-' (it becomes the file name {{TASK}}.json), "
            f"got {task_name!r}."
        )
    builtin = _mteb_task_names().get(_norm(task_name))
    if builtin is not None:
        raise ValueError(
            f"task name {task_name!r} is the built-in MTEB task {builtin!r}: results of a local folder under that name "
            f"would be mistaken for the official task. Use --tasks {builtin} for the official task, or another name "
            f"for the local folder (e.g. {task_name}-local)."
        )
    return str(task_name)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@lru_cache(maxsize=1)
def _mteb_task_names() -> dict[str, str]:
    """Normalised name → MTEB task name, for every task in the installed mteb (no network)."""
    import mteb

    return {_norm(t.metadata.name): t.metadata.name for t in mteb.get_tasks()}


@lru_cache(maxsize=1)
def _mteb_retrieval_task_names() -> dict[str, str]:
    import mteb

    return {_norm(t.metadata.name): t.metadata.name for t in mteb.get_tasks(task_types=["Retrieval"])}


# --------------------------------------------------------------------------------------------------------- hashing
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
    files = [folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / f"{split}.tsv"]
    return _hash_files([p for p in files if p.is_file()], folder)


def model_revision(model) -> str:
    """A content hash of what a SentenceTransformer computes: its weights, pooling, similarity and lengths.

    Used as the results revision when none is given (for an unpublished model there is no Hub commit yet).
    """
    import torch

    from ..modeling.loading import pooling_mode

    h = hashlib.sha256()
    desc = [pooling_mode(model), str(_similarity_name(model)), getattr(model, "max_seq_length", None)]
    h.update(json.dumps(desc, default=str).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode() + b"\0")
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    tok = getattr(model, "tokenizer", None)
    vocab = getattr(tok, "get_vocab", None)
    if callable(vocab):
        h.update(json.dumps(sorted(vocab().items())).encode())
    return h.hexdigest()[:40]


# ------------------------------------------------------------------------------------------------------------ task
@lru_cache(maxsize=1)
def _beir_task_base():
    """The ``AbsTaskRetrieval`` subclass behind :func:`beir_task` (built on first use: mteb is a heavy import)."""
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
            from ..data.beir import load_beir

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
        folder: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``).
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
    from mteb.abstasks.task_metadata import TaskMetadata

    from ..data.beir import load_beir

    folder = Path(folder).expanduser()
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


# ------------------------------------------------------------------------------------------------------ model meta
def _similarity_name(model) -> str:
    name = getattr(model, "similarity_fn_name", None) or "cosine"
    return str(getattr(name, "value", name))


def read_training_info(model_dir: str | os.PathLike | None) -> dict[str, Any]:
    """The provenance record of a model directory (``hf_cocodr_provenance.json``, or the older
    ``hf_cocodr_training.json``; ``{}`` when absent or unreadable)."""
    from ..provenance import read_provenance

    return read_provenance(model_dir)


def _dataset_label(spec: str) -> str:
    """``"../data/scifact"`` → ``"scifact"``, ``"squad-v1.1:train"`` → ``"squad-v1.1"``."""
    spec = str(spec).strip().rstrip("/\\")
    if ":" in spec and not re.match(r"^[A-Za-z]:[\\/]", spec):  # "name:split", not a Windows drive
        spec = spec.rsplit(":", 1)[0]
    name = Path(spec).name or spec
    for suffix in (".jsonl", ".json", ".tsv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def mteb_dataset_name(spec: str) -> str:
    """The MTEB name of a training data set when MTEB has it (``scifact`` → ``SciFact``), else its own label."""
    label = _dataset_label(spec)
    known = _mteb_retrieval_task_names()
    alias = _BEIR_TO_MTEB.get(label.lower())
    if alias and _norm(alias) in known:
        return known[_norm(alias)]
    return known.get(_norm(label), label)


def declared_training_datasets(info: dict[str, Any]) -> set[str]:
    """Every data set a model saw, from its training info: COCO corpora, fine-tuning sources and ``datasets``.

    COCO pretraining reads the target corpora (documents only) and counts as training on them: MTEB uses this to mark
    results on those tasks as not zero-shot. Names are mapped to MTEB task names where MTEB has the data set.
    """
    specs: list[str] = []
    for stage in info.get("stages") or []:
        if not isinstance(stage, dict):
            continue
        specs += [str(c) for c in stage.get("corpora") or []]
        if stage.get("source_data"):
            specs.append(str(stage["source_data"]))
    specs += [str(d) for d in info.get("datasets") or []]
    return {mteb_dataset_name(s) for s in specs if str(s).strip()}


def _readme_front_matter(model_dir: Path | None) -> dict[str, Any]:
    if model_dir is None or not (model_dir / "README.md").is_file():
        return {}
    text = (model_dir / "README.md").read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        import yaml

        data = yaml.safe_load(text[3:end])
    except Exception:  # a malformed card must not break the metadata
        return {}
    return data if isinstance(data, dict) else {}


def _release_date(model_dir: Path | None) -> str:
    """The date of the newest weight file (the day the model was written), else today."""
    stamps = []
    if model_dir is not None:
        stamps = [p.stat().st_mtime for pat in ("*.safetensors", "*.bin") for p in model_dir.glob(pat)]
    ts = max(stamps) if stamps else datetime.datetime.now().timestamp()
    return datetime.date.fromtimestamp(ts).isoformat()


def _hub_id(value: Any) -> str | None:
    """``value`` when it looks like a Hub model id (``org/name``) rather than a local path, else None."""
    if not isinstance(value, str) or not _MODEL_NAME_RE.match(value):
        return None
    return None if Path(value).expanduser().exists() else value


# Self-contained (only sentence-transformers and mteb): mteb_meta_snippet copies this function into the PR snippet.
def cocodr_sentence_transformer_loader(
    model_name: str,
    revision: str | None = None,
    device: str | None = None,
    pooling_mode: str = "cls",
    similarity_fn_name: str = "dot",
    max_seq_length: int | None = None,
    **kwargs: Any,
):
    """Load a raw transformers checkpoint (no ``modules.json``) as an MTEB encoder with COCO-DR's pooling/similarity.

    CLS pooling and dot-product similarity by default, instead of sentence-transformers' mean-pooling fallback.
    """
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    hub = {"revision": revision} if revision else {}
    transformer = Transformer(
        model_name, max_seq_length=max_seq_length, model_kwargs=dict(hub), processor_kwargs=dict(hub),
        config_kwargs=dict(hub),
    )
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    model = SentenceTransformer(modules=[transformer, pooling], similarity_fn_name=similarity_fn_name, device=device)
    return SentenceTransformerEncoderWrapper(model, revision=revision, **kwargs)


def model_meta_for(
    model_dir: str | os.PathLike | None,
    model_name: str,
    revision: str | None = None,
    *,
    model=None,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    license: str | None = None,
    release_date: str | None = None,
    training_datasets: Iterable[str] | None = None,
    adapted_from: str | None = None,
    public_training_code: str | None = TRAINING_CODE_URL,
    public_training_data: str | bool | None = None,
    reference: str | None = None,
    contacts: Sequence[str] | None = None,
    citation: str | None = None,
    raw_checkpoint: bool | None = None,
):
    """The ``mteb.ModelMeta`` of a model directory, as an mteb model-implementation PR would declare it.

    For a model mteb already knows (``model_name`` itself, or the base model it was adapted from, e.g.
    ``sentence-transformers/all-MiniLM-L6-v2``; ``mteb.get_model_meta`` reads mteb's registry offline), the registry's
    meta is the starting point and only what adaptation changed is replaced: name, revision, loader, the training data
    added by hf_cocodr's stages, the release date of this model (when a stage trained it), ``adapted_from``, and the
    pooling / similarity / sizes when the exported model differs. Other models get mteb's own
    ``ModelMeta.from_sentence_transformer_model`` (no Hub access), completed from the model and the directory.

    Read from the model: pooling and similarity, ``n_parameters``, ``n_embedding_parameters``, ``embed_dim``,
    ``max_tokens`` and ``memory_usage_mb``; from ``hf_cocodr_provenance.json``: the training data sets (COCO corpora,
    fine-tuning source, ``datasets``) and the base model (``adapted_from``; for a local copy of a Hub model, the Hub
    id it was resolved to); from the card's front matter: the license. The COCO-DR citation is set only for COCO-DR
    models (a COCO stage ran, or the base is a COCO-DR checkpoint). A sentence-transformers directory gets mteb's
    ``SentenceTransformerEncoderWrapper`` as loader; a raw checkpoint gets :func:`cocodr_sentence_transformer_loader`
    with its pooling and similarity.

    Args:
        model_dir: the model directory (``None`` when only ``model`` is given).
        model_name: the published name, ``ORG/NAME``.
        revision: the Hub commit SHA of the published model (default: a content hash of the weights).
        model: the already loaded SentenceTransformer (default: loaded from ``model_dir``).
        languages: ISO 639-3 + script codes the model is meant for (a known model keeps its own unless these differ
            from the default).
        license: default: the known model's or the card's license, else ``apache-2.0`` (the hf_cocodr card's default).
        release_date: ``YYYY-MM-DD`` (default: the date of the weight files; a known model that no stage trained keeps
            its own).
        training_datasets: extra data sets to declare, on top of those read from the provenance. Without either (and
            no known base), ``training_datasets`` is ``None``: unknown to MTEB, whose zero-shot status is then unknown.
        adapted_from: the base model (default: ``base_model`` from the provenance or card, when a Hub id).
        raw_checkpoint: whether the published model lacks ``modules.json`` (so its loader must set CLS pooling);
            default: read from ``model_dir``, else False.

    Returns:
        A validated ``mteb.models.ModelMeta``.

    Raises:
        ValueError: bad model name, revision, language code or license.
        FileNotFoundError: ``model_dir`` is not a model directory.
    """
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    from ..model_card import CITATIONS
    from ..modeling.loading import is_sentence_transformers_dir, load_encoder, pooling_mode
    from ..provenance import is_cocodr_model, resolve_hub_id

    model_name = check_model_name(model_name)
    path = None
    if model_dir is not None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {path} not found.")
    if model is None:
        if path is None:
            raise ValueError("model_meta_for needs a model directory or a loaded model.")
        model = load_encoder(path)
    revision = check_revision(revision) if revision is not None else model_revision(model)

    info = read_training_info(path)
    card = _readme_front_matter(path)
    trained = bool(info.get("stages"))
    base = adapted_from or _hub_id(info.get("base_model")) or _hub_id(card.get("base_model"))
    if base is None and path is not None and not trained:  # a local copy of a Hub model keeps its origin
        base = _hub_id(resolve_hub_id(path)[0])
    if base == model_name:
        base = None
    known = _registry_meta(model_name) or (_registry_meta(base) if base else None)
    # Training data: none declared and no provenance is unknown (None), not "none" (an empty set).
    ours = None
    if trained or info.get("datasets") or training_datasets is not None:
        ours = declared_training_datasets(info) | {mteb_dataset_name(d) for d in training_datasets or []}

    params = list(model.parameters())
    n_parameters = int(sum(p.numel() for p in params))
    memory_mb = round(sum(p.numel() * p.element_size() for p in params) / 2**20, 1)
    n_embedding = None
    with contextlib.suppress(Exception):
        n_embedding = int(model[0].auto_model.get_input_embeddings().weight.numel())
    pool = pooling_mode(model) or "unknown"
    similarity = _similarity_name(model)
    if raw_checkpoint is None:
        raw_checkpoint = path is not None and not is_sentence_transformers_dir(path)
    is_st = not raw_checkpoint
    prompts = {k: v for k, v in (getattr(model, "prompts", None) or {}).items() if v}
    cocodr = is_cocodr_model({**info, "base_model": base or info.get("base_model")})
    if citation is None and cocodr:
        citation = CITATIONS["cocodr"]["bibtex"]
        if known is not None and known.citation:
            citation = f"{citation}\n\n{known.citation.strip()}"
    ours_changed = {
        "name": model_name,
        "revision": revision,
        "loader": _sentence_transformers_loader() if is_st else cocodr_sentence_transformer_loader,
        "loader_kwargs": {} if is_st else {"pooling_mode": pool, "similarity_fn_name": similarity},
        "adapted_from": base,
    }

    if known is not None:
        renamed = known.name != model_name
        fields = dict(known)
        fields.update(ours_changed)
        if trained or release_date:
            fields["release_date"] = release_date or _release_date(path)
        if ours is not None or known.training_datasets is not None:
            fields["training_datasets"] = set(known.training_datasets or set()) | (ours or set())
        measured = {"similarity_fn_name": ScoringFunction(similarity), "max_tokens": model.max_seq_length,
                    "embed_dim": int(model.get_embedding_dimension()), "n_parameters": n_parameters}
        for key, value in measured.items():
            if fields.get(key) != value:
                fields[key] = value
        if fields["n_parameters"] != known.n_parameters:
            fields.update(memory_usage_mb=memory_mb, n_embedding_parameters=n_embedding)
        if tuple(languages) != tuple(DEFAULT_LANGUAGES):
            fields["languages"] = list(languages)
        if license:
            fields["license"] = license
        if trained and public_training_code:
            fields["public_training_code"] = public_training_code
        if public_training_data is not None:
            fields["public_training_data"] = public_training_data
        if renamed:
            fields["reference"] = reference or f"https://huggingface.co/{model_name}"
        elif reference:
            fields["reference"] = reference
        if citation is not None:
            fields["citation"] = citation
        if contacts:
            fields["contacts"] = list(contacts)
        if path is not None and any(path.glob("*.safetensors")) and "safetensors" not in fields["framework"]:
            fields["framework"] = [*fields["framework"], "safetensors"]
        return ModelMeta(**fields)

    with warnings_quiet():  # mteb's own helper, without the Hub
        meta = ModelMeta.from_sentence_transformer_model(model, revision=revision, fill_missing=None,
                                                         fetch_from_hf=False)
    framework = list(dict.fromkeys([*meta.framework, "Sentence Transformers", "PyTorch"]))
    if path is not None and any(path.glob("*.safetensors")):
        framework.append("safetensors")
    fields = dict(meta)
    fields.update(
        ours_changed,
        release_date=release_date or _release_date(path),
        languages=list(languages),
        n_parameters=n_parameters,
        n_embedding_parameters=n_embedding if n_embedding is not None else meta.n_embedding_parameters,
        memory_usage_mb=memory_mb,
        max_tokens=model.max_seq_length,
        embed_dim=int(model.get_embedding_dimension()),
        license=license or card.get("license") or "apache-2.0",
        open_weights=True,
        public_training_code=public_training_code,
        public_training_data=public_training_data,
        framework=framework,
        reference=reference or f"https://huggingface.co/{model_name}",
        similarity_fn_name=ScoringFunction(similarity),
        use_instructions=bool(prompts),
        training_datasets=ours,
        model_type=["dense"],
        modalities=["text"],
        citation=citation,
        contacts=list(contacts) if contacts else None,
    )
    return ModelMeta(**fields)


def _registry_meta(name: str | None):
    """mteb's registered ``ModelMeta`` of ``name`` (offline: mteb's own registry), else None."""
    if not name:
        return None
    try:
        import mteb
        from mteb.models.get_model_meta import MODEL_REGISTRY

        if name not in MODEL_REGISTRY:
            return None
        with warnings_quiet():
            return mteb.get_model_meta(name, fetch_from_hf=False)
    except Exception:  # an mteb without this registry layout: treat the model as unknown
        return None


def _sentence_transformers_loader():
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    return SentenceTransformerEncoderWrapper


def mteb_model(model, meta):
    """An MTEB encoder for a loaded SentenceTransformer, carrying ``meta`` (so ``mteb.evaluate`` runs it offline).

    ``mteb.evaluate`` uses the ``mteb_model_meta`` of the object it gets for the results path and ``model_meta.json``
    and never loads the model by name; the wrapper encodes queries with ``encode_query`` and documents with
    ``encode_document`` and scores with the model's own similarity.
    """
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper

    with warnings_quiet():
        wrapped = SentenceTransformerEncoderWrapper(model)
    wrapped.mteb_model_meta = meta
    return wrapped


# -------------------------------------------------------------------------------------------------------- running
@contextlib.contextmanager
def warnings_quiet() -> Iterator[None]:
    """Silence mteb's INFO logs, ``datasets`` progress bars and deprecation chatter for the duration of a call."""
    import warnings

    import datasets

    loggers = [logging.getLogger(n) for n in ("mteb", "sentence_transformers", "datasets")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if not bars_were_disabled:
            datasets.enable_progress_bars()


def results_dir(output_folder: str | os.PathLike, model_name: str, revision: str) -> Path:
    """``OUT/results/ORG__NAME/REV``: where MTEB writes task results and ``model_meta.json``."""
    return Path(output_folder) / "results" / model_name.replace("/", "__").replace(" ", "_") / revision


def _builtin_tasks(names: Sequence[str], languages: Sequence[str] | None = None) -> list:
    import mteb

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


def _is_offline_error(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        name = type(exc).__name__
        if isinstance(exc, ConnectionError) or name in {
            "OfflineModeIsEnabled", "LocalEntryNotFoundError", "DatasetNotFoundError", "ConnectionError", "ConnectError",
            "ConnectTimeout",
        }:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


class MTEBDataUnavailableError(FileNotFoundError):
    """A built-in MTEB task's dataset is neither cached locally nor downloadable (e.g. the Hub is unreachable)."""


def _summarise(task_result) -> dict[str, Any]:
    """Main score and headline metrics of a ``TaskResult`` (averaged over subsets when there are several)."""
    keys = {"main_score": "main_score", "ndcg@10": "ndcg_at_10", "recall@100": "recall_at_100", "mrr@10": "mrr_at_10"}
    out: dict[str, Any] = {"splits": sorted(task_result.scores)}
    entries = [e for split in task_result.scores.values() for e in split]
    for label, key in keys.items():
        vals = [float(e[key]) for e in entries if e.get(key) is not None]
        out[label] = round(sum(vals) / len(vals), 6) if vals else None
    if len(entries) > 1:
        out["subsets"] = len(entries)
    return out


def run_mteb(
    model,
    folder: str | os.PathLike | None = None,
    split: str = "test",
    task_name: str | None = None,
    model_name: str | None = None,
    revision: str | None = None,
    output_folder: str | os.PathLike = "mteb_results",
    *,
    tasks: Sequence[Any] | None = None,
    batch_size: int = 64,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    task_languages: Sequence[str] | None = None,
    overwrite: bool = False,
    prediction_folder: str | os.PathLike | None = None,
    co2_tracker: bool = False,
    device: str | None = None,
    meta_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate a model with ``mteb.evaluate`` on a local BEIR split and/or built-in MTEB tasks.

    Results land in the MTEB results-repository layout: ``OUT/results/ORG__NAME/REV/{TASK}.json`` and
    ``OUT/results/ORG__NAME/REV/model_meta.json`` (the generated :func:`model_meta_for`), so the revision folder can be
    copied into ``embeddings-benchmark/results`` as it is. The main score is nDCG@10; on a BEIR folder it equals
    :func:`hf_cocodr.evaluate_retrieval`'s (same texts, same query/document encoders, same similarity).

    Args:
        model: a model directory (sentence-transformers or raw checkpoint, loaded with CLS/dot) or a loaded
            SentenceTransformer.
        folder / split / task_name: a local BEIR folder to evaluate as the task ``task_name`` (see :func:`beir_task`).
        model_name: ``ORG/NAME`` (required).
        revision: the model revision (default: a content hash of the weights).
        output_folder: the MTEB cache folder written to (``OUT``).
        tasks: built-in MTEB task names (``["SciFact", "NFCorpus"]``) or MTEB task objects; they need the Hub or a
            local Hugging Face datasets cache.
        batch_size: encoding batch size.
        languages: the model's languages (for the ModelMeta) and the local task's languages.
        task_languages: restrict multilingual built-in tasks to these languages.
        overwrite: re-run tasks that already have results in ``output_folder`` (default: only missing splits).
        prediction_folder: also save the top-ranked documents per query there.
        meta_kwargs: extra arguments for :func:`model_meta_for` (license, training_datasets, adapted_from, ...).

    Returns:
        ``{"results_folder", "model_meta", "model_name", "revision", "tasks": {name: {"main_score", "ndcg@10",
        "recall@100", "mrr@10", "splits", "file"}}}``.

    Raises:
        ValueError: bad model name, revision, task name or unknown MTEB task; nothing to evaluate.
        FileNotFoundError / BEIRFormatError: missing model or BEIR folder, malformed data.
        MTEBDataUnavailableError: a built-in task's data is not cached and the Hub is unreachable.
    """
    import mteb

    from ..modeling.loading import load_encoder

    model_name = check_model_name(model_name)
    if revision is not None:
        revision = check_revision(revision)
    if batch_size is None or batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    builtin_names = [t for t in tasks or [] if isinstance(t, str)]
    task_objects = [t for t in tasks or [] if not isinstance(t, str)]
    if folder is None and not tasks:
        raise ValueError("nothing to evaluate: give a BEIR folder (DATA_DIR) or MTEB task names (--tasks SciFact,...).")

    local_tasks = []
    if folder is not None:
        local_tasks.append(beir_task(folder, split, task_name, languages=languages))
    with warnings_quiet():
        builtin = _builtin_tasks(builtin_names, task_languages) if builtin_names else []

    model_dir = None
    meta_kwargs = dict(meta_kwargs or {})
    if isinstance(model, (str, os.PathLike)):
        model_dir = Path(model).expanduser()
        model_id = str(model)
        model = load_encoder(model_dir if model_dir.exists() else model_id, device=device)
        if not model_dir.is_dir():  # a Hub id: no local files to read metadata from
            model_dir = None
            if "raw_checkpoint" not in meta_kwargs:
                from ..modeling.loading import _hub_has_modules_json

                with contextlib.suppress(Exception):
                    meta_kwargs["raw_checkpoint"] = not _hub_has_modules_json(model_id, None, None)
    meta = model_meta_for(model_dir, model_name, revision, model=model, languages=languages, **meta_kwargs)
    encoder = mteb_model(model, meta)
    cache = mteb.ResultCache(output_folder)
    encode_kwargs = {"batch_size": int(batch_size), "show_progress_bar": False}

    summary: dict[str, Any] = {}
    out_dir = results_dir(output_folder, meta.name, meta.revision)
    for task in [*local_tasks, *task_objects, *builtin]:
        name = task.metadata.name
        try:
            with warnings_quiet():
                result = mteb.evaluate(
                    encoder, task, cache=cache, encode_kwargs=dict(encode_kwargs),
                    overwrite_strategy="always" if overwrite else "only-missing", co2_tracker=co2_tracker,
                    show_progress_bar=False, prediction_folder=prediction_folder, raise_error=True,
                )
        except Exception as e:
            if task in builtin and _is_offline_error(e):
                ds = task.metadata.dataset
                raise MTEBDataUnavailableError(
                    f"MTEB task {name!r} needs the dataset {ds.get('path')!r} (revision {ds.get('revision')}), which "
                    "is not in the local Hugging Face cache, and the Hub is unreachable"
                    f"{' (HF_HUB_OFFLINE=1)' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''}. Run once with network "
                    "access to cache it, or evaluate a local BEIR copy: hf-cocodr mteb MODEL DATA_DIR --task-name NAME."
                ) from e
            raise
        for task_result in result.task_results:
            summary[task_result.task_name] = {**_summarise(task_result),
                                              "file": str(out_dir / f"{task_result.task_name}.json")}
        if result.exceptions:
            raise RuntimeError(f"MTEB task {name!r} failed: {result.exceptions[0].exception}")
    meta_path = out_dir / "model_meta.json"
    return {
        "results_folder": str(out_dir.resolve()),
        "model_meta": str(meta_path.resolve()),
        "model_name": meta.name,
        "revision": meta.revision,
        "tasks": summary,
    }


# ------------------------------------------------------------------------------------------------ PR snippet
def _python_identifier(model_name: str) -> str:
    ident = re.sub(r"\W+", "_", model_name.split("/", 1)[1]).strip("_").lower() or "model"
    return f"_{ident}" if ident[0].isdigit() else ident


def results_submission_steps(model_name: str, revision: str, output_folder: str | os.PathLike = "mteb_results",
                             tasks: Sequence[str] = ("SciFact", "NFCorpus")) -> list[str]:
    """Numbered steps to publish MTEB results for ``model_name`` at ``revision``."""
    rel = f"results/{model_name.replace('/', '__')}/{revision}"
    org_file = re.sub(r"\W+", "_", model_name.split("/", 1)[0]).lower() + "_models.py"
    out = str(output_folder)
    return [
        f"Push the model to the Hub as {model_name} and use the commit SHA of that upload as the revision "
        f"(here {revision}); the leaderboard keys results by name and revision.",
        f"Model implementation: fork {MTEB_REPO}, paste the ModelMeta above into "
        f"mteb/models/model_implementations/{org_file} (create it if needed), check that "
        f"`mteb.get_model_meta({model_name!r})` returns it, and open a pull request.",
        f"Evaluate on the official MTEB tasks (local BEIR folders are not leaderboard tasks): hf-cocodr mteb MODEL_DIR "
        f"--tasks {','.join(tasks)} --model-name {model_name} --revision {revision} --output-folder {out}",
        f"Fork and clone {RESULTS_REPO}, then copy the revision folder as it is, task files and model_meta.json: "
        f"mkdir -p results/{model_name.replace('/', '__')} && cp -r {out}/{rel} results/{model_name.replace('/', '__')}/",
        f"Commit, push to your fork and open a pull request against {RESULTS_REPO} (branch main), linking the model "
        "implementation PR; the results appear on the leaderboard once both are merged.",
    ]


def mteb_meta_snippet(
    model_dir: str | os.PathLike,
    model_name: str,
    revision: str,
    *,
    output_folder: str | os.PathLike = "mteb_results",
    model=None,
    **meta_kwargs: Any,
) -> str:
    """Python source for an mteb model-implementation PR, followed by the results-submission steps as comments.

    The whole text is valid Python: a ``ModelMeta(...)`` with every field filled (loader included: mteb's
    ``SentenceTransformerEncoderWrapper`` for a sentence-transformers directory, a CLS/dot loader for a raw
    checkpoint), then the numbered steps of a submission to ``embeddings-benchmark/results`` as comments.

    Args:
        model_dir: the model directory.
        model_name: ``ORG/NAME`` as published on the Hub.
        revision: the Hub commit SHA of the published model.
        output_folder: the ``--output-folder`` of ``hf-cocodr mteb`` used in the steps.
        model: the loaded model (default: loaded from ``model_dir``).
        **meta_kwargs: passed to :func:`model_meta_for`.
    """
    import textwrap

    from .. import __version__
    from ..modeling.loading import load_encoder, pooling_mode

    if model is None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {path} not found.")
        model = load_encoder(path)
    meta = model_meta_for(model_dir, model_name, check_revision(revision), model=model, **meta_kwargs)
    citation = meta.citation
    lines = meta.to_python().splitlines()
    body = []
    for line in lines:
        if line.startswith("    citation=") and citation:
            line = "    citation=CITATION,"
        body.append(line)
    body[0] = f"{_python_identifier(meta.name)} = {body[0]}"
    custom_loader = meta.loader is cocodr_sentence_transformer_loader
    notes = [
        f"Pooling: {pooling_mode(model) or 'none'}; similarity: {meta.similarity_fn_name.value}; embedding size "
        f"{meta.embed_dim}; max tokens {int(meta.max_tokens) if meta.max_tokens else None}.",
        "Add it to mteb/models/model_implementations/ in a pull request to embeddings-benchmark/mteb.",
    ]
    if meta.training_datasets is None:
        notes.append("The training data is unknown (no hf_cocodr_provenance.json): fill in training_datasets.")
    else:
        own = sorted(d for d in meta.training_datasets if _norm(d) not in _mteb_task_names())
        if own:
            notes.append(f"training_datasets also names data sets MTEB does not have ({', '.join(own)}), "
                         "as hf_cocodr recorded them.")
    header = [f'"""mteb model implementation for {meta.name} (generated by hf-cocodr {__version__}).', ""]
    for note in notes:
        header += textwrap.wrap(note, 116)
    header[-1] += '"""'
    header += ["", "from __future__ import annotations", ""]
    if custom_loader:
        header += [
            "from typing import Any",
            "",
            "from mteb.models.model_meta import ModelMeta, ScoringFunction",
            "",
            "",
        ]
        header += inspect.getsource(cocodr_sentence_transformer_loader).splitlines() + ["", ""]
    else:
        header += [
            "from mteb.models.model_meta import ModelMeta, ScoringFunction",
            "from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper",
            "",
        ]
    if citation:
        header += ["CITATION = r'''" + citation.replace("'''", "\\'\\'\\'") + "'''", ""]
    steps = results_submission_steps(meta.name, meta.revision, output_folder)
    footer = ["", "", "# Submitting results to the MTEB leaderboard:"]
    for i, step in enumerate(steps, 1):
        footer += textwrap.wrap(f"{i}. {step}", 116, initial_indent="# ", subsequent_indent="#    ",
                                break_long_words=False, break_on_hyphens=False)
    return "\n".join(header + body + footer) + "\n"
