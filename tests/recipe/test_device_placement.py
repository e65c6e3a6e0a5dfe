"""Every probe and every stage step builds its inputs where the model is: the recipe, its probes included, runs with
the model on a simulated accelerator (:mod:`device_sim`), where a tensor built on the CPU fails the first operation
that meets the model's tensors, as it does on a GPU ("Expected all tensors to be on the same device")."""

from __future__ import annotations

import json

import pytest
import torch
from device_sim import NAME, ops_seen, simulated_gpu
from helpers import EVERY_STAGE_TWO_STEPS

CFG = EVERY_STAGE_TWO_STEPS


pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def _spy_forwards(monkeypatch) -> list[tuple[str, str]]:
    """(device of the encoder's weights, device of its input ids) of every training forward of a BERT encoder."""
    from transformers import BertModel

    seen: list[tuple[str, str]] = []
    original = BertModel.forward

    def forward(self, input_ids=None, *a, **kw):
        if torch.is_grad_enabled():
            seen.append((self.embeddings.word_embeddings.weight.device.type, input_ids.device.type))
        return original(self, input_ids, *a, **kw)

    monkeypatch.setattr(BertModel, "forward", forward)
    return seen


def _recipe(model_dir, beir, out, **kw):
    """The recipe with a budget (so the planner probes every stage) wide enough for a busy machine, and 2 steps a
    stage."""
    from hf_cocodr.recipe import run_recipe

    cfg = {**CFG, "target_queries": [f"{beir}:train"]}
    return run_recipe(
        str(model_dir), [str(beir)], str(beir), out, config=cfg, max_minutes=30.0, evals=[f"{beir}:dev"], **kw
    )


def test_the_simulated_device_refuses_what_a_gpu_refuses_and_computes_what_the_cpu_computes(monkeypatch):
    """The simulation is only worth its name if it fails where a GPU fails (an operation mixing the devices, a CPU
    index into a GPU tensor excepted) and computes the CPU's numbers otherwise."""
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    with simulated_gpu(monkeypatch) as device:
        xs, ws = x.to(device), w.to(device)
        assert xs.device.type == NAME and (xs @ ws).device.type == NAME
        assert torch.equal((xs @ ws).cpu(), x @ w)
        with pytest.raises(RuntimeError, match="same device"):
            x @ ws
        with pytest.raises(RuntimeError, match="same device"):
            torch.zeros(3, device=device).index_add(0, torch.tensor([0, 1]), torch.ones(2))
        assert torch.equal(xs[torch.tensor([2, 0])].cpu(), x[[2, 0]])  # CPU indices: allowed, as on CUDA
        assert (xs * torch.tensor(2.0)).device.type == NAME  # a 0-dim CPU tensor is a scalar, as on CUDA
        assert torch.eye(3, device=device).shape == (3, 3) and torch.eye(3, device=device).device.type == NAME
        assert xs.sum().item() == pytest.approx(float(x.sum()))
        # autocast on the device computes what CPU autocast computes (a bf16 matmul), and nothing outside the block
        with torch.autocast(NAME, dtype=torch.bfloat16):
            low = xs @ ws
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = x @ w
        assert low.dtype == torch.bfloat16 and low.device.type == NAME and torch.equal(low.cpu(), expected)
        assert (xs @ ws).dtype == torch.float32


@pytest.mark.parametrize("native", ["0", "1"], ids=["fp32", "native-bf16"])
def test_every_probe_and_stage_of_the_recipe_runs_with_the_model_on_the_device(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, native
):
    """The planner probes COCO, the fine-tuning and the distillation (their trainers' steps, the encoding and the
    teacher's timing), then every stage trains and the model is evaluated, all with the model on the (simulated)
    GPU: every input a step builds has to be placed where the model is. The issue's GPU run stopped in the planner
    here ("index is on cpu, different from other tensors on cuda:0"). Both precisions the machine may pick: fp32, and
    a machine with native bf16, whose corpus encodings run under bf16 autocast on the device."""
    monkeypatch.setenv("HF_COCODR_NATIVE_BF16", native)
    seen = _spy_forwards(monkeypatch)
    before = ops_seen[0]
    with simulated_gpu(monkeypatch):
        _recipe(tiny_bert_nomlm_dir, tiny_beir, tmp_path / "out")
    record = json.loads((tmp_path / "out" / "recipe.json").read_text())
    assert {"coco_step_s", "finetune_step_s", "distill_step_s", "distill_teacher_s"} <= set(
        record["plan"]["throughput"]
    )
    assert set(record["steps_trained"]) == {"coco", "finetune", "distill"}
    # every training forward (4 probed steps and the trained steps of each of the 3 stages) saw the model and its
    # inputs on the device
    assert len(seen) >= 3 * 4 + sum(record["steps_trained"].values())
    assert set(seen) == {(NAME, NAME)}
    assert ops_seen[0] - before > 10_000  # the arithmetic ran on the device's tensors
    assert record["precision"]["encoding"] == ("bf16" if native == "1" else "fp32")
    assert {r["precision"] for r in record["corpus_encodings"]} == {record["precision"]["encoding"]}


@pytest.mark.parametrize("native", ["0", "1"], ids=["fp32", "native-bf16"])
@pytest.mark.parametrize("stage", ["coco", "finetune", "distill"])
def test_a_step_that_builds_its_inputs_on_the_cpu_fails_the_check(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, stage, native
):
    """The check can fail: a stage whose step hands its model inputs on the CPU (the COCO batch, the features the
    fine-tuning's or the distillation's loss encodes) stops the recipe with the error a GPU gives, in the planner's
    probe of that stage."""
    import hf_cocodr.recipe.probe as probe
    from hf_cocodr.finetuning.losses import HybridDistillLoss, IDROLoss

    monkeypatch.setenv("HF_COCODR_NATIVE_BF16", native)
    from hf_cocodr.pretraining.trainer import CocoPretrainer

    def on_cpu(x):
        if isinstance(x, torch.Tensor):
            return x.cpu()
        if isinstance(x, dict):
            return {k: on_cpu(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(on_cpu(v) for v in x)
        return x

    if stage == "coco":
        build = CocoPretrainer._inputs
        monkeypatch.setattr(CocoPretrainer, "_inputs", lambda self, docs: on_cpu(build(self, docs)))
    else:  # the step's features, as the loss receives them, moved back to the CPU
        cls = IDROLoss if stage == "finetune" else HybridDistillLoss
        forward = cls.forward
        monkeypatch.setattr(cls, "forward", lambda self, features, *a, **kw: forward(self, on_cpu(features), *a, **kw))
    probed = []
    real = probe.time_trainer_steps
    monkeypatch.setattr(
        probe, "time_trainer_steps", lambda s, run, **kw: (probed.append(s.name), real(s, run, **kw))[1]
    )
    with simulated_gpu(monkeypatch), pytest.raises(RuntimeError, match="same device"):
        _recipe(tiny_bert_nomlm_dir, tiny_beir, tmp_path / "out")
    assert probed[-1] == stage  # the probe of the faulty stage stopped the run
