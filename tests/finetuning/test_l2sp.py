"""The pull toward the starting weights (``distill_l2sp``, :class:`StartingPointAnchor`): each step's weights are the
optimizer's moved ``lr · α`` of the way back to the start, taken by hand; ``lr · α = 1`` never leaves the start; off
is the run without it; a resumed run pulls as an uninterrupted one; and the recipe's option reaches the trainer, its
record and the card."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import QUERY_SIDE_CFG as CFG
from helpers import spy_distillation_trainers
from tiny import stop_at
from transformers import TrainerCallback

from hf_cocodr import DistillationTrainer, DistillationTrainingArguments, load_encoder
from hf_cocodr.errors import ConfigError
from hf_cocodr.finetuning.callbacks import StartingPointAnchor
from hf_cocodr.recipe import RecipeConfig, run_recipe
from hf_cocodr.rundir.run_record import RunMismatchError

from .test_distillation_trainer import COMMON, no_dropout, teacher_rows, trained_params

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


class StepSpy(TrainerCallback):
    """Given before the anchor (callbacks run in the order they were added): the weights the optimizer's step left
    and that step's learning rate; then, at the step's end, the weights after the pull."""

    def __init__(self):
        self.optimizer_left: dict[int, dict[str, torch.Tensor]] = {}
        self.lr: dict[int, float] = {}
        self.after: dict[int, dict[str, torch.Tensor]] = {}

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        step = state.global_step + 1
        self.optimizer_left[step] = trained_params(model)
        self.lr[step] = optimizer.param_groups[0]["lr"]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = trained_params(model)


def _train(tiny_st_dir, out, l2sp: float, callbacks=(), resume=None, **extra):
    model = no_dropout(load_encoder(str(tiny_st_dir)))
    start = trained_params(model)
    args = DistillationTrainingArguments(
        output_dir=str(out), **{**COMMON, "max_steps": 4, "learning_rate": 5e-3, **extra}, distill_l2sp=l2sp
    )
    trainer = DistillationTrainer(model=model, args=args, train_dataset=teacher_rows(), callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, start, trained_params(model)


def test_each_step_moves_lr_times_the_weight_of_the_way_back_to_the_start(tiny_st_dir, tmp_path):
    """θ_after = θ_opt + lr·α·(θ₀ − θ_opt) at every step, with θ₀ the weights before training and lr the step's (the
    linear schedule's, so it differs from step to step)."""
    spy = StepSpy()
    trainer, start, final = _train(tiny_st_dir, tmp_path / "o", 40.0, callbacks=[spy])
    assert [type(cb) for cb in trainer.callback_handler.callbacks].count(StartingPointAnchor) == 1
    assert sorted(spy.after) == [1, 2, 3, 4] and len(set(spy.lr.values())) > 1
    for step in (1, 2, 3, 4):
        rate = spy.lr[step] * 40.0
        for name, moved in spy.optimizer_left[step].items():
            by_hand = moved + rate * (start[name] - moved)
            torch.testing.assert_close(spy.after[step][name], by_hand, rtol=1e-6, atol=1e-7)
    # the pull acted: some parameter ended nearer its start than the optimizer alone left it at the last step
    assert any(not torch.equal(spy.after[4][n], spy.optimizer_left[4][n]) for n in final)
    saved = load_encoder(str(trainer.finalize()))
    for name, p in saved.named_parameters():
        if name in final:
            torch.testing.assert_close(p.detach(), final[name], rtol=0, atol=0)
    assert "| pull toward the start (L2-SP weight) | 40.0 |" in (tmp_path / "o" / "README.md").read_text()


