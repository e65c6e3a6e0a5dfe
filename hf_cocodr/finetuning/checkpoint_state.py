"""What a row-based trainer saves beside a checkpoint's weights, and restores on resume: one protocol.

Every stateful component of a run (the cluster ids, the iDRO weights, the training rows' negatives, the K-Means and
negatives-refresh callbacks, the loss terms and methods that keep state, the trainer's list of skipped steps)
implements :class:`CheckpointState`: a ``state_name``, ``state() -> (tensors, meta)`` and ``load_state(tensors,
meta)``. The trainer saves a list of them into one safetensors file of tensors and one JSON of metadata
(:mod:`hf_cocodr.rundir.state`): a component's tensor ``key`` is stored as ``<state_name>_<key>``, its metadata under
``meta[<state_name>]``, so components never collide (names are checked: none may be another's prefix).

Checkpoints written before this protocol (no ``state_format`` in their JSON) kept three entries at the top level
of the metadata (``negatives_source``, ``skipped_steps``, ``idro_config``); :func:`upgrade_legacy` moves them to
their components' places, so those checkpoints keep loading.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

STATE_FORMAT = 2  # the metadata's ``state_format``; absent: the format before the protocol (see upgrade_legacy)


@runtime_checkable
class CheckpointState(Protocol):
    """A component whose state is saved with every checkpoint and restored on resume.

    ``state()`` returns ``(tensors, meta)``: arrays or tensors by key (saved as safetensors) and JSON-able
    metadata; ``load_state`` receives the same two dicts back (tensors as torch tensors). It is called only when
    the checkpoint holds something of the component (a tensor or its metadata)."""

    state_name: str

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None: ...


class ClusterAssignment:
    """The cluster id of every training row (what the iDRO loss groups a batch by); K-Means writes it."""

    state_name = "cluster"

    def __init__(self, num_rows: int):
        self.ids = np.zeros(num_rows, dtype=np.int64)

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"ids": self.ids}, {}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        self.ids = np.asarray(tensors["ids"]).astype(np.int64)


class SkippedSteps:
    """The optimizer steps skipped after a non-finite loss (1-based step numbers)."""

    state_name = "trainer"

    def __init__(self):
        self.steps: list[int] = []

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"skipped_steps": list(self.steps)}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        self.steps = list(meta.get("skipped_steps", []))


class RowsState:
    """The state of a training rows source (its negatives table; see ``RowsSource.state_tensors``)."""

    state_name = "data"

    def __init__(self, rows):
        self.rows = rows

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return dict(self.rows.state_tensors()), {"negatives_source": self.rows.negatives_source}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        if tensors:  # (rows without state, e.g. a plain dataset's, saved none)
            arrays = {k: np.asarray(v) for k, v in tensors.items()}
            self.rows.load_state_tensors(arrays, meta.get("negatives_source", "checkpoint"))


def _check_names(components) -> None:
    names = [c.state_name for c in components]
    for i, a in enumerate(names):
        clash = [b for j, b in enumerate(names) if j != i and (b == a or b.startswith(a + "_"))]
        if clash:
            raise ValueError(f"checkpoint state names collide: {a!r} and {clash[0]!r} (one is the other's prefix)")


def collect_state(components) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, meta)`` of every component, keyed as the module docstring says."""
    components = list(components)
    _check_names(components)
    tensors: dict[str, Any] = {}
    meta: dict[str, Any] = {"state_format": STATE_FORMAT}
    for component in components:
        own_tensors, own_meta = component.state()
        for key, value in own_tensors.items():
            tensors[f"{component.state_name}_{key}"] = value
        if own_meta:
            meta[component.state_name] = own_meta
    return tensors, meta


def restore_state(components, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    """Hand each component what :func:`collect_state` saved of it (checkpoints of the legacy format included)."""
    tensors, meta = upgrade_legacy(tensors, meta)
    for component in components:
        prefix = f"{component.state_name}_"
        own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        own_meta = meta.get(component.state_name)
        if own or own_meta is not None:
            component.load_state(own, own_meta or {})


def upgrade_legacy(tensors: dict[str, Any], meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The legacy layout (hf_cocodr before the protocol) in today's: the tensor keys were already
    ``<component>_<key>``; three metadata entries lay at the top level."""
    if "state_format" in meta:
        return tensors, meta
    meta = dict(meta)
    meta["trainer"] = {"skipped_steps": list(meta.pop("skipped_steps", []))}
    meta["data"] = {"negatives_source": meta.pop("negatives_source", "checkpoint")}
    if "idro_config" in meta:
        meta["idro"] = {"config": meta.pop("idro_config")}
    meta["state_format"] = STATE_FORMAT
    return tensors, meta
