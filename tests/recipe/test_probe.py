"""The step probe: it times in the precision the stages train in, the median of timed calls after a warm-up."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("bf16", [False, True])
def test_the_step_probe_runs_in_the_precision_the_stages_train_in(tiny_bert_nomlm_dir, tiny_beir, monkeypatch, bf16):
    """A stage set to bf16 trains under bf16 autocast; the planner's probe must time its steps the same way, or a
    bf16 recipe is planned with fp32 step times and leaves a third of its budget unused."""
    from transformers import AutoTokenizer

    from hf_cocodr import IDROTrainingArguments, RetrievalTrainingData
    from hf_cocodr.data.spans import SpanCorpus
    from hf_cocodr.finetuning.losses.idro import IDROLoss
    from hf_cocodr.modeling.condenser import CondenserForPretraining
    from hf_cocodr.pretraining import CocoPretrainingArguments
    from hf_cocodr.recipe import measure_throughput

    seen = {"coco": [], "finetune": []}

    def spy(cls, name):
        original = cls.forward

        def forward(self, *a, **kw):
            seen[name].append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
            return original(self, *a, **kw)

        monkeypatch.setattr(cls, "forward", forward)

    spy(CondenserForPretraining, "coco")
    spy(IDROLoss, "finetune")
    common = dict(report_to="none", use_cpu=True, max_steps=1, per_device_train_batch_size=4)
    coco_args = CocoPretrainingArguments(output_dir="unused", **common)
    ft_args = IDROTrainingArguments(output_dir="unused", num_clusters=3, num_negatives=1, **common)
    coco_args.bf16 = ft_args.bf16 = bf16  # set after validation: the probe, not the Trainer, is under test
    spans = SpanCorpus.build([tiny_beir], AutoTokenizer.from_pretrained(tiny_bert_nomlm_dir), cache=False)
    data = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    tp = measure_throughput(str(tiny_bert_nomlm_dir), coco_args, ft_args, spans, data, "mean")
    assert {"coco_step_s", "finetune_step_s"} <= set(tp)
    assert seen["coco"] and set(seen["coco"]) == {bf16}
    assert seen["finetune"] and set(seen["finetune"]) == {bf16}


def test_step_timing_is_the_median_of_the_timed_calls_after_a_warm_up(monkeypatch):
    """Hand-made clock: the warm-up call is not timed and one slow call does not move the plan."""
    import hf_cocodr.recipe.probe as recipe

    ticks = iter([0.0, 2.0, 10.0, 19.0, 20.0, 23.0])  # timed calls take 2, 9 and 3 seconds
    calls = []
    monkeypatch.setattr(recipe.time, "perf_counter", lambda: next(ticks))
    assert recipe._time_it(lambda: calls.append(1), repeats=3) == 3.0
    assert len(calls) == 4  # the warm-up, then three timed calls
