"""Model cards for hf_cocodr models, built with ``huggingface_hub``'s ``ModelCard`` / ``ModelCardData`` / ``EvalResult``.

The card is built from plain data (``card_data``), the model's provenance (``hf_cocodr_provenance.json``, see
:mod:`hf_cocodr.provenance`) and what the directory holds (``eval.json``, MTEB results), so it renders identically
offline and online and can be regenerated at each save. The metadata the Hub parses: ``base_model`` (a Hub id),
``datasets`` (only real Hub dataset ids; local data is described in the text), ``model-index`` (every evaluation:
``hf-cocodr evaluate`` / recipe results and MTEB results), and the same evaluations as ``.eval_results/*.yaml``
(huggingface_hub 2.x's format, :func:`write_eval_results`). The Markdown body is rendered from
``model_cards/cocodr_model_card.md.jinja``. Tokens never enter the card: values that look like credentials are refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from .citations import CITATIONS
from .data.sources import hub_dataset_spec
from .modeling.asymmetric import is_asymmetric
from .modeling.loading import pooling_mode
from .provenance import (
    LEGACY_TRAINING_INFO_FILE,
    PROVENANCE_FILE,
    is_cocodr_model,
    update_provenance,
    write_provenance,
)
from .rundir.run_record import EVAL_RESULTS
from .storage import staged_name
from .utils import atomic_write_text, import_mteb, is_hub_id, public_value, redact_text

logger = logging.getLogger(__name__)

# The provenance record (stages, base model, data fingerprints, ...); older outputs hold it as LEGACY_TRAINING_INFO_FILE.
TRAINING_INFO_FILE = PROVENANCE_FILE
EVAL_FILE = "eval.json"
EVAL_RESULTS_DIR = EVAL_RESULTS  # huggingface_hub 2.x's evaluation results (.eval_results/*.yaml)
MTEB_DIR = "mteb_results"
DISTILL_READER = "the hybrid-teacher distillation"  # the card's name of the distillation as a reader of target data
HYBRID_SYSTEM = "hybrid with BM25"  # how the card labels the rows of an hf-cocodr mteb --hybrid run
RETRIEVAL_TASK = ("text-retrieval", "Retrieval")  # the Hub's task id for retrieval (as mteb maps it) and its name
HF_COCODR_URL = "https://github.com/hf-cocodr/hf_cocodr"
MTEB_URL = "https://github.com/embeddings-benchmark/mteb"
_METRIC_RE = re.compile(r"^(ndcg|recall|mrr|map)@(\d+)$")
_METRIC_NAMES = {"ndcg": "nDCG", "recall": "Recall", "mrr": "MRR", "map": "MAP"}

METHOD_NAMES = {
    "coco": "COCO (continuous contrastive pretraining with a Condenser head)",
    "idro": "iDRO (implicit distributionally robust optimisation)",
    "groupdro": "GroupDRO",
    "uniform": "plain contrastive fine-tuning (uniform cluster weights)",
    "pseudo-pairs": "contrastive fine-tuning on target pseudo pairs (title or sentence vs. the rest of the document)",
    "wise-ft": "WiSE-FT (weight-space ensemble with the starting model)",
    "model-soup": "model soup (uniform weight average of runs with different seeds)",
}

_TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")


def _template(name: str) -> str:
    try:
        return resources.files("hf_cocodr.model_cards").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):  # running from a checkout without installation
        return (Path(__file__).resolve().parent.parent / "model_cards" / name).read_text(encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _split_spec(spec: str) -> tuple[str, str | None]:
    """``"../data/scifact:train"`` → ``("scifact", "train")``; a spec without a split → ``(label, None)``; a Hub
    dataset's (``"mteb/scifact@REV:test"``) → ``("mteb/scifact@REV", "test")``."""
    text = str(spec).strip().rstrip("/\\")
    split = None
    if ":" in text and not re.match(r"^[A-Za-z]:[\\/]", text) and not os.path.isdir(text):
        text, split = text.rsplit(":", 1)
    if hub_dataset_spec(text) is not None:
        return text, split
    return (Path(text).name or text), split


