"""A stage is one class of a few hooks: a toy stage that defines only its name, its settings, ``build_trainer`` and
``cost`` (the default ``train`` trains its trainer) is probed, planned under a budget from a probe of its own trainer,
given a deadline, run, and resumed after a crash; its plan field survives ``plan.json``. A stage list without a
built-in stage runs a recipe whose schedule never mentions that stage, and a plan written before the contract was
narrowed loads to the same plan."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
import torch
from helpers import Copy
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_cocodr.errors import ConfigError
from hf_cocodr.finetuning.callbacks import WallClockDeadline
from hf_cocodr.recipe import STAGES, Plan, RecipeConfig, Stage, budget_plan, choose_schedule, run_recipe
from hf_cocodr.recipe.outputs import export_final
from hf_cocodr.recipe.planner import one_step_costs, stage_deadlines
from hf_cocodr.recipe.settings import check_number, check_whole, option
from hf_cocodr.recipe.stages import STAGE_SETTINGS, DistillStage, stage_step_seconds

STEP_SLEEP_S = 0.02  # the toy's steps take at least this long, so the budget buys a bounded number of them
LEGACY_PLAN = Path(__file__).parent / "data" / "legacy_plan.json"


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


class ToyTrainer(Trainer):
    """A trainer whose "model" at the end is the one the stage started from (the recipe exports an encoder)."""

    def __init__(self, *args, start: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = start

    def finalize(self) -> None:
        export_final(Path(self.start), Path(self.args.output_dir))


class Toy(Stage):
    """The whole stage: a name, settings, a trainer, and a field it sets in the plan. No ``train``: the default
    trains the trainer by the stage's deadline, resuming from its checkpoint."""

    name = "toy"
    settings = ToySettings

    def __init__(self, crash_at: int | None = None):
        self.crash_at, self.trained, self.probed, self.trainers, self.rounds = crash_at, [], [], [], None

    def cost(self, throughput, cfg, **kw):
        return replace(super().cost(throughput, cfg, **kw), plan={"toy_rounds": 2})

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
        trainer = ToyTrainer(
            model=Regression(),
            args=args,
            train_dataset=data,
            callbacks=[Slow(steps, None if probe else self.crash_at)],
            start=run.current,
        )
        if not probe:
            self.trainers.append(trainer)
            self.rounds = run.plan.stage_fields.get("toy_rounds")
        return trainer


ONLY_TOY = dict(skip_coco=True, skip_finetune=True, wise_alpha=None, save_hybrid=False)


def test_the_toy_defines_only_hooks_of_the_contract():
    own = {k for k, v in vars(Toy).items() if inspect.isfunction(v) and not k.startswith("__")}
    assert own <= set(Stage.HOOKS) and "train" not in own  # (the default train trains its trainer)


def test_a_toy_stage_is_probed_planned_under_a_budget_given_a_deadline_run_and_resumed(
    tiny_st_dir, tiny_beir, tmp_path, monkeypatch
):
    import hf_cocodr.recipe.planner as planner

    monkeypatch.setattr(planner, "STAGE_LOAD_SECONDS", 1.0)  # (a budget of seconds, not of model loads)
    out, args = tmp_path / "run", (str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir))
    crashing = Toy(crash_at=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(*args, out, config=ONLY_TOY, stages=(crashing,), max_minutes=0.15)
    plan = json.loads((out / "plan.json").read_text())
    step_s = plan["throughput"]["toy_step_s"]
    assert step_s >= STEP_SLEEP_S  # the probe timed the toy's own trainer, its sleeping callback included
    assert crashing.probed == [1, 2, 3, 4]  # a warm-up step and three timed ones, in a folder of its own
    assert not (out / "toy" / "checkpoint-4").exists()  # the probe wrote into its own temporary folder
    assert plan["toy_steps"] >= 2 and plan["toy_steps"] <= plan["budget_seconds"] / step_s
    assert plan["toy_rounds"] == 2 and crashing.rounds == 2  # the stage's own plan field
    assert "coco_runs" not in plan and "refreshes" not in plan  # no built-in stage's field in a run without it
    deadline = [c for c in crashing.trainers[0].callback_handler.callbacks if isinstance(c, WallClockDeadline)]
    assert len(deadline) == 1  # the stage got its deadline
    assert crashing.trained == [1, 2, 3]
    resumed = Toy()
    run_recipe(*args, out, config=ONLY_TOY, stages=(resumed,), max_minutes=0.15)
    marker = json.loads((out / "toy" / "hf_cocodr_stage.json").read_text())
    assert resumed.probed == []  # the saved plan is kept: no second probe
    assert resumed.rounds == 2  # and its field read back from plan.json
    assert resumed.trained and resumed.trained[0] == 3  # resumed from step 2's checkpoint (the crash hit first)
    stopped = marker.get("stopped_by_deadline_at_step")
    assert marker["steps"] == json.loads((out / "plan.json").read_text())["toy_steps"] or stopped


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


def _mentions_distillation(record) -> list[str]:
    distill = {f.name for f in fields(DistillStage.settings)} | {"distill_side"}
    text = json.dumps(record)
    return [name for name in sorted(distill) if name in text] + (["distill"] if "distill" in text else [])


def test_a_schedule_without_the_distillation_never_mentions_it():
    """A head-less model given target queries gets the distillation alone from the built-in stages; a stage list
    without the distillation gets the COCO soup, and the record names none of the distillation's options."""
    without = tuple(s for s in STAGES if s is not DistillStage)
    cfg = RecipeConfig(target_queries=["q.jsonl"])
    with_it, record = choose_schedule(cfg, False)
    assert record["kind"] == "no_mlm_head_queries" and _mentions_distillation(record)
    resolved, record = choose_schedule(cfg, False, without)
    assert record["kind"] == "no_mlm_head_soup" and _mentions_distillation(record) == []
    assert resolved.skip_coco is False and resolved.coco_share == 1.0  # the soup's shares, of the run's stages
    assert choose_schedule(RecipeConfig(), True, without)[1]["kind"] == "mlm_head"


def test_a_recipe_whose_stage_list_omits_the_built_ins_runs_and_its_schedule_never_mentions_them(
    tiny_st_dir, tiny_beir, tmp_path
):
    out = tmp_path / "run"
    run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=ONLY_TOY, stages=(Copy,))
    record = json.loads((out / "recipe.json").read_text())
    assert _mentions_distillation(record["schedule"]) == []
    assert not any(key in json.dumps(record["schedule"]) for key in ("skip_coco", "coco_share", "finetune"))
    assert record["plan"] == {"polish_steps": 2} and record["steps_trained"] == {"polish": 2}
    assert not (out / "distill").exists() and not (out / "coco").exists()


