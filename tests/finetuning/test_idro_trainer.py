from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from tiny import stop_at
from transformers import TrainerCallback

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.finetuning import KMeansClusteringCallback


@pytest.fixture(scope="module")
def multi_beir(tmp_path_factory):
    import tiny

    return tiny.make_beir(tmp_path_factory.mktemp("mb") / "beir", n_queries=60, multi_positive=True)


def make_args(out, **kw):
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        max_steps=6,
        num_clusters=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=7,
        learning_rate=1e-3,
        dataloader_drop_last=True,
        idro_tau=50.0,
    )
    base.update(kw)
    return IDROTrainingArguments(**base)


class Spy(TrainerCallback):
    """Records, after every step, the loss weights and the cluster assignment the trainer holds."""

    def __init__(self):
        self.trainer = None
        self.weights, self.assignments, self.centroids = {}, {}, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.weights[state.global_step] = self.trainer.idro_loss.weights.clone()
        self.assignments[state.global_step] = self.trainer.cluster_ids.copy()
        self.centroids[state.global_step] = self.trainer.kmeans_callback.centroids.copy()


def build(tiny_bert_dir, data, args, callbacks=()):
    torch.manual_seed(0)
    model = load_encoder(str(tiny_bert_dir))
    spy = Spy()
    trainer = IDROTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))
    trainer.add_callback(spy)  # last: sees the state after the clustering/negative callbacks of the step
    spy.trainer = trainer
    return trainer, spy


def test_trains_and_changes_every_trainable_parameter(tiny_bert_dir, multi_beir, tmp_path):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="bm25")
    trainer, _ = build(tiny_bert_dir, data, make_args(tmp_path / "o", max_steps=4))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert "train_loss" in trainer.state.log_history[-1]
    unchanged = [
        n
        for n, p in trainer.model.named_parameters()
        if p.requires_grad and "pooler" not in n and torch.equal(before[n], p.detach())
    ]
    assert not unchanged, unchanged
    logged = trainer.state.log_history[0]
    for key in ("idro_clusters_present", "idro_weight_max", "idro_weight_min", "hard_negatives_per_query"):
        assert key in logged


def test_kmeans_runs_inside_train_and_changes_assignments(tiny_bert_dir, multi_beir, tmp_path):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="bm25")
    trainer, spy = build(tiny_bert_dir, data, make_args(tmp_path / "o", cluster_every_steps=2, learning_rate=5e-3))
    assert trainer.kmeans_callback is not None  # auto-inserted
    assert (trainer.cluster_ids == 0).all()  # nothing before train()
    trainer.train()
    km = trainer.kmeans_callback
    assert [h["step"] for h in km.history] == [0, 2, 4]
    assert len(set(spy.assignments[1].tolist())) > 1  # the ids came from the clustering at train start
    # re-clustering at step 2 used the current (trained) model: new centroids, same centroids in between
    assert not np.allclose(spy.centroids[1], spy.centroids[2])
    assert np.array_equal(spy.centroids[2], spy.centroids[3])


def test_user_callback_is_not_duplicated(tiny_bert_dir, multi_beir, tmp_path):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="none")
    mine = KMeansClusteringCallback(num_clusters=3, every_steps=0)
    trainer, _ = build(tiny_bert_dir, data, make_args(tmp_path / "o", max_steps=2, num_negatives=0), [mine])
    assert trainer.kmeans_callback is mine
    assert sum(isinstance(c, KMeansClusteringCallback) for c in trainer.callback_handler.callbacks) == 1
    trainer.train()
    assert trainer.cluster_ids.max() < 3


