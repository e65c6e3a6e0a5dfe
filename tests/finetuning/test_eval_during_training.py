"""Evaluation during iDRO fine-tuning: eval sets in both training forms, a plain eval loss that changes no state,
any sentence-transformers evaluator, ``load_best_model_at_end`` with the iDRO state, and the CLI flag."""

from __future__ import annotations

import copy
import json

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.base.evaluation import BaseEvaluator

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.cli import main
from hf_cocodr.rundir.state import load_state


def make_args(out, **kw):
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        max_steps=4,
        num_clusters=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=7,
        learning_rate=1e-3,
        dataloader_drop_last=True,
        idro_tau=50.0,
        disable_tqdm=True,
    )
    base.update(kw)
    return IDROTrainingArguments(**base)


def pairs(n: int = 6) -> datasets.Dataset:
    """(query, positive, negative) rows of distinct texts."""
    import random

    import tiny

    rng = random.Random(5)
    topics = sorted(tiny.TOPICS)
    return datasets.Dataset.from_dict(
        {
            "query": [tiny.sentence(rng, topics[i % 8], 5) for i in range(n)],
            "positive": [tiny.document(rng, topics[i % 8], 2) for i in range(n)],
            "negative": [tiny.document(rng, topics[(i + 3) % 8], 2) for i in range(n)],
        }
    )


def snapshot(trainer) -> dict:
    """Everything evaluation must leave alone, copied."""
    km = trainer.kmeans_callback
    return {
        "log_weights": trainer.idro_loss.log_weights.clone(),
        "cluster_ids": trainer.cluster_ids.copy(),
        "centroids": None if km is None or km.centroids is None else km.centroids.copy(),
        "kmeans_count": None if km is None else km.count,
        "neg_idx": trainer.training_data.neg_idx.copy(),
        "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None,
        "weight_history": len(trainer.weight_history),
    }


def assert_same(a, b):
    assert torch.equal(a["log_weights"], b["log_weights"])
    assert np.array_equal(a["cluster_ids"], b["cluster_ids"])
    assert (a["centroids"] is None) == (b["centroids"] is None)
    if a["centroids"] is not None:
        assert np.array_equal(a["centroids"], b["centroids"])
    assert a["kmeans_count"] == b["kmeans_count"]
    assert np.array_equal(a["neg_idx"], b["neg_idx"])
    for n, p in a["params"].items():
        assert torch.equal(p, b["params"][n]), n
    assert a["weight_history"] == b["weight_history"]
    oa, ob = a["optimizer"], b["optimizer"]
    assert (oa is None) == (ob is None)
    if oa is not None:
        assert oa["param_groups"] == ob["param_groups"]
        assert oa["state"].keys() == ob["state"].keys()
        for k, st in oa["state"].items():
            for name, v in st.items():
                w = ob["state"][k][name]
                assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, (k, name)


@pytest.fixture(scope="module")
def train_data(tiny_beir):
    return RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")


@pytest.fixture(scope="module")
def eval_data(tiny_beir):
    return RetrievalTrainingData.from_beir(tiny_beir, "dev", negatives="bm25")


def test_eval_sets_in_both_forms_are_evaluated_during_training(tiny_bert_dir, train_data, eval_data, tmp_path):
    torch.manual_seed(0)
    args = make_args(tmp_path / "o", eval_strategy="steps", eval_steps=2)
    trainer = IDROTrainer(
        model=load_encoder(str(tiny_bert_dir)),
        args=args,
        train_dataset=train_data,
        eval_dataset={"beir": eval_data, "pairs": pairs(8)},
    )
    trainer.train()
    evals = [h for h in trainer.state.log_history if any(k.startswith("eval_") for k in h)]
    for name in ("beir", "pairs"):
        steps = [h["step"] for h in evals if f"eval_{name}_loss" in h]
        assert steps == [2, 4], (name, evals)
        assert all(
            np.isfinite(h[f"eval_{name}_loss"]) and h[f"eval_{name}_loss"] > 0
            for h in evals
            if f"eval_{name}_loss" in h
        )
    # the iDRO statistics and weight history are the training steps' only
    assert [h["step"] for h in trainer.weight_history] == [1, 2, 3, 4]
    assert not any("idro_weight_max" in h for h in evals)


