"""What an :class:`~hf_cocodr.finetuning.IDROTrainer` saves beside a checkpoint's weights, and restores on resume.

One safetensors file of tensors and one JSON of metadata (:mod:`hf_cocodr.rundir.state`): the cluster ids, the iDRO
log-weights, the training data's state (its negatives), the state of the loss's auxiliary terms and of each method,
K-Means' centroids and the negatives refresh's schedule. Each component's tensors carry its prefix (``data_``,
``method_<name>_``, ``kmeans_``), so components never collide.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def collect_state(trainer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, meta)`` of ``trainer``'s state beyond the Trainer's own (weights, optimizer, scheduler, RNG)."""
    tensors: dict[str, Any] = {"cluster_ids": trainer.cluster_ids}
    meta: dict[str, Any] = {
        "negatives_source": trainer.training_data.negatives_source,
        "skipped_steps": trainer.skipped_steps,
    }
    loss = trainer.idro_loss
    if loss is not None:
        tensors["idro_log_weights"] = loss.log_weights.detach().cpu()
        meta["idro_config"] = loss.get_config_dict()
    for k, v in trainer.training_data.state_tensors().items():
        tensors[f"data_{k}"] = v
    for aux in getattr(loss, "auxiliary", []):  # the state of loss terms (e.g. a method's classifier and queue)
        if hasattr(aux, "state_tensors"):
            tensors.update(aux.state_tensors())
    for method in trainer.methods:
        for k, v in method.state_tensors().items():
            tensors[f"method_{method.name}_{k}"] = v
    if trainer.kmeans_callback is not None:
        for k, v in trainer.kmeans_callback.state_tensors().items():
            tensors[f"kmeans_{k}"] = v
        meta["kmeans"] = trainer.kmeans_callback.state_meta()
    if trainer.negatives_callback is not None:
        meta["negatives"] = trainer.negatives_callback.state_meta()
    return tensors, meta


def restore_state(trainer, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    """Put what :func:`collect_state` returned back into ``trainer``."""
    trainer.cluster_ids = tensors["cluster_ids"].numpy().astype(np.int64)
    loss = trainer.idro_loss
    if loss is not None and "idro_log_weights" in tensors:
        loss.log_weights = tensors["idro_log_weights"].to(torch.float64)
    for aux in getattr(loss, "auxiliary", []):
        if hasattr(aux, "load_state_tensors"):
            aux.load_state_tensors(tensors)
    for method in trainer.methods:
        prefix = f"method_{method.name}_"
        own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        if own:
            method.load_state_tensors(own)
    data_t = {k[5:]: v.numpy() for k, v in tensors.items() if k.startswith("data_")}
    if data_t:
        trainer.training_data.load_state_tensors(data_t, meta.get("negatives_source", "checkpoint"))
    trainer.skipped_steps = list(meta.get("skipped_steps", []))
    if trainer.kmeans_callback is not None and "kmeans" in meta:
        km = {k[7:]: v.numpy() for k, v in tensors.items() if k.startswith("kmeans_")}
        trainer.kmeans_callback.load_state(km, meta["kmeans"])
    if trainer.negatives_callback is not None and "negatives" in meta:
        trainer.negatives_callback.load_state({}, meta["negatives"])
