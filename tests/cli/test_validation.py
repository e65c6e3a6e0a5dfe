"""Validate before work: silent coercions refused, tracebacks turned into one line, all before a model is loaded.

Every CLI case here runs with the model loaders replaced by a stub that fails the test, so a check that happens
only after loading (or not at all) fails fast instead of training.
"""

from __future__ import annotations

import logging
import math

import pytest
from helpers import beir, run_cli

from hf_cocodr.cli import main
from hf_cocodr.data.beir import BEIRFormatError, column_numpy, load_beir, load_qrels
from hf_cocodr.errors import ConfigError

HEADER = "query-id\tcorpus-id\tscore\n"
UNCACHED = "acme-not-cached/tiny-model"


def _model_loaders():
    """(owner, attribute) of every way hf_cocodr loads model weights."""
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel

    import hf_cocodr.modeling.loading as loading
    from hf_cocodr.modeling.condenser import CondenserForPretraining

    return [
        (loading, "load_encoder"),
        (PreTrainedModel, "from_pretrained"),
        (CondenserForPretraining, "from_pretrained"),
        (SentenceTransformer, "__init__"),
    ]


@pytest.fixture()
def loads(monkeypatch, tiny_bert_dir, tiny_beir):
    """Records every model load attempt and stops it (the fixtures that build models are created before)."""
    calls: list[str] = []

    for owner, name in _model_loaders():

        def stub(*args, _what=f"{getattr(owner, '__name__', owner)}.{name}", **kwargs):
            calls.append(_what)
            raise AssertionError(f"a model was loaded ({_what}) before the input was validated")

        is_classmethod = isinstance(owner.__dict__.get(name), classmethod)
        monkeypatch.setattr(owner, name, classmethod(stub) if is_classmethod else stub)
    return calls


def _finetune(model, data, out, *extra):
    return [
        "finetune",
        "--model",
        model,
        "--train-data",
        data,
        "--output_dir",
        out,
        "--max_steps",
        "1",
        "--use_cpu",
        "--per_device_train_batch_size",
        "4",
        *extra,
    ]


def _pretrain(model, data, out, *extra):
    return [
        "pretrain",
        "--model",
        model,
        "--corpus",
        data,
        "--output_dir",
        out,
        "--max_steps",
        "1",
        "--use_cpu",
        *extra,
    ]


# ---------------------------------------------------------------------------------------- 1. qrels grades
@pytest.mark.parametrize("grade", ["0.5", "inf", "nan", "-inf", "1e400"])
def test_qrels_grade_must_be_a_finite_whole_number(grade, tmp_path, capsys):
    folder = beir(tmp_path / "data", qrels=HEADER + f"q0\td0\t1\nq1\td1\t{grade}\n")
    msg = run_cli(["bm25", folder, "--split", "train"], capsys)
    assert f"train.tsv, line 3: score '{grade}' is not a whole number" in msg


# ---------------------------------------------------------------------------------------- 2. duplicate rows
def test_conflicting_duplicate_qrels_rows_name_both_lines(tmp_path):
    folder = beir(tmp_path / "data", qrels=HEADER + "q0\td0\t1\nq1\td1\t1\nq0\td0\t2\n")
    with pytest.raises(
        BEIRFormatError,
        match=r"train.tsv, line 4: query-id 'q0' and corpus-id 'd0' are judged 1 on "
        r"line 2 and 2 here",
    ):
        load_qrels(folder, "train")