@pytest.mark.parametrize("preset", ["paper", "groupdro"])
def test_evaluate_twice_changes_no_state(preset, tiny_bert_dir, train_data, eval_data, tmp_path):
    torch.manual_seed(0)
    args = make_args(tmp_path / "o", idro_preset=preset, cluster_every_steps=2, eval_strategy="steps", eval_steps=3)
    trainer = IDROTrainer(
        model=load_encoder(str(tiny_bert_dir)), args=args, train_dataset=train_data, eval_dataset=eval_data
    )
    trainer.train()
    assert trainer.optimizer.state  # Adam moments exist: the comparison below covers them
    assert len(set(trainer.cluster_ids.tolist())) > 1
    before, rng = snapshot(trainer), torch.get_rng_state()
    first = trainer.evaluate()
    after_first = snapshot(trainer)
    second = trainer.evaluate()
    assert_same(before, after_first)
    assert_same(before, snapshot(trainer))
    assert torch.equal(torch.get_rng_state(), rng)
    assert first["eval_loss"] == second["eval_loss"]  # the same positives and negatives each time
    # evaluating another set explicitly (a plain dataset) changes nothing either
    other = trainer.evaluate(eval_dataset=pairs(8), metric_key_prefix="other")
    assert np.isfinite(other["other_loss"])
    assert_same(before, snapshot(trainer))


def test_a_run_with_evaluation_trains_as_the_run_without(tiny_bert_dir, train_data, eval_data, tmp_path):
    """Evaluating consumes no randomness of the run (its data loader draws a seed): same dropout, same steps."""
    runs = {}
    for strategy in ("no", "steps"):
        torch.manual_seed(0)
        args = make_args(tmp_path / strategy, max_steps=3, eval_strategy=strategy, eval_steps=1)
        trainer = IDROTrainer(
            model=load_encoder(str(tiny_bert_dir)), args=args, train_dataset=train_data, eval_dataset=eval_data
        )
        trainer.train()
        runs[strategy] = snapshot(trainer)
    assert trainer.model[0].auto_model.config.hidden_dropout_prob > 0  # dropout draws from the torch RNG
    assert_same(runs["no"], runs["steps"])


def test_eval_loss_is_the_plain_infonce(tiny_st_dir, train_data, tmp_path):
    from sentence_transformers import SentenceTransformer

    eval_set = pairs(6)
    model = SentenceTransformer(str(tiny_st_dir))
    args = make_args(tmp_path / "o", idro_preset="paper", per_device_eval_batch_size=6, idro_scale=2.0)
    trainer = IDROTrainer(model=model, args=args, train_dataset=train_data, eval_dataset=eval_set)
    loss = trainer.idro_loss
    loss.set_log_weights(torch.tensor([0.0, 3.0, -2.0], dtype=torch.float64))  # weights must not matter
    weights = loss.log_weights.clone()
    got = trainer.evaluate()["eval_loss"]

    model.eval()
    with torch.no_grad():
        q = model.encode_query(eval_set["query"], convert_to_tensor=True)
        docs = model.encode_document(list(eval_set["positive"]) + list(eval_set["negative"]), convert_to_tensor=True)
    if loss.similarity == "cosine":
        q, docs = F.normalize(q, dim=-1), F.normalize(docs, dim=-1)
    logits = 2.0 * q @ docs.T  # every positive and negative of the batch is a candidate of every query
    expected = (torch.logsumexp(logits, 1) - logits.diagonal()).mean().item()
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert torch.equal(loss.log_weights, weights)


