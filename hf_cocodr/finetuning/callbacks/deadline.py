"""WallClockDeadline: end ``trainer.train()`` at a wall-clock deadline, whatever ``max_steps`` says."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from transformers import TrainerCallback

from ... import distributed as D

logger = logging.getLogger(__name__)


class WallClockDeadline(TrainerCallback):
    """Stop training after the first optimizer step that ends at or past ``deadline`` (a ``clock()`` reading).

    The recipe plans its steps from a measured step time; a step that runs slower than measured (longer texts, more
    clusters in a batch, a busy machine) would overrun ``--max-minutes``. With this callback the plan is an upper
    bound and the clock the limit: the stage ends with fewer steps, saves and exports as usual, and
    ``stopped_at_step`` says where it stopped (``None``: it ran all its steps). The learning-rate schedule is the
    planned one, so a stopped stage ends before its learning rate has decayed to zero.

    Rank 0 reads the clock and broadcasts its decision, so every rank stops after the same step.
    """

    def __init__(self, deadline: float, *, name: str = "training", clock: Callable[[], float] = time.perf_counter):
        self.deadline, self.name, self.clock = float(deadline), name, clock
        self.stopped_at_step: int | None = None

    def seconds_left(self) -> float:
        return self.deadline - self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        late = np.array([self.clock() >= self.deadline]) if D.is_main() else None
        late = D.broadcast_array(late)
        if bool(late[0]) and state.global_step < state.max_steps:
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
            logger.warning(
                "%s: stopped at step %d of %d, its share of the time budget is spent (steps ran slower "
                "than the planner measured)",
                self.name,
                state.global_step,
                state.max_steps,
            )
        return control
