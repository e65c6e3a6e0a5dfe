"""The checkpoint-state protocol: components saved and restored by name, and checkpoints of the format before the
protocol (``legacy_state/``, written by the code at 89d31cf; see its README) still load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.finetuning.checkpoint_state import (
    STATE_FORMAT,
    CheckpointState,
    ClusterAssignment,
    collect_state,
    restore_state,
    upgrade_legacy,
)
from hf_cocodr.methods import configure_methods

LEGACY = Path(__file__).parent / "legacy_state"


class Counter:
    """A stateful component written for the test: a tensor and a number."""

    def __init__(self, name: str):
        self.state_name, self.values, self.calls = name, torch.zeros(3), 0
        self.loaded = None

    def state(self):
        return {"values": self.values}, {"calls": self.calls}

    def load_state(self, tensors, meta):
        self.loaded = (tensors, meta)
        self.values, self.calls = tensors["values"], meta["calls"]


def test_components_are_saved_under_their_names_and_restored_to_their_own():
    a, b, clusters = Counter("a"), Counter("b"), ClusterAssignment(4)
    a.values, a.calls = torch.tensor([1.0, 2.0, 3.0]), 5
    clusters.ids = np.array([3, 1, 0, 2])
    assert isinstance(a, CheckpointState) and isinstance(clusters, CheckpointState)
    tensors, meta = collect_state([a, b, clusters])
    assert set(tensors) == {"a_values", "b_values", "cluster_ids"}
    assert meta == {"state_format": STATE_FORMAT, "a": {"calls": 5}, "b": {"calls": 0}}
    a2, b2, c2, absent = Counter("a"), Counter("b"), ClusterAssignment(4), Counter("never_saved")
    restore_state([a2, b2, c2, absent], tensors, json.loads(json.dumps(meta)))
    assert torch.equal(a2.values, a.values) and a2.calls == 5 and b2.calls == 0
    assert set(a2.loaded[0]) == {"values"}  # its own keys, without the prefix
    assert c2.ids.tolist() == [3, 1, 0, 2]
    assert absent.loaded is None  # nothing of it in the checkpoint: not called


def test_names_that_are_prefixes_of_each_other_are_refused():
    with pytest.raises(ValueError, match="'data' and 'data_extra'"):
        collect_state([Counter("data"), Counter("data_extra")])
    with pytest.raises(ValueError, match="collide"):
        collect_state([Counter("x"), Counter("x")])


def test_the_legacy_layout_is_upgraded():
    tensors, meta = {"cluster_ids": torch.zeros(2)}, {"negatives_source": "bm25", "skipped_steps": [3], "kmeans": {}}
    up_tensors, up = upgrade_legacy(tensors, meta)
    assert up_tensors is tensors
    assert up == {
        "state_format": STATE_FORMAT,
        "trainer": {"skipped_steps": [3]},
        "data": {"negatives_source": "bm25"},
        "kmeans": {},
    }
    assert upgrade_legacy(tensors, up)[1] is up  # today's format: as is


def _legacy_shaped_trainer(tiny_st_dir, tmp_path):
    """A trainer set up as the one that wrote ``legacy_state`` (see its README), before any step."""
    import tiny

    beir = tiny.make_beir(tmp_path / "beir" / "toy", n_docs=40, n_queries=16)
    model = load_encoder(str(tiny_st_dir))
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=4,
        max_steps=2,
        num_clusters=3,
        refresh_negatives_every_steps=1,
        negatives_top_k=5,
        report_to="none",
        use_cpu=True,
        seed=3,
    )
    data = RetrievalTrainingData.from_beir(beir, "train", negatives="bm25")
    loss, data, setup = configure_methods(["modir"], model, args, data, None, [str(beir)])
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, loss=loss)
    setup(trainer)
    return trainer


def test_a_checkpoint_of_the_legacy_format_loads(tiny_st_dir, tmp_path):
    saved = load_file(str(LEGACY / "hf_cocodr_state.safetensors"))
    meta = json.loads((LEGACY / "hf_cocodr_state.json").read_text())
    assert "state_format" not in meta  # the fixture is of the old format
    trainer = _legacy_shaped_trainer(tiny_st_dir, tmp_path)
    trainer.load_checkpoint_state(str(LEGACY))
    assert np.array_equal(trainer.cluster_ids, saved["cluster_ids"].numpy())
    assert torch.equal(trainer.idro_loss.log_weights, saved["idro_log_weights"])
    data = trainer.training_data
    assert np.array_equal(data.neg_ptr, saved["data_neg_ptr"].numpy())
    assert np.array_equal(data.neg_idx, saved["data_neg_idx"].numpy())
    assert data.negatives_source == meta["negatives_source"] == "self-mined@1"
    km, nc = trainer.kmeans_callback, trainer.negatives_callback
    assert np.array_equal(km.centroids, saved["kmeans_centroids"].numpy()) and km.restored
    assert km.count == meta["kmeans"]["count"] == 2 and km.history == meta["kmeans"]["history"]
    assert nc.count == 1 and nc.history == meta["negatives"]["history"]
    modir = trainer.idro_loss.auxiliary[0]
    assert torch.equal(modir.classifier, saved["modir_classifier"]) and modir.adam_t == int(saved["modir_adam_t"])
    assert [len(d) for _, d in modir.queue] == saved["modir_queue_sizes"].tolist()
    assert trainer.skipped_steps == []
    # saved again, the tensors are the legacy file's, key for key; the metadata is today's layout of the same
    tensors, again = trainer.state_for_checkpoint()
    assert set(tensors) == set(saved)
    for key, value in saved.items():
        assert torch.equal(torch.as_tensor(np.asarray(tensors[key])), value), key
    assert again["idro"]["config"] == meta["idro_config"]
    assert again["data"] == {"negatives_source": "self-mined@1"} and again["trainer"] == {"skipped_steps": []}
    assert again["kmeans"] == meta["kmeans"] and again["negatives"] == meta["negatives"]
