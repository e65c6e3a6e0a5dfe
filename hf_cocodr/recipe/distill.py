"""The recipe's distillation stage (:class:`DistillStage`): the hybrid teacher's ranking distilled into the dense
model on unlabelled target queries.

The teacher is :class:`~hf_cocodr.hybrid.HybridRetriever` of the *starting* model and BM25 over the target corpus
the queries belong to (:func:`~hf_cocodr.data.teacher.route_queries`); for each query its top ``distill_k``
documents and fused scores are the training row, and the student (the model the stages before left behind) learns
the teacher's score distribution over them with :class:`~hf_cocodr.finetuning.losses.HybridDistillLoss` (listwise
KL, plus the in-batch contrast on the teacher's first candidate). The query labels are never read. The teacher's
indexes are cached per model and corpus (``<cache>/teacher``), so a resumed or repeated run encodes only the
queries again.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any

import numpy as np

from ..data.target_queries import read_target_queries
from ..data.teacher import distill_dataset, route_queries, teacher_cache_path
from ..fusion import FusionConfig
from ..hybrid import HYBRID_FILE, _corpus_ids_texts
from ..modeling.loading import load_encoder
from ..modeling.precision import encoding_precision
from ..utils import native_bf16
from .checks import DISTILL_BATCH_SIZE
from .config import RecipeConfig
from .context import RecipeRun
from .outputs import stopped
from .plan import Plan
from .stage import Stage, run_arguments, settings

logger = logging.getLogger(__name__)


def pass_cap(rows: int, per_step: int, passes: float | None) -> int | None:
    """The most steps ``passes`` passes over ``rows`` training rows take at ``per_step`` rows a step (a last
    incomplete batch is dropped, as the stage's trainer does; at least 1); None when ``passes`` is None."""
    if passes is None:
        return None
    return max(1, math.floor(passes * (rows // per_step) + 1e-9))


def bf16_by_default(cfg: RecipeConfig) -> bool:
    """Whether the distillation trains under bf16 without being told: where the machine has native bf16 kernels
    (:func:`~hf_cocodr.utils.native_bf16`) and its options set neither ``bf16`` nor ``fp16``."""
    return native_bf16() and "bf16" not in cfg.distill and not cfg.distill.get("fp16")


class DistillStage(Stage):
    """Distillation of the hybrid teacher (the starting model + BM25) on the ``target_queries``: runs when target
    queries are given and ``skip_distill`` is false (the schedule's choice under ``auto``). It trains under bf16
    autocast where the machine has native bf16 kernels (:func:`bf16_by_default`), in fp32 elsewhere;
    ``distill: {bf16: ...}`` (or ``fp16: true``) decides instead. It trains the steps the plan gives it, but at most
    ``distill_max_passes`` passes over the queries (:meth:`steps`)."""

    name = "distill"
    share_option = "distill_share"
    reads_target_queries = True

    def enabled(self, cfg: RecipeConfig) -> bool:
        return cfg.skip_distill is False and bool(cfg.target_queries)

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        return cfg.distill_steps

    def fixed_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        # encoding the corpus (unless the teacher's indexes of it are cached) and ranking the queries
        return throughput.get("distill_teacher_s", 0.0)

    def planned_seconds(self, plan: Plan, step_s: float, load_s: float) -> float:
        return plan.steps_of(self.name) * step_s + (plan.throughput or {}).get("distill_teacher_s", 0.0)

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        cfg = run.cfg
        defaults = dict(
            **run_arguments(run, self.name, logging_steps=5, save_steps=50),
            per_device_train_batch_size=DISTILL_BATCH_SIZE,
            learning_rate=5e-5,  # docs/adaptation.md says why
            warmup_steps=0.1,
            idro_preset="uniform",
            dataloader_drop_last=True,
            max_length=cfg.train_max_length,
        )
        if bf16_by_default(cfg):  # where the machine computes bf16 natively (docs/precision.md)
            defaults["bf16"] = True
        return {**defaults, **cfg.distill}

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg = run.cfg
        return {
            "stage": self.name,
            "start": start,
            "teacher": {
                "model": run.fps["model"],
                "targets": run.fps["targets"],
                "dense_weight": cfg.distill_teacher_weight,
                "k": cfg.distill_k,
            },
            "queries": self._queries_digest(run),
            "loss": {
                "teacher_temperature": cfg.distill_teacher_temperature,
                "in_batch": cfg.distill_in_batch_weight,
                **({} if cfg.distill_document_gradients else {"document_gradients": False}),
            },
            "settings": settings(run.arguments[self.name]),
            "steps": self.steps(run),  # the plan's, or fewer where the cap on passes ends the stage first
        }

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Seconds of one distillation step (a batch of the stage's shape on target documents) and of ranking the
        queries with the teacher (the corpus too when its indexes are not cached)."""
        import torch

        from ..finetuning.losses.distill import HybridDistillLoss

        cfg, kw = run.cfg, run.arguments[self.name]
        routed = route_queries(cfg.target_queries, run.target_corpora)
        docs, teacher_docs, queries = [], 0, []
        for corpus, src in routed:
            doc_ids, texts = _corpus_ids_texts(corpus)
            docs += texts
            queries += src.texts
            if not (teacher_cache_path(run.fps["model"], doc_ids, texts) / HYBRID_FILE).is_file():
                teacher_docs += len(texts)  # the teacher's indexes of this corpus are to be built
        st = load_encoder(run.model)
        gen = np.random.default_rng(0)
        batch, k = int(kw["per_device_train_batch_size"]), int(cfg.distill_k)
        sample = [docs[i] for i in gen.choice(len(docs), batch * (k + 1), replace=len(docs) < batch * (k + 1))]
        out: dict[str, float] = {}
        # the teacher encodes the queries, and the documents of a corpus it has no cached indexes of, at the
        # model's own length
        st.encode_document(sample[:8], batch_size=8)  # warm-up
        t0 = time.perf_counter()
        st.encode_document(sample[:64], batch_size=64)
        per_doc = (time.perf_counter() - t0) / min(64, len(sample))
        asked = [queries[i] for i in gen.choice(len(queries), min(64, len(queries)), replace=False)]
        t0 = time.perf_counter()
        st.encode_query(asked, batch_size=64)
        per_query = (time.perf_counter() - t0) / len(asked)
        out["distill_teacher_s"] = round(per_doc * teacher_docs + per_query * len(queries), 2)
        loss = HybridDistillLoss(st, **self._loss_options(cfg, run.similarity))
        opt = torch.optim.AdamW([p for p in st.parameters() if p.requires_grad], lr=1e-8)
        labels = torch.as_tensor(gen.standard_normal((batch, k)), dtype=torch.float32)
        columns = [sample[:batch]] + [sample[batch * j : batch * (j + 1)] for j in range(1, k + 1)]
        st.train()

        def step() -> None:
            feats = [st.preprocess(c, max_length=kw["max_length"]) for c in columns]
            # in the precision the stage's Trainer runs its forward in, as the other stages are probed
            with encoding_precision(st, "bf16" if kw.get("bf16") else "fp32"):
                value = loss(feats, labels)
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # warm-up, then the median of 3 timed steps (as the other stages are probed)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out["distill_step_s"] = float(np.median(times))
        st.eval()
        return out

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ..finetuning import IDROTrainingArguments
        from ..finetuning.losses.distill import HybridDistillLoss
        from ..training_api import build_idro_trainer

        cfg, planned, steps = run.cfg, run.plan.steps_of(self.name), self.steps(run)
        t0 = time.perf_counter()
        rows, info = distill_dataset(
            run.model,
            run.fps["model"],
            run.target_corpora,
            cfg.target_queries,
            cfg.distill_k,
            fusion=self._fusion(cfg),
            batch_size=cfg.eval_batch_size,
        )
        logger.info(
            "distillation: %d training rows from the hybrid teacher (%s) in %.1f s",
            len(rows),
            "; ".join(f"{i['queries']} -> {i['corpus']}{' (cached)' if i['cached'] else ''}" for i in info),
            time.perf_counter() - t0,
        )
        model = load_encoder(run.current)
        args = IDROTrainingArguments(
            **{
                **run.arguments[self.name],
                "refresh_negatives_every_steps": 0,
                "max_steps": steps,
                "overwrite_output_dir": True,
            }
        )
        if steps < planned:
            logger.info(
                "distillation: %d steps, not the %d planned: at most %g passes over the %d target queries "
                "(distill_max_passes)",
                steps,
                planned,
                cfg.distill_max_passes,
                run.extras["distill_num_queries"],
            )
        loss = HybridDistillLoss(model, **self._loss_options(cfg, run.similarity))
        trainer = build_idro_trainer(model, args, rows, loss=loss, negatives_label="the hybrid teacher's candidates")
        trainer.extra_methods.append("hybrid-teacher distillation")
        trainer.target_queries_read += [i["queries"] for i in info]
        trainer.target_corpora_read += [i["corpus"] for i in info]
        guard = run.deadline(trainer, self.name)
        trainer.train(resume_from_checkpoint=True if run.resume else None)
        trainer.finalize()
        ended = stopped(guard)
        # the cap ended the stage: it had fewer steps than planned, and no deadline stopped it before them
        capped = {"capped_at_passes": cfg.distill_max_passes} if steps < planned and not ended else {}
        if trainer.state.global_step > steps:
            logger.warning(
                "distillation: resumed from a checkpoint at step %d, past the %d steps this run trains (it was "
                "started with other settings)",
                trainer.state.global_step,
                steps,
            )
        return {"steps": trainer.state.global_step, "rows": len(rows), "teacher": info, **capped, **ended}

    # ------------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _fusion(cfg: RecipeConfig):

        return FusionConfig(dense_weight=float(cfg.distill_teacher_weight))

    @staticmethod
    def _loss_options(cfg: RecipeConfig, similarity: str) -> dict[str, Any]:
        return {
            # the student's own scale: a cosine model was trained at temperature 0.05 (scale 20)
            "temperature": 0.05 if similarity == "cosine" else 1.0,
            "teacher_temperature": float(cfg.distill_teacher_temperature),
            "in_batch_weight": float(cfg.distill_in_batch_weight),
            "similarity": similarity,
            "document_gradients": bool(cfg.distill_document_gradients),
        }

    def _queries_digest(self, run: RecipeRun) -> str:
        """A digest of the target queries' texts (read once per run)."""
        self._read_queries(run)
        return run.extras["distill_queries"]

    def _read_queries(self, run: RecipeRun) -> None:
        if "distill_queries" not in run.extras:
            h, n = hashlib.sha256(), 0
            for spec in run.cfg.target_queries:
                for text in read_target_queries(spec).texts:
                    h.update(text.encode("utf-8", "surrogatepass") + b"\x1e")
                    n += 1
            run.extras["distill_queries"], run.extras["distill_num_queries"] = h.hexdigest()[:16], n

    def steps(self, run: RecipeRun) -> int:
        """The steps the stage trains: the plan's, but at most ``distill_max_passes`` passes over the target queries
        (:func:`pass_cap`) unless ``distill_steps`` fixes them."""
        planned, cap = run.plan.steps_of(self.name), self._cap(run)
        return planned if cap is None else min(planned, cap)

    def _cap(self, run: RecipeRun) -> int | None:
        if run.cfg.distill_steps is not None or run.cfg.distill_max_passes is None:  # fixed steps are yours
            return None
        if "distill_per_step" not in run.extras:  # queries a step: on every rank, every accumulated batch
            from ..finetuning import IDROTrainingArguments

            args = IDROTrainingArguments(**{**run.arguments[self.name], "max_steps": 1})
            run.extras["distill_per_step"] = (
                args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
            )
        self._read_queries(run)
        n = run.extras["distill_num_queries"]
        return pass_cap(n, run.extras["distill_per_step"], run.cfg.distill_max_passes)
