"""The step-time probe of the planner: a stage's own trainer (:meth:`~hf_cocodr.recipe.Stage.build_trainer`) trains
a few steps into a temporary folder while a callback reads the clock at the end of every step
(:func:`time_trainer_steps`). What is timed is the step the stage will train: its data loading and collation, the
loss, the backward pass and the optimizer update, on the model's device and in the stage's precision.

The first step is a warm-up; the median of the next :data:`STEP_TIMINGS` steps is planned by (single steps vary by
a third in either direction). On a GPU the clock is read after the device finished the step's work.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import TrainerCallback

from .context import log_to_logger

if TYPE_CHECKING:
    from .context import RecipeRun
    from .stage import Stage

logger = logging.getLogger(__name__)

STEP_TIMINGS = 3  # timed training steps per stage (after a warm-up step); their median is planned by


class StepTimer(TrainerCallback):
    """Seconds between the ends of consecutive optimizer steps (each interval holds one whole step: fetching and
    collating its batch, forward, backward, update and the callbacks of the step before).

    Args:
        clock: the clock (``time.perf_counter``).
        synchronize: called before each reading (``torch.cuda.synchronize`` when the model is on a GPU, so the
            step's queued kernels are counted).
    """

    def __init__(self, clock=time.perf_counter, synchronize=None):
        self.clock, self.synchronize = clock, synchronize
        self.intervals: list[float] = []
        self._last: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._last, self.intervals = None, []

    def on_step_end(self, args, state, control, **kwargs):
        if self.synchronize is not None:
            self.synchronize()
        now = self.clock()
        if self._last is not None:
            self.intervals.append(now - self._last)
        self._last = now


def _synchronizer(trainer) -> Any:
    import torch

    device = getattr(trainer.args, "device", None)
    if device is not None and getattr(device, "type", "") == "cuda" and torch.cuda.is_available():
        return torch.cuda.synchronize
    return None


def time_trainer_steps(stage: Stage, run: RecipeRun, timings: int = STEP_TIMINGS) -> tuple[float, Any]:
    """Median seconds of one optimizer step of ``stage``'s trainer, and the trainer: ``1 + timings`` steps trained
    into a temporary folder (the first a warm-up), timed by :class:`StepTimer`. Nothing is written outside that
    folder."""
    with tempfile.TemporaryDirectory(prefix="hf_cocodr-probe-") as tmp:
        trainer = stage.build_trainer(run, 1 + timings, output_dir=tmp, probe=True)
        log_to_logger(trainer, f"{stage.name} (probe)")
        timer = StepTimer(synchronize=_synchronizer(trainer))
        trainer.add_callback(timer)
        trainer.train()
        if not timer.intervals:
            raise RuntimeError(f"stage {stage.name}: the probe trained fewer than 2 steps; nothing was timed")
        seconds = float(np.median(timer.intervals))
    logger.info("stage %s: a step takes %.3f s (median of %d timed steps)", stage.name, seconds, len(timer.intervals))
    return seconds, trainer


def time_call(fn, repeats: int = 1) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
