"""IDROLoss: per-cluster reweighted InfoNCE (iDRO from COCO-DR), with GroupDRO and uniform baselines."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import distributed as D
from ...citations import CITATIONS
from ...modeling.packing import embed_packed
from .grad_gram import (
    ParamSubset,
    PooledPositionProbe,
    at_least_float32,
    gram_autograd,
    gram_pooled_position,
    has_normalize,
    unwrap,
)
from .infonce import BatchLayout, infonce_cotangents, per_sample_infonce

logger = logging.getLogger(__name__)

PRESETS = ("paper", "reference", "groupdro", "uniform")
GRAM_NORMALIZATIONS = ("none", "diag")
_MAX_LOG_STEP = 1e30  # keeps log-weights finite for absurdly small tau


def text_keys(features: dict[str, Tensor]) -> Tensor:
    """A 62-bit hash of each row's token ids: identical texts get identical keys (for false-negative masking)."""
    ids = features["input_ids"].long()
    mask = features.get("attention_mask")
    if mask is not None:
        ids = ids * mask.long()
    mod = (1 << 61) - 1
    pos = torch.arange(ids.shape[1], device=ids.device)
    mult = torch.remainder(pos * 1_000_003 + 7919, mod)
    return torch.remainder((ids * mult).sum(1) + ids.shape[1], mod)


