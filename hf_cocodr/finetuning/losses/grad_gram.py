"""Exact per-cluster gradient inner products ⟨∇L_i, ∇L_j⟩ over a declared parameter subset, computed cheaply.

Two engines, both exact:

* **Pooled-position engine** (the default for CLS-pooled BERT-family encoders). With CLS pooling, the parameters
  of the last block that act position-wise (attention output projection, feed-forward, both LayerNorms) only
  touch the pooled position. Forward hooks record, for every text of the batch, the inputs of that block at
  position 0 (the attention context and the residual) and its dropout masks. A tiny re-computation over those
  T vectors reproduces the embeddings; one batched vector-Jacobian product pushes all P cluster cotangents
  through it at once. For a linear layer with inputs ``x_t`` and per-cluster output cotangents ``g_{i,t}``,
  ``⟨∇W_i, ∇W_j⟩ = Σ_{t,s} (g_{i,t}·g_{j,s}) (x_t·x_s)``, so the weight gradients are never materialised
  when T is small (the "Gram trick"); otherwise they are. Cost: a few small matrix products, independent of
  sequence length.
* **Autograd engine** (any subset, any architecture): one vector-Jacobian product per present cluster through
  the real graph, restricted to the subset (``torch.autograd.grad(E, params, grad_outputs=C_i)``).

Both start from the cluster cotangents ``C_i = ∂L_i/∂E`` of the (global) cluster mean losses with respect to
every embedding of the local batch, so in-batch negatives, which couple clusters, are handled exactly.
Under DDP, the pooled-position factors (or the autograd gradient rows) are gathered/summed so every rank gets
the Gram of the global per-cluster losses.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import distributed as D

logger = logging.getLogger(__name__)

_POSITIONWISE = (
    "attention.output.dense.weight",
    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",
    "intermediate.dense.bias",
    "output.dense.weight",
    "output.dense.bias",
    "output.LayerNorm.weight",
    "output.LayerNorm.bias",
)


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in float32, or as it is when it is already in a wider float (a double-precision model stays double)."""
    return t if t.dtype == torch.float64 else t.float()


def unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module) and not hasattr(model, "encode"):
        model = model.module
    return model


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The transformer blocks of a model: the longest ModuleList of same-type modules (name, list)."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(m) for m in mod}) == 1:
            if best is None or len(mod) > len(best[1]):
                best = (name, mod)
    if best is None:
        raise ValueError("could not find the transformer blocks (a ModuleList of layers) in the model")
    return best


def _is_bert_like(block: nn.Module) -> bool:
    try:
        att = block.attention.output
        return all(
            isinstance(x, nn.Module)
            for x in (att.dense, att.LayerNorm, block.intermediate.dense, block.output.dense, block.output.LayerNorm)
        ) and callable(block.intermediate.intermediate_act_fn)
    except AttributeError:
        return False


class ParamSubset:
    """Resolve a ``grad_params`` spec into exact parameter names (as in ``model.named_parameters()``).

    Specs: ``"auto"`` (``"last_layer"`` for CLS pooling, else ``"last_norm"``), ``"last_layer"`` (the
    position-wise parameters of the last block), ``"last_norm"`` (the last block's final LayerNorm),
    ``"last_blocks:N"`` (every parameter of the last N blocks), or an explicit list of names.
    """

    def __init__(self, model: nn.Module, spec: str | Sequence[str] = "auto"):
        st = unwrap(model)
        named = dict(st.named_parameters())
        block_list_name, blocks = find_blocks(st)
        last = f"{block_list_name}.{len(blocks) - 1}."
        self.pooling = _pooling_mode(st)
        self.spec = spec
        if isinstance(spec, str):
            s = spec
            if s == "auto":
                s = "last_layer" if self.pooling == "cls" and _is_bert_like(blocks[-1]) else "last_norm"
            if s == "last_layer":
                names = (
                    [last + p for p in _POSITIONWISE if last + p in named]
                    if _is_bert_like(blocks[-1])
                    else [n for n in named if n.startswith(last)]
                )
            elif s == "last_norm":
                names = [n for n in named if n.startswith(last) and re.search(r"output\.LayerNorm\.(weight|bias)$", n)]
                if not names:  # non-BERT naming: the last LayerNorm-like parameters of the last block
                    names = [n for n in named if n.startswith(last) and ("norm" in n.lower())][-2:]
            elif s.startswith("last_blocks:"):
                try:
                    n_blocks = int(s.split(":", 1)[1])
                except ValueError:
                    raise ValueError(f"grad_params {spec!r}: expected 'last_blocks:N' with an integer N") from None
                if not 1 <= n_blocks <= len(blocks):
                    raise ValueError(f"grad_params {spec!r}: N must be in 1..{len(blocks)}")
                prefixes = tuple(f"{block_list_name}.{i}." for i in range(len(blocks) - n_blocks, len(blocks)))
                names = [n for n in named if n.startswith(prefixes)]
            else:
                raise ValueError(
                    f"grad_params {spec!r} not understood; use 'auto', 'last_layer', 'last_norm', 'last_blocks:N' "
                    "or a list of parameter names"
                )
            self.resolved = s
        else:
            names = list(spec)
            unknown = [n for n in names if n not in named]
            if unknown:
                raise ValueError(f"grad_params: unknown parameter names {unknown[:5]} (see model.named_parameters())")
            self.resolved = "names"
        names = [n for n in names if named[n].requires_grad]
        if not names:
            raise ValueError(f"grad_params {spec!r} selects no trainable parameters")
        self.names = names
        self.params = [named[n] for n in names]
        self.num_elements = sum(p.numel() for p in self.params)
        self.last_block = blocks[-1]
        self.last_prefix = last
        self.fast = (
            self.pooling == "cls"
            and _is_bert_like(blocks[-1])
            and all(n.startswith(last) and n[len(last) :] in _POSITIONWISE for n in names)
            and _only_pooling_after(st)
        )