def _metric_label(key: str) -> tuple[str, str] | None:
    """``"ndcg@10"`` → ``("ndcg_at_10", "nDCG@10")`` (mteb's metric id and a readable name); None for other keys."""
    m = _METRIC_RE.match(key)
    return (f"{m[1]}_at_{m[2]}", f"{_METRIC_NAMES[m[1]]}@{m[2]}") if m else None


def collect_evaluations(directory: Path) -> list[dict[str, Any]]:
    """Every evaluation stored with the model: ``eval.json`` (hf-cocodr evaluate / recipe) and MTEB result files.

    One row per data set and split: ``dataset`` (the table label), ``name``, ``split``, ``dataset_type`` (a Hub
    dataset id for MTEB's built-in tasks, else the local data set's name), ``dataset_revision``, ``source`` and
    ``metrics`` (``{"ndcg@10": value, ...}``). Results of the model's hybrid with BM25 (an ``eval.json`` entry of
    ``evaluate --hybrid`` or the recipe, :func:`_eval_systems`; ``hf-cocodr mteb --hybrid`` into the same
    ``mteb_results`` folder, whose ``model_meta.json`` says ``model_type`` hybrid) are rows of their own, with
    ``system`` set to :data:`HYBRID_SYSTEM` and the label saying so: a model's row holds what the model alone scores.
    """
    rows: list[dict[str, Any]] = []
    ev = _read_json(directory / EVAL_FILE)
    if isinstance(ev, dict):
        for key, value in ev.items():
            if not (isinstance(value, dict) and "ndcg@10" in value):
                continue
            name, split = _split_spec(key)
            hub = hub_dataset_spec(name)  # a Hub dataset: its id and revision
            for system, result in _eval_systems(value):
                rows.append(
                    {
                        # the label is not where the data lies here
                        "dataset": (f"{name}:{split}" if split else name) + (f", {system}" if system else ""),
                        "name": name,
                        "split": split,
                        "dataset_type": hub[0] if hub else name,
                        "dataset_revision": hub[1] if hub else None,
                        "source": "hf-cocodr evaluate",
                        "system": system,
                        "metrics": {
                            k: v for k, v in result.items() if _metric_label(k) and isinstance(v, (int, float))
                        },
                        **_metric_subset(result),
                    }
                )
    mteb_root = directory / MTEB_DIR
    if mteb_root.is_dir():
        for task_file in sorted(mteb_root.rglob("*.json")):
            if task_file.name == "model_meta.json":
                continue
            data = _read_json(task_file)
            if not isinstance(data, dict) or not isinstance(data.get("scores"), dict):
                continue
            task = data.get("task_name", task_file.stem)
            meta = _read_json(task_file.parent / "model_meta.json")
            # a hybrid run (hf-cocodr mteb --hybrid): the model fused with BM25, listed beside the model's own rows
            system = HYBRID_SYSTEM if isinstance(meta, dict) and "hybrid" in (meta.get("model_type") or []) else None
            for split, entries in data["scores"].items():
                for entry in entries:
                    metrics = {
                        k.replace("_at_", "@"): float(v)
                        for k, v in entry.items()
                        if _metric_label(k.replace("_at_", "@")) and isinstance(v, (int, float))
                    }
                    subset = entry.get("hf_subset", "default")
                    rows.append(
                        {
                            "dataset": (f"{task} ({split})" if subset == "default" else f"{task} {subset} ({split})")
                            + (f", {system}" if system else ""),
                            "name": task if subset == "default" else f"{task} ({subset})",
                            "split": split,
                            "dataset_type": _mteb_dataset_path(task) or task,
                            "dataset_config": subset,
                            "dataset_revision": data.get("dataset_revision"),
                            "source": "MTEB",
                            "system": system,
                            "metrics": metrics,
                            "ndcg@10": entry.get("ndcg_at_10"),
                            "recall@100": entry.get("recall_at_100"),
                            "mrr@10": entry.get("mrr_at_10"),
                        }
                    )
    return rows