def test_identical_duplicate_qrels_rows_give_one_warning(tmp_path, capsys):
    rows = HEADER + "".join(f"q{i}\td{i}\t1\n" for i in range(12)) + "q3\td3\t1\nq5\td5\t1\n"
    folder = beir(tmp_path / "data", qrels=rows)
    assert main(["bm25", str(folder), "--split", "train"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "duplicate" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert "2 duplicate (query-id, corpus-id) row(s) with the same grade ignored (first on line 14)" in warnings[0]
    assert load_qrels(folder, "train")["q3"] == {"d3": 1}


# ---------------------------------------------------------------------------------------- 3. recipe steps
@pytest.mark.parametrize(
    "bad, switch",
    [
        ({"finetune_steps": 0}, "skip_finetune: true"),
        ({"coco_steps": 0}, "skip_coco: true"),
        ({"distill_steps": 0}, "skip_distill: true"),
        ({"coco_steps": -5}, "skip_coco: true"),
    ],
)
def test_recipe_steps_must_be_at_least_one(bad, switch):
    from hf_cocodr.recipe import RecipeConfig

    name, value = next(iter(bad.items()))
    with pytest.raises(
        ConfigError,
        match=rf"recipe option {name} must be a whole number >= 1 \(or unset\), got "
        rf"{value}; to leave the stage out set {switch}",
    ):
        RecipeConfig.from_dict(bad)


# ---------------------------------------------------------------------------------------- 4. max_steps
@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
@pytest.mark.parametrize("steps", [0, -2])
def test_max_steps_zero_or_below_minus_one_is_refused(kind, steps, tmp_path):
    from hf_cocodr import CocoPretrainingArguments, IDROTrainingArguments

    cls = IDROTrainingArguments if kind == "finetune" else CocoPretrainingArguments
    with pytest.raises(
        ConfigError,
        match=rf"max_steps must be >= 1, or -1 \(the default\) to train num_train_epochs; "
        rf"got {steps}",
    ):
        cls(output_dir=str(tmp_path), max_steps=steps)
    assert cls(output_dir=str(tmp_path)).max_steps == -1  # the default still means "train num_train_epochs"


# ---------------------------------------------------------------------------------------- 5. float settings
@pytest.mark.parametrize(
    "kind, field, value, bound",
    [
        ("finetune", "idro_tau", math.inf, "> 0"),
        ("finetune", "idro_tau", math.nan, "> 0"),
        ("finetune", "idro_beta", math.nan, ">= 0"),
        ("finetune", "idro_scale", 0.0, "> 0"),
        ("finetune", "idro_scale", math.inf, "> 0"),
        ("finetune", "modir_lambda", math.inf, ">= 0"),
        ("finetune", "modir_half_life", math.inf, "> 0"),
        ("finetune", "modir_classifier_lr", math.nan, "> 0"),
        ("finetune", "berm_alpha", math.nan, ">= 0"),
        ("finetune", "learning_rate", math.nan, ">= 0"),
        ("pretrain", "contrastive_temperature", math.inf, "> 0"),
        ("pretrain", "mlm_weight", math.nan, ">= 0"),
        ("pretrain", "contrastive_weight", math.inf, ">= 0"),
        ("pretrain", "learning_rate", math.inf, ">= 0"),
        ("pretrain", "weight_decay", math.nan, ">= 0"),
    ],
)
def test_float_settings_must_be_finite_and_in_range(kind, field, value, bound, tmp_path):
    from hf_cocodr import CocoPretrainingArguments, IDROTrainingArguments

    cls = IDROTrainingArguments if kind == "finetune" else CocoPretrainingArguments
    with pytest.raises(ConfigError, match=rf"{field} must be {bound} and finite, got {value!r}"):
        cls(output_dir=str(tmp_path), **{field: value})


# ---------------------------------------------------------------------------------------- 6. bm25_top_k
@pytest.mark.parametrize(
    "name, value", [("bm25_top_k", 0), ("bm25_top_k", -3), ("max_queries", 0), ("corpus_pool", 0)]
)
def test_training_data_counts_must_be_at_least_one(name, value, tiny_beir):
    from hf_cocodr import RetrievalTrainingData

    with pytest.raises(ValueError, match=rf"{name} must be a whole number >= 1"):
        RetrievalTrainingData.from_beir(tiny_beir, "train", **{name: value})


# ---------------------------------------------------------------------------------------- 7. one line, not a traceback
@pytest.mark.parametrize("command", ["evaluate", "finetune", "pretrain"])
def test_uncached_hub_id_offline_is_one_line(command, loads, tiny_beir, tmp_path, capsys):
    args = {
        "evaluate": ["evaluate", UNCACHED, tiny_beir, "--split", "train"],
        "finetune": _finetune(UNCACHED, tiny_beir, tmp_path / "o"),
        "pretrain": _pretrain(UNCACHED, tiny_beir, tmp_path / "o"),
    }[command]
    msg = run_cli(args, capsys)
    assert (
        f"model '{UNCACHED}' is not a local folder and is not in the Hugging Face cache (offline: HF_HUB_OFFLINE=1)"
    ) in msg


def test_load_encoder_uncached_hub_id_offline():
    from hf_cocodr import load_encoder

    with pytest.raises(FileNotFoundError, match="is not in the Hugging Face cache"):
        load_encoder(UNCACHED)


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "not found: no such directory, and it is not a Hub id"),
        ("file", "is a file; expected a model directory"),
    ],
)
def test_pretrain_model_missing_or_a_file(case, needle, loads, tiny_beir, tmp_path, capsys):
    path = tmp_path / "model"
    if case == "file":
        path.write_text("not a model")
    assert needle in run_cli(_pretrain(path, tiny_beir, tmp_path / "o"), capsys)


