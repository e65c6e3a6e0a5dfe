"""DistillationTrainer: the loss of a step is HybridDistillLoss on the rows' texts and teacher scores, and it trains
exactly as IDROTrainer with a HybridDistillLoss did (the recipe's distillation before the trainer had its own)."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset

from hf_cocodr import (
    DistillationTrainer,
    DistillationTrainingArguments,
    HybridDistillLoss,
    IDROTrainer,
    IDROTrainingArguments,
    load_encoder,
)

K = 3
OPTIONS = dict(temperature=0.5, teacher_temperature=1.0, in_batch_weight=0.5, similarity="dot")
COMMON = dict(
    per_device_train_batch_size=4,
    max_steps=3,
    learning_rate=1e-3,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    seed=11,
    dataloader_drop_last=True,
    logging_steps=1,
)


def teacher_rows(n: int = 12) -> Dataset:
    import tiny

    rng = random.Random(4)
    topics = sorted(tiny.TOPICS)
    columns = {"query": [], **{f"doc_{j}": [] for j in range(1, K + 1)}, "label": []}
    for _ in range(n):
        topic = rng.choice(topics)
        columns["query"].append(tiny.sentence(rng, topic, 5))
        for j in range(1, K + 1):
            columns[f"doc_{j}"].append(tiny.sentence(rng, rng.choice(topics)))
        columns["label"].append(sorted((rng.gauss(0, 1) for _ in range(K)), reverse=True))
    return Dataset.from_dict(columns)


def trained_params(model) -> dict[str, torch.Tensor]:
    """A copy of every parameter the trainer trains (``requires_grad``), by name."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def test_a_step_loss_is_the_hybrid_distill_loss_of_the_rows(tiny_st_dir, tmp_path):
    model = load_encoder(str(tiny_st_dir)).eval()
    rows = teacher_rows()
    args = DistillationTrainingArguments(output_dir=str(tmp_path / "o"), **COMMON)
    trainer = DistillationTrainer(model=model, args=args, train_dataset=rows, loss=HybridDistillLoss(model, **OPTIONS))
    picked = [5, 0, 7, 2]
    with torch.no_grad():
        got = trainer.compute_loss(model, {"label": torch.tensor(picked)})
        batch = rows.select(picked)
        features = [model.preprocess(batch["query"], task="query")]
        features += [model.preprocess(batch[f"doc_{j}"], task="document") for j in range(1, K + 1)]
        by_hand = HybridDistillLoss(model, **OPTIONS)(features, torch.tensor(batch["label"]))
    assert float(got) == pytest.approx(float(by_hand), rel=1e-5)


def test_it_trains_as_idro_trainer_with_the_distill_loss_did(tiny_st_dir, tmp_path):
    def run(trainer_class, args_class, name):
        torch.manual_seed(0)
        model = no_dropout(load_encoder(str(tiny_st_dir)))
        args = args_class(output_dir=str(tmp_path / name), **COMMON)
        trainer = trainer_class(
            model=model, args=args, train_dataset=teacher_rows(), loss=HybridDistillLoss(model, **OPTIONS)
        )
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return {n: p.detach().clone() for n, p in model.named_parameters()}, losses

    before = {n: p.detach().clone() for n, p in load_encoder(str(tiny_st_dir)).named_parameters()}
    old, old_losses = run(IDROTrainer, IDROTrainingArguments, "idro")
    new, new_losses = run(DistillationTrainer, DistillationTrainingArguments, "distill")
    assert len(new_losses) == 3 and new_losses == old_losses
    assert all(torch.equal(old[n], new[n]) for n in old)
    assert any(not torch.equal(before[n], new[n]) for n in new)  # it did train


def test_the_loss_holds_its_settings_and_the_default_is_the_rows_loss_at_its_defaults(tiny_st_dir, tmp_path):
    """No loss given: the rows' loss at its defaults (the student's temperature by the model's similarity); a loss
    given with its settings is the one trained; the arguments hold no loss setting."""
    from hf_cocodr.finetuning.losses import distill_loss

    model = load_encoder(str(tiny_st_dir))
    args = DistillationTrainingArguments(output_dir=str(tmp_path / "o"), **COMMON)
    trainer = DistillationTrainer(model=model, args=args, train_dataset=teacher_rows())
    cosine = model.similarity_fn_name == "cosine"
    plain = HybridDistillLoss(
        model,
        temperature=0.05 if cosine else 1.0,
        teacher_temperature=1.0,
        in_batch_weight=1.0,
        document_gradients=True,
    )
    assert trainer.loss.get_config_dict() == plain.get_config_dict()
    settings = dict(teacher_temperature=2.0, in_batch_weight=0.0, document_gradients=False)
    loss = distill_loss(model, teacher_rows(), **settings)
    assert DistillationTrainer(model=model, args=args, train_dataset=teacher_rows(), loss=loss).loss is loss
    assert loss.get_config_dict() == {**plain.get_config_dict(), **settings}
    with pytest.raises(TypeError):
        DistillationTrainingArguments(output_dir=str(tmp_path / "q"), distill_teacher_temperature=2.0, **COMMON)


def test_rows_without_teacher_scores_and_bad_settings_are_refused(tiny_st_dir, tmp_path):
    model = load_encoder(str(tiny_st_dir))
    args = DistillationTrainingArguments(output_dir=str(tmp_path / "o"), **COMMON)
    plain = teacher_rows().remove_columns("label")
    with pytest.raises(ValueError, match="needs rows with the teacher's scores"):
        DistillationTrainer(model=model, args=args, train_dataset=plain)
    with pytest.raises(ValueError, match="needs DistillationTrainingArguments"):
        DistillationTrainer(
            model=model, args=IDROTrainingArguments(output_dir=str(tmp_path / "p")), train_dataset=plain
        )
    with pytest.raises(ValueError):
        DistillationTrainingArguments(output_dir=str(tmp_path / "q"), **{**COMMON, "max_steps": 0})
    for bad in ({"teacher_temperature": 0.0}, {"in_batch_weight": -1.0}):
        with pytest.raises(ValueError):
            HybridDistillLoss(model, **bad)
