"""WeightAveraging: stochastic weight averaging (SWA, Izmailov et al., UAI 2018) over the last steps of a run.

The trained parameters of the weights after each of the last ``ceil(fraction × max_steps)`` optimizer steps are
averaged uniformly, and the average replaces the weights when training ends, so the saved model is the average.
Where a uniform soup averages the endpoints of several runs (:mod:`hf_cocodr.modeling.wise`), this averages the
points one run passes through: one training run, one model, no inference cost.
"""

from __future__ import annotations

import logging
import math

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def trained_parameters(model) -> dict[str, torch.nn.Parameter]:
    """The parameters a trainer trains (``requires_grad``), by name: what the weight callbacks average or pull."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


class WeightAveraging(TrainerCallback):
    """Keep the running mean (in float32) of every trainable parameter over the last ``fraction`` of the planned
    steps, and load it into the model at the end of ``trainer.train()``.

    The window is the steps ``max_steps − ceil(fraction × max_steps) + 1`` to ``max_steps`` (1-based); ``fraction =
    1`` averages every step's weights. A run stopped before its window opens (a wall-clock deadline) keeps its
    weights as they are; one stopped inside it keeps the average of the steps it ran. Only parameters with
    ``requires_grad`` are averaged (a frozen document route stays as it is). The mean and its count are saved with
    every checkpoint (name ``swa``), so a resumed run averages exactly as an uninterrupted one. Under
    torch.distributed every rank holds the same weights and keeps the same mean. Each ``train()`` from step 0 starts
    a new mean. Not with ``load_best_model_at_end`` (the average would replace the best checkpoint's weights).
    """

    state_name = "swa"

    def __init__(self, fraction: float):
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ValueError(f"WeightAveraging fraction must be a number in (0, 1], got {fraction!r}")
        self.fraction = float(fraction)
        self.mean: dict[str, torch.Tensor] = {}  # parameter name -> running mean (float32, on the parameter's device)
        self.count = 0  # the steps averaged so far
        self.applied = False
        self.ended = False  # the last train() has ended (the weights are final)

    def first_step(self, max_steps: int) -> int:
        """The first step (1-based) whose weights join the average."""
        window = math.ceil(round(self.fraction * max_steps, 9))  # (0.28 × 100 is 28.000000000000004 in floats)
        return max(1, max_steps - window + 1)

    def on_train_begin(self, args, state, control, **kwargs):
        self.applied = self.ended = False
        if state.global_step == 0:  # a run from its start (a resumed one keeps the mean its checkpoint restored)
            self.mean, self.count = {}, 0
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is None or state.global_step < self.first_step(state.max_steps):
            return control
        params = trained_parameters(model)
        if self.count and set(params) != set(self.mean):
            raise RuntimeError("WeightAveraging: the model's trained parameters changed during training")
        self.count += 1
        with torch.no_grad():
            for name, p in params.items():
                value = p.detach().float()
                if self.count == 1:
                    self.mean[name] = value.clone()
                else:
                    mean = self.mean[name]
                    if mean.device != value.device:  # (restored from a checkpoint on the CPU)
                        mean = self.mean[name] = mean.to(value.device)
                    mean.add_(value - mean, alpha=1.0 / self.count)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.ended = True
        if model is None or not self.count or self.applied:
            return control
        params = trained_parameters(model)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self.mean[name].to(device=p.device, dtype=p.dtype))
        self.applied = True
        logger.info(
            "SWA: the weights are the uniform average of the last %d steps' (from step %d)",
            self.count,
            self.first_step(state.max_steps),
        )
        return control

    # ------------------------------------------------------------------------------------- CheckpointState
    def state(self):
        # the count always, so a checkpoint from before the window restores an empty mean
        return {name: t.detach().cpu() for name, t in self.mean.items()}, {"count": self.count}

    def load_state(self, tensors, meta):
        self.count = int(meta.get("count", 0))
        self.mean = {name: torch.as_tensor(t, dtype=torch.float32).clone() for name, t in tensors.items()}
        if self.count and not self.mean:
            raise ValueError("WeightAveraging: the checkpoint counts averaged steps but holds no mean")