@pytest.mark.parametrize(
    "yaml_text, needle",
    [
        ("coco: 5\n", "recipe option 'coco' must be a mapping of training arguments, got 5"),
        ("finetune_steps: abc\n", "recipe option finetune_steps must be a whole number >= 1 (or unset), got 'abc'"),
        ("target_corpus: 3\n", "--config option target_corpus must be a path or a list of them, got 3"),
        ("eval: 3\n", "--config option eval must be a path or a list of them, got 3"),
        ("methods: modir\n", "recipe option methods must be a list of names, got 'modir'"),
        ("seed: x\n", "recipe option seed must be a whole number >= 0, got 'x'"),
        ("finetune: {learning_rate: abc}\n", "recipe option finetune.learning_rate must be of type float, got 'abc'"),
        ("finetune: {idro_tau: .inf}\n", "recipe option finetune: idro_tau must be > 0 and finite, got inf"),
        ("coco: {no_such_field: 1}\n", "recipe option coco: unknown field(s) ['no_such_field']"),
        (
            "distill: {max_steps: 3}\n",
            "recipe option distill.max_steps: the recipe sets each stage's steps; use distill_steps",
        ),
    ],
)
def test_recipe_config_of_the_wrong_type_is_one_line(
    yaml_text, needle, loads, tiny_bert_dir, tiny_beir, tmp_path, capsys
):
    cfg = tmp_path / "recipe.yaml"
    cfg.write_text(yaml_text)
    msg = run_cli(
        [
            "recipe",
            "--model",
            tiny_bert_dir,
            "--source-data",
            tiny_beir,
            "--target-corpus",
            tiny_beir,
            "--output_dir",
            tmp_path / "o",
            "--config",
            cfg,
        ],
        capsys,
    )
    assert needle in msg


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_truncated_beir_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_COCODR_CACHE", str(tmp_path / "cache"))
    folder = beir(tmp_path / "data")
    ids = column_numpy(load_beir(folder, "train").corpus, "_id").tolist()
    (cache,) = (tmp_path / "cache").rglob("corpus-*.arrow")
    raw = cache.read_bytes()
    cache.write_bytes(raw[: len(raw) // 2])
    records = _Records()
    logger = logging.getLogger("hf_cocodr.data.beir")
    logger.addHandler(records)
    try:
        again = load_beir(folder, "train")
    finally:
        logger.removeHandler(records)
    assert column_numpy(again.corpus, "_id").tolist() == ids
    assert len(records.messages) == 1 and "truncated or corrupt" in records.messages[0], records.messages
    assert str(cache) in records.messages[0]
    assert cache.stat().st_size == len(raw)  # rebuilt in place


@pytest.mark.parametrize("kind", ["finetune", "pretrain"])
def test_trainers_refuse_model_none(kind, tiny_beir, tmp_path):
    if kind == "finetune":
        from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData

        args = IDROTrainingArguments(output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True)
        data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="none")
        with pytest.raises(ConfigError, match="IDROTrainer needs model=: a SentenceTransformer"):
            IDROTrainer(model=None, args=args, train_dataset=data)
    else:
        from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

        args = CocoPretrainingArguments(output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True)
        with pytest.raises(ConfigError, match="CocoPretrainer needs model=: a CondenserForPretraining"):
            CocoPretrainer(model=None, args=args, corpora=[str(tiny_beir)])


@pytest.mark.parametrize("command", ["finetune", "pretrain"])
@pytest.mark.parametrize(
    "problem, needle",
    [
        ("offline", "push_to_hub to acme/tiny needs the Hub, but offline mode is on (HF_HUB_OFFLINE=1)"),
        ("no token", "push_to_hub to acme/tiny needs a Hugging Face token"),
    ],
)
def test_push_to_hub_fails_before_training(
    command, problem, needle, loads, monkeypatch, tiny_bert_dir, tiny_beir, tmp_path, capsys
):
    if problem == "no token":
        from huggingface_hub import constants

        import hf_cocodr.hub

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_cocodr.hub, "_current_token", lambda: None)
    make = _finetune if command == "finetune" else _pretrain
    args = make(tiny_bert_dir, tiny_beir, tmp_path / "o", "--push_to_hub", "--hub_model_id", "acme/tiny")
    assert needle in run_cli(args, capsys)


