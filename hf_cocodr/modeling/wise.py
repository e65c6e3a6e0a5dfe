"""Weight-space ensembling: of an adapted encoder with its starting point (WiSE-FT, Wortsman et al., CVPR 2022), and
of several runs from one starting point (a uniform model soup, Wortsman et al., ICML 2022).

WiSE-FT: ``θ = (1 − α)·θ_start + α·θ_adapted``: α = 0 is the starting model, α = 1 the adapted one. Interpolating the
weights of a fine-tuned model with the model it started from keeps much of the start's robustness out of distribution
while keeping what adaptation gained; it costs one pass over the weights and no inference overhead.

Soup: ``θ = mean_i θ_i`` over runs that started from the same weights and differ only in their seed (data order,
masks, spans). What the runs learned in common adds up; what each picked up from its own noisy batches is averaged
down. Also one pass over the weights, and still a single model.
"""

from __future__ import annotations

import logging
import math

import torch

from .asymmetric import document_modules, is_asymmetric, query_modules

logger = logging.getLogger(__name__)


def interpolate_state_dicts(
    start: dict[str, torch.Tensor], adapted: dict[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
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
            raise ValueError(
                f"cannot ensemble weights: {name} has shape {tuple(s.shape)} in the starting model and "
                f"{tuple(a.shape)} in the adapted one (was the vocabulary extended?)"
            )
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
    pooling, similarity and tokenizer are kept.

    An asymmetric adapted model (a ``Router`` of a query and a document route, each a copy of the plain starting
    model's modules, as the query-side distillation saves it) is interpolated route by route with the starting
    model's modules: its query route becomes ``(1 − α)·θ_start + α·θ_query``, and its document route, where it is the
    starting model's frozen copy, stays the starting model's (an index built with the start stays valid)."""
    if is_asymmetric(adapted_model) and not is_asymmetric(start_model):
        base = list(start_model)
        done: set[int] = set()
        for route in (query_modules(adapted_model), document_modules(adapted_model)):
            if len(route) != len(base):
                raise ValueError(
                    f"cannot ensemble weights: a route of the adapted model has {len(route)} modules, the starting "
                    f"model {len(base)}"
                )
            for mine, theirs in zip(route, base):
                if id(mine) in done:  # (a module after the router serves both routes: interpolated once)
                    continue
                done.add(id(mine))
                mine.load_state_dict(interpolate_state_dicts(theirs.state_dict(), mine.state_dict(), alpha))
        logger.info("WiSE-FT: each route = %.2f x starting model + %.2f x adapted route", 1.0 - alpha, alpha)
        return adapted_model
    merged = interpolate_state_dicts(start_model.state_dict(), adapted_model.state_dict(), alpha)
    adapted_model.load_state_dict(merged)
    logger.info("WiSE-FT: weights = %.2f x starting model + %.2f x adapted model", 1.0 - alpha, alpha)
    return adapted_model


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The uniform mean of every floating-point tensor over ``state_dicts`` (accumulated in float64); other tensors
    (ids, counters) from the first. One state dict is returned exactly (copied). All must hold the same names with the
    same shapes."""
    if not state_dicts:
        raise ValueError("a soup needs at least one model")
    first = state_dicts[0]
    for i, sd in enumerate(state_dicts[1:], 1):
        missing = sorted(set(sd) ^ set(first))
        if missing:
            raise ValueError(f"cannot average weights: model {i} differs from model 0 in parameters {missing[:5]}")
        for name, t in sd.items():
            if t.shape != first[name].shape:
                raise ValueError(
                    f"cannot average weights: {name} has shape {tuple(first[name].shape)} in model 0 "
                    f"and {tuple(t.shape)} in model {i}"
                )
    out = {}
    for name, t in first.items():
        if not t.is_floating_point() or len(state_dicts) == 1:
            out[name] = t.detach().clone()
        else:
            total = torch.zeros(t.shape, dtype=torch.float64)
            for sd in state_dicts:
                total += sd[name].detach().double()
            out[name] = (total / len(state_dicts)).to(t.dtype)
    return out


def soup(models: list):
    """Load the uniform weight average of ``models`` (``SentenceTransformer`` objects with the same architecture, e.g.
    runs of one stage with different seeds) into the first and return it (its modules, pooling, similarity and
    tokenizer are kept)."""
    merged = average_state_dicts([m.state_dict() for m in models])
    models[0].load_state_dict(merged)
    logger.info("model soup: the uniform weight average of %d models", len(models))
    return models[0]
