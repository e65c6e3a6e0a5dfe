"""The stage list of a recipe is checked before any work (issue 52, item 5): a stage's name is a plain identifier (it
names its folder ``OUT/<name>`` and its options), no other stage's, no built-in's and no entry the run writes itself;
its settings add options of their own, never another stage's or the recipe's; every entry is a ``Stage``. Each fault
is one ``ConfigError`` naming the stage, and nothing is written."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import Copy

from hf_cocodr.errors import ConfigError
from hf_cocodr.recipe import STAGES, run_recipe
from hf_cocodr.recipe.settings import check_whole, option

ONLY_TOY = dict(skip_coco=True, skip_finetune=True, wise_alpha=None, save_hybrid=False)


def named(name, settings=None, base=Copy):
    return type(f"Stage_{abs(hash(name))}", (base,), {"name": name, "settings": settings})


@pytest.fixture
def recipe(tiny_st_dir, tiny_beir, tmp_path):
    out = tmp_path / "nest" / "OUT"

    def run(stages):
        return run_recipe(str(tiny_st_dir), [str(tiny_beir)], str(tiny_beir), out, config=ONLY_TOY, stages=stages)

    yield run
    assert not (tmp_path / "nest").exists()  # refused before any work: nothing written, not even OUT


@pytest.mark.parametrize("name", ["..", "sub/dir", "", "v2.final", "tidy up", "3rd"])
def test_a_stage_name_that_is_not_a_plain_identifier_is_refused(recipe, name):
    with pytest.raises(ConfigError, match=f"stage {name!r}.*identifier"):
        recipe((*STAGES, named(name)))


def test_two_stages_of_one_name_are_refused(recipe):
    with pytest.raises(ConfigError, match="stage 'polish'.*twice"):
        recipe((*STAGES, Copy(), named("polish")))


@pytest.mark.parametrize("name", ["hybrid", "queries", "Model"])
def test_a_stage_named_like_an_entry_the_run_writes_is_refused(recipe, name):
    with pytest.raises(ConfigError, match=f"stage {name!r}.*the recipe writes"):
        recipe((*STAGES, named(name)))


@pytest.mark.parametrize("name", ["distill", "wise"])
def test_a_stage_named_like_a_built_in_one_is_refused(recipe, name):
    with pytest.raises(ConfigError, match=f"stage {name!r}.*built-in"):
        recipe((named(name),))


@dataclass
class ShadowSettings:
    polish_steps: int | None = option(None, "steps of the polish stage")
    distill_k: int = option(7, "candidates the polish stage reranks")  # the distillation's option

    def check(self) -> None:
        check_whole(self, "polish_steps", 1)


@dataclass
class SeedSettings:
    buff_seed_rows: int = option(3, "rows")
    seed: int = option(5, "the buff stage's seed")  # the recipe's own option

    def check(self) -> None:
        pass


@dataclass
class RateA:
    rate: float = option(0.1, "a rate")

    def check(self) -> None:
        pass


@dataclass
class RateB:
    rate: float = option(0.2, "another rate")

    def check(self) -> None:
        pass


def test_a_settings_field_that_is_a_built_in_stages_option_is_refused(recipe):
    with pytest.raises(ConfigError, match="stage 'polish'.*distill_k.*distill"):
        recipe((*STAGES, named("polish", ShadowSettings)))


def test_a_settings_field_that_is_a_shared_recipe_option_is_refused(recipe):
    with pytest.raises(ConfigError, match="stage 'buff'.*seed"):
        recipe((*STAGES, named("buff", SeedSettings)))


def test_a_settings_field_that_is_another_added_stages_option_is_refused(recipe):
    with pytest.raises(ConfigError, match="stage 'second'.*rate.*'first'"):
        recipe((*STAGES, named("first", RateA), named("second", RateB)))


def test_a_name_whose_options_are_another_stages_is_refused(recipe):
    # a stage named coco_run would take COCO's coco_run_steps (the steps of one COCO run) as its own steps
    with pytest.raises(ConfigError, match="stage 'coco_run'.*coco_run_steps"):
        recipe((*STAGES, named("coco_run")))


class NotAStage:
    name = "lookalike"

    def train(self, run):  # pragma: no cover - never reached
        raise AssertionError


@pytest.mark.parametrize("entry", ["coco", NotAStage, NotAStage(), None], ids=["str", "class", "instance", "none"])
def test_an_entry_that_is_not_a_stage_is_refused(recipe, entry):
    with pytest.raises(ConfigError, match=rf"stages\[{len(STAGES)}\] = .*is not a Stage"):
        recipe((*STAGES, entry))
