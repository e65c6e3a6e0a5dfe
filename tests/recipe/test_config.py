"""The recipe's settings: a torch-free module, and the command line's flags built from the dataclass fields."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import fields

import pytest

from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe.config import (
    STAGE_OPTIONS,
    Auto,
    RecipeArguments,
    RecipeConfig,
    add_config_arguments,
    config_from_flags,
)
from hf_cocodr.retired import RETIRED_OPTIONS

# The recipe command's flags as README and scripts use them: a contract (less the retired ones, hf_cocodr.retired).
FLAGS = (
    "--model",
    "--target-corpus",
    "--source-data",
    "--source-split",
    "--output_dir",
    "--output-dir",
    "--eval",
    "--max-minutes",
    "--resume_from_checkpoint",
    "--resume-from-checkpoint",
    "--overwrite_output_dir",
    "--overwrite-output-dir",
    "--method",
    "--target-queries",
    "--schedule",
    "--coco-mlm-weight",
    "--coco-lr",
    "--coco-runs",
    "--coco-run-steps",
    "--skip-coco",
    "--skip-finetune",
    "--wise-alpha",
    "--train-max-length",
    "--no-start-eval",
    "--no-save-hybrid",
    "--config",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, RecipeArguments)
    add_config_arguments(parser, RecipeConfig)
    return parser


def test_importing_the_config_loads_no_torch():
    code = (
        "import sys, hf_cocodr.recipe.config; print(sorted(m for m in ('torch', 'transformers', "
        "'sentence_transformers', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_flag_of_the_recipe_command_is_kept_and_every_field_has_one():
    options = _parser()._option_string_actions
    assert [f for f in FLAGS if f not in options] == []
    assert [
        n
        for n in RETIRED_OPTIONS
        if f"--{n.replace('_', '-')}" in options or n in {f.name for f in fields(RecipeConfig)}
    ] == []
    dests = {a.dest for a in options.values()}
    for f in fields(RecipeConfig):
        assert f.metadata["help"], f.name
        assert (f.name in dests) is (f.name not in STAGE_OPTIONS), f.name


def test_flags_parse_to_the_config_values_and_unset_flags_leave_the_defaults():
    ns = _parser().parse_args(
        [
            "--coco-runs",
            "budget",
            "--wise-alpha",
            "none",
            "--skip-coco",
            "false",
            "--skip-finetune",
            "auto",
            "--no-start-eval",
            "--method",
            "berm",
            "--method",
            "rmsc",
            "--coco-lr",
            "1e-5",
            "--coco-mlm-weight",
            "0",
            "--distill-k",
            "6",
            "--coco-run-steps",
            "30",
            "--source-split",
            "dev",
        ]
    )
    given = config_from_flags(ns)
    assert given == {
        "source_split": "dev",
        "coco_mlm_weight": 0.0,
        "coco_learning_rate": 1e-5,
        "coco_runs": "budget",
        "coco_run_steps": 30,
        "distill_k": 6,
        "wise_alpha": None,
        "evaluate_start": False,
        "skip_coco": False,
        "skip_finetune": "auto",
        "methods": ["berm", "rmsc"],
    }
    cfg = RecipeConfig.from_dict(given)
    assert cfg.coco_runs is Auto.BUDGET and cfg.skip_finetune is Auto.AUTO and cfg.save_hybrid is True
    assert config_from_flags(_parser().parse_args([])) == {}
    run = RecipeArguments(
        **config_from_flags(
            _parser().parse_args(["--output-dir", "o", "--eval", "d:dev", "--resume_from_checkpoint", "false"]),
            RecipeArguments,
        )
    )
    assert (run.output_dir, run.eval, run.resume, run.max_minutes) == ("o", ["d:dev"], False, None)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--wise-alpha", "half"], "--wise-alpha must be a number in [0, 1] or 'none', got 'half'"),
        (["--coco-runs", "many"], "--coco-runs must be a whole number >= 1, 'budget' or 'auto', got 'many'"),
        (["--coco-share", "most"], "--coco-share must be a number or 'auto', got 'most'"),
    ],
)
def test_a_flag_of_the_wrong_kind_is_refused_by_name(argv, needle):
    with pytest.raises(ConfigError) as err:
        config_from_flags(_parser().parse_args(argv))
    assert str(err.value) == needle


def test_auto_reads_and_records_as_its_string():
    import json

    cfg = RecipeConfig(coco_runs="budget", coco_share="auto")
    assert cfg.coco_runs is Auto.BUDGET and cfg.coco_share is Auto.AUTO and cfg.schedule == "auto"
    assert json.loads(json.dumps({"runs": cfg.coco_runs}))["runs"] == "budget"


def test_the_fine_tune_loss_follows_the_schedule_unless_the_user_names_one():
    from hf_cocodr.finetuning.losses import PRESETS
    from hf_cocodr.recipe import RecipeConfig, choose_schedule
    from hf_cocodr.recipe.config import FINETUNE_PRESETS

    assert set(FINETUNE_PRESETS) == set(PRESETS)
    cfg, record = choose_schedule(RecipeConfig(), True)  # a trained MLM head: COCO, then the plain fine-tune
    assert cfg.finetune_preset == "uniform" and record["chosen"]["finetune_preset"] == "uniform"
    cfg, _ = choose_schedule(RecipeConfig(schedule="paper"), True)  # COCO-DR as published: iDRO
    assert cfg.finetune_preset == "paper"
    cfg, record = choose_schedule(RecipeConfig(finetune={"idro_preset": "groupdro"}), True)
    assert cfg.finetune_preset == "groupdro" and record["set_by_user"]["finetune_preset"] == "groupdro"
    cfg, record = choose_schedule(RecipeConfig(finetune_preset="reference"), True)
    assert cfg.finetune_preset == "reference" and "finetune_preset" in record["set_by_user"]


def test_the_encoding_batch_is_small_on_a_cpu_and_the_users_when_given(monkeypatch):
    """``eval_batch_size`` unset: 16 on a CPU (small batches encode faster there), 64 on a GPU; a given one is kept
    and a bad one refused by name."""
    import hf_cocodr.recipe.settings as settings

    monkeypatch.setattr(settings, "no_gpu", lambda: True)
    assert settings.encode_batch_size(RecipeConfig()) == settings.CPU_ENCODE_BATCH == 16
    assert settings.encode_batch_size(RecipeConfig(eval_batch_size=40)) == 40
    monkeypatch.setattr(settings, "no_gpu", lambda: False)
    assert settings.encode_batch_size(RecipeConfig()) == settings.GPU_ENCODE_BATCH == 64
    with pytest.raises(ConfigError, match="eval_batch_size must be a whole number >= 1"):
        RecipeConfig(eval_batch_size=0).validate()
