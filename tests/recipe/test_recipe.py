from __future__ import annotations

import json
import logging

import pytest
import torch
from helpers import CFG
from tiny import crash_at

from hf_cocodr.errors import ConfigError
from hf_cocodr.modeling.precision import resolve_corpus_precision
from hf_cocodr.recipe import RecipeConfig, run_recipe
from hf_cocodr.recipe.config import AUTO
from hf_cocodr.recipe.runner import _precision_choice
from hf_cocodr.retrieval.session import EncodingSession


def test_recipe_runs_skips_finished_stages_and_reports(tiny_bert_dir, tiny_beir, tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    spec = f"{tiny_beir}:dev"
    res = run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[spec], config=CFG)
    assert set(res) == {spec} and {"ndcg@10", "recall@100"} <= set(res[spec])
    assert json.loads((out / "eval.json").read_text()) == res
    for stage in ("coco", "finetune", "wise"):
        assert (out / stage / "hf_cocodr_stage.json").is_file()
    model_files = {p.name for p in (out / "model").iterdir()}
    assert {"modules.json", "README.md", "model.safetensors", "eval.json"} <= model_files
    assert not any(n.startswith("checkpoint-") for n in model_files)
    card = (out / "model" / "README.md").read_text()
    assert "COCO continuous contrastive pretraining" in card and "iDRO fine-tuning" in card
    history = json.loads((out / "finetune" / "idro_weights.json").read_text())
    assert len(history["weights"]) == 4
    assert any(c["reason"].startswith("negatives refresh") for c in history["clusterings"])

    # A re-run skips both stages (no trainer is even built) and gives the same evaluation.
    import hf_cocodr.finetuning as ft
    import hf_cocodr.pretraining as pt

    def boom(*a, **k):
        raise AssertionError("a finished stage was run again")

    monkeypatch.setattr(pt, "CocoPretrainer", boom)
    monkeypatch.setattr(ft, "IDROTrainer", boom)
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        again = run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, evals=[spec], config=CFG)
    assert again == res
    assert sum("already finished" in r.getMessage() for r in caplog.records) == 3


def test_recipe_resumes_an_interrupted_stage(tiny_bert_dir, tiny_beir, tmp_path, monkeypatch, caplog):
    from hf_cocodr.finetuning import IDROTrainer

    out = tmp_path / "run"
    undo = crash_at(monkeypatch, IDROTrainer, 3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=CFG)
    assert (out / "coco" / "hf_cocodr_stage.json").is_file()
    assert not (out / "finetune" / "hf_cocodr_stage.json").exists()
    assert (out / "finetune" / "checkpoint-2").is_dir()
    undo()
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):
        run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=CFG)
    messages = [r.getMessage() for r in caplog.records]
    assert any("stage coco: already finished" in m for m in messages)
    assert any("resuming from" in m and "checkpoint-2" in m for m in messages)
    state = json.loads((out / "finetune" / "trainer_state.json").read_text())
    assert state["global_step"] == 4


def test_recipe_cli_last_line_is_json_keyed_by_eval(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    import yaml

    from hf_cocodr.cli import main

    cfg = tmp_path / "recipe.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    spec = f"{tiny_beir}:dev"
    rc = main(
        [
            "recipe",
            "--model",
            str(tiny_bert_dir),
            "--target-corpus",
            str(tiny_beir),
            "--source-data",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "o"),
            "--eval",
            spec,
            "--config",
            str(cfg),
        ]
    )
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(last) == [spec] and "ndcg@10" in last[spec] and "recall@100" in last[spec]


def test_recipe_bad_config(tmp_path):
    with pytest.raises(ValueError, match="unknown recipe option"):
        RecipeConfig.from_dict({"coco_stepz": 3})


def test_recipe_with_a_seed_method(tiny_bert_dir, tiny_beir, tmp_path, capsys):
    """COCO -> iDRO + BERM through the recipe CLI: the BERM losses are logged in the fine-tuning stage."""
    import yaml

    from hf_cocodr.cli import main

    cfg = tmp_path / "recipe.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    out = tmp_path / "o"
    rc = main(
        [
            "recipe",
            "--model",
            str(tiny_bert_dir),
            "--target-corpus",
            str(tiny_beir),
            "--source-data",
            str(tiny_beir),
            "--output_dir",
            str(out),
            "--method",
            "berm",
            "--config",
            str(cfg),
        ]
    )
    assert rc == 0
    logs = json.loads((out / "finetune" / "trainer_state.json").read_text())["log_history"]
    assert any("berm_balance_loss" in h for h in logs), logs
    assert json.loads((out / "recipe.json").read_text())["config"]["methods"] == ["berm"]


def test_recipe_rejects_unknown_or_unfed_methods(tiny_bert_dir, tiny_beir, tmp_path):
    from hf_cocodr.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown"):
        run_recipe(
            str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "a", config=dict(CFG, methods=["mo-dir"])
        )
    with pytest.raises(ConfigError, match="target corpora"):
        run_recipe(
            str(tiny_bert_dir), [], str(tiny_beir), tmp_path / "b", config=dict(CFG, skip_coco=True, methods=["modir"])
        )


