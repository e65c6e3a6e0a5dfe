"""MoDIR (Xin et al., ACL Findings 2022): momentum adversarial domain-invariant representations.

A linear domain classifier (no bias) is trained, each step, on a momentum queue of *detached* source and target
embeddings (queries and documents) from the last ``queue_batches`` batches; then, with the classifier frozen, the
encoder receives ``λ · confusion`` where the confusion loss is the cross-entropy of the classifier's prediction
against the uniform domain distribution on the current source and target embeddings. λ decays as
``λ₀ · 2^(−step / half_life)``. Target texts come from an unlabelled stream (a corpus folder and optionally target
queries), sampled deterministically per ``(seed, step)``; the whole stream is used, not its first lines.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import distributed as D
from ..data.spans import corpus_source
from ..data.target_queries import read_target_queries
from ..errors import ConfigError
from .base import Method, check_number

logger = logging.getLogger(__name__)

CITATION = {
    "title": "Zero-Shot Dense Retrieval with Momentum Adversarial Domain Invariant Representations",
    "bibtex": """@inproceedings{xin2022modir,
  title = {Zero-Shot Dense Retrieval with Momentum Adversarial Domain Invariant Representations},
  author = {Xin, Ji and Xiong, Chenyan and Srinivasan, Ashwin and Sharma, Ankita and Jose, Damien and Bennett, Paul},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2022},
  year = {2022},
  url = {https://arxiv.org/abs/2110.07581}
}""",
}


@dataclass
class MoDIRSettings:
    """MoDIR's training arguments (fields of :class:`~hf_cocodr.IDROTrainingArguments`).

    Args:
        modir_lambda / modir_half_life: the confusion-loss weight λ = λ₀·2^(−step/half_life).
        modir_queue_batches: n, past batches in the momentum queue of the domain classifier.
        modir_classifier_lr: Adam learning rate of the domain classifier (one update on the queue per step).
    """

    modir_lambda: float = field(default=1.0, metadata={"help": "MoDIR: initial confusion-loss weight lambda0"})
    modir_half_life: float = field(default=10_000.0, metadata={"help": "MoDIR: steps after which lambda halves"})
    modir_queue_batches: int = field(default=1000, metadata={"help": "MoDIR: past batches in the momentum queue"})
    modir_classifier_lr: float = field(default=0.01, metadata={"help": "MoDIR: Adam lr of the domain classifier"})

    def check(self) -> None:
        """ConfigError for a setting out of range, by name (IDROTrainingArguments calls ``Settings.check(args)``)."""
        for name in ("modir_half_life", "modir_classifier_lr"):
            check_number(self, name, positive=True)
        check_number(self, "modir_lambda", positive=False)
        if self.modir_queue_batches < 1:
            raise ConfigError(f"modir_queue_batches must be >= 1, got {self.modir_queue_batches}")


def confusion_loss(logits: Tensor) -> Tensor:
    """Cross-entropy of the predicted domain distribution against uniform: minimal (= log 2) at 50/50."""
    return -F.log_softmax(logits, dim=-1).mean(dim=-1).mean()


class MoDIRObjective(nn.Module):
    """The MoDIR term of :class:`~hf_cocodr.IDROLoss` (pass it in ``auxiliary=[...]``).

    Args:
        target_texts: unlabelled target-domain documents; required.
        target_queries: unlabelled target-domain queries (optional). When given, each step's target sample is half
            queries (encoded as queries) and half documents, mirroring the source side (queries + positives).
        embedding_dim: the encoder's embedding size.
        target_batch_size: target texts encoded per step (default: the source batch size).
        queue_batches: n, how many past batches the momentum queue keeps (memory: n × rows × dim floats, rows =
            the queries, positives and target texts of one step on all ranks; 147 MB for n=1000, 32 queries,
            dim 384).
        lambda0 / half_life: λ = λ₀·2^(−step/half_life).
        classifier_lr / classifier_steps: Adam updates of the classifier on the whole queue, each training step.
            Adam, not plain SGD, because its step size does not depend on the embedding scale: with unit-norm
            embeddings an SGD learning rate of 0.01 leaves the classifier at chance for hundreds of steps (and the
            confusion loss without a gradient), while the same rate diverges on un-normalised dot-product
            embeddings. The Adam moments are checkpointed with the classifier and the queue.
    """

    name = "modir"

    def __init__(
        self,
        target_texts: Sequence[str],
        embedding_dim: int,
        *,
        target_queries: Sequence[str] = (),
        target_batch_size: int | None = None,
        queue_batches: int = 1000,
        lambda0: float = 1.0,
        half_life: float = 10_000.0,
        classifier_lr: float = 0.01,
        classifier_steps: int = 1,
        seed: int = 0,
    ):
        super().__init__()
        texts = [t for t in target_texts if t and t.strip()]
        if not texts:
            raise ValueError(
                "MoDIR needs a stream of unlabelled target texts (target corpus documents); "
                "pass target_texts / --target-corpus"
            )
        if queue_batches < 1 or half_life <= 0 or lambda0 < 0:
            raise ValueError("MoDIR needs queue_batches >= 1, half_life > 0 and lambda0 >= 0")
        self.target_texts = texts
        self.target_queries = [q for q in target_queries if q and q.strip()]
        self.target_batch_size = target_batch_size
        self.queue_batches = queue_batches
        self.lambda0, self.half_life = lambda0, half_life
        self.classifier_lr, self.classifier_steps = classifier_lr, classifier_steps
        self.seed = seed
        # the classifier and its Adam moments are plain CPU tensors, not parameters: the trainer's optimizer must
        # not see them (they are trained here, on the queue, and checkpointed through state_tensors)
        g = torch.Generator().manual_seed(seed)
        self.classifier = torch.randn(2, embedding_dim, generator=g) * 0.01
        self.adam_m = torch.zeros(2, embedding_dim)
        self.adam_v = torch.zeros(2, embedding_dim)
        self.adam_t = 0
        self.queue: list[tuple[Tensor, Tensor]] = []  # (embeddings, domain labels) per batch, newest last
        self.last_accuracy = float("nan")

    def lam(self, step: int) -> float:
        return self.lambda0 * math.pow(2.0, -step / self.half_life)

    def sample_targets(self, step: int, n: int, pool: Sequence[str] | None = None, stream: int = 0) -> list[str]:
        """This rank's ``n`` texts of ``pool`` (default: the target documents) for ``step``: one global draw of
        ``n × world size`` texts per step, cut into rank slices, so 2 ranks see exactly the texts one process with
        the doubled batch sees. The whole stream is sampled, not its first lines."""
        pool = self.target_texts if pool is None else pool
        world, rank = D.world()
        rng = np.random.default_rng([self.seed, step, stream])
        total = min(n * world, len(pool))
        idx = rng.choice(len(pool), size=total, replace=False)
        per_rank = max(1, total // world)
        return [pool[i] for i in idx[rank * per_rank : (rank + 1) * per_rank]]

    def _train_classifier(self) -> None:
        x = torch.cat([e for e, _ in self.queue])
        y = torch.cat([d for _, d in self.queue])
        b1, b2, eps = 0.9, 0.999, 1e-8
        w = self.classifier.detach().clone()
        for _ in range(self.classifier_steps):
            with torch.enable_grad():
                w.requires_grad_(True)
                (g,) = torch.autograd.grad(F.cross_entropy(x @ w.T, y), w)
            w = w.detach()
            self.adam_t += 1
            self.adam_m = b1 * self.adam_m + (1 - b1) * g
            self.adam_v = b2 * self.adam_v + (1 - b2) * g * g
            m_hat = self.adam_m / (1 - b1**self.adam_t)
            v_hat = self.adam_v / (1 - b2**self.adam_t)
            w = w - self.classifier_lr * m_hat / (v_hat.sqrt() + eps)
        self.classifier = w
        with torch.no_grad():
            self.last_accuracy = float(((x @ self.classifier.T).argmax(1) == y).float().mean())

    def compute(self, model, embeddings: list[Tensor], outputs, context: dict) -> dict[str, Tensor]:
        """Source embeddings = this batch's queries and positives; target = a fresh sample of the stream."""
        return self(model, [embeddings[0], embeddings[1]], context)

    def forward(self, model, source_embeddings: Tensor | list[Tensor], context: dict) -> dict[str, Tensor]:
        """Under DDP every rank enqueues the embeddings of *all* ranks (gathered, detached), so the classifiers of
        all ranks stay identical; the confusion loss is computed on this rank's embeddings (DDP averages it)."""
        parts = list(source_embeddings) if isinstance(source_embeddings, list | tuple) else [source_embeddings]
        source = torch.cat(parts)
        step = int(context.get("step", 0))
        n = self.target_batch_size or parts[0].shape[0]
        n_queries = n // 2 if self.target_queries else 0
        target = _encode(model, self.sample_targets(step, n - n_queries), "document", source.device)
        if n_queries:
            queries = _encode(
                model, self.sample_targets(step, n_queries, self.target_queries, 1), "query", source.device
            )
            target = torch.cat([queries, target])
        # 1. the queue gets this batch of every rank (detached), the classifier learns on the queue
        src_all = torch.cat([D.all_gather_tensor(p.detach()) for p in parts])
        tgt_all = D.all_gather_tensor(target.detach())
        emb = torch.cat([src_all, tgt_all]).float().cpu()
        dom = torch.cat([torch.zeros(len(src_all), dtype=torch.long), torch.ones(len(tgt_all), dtype=torch.long)])
        self.queue.append((emb, dom))
        del self.queue[: max(0, len(self.queue) - self.queue_batches)]
        self._train_classifier()  # on the CPU: the queue lives there
        # 2. frozen classifier, confusion loss on the current embeddings (gradients reach the encoder only)
        w = self.classifier.to(source.device, source.dtype)
        logits = torch.cat([source, target]) @ w.T
        conf = confusion_loss(logits)
        return {
            "modir_loss": conf * self.lam(step),
            "_confusion_loss": conf.detach(),
            "_domain_classifier_accuracy": torch.tensor(self.last_accuracy),
        }

    # ---------------------------------------------------------------------------------------- checkpointing
    state_name = "modir"  # the checkpoint-state component (hf_cocodr.finetuning.checkpoint_state)

    def state(self) -> tuple[dict[str, Tensor], dict]:
        return {k.removeprefix("modir_"): v for k, v in self.state_tensors().items()}, {}

    def load_state(self, tensors: dict[str, Tensor], meta: dict) -> None:
        self.load_state_tensors({f"modir_{k}": v for k, v in tensors.items()})

    def state_tensors(self) -> dict[str, Tensor]:
        out = {
            "modir_classifier": self.classifier.cpu(),
            "modir_adam_m": self.adam_m,
            "modir_adam_v": self.adam_v,
            "modir_adam_t": torch.tensor(self.adam_t),
        }
        if self.queue:
            out["modir_queue_emb"] = torch.cat([e for e, _ in self.queue])
            out["modir_queue_dom"] = torch.cat([d for _, d in self.queue])
            out["modir_queue_sizes"] = torch.tensor([len(d) for _, d in self.queue])
        return out

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        if "modir_classifier" in tensors:
            self.classifier = tensors["modir_classifier"].float()
        if "modir_adam_t" in tensors:
            self.adam_m, self.adam_v = tensors["modir_adam_m"].float(), tensors["modir_adam_v"].float()
            self.adam_t = int(tensors["modir_adam_t"])
        self.queue = []
        if "modir_queue_sizes" in tensors:
            emb, dom = tensors["modir_queue_emb"], tensors["modir_queue_dom"]
            start = 0
            for n in tensors["modir_queue_sizes"].tolist():
                self.queue.append((emb[start : start + n], dom[start : start + n]))
                start += n