def test_refreshed_negatives_never_contain_positives(tiny_bert_dir, multi_beir, tmp_path):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="bm25")
    trainer, _ = build(
        tiny_bert_dir,
        data,
        make_args(tmp_path / "o", max_steps=5, refresh_negatives_every_steps=2, negatives_top_k=50),
    )
    seen = []
    orig = data.sample

    def spy_sample(rows, **kw):
        cols, doc_keys, pos_keys = orig(rows, **kw)
        seen.append((doc_keys.copy(), pos_keys.copy()))
        return cols, doc_keys, pos_keys

    data.sample = spy_sample
    trainer.train()
    assert trainer.negatives_callback.count == 2
    assert data.negatives_source.startswith("self-mined@4")
    for row in range(len(data)):
        assert not set(data.negatives(row).tolist()) & set(data.positives(row).tolist())
    for doc_keys, pos_keys in seen:
        for negs, pos in zip(doc_keys[:, 1:], pos_keys):
            assert not set(negs.tolist()) & set(p for p in pos.tolist() if p >= 0)
    # re-clustering happened with each refresh
    reasons = [h["reason"] for h in trainer.kmeans_callback.history]
    assert reasons.count("negatives refresh at step 2") == 1 and reasons.count("negatives refresh at step 4") == 1


@pytest.mark.parametrize(
    "stop,max_steps,cluster_every", [(3, 6, 2), (5, 9, 0)], ids=["every-2-steps", "per-epoch-resumed-late-in-an-epoch"]
)
def test_resume_continues_the_same_trajectory(stop, max_steps, cluster_every, tiny_bert_dir, multi_beir, tmp_path):
    # 60 queries / 8 = 7 steps per epoch: the second case resumes at epoch progress 5/7 (> 0.5) and then crosses
    # the epoch boundary, where the per-epoch re-clustering must happen once, at step 7, as in the uninterrupted run
    def run(out, halt=None, resume=None):
        data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="bm25")
        args = make_args(
            out,
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=stop,
            cluster_every_steps=cluster_every,
            refresh_negatives_every_steps=3,
            negatives_top_k=30,
            recluster_on_refresh=bool(cluster_every),
        )
        trainer, spy = build(tiny_bert_dir, data, args, [stop_at(halt)] if halt else [])
        trainer.train(resume_from_checkpoint=resume)
        return trainer, spy

    full, spy_full = run(tmp_path / "full")
    part, _ = run(tmp_path / "part", halt=stop)
    assert part.state.global_step == stop
    resumed, spy_res = run(tmp_path / "part", resume=True)
    assert resumed.state.global_step == max_steps
    assert [h["reason"] for h in resumed.kmeans_callback.history] == [
        h["reason"] for h in full.kmeans_callback.history
    ]
    torch.testing.assert_close(spy_res.weights[max_steps], spy_full.weights[max_steps], rtol=1e-6, atol=1e-9)
    assert np.array_equal(spy_res.assignments[max_steps], spy_full.assignments[max_steps])
    loss_full = [h["loss"] for h in full.state.log_history if "loss" in h and h["step"] > stop]
    loss_res = [h["loss"] for h in resumed.state.log_history if "loss" in h and h["step"] > stop]
    assert loss_res == pytest.approx(loss_full, rel=1e-5)
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_k_larger_than_queries_is_clamped(tiny_bert_dir, multi_beir, tmp_path, caplog):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="none")
    trainer, _ = build(tiny_bert_dir, data, make_args(tmp_path / "o", max_steps=1, num_clusters=500, num_negatives=0))
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert any("larger than the 30 training queries" in r.getMessage() for r in caplog.records)
    assert trainer.idro_loss.num_clusters == 30


