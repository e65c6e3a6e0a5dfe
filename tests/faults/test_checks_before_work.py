"""Checks before work: every token-length setting against the model's position limit (one rule for every command:
refused with one line naming the setting, the value, the model and its limit, before any model is loaded), and a
recipe budget that cannot buy one step of each stage (refused before any training).

The tiny BERT of the tests has 128 positions.
"""

from __future__ import annotations

import json

import pytest

from hf_cocodr.cli import main
from hf_cocodr.errors import ConfigError

LIMIT = 128  # tests/tiny.py: max_position_embeddings of the tiny BERT


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any weights load (transformers' from_pretrained, which every model load goes through) fails the test."""
    from transformers import PreTrainedModel

    def boom(cls, *a, **k):
        raise AssertionError(f"a model was loaded ({cls.__name__}) before the input was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(boom))


def _one_line_error(capsys, command: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hf-cocodr {command}: error: "), err[0]
    return err[0]


def _commands(model, data, out) -> dict[str, tuple[list[str], str, str]]:
    """command -> (argv with a length one past the limit, the setting's name as written, the value)."""
    over = str(LIMIT + 1)
    training = ["--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "4", "--use_cpu"]
    return {
        "evaluate-doc": (
            ["evaluate", str(model), str(data), "--split", "dev", "--doc-max-length", "1024"],
            "--doc-max-length",
            "1024",
        ),
        "evaluate-query": (
            ["evaluate", str(model), str(data), "--split", "dev", "--query-max-length", over],
            "--query-max-length",
            over,
        ),
        "export": (["export", str(model), str(out), "--max-seq-length", over], "--max-seq-length", over),
        "finetune": (
            [
                "finetune",
                "--model",
                str(model),
                "--train-data",
                str(data),
                "--num-clusters",
                "2",
                *training,
                "--max_length",
                over,
            ],
            "max_length",
            over,
        ),
        "pretrain": (
            ["pretrain", "--model", str(model), "--corpus", str(data), *training, "--max_span_length", over],
            "max_span_length",
            over,
        ),
        "recipe": (
            [
                "recipe",
                "--model",
                str(model),
                "--target-corpus",
                str(data),
                "--source-data",
                str(data),
                "--output_dir",
                str(out),
                "--train-max-length",
                "100000",
            ],
            "train_max_length",
            "100000",
        ),
    }


@pytest.mark.parametrize("case", ["evaluate-doc", "evaluate-query", "export", "finetune", "pretrain", "recipe"])
def test_a_length_past_the_position_limit_is_refused_before_any_model_loads(
    case, tiny_bert_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    argv, name, value = _commands(tiny_bert_dir, tiny_beir, tmp_path / "out")[case]
    assert main(argv) == 2
    line = _one_line_error(capsys, argv[0])
    assert f"{name} {value} " in line and str(tiny_bert_dir) in line and f"give at most {LIMIT}" in line, line
    assert not (tmp_path / "out").exists()  # nothing written either


def test_the_same_rule_in_the_python_api(tiny_bert_dir, tiny_beir, tmp_path, no_model_loads):
    from hf_cocodr import RecipeConfig, evaluate_retrieval, export_sentence_transformer, run_recipe

    with pytest.raises(ConfigError, match=f"doc_max_length 129 .* give at most {LIMIT}"):
        evaluate_retrieval(str(tiny_bert_dir), tiny_beir, "dev", doc_max_length=129)
    with pytest.raises(ConfigError, match=f"document_length 500 .* give at most {LIMIT}"):
        export_sentence_transformer(str(tiny_bert_dir), tmp_path / "e", document_length=500)
    with pytest.raises(ConfigError, match=f"finetune.max_length 129 .* give at most {LIMIT}"):
        run_recipe(
            str(tiny_bert_dir),
            [str(tiny_beir)],
            str(tiny_beir),
            tmp_path / "r",
            config=RecipeConfig(finetune={"max_length": 129}),
        )
    with pytest.raises(ConfigError, match="must be a whole number of tokens >= 1, got 0"):
        export_sentence_transformer(str(tiny_bert_dir), tmp_path / "e", max_seq_length=0)
    assert not (tmp_path / "e").exists() and not (tmp_path / "r").exists()


def test_position_limits_of_architectures_and_layouts(tiny_bert_dir, tiny_st_dir):
    from hf_cocodr.modeling.limits import limit_from_config, position_limit

    # RoBERTa-style position tables reserve pad_token_id + 1 rows: 514 positions encode 512 tokens
    assert limit_from_config({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert limit_from_config({"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0}) == 512
    assert limit_from_config({"model_type": "t5"}) is None  # no position table: nothing to check against
    assert position_limit(str(tiny_bert_dir)) == LIMIT  # a raw checkpoint
    assert position_limit(str(tiny_st_dir)) == LIMIT  # a sentence-transformers folder: its Transformer's config


def test_a_length_at_the_limit_works(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr import load_encoder
    from hf_cocodr.recipe import RecipeConfig
    from hf_cocodr.recipe.checks import check_recipe_lengths

    at = str(LIMIT)
    assert (
        main(
            [
                "evaluate",
                str(tiny_bert_dir),
                str(tiny_beir),
                "--split",
                "dev",
                "--doc-max-length",
                at,
                "--query-max-length",
                at,
            ]
        )
        == 0
    )
    assert "ndcg@10" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["export", str(tiny_bert_dir), str(tmp_path / "e"), "--max-seq-length", at]) == 0
    assert load_encoder(str(tmp_path / "e")).max_seq_length == LIMIT
    training = ["--max_steps", "1", "--per_device_train_batch_size", "4", "--use_cpu", "--save_strategy", "no"]
    assert (
        main(
            [
                "finetune",
                "--model",
                str(tiny_bert_dir),
                "--train-data",
                str(tiny_beir),
                "--num-clusters",
                "2",
                "--output_dir",
                str(tmp_path / "f"),
                *training,
                "--max_length",
                at,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "pretrain",
                "--model",
                str(tiny_bert_dir),
                "--corpus",
                str(tiny_beir),
                "--output_dir",
                str(tmp_path / "p"),
                *training,
                "--max_span_length",
                at,
            ]
        )
        == 0
    )
    # the recipe's default train_max_length is the tiny model's limit: tests/recipe/test_recipe.py runs it end to end
    assert RecipeConfig().train_max_length == LIMIT
    check_recipe_lengths(
        str(tiny_bert_dir), RecipeConfig(finetune={"max_length": LIMIT}, coco={"max_span_length": LIMIT})
    )


# ----------------------------------------------------------------------------------------------------- budgets
def test_a_budget_the_fixed_costs_use_up_is_refused_before_any_work(
    tiny_bert_dir, tiny_beir, tmp_path, capsys, no_model_loads
):
    out = tmp_path / "out"
    argv = [
        "recipe",
        "--model",
        str(tiny_bert_dir),
        "--target-corpus",
        str(tiny_beir),
        "--source-data",
        str(tiny_beir),
        "--output_dir",
        str(out),
        "--max-minutes",
        "0.01",
    ]
    assert main(argv) == 2
    line = _one_line_error(capsys, "recipe")
    assert "max_minutes 0.01 (0.6 s) leaves no time to train" in line and "give more than" in line, line
    assert not out.exists()


def test_the_budget_must_exceed_the_fixed_loads_and_exports():
    """Hand-computed: 20 s per model load + export; the final model's always, COCO's and WiSE-FT's when they run."""
    from hf_cocodr.recipe.checks import check_budget_floor

    with pytest.raises(
        ConfigError,
        match=r"max_minutes 1 \(60.0 s\) leaves no time to train: 3 model load\(s\) and "
        r"export\(s\) \(the final model's, COCO's, WiSE-FT's, 20 s each\) alone take "
        r"60 s; give more than 1 minutes",
    ):
        check_budget_floor(1.0, 20.0, ["COCO", "WiSE-FT"])
    check_budget_floor(1.01, 20.0, ["COCO", "WiSE-FT"])
    check_budget_floor(0.34, 20.0, [])  # 20.4 s > 20 s
    with pytest.raises(ConfigError, match="give more than 0.34 minutes"):
        check_budget_floor(0.33, 20.0, [])


def test_the_budget_must_buy_one_step_of_each_stage(monkeypatch):
    """Hand-computed: 40 s of fixed costs, then one step each of 30 s (COCO), 20 s (fine-tuning), 15 s
    (distillation)."""
    import hf_cocodr.recipe.planner as planner
    from hf_cocodr.recipe import Plan, RecipeConfig
    from hf_cocodr.recipe.checks import check_budget_buys_steps

    steps = {"coco": 30.0, "finetune": 20.0, "distill": 15.0}
    cfg = RecipeConfig(skip_coco=False, skip_finetune=False, skip_distill=False, target_queries=["q.jsonl"])

    def one_step(runs: int = 1) -> dict:
        return planner.one_step_costs(Plan(stage_fields={"coco_runs": runs}), steps, cfg)

    check_budget_buys_steps({"budget_seconds": 105.0, "fixed_seconds": 40.0}, one_step())  # exactly one step each
    with pytest.raises(
        ConfigError,
        match=r"cannot buy one step of the distill stage: its probed cost is 15.00 s per "
        r"step.*take 40.0 s and one step of each stage before it \(50.0 s\); give "
        r"at least 1.75 minutes",
    ):
        check_budget_buys_steps({"budget_seconds": 104.0, "fixed_seconds": 40.0}, one_step())
    with pytest.raises(
        ConfigError, match="cannot buy one step of the coco stage: its probed cost is 30.00 s per step x 2 runs"
    ):  # a soup of 2 runs: 2 steps and one more load (10 s)
        monkeypatch.setattr(planner, "STAGE_LOAD_SECONDS", 10.0)
        check_budget_buys_steps({"budget_seconds": 105.0, "fixed_seconds": 40.0}, one_step(runs=2))


def test_a_refusal_names_the_largest_fixed_costs():
    """Hand-computed: a cold CPU run whose teacher encoding is most of the fixed costs says so by name."""
    from hf_cocodr.recipe.checks import check_budget_buys_steps

    plan = {
        "budget_seconds": 900.0,
        "fixed_seconds": 1225.0,
        "fixed_costs": {
            "spent_before_the_plan": 26.0,
            "model_loads_exports": 20.0,
            "distill_teacher_encode": 1104.0,
            "distill_teacher_bm25": 8.0,
            "distill_teacher_rank": 66.0,
            "other": 1.0,
        },
    }
    with pytest.raises(
        ConfigError,
        match=r"cannot buy one step of the distill stage: its probed cost is 1.21 s per step, and the fixed costs "
        r"take 1225.0 s \(the largest: distill_teacher_encode 1104.0 s, distill_teacher_rank 66.0 s, "
        r"spent_before_the_plan 26.0 s\); give at least 20.44 minutes",
    ):
        check_budget_buys_steps(plan, {"distill": (1.21, "1.21 s per step")})


@pytest.mark.parametrize("stage", ["coco", "finetune"])
def test_a_budget_below_one_probed_step_is_refused_before_any_training(
    stage, tiny_bert_dir, tiny_beir, tmp_path, monkeypatch
):
    import hf_cocodr.finetuning as ft
    import hf_cocodr.pretraining as pt
    import hf_cocodr.recipe.planner as planner
    from hf_cocodr import recipe

    def no_training(*a, **k):
        raise AssertionError("a stage trained although the budget cannot buy one step of each")

    monkeypatch.setattr(pt, "CocoPretrainer", no_training)
    monkeypatch.setattr(ft, "IDROTrainer", no_training)
    tp = {
        "coco_step_s": 1.0,
        "finetune_step_s": 1.0,
        "encode_doc_s": 0.001,
        "encode_query_s": 0.001,
        f"{stage}_step_s": 400.0,
    }  # one step of `stage` costs more than the 5 minutes
    monkeypatch.setattr(planner, "measure", lambda *a, **k: dict(tp))
    cfg = {
        "wise_alpha": None,
        "coco_runs": 1,
        "refreshes": 0,
        "corpus_pool": None,
        "coco": {"per_device_train_batch_size": 8},
        "finetune": {"per_device_train_batch_size": 8, "num_clusters": 3},
    }
    out = tmp_path / "run"
    with pytest.raises(
        ConfigError,
        match=rf"max_minutes 5 \(300.0 s\) cannot buy one step of the {stage} stage: its "
        r"probed cost is 400.00 s per step",
    ):
        recipe.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg, max_minutes=5.0)
    assert not any((out / s).exists() for s in ("coco", "finetune"))


def test_convert_caps_its_defaults_and_refuses_a_given_length_past_the_limit(
    tiny_bert_dir, tmp_path, capsys, no_model_loads
):
    assert main(["convert", str(tiny_bert_dir), str(tmp_path / "c"), "--document-length", "256"]) == 2
    line = _one_line_error(capsys, "convert")
    assert "--document-length 256 " in line and f"give at most {LIMIT}" in line, line
    assert not (tmp_path / "c").exists()
