"""Stochastic weight averaging of the distillation (``distill_swa``, :class:`WeightAveraging`): the saved weights are
the mean of the steps' weights in its window, one step's window is no averaging at all, a resumed run averages as an
uninterrupted one, and the recipe's option reaches the trainer, its record and the card."""

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
from hf_cocodr.finetuning.callbacks import WeightAveraging
from hf_cocodr.recipe import RecipeConfig, run_recipe

from .test_distillation_trainer import COMMON, no_dropout, teacher_rows, trained_params

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


class StepWeights(TrainerCallback):
    """The trained parameters after each optimizer step (before the averaging replaces them at the end)."""

    def __init__(self):
        self.after: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = trained_params(model)


def _train(tiny_st_dir, out, swa: float, steps: int = 4, callbacks=(), resume=None, **extra):
    model = no_dropout(load_encoder(str(tiny_st_dir)))
    args = DistillationTrainingArguments(
        output_dir=str(out), **{**COMMON, "max_steps": steps, "learning_rate": 5e-3, **extra}, distill_swa=swa
    )
    trainer = DistillationTrainer(model=model, args=args, train_dataset=teacher_rows(), callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trained_params(model)


def test_the_weights_are_the_mean_of_the_windows_steps(tiny_st_dir, tmp_path):
    """Fraction 0.5 of 4 steps: the saved weights are the mean of the weights after steps 3 and 4, taken by hand;
    fraction 1: of all four."""
    for swa, window in ((0.5, (3, 4)), (1.0, (1, 2, 3, 4))):
        seen = StepWeights()
        trainer, final = _train(tiny_st_dir, tmp_path / f"o{swa}", swa, callbacks=[seen])
        assert sorted(seen.after) == [1, 2, 3, 4]
        averaging = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, WeightAveraging)]
        assert len(averaging) == 1 and averaging[0].count == len(window)
        for name, value in final.items():
            by_hand = torch.stack([seen.after[s][name] for s in window]).mean(0)
            torch.testing.assert_close(value, by_hand, rtol=1e-5, atol=1e-6)
        # and it is not the last step's: the steps moved the weights
        assert any(not torch.equal(final[n], seen.after[4][n]) for n in final)
        saved = load_encoder(str(trainer.finalize()))
        for name, p in saved.named_parameters():
            torch.testing.assert_close(p.detach(), final[name], rtol=0, atol=0)


def test_a_window_of_one_step_is_no_averaging(tiny_st_dir, tmp_path):
    """0.01 of 4 steps is the last step alone: exactly the weights of the same run without averaging."""
    off, plain = _train(tiny_st_dir, tmp_path / "plain", 0.0)
    trainer, one = _train(tiny_st_dir, tmp_path / "one", 0.01)
    assert not any(isinstance(cb, WeightAveraging) for cb in off.callback_handler.callbacks)  # 0: off
    assert [cb.count for cb in trainer.callback_handler.callbacks if isinstance(cb, WeightAveraging)] == [1]
    for name in plain:
        assert torch.equal(plain[name], one[name]), name


def test_a_resumed_run_averages_as_an_uninterrupted_one(tiny_st_dir, tmp_path):
    """Window steps 2-4; the run stopped after step 3 (its checkpoint holds a mean of 2 steps) and resumed ends on
    the weights of the run that never stopped."""
    save = dict(save_strategy="steps", save_steps=1)
    _, whole = _train(tiny_st_dir, tmp_path / "whole", 0.75, **save)
    _train(tiny_st_dir, tmp_path / "cut", 0.75, callbacks=[stop_at(3)], **save)
    state = json.loads((tmp_path / "cut" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    card = (tmp_path / "cut" / "checkpoint-3" / "README.md").read_text()  # raw weights: the card does not claim them
    assert "| weights averaged (SWA) | planned over steps 2-4; this checkpoint holds its own step's weights |" in card
    trainer, resumed = _train(tiny_st_dir, tmp_path / "cut", 0.75, resume=True, **save)
    assert [cb.count for cb in trainer.callback_handler.callbacks if isinstance(cb, WeightAveraging)] == [3]
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=1e-5, atol=1e-6)
    # resumed from its last checkpoint (step 4 of 4): no step is trained, and the mean that checkpoint holds is loaded
    _, again = _train(tiny_st_dir, tmp_path / "whole", 0.75, resume=True, **save)
    for name in whole:
        torch.testing.assert_close(again[name], whole[name], rtol=1e-5, atol=1e-6)


def test_the_window_counts_whole_steps_and_a_stop_before_it_averages_nothing(tiny_st_dir, tmp_path):
    """⌈f × steps⌉ in exact arithmetic (0.28 of 100 is 28 steps, where floats read 28.000000000000004); a run stopped
    before its window keeps its last weights, and its card says so."""
    assert WeightAveraging(0.28).first_step(100) == 73 and WeightAveraging(0.5).first_step(5) == 3
    assert WeightAveraging(1.0).first_step(7) == 1 and WeightAveraging(0.01).first_step(4) == 4
    _, plain = _train(tiny_st_dir, tmp_path / "plain", 0.0, callbacks=[stop_at(2)])
    trainer, stopped = _train(tiny_st_dir, tmp_path / "stopped", 0.5, callbacks=[stop_at(2)])  # window: steps 3-4
    for name in plain:
        assert torch.equal(plain[name], stopped[name]), name
    trainer.finalize()
    card = (tmp_path / "stopped" / "README.md").read_text()
    assert "| weights averaged (SWA) | none: the stage stopped before its window (steps 3-4) |" in card


def test_bad_fractions_are_refused(tmp_path):
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ConfigError, match="distill_swa"):
            DistillationTrainingArguments(output_dir=str(tmp_path / "o"), distill_swa=bad)
        with pytest.raises(ValueError, match="fraction"):
            WeightAveraging(bad)
    with pytest.raises(ValueError, match="fraction"):
        WeightAveraging(0)
    with pytest.raises(ConfigError, match="distill_swa"):
        RecipeConfig(distill_swa=2).validate()
    with pytest.raises(ConfigError, match="load_best_model_at_end"):
        DistillationTrainingArguments(
            output_dir=str(tmp_path / "o"), distill_swa=0.5, load_best_model_at_end=True, eval_strategy="steps",
            save_strategy="steps",
        )  # fmt: skip


def test_the_recipe_option_reaches_the_trainer_the_record_and_the_card(tiny_st_dir, tiny_beir, tmp_path, monkeypatch):
    trainers = spy_distillation_trainers(monkeypatch)
    out = tmp_path / "run"
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"], "guard": "record", "distill_swa": 0.5}
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    trainer = trainers[-1]
    assert trainer.args.distill_swa == 0.5
    (averaging,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, WeightAveraging)]
    assert averaging.count == 1 and averaging.applied  # 2 steps: the last half is step 2
    assert "| weights averaged (SWA) | step 2 alone |" in (out / "model" / "README.md").read_text()
    assert json.loads((out / "recipe.json").read_text())["config"]["distill_swa"] == 0.5
    # (the stage's identity names it: tests/recipe/test_distill_stage.py::test_an_old_run_folders_distillation_...)