def _mteb_dataset_path(task_name: str) -> str | None:
    """The Hub dataset id of a built-in MTEB task (``SciFact`` → ``mteb/scifact``); None for a local task."""
    try:
        from .evaluation.mteb.common import mteb_task_names, normalize_task_name

        if mteb_task_names().get(normalize_task_name(task_name)) != task_name:
            return None
        mteb = import_mteb()

        return mteb.get_task(task_name).metadata.dataset.get("path")
    except Exception:  # mteb missing or the task unknown
        return None


def eval_results(evaluations: list[dict[str, Any]]) -> list:
    """``huggingface_hub.EvalResult`` for every metric of every evaluation row (the card's ``model-index``).

    Rows of a hybrid run are left out: the model-index states what the model alone scores; the card's table lists
    the hybrid beside it."""
    from huggingface_hub import EvalResult

    out = []
    for row in evaluations:
        if row.get("system"):
            continue
        for key, value in row["metrics"].items():
            metric_type, metric_name = _metric_label(key)
            source = (
                {"source_name": "MTEB", "source_url": MTEB_URL}
                if row["source"] == "MTEB"
                else {"source_name": "hf-cocodr evaluate", "source_url": HF_COCODR_URL}
            )
            out.append(
                EvalResult(
                    task_type=RETRIEVAL_TASK[0],
                    task_name=RETRIEVAL_TASK[1],
                    dataset_type=row["dataset_type"],
                    dataset_name=row["name"],
                    dataset_config=row.get("dataset_config"),
                    dataset_split=row["split"],
                    dataset_revision=row.get("dataset_revision"),
                    metric_type=metric_type,
                    metric_name=metric_name,
                    metric_value=round(float(value), 6),
                    **source,
                )
            )
    return out


def eval_result_entries(evaluations: list[dict[str, Any]]) -> dict[str, list]:
    """``huggingface_hub.EvalResultEntry`` for every metric of every evaluation row of the model itself (as the
    ``model-index``: a hybrid's rows are left out), by the name of the ``.eval_results/<name>.yaml`` file that holds
    them (one per data set). The data set is its Hub id (an MTEB task's dataset, a Hub dataset evaluated; a local
    one is named by its name); the task an MTEB task's name, else the split; the notes name the metric, the split
    and the subset."""
    from huggingface_hub import EvalResultEntry

    files: dict[str, list] = {}
    for row in evaluations:
        if row.get("system"):
            continue
        mteb = row["source"] == "MTEB"
        source = (
            {"source_name": "MTEB", "source_url": MTEB_URL}
            if mteb
            else {
                "source_name": "hf-cocodr evaluate",
                "source_url": HF_COCODR_URL,
            }
        )
        task = row["name"].split(" (")[0] if mteb else (row.get("split") or "default")
        subset = row.get("dataset_config")
        for key, value in row["metrics"].items():
            where = [f"split {row['split']}"] if row.get("split") else []
            where += [f"subset {subset}"] if subset and subset != "default" else []
            entry = EvalResultEntry(
                dataset_id=str(row["dataset_type"]),
                task_id=str(task),
                value=round(float(value), 6),
                dataset_revision=row.get("dataset_revision"),
                notes=", ".join([_metric_label(key)[1], *where]),
                **source,
            )
            files.setdefault(re.sub(r"[^\w.-]+", "_", str(row["dataset_type"])).strip("_"), []).append(entry)
    return files


def eval_results_files(evaluations: list[dict[str, Any]]) -> dict[str, str]:
    """``.eval_results/<data set>.yaml`` → its text (huggingface_hub 2.x's evaluation results format, written by its
    own ``eval_result_entries_to_yaml``) for :func:`eval_result_entries`."""
    import yaml
    from huggingface_hub import eval_result_entries_to_yaml

    return {
        f"{EVAL_RESULTS_DIR}/{name}.yaml": yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False)
        for name, entries in eval_result_entries(evaluations).items()
    }