class ScriptedEvaluator(BaseEvaluator):
    """Returns a fixed score per step, so the best checkpoint is known in advance (and is not the last one)."""

    def __init__(self, scores: dict[int, float]):
        super().__init__()
        self.scores = scores
        self.primary_metric = "score"
        self.greater_is_better = True
        self.calls: list[int] = []

    def __call__(self, model, output_path=None, epoch=-1, steps=-1):
        self.calls.append(steps)
        return {"score": self.scores.get(steps, 0.0)}


def test_load_best_model_restores_weights_and_idro_state(tiny_bert_dir, train_data, eval_data, tmp_path):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    evaluator = ScriptedEvaluator({2: 0.1, 4: 0.9, 6: 0.5})
    args = make_args(
        tmp_path / "o",
        max_steps=6,
        cluster_every_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_score",
        greater_is_better=True,
    )
    trainer = IDROTrainer(
        model=load_encoder(str(tiny_bert_dir)),
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        evaluator=evaluator,
    )
    trainer.train()
    assert evaluator.calls == [2, 4, 6]
    best = tmp_path / "o" / "checkpoint-4"
    assert trainer.state.best_model_checkpoint == str(best)
    tensors, meta = load_state(best)
    last, _ = load_state(tmp_path / "o" / "checkpoint-6")
    # the test means something: the last step's state differs from the best one's
    assert not torch.equal(tensors["idro_log_weights"], last["idro_log_weights"])
    saved = SentenceTransformer(str(best)).state_dict()
    last_saved = SentenceTransformer(str(tmp_path / "o" / "checkpoint-6")).state_dict()
    assert any(not torch.equal(saved[k], last_saved[k]) for k in saved)

    now = trainer.model.state_dict()
    assert saved.keys() == now.keys()
    for k in saved:
        assert torch.equal(saved[k], now[k].cpu()), k
    assert torch.equal(trainer.idro_loss.log_weights.cpu(), tensors["idro_log_weights"])
    assert np.array_equal(trainer.cluster_ids, tensors["cluster_ids"].numpy())
    assert np.array_equal(trainer.kmeans_callback.centroids, tensors["kmeans_centroids"].numpy())
    assert trainer.kmeans_callback.count == meta["kmeans"]["count"]


# ------------------------------------------------------------------------------------------------------ CLI
def test_cli_eval_during_training(tiny_st_dir, tiny_beir, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(
        [
            "finetune",
            "--model",
            str(tiny_st_dir),
            "--train-data",
            str(tiny_beir),
            "--num-clusters",
            "2",
            "--eval-during-training",
            f"{tiny_beir}:dev",
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_steps",
            "1",
            "--per_device_train_batch_size",
            "4",
            "--save_strategy",
            "no",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    assert rc == 0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    ndcg = [h for h in history if "eval_toy_dev_ndcg@10" in h]
    assert [h["step"] for h in ndcg] == [1, 2]
    assert all(0.0 <= h["eval_toy_dev_ndcg@10"] <= 1.0 for h in ndcg)
    assert "output_dir" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("{beir}:nosuchsplit", "--eval-during-training '{beir}:nosuchsplit': split 'nosuchsplit' not found"),
        ("{tmp}/missing:dev", "--eval-during-training '{tmp}/missing:dev': {tmp}/missing is not a directory"),
    ],
)
def test_cli_bad_eval_during_training_spec(spec, needle, tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch):
    import hf_cocodr.modeling.loading as loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the spec was checked")

    monkeypatch.setattr(loading, "load_encoder", no_loading)
    spec = spec.format(beir=tiny_beir, tmp=tmp_path)
    rc = main(
        [
            "finetune",
            "--model",
            str(tiny_st_dir),
            "--train-data",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "o"),
            "--eval-during-training",
            spec,
            "--use_cpu",
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert needle.format(beir=tiny_beir, tmp=tmp_path) in lines[-1], lines
    assert not any("Traceback" in line for line in lines)
    assert not (tmp_path / "o").exists()
