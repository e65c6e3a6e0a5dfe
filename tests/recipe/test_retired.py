"""A retired lever (:mod:`hf_cocodr.retired`) is never run as if it were not there: a YAML config, a flag, an old run
folder (its ``recipe.json``, its ``plan.json``, a retired stage's folder) or a checkpoint that names one at a value
that acted gets a one-line error naming it, before any model loads; at the value at which it did nothing it is
ignored, and the log says so."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from transformers import PreTrainedModel

from hf_cocodr.cli import main
from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe import RecipeConfig, run_recipe
from hf_cocodr.recipe.outputs import check_no_retired_levers
from hf_cocodr.retired import RETIRED_AT, RETIRED_OPTIONS

LEGACY_PLAN = Path(__file__).parent / "data" / "legacy_plan.json"


@pytest.fixture
def no_model_loads(monkeypatch):
    def boom(cls, *a, **k):
        raise AssertionError(f"a model was loaded ({cls.__name__}) before the retired option was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(boom))


def _recipe(model, corpus, out, *extra) -> list[str]:
    return ["recipe", "--model", str(model), "--target-corpus", str(corpus), "--source-data", str(corpus)] + [
        "--output_dir",
        str(out),
        *extra,
    ]


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("hf-cocodr recipe: error: "), err
    return err[0]


@pytest.mark.parametrize(
    "config, named",
    [
        ({"distill_swa": 0.5}, "recipe option distill_swa is retired"),
        ({"target_pairs": "title_body"}, "recipe option target_pairs is retired"),
        ({"distill": {"distill_margin_weight": 0.1}}, "recipe option distill.distill_margin_weight is retired"),
    ],
)
def test_a_yaml_config_naming_a_retired_option_gets_one_line(
    config, named, tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(_recipe(tiny_st_dir, tiny_beir, tmp_path / "out", "--config", str(path))) == 2
    line = _error_line(capsys)
    assert named in line and RETIRED_AT[:12] in line, line
    assert not (tmp_path / "out").exists()


def test_a_retired_flag_gets_one_line(tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads):
    assert main(_recipe(tiny_st_dir, tiny_beir, tmp_path / "out", "--distill-l2sp", "100")) == 2
    assert "--distill-l2sp is retired (the distillation's pull toward the starting weights" in _error_line(capsys)
    assert main(_recipe(tiny_st_dir, tiny_beir, tmp_path / "out", "--target-pairs=ict")) == 2
    assert "--target-pairs is retired (the target pseudo-pairs stage" in _error_line(capsys)


def test_a_retired_option_at_its_off_value_is_ignored_and_said(caplog):
    """A config written for an earlier version with the lever off (its default, or a target-stage setting that only
    acted with the stage on) loads to the config without it, and the log names what it ignored."""
    with caplog.at_level(logging.WARNING, logger="hf_cocodr.recipe"):
        cfg = RecipeConfig.from_dict(
            {"distill_swa": 0.0, "target_pairs": "none", "target_share": 0.3, "distill": {"distill_l2sp": 0}}
        )
    assert cfg == RecipeConfig.from_dict({"distill": {}})
    said = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert len(said) == 1 and all(
        n in said[0] for n in ("distill_swa", "target_pairs", "target_share", "distill_l2sp")
    )
    assert "ignored" in said[0]
    # every retired option either acts at some value (refused there) or only ever acted with another (inert)
    for name, retired in RETIRED_OPTIONS.items():
        if not retired.inert:
            with pytest.raises(ConfigError, match=f"^recipe option {name} is retired"):
                RecipeConfig.from_dict({name: "on"})


def _old_run(out: Path, config: dict | None = None, plan: dict | None = None) -> Path:
    out.mkdir(parents=True)
    if config is not None:
        (out / "recipe.json").write_text(json.dumps({"config": config}))
    if plan is not None:
        (out / "plan.json").write_text(json.dumps(plan))
    return out


def test_an_old_run_folder_naming_a_retired_lever_is_refused_before_any_work(
    tiny_st_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    """Resumed, an old run that trained with a retired lever would go on without it: its recipe.json (an option that
    acted), its plan.json (a retired stage given steps) or a retired stage's folder refuses the run by name."""
    out = _old_run(tmp_path / "swa", config={"distill_swa": 0.5, "distill_k": 8, "seed": 42})
    assert main(_recipe(tiny_st_dir, tiny_beir, out)) == 2
    line = _error_line(capsys)
    assert f"{out / 'recipe.json'}: option distill_swa is retired" in line, line
    assert {p.name for p in out.iterdir()} == {"recipe.json"}  # (nothing claimed, nothing written)
    with pytest.raises(ConfigError, match=r"plan.json: target_steps 140 \(target_pairs\) is retired"):
        run_recipe(
            str(tiny_st_dir),
            [str(tiny_beir)],
            str(tiny_beir),
            _old_run(tmp_path / "p", plan=json.loads(LEGACY_PLAN.read_text())),
        )
    staged = _old_run(tmp_path / "staged")
    (staged / "target" / "checkpoint-2").mkdir(parents=True)
    with pytest.raises(ConfigError, match="target: the stage of target_pairs is retired"):
        check_no_retired_levers(staged)
    # the lever off (a default run of then), or a fresh start: nothing to refuse
    check_no_retired_levers(
        _old_run(tmp_path / "off", config={"distill_swa": 0.0, "target_pairs": "none"}, plan={"target_steps": 0})
    )


def test_a_checkpoint_with_a_retired_callbacks_state_is_refused_on_resume(tiny_st_dir, tmp_path):
    """A distillation interrupted under --distill-swa saved its averaging's state beside the checkpoint: resuming it
    without the averaging would be another training, so the trainer refuses by name."""
    from datasets import Dataset

    from hf_cocodr.finetuning import DistillationTrainer, DistillationTrainingArguments
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.rundir.state import save_state

    rows = Dataset.from_dict(
        {"query": ["a b", "c d"], "doc_1": ["a", "c"], "doc_2": ["b", "d"], "label": [[1, 0]] * 2}
    )
    args = DistillationTrainingArguments(
        output_dir=str(tmp_path / "o"), max_steps=1, per_device_train_batch_size=2, use_cpu=True, report_to="none"
    )
    trainer = DistillationTrainer(model=load_encoder(str(tiny_st_dir)), args=args, train_dataset=rows)
    checkpoint = tmp_path / "o" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    tensors, meta = trainer.state_for_checkpoint()
    save_state(str(checkpoint), tensors, {**meta, "swa": {"count": 3}})
    with pytest.raises(ConfigError, match=r"checkpoint-1: the state of distill_swa is retired"):
        trainer.load_checkpoint_state(str(checkpoint))
    save_state(str(checkpoint), tensors, meta)
    trainer.load_checkpoint_state(str(checkpoint))  # today's state loads