# ---------------------------------------------------------------------------------------- 8. late validation
@pytest.mark.parametrize(
    "case", ["output is a folder", "output under a file", "eval folder missing", "eval split missing"]
)
def test_outputs_and_eval_specs_are_checked_before_the_model_loads(
    case, loads, tiny_bert_dir, tiny_beir, tmp_path, capsys
):
    (tmp_path / "afile").write_text("x")
    evaluate = ["evaluate", tiny_bert_dir, tiny_beir, "--split", "train", "--output"]
    args, needle = {
        "output is a folder": ([*evaluate, tmp_path], f"--output {tmp_path} is a folder; expected a file path"),
        "output under a file": (
            [*evaluate, tmp_path / "afile" / "r.json"],
            f"{tmp_path / 'afile'} is a file, not a folder",
        ),
        "eval folder missing": (
            _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o", "--eval", "nowhere:dev"),
            "--eval 'nowhere:dev': nowhere is not a directory",
        ),
        "eval split missing": (
            _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o", "--eval", f"{tiny_beir}:nosplit"),
            "split 'nosplit' not found",
        ),
    }[case]
    assert needle in run_cli(args, capsys)


# ---------------------------------------------------------------------------------------- before any model load
def test_validation_failures_happen_before_any_model_load(loads, tiny_bert_dir, tiny_beir, tmp_path, capsys):
    """A representative set of the failures above, with every model loader spied on: none is ever reached."""
    bad_grades = beir(tmp_path / "grades", qrels=HEADER + "".join(f"q{i}\td{i}\t0.5\n" for i in range(12)))
    recipe_cfg = tmp_path / "recipe.yaml"
    recipe_cfg.write_text("finetune_steps: 0\n")
    (tmp_path / "afile").write_text("x")
    cases = [
        _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o1", "--tau", "inf"),
        _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o2", "--max_steps", "0"),
        _finetune(tiny_bert_dir, bad_grades, tmp_path / "o3"),
        _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o4", "--eval", "nowhere:dev"),
        _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o5", "--push_to_hub", "--hub_model_id", "acme/tiny"),
        _finetune(tiny_bert_dir, tiny_beir, tmp_path / "o6", "--max-queries", "0"),
        _finetune(UNCACHED, tiny_beir, tmp_path / "o7"),
        _pretrain(tiny_bert_dir, tiny_beir, tmp_path / "o8", "--contrastive_temperature", "inf"),
        _pretrain(tmp_path / "afile", tiny_beir, tmp_path / "o9"),
        _pretrain(tiny_bert_dir, tmp_path / "no-corpus", tmp_path / "o10"),
        [
            "recipe",
            "--model",
            tiny_bert_dir,
            "--source-data",
            tiny_beir,
            "--output_dir",
            tmp_path / "o11",
            "--config",
            recipe_cfg,
        ],
        ["evaluate", tiny_bert_dir, tiny_beir, "--split", "train", "--output", tmp_path],
    ]
    for args in cases:
        msg = run_cli(args, capsys)
        assert loads == [], (args, msg, loads)
