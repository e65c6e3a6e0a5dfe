"""Every overview of the recipe names every stage of ``STAGES``: the package docstring, ``run_recipe``'s and
``RecipeConfig``'s docstrings, the ``--config`` help and the README."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import hf_cocodr.recipe as recipe
from hf_cocodr.recipe.config import RecipeArguments, RecipeConfig, add_config_arguments
from hf_cocodr.recipe.runner import run_recipe
from hf_cocodr.recipe.stages import STAGES

README = Path(__file__).resolve().parents[2] / "README.md"


def _config_help() -> str:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, RecipeArguments)
    return next(a.help for a in parser._actions if a.dest == "config")


OVERVIEWS = {
    "hf_cocodr.recipe": lambda: recipe.__doc__,
    "run_recipe": lambda: run_recipe.__doc__,
    "RecipeConfig": lambda: RecipeConfig.__doc__,
    "--config help": _config_help,
    "README": lambda: README.read_text(),
}


@pytest.mark.parametrize("where", sorted(OVERVIEWS))
def test_every_overview_names_every_stage(where):
    text = " ".join(OVERVIEWS[where]().split()).lower()
    spellings = {s.name: (s.title.lower(), f"`{s.name}", f"{s.name},", f"{s.name})") for s in STAGES}
    missing = [name for name, ways in spellings.items() if not any(way in text for way in ways)]
    assert not missing, f"{where} does not name the stage(s) {missing}"


def test_the_config_help_names_every_stage_mapping():
    assert all(f"`{s.settings.training_options}:`" in _config_help() for s in STAGES if s.trains)