def test_nothing_to_train_names_the_runs_stages():
    """The refusal lists the stages of the run (an added one among them), not a fixed list."""
    from hf_cocodr.recipe.runner import _all_off

    class Off(Copy):
        name = "polish"

        def enabled(self, cfg):
            return False

    cfg = RecipeConfig(skip_coco=True)
    from hf_cocodr.recipe.stages import instantiate

    text = _all_off(cfg, list(instantiate((STAGES[0], Off))))
    assert text == "COCO, polish are all off (skip_coco=True)"


def test_a_new_stages_plan_field_round_trips_through_the_plan_dict():
    tp = {"toy_step_s": 2.0}
    cfg = RecipeConfig(**ONLY_TOY)
    plan = budget_plan(100.0, tp, cfg, overhead_s=0.0, stages=(Toy(),))
    assert plan.steps == {"toy": 50} and plan.stage_fields == {"toy_rounds": 2}
    saved = json.loads(json.dumps(plan.to_dict()))
    assert saved["toy_rounds"] == 2 and Plan.from_dict(saved) == plan and Plan.from_dict(saved).to_dict() == saved


def test_a_plan_written_before_the_contract_was_narrowed_loads_to_the_same_plan():
    """``data/legacy_plan.json`` was written by the planner before this change (COCO soup of 2 runs, the fine-tuning
    with 2 refreshes, target pairs, the distillation, WiSE-FT). It loads to the plan below and writes back the same
    dict, the steps of the retired target stage included (a run refuses to resume it: tests/recipe/test_retired.py),
    and today's stages get the deadlines and one-step costs that planner computed from it (hand-checked: the
    distillation ends at 100 + 1800 - 2 x 20 s (the final export and WiSE-FT's), each stage before it that much
    earlier than the next one's planned seconds: 280 x 1.5 + 30.5, 126 x 4 + 2 x 6, so COCO's
    (2 x 63 x 2.5 + 20) s later)."""
    legacy = json.loads(LEGACY_PLAN.read_text())
    plan = Plan.from_dict(legacy)
    assert plan.steps == {"coco": 63, "finetune": 126, "target": 140, "distill": 280}
    assert plan.stage_fields == {"coco_runs": 2, "refreshes": 2, "refresh_seconds_each": 6.0, "kmeans_seconds": 0.0}
    assert (plan.budget_seconds, plan.fixed_seconds, plan.identity) == (1800.0, 117.5, "0123456789abcdef")
    assert plan.runs_of("coco") == 2 and plan.runs_of("finetune") == 1
    assert plan.to_dict() == legacy
    cfg, _ = choose_schedule(
        RecipeConfig(
            coco_runs="budget",
            skip_distill=False,
            target_queries=["q.jsonl"],
            pseudo_queries=0,
            wise_alpha=0.5,
        ),
        True,
    )
    assert stage_deadlines(legacy, cfg, 100.0) == pytest.approx({"distill": 1860.0, "finetune": 1409.5, "coco": 893.5})
    assert one_step_costs(plan, stage_step_seconds(plan.throughput, cfg), cfg) == {
        "coco": (25.0, "2.50 s per step x 2 runs"),
        "finetune": (4.0, "4.00 s per step"),
        "distill": (1.5, "1.50 s per step"),
    }


def test_recipe_config_inherits_the_settings_of_the_stages_and_nothing_else():
    assert STAGE_SETTINGS == tuple(s.settings for s in STAGES)
    assert set(RecipeConfig.__bases__) == set(STAGE_SETTINGS) and len(RecipeConfig.__bases__) == len(STAGES)
    assert RecipeConfig.settings_classes() == list(STAGE_SETTINGS)[::-1]


def test_the_stage_switches_and_step_seconds_read_a_config_the_schedule_has_not_resolved():
    """``stage_switches`` / ``stage_step_seconds`` (public) answer for a config whose shares are still ``auto`` (the
    same steps and step seconds as for the config the schedule resolves: they read no share)."""
    from hf_cocodr.recipe import choose_schedule
    from hf_cocodr.recipe.stages import stage_switches

    cfg = RecipeConfig(coco_steps=3)
    resolved = choose_schedule(cfg, has_mlm_head=True)[0]
    throughput = {"coco_step_s": 0.5, "finetune_step_s": 0.25}
    steps = {name: fixed for name, (_, fixed) in stage_switches(cfg).items()}
    assert steps["coco"] == 3 and steps == {name: fixed for name, (_, fixed) in stage_switches(resolved).items()}
    assert stage_step_seconds(throughput, cfg) == stage_step_seconds(throughput, resolved)
    assert stage_step_seconds(throughput, cfg)["finetune"] == 0.25