def test_nan_loss_step_is_skipped_and_training_continues(tiny_bert_dir, multi_beir, tmp_path, caplog):
    data = RetrievalTrainingData.from_beir(multi_beir, "train", negatives="bm25")
    trainer, _ = build(tiny_bert_dir, data, make_args(tmp_path / "o", max_steps=4))
    transformer = trainer.model[0]
    orig = transformer.forward
    calls = {"n": 0}
    snapshots = {}

    class Snap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots[state.global_step] = [p.detach().clone() for p in trainer.model.parameters()]

    trainer.add_callback(Snap())

    def poisoned(features, *a, **k):
        out = orig(features, *a, **k)
        if trainer.state.global_step == 1:  # second step: poison the embeddings
            out["token_embeddings"] = out["token_embeddings"] * float("nan")
        calls["n"] += 1
        return out

    transformer.forward = poisoned
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert trainer.state.global_step == 4
    assert trainer.skipped_steps == [2]
    assert any("non-finite loss at step 2" in r.getMessage() for r in caplog.records)
    for a, b in zip(snapshots[1], snapshots[2]):
        assert torch.equal(a, b)  # no update at the skipped step
    assert any(not torch.equal(a, b) for a, b in zip(snapshots[2], snapshots[3]))
    assert all(np.isfinite(p.detach().numpy()).all() for p in trainer.model.parameters())
    # the skipped step left the optimizer state alone too: 3 Adam steps in 4 training steps
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert {int(s["step"]) for s in inner.state.values()} == {3}


def test_plain_dataset_is_accepted(tiny_bert_dir, tmp_path):
    import random

    import tiny
    from datasets import Dataset

    rng = random.Random(0)  # distinct texts (the tiny vocabulary has no digits: "topic 3" would be "topic [UNK]")
    topics = [sorted(tiny.TOPICS)[i % len(tiny.TOPICS)] for i in range(16)]
    ds = Dataset.from_dict(
        {"anchor": [tiny.sentence(rng, t, 5) for t in topics], "positive": [tiny.document(rng, t, 2) for t in topics]}
    )
    trainer, _ = build(tiny_bert_dir, ds, make_args(tmp_path / "o", max_steps=2, num_clusters=2))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert trainer.state.global_step == 2
    # it trained on the dataset's pairs: a finite training loss was logged and the encoder moved
    losses = [row["train_loss"] for row in trainer.state.log_history if "train_loss" in row]
    assert len(losses) == 1 and np.isfinite(losses[0]) and losses[0] > 0
    after = dict(trainer.model.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n].detach())]
    assert any("encoder.layer" in n for n in changed), "no transformer weight changed"


def test_bad_inputs(tiny_bert_dir, tmp_path):
    from datasets import Dataset

    model = load_encoder(str(tiny_bert_dir))
    with pytest.raises(ValueError, match="at least two text columns"):
        IDROTrainer(model=model, args=make_args(tmp_path), train_dataset=Dataset.from_dict({"q": ["a"]}))
    with pytest.raises(ValueError, match="empty"):
        IDROTrainer(model=model, args=make_args(tmp_path), train_dataset=Dataset.from_dict({"q": [], "p": []}))
    with pytest.raises(ValueError, match="idro_tau must be > 0"):
        make_args(tmp_path, idro_tau=0.0)
    with pytest.raises(ValueError, match="idro_beta must be >= 0"):
        make_args(tmp_path, idro_beta=-1.0)
    ds = Dataset.from_dict({"q": ["a", "b"] * 4, "p": ["c", "d"] * 4})
    with pytest.raises(ValueError, match="refresh_negatives_every_steps needs RetrievalTrainingData"):
        IDROTrainer(model=model, args=make_args(tmp_path, refresh_negatives_every_steps=2), train_dataset=ds)
    with pytest.raises(ValueError, match="2 training queries cannot fill one batch of 8"):
        IDROTrainer(model=model, args=make_args(tmp_path), train_dataset=ds.select(range(2)))


def test_missing_positives_error_lists_examples(tmp_path):
    import tiny

    from hf_cocodr.data import BEIRFormatError

    folder = tiny.make_beir(tmp_path / "b", n_queries=4)
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    blank = [json.dumps({**json.loads(x), "title": "", "text": ""}) for x in lines]
    (folder / "corpus.jsonl").write_text("\n".join(blank + [json.dumps({"_id": "extra", "text": "x"})]) + "\n")
    with pytest.raises(
        BEIRFormatError, match=r"none of the 2 judged queries has a positive document with text.*e\.g\. \['q"
    ):
        RetrievalTrainingData.from_beir(folder, "train", negatives="none")