def write_eval_results(directory: str | os.PathLike, evaluations: list[dict[str, Any]]) -> list[Path]:
    """Write :func:`eval_results_files` into ``directory`` (beside the card's ``model-index``, for older readers),
    each file atomically; returns the files."""
    written = []
    for rel, text in eval_results_files(evaluations).items():
        path = Path(directory) / rel
        path.parent.mkdir(exist_ok=True)
        atomic_write_text(path, text)
        written.append(path)
    return written


def _eval_systems(value: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The model's own metrics and, where the evaluation was a hybrid one, the hybrid's, from one ``eval.json``
    entry: ``(None, model metrics)`` first, then ``(HYBRID_SYSTEM, hybrid metrics)``.

    ``evaluate --hybrid`` (and the recipe's evaluation of its final model) stores the hybrid at the top level with
    the model's own metrics under ``"dense"``; the recipe's ``OUT/eval.json`` stores the model's at the top level
    with the hybrid's under ``"hybrid"``. Either way the model's row holds what the model alone scores."""
    dense, hybrid = value.get("dense"), value.get("hybrid")
    if isinstance(dense, dict) and "ndcg@10" in dense:
        return [(None, dense), (HYBRID_SYSTEM, value)]
    if isinstance(hybrid, dict) and "ndcg@10" in hybrid:
        return [(None, value), (HYBRID_SYSTEM, hybrid)]
    return [(None, value)]


def _metric_subset(value: dict[str, Any]) -> dict[str, Any]:
    return {k: value.get(k) for k in ("ndcg@10", "recall@100", "mrr@10")}


def _local_data_labels(stages: list[dict[str, Any]]) -> set[str]:
    """Names of the data the stages read from local folders (never Hub dataset ids)."""
    labels: set[str] = set()
    for s in stages:
        for spec in [*(s.get("corpora") or []), *(s.get("target queries") or []), s.get("source_data")]:
            if spec:
                labels |= {str(spec), _split_spec(str(spec))[0]}
    return labels


def hub_datasets(datasets: list[str], stages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """``(hub, local)``: the entries that are Hub dataset ids (``validate_repo_id`` passes, no split suffix, not a local
    path, not data a stage read from a local folder) and the rest, which the card describes in its text."""
    local_labels = _local_data_labels(stages)
    hub, local = [], []
    for d in dict.fromkeys(str(x) for x in datasets if x):
        ok = ":" not in d and d not in local_labels and is_hub_id(d, namespace=False)
        (hub if ok else local).append(d)
    return hub, local


def display_name(directory: Path) -> str:
    """The name of a model folder for its card: the final folder's name, not a staging or checkpoint folder's."""
    name = directory.name
    staged = staged_name(name)  # the staging sibling of utils.atomic_directory (hf_cocodr.storage.staging_path)
    if staged:
        return staged
    m = re.match(r"^\.(.+)\.tmp-[0-9a-f]{8}$", name)  # that of earlier versions
    if m:
        return m[1]
    if name.startswith("checkpoint-") and directory.parent.name:
        return directory.parent.name
    return name


def build_card_data(
    directory: Path, model, card_data: dict[str, Any], pooling: str, similarity: str, name: str | None = None
) -> dict[str, Any]:
    training = _read_json(directory / TRAINING_INFO_FILE) or _read_json(directory / LEGACY_TRAINING_INFO_FILE) or {}
    data = {**training, **{k: v for k, v in card_data.items() if v is not None}}
    stages = data.get("stages", [])
    methods = list(dict.fromkeys(data.get("methods") or [s.get("method") for s in stages if s.get("method")]))
    # fine-tuning methods describe themselves (hf_cocodr.methods.Method.card_metadata): name, citation, and
    # whether they read target documents while fine-tuning (their stage lists them under "corpora")
    method_cards = {m: c for m, c in (data.get("method_cards") or {}).items() if m in methods and isinstance(c, dict)}
    known = {**CITATIONS, **{m: c["citation"] for m, c in method_cards.items() if c.get("citation")}}
    pretraining_corpora = sorted({c for s in stages if s.get("type") == "coco" for c in s.get("corpora", [])})
    finetuning_corpora = sorted(
        {c for s in stages if s.get("type") in ("finetune", "distill") for c in s.get("corpora", [])}
    )
    target_queries_read = sorted({q for s in stages for q in s.get("target queries", [])})
    readers = (
        ["training on target pseudo pairs"]
        if "pseudo-pairs" in methods or any(s.get("method") == "pseudo-pairs" for s in stages)
        else []
    )
    readers += [c["reads_target_corpora"] for c in method_cards.values() if c.get("reads_target_corpora")]
    distill_stages = [s for s in stages if s.get("type") == "distill"]
    readers += [DISTILL_READER] if any(s.get("corpora") for s in distill_stages) else []
    # who read the unlabelled target queries: the distillation (its teacher ranks them), or a method (MoDIR)
    query_readers = [DISTILL_READER] if any(s.get("target queries") for s in distill_stages) else []
    if any(s.get("target queries") for s in stages if s.get("type") != "distill"):
        by_methods = [c["reads_target_queries"] for c in method_cards.values() if c.get("reads_target_queries")]
        query_readers += by_methods or ["fine-tuning"]
    source_data = [s.get("source_data") for s in stages if s.get("type") == "finetune" and s.get("source_data")]
    citations = (["cocodr"] if is_cocodr_model(data) else []) + (["condenser"] if "coco" in methods else [])
    citations += [m for m in methods if m in known and m not in citations]
    datasets, local_datasets = hub_datasets(list(data.get("datasets") or []), stages)
    # the card's text names local data by its name (and split), never by where it lies on this machine
    pretraining_corpora, finetuning_corpora = public_value(pretraining_corpora), public_value(finetuning_corpora)
    target_queries_read, source_data = public_value(target_queries_read), public_value(source_data)
    local_datasets, stages = list(dict.fromkeys(public_value(local_datasets))), public_value(stages)
    transformer = model[0]
    data.update(
        model_name=data.get("model_name") or name or display_name(directory),
        pooling=pooling,
        similarity=similarity,
        embedding_dim=model.get_embedding_dimension(),
        max_seq_length=transformer.max_seq_length,
        query_length=getattr(transformer, "query_length", None),
        document_length=getattr(transformer, "document_length", None),
        do_lower_case=bool(
            getattr(getattr(transformer, "tokenizer", None), "do_lower_case", False)
            or _tokenizer_lowercases(transformer)
        ),
        methods=methods,
        method_names=[method_cards.get(m, {}).get("display_name") or METHOD_NAMES.get(m, m) for m in methods],
        pretraining_corpora=pretraining_corpora,
        finetuning_corpora=finetuning_corpora,
        finetuning_readers=readers or ["fine-tuning"],
        recipe_schedule=data.get("recipe_schedule"),
        guard=data.get("guard"),
        teacher_check=data.get("teacher_check"),
        queries_trained=data.get("queries_trained"),
        project_url=HF_COCODR_URL,
        start_vs_adapted=public_value(data.get("start_vs_adapted")),
        target_queries_read=target_queries_read,
        query_readers=_sentence_start(" and ".join(dict.fromkeys(query_readers))),
        asymmetric=is_asymmetric(model),
        source_data=source_data,
        stages=stages,
        datasets=datasets,
        local_datasets=local_datasets,
        base_model=data.get("base_model"),
        base_model_revision=data.get("base_model_revision"),
        evaluations=collect_evaluations(directory),
        citations=[known[c] for c in citations],
    )
    return data


def _sentence_start(text: str) -> str:
    """``text`` with its first letter upper-cased (and nothing else changed: "MoDIR" stays "MoDIR")."""
    return text[:1].upper() + text[1:]


def _tokenizer_lowercases(transformer) -> bool:
    tok = getattr(transformer, "tokenizer", None)
    try:
        return tok("ABC", add_special_tokens=False)["input_ids"] == tok("abc", add_special_tokens=False)["input_ids"]
    except Exception:
        return False


def card_metadata(data: dict[str, Any]):
    """The card's ``huggingface_hub.ModelCardData``: library, tags, license, language, ``base_model``, Hub
    ``datasets`` and the ``model-index`` of every evaluation."""
    from huggingface_hub import ModelCardData

    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense-retrieval", "hf-cocodr"]
    tags += (["cocodr"] if is_cocodr_model(data) else []) + [m for m in data.get("methods", []) if m != "uniform"]
    results = eval_results(data.get("evaluations") or [])
    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=list(dict.fromkeys(tags + list(data.get("tags") or []))),
        license=data.get("license") or "apache-2.0",
        language=data.get("language") or ["en"],
        base_model=data.get("base_model") or None,
        datasets=list(data.get("datasets") or []) or None,
        model_name=data["model_name"] if results else None,
        eval_results=results or None,
    )


def build_model_card(data: dict[str, Any]):
    """The ``huggingface_hub.ModelCard``: the metadata of :func:`card_metadata` and the body rendered from the
    template (``{{ card_data }}`` is the YAML header, as in huggingface_hub's own templates)."""
    import jinja2
    from huggingface_hub import ModelCard

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    env.filters["fmt"] = lambda v: "–" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
    meta = card_metadata(data)
    text = env.from_string(_template("cocodr_model_card.md.jinja")).render(card_data=meta.to_yaml(), **data)
    return ModelCard(text)


def render_model_card(data: dict[str, Any]) -> str:
    text = str(build_model_card(data))
    if _TOKEN_PATTERN.search(text):
        raise ValueError("refusing to write a model card that contains something that looks like a Hugging Face token")
    return text


def write_model_card(
    directory: str | os.PathLike,
    model,
    card_data: dict[str, Any] | None = None,
    *,
    pooling: str | None = None,
    similarity: str | None = None,
    name: str | None = None,
) -> Path:
    """Render ``README.md`` in ``directory`` (atomically) and store the provenance it was built from
    (``hf_cocodr_provenance.json``: ``card_data`` merged into what the folder, the starting model and this run's
    owner record already say; see :mod:`hf_cocodr.provenance`).

    The card's title is the user's name for the model: ``card_data["model_name"]``, else the model's
    ``model_card_data.model_id`` (set from ``hub_model_id`` by the trainers), else ``name``, else the folder's name (the
    final folder's when ``directory`` is a staging or checkpoint folder)."""
    directory = Path(directory)
    card_data = dict(card_data or {})
    model_id = getattr(getattr(model, "model_card_data", None), "model_id", None)  # the trainer's hub_model_id
    if model_id and not card_data.get("model_name"):
        card_data["model_name"] = model_id
    pooling = pooling or pooling_mode(model) or "unknown"
    similarity = similarity or str(getattr(model, "similarity_fn_name", "cosine"))
    transformer = model[0]
    settings = {
        "pooling": pooling,
        "similarity": similarity,
        "max_seq_length": transformer.max_seq_length,
        "query_length": getattr(transformer, "query_length", None),
        "document_length": getattr(transformer, "document_length", None),
    }
    provenance = update_provenance(directory, model, card_data, settings)
    data = build_card_data(directory, model, {**provenance, **card_data}, pooling, similarity, name=name)
    text = render_model_card(data)  # refuses token-like strings before anything is written
    write_provenance(directory, provenance)
    path = directory / "README.md"
    atomic_write_text(path, redact_text(text))  # no token in the card, whatever the settings it quotes held
    write_eval_results(directory, data["evaluations"])
    return path
