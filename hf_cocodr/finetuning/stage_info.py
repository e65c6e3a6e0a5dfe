"""What a fine-tuning stage did, as the model card and the provenance record describe it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..methods.registry import get_method
from ..provenance import source_info as previous_training_info


def finetune_stage_info(trainer, data_name: str, negatives: str) -> dict[str, Any]:
    a = trainer.args
    loss = trainer.idro_loss
    cfg = loss.get_config_dict() if loss is not None else {}
    method = {"paper": "idro", "reference": "idro", "groupdro": "groupdro", "uniform": "uniform"}.get(
        cfg.get("preset"), "finetune"
    )
    negs = negatives
    refresh = getattr(a, "refresh_negatives_every_steps", 0)  # (a distillation's arguments have none)
    if refresh:
        negs += f", then self-mined (ANCE-style) every {refresh} steps"
    if getattr(trainer, "stage_type", None) == "distill":
        return distill_stage_info(trainer)
    info = {
        "type": "finetune",
        "title": {"idro": "iDRO fine-tuning", "groupdro": "GroupDRO fine-tuning"}.get(
            method, "contrastive fine-tuning"
        ),
        "method": method,
        "source_data": data_name,
        "steps": trainer.state.global_step,
        "queries per step": a.per_device_train_batch_size * max(1, a.world_size) * a.gradient_accumulation_steps,
        "hard negatives per query": trainer._num_negatives,
        "negatives": negs,
        "learning rate": a.learning_rate,
        "seed": a.seed,
    }
    if loss is not None:
        info.update(
            {
                "iDRO preset": cfg["preset"],
                "K (clusters)": cfg["num_clusters"],
                "tau": cfg["tau"],
                "beta": cfg["beta"],
                "gradient-similarity parameters": cfg["grad_params"],
                "similarity": cfg["similarity"],
                "scale": cfg["scale"],
            }
        )
    for method in getattr(trainer, "methods", []):  # each plugged-in method describes its settings
        info.update(method.stage_info(a))
    if getattr(trainer, "target_corpora_read", None):
        info["corpora"] = list(trainer.target_corpora_read)  # target documents read by a method, never labels
    if getattr(trainer, "target_queries_read", None):
        info["target queries"] = list(trainer.target_queries_read)  # unlabelled target queries read by a method
    return info


def distill_stage_info(trainer) -> dict[str, Any]:
    """A distillation stage on the card: no relevance labels (the teacher ranks the unlabelled target queries), the
    side that trained, and the target data read."""
    a = trainer.args
    from .losses.distill import QuerySideDistillLoss

    query_side = isinstance(trainer.loss, QuerySideDistillLoss)
    try:  # the teacher's candidates of a row: one column of scores per candidate
        labels = trainer.training_data.row_labels([0])
        candidates = int(np.asarray(labels).shape[-1]) if labels is not None else None
    except Exception:  # a rows source that cannot say
        candidates = None
    info: dict[str, Any] = {
        "type": "distill",
        "title": "hybrid-teacher distillation" + (" (query side)" if query_side else ""),
        "method": "distillation",
        "teacher": "the starting model fused with BM25 over each target corpus (no relevance labels)",
        "trained": (
            "the query encoder only: documents go through the starting model's encoder, unchanged"
            if query_side
            else "the whole model (queries and documents)"
        ),
        "steps": trainer.state.global_step,
        "queries per step": a.per_device_train_batch_size * max(1, a.world_size) * a.gradient_accumulation_steps,
        "candidates per query": candidates,
        "learning rate": a.learning_rate,
        "seed": a.seed,
    }
    info = {k: v for k, v in info.items() if v is not None}
    if getattr(trainer, "target_corpora_read", None):
        info["corpora"] = list(trainer.target_corpora_read)
    if getattr(trainer, "target_queries_read", None):
        info["target queries"] = list(trainer.target_queries_read)
    return info


def starting_model_info(model) -> dict[str, Any]:
    """The training record of the model a run starts from (its stages go first on the card)."""
    path = getattr(getattr(getattr(model[0], "model", None), "config", None), "_name_or_path", None)
    info = previous_training_info(path) if path else {}
    if "base_model" not in info and path and not os.path.exists(str(path)):
        info["base_model"] = str(path)
    return info


def finetune_card_data(trainer, prev: dict[str, Any]) -> dict[str, Any]:
    """The model card's data for a fine-tuning run: the starting model's record ``prev``, then this run's stage."""
    stage = finetune_stage_info(
        trainer,
        trainer.training_data.name,
        getattr(trainer, "negatives_label", None) or trainer.training_data.negatives_source,
    )
    methods = list(dict.fromkeys(list(prev.get("methods", [])) + [stage["method"]] + list(trainer.extra_methods)))
    datasets = list(
        dict.fromkeys(list(prev.get("datasets", [])) + [stage.get("source_data")] + list(stage.get("corpora", [])))
    )
    data = {
        "stages": list(prev.get("stages", [])) + [stage],
        "methods": methods,
        "datasets": [d for d in datasets if d],
        "base_model": prev.get("base_model"),
    }
    cards = _method_cards(trainer, methods, prev.get("method_cards") or {})
    if cards:
        data["method_cards"] = cards
    return data


def _method_cards(trainer, names: list[str], earlier: dict[str, Any]) -> dict[str, Any]:
    """What the model card needs of each method of this model (its earlier stages' too): display name, citation,
    whether it read target documents; from the plugged-in or registered :class:`~hf_cocodr.methods.Method` classes."""
    active = {m.name: type(m) for m in trainer.methods}
    cards = dict(earlier)
    for name in names:
        cls = active.get(name) or get_method(name)
        meta = cls.card_metadata() if cls is not None else None
        if meta:  # (a method the card describes itself has none)
            cards[name] = meta
    return cards
