"""A GPU gets larger per-device batches than a CPU core (by its memory, up to a cap) and bf16 where it computes bf16
natively; a CPU keeps the batches and precision it had. The choice is tested with torch.cuda's answers replaced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_cocodr.recipe import RecipeConfig
from hf_cocodr.recipe import settings as S
from hf_cocodr.recipe.stages.coco import CocoStage
from hf_cocodr.recipe.stages.distill import DistillStage
from hf_cocodr.recipe.stages.finetune import FinetuneStage


def _gpu(monkeypatch, gib: float | None, bf16: bool = True) -> None:
    """This machine as one with a CUDA device of ``gib`` GiB (None: no CUDA device) and native bf16 or not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gib is not None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=int(gib * 2**30)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Simulated GPU")
    for module in ("hf_cocodr.utils", "hf_cocodr.recipe.settings", "hf_cocodr.recipe.stages.distill"):
        monkeypatch.setattr(f"{module}.native_bf16", lambda: bf16)


def _run(tmp_path: Path, **options) -> SimpleNamespace:
    from hf_cocodr.recipe.schedules import choose_schedule

    cfg, _ = choose_schedule(RecipeConfig(**options), False)  # every "auto" resolved
    return SimpleNamespace(cfg=cfg, similarity="cosine", pooling="mean", dir=lambda name: tmp_path / name)


@pytest.mark.parametrize(
    ("gib", "cpu_batch", "cap", "expected"),
    [
        (None, 32, 128, 32),  # a CPU: as before
        (80.0, 32, 128, 128),  # 40 GiB or more: x4
        (80.0, 32, 100, 100),  # ... at most the cap
        (24.0, 32, 128, 64),  # 16 GiB or more: x2
        (8.0, 32, 128, 32),  # a small card: the CPU's batch
        (80.0, 16, 8, 16),  # never below the CPU's batch
    ],
)
def test_a_gpu_gets_a_larger_batch_by_its_memory_up_to_a_cap(monkeypatch, gib, cpu_batch, cap, expected):
    _gpu(monkeypatch, gib)
    assert S.device_batch_size(cpu_batch, cap) == expected


def test_bf16_by_default_on_a_gpu_with_native_bf16_only(monkeypatch):
    _gpu(monkeypatch, 80.0, bf16=True)
    assert S.gpu_bf16() and S.gpu_bf16_default({}) == {"bf16": True}
    assert S.gpu_bf16_default({"bf16": False}) == {} and S.gpu_bf16_default({"fp16": True}) == {}
    _gpu(monkeypatch, 80.0, bf16=False)  # a card before Ampere: bf16 only emulated
    assert not S.gpu_bf16()
    _gpu(monkeypatch, None, bf16=True)  # a CPU with AMX: the distillation's own default, not the other stages'
    assert not S.gpu_bf16()


def test_the_stages_train_larger_batches_in_bf16_on_a_large_gpu_and_as_before_on_a_cpu(monkeypatch, tmp_path):
    """COCO and the fine-tuning: 32 on a CPU core, 128 on an 80 GiB card with bf16; the options
    decide over both. The distillation: 16 on a CPU; on the card up to 64 but at least 8 steps a pass over its
    queries."""
    distill = DistillStage()
    distill.queries_digest, distill.num_queries = "x", 10_000

    def args(run):
        return {s.name: s.arguments(run) for s in (CocoStage(), FinetuneStage(), distill)}

    _gpu(monkeypatch, 80.0)
    on_gpu = args(_run(tmp_path))
    assert {k: v["per_device_train_batch_size"] for k, v in on_gpu.items()} == {
        "coco": 128,
        "finetune": 128,
        "distill": 64,
    }
    assert all(v.get("bf16") is True for v in on_gpu.values())
    assert not any(v["use_cpu"] for v in on_gpu.values())
    distill.num_queries = 200  # 200 queries: 25 a step leave 8 steps a pass
    assert distill.arguments(_run(tmp_path))["per_device_train_batch_size"] == 25
    distill.num_queries = 50  # never below the CPU's 16
    assert distill.arguments(_run(tmp_path))["per_device_train_batch_size"] == 16
    mine = _run(tmp_path, finetune={"per_device_train_batch_size": 8, "fp16": True}, coco={"bf16": False})
    assert FinetuneStage().arguments(mine)["per_device_train_batch_size"] == 8
    assert "bf16" not in FinetuneStage().arguments(mine) and CocoStage().arguments(mine)["bf16"] is False

    _gpu(monkeypatch, None, bf16=False)
    on_cpu = args(_run(tmp_path))
    assert {k: v["per_device_train_batch_size"] for k, v in on_cpu.items()} == {
        "coco": 32,
        "finetune": 32,
        "distill": 16,
    }
    assert not any(v.get("bf16") for v in on_cpu.values())


def test_recipe_json_records_the_device_and_each_stage_batch(monkeypatch):
    _gpu(monkeypatch, 80.0)
    assert S.device_record() == {"type": "cuda", "name": "Simulated GPU", "memory_gib": 80.0}
    _gpu(monkeypatch, None)
    assert S.device_record() == {"type": "cpu"}
