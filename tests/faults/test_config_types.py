"""YAML ``--config`` values of the wrong type end in one line naming the key and the type, before any model loads."""

from __future__ import annotations

import enum
from typing import Literal

import pytest

from hf_cocodr.cli import main
from hf_cocodr.config_types import expected_type, matches_type


@pytest.mark.parametrize(
    "command, yaml_text, key, words",
    [
        ("finetune", "logging_steps: [3]\n", "logging_steps", "a number"),
        ("finetune", "seed: true\n", "seed", "a whole number"),
        ("pretrain", "seed: true\n", "seed", "a whole number"),
        ("pretrain", "do_train: [yes]\n", "do_train", "true or false"),
    ],
)
def test_a_config_value_of_the_wrong_type_names_key_and_type(
    command, yaml_text, key, words, tiny_st_dir, tiny_beir, tmp_path, capsys, monkeypatch
):
    import hf_cocodr.modeling.loading as loading

    def no_model_load(*a, **k):  # the check must come before any model is loaded
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(loading, "load_encoder", no_model_load, raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    data_flag = ["--train-data", str(tiny_beir)] if command == "finetune" else ["--corpus", str(tiny_beir)]
    rc = main(
        [command, "--model", str(tiny_st_dir), *data_flag, "--config", str(cfg), "--output_dir", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    line = err.strip().splitlines()[-1]
    assert f"--config {cfg}: option {key} must be {words}" in line and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_yaml_strings_that_argparse_converts_are_accepted():
    # YAML 1.1 reads `learning_rate: 1e-4` as a string; argparse converts string defaults with the field's type
    assert matches_type("1e-4", float) and matches_type("3", int) and matches_type("true", bool)
    assert not matches_type("abc", float) and not matches_type(True, int) and not matches_type([3], float)


def test_matches_and_words_for_compound_annotations():
    class Color(enum.Enum):
        RED = "red"

    assert matches_type(None, int | None) and matches_type(4, int | None) and not matches_type("x", int | None)
    assert matches_type(["a", "b"], list[str]) and not matches_type(["a", 1], list[str])
    assert matches_type("red", Color) and not matches_type("blue", Color)
    assert matches_type("b", Literal["a", "b"]) and not matches_type("c", Literal["a", "b"])
    assert expected_type(int | None) == "a whole number or null"
    assert expected_type(list[str]) == "a list of strings"
    assert expected_type(Color) == "one of 'red'"
