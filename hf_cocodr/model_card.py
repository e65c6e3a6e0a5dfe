"""Model cards for hf_cocodr models: YAML metadata + a Markdown body rendered from ``model_cards/*.jinja``.

The card is built from plain data (``card_data``) plus what the directory holds (``eval.json``, MTEB results,
``hf_cocodr_training.json``), so it renders identically offline and online and can be regenerated at each save.
Tokens never enter the card: values that look like credentials are refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .utils import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)

TRAINING_INFO_FILE = "hf_cocodr_training.json"
EVAL_FILE = "eval.json"
MTEB_DIR = "mteb_results"

CITATIONS: dict[str, dict[str, str]] = {
    "cocodr": {
        "title": "COCO-DR: Combating Distribution Shifts in Zero-Shot Dense Retrieval with Contrastive and "
        "Distributionally Robust Learning",
        "bibtex": """@inproceedings{yu2022cocodr,
  title = {{COCO-DR}: Combating Distribution Shifts in Zero-Shot Dense Retrieval with Contrastive and Distributionally Robust Learning},
  author = {Yu, Yue and Xiong, Chenyan and Sun, Si and Zhang, Chao and Overwijk, Arnold},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing},
  year = {2022},
  url = {https://arxiv.org/abs/2210.15212}
}""",
    },
    "condenser": {
        "title": "Condenser: a Pre-training Architecture for Dense Retrieval",
        "bibtex": """@inproceedings{gao2021condenser,
  title = {Condenser: a Pre-training Architecture for Dense Retrieval},
  author = {Gao, Luyu and Callan, Jamie},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year = {2021},
  url = {https://arxiv.org/abs/2104.08253}
}""",
    },
    "groupdro": {
        "title": "Distributionally Robust Neural Networks for Group Shifts",
        "bibtex": """@inproceedings{sagawa2020groupdro,
  title = {Distributionally Robust Neural Networks for Group Shifts: On the Importance of Regularization for Worst-Case Generalization},
  author = {Sagawa, Shiori and Koh, Pang Wei and Hashimoto, Tatsunori B. and Liang, Percy},
  booktitle = {International Conference on Learning Representations},
  year = {2020},
  url = {https://arxiv.org/abs/1911.08731}
}""",
    },
    "modir": {
        "title": "Zero-Shot Dense Retrieval with Momentum Adversarial Domain Invariant Representations",
        "bibtex": """@inproceedings{xin2022modir,
  title = {Zero-Shot Dense Retrieval with Momentum Adversarial Domain Invariant Representations},
  author = {Xin, Ji and Xiong, Chenyan and Srinivasan, Ashwin and Sharma, Ankita and Jose, Damien and Bennett, Paul},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2022},
  year = {2022},
  url = {https://arxiv.org/abs/2110.07581}
}""",
    },
    "berm": {
        "title": "BERM: Training the Balanced and Extractable Representation for Matching to Improve Generalization "
        "Ability of Dense Retrieval",
        "bibtex": """@inproceedings{xu2023berm,
  title = {{BERM}: Training the Balanced and Extractable Representation for Matching to Improve Generalization Ability of Dense Retrieval},
  author = {Xu, Shicheng and Pang, Liang and Shen, Huawei and Cheng, Xueqi},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics},
  year = {2023},
  url = {https://arxiv.org/abs/2305.11052}
}""",
    },
    "rmsc": {
        "title": "Improving the Generalization Ability of Dense Passage Retrieval via Relevance Matching and "
        "Soft Domain Control (RMSC)",
        "bibtex": """@misc{rmsc,
  title = {Relevance Matching and Soft Domain Control for Zero-Shot Dense Retrieval},
  note = {RMSC: domain tokens [S]/[T] and relevance tokens [W]/[H] prepended/appended to the input}
}""",
    },
}

METHOD_NAMES = {
    "coco": "COCO (continuous contrastive pretraining with a Condenser head)",
    "idro": "iDRO (implicit distributionally robust optimisation)",
    "groupdro": "GroupDRO",
    "uniform": "plain contrastive fine-tuning (uniform cluster weights)",
    "modir": "MoDIR (momentum adversarial domain-invariant representations)",
    "berm": "BERM (balanced and extractable representations for matching)",
    "rmsc": "RMSC (relevance matching and soft domain control tokens)",
    "pseudo-pairs": "contrastive fine-tuning on target pseudo pairs (title or sentence vs. the rest of the document)",
    "wise-ft": "WiSE-FT (weight-space ensemble with the starting model)",
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


def collect_evaluations(directory: Path) -> list[dict[str, Any]]:
    """Rows for the evaluation table from ``eval.json`` (hf-cocodr evaluate / recipe) and MTEB result files."""
    rows: list[dict[str, Any]] = []
    ev = _read_json(directory / EVAL_FILE)
    if isinstance(ev, dict):
        for key, value in ev.items():
            if isinstance(value, dict) and "ndcg@10" in value:
                rows.append({"dataset": key, "source": "hf-cocodr evaluate", **_metric_subset(value)})
    mteb_root = directory / MTEB_DIR
    if mteb_root.is_dir():
        for task_file in sorted(mteb_root.rglob("*.json")):
            if task_file.name == "model_meta.json":
                continue
            data = _read_json(task_file)
            if not isinstance(data, dict) or "scores" not in data:
                continue
            for split, entries in data["scores"].items():
                for entry in entries:
                    rows.append({
                        "dataset": f"{data.get('task_name', task_file.stem)} ({split})",
                        "source": "MTEB",
                        "ndcg@10": entry.get("ndcg_at_10"),
                        "recall@100": entry.get("recall_at_100"),
                        "mrr@10": entry.get("mrr_at_10"),
                    })
    return rows


def _metric_subset(value: dict[str, Any]) -> dict[str, Any]:
    return {k: value.get(k) for k in ("ndcg@10", "recall@100", "mrr@10")}


def build_card_data(directory: Path, model, card_data: dict[str, Any], pooling: str, similarity: str) -> dict[str, Any]:
    training = _read_json(directory / TRAINING_INFO_FILE) or {}
    data = {**training, **{k: v for k, v in card_data.items() if v is not None}}
    stages = data.get("stages", [])
    methods = list(dict.fromkeys(data.get("methods") or [s.get("method") for s in stages if s.get("method")]))
    pretraining_corpora = sorted({c for s in stages if s.get("type") == "coco" for c in s.get("corpora", [])})
    # MoDIR / RMSC read target documents while fine-tuning (their stage lists them under "corpora")
    finetuning_corpora = sorted({c for s in stages if s.get("type") == "finetune" for c in s.get("corpora", [])})
    target_queries_read = sorted({q for s in stages for q in s.get("target queries", [])})
    readers = (["training on target pseudo pairs"] if "pseudo-pairs" in methods
               or any(s.get("method") == "pseudo-pairs" for s in stages) else [])
    readers += [name for key, name in (("modir", "MoDIR"), ("rmsc", "RMSC")) if key in methods]
    source_data = [s.get("source_data") for s in stages if s.get("type") == "finetune" and s.get("source_data")]
    citations = ["cocodr"] + (["condenser"] if "coco" in methods else [])
    citations += [m for m in methods if m in CITATIONS and m not in citations]
    transformer = model[0]
    data.update(
        model_name=data.get("model_name") or directory.name,
        pooling=pooling,
        similarity=similarity,
        embedding_dim=model.get_embedding_dimension(),
        max_seq_length=transformer.max_seq_length,
        query_length=getattr(transformer, "query_length", None),
        document_length=getattr(transformer, "document_length", None),
        do_lower_case=bool(getattr(getattr(transformer, "tokenizer", None), "do_lower_case", False)
                           or _tokenizer_lowercases(transformer)),
        methods=methods,
        method_names=[METHOD_NAMES.get(m, m) for m in methods],
        pretraining_corpora=pretraining_corpora,
        finetuning_corpora=finetuning_corpora,
        finetuning_readers=readers or ["fine-tuning"],
        recipe_schedule=data.get("recipe_schedule"),
        start_vs_adapted=data.get("start_vs_adapted"),
        target_queries_read=target_queries_read,
        source_data=source_data,
        stages=stages,
        evaluations=collect_evaluations(directory),
        citations=[CITATIONS[c] for c in citations],
    )
    return data


def _tokenizer_lowercases(transformer) -> bool:
    tok = getattr(transformer, "tokenizer", None)
    try:
        return tok("ABC", add_special_tokens=False)["input_ids"] == tok("abc", add_special_tokens=False)["input_ids"]
    except Exception:
        return False


def card_metadata(data: dict[str, Any]) -> dict[str, Any]:
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense-retrieval", "hf-cocodr",
            "cocodr"] + [m for m in data.get("methods", []) if m not in ("uniform",)]
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers",
        "pipeline_tag": "sentence-similarity",
        "tags": list(dict.fromkeys(tags + list(data.get("tags") or []))),
        "license": data.get("license") or "apache-2.0",
        "language": data.get("language") or ["en"],
    }
    if data.get("base_model"):
        meta["base_model"] = data["base_model"]
    datasets = list(dict.fromkeys(list(data.get("datasets") or [])))
    if datasets:
        meta["datasets"] = datasets
    return meta


def render_model_card(data: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["fmt"] = lambda v: "–" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
    body = env.from_string(_template("cocodr_model_card.md.jinja")).render(**data)
    meta = yaml.safe_dump(card_metadata(data), sort_keys=False, allow_unicode=True).strip()
    text = f"---\n{meta}\n---\n\n{body}"
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
) -> Path:
    """Render ``README.md`` in ``directory`` (atomically) and store the training info it was built from."""
    from .modeling.loading import pooling_mode

    directory = Path(directory)
    card_data = dict(card_data or {})
    training = None
    if card_data.get("stages") is not None or card_data.get("methods") is not None:
        training = {**(_read_json(directory / TRAINING_INFO_FILE) or {}), **_jsonable(card_data)}
    data = build_card_data(
        directory, model, {**(training or {}), **card_data}, pooling or pooling_mode(model) or "unknown",
        similarity or str(getattr(model, "similarity_fn_name", "cosine")),
    )
    text = render_model_card(data)  # refuses token-like strings before anything is written
    if training is not None:
        atomic_write_json(directory / TRAINING_INFO_FILE, training)
    path = directory / "README.md"
    atomic_write_text(path, text)
    return path


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