def _pooling_mode(st: nn.Module) -> str | None:
    for m in st.modules():
        mode = getattr(m, "pooling_mode", None)
        if isinstance(mode, str):
            return mode
    return None


def _only_pooling_after(st: nn.Module) -> bool:
    """Modules after the Transformer are only Pooling (and optionally Normalize)."""
    try:
        mods = list(st)[1:]
    except TypeError:
        return False
    return all(type(m).__name__ in ("Pooling", "Normalize") for m in mods)


def has_normalize(st: nn.Module) -> bool:
    try:
        return any(type(m).__name__ == "Normalize" for m in list(unwrap(st))[1:])
    except TypeError:
        return False


class PooledPositionProbe:
    """Forward hooks on the last block recording, at position 0, what the pooled-position engine needs."""

    def __init__(self, block: nn.Module):
        self.block = block
        self.handles: list = []
        self.ctx: list[Tensor] = []
        self.res: list[Tensor] = []
        self.mask1: list[Tensor | None] = []
        self.mask2: list[Tensor | None] = []
        self.inverse: Tensor | None = None  # rows recorded in another order than the embeddings': their positions

    def reset(self) -> None:
        self.ctx, self.res, self.mask1, self.mask2 = [], [], [], []
        self.inverse = None

    def __enter__(self):
        self.reset()
        att_out = self.block.attention.output

        def pre_hook(_mod, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            inp = args[1] if len(args) > 1 else kwargs["input_tensor"]
            if hs.dim() != 3:
                raise RuntimeError("pooled-position engine needs padded (batch, seq, dim) inputs")
            self.ctx.append(hs[:, 0].detach())
            self.res.append(inp[:, 0].detach())

        def drop_hook(store):
            def hook(mod, args, out):
                if not mod.training or mod.p == 0:
                    store.append(None)
                else:
                    keep = (out[:, 0] != 0).to(out.dtype)
                    store.append(keep / (1 - mod.p))

            return hook

        self.handles = [
            att_out.register_forward_pre_hook(pre_hook, with_kwargs=True),
            att_out.dropout.register_forward_hook(drop_hook(self.mask1)),
            self.block.output.dropout.register_forward_hook(drop_hook(self.mask2)),
        ]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    @staticmethod
    def _cat_masks(masks: list[Tensor | None], like: list[Tensor]) -> Tensor | None:
        if all(m is None for m in masks):
            return None
        return torch.cat([torch.ones_like(x) if m is None else m for m, x in zip(masks, like)])

    def tensors(self) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """(context, residual, dropout mask 1, dropout mask 2) of every text, in the embeddings' order."""
        out = (
            torch.cat(self.ctx),
            torch.cat(self.res),
            self._cat_masks(self.mask1, self.ctx),
            self._cat_masks(self.mask2, self.ctx),
        )
        if self.inverse is None:
            return out
        return tuple(None if t is None else t.index_select(0, self.inverse) for t in out)


def _linear_gram(x: Tensor, g: Tensor) -> Tensor:
    """Σ_{t,s} (g_it·g_js)(x_t·x_s) for x (T×in), g (P×T×out): the Gram of the weight gradients g_iᵀx."""
    P, T, out = g.shape
    inp = x.shape[1]
    if T * T * (out + inp) < T * out * inp:  # Gram trick: never materialise P weight gradients
        kxx = x @ x.T  # T×T
        h = torch.einsum("ts,pso->pto", kxx, g)
        return g.reshape(P, -1) @ h.reshape(P, -1).T
    w = torch.einsum("pto,ti->poi", g, x).reshape(P, -1)
    return w @ w.T


def gram_pooled_position(subset: ParamSubset, probe: PooledPositionProbe, cot: Tensor, normalize: bool) -> Tensor:
    """The P×P Gram through the pooled-position re-computation. ``cot``: P×T×d cotangents at the embeddings."""
    blk = subset.last_block
    ao, inter, out = blk.attention.output, blk.intermediate, blk.output
    # in full precision even under autocast (the probe recorded bf16 activations then): the Gram decides the weights
    ctx, res, m1, m2 = (at_least_float32(t) if t is not None else None for t in probe.tensors())
    if ctx.shape[0] != cot.shape[1]:
        raise RuntimeError(f"probe recorded {ctx.shape[0]} texts but the batch has {cot.shape[1]} embeddings")
    with torch.enable_grad(), torch.autocast(cot.device.type, enabled=False):
        y1 = F.linear(ctx, ao.dense.weight, ao.dense.bias)
        a = y1 * m1 if m1 is not None else y1
        h1 = F.layer_norm(a + res, a.shape[-1:], ao.LayerNorm.weight, ao.LayerNorm.bias, ao.LayerNorm.eps)
        y2 = F.linear(h1, inter.dense.weight, inter.dense.bias)
        z = inter.intermediate_act_fn(y2)
        y3 = F.linear(z, out.dense.weight, out.dense.bias)
        o = y3 * m2 if m2 is not None else y3
        e = F.layer_norm(o + h1, o.shape[-1:], out.LayerNorm.weight, out.LayerNorm.bias, out.LayerNorm.eps)
        emb = F.normalize(e, dim=-1) if normalize else e
        rel = subset.last_prefix
        linears = {"attention.output.dense": (ctx, y1), "intermediate.dense": (h1, y2), "output.dense": (z, y3)}
        norms = {"attention.output.LayerNorm": ao.LayerNorm, "output.LayerNorm": out.LayerNorm}
        wanted = {n[len(rel) :] for n in subset.names}
        lin_keys = [k for k in linears if f"{k}.weight" in wanted or f"{k}.bias" in wanted]
        norm_params = [(k, attr) for k in norms for attr in ("weight", "bias") if f"{k}.{attr}" in wanted]
        inputs = [linears[k][1] for k in lin_keys] + [getattr(norms[k], a) for k, a in norm_params]
        grads = _batched_vjp(emb, inputs, cot)
    P = cot.shape[0]
    gram = torch.zeros(P, P, dtype=torch.float64, device=cot.device)
    small: list[Tensor] = []
    for k, g in zip(lin_keys, grads[: len(lin_keys)]):
        x = linears[k][0].detach()
        x_all, g_all = D.gather_cat(x, 0), D.gather_cat(g, 1)
        if f"{k}.weight" in wanted:
            gram += _linear_gram(x_all, g_all).double()
        if f"{k}.bias" in wanted:
            small.append(g.sum(1))
    small += [g.reshape(P, -1) for g in grads[len(lin_keys) :]]
    if small:
        v = D.all_reduce_sum(torch.cat(small, dim=1))
        gram += (v @ v.T).double()
    return gram


def _batched_vjp(output: Tensor, inputs: list[Tensor], cot: Tensor) -> list[Tensor]:
    """P vector-Jacobian products at once (vmap over the backward), with a loop as fallback."""
    try:
        grads = torch.autograd.grad(output, inputs, grad_outputs=cot, is_grads_batched=True, allow_unused=True)
    except RuntimeError:  # an op without a batching rule
        per = [torch.autograd.grad(output, inputs, grad_outputs=c, retain_graph=True, allow_unused=True) for c in cot]
        grads = tuple(torch.stack(gs) if gs[0] is not None else None for gs in zip(*per))
    return [
        torch.zeros((cot.shape[0], *x.shape), dtype=cot.dtype, device=cot.device) if g is None else g
        for g, x in zip(grads, inputs)
    ]


def gram_autograd(subset: ParamSubset, embeddings: Tensor, cot: Tensor) -> Tensor:
    """The P×P Gram by one vector-Jacobian product per cluster through the real graph (any subset)."""
    rows = []
    for c in cot:
        gs = torch.autograd.grad(embeddings, subset.params, grad_outputs=c, retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(gs, subset.params)])
        )
    v = D.all_reduce_sum(torch.stack(rows))
    return v.double() @ v.double().T
