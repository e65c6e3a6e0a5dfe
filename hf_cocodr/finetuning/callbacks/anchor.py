"""StartingPointAnchor: regularisation toward the starting weights (L2-SP, Li et al., ICML 2018), decoupled from the
gradient as AdamW decouples its weight decay.

L2-SP adds ``α/2 · ‖θ − θ₀‖²`` to the loss, so that fine-tuning stays near the pretrained weights ``θ₀``. Under Adam a
penalty in the loss is divided by each parameter's gradient scale like every other gradient, so its strength differs
from parameter to parameter; this callback applies it after the optimizer's step instead, the way AdamW applies weight
decay (Loshchilov & Hutter, ICLR 2019), but toward ``θ₀`` rather than toward zero: after each step every trained
parameter moves the fraction ``lr · α`` of its distance back to its starting value (``lr`` the step's learning rate).
A deviation forgets itself with a time constant of ``1 / (lr · α)`` steps.
"""

from __future__ import annotations

import logging

import torch
from transformers import TrainerCallback

from .averaging import trained_parameters

logger = logging.getLogger(__name__)


class StartingPointAnchor(TrainerCallback):
    """After every optimizer step, ``θ ← θ − lr · α · (θ − θ₀)`` for every trainable parameter, where ``θ₀`` is its
    value when ``trainer.train()`` began from step 0 and ``lr`` its parameter group's learning rate at that step.

    Only parameters with ``requires_grad`` are pulled (a frozen document route stays as it is); a parameter the step
    left without a gradient (a skipped step, see :class:`~hf_cocodr.finetuning.rows_trainer.RowsTrainer`) is not
    pulled, as AdamW does not decay it. ``θ₀`` is saved with every checkpoint (name ``l2sp``), so a resumed run pulls
    toward the same weights as an uninterrupted one. Under torch.distributed every rank holds the same weights and
    applies the same pull. ``lr · α`` must stay at most 1 (1 puts every parameter back at its start after each
    step); a larger product is refused when the step comes.
    """

    state_name = "l2sp"

    def __init__(self, weight: float):
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            raise ValueError(f"StartingPointAnchor weight must be a positive number, got {weight!r}")
        self.weight = float(weight)
        self.anchor: dict[str, torch.Tensor] = {}  # parameter name -> its starting value (float32)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            return control
        params = trained_parameters(model)
        if state.global_step == 0:  # a run from its start (a resumed one keeps the anchor its checkpoint restored)
            with torch.no_grad():
                self.anchor = {name: p.detach().float().clone() for name, p in params.items()}
        elif set(self.anchor) != set(params):
            raise RuntimeError(
                "StartingPointAnchor: the resumed checkpoint holds no starting weights for the trained parameters "
                f"({len(self.anchor)} saved, {len(params)} trained): resume from a checkpoint of a run with l2sp on"
            )
        return control

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None or optimizer is None:
            return control
        lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        with torch.no_grad():
            for name, p in trained_parameters(model).items():
                if p.grad is None:  # (the step left it alone)
                    continue
                rate = float(lr_of.get(id(p), 0.0)) * self.weight
                if rate > 1.0:
                    raise ValueError(
                        f"StartingPointAnchor: learning rate × weight is {rate:.4g} at step {state.global_step + 1}, "
                        "above 1 (the pull would overshoot the starting weights): lower the weight"
                    )
                if not rate:
                    continue
                start = self.anchor[name]
                if start.device != p.device:  # (restored from a checkpoint on the CPU)
                    start = self.anchor[name] = start.to(p.device)
                # θ ← θ − rate·(θ − θ₀), in float32 (as the optimizer's own update)
                p.copy_(p.float().lerp_(start, rate).to(p.dtype))
        return control

    # ------------------------------------------------------------------------------------- CheckpointState
    def state(self):
        return {name: t.detach().cpu() for name, t in self.anchor.items()}, {"weight": self.weight}

    def load_state(self, tensors, meta):
        self.anchor = {name: torch.as_tensor(t, dtype=torch.float32).clone() for name, t in tensors.items()}
