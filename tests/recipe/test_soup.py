"""The recipe's COCO soup: the mean of its runs, the single run as its first, resumed after a kill."""

from __future__ import annotations

import json
import logging

import pytest
import torch


def test_a_recipe_soup_is_the_mean_of_its_runs_and_its_first_run_is_the_single_run(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, caplog
):
    from safetensors.torch import load_file

    from hf_cocodr.modeling.wise import average_state_dicts
    from hf_cocodr.recipe import run_recipe

    cfg = dict(
        pseudo_queries=0,  # the head-less schedule's COCO soup
        skip_finetune=True,
        wise_alpha=None,
        coco_steps=2,
        corpus_pool=None,
        coco={"per_device_train_batch_size": 8, "save_steps": 2},
        guard="record",  # (the soup is exported whatever the guard reads: the test is of the soup)
    )

    def weights(folder):
        return load_file(str(folder / "model.safetensors"))

    soup_out, single_out = tmp_path / "soup", tmp_path / "single"
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), soup_out, config={**cfg, "coco_runs": 2})
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), single_out, config={**cfg, "coco_runs": 1})
    runs = [weights(soup_out / "coco-runs" / f"run-{i}") for i in range(2)]
    assert any(not torch.equal(runs[0][k], runs[1][k]) for k in runs[0])  # the seeds differ
    single = weights(single_out / "coco")
    assert all(torch.equal(runs[0][k], single[k]) for k in single)  # run 0 is the single run, bit for bit
    mean, souped = average_state_dicts(runs), weights(soup_out / "coco")
    assert all(torch.equal(mean[k], souped[k]) for k in mean)
    assert all(torch.equal(souped[k], v) for k, v in weights(soup_out / "model").items())  # the final model
    record = json.loads((soup_out / "recipe.json").read_text())
    assert record["plan"]["coco_runs"] == 2 and record["steps_trained"] == {"coco": 2}
    assert "model soup" in (soup_out / "model" / "README.md").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_cocodr"):  # a re-run trains nothing
        run_recipe(
            str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), soup_out, config={**cfg, "coco_runs": 2}
        )
    assert any("stage coco: already finished" in r.getMessage() for r in caplog.records)


def test_a_killed_soup_resumes_to_the_uninterrupted_soup(tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch):
    """A crash in the second COCO run: the re-run skips the first run, resumes the second from its checkpoint, and
    the soup is bit for bit the soup of an uninterrupted run."""
    from safetensors.torch import load_file

    from hf_cocodr.pretraining import CocoPretrainer
    from hf_cocodr.recipe import run_recipe

    cfg = dict(
        pseudo_queries=0,  # the head-less schedule's COCO soup
        skip_finetune=True,
        wise_alpha=None,
        coco_steps=3,
        corpus_pool=None,
        coco_runs=2,
        coco={"per_device_train_batch_size": 8, "save_steps": 1},
    )
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "whole", config=cfg)
    original = CocoPretrainer.training_step

    def crash_in_run_2(self, *a, **k):
        if self.args.seed == 43 and self.state.global_step == 2:
            raise RuntimeError("simulated crash")
        return original(self, *a, **k)

    monkeypatch.setattr(CocoPretrainer, "training_step", crash_in_run_2)
    out = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    assert (out / "coco-runs" / "run-0" / "hf_cocodr_stage.json").is_file()
    assert not (out / "coco-runs" / "run-1" / "hf_cocodr_stage.json").exists()
    monkeypatch.setattr(CocoPretrainer, "training_step", original)
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), out, config=cfg)
    whole, resumed = (load_file(str(d / "model" / "model.safetensors")) for d in (tmp_path / "whole", out))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