def test_a_pull_of_the_whole_way_never_leaves_the_start(tiny_st_dir, tmp_path):
    """lr · α = 1 at a constant learning rate: every step is undone, so the weights end exactly where they began
    (while the same run without the pull moves them)."""
    flat = dict(lr_scheduler_type="constant", warmup_steps=0)
    _, start, anchored = _train(tiny_st_dir, tmp_path / "anchored", 200.0, **flat)  # 5e-3 × 200 = 1
    _, _, free = _train(tiny_st_dir, tmp_path / "free", 0.0, **flat)
    for name in start:
        assert torch.equal(anchored[name], start[name]), name
    assert any(not torch.equal(free[n], start[n]) for n in start)


def test_off_is_the_run_without_it(tiny_st_dir, tmp_path):
    """0 (the default) adds no callback, and its weights are those of a run that never heard of the option."""
    off, _, zero = _train(tiny_st_dir, tmp_path / "zero", 0.0)
    assert not any(isinstance(cb, StartingPointAnchor) for cb in off.callback_handler.callbacks)
    model = no_dropout(load_encoder(str(tiny_st_dir)))
    args = DistillationTrainingArguments(output_dir=str(tmp_path / "plain"), **{**COMMON, "max_steps": 4})
    args.learning_rate = 5e-3
    DistillationTrainer(model=model, args=args, train_dataset=teacher_rows()).train()
    plain = trained_params(model)
    for name in plain:
        assert torch.equal(plain[name], zero[name]), name


def test_a_resumed_run_pulls_toward_the_same_start(tiny_st_dir, tmp_path):
    """Stopped after step 2 and resumed (the model now holds step 2's weights, not the start's): it ends on the
    weights of the run that never stopped, because the checkpoint holds θ₀."""
    save = dict(save_strategy="steps", save_steps=1)
    _, _, whole = _train(tiny_st_dir, tmp_path / "whole", 40.0, **save)
    _train(tiny_st_dir, tmp_path / "cut", 40.0, callbacks=[stop_at(2)], **save)
    _, _, resumed = _train(tiny_st_dir, tmp_path / "cut", 40.0, resume=True, **save)
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=1e-5, atol=1e-6)
    # a run without the pull (its checkpoints hold no starting weights) is not resumed with it: refused by name
    _train(tiny_st_dir, tmp_path / "plain", 0.0, callbacks=[stop_at(2)], **save)
    with pytest.raises(RunMismatchError, match="distill_l2sp"):
        _train(tiny_st_dir, tmp_path / "plain", 40.0, resume=True, **save)


def test_bad_weights_are_refused(tmp_path):
    for bad in (-1.0, True, "strong", float("inf")):
        with pytest.raises(ConfigError, match="distill_l2sp"):
            DistillationTrainingArguments(output_dir=str(tmp_path / "o"), distill_l2sp=bad)
        with pytest.raises(ValueError, match="weight"):
            StartingPointAnchor(bad)
    with pytest.raises(ConfigError, match="at most 1"):  # 1e-3 × 2000 = 2: past the start
        DistillationTrainingArguments(output_dir=str(tmp_path / "o"), learning_rate=1e-3, distill_l2sp=2000)
    with pytest.raises(ConfigError, match="distill_l2sp"):
        RecipeConfig(distill_l2sp=-3).validate()


def test_the_recipe_option_reaches_the_trainer_the_record_and_the_card(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    trainers = spy_distillation_trainers(monkeypatch)
    out = tmp_path / "run"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "guard": "record", "distill_l2sp": 100.0}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    trainer = trainers[-1]
    assert trainer.args.distill_l2sp == 100.0
    (anchor,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StartingPointAnchor)]
    # the query side trains the query route alone: the anchor holds it, not the frozen document route
    routes = {name.split(".")[2] for name, _ in trainer.model.named_parameters()}
    assert routes == {"query", "document"} and {name.split(".")[2] for name in anchor.anchor} == {"query"}
    assert "| pull toward the start (L2-SP weight) | 100.0 |" in (out / "model" / "README.md").read_text()
    assert json.loads((out / "recipe.json").read_text())["config"]["distill_l2sp"] == 100.0
