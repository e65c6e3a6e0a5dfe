"""recipe.json records each training stage's texts/s and tokens/s, counted by a trainer callback from what the steps
fed the model (and, on CUDA, how busy the GPU was)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import EVERY_STAGE_TWO_STEPS

CFG = {**EVERY_STAGE_TWO_STEPS, "evaluate_start": False}


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def test_recipe_json_records_the_texts_and_tokens_each_stage_trained_on(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch
):
    """Two steps of 4 rows per stage: COCO encodes 2 spans of each document (16 texts), the fine-tuning a query, its
    positive and one negative (24), the distillation a query and its 3 candidates (32). The tokens are those of the
    attention masks the encoder received in training mode, counted here by an independent spy on its forward (the
    meter counts the tokens that are not padding where the word embeddings receive them)."""
    from transformers import BertModel

    from hf_cocodr.recipe import run_recipe
    from hf_cocodr.recipe.runner import _run_stage

    seen = {"texts": 0, "tokens": 0, "padded": 0}
    per_stage = {}
    original = BertModel.forward

    def forward(self, input_ids=None, attention_mask=None, *a, **kw):
        if self.training and not torch.is_inference_mode_enabled():
            seen["texts"] += input_ids.shape[0]
            seen["tokens"] += int(attention_mask.sum())
            seen["padded"] += input_ids.numel()
        return original(self, input_ids, attention_mask, *a, **kw)

    def run_stage(run, stage):
        before = dict(seen)
        _run_stage(run, stage)
        per_stage[stage.name] = {k: seen[k] - before[k] for k in seen}

    monkeypatch.setattr(BertModel, "forward", forward)
    monkeypatch.setattr("hf_cocodr.recipe.runner._run_stage", run_stage)
    cfg = {**CFG, "target_queries": [f"{tiny_beir}:train"]}
    run_recipe(str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "out", config=cfg)
    full = json.loads((tmp_path / "out" / "recipe.json").read_text())
    assert full["device"] == {"type": "cpu"} and full["batches"] == {"coco": 4, "finetune": 4, "distill": 4}
    record = full["throughput"]
    assert set(record) == {"coco", "finetune", "distill"}
    expected_texts = {"coco": 2 * 4 * 2, "finetune": 2 * 4 * 3, "distill": 2 * 4 * (1 + 3)}
    for stage, texts in expected_texts.items():
        got = record[stage]
        assert got["steps"] == 2
        assert got["texts"] == texts == per_stage[stage]["texts"]
        assert got["tokens"] == per_stage[stage]["tokens"] > 0
        assert got["padded_tokens"] == per_stage[stage]["padded"] >= got["tokens"]
        assert got["texts_per_s"] == pytest.approx(got["texts"] / got["seconds"], abs=0.006)  # (rounded)
        assert got["tokens_per_s"] == pytest.approx(got["tokens"] / got["seconds"], abs=0.006)
        assert "gpu_utilization_mean" not in got  # no GPU here


def test_the_gpu_sampler_averages_its_readings_and_reads_nothing_without_a_gpu(monkeypatch):
    """The sampler's summary is the mean and maximum of what it read; where no GPU can be read (this machine, or
    ``torch.cuda`` without NVML and without nvidia-smi) there is no reader and no key is recorded."""
    import threading

    from hf_cocodr.finetuning.callbacks import GpuUtilization
    from hf_cocodr.finetuning.callbacks.throughput import gpu_utilization_reader

    readings, done = iter([10.0, None, 30.0, 80.0]), threading.Event()

    def read():
        value = next(readings, None)
        if value == 80.0:
            done.set()
        return value

    gpu = GpuUtilization(read, every=0.001).start()
    assert done.wait(10)
    gpu.stop()
    assert gpu.summary() == {
        "gpu_utilization_mean": 40.0,
        "gpu_utilization_max": 80.0,
        "gpu_utilization_samples": 3,
    }
    assert GpuUtilization(None).start().stop().summary() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_utilization_reader() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "utilization", lambda index: 57)
    assert gpu_utilization_reader("cuda:0")() == 57.0
