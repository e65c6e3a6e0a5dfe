"""A stage is one class: a toy stage that defines only its name, its settings, ``build_trainer`` and ``train`` is
planned under a budget from a probe of its own trainer, given a deadline, run, and resumed after a crash."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe import Stage, run_recipe
from hf_cocodr.recipe.outputs import export_final
from hf_cocodr.recipe.settings import check_number, check_whole, option

STEP_SLEEP_S = 0.02  # the toy's steps take at least this long, so the budget buys a bounded number of them


@dataclass
class ToySettings:
    toy_steps: int | None = option(None, "steps of the toy stage (default: planned)")
    toy_share: float = option(1.0, "the toy stage's share of the budget")

    def check(self) -> None:
        check_whole(self, "toy_steps", 1)
        check_number(self, "toy_share", 0, 1, allow_auto=False)


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": (self.linear(x).squeeze(-1) - y).square().mean()}


class Slow(TrainerCallback):
    """Each step takes at least STEP_SLEEP_S, and the steps a trainer trains are recorded."""

    def __init__(self, steps: list[int], crash_at: int | None = None):
        self.steps, self.crash_at = steps, crash_at

    def on_step_begin(self, args, state, control, **kwargs):
        import time

        time.sleep(STEP_SLEEP_S)
        self.steps.append(state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        if self.crash_at is not None and state.global_step == self.crash_at:
            raise RuntimeError("simulated crash")


class Toy(Stage):
    """The whole stage: a name, settings, a trainer and how it trains."""

    name = "toy"
    settings = ToySettings

    def __init__(self, crash_at: int | None = None):
        self.crash_at, self.trained, self.probed, self.guard = crash_at, [], [], None

    def build_trainer(self, run, max_steps, *, output_dir=None, probe=False):
        from datasets import Dataset

        gen = torch.Generator().manual_seed(0)
        data = Dataset.from_dict({"x": torch.rand(64, 4, generator=gen).tolist(), "y": torch.rand(64).tolist()})
        args = self.training_arguments(
            run,
            TrainingArguments,
            max_steps,
            output_dir=output_dir or run.dir(self.name),
            probe=probe,
            per_device_train_batch_size=4,
            save_strategy="steps",
            save_steps=1,
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            seed=run.cfg.seed,
        )
        steps = self.probed if probe else self.trained
        return Trainer(
            model=Regression(),
            args=args,
            train_dataset=data,
            callbacks=[Slow(steps, None if probe else self.crash_at)],
        )

    def train(self, run):
        trainer = self.build_trainer(run, run.plan.steps_of(self.name))
        self.guard = run.deadline(trainer, self.name)
        resume = run.resume and any(run.dir(self.name).glob("checkpoint-*"))
        trainer.train(resume_from_checkpoint=True if resume else None)
        export_final(Path(run.current), run.dir(self.name))  # (the toy's "model": the one it started from)
        return {"steps": trainer.state.global_step}


ONLY_TOY = dict(skip_coco=True, skip_finetune=True, target_pairs="none", wise_alpha=None, save_hybrid=False)


def test_a_toy_stage_is_probed_planned_under_a_budget_given_a_deadline_run_and_resumed(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch
):
    import hf_cocodr.recipe.planner as planner

    monkeypatch.setattr(planner, "STAGE_LOAD_SECONDS", 1.0)  # (a budget of seconds, not of model loads)
    out, args = tmp_path / "run", (str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir))
    crashing = Toy(crash_at=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(*args, out, config=ONLY_TOY, stages=(crashing,), max_minutes=0.5)
    plan = json.loads((out / "plan.json").read_text())
    step_s = plan["throughput"]["toy_step_s"]
    assert step_s >= STEP_SLEEP_S  # the probe timed the toy's own trainer, its sleeping callback included
    assert crashing.probed == [1, 2, 3, 4]  # a warm-up step and three timed ones, in a folder of its own
    assert not (out / "toy" / "checkpoint-4").exists()  # the probe wrote into its own temporary folder
    assert plan["toy_steps"] >= 2 and plan["toy_steps"] <= plan["budget_seconds"] / step_s
    assert crashing.guard is not None  # the stage got its deadline
    assert crashing.trained == [1, 2, 3]
    resumed = Toy()
    run_recipe(*args, out, config=ONLY_TOY, stages=(resumed,), max_minutes=0.5)
    marker = json.loads((out / "toy" / "hf_cocodr_stage.json").read_text())
    assert resumed.probed == []  # the saved plan is kept: no second probe
    assert (
        resumed.trained and resumed.trained[0] == 3
    )  # resumed from step 2's checkpoint (the crash hit before step 3 saved)
    assert marker["steps"] == json.loads((out / "plan.json").read_text())["toy_steps"] or resumed.guard.stopped_at_step


def test_the_toy_stage_settings_are_recipe_options_checked_by_name(tiny_st_dir, tiny_beir, tmp_path):
    args = (str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "run")
    with pytest.raises(ConfigError, match="toy_share"):
        run_recipe(*args, config={**ONLY_TOY, "toy_share": 2.0}, stages=(Toy,), max_minutes=0.5)
    with pytest.raises(ConfigError, match="unknown recipe option"):
        run_recipe(*args, config={**ONLY_TOY, "toy_share": 0.5})  # without the stage, no such option
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_stage_without_a_trainer_or_fixed_steps_is_refused_by_name_not_divided_by_zero(
    tiny_st_dir, tiny_beir, tmp_path
):
    class NoTrainer(Stage):
        name = "bare"

        def train(self, run):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(ConfigError, match="stage bare: no step time was measured"):
        run_recipe(
            str(tiny_st_dir),
            [str(tiny_beir)],
            str(tiny_beir),
            tmp_path / "run",
            config=ONLY_TOY,
            stages=(NoTrainer,),
            max_minutes=0.5,
        )