class IDROLoss(nn.Module):
    """Implicit distributionally robust optimisation (iDRO) over query clusters, as in COCO-DR.

    Each row is a query with its positive document and optional hard negatives; ``labels`` are the rows'
    cluster ids (supplied by :class:`~hf_cocodr.KMeansClusteringCallback` through the
    :class:`~hf_cocodr.IDROTrainer`). The per-sample InfoNCE loss ℓ_b is averaged per present cluster
    (ℓ_i), and the clusters are reweighted:

    * ``preset="paper"``: α_i = ℓ_i^β / Σ_j ℓ_j^β; r_ij = (ℓ_iℓ_j)^β ⟨∇ℓ_i, ∇ℓ_j⟩;
      log ω_i += (1/τ) Σ_j r_ij (present i), renormalised over all K in log space;
      L = Σ α_i ω_i ℓ_i / Σ α_i ω_i with this step's ω.
    * ``preset="reference"``: what the authors' released code does: L = Σ ω_i ℓ_i with the previous ω and
      no α; e_i = ρ·(1/K) Σ_j (ℓ_iℓ_j)^β cos(∇ℓ_i, ∇ℓ_j); ω ← ω^0.1·exp(e) on present clusters, 0 elsewhere,
      normalised, floored at 0.01. The released code takes the gradients of the last 3 blocks (2 for 24+ layer
      models) with one backward pass per cluster (``grad_params="last_blocks:3"`` does that here); by default the
      cosines come from the same cheap exact Gram as the paper preset's (the last block's position-wise
      parameters), so the rule costs what the paper rule costs.
    * ``preset="groupdro"``: online GroupDRO (Sagawa et al.): log q_i += η ℓ_i, L = Σ q_i ℓ_i / Σ q_i over
      the present clusters.
    * ``preset="uniform"``: the plain mean of ℓ_b (for ablations); gradients equal plain InfoNCE.

    The gradient inner products are exact (see :mod:`hf_cocodr.finetuning.losses.grad_gram`) and cheap for
    the default subset. After each forward, :attr:`last_stats` holds ``cluster_ids``, ``cluster_losses``,
    ``cluster_sizes``, ``alpha``, ``weights`` (ω of the present clusters after this step's update),
    ``grad_gram`` (raw ⟨∇ℓ_i, ∇ℓ_j⟩ before β or normalisation), ``grad_param_names`` and ``skipped``.

    Args:
        model: the SentenceTransformer being trained.
        preset: ``"paper"``, ``"reference"``, ``"groupdro"`` or ``"uniform"``.
        num_clusters: K, the number of query clusters (clamped by the callback if there are fewer queries).
        beta: the exponent β of the loss-scaling terms (≥ 0).
        tau: the temperature τ of the ω update (> 0; ``float("inf")`` freezes ω).
        grad_params: the parameter subset of the gradient similarity: ``"auto"`` (the default: the position-wise
            parameters of the last block for CLS pooling, which is cheap and exact; the last LayerNorm otherwise),
            ``"last_layer"``, ``"last_norm"``, ``"last_blocks:N"`` (the reference code's subset with N = 3: one
            backward pass per cluster) or explicit parameter names.
        in_batch_negatives: use every other document of the batch as a negative (default) besides the row's
            own hard negatives.
        gather_across_devices: gather candidates from all ranks under DDP (the global batch).
        similarity: ``"dot"`` or ``"cosine"``; default: the model's own similarity.
        scale: multiplies the similarities (1/temperature of the InfoNCE).
        rho, omega_power, omega_floor: constants of the reference preset.
        groupdro_step_size: η of the GroupDRO preset.
        compute_gram: compute ``grad_gram`` even for presets that do not need it (for analysis).
        gram_normalization: ``"none"`` (the paper's rule as written: raw inner products, so the step of log ω
            scales with the encoder's gradient norms) or ``"diag"`` (the paper preset's Gram divided by the mean
            of its diagonal each step, so τ means the same for any encoder: ``"diag"`` with τ equals ``"none"``
            with τ × that mean).
        auxiliary: extra objectives added to the reweighted retrieval loss, e.g.
            :class:`~hf_cocodr.methods.MoDIRObjective` and :class:`~hf_cocodr.methods.BERMObjective`; the
            loss then returns a dict of named terms (each logged).
        gram_engine: ``"auto"`` (the pooled-position engine whenever the subset allows it), ``"autograd"``
            (always one vector-Jacobian product per cluster, for comparison) or ``"pooled"`` (require it).

    References:
        - Yu et al., COCO-DR, EMNLP 2022: https://arxiv.org/abs/2210.15212
        - Sagawa et al., Distributionally Robust Neural Networks, ICLR 2020: https://arxiv.org/abs/1911.08731

    Requirements:
        1. (query, positive) pairs or (query, positive, negative_1, ..., negative_m) tuples
        2. cluster ids as labels (the IDROTrainer supplies them)

    Inputs:
        +-------------------------------------------+--------------------------+
        | Texts                                     | Labels                   |
        +===========================================+==========================+
        | (query, positive, negative_1, ..., neg_m) | cluster id of each query |
        +-------------------------------------------+--------------------------+

    Relations:
        - ``preset="uniform"`` equals :class:`~sentence_transformers.losses.MultipleNegativesRankingLoss`
          with the same similarity and scale (and masks labelled positives out of the negatives).

    Example:
        ::

            from hf_cocodr import IDROLoss, IDROTrainer, IDROTrainingArguments, load_encoder
            from hf_cocodr.data import RetrievalTrainingData

            model = load_encoder("OpenMatch/cocodr-base")
            data = RetrievalTrainingData.from_beir("data/msmarco", split="train", negatives="bm25")
            loss = IDROLoss(model, preset="paper", num_clusters=50, tau=1.0)
            args = IDROTrainingArguments(output_dir="out", per_device_train_batch_size=32, max_steps=1000)
            trainer = IDROTrainer(model=model, args=args, train_dataset=data, loss=loss)
            trainer.train()
    """

    def __init__(
        self,
        model,
        preset: str = "paper",
        num_clusters: int = 50,
        beta: float = 0.25,
        tau: float = 1.0,
        grad_params: str | Sequence[str] | None = None,
        in_batch_negatives: bool = True,
        gather_across_devices: bool = False,
        similarity: str | None = None,
        scale: float = 1.0,
        rho: float = 0.05,
        omega_power: float = 0.1,
        omega_floor: float = 0.01,
        groupdro_step_size: float = 0.01,
        compute_gram: bool | None = None,
        gram_engine: str = "auto",
        gram_normalization: str = "none",
        auxiliary: list | None = None,
    ) -> None:
        super().__init__()
        self._check_settings(preset, gram_normalization, tau, beta, num_clusters, scale)
        self.gram_normalization = gram_normalization
        self.model = model
        self.preset = preset
        self.beta = float(beta)
        self.tau = float(tau)
        self.in_batch_negatives = in_batch_negatives
        self.gather_across_devices = gather_across_devices
        st = unwrap(model)
        self.similarity = similarity or str(getattr(st, "similarity_fn_name", None) or "dot")
        if self.similarity not in ("dot", "cosine"):
            raise ValueError(f"similarity must be 'dot' or 'cosine', got {self.similarity!r}")
        self.scale = float(scale)
        self.rho, self.omega_power, self.omega_floor = rho, omega_power, omega_floor
        self.groupdro_step_size = groupdro_step_size
        self._set_gradient_subset(st, grad_params, gram_engine, compute_gram)
        self.register_buffer("log_weights", torch.empty(0, dtype=torch.float64), persistent=False)
        self.reset_weights(int(num_clusters))
        self.last_stats: dict[str, Any] = {}
        self.skipped_steps = 0
        self.auxiliary = nn.ModuleList(auxiliary or [])
        self._log_gradient_subset()

    @staticmethod
    def _check_settings(preset: str, gram_normalization: str, tau, beta, num_clusters, scale) -> None:
        """Refuse an unknown preset or Gram normalisation and out-of-range τ, β, K or scale."""
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
        if gram_normalization not in GRAM_NORMALIZATIONS:
            raise ValueError(f"gram_normalization must be one of {GRAM_NORMALIZATIONS}, got {gram_normalization!r}")
        if not (isinstance(tau, (int, float)) and tau > 0):
            raise ValueError(f"tau must be > 0 (use float('inf') to freeze the weights), got {tau!r}")
        if not (isinstance(beta, (int, float)) and beta >= 0 and math.isfinite(beta)):
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        if int(num_clusters) < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")

    def _set_gradient_subset(self, st, grad_params, gram_engine: str, compute_gram: bool | None) -> None:
        """Whether the preset needs the gradient Gram (``needs_gram``), the parameter subset it is taken over
        (``grad_params_spec``; ``subset``, None without a Gram) and the engine computing it."""
        preset = self.preset
        self.needs_gram = preset in ("paper", "reference") if compute_gram is None else bool(compute_gram)
        if grad_params is None:
            grad_params = "auto"  # the cheap exact Gram, for the reference rule too
        self.grad_params_spec = grad_params
        if gram_engine not in ("auto", "autograd", "pooled"):
            raise ValueError(f"gram_engine must be 'auto', 'autograd' or 'pooled', got {gram_engine!r}")
        self.subset = ParamSubset(st, grad_params) if self.needs_gram else None
        if self.subset is not None and gram_engine == "autograd":
            self.subset.fast = False
        if self.subset is not None and gram_engine == "pooled" and not self.subset.fast:
            raise ValueError(
                "gram_engine='pooled' needs CLS pooling on a BERT-family encoder and a subset of the last block's "
                f"position-wise parameters; got pooling={self.subset.pooling!r}, grad_params={grad_params!r}"
            )

    def _log_gradient_subset(self) -> None:
        if self.subset is not None:
            logger.info(
                "iDRO gradient similarity over %d parameters (%s, %s engine): %s",
                self.subset.num_elements,
                self.subset.resolved,
                "pooled-position" if self.subset.fast else "autograd",
                ", ".join(self.subset.names),
            )

    # ------------------------------------------------------------------------------------------ weights
    @property
    def num_clusters(self) -> int:
        return int(self.log_weights.numel())

    @property
    def weights(self) -> Tensor:
        """ω over all K clusters (sums to 1)."""
        return self.log_weights.exp()

    def reset_weights(self, num_clusters: int | None = None) -> None:
        k = num_clusters or self.num_clusters
        self.log_weights = torch.full((k,), -math.log(k), dtype=torch.float64, device=self.log_weights.device)

    def set_log_weights(self, log_weights: Tensor) -> None:
        lw = log_weights.to(torch.float64)
        lw = lw - lw.max()  # exact for ties even when the log-weights are astronomically large
        self.log_weights = lw - torch.logsumexp(lw, 0)

    # ------------------------------------------------------------------------------------------ encoding
    def _embed(self, sentence_features: Iterable[dict[str, Tensor]], probe: PooledPositionProbe | None):
        """(features, embeddings per column, full outputs per column or None). Features that carry a packing plan
        (:class:`~hf_cocodr.modeling.packing.PackedColumns`, what the trainer hands over) are embedded in one
        forward per length group; others as sentence-transformers embeds columns (the queries, then the other
        columns merged)."""

        from sentence_transformers.base.losses.merged_forward import embed_columns

        packed = getattr(sentence_features, "packed", None)
        features = list(sentence_features)
        with probe if probe is not None else contextlib.nullcontext():
            if self._token_states:  # auxiliary objectives read token states: one forward per column
                outputs = [self.model(f) for f in features]
                return features, [o["sentence_embedding"] for o in outputs], outputs
            if packed is not None:
                embeddings = embed_packed(self.model, features, packed=packed)
                if probe is not None:  # the probe recorded the rows in the groups' order
                    probe.inverse = packed.inverse
                return features, embeddings, None
            return features, embed_columns(self.model, features), None

    def _layout(self, features, embeddings, doc_keys, pos_keys, world: int):
        B = embeddings[0].shape[0]
        M = len(embeddings) - 1
        if M < 1:
            raise ValueError("IDROLoss needs at least (query, positive) columns")
        if doc_keys is None:
            doc_keys = torch.stack([text_keys(f) for f in features[1:]], dim=1)  # B×M
            if pos_keys is None:
                pos_keys = doc_keys[:, :1]
        if pos_keys is None:
            pos_keys = doc_keys[:, :1]
        doc_flat = doc_keys.t().reshape(-1).to(embeddings[0].device)  # column-major, like the candidates
        pos_keys = pos_keys.to(embeddings[0].device)
        if world > 1:
            doc_flat = D.gather_cat(doc_flat, 0)
            pos_keys = D.gather_padded(pos_keys)
        return B, M, doc_flat, pos_keys

    def per_sample_loss(self, sentence_features, labels=None, doc_keys=None, pos_keys=None) -> Tensor:
        """The differentiable per-row InfoNCE loss vector that the cluster losses average."""
        features, embeddings, _ = self._embed(sentence_features, None)
        return self._local_losses(features, embeddings, doc_keys, pos_keys)[0]

    def plain_loss(self, sentence_features, doc_keys=None, pos_keys=None) -> Tensor:
        """The plain contrastive objective of this loss: the mean InfoNCE over the rows, with its similarity, scale,
        in-batch negatives and false-negative masking, but no cluster weights. It needs no labels, computes no
        gradient similarity and reads or changes no state (ω, :attr:`last_stats`, auxiliary objectives): the
        :class:`~hf_cocodr.IDROTrainer` reports it as the evaluation loss."""
        return self.per_sample_loss(sentence_features, doc_keys=doc_keys, pos_keys=pos_keys).mean()

    def _local_losses(self, features, embeddings, doc_keys, pos_keys):
        world, rank = D.world()
        B, M, doc_flat, pos_all = self._layout(features, embeddings, doc_keys, pos_keys, world)
        q = embeddings[0]
        cands = torch.cat(embeddings[1:], dim=0)
        rows = torch.arange(B, device=q.device)
        if world > 1 and self.gather_across_devices:
            from sentence_transformers.util import all_gather_with_grad

            cands = all_gather_with_grad(cands)
            layout, row_rank = BatchLayout(B, M, world, doc_flat, pos_all), rank
        else:
            local = BatchLayout(B, M, 1, doc_flat.reshape(world, -1)[rank], pos_all[rank * B : (rank + 1) * B])
            layout, row_rank = local, 0
        allowed, targets = layout.mask_and_targets(
            torch.full_like(rows, row_rank), rows, self.in_batch_negatives, cross_rank=True
        )
        ell = per_sample_infonce(q, cands, allowed, targets, self.similarity, self.scale)
        return ell, (B, M, doc_flat, pos_all, world, rank)

    # ------------------------------------------------------------------------------------------ forward
    def forward(
        self,
        sentence_features,
        labels: Tensor,
        doc_keys: Tensor | None = None,
        pos_keys: Tensor | None = None,
        context: dict | None = None,
    ) -> Tensor | dict[str, Tensor]:
        loss, embeddings, outputs = self._retrieval_forward(sentence_features, labels, doc_keys, pos_keys)
        if not len(self.auxiliary):
            return loss
        terms = {"retrieval_loss": loss}
        metrics = {}
        if not self.last_stats.get("skipped"):
            for aux in self.auxiliary:
                for k, v in aux.compute(self.model, embeddings, outputs, context or {}).items():
                    if k.startswith("_"):
                        metrics[k[1:]] = float(v)
                    else:
                        terms[k] = v
        self.last_stats["aux_metrics"] = metrics
        return terms

    @property
    def _token_states(self) -> bool:
        """Whether an auxiliary objective reads token states (then the encoder runs one forward per column)."""
        return any(getattr(a, "needs_token_states", False) for a in self.auxiliary)

    def _retrieval_forward(self, sentence_features, labels, doc_keys, pos_keys):
        if labels is None:
            raise ValueError("IDROLoss needs cluster ids as labels; train it with IDROTrainer (which supplies them)")
        fast = self.subset is not None and self.subset.fast
        probe = PooledPositionProbe(self.subset.last_block) if fast else None
        features, embeddings, outputs = self._embed(sentence_features, probe)
        ell, (B, M, doc_flat, pos_all, world, rank) = self._local_losses(features, embeddings, doc_keys, pos_keys)
        host_labels = labels.reshape(-1).long() if labels.device.type == "cpu" else None
        labels = self._checked_labels(labels, B, ell.device)
        cluster_losses, ell_all, present, inverse, sizes, cot_inputs = self._global_cluster_losses(
            embeddings, labels, BatchLayout(B, M, world, doc_flat, pos_all), host_labels
        )
        finite = bool(torch.isfinite(ell_all.detach()).all())
        stats: dict[str, Any] = {
            "cluster_ids": present.detach(),
            "cluster_sizes": sizes.detach().long(),
            "cluster_losses": cluster_losses.detach(),
            "grad_param_names": list(self.subset.names) if self.subset is not None else [],
            "grad_gram": None,
            "skipped": not finite,
        }
        if not finite:
            self.skipped_steps += 1
            stats.update(alpha=None, weights=self.weights[present].detach(), coefficients=None)
            self.last_stats = stats
            # A zero loss that still reaches every embedding, so DDP's reducer sees every parameter.
            return sum(e.sum() for e in embeddings) * 0.0, embeddings, outputs

        gram = None
        if self.needs_gram:
            gram = self._cluster_gram(cot_inputs, inverse, sizes, embeddings, probe, B, M, rank)
            stats["grad_gram"] = gram.detach()
        ell_c = cluster_losses.detach().double()
        alpha = self._alpha(ell_c)
        coef = self._update_and_coefficients(present, ell_c, alpha, gram)
        stats.update(
            alpha=alpha.float(),
            weights=self.weights[present].detach().float(),
            coefficients=coef.float(),
            all_weights=self.weights.detach().float(),
        )
        self.last_stats = stats
        if self.preset == "uniform":
            return ell.mean(), embeddings, outputs
        # Each local row carries its cluster's coefficient / cluster size; ×world undoes DDP gradient averaging.
        local_inv = inverse[rank * B : (rank + 1) * B]
        row_w = (coef / sizes.double())[local_inv].to(ell.dtype)
        return world * (row_w * ell).sum(), embeddings, outputs

    def _checked_labels(self, labels: Tensor, B: int, device) -> Tensor:
        """The cluster ids on ``device``, checked where they are (ids the host drew are checked before they move:
        no read-back from the device)."""
        labels = labels.long().reshape(-1)
        if labels.numel() != B:
            raise ValueError(f"got {labels.numel()} cluster ids for a batch of {B} queries")
        if (labels < 0).any() or (labels >= self.num_clusters).any():
            raise ValueError(f"cluster ids must be in [0, {self.num_clusters}), got {labels.min()}..{labels.max()}")
        labels = labels.to(device)
        if self.log_weights.device != device:
            self.log_weights = self.log_weights.to(device)
        return labels

    def _global_cluster_losses(self, embeddings, labels: Tensor, layout: BatchLayout, host_labels: Tensor | None):
        """Per-cluster mean losses over the global batch, from detached, gathered embeddings (identical on every
        rank): ``(cluster losses, per-row losses, present ids, inverse, sizes, cotangent inputs)``; the last is
        what :meth:`_cluster_gram` needs (None when the preset needs no Gram)."""
        B, world = layout.batch_size, layout.world_size
        # in full precision even under autocast: in bf16 the per-cluster losses round to one value and their
        # gradients share a common part that swamps the differences the Gram matrix measures (tests/modeling/test_bf16.py)
        q_all = at_least_float32(D.gather_cat(embeddings[0].detach(), 0))
        c_all = at_least_float32(D.gather_cat(torch.cat(embeddings[1:], 0).detach(), 0))
        with torch.no_grad(), torch.autocast(labels.device.type, enabled=False):
            rows = torch.arange(world * B, device=labels.device)
            allowed, targets = layout.mask_and_targets(
                rows // B, rows % B, self.in_batch_negatives, cross_rank=self.gather_across_devices or world == 1
            )
            ell_all = per_sample_infonce(q_all, c_all, allowed, targets, self.similarity, self.scale)
            if world == 1 and host_labels is not None:  # the cluster ids as the host drew them: no read-back
                present, inverse = torch.unique(host_labels, sorted=True, return_inverse=True)
                present, inverse = present.to(labels.device), inverse.to(labels.device)
            else:
                present, inverse = torch.unique(D.gather_cat(labels, 0), sorted=True, return_inverse=True)
            P = present.numel()
            sizes = torch.bincount(inverse, minlength=P).to(ell_all.dtype)
            cluster_losses = (
                torch.zeros(P, dtype=ell_all.dtype, device=labels.device).index_add(0, inverse, ell_all) / sizes
            )
        cot_inputs = (q_all, c_all, allowed, targets) if self.needs_gram else None
        return cluster_losses, ell_all, present, inverse, sizes, cot_inputs

    def _cluster_gram(self, cot_inputs, inverse, sizes, embeddings, probe, B: int, M: int, rank: int) -> Tensor:
        """The Gram matrix of the per-cluster loss gradients w.r.t. the selected parameters: the cotangents of
        every cluster's loss at every embedding in closed form (:func:`infonce_cotangents`, one row per cluster),
        then this rank's rows through the encoder's tail."""
        q_all, c_all, allowed, targets = cot_inputs
        # the cluster means as weights over the rows: w[i, b] = [row b in cluster i] / |cluster i|
        # in double precision: the closed form's softmax − one-hot loses digits to cancellation in float32
        weights = F.one_hot(inverse, sizes.numel()).T.double() / sizes.double()[:, None]
        with torch.no_grad(), torch.autocast(q_all.device.type, enabled=False):
            cot_q, cot_c = infonce_cotangents(
                q_all.double(), c_all.double(), allowed, targets, weights, self.similarity, self.scale
            )
        cot_q, cot_c = cot_q.to(q_all.dtype), cot_c.to(q_all.dtype)
        local_cot = torch.cat(
            [cot_q[:, rank * B : (rank + 1) * B], cot_c[:, rank * B * M : (rank + 1) * B * M]], dim=1
        )
        if probe is not None:
            return gram_pooled_position(self.subset, probe, local_cot, has_normalize(self.model))
        return gram_autograd(self.subset, torch.cat(embeddings, 0), local_cot)

    def _alpha(self, ell_c: Tensor) -> Tensor:
        powered = ell_c.clamp(min=0) ** self.beta
        total = powered.sum()
        return powered / total if total > 0 else torch.full_like(ell_c, 1.0 / ell_c.numel())

    def _update_and_coefficients(self, present: Tensor, ell_c: Tensor, alpha: Tensor, gram: Tensor | None) -> Tensor:
        lw = self.log_weights
        if self.preset == "paper":
            scaled = ell_c.clamp(min=0) ** self.beta
            g = gram.double()
            if self.gram_normalization == "diag":
                d = g.diagonal().clamp(min=0).mean()
                g = g / d if d > 0 else torch.zeros_like(g)
            r = scaled[:, None] * scaled[None, :] * g
            step = (r.sum(1) / self.tau) if math.isfinite(self.tau) else torch.zeros_like(ell_c)
            step = step.clamp(-_MAX_LOG_STEP, _MAX_LOG_STEP)
            new = lw.clone()
            new[present] = new[present] + step
            self.set_log_weights(new)
            # normalised in log space: no 0/0 when the present clusters' weights underflow
            return torch.softmax(alpha.clamp(min=1e-300).log() + self.log_weights[present], 0)
        if self.preset == "reference":
            prev = self.weights[present].clone()
            d = gram.double().diagonal().clamp(min=0).sqrt()
            denom = d[:, None] * d[None, :]
            cos = torch.where(denom > 0, gram.double() / denom.clamp(min=1e-300), torch.zeros_like(denom))
            scaled = ell_c.clamp(min=0) ** self.beta
            e = self.rho * (scaled[:, None] * scaled[None, :] * cos).sum(1) / self.num_clusters
            w = torch.zeros_like(lw)
            w[present] = self.weights[present] ** self.omega_power * torch.exp(e)
            w = w / w.sum()
            w = w.clamp(min=self.omega_floor)
            self.log_weights = w.log()
            return prev
        if self.preset == "groupdro":
            new = lw.clone()
            new[present] = new[present] + self.groupdro_step_size * ell_c
            self.set_log_weights(new)
            return torch.softmax(self.log_weights[present], 0)
        # uniform: coefficient ∝ cluster size, i.e. the plain mean over rows
        return torch.ones_like(ell_c)

    # ------------------------------------------------------------------------------------------ checkpoints
    state_name = "idro"  # the checkpoint-state component (hf_cocodr.finetuning.checkpoint_state)

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The cluster log-weights (tensors) and the loss's configuration (metadata, for the reader)."""
        return {"log_weights": self.log_weights.detach().cpu()}, {"config": self.get_config_dict()}

    def load_state(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        if "log_weights" in tensors:
            self.log_weights = tensors["log_weights"].to(torch.float64)

    # ------------------------------------------------------------------------------------------ plumbing
    def get_config_dict(self) -> dict[str, Any]:
        cfg = {
            "preset": self.preset,
            "num_clusters": self.num_clusters,
            "beta": self.beta,
            "tau": self.tau,
            **({"gram_normalization": self.gram_normalization} if self.gram_normalization != "none" else {}),
            "grad_params": self.subset.resolved if self.subset is not None else None,
            "in_batch_negatives": self.in_batch_negatives,
            "gather_across_devices": self.gather_across_devices,
            "similarity": self.similarity,
            "scale": self.scale,
        }
        if self.preset == "reference":
            cfg.update(rho=self.rho, omega_power=self.omega_power, omega_floor=self.omega_floor)
        if self.preset == "groupdro":
            cfg.update(groupdro_step_size=self.groupdro_step_size)
        return cfg

    @property
    def citation(self) -> str:
        key = "groupdro" if self.preset == "groupdro" else "cocodr"
        return CITATIONS[key]["bibtex"]

    def remap_clusters(self, mapping: Tensor | None, num_clusters: int) -> None:
        """After re-clustering: new cluster j takes ω of old cluster ``mapping[j]`` (or a reset when None)."""
        if mapping is None:
            self.reset_weights(num_clusters)
            return
        old = self.log_weights
        new = torch.full(
            (num_clusters,),
            float(torch.logsumexp(old, 0) - math.log(max(1, old.numel()))),
            dtype=torch.float64,
            device=old.device,
        )
        valid = mapping >= 0
        new[valid] = old[mapping[valid]]
        self.set_log_weights(new)