def _encode(model, texts: list[str], task: str, device) -> Tensor:
    """Embeddings with gradient, through the model's own preprocessing for ``task`` (query / document)."""
    feats = model.preprocess(texts, task=task) if hasattr(model, "encode_document") else model.preprocess(texts)
    feats = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in feats.items()}
    return model(feats)["sentence_embedding"]


def domain_classifier_probe(
    source: np.ndarray, target: np.ndarray, *, epochs: int = 200, lr: float = 0.1, seed: int = 0
) -> dict[str, float]:
    """MoDIR's diagnostic: a *fresh* linear domain classifier trained on final embeddings (half of each domain),
    scored on the other half. Returns held-out ``accuracy`` and ``log_loss`` (nats); lower accuracy and higher loss
    mean more domain-invariant embeddings. Features are standardised with the training half's statistics, so
    models with different embedding scales (dot-product vs. normalised) are probed alike."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([source, target]).astype(np.float32)
    y = np.concatenate([np.zeros(len(source)), np.ones(len(target))]).astype(np.int64)
    if len(source) < 2 or len(target) < 2:
        raise ValueError(
            f"the domain probe needs at least 2 embeddings per domain, got {len(source)} source and "
            f"{len(target)} target"
        )
    perm = rng.permutation(len(x))
    half = len(x) // 2
    tr, te = perm[:half], perm[half:]
    mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-6
    x = (x - mu) / sd
    xt, yt = torch.from_numpy(x[tr]), torch.from_numpy(y[tr])
    w = torch.zeros(2, x.shape[1], requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    for _ in range(epochs):
        opt.zero_grad()
        F.cross_entropy(xt @ w.T, yt).backward()
        opt.step()
    with torch.no_grad():
        logits = torch.from_numpy(x[te]) @ w.T
        labels = torch.from_numpy(y[te])
        return {
            "accuracy": float((logits.argmax(1) == labels).float().mean()),
            "log_loss": float(F.cross_entropy(logits, labels)),
        }


def domain_classifier_accuracy(source: np.ndarray, target: np.ndarray, **kwargs) -> float:
    """Held-out accuracy of :func:`domain_classifier_probe` (lower is more domain-invariant)."""
    return domain_classifier_probe(source, target, **kwargs)["accuracy"]


# ---------------------------------------------------------------------------------------------- target streams
def target_texts(target_corpora, max_texts: int = 50_000, seed: int = 0) -> list[str]:
    """Unlabelled target texts for MoDIR: documents of the target corpora (a random sample if very large)."""
    texts = [t for c in target_corpora for t in corpus_source(c).texts() if t.strip()]
    if len(texts) > max_texts:
        idx = np.random.default_rng(seed).choice(len(texts), max_texts, replace=False)
        texts = [texts[i] for i in sorted(idx)]
    return texts


def target_query_texts(sources) -> tuple[list[str], list[str]]:
    """Unlabelled target queries for MoDIR: ``(texts, names)`` from ``--target-queries`` sources (BEIR folders,
    ``DIR:SPLIT`` whose qrels labels are never read, or JSONL files; :mod:`hf_cocodr.data.target_queries`)."""
    texts, names = [], []
    for spec in sources:
        src = read_target_queries(spec)
        texts += src.texts
        names.append(src.name)
    if sources and not texts:
        raise ConfigError(f"target queries {list(map(str, sources))}: no non-empty query text found")
    return texts, names


# ---------------------------------------------------------------------------------------------- the method
class MoDIR(Method):
    """MoDIR as a method of :class:`~hf_cocodr.IDROTrainer`: one :class:`MoDIRObjective` loss term fed by the target
    documents (and optionally target queries); its classifier, Adam moments and queue are saved with the loss."""

    name = "modir"
    label = "MoDIR"
    display_name = "MoDIR (momentum adversarial domain-invariant representations)"
    citation = CITATION
    settings = MoDIRSettings
    reads_target_corpora = True
    reads_target_queries = True

    def __init__(self, settings: MoDIRSettings | None = None, objective: MoDIRObjective | None = None):
        super().__init__(settings or MoDIRSettings())
        self.objective = objective

    @classmethod
    def build(cls, model, args, data, *, target_corpora=(), target_queries=(), **overrides) -> MoDIR:
        cfg = cls.settings_from(args, **overrides)
        query_texts, query_names = target_query_texts(target_queries) if target_queries else ([], [])
        objective = MoDIRObjective(
            target_texts(target_corpora, seed=args.seed),
            model.get_embedding_dimension(),
            target_queries=query_texts,
            queue_batches=cfg.modir_queue_batches,
            lambda0=cfg.modir_lambda,
            half_life=cfg.modir_half_life,
            classifier_lr=cfg.modir_classifier_lr,
            seed=args.seed,
        )
        method = cls(cfg, objective)
        method.target_corpora_read = [corpus_source(c).name for c in target_corpora]
        method.target_queries_read = query_names
        return method

    def loss_terms(self) -> list:
        return [self.objective] if self.objective is not None else []

    def stage_info(self, args) -> dict[str, str]:
        c = self.config
        return {
            "MoDIR": f"λ₀={c.modir_lambda:g}, half-life {c.modir_half_life:g} steps, queue "
            f"{c.modir_queue_batches} batches, classifier Adam lr {c.modir_classifier_lr:g}"
        }