def test_recipe_cli_and_start_scores(tiny_bert_nomlm_dir, tiny_beir, tmp_path, capsys, monkeypatch):
    """The recipe from the command line (flags over a --config file): each split reports the starting model's scores
    beside the adapted one's, dense, BM25 and hybrid, and the card says so."""
    import yaml

    from hf_cocodr import evaluate_retrieval, load_encoder
    from hf_cocodr.cli import main

    cfg = tmp_path / "recipe.yaml"
    cfg.write_text(yaml.safe_dump({**CFG, "coco_steps": 1, "finetune_steps": 2}))
    out = tmp_path / "o"
    spec = f"{tiny_beir}:dev"
    rc = main(
        [
            "recipe",
            "--model",
            str(tiny_bert_nomlm_dir),
            "--target-corpus",
            str(tiny_beir),
            "--source-data",
            str(tiny_beir),
            "--output_dir",
            str(out),
            "--eval",
            spec,
            "--coco-mlm-weight",
            "0",
            "--wise-alpha",
            "none",
            "--config",
            str(cfg),
        ]
    )
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((out / "recipe.json").read_text())
    # the run encodes its corpora in the precision it recorded (bf16 on a machine with native bf16): so do these
    session = EncodingSession(record["precision"]["encoding"])
    start = evaluate_retrieval(load_encoder(str(tiny_bert_nomlm_dir)), str(tiny_beir), "dev", session=session)
    # the starting model's own score; the tiny random BERT ties many of its scores, and vectors that differ in their
    # last bits (the run encodes its corpus once, in its own batches, or takes them from the session's encoding cache)
    # can reorder tied documents: 0.0009 apart was seen once in a full-suite run, a different model is far more
    assert last[spec]["start"]["ndcg@10"] == pytest.approx(start["ndcg@10"], abs=2e-3)
    assert not (out / "wise").exists()
    assert record["schedule"]["kind"] == "no_mlm_head_soup"  # (CFG: pseudo_queries 0)
    assert record["config"]["coco_mlm_weight"] == 0.0 and record["schedule"]["set_by_user"]["coco_mlm_weight"] == 0
    encoding, why = resolve_corpus_precision("auto")
    # logged and recorded: training in fp32 unless asked, corpus encodings bf16 only where the machine has it natively
    assert record["precision"] == {**_precision_choice(RecipeConfig()), "encoding": encoding, "encoding_why": why}
    assert record["precision"]["training"] == "fp32"
    card = (out / "model" / "README.md").read_text()
    assert "start → adapted" in card

    # dense, BM25 and hybrid for the start and the adapted model, as evaluate --hybrid gives them; the card says it;
    # the hybrid retriever of the target corpus is saved next to the model and searches as built
    # with the fusion the run fitted (on this tiny model's tied scores, vectors that differ in their last bits can fit
    # another weight; the fit itself is tested in tests/retrieval), evaluate --hybrid gives the run's numbers
    def fused_as(result):
        return {k: v for k, v in result["hybrid"]["fusion"].items() if k != "fit"}

    hybrid_start = evaluate_retrieval(
        load_encoder(str(tiny_bert_nomlm_dir)),
        str(tiny_beir),
        "dev",
        hybrid=True,
        fusion=fused_as(last[spec]["start"]),
    )
    assert last[spec]["start"]["hybrid"]["ndcg@10"] == pytest.approx(hybrid_start["ndcg@10"], abs=2e-3)
    assert last[spec]["start"]["bm25"]["ndcg@10"] == hybrid_start["bm25"]["ndcg@10"] == last[spec]["bm25"]["ndcg@10"]
    adapted = evaluate_retrieval(
        load_encoder(str(out / "model")), str(tiny_beir), "dev", hybrid=True, fusion=fused_as(last[spec])
    )
    assert last[spec]["hybrid"]["ndcg@10"] == pytest.approx(adapted["ndcg@10"], abs=2e-3)
    assert last[spec]["ndcg@10"] == pytest.approx(adapted["dense"]["ndcg@10"], abs=2e-3)
    assert "hybrid nDCG@10 start → adapted" in card
    from hf_cocodr import HybridRetriever

    saved = HybridRetriever.load(out / "hybrid" / tiny_beir.name, corpus=tiny_beir)
    assert (
        saved.meta["model_fingerprint"]
        == HybridRetriever.build(str(out / "model"), tiny_beir).meta["model_fingerprint"]
    )
    assert len(saved.search(["a query"], k=3)[0][0]) == 3
    assert saved.meta["encode_precision"] == encoding


