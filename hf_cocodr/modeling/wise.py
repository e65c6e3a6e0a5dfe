"""Weight-space ensembling of an adapted encoder with its starting point (WiSE-FT, Wortsman et al., CVPR 2022).

``θ = (1 − α)·θ_start + α·θ_adapted``: α = 0 is the starting model, α = 1 the adapted one. Interpolating the weights
of a fine-tuned model with the model it started from keeps much of the start's robustness out of distribution while
keeping what adaptation gained; it costs one pass over the weights and no inference overhead.
"""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger(__name__)


def interpolate_state_dicts(start: dict[str, torch.Tensor], adapted: dict[str, torch.Tensor],
                            alpha: float) -> dict[str, torch.Tensor]:
    """``(1 − α)·start + α·adapted`` for every floating-point tensor; other tensors (ids, counters) from ``adapted``.

    α = 0 and α = 1 return the respective tensors exactly (copied, not recomputed). The two state dicts must hold the
    same names with the same shapes (a model whose vocabulary grew, e.g. with RMSC tokens, cannot be ensembled).
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"the WiSE-FT alpha must be a number in [0, 1], got {alpha!r}")
    missing = sorted(set(adapted) ^ set(start))
    if missing:
        raise ValueError(f"cannot ensemble weights: the two models differ in parameters {missing[:5]}")
    out = {}
    for name, a in adapted.items():
        s = start[name]
        if s.shape != a.shape:
            raise ValueError(f"cannot ensemble weights: {name} has shape {tuple(s.shape)} in the starting model and "
                             f"{tuple(a.shape)} in the adapted one (was the vocabulary extended?)")
        if not a.is_floating_point() or alpha == 1.0:
            out[name] = a.detach().clone()
        elif alpha == 0.0:
            out[name] = s.detach().to(a.dtype).clone()
        else:
            out[name] = ((1.0 - alpha) * s.detach().double() + alpha * a.detach().double()).to(a.dtype)
    return out


def wise_ensemble(start_model, adapted_model, alpha: float):
    """Load the interpolation of ``start_model`` and ``adapted_model`` (two ``SentenceTransformer`` objects with the
    same architecture) into ``adapted_model`` and return it. Only the weights change: the adapted model's modules,
    pooling, similarity and tokenizer are kept."""
    merged = interpolate_state_dicts(start_model.state_dict(), adapted_model.state_dict(), alpha)
    adapted_model.load_state_dict(merged)
    logger.info("WiSE-FT: weights = %.2f x starting model + %.2f x adapted model", 1.0 - alpha, alpha)
    return adapted_model
