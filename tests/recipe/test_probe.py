"""The step probe: it times in the precision the stages train in, the median of timed calls after a warm-up."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("bf16", [False, True])
def test_the_step_probe_runs_in_the_precision_the_stages_train_in(
    tiny_bert_nomlm_dir, tiny_beir, tmp_path, monkeypatch, bf16
):
    """A stage set to bf16 trains under bf16 autocast; the planner's probe must time its steps the same way, or a
    bf16 recipe is planned with fp32 step times and leaves a third of its budget unused. The probe trains the
    stage's own trainer, so every forward of the run, probed or trained, sees the stage's precision."""
    import hf_cocodr.recipe.probe as probe
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.condenser import CondenserForPretraining
    from hf_cocodr.recipe import run_recipe

    seen = {"coco": [], "finetune": []}

    def spy(cls, name):
        original = cls.forward

        def forward(self, *a, **kw):
            if torch.is_grad_enabled():  # a training step's forward (the K-Means and evaluation encode without grad)
                bf16_on = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
                seen[name].append(bf16_on)
            return original(self, *a, **kw)

        monkeypatch.setattr(cls, "forward", forward)

    spy(CondenserForPretraining, "coco")
    spy(type(load_encoder(str(tiny_bert_nomlm_dir))[0]), "finetune")  # the encoder's transformer module
    probed = []
    real = probe.time_trainer_steps

    def timed(stage, run, **kw):
        probed.append(stage.name)
        return real(stage, run, **kw)

    monkeypatch.setattr(probe, "time_trainer_steps", timed)
    common = {"per_device_train_batch_size": 4, "bf16": bf16}
    cfg = {
        "pseudo_queries": 0,
        "skip_coco": False,
        "skip_finetune": False,
        "wise_alpha": None,
        "coco_runs": 1,
        "coco_steps": 2,
        "finetune_steps": 2,
        "finetune_preset": "paper",
        "save_hybrid": False,
        "coco": common,
        "finetune": {**common, "num_clusters": 3, "num_negatives": 1},
    }
    run_recipe(
        str(tiny_bert_nomlm_dir), [str(tiny_beir)], str(tiny_beir), tmp_path / "out", config=cfg, max_minutes=30
    )
    assert probed == ["coco", "finetune"]
    # 4 probed steps and 2 trained of each stage, all in the stage's precision
    assert len(seen["coco"]) >= 6 and set(seen["coco"]) == {bf16}
    assert len(seen["finetune"]) >= 6 and set(seen["finetune"]) == {bf16}


def test_step_timing_is_the_median_of_the_timed_calls_after_a_warm_up(monkeypatch):
    """Hand-made clock: the warm-up call is not timed and one slow call does not move the plan."""
    import hf_cocodr.recipe.probe as recipe

    ticks = iter([0.0, 2.0, 10.0, 19.0, 20.0, 23.0])  # timed calls take 2, 9 and 3 seconds
    calls = []
    monkeypatch.setattr(recipe.time, "perf_counter", lambda: next(ticks))
    assert recipe.time_call(lambda: calls.append(1), repeats=3) == 3.0
    assert len(calls) == 4  # the warm-up, then three timed calls