def test_a_corpus_of_plain_texts_draws_no_pseudo_query(tiny_bert_nomlm_dir, tiny_beir, tmp_path):
    """With the head-less schedule's own choice (no pseudo_queries given): plain texts (no document ids) give no
    pseudo-query to rank, so the schedule draws none (the COCO soup), and says why."""
    docs = tmp_path / "docs.jsonl"
    lines = [json.loads(line) for line in open(tiny_beir / "corpus.jsonl")]
    docs.write_text("\n".join(json.dumps({"text": d["text"]}) for d in lines))
    cfg = {**{k: v for k, v in CFG.items() if k != "pseudo_queries"}, "wise_alpha": None}
    run_recipe(str(tiny_bert_nomlm_dir), [str(docs)], str(tiny_beir), tmp_path / "plain", config=cfg)
    record = json.loads((tmp_path / "plain" / "recipe.json").read_text())
    assert record["schedule"]["chosen"]["pseudo_queries"] == 0 and "without document ids" in record["schedule"]["why"]
    assert "distill" not in record["steps_trained"] and "coco" in record["steps_trained"]


def test_a_stage_may_ask_for_bf16_on_a_machine_without_gpu():
    """The stage options are checked as the stage will build them (``use_cpu`` where there is no GPU): transformers
    refuses ``bf16`` without a GPU unless ``use_cpu`` is set, which refused every bf16 recipe on a CPU."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    cfg = RecipeConfig.from_dict({"coco": {"bf16": True}, "finetune": {"bf16": True}})
    assert cfg.coco["bf16"] is True and cfg.finetune["bf16"] is True


def test_precision_choice_is_fp32_unless_a_stage_asks_for_bf16(monkeypatch):
    import hf_cocodr.recipe.runner as recipe

    for native in (False, True):
        monkeypatch.setattr(recipe, "native_bf16", lambda native=native: native)
        plain = _precision_choice(RecipeConfig())
        assert plain["training"] == "fp32" and plain["native_bf16"] is native
        assert ("no native bf16" in plain["why"]) is (not native)
        asked = _precision_choice(RecipeConfig(coco={"bf16": True}, finetune={"bf16": True}))
        assert asked["training"] == "bf16 (coco, finetune)"
        assert ("expect it slower" in asked["why"]) is (not native)


def test_the_precision_record_names_only_stages_that_train(monkeypatch):
    """A stage switched off trains in no precision, whatever its options say; the distillation's own bf16 default
    (native machines) is named as such, and a user's fp16 leaves it off."""
    import hf_cocodr.recipe.runner as recipe
    import hf_cocodr.recipe.stages.distill as distill_module
    from hf_cocodr.recipe.stages import STAGES
    from hf_cocodr.recipe.stages.distill import bf16_by_default

    for module in (recipe, distill_module):
        monkeypatch.setattr(module, "native_bf16", lambda: True)
    off = RecipeConfig(skip_finetune=True, finetune={"bf16": True})
    assert _precision_choice(off, {"finetune": {"bf16": True}}, STAGES)["training"] == "fp32"
    queries = RecipeConfig(skip_distill=False, target_queries=["q.jsonl"])
    choice = _precision_choice(queries, {"distill": {"bf16": True}}, STAGES)
    assert choice["training"] == "bf16 (distill)" and "distill: the stage's default" in choice["why"]
    no_queries = RecipeConfig(skip_distill=False, target_queries=[])  # the stage is off
    assert _precision_choice(no_queries, {"distill": {"bf16": True}}, STAGES)["training"] == "fp32"
    assert bf16_by_default(queries)
    assert not bf16_by_default(RecipeConfig(distill={"fp16": True}))
    assert not bf16_by_default(RecipeConfig(distill={"bf16": False}))
    monkeypatch.setattr(distill_module, "native_bf16", lambda: False)
    assert not bf16_by_default(queries)


def test_native_bf16_does_not_count_a_gpu_that_only_emulates_it(monkeypatch):
    """A CUDA card before Ampere (T4, V100) can hold bf16 tensors but computes them by emulation: not native."""
    from hf_cocodr.utils import native_bf16

    monkeypatch.delenv("HF_COCODR_NATIVE_BF16")  # the detection itself (the suite pins it)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert native_bf16() is False
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert native_bf16() is True


def test_the_cap_on_passes_reads_a_number_or_none_from_the_command_line():
    import argparse

    from hf_cocodr.recipe.config import add_config_arguments, config_from_flags

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert config_from_flags(parser.parse_args(["--distill-max-passes", "none"]))["distill_max_passes"] is None
    assert config_from_flags(parser.parse_args(["--distill-max-passes", "1.5"]))["distill_max_passes"] == 1.5
    assert config_from_flags(parser.parse_args(["--distill-max-passes", "auto"]))["distill_max_passes"] == AUTO
    with pytest.raises(ConfigError, match=r"--distill-max-passes must be a number > 0, 'none' or 'auto', got 'x'"):
        config_from_flags(parser.parse_args(["--distill-max-passes", "x"]))
    assert "distill_max_passes" not in config_from_flags(parser.parse_args([]))  # the default stands
