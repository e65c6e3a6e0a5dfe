"""The recipe's distillation stage (:class:`DistillStage`): the hybrid teacher's ranking distilled into the dense
model on unlabelled target queries.

The teacher is :class:`~hf_cocodr.retrieval.hybrid.HybridRetriever` of the *starting* model and BM25 over the target corpus
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import ConfigError
from ...modeling.loading import load_encoder
from ...utils import native_bf16
from ..checks import DISTILL_BATCH_SIZE
from ..outputs import stopped
from ..settings import AUTO, Auto, check_flag, check_number, check_switch, check_whole, option
from ..stage import Stage, run_arguments, trajectory

if TYPE_CHECKING:
    from ..config import RecipeConfig
    from ..context import RecipeRun
    from ..plan import Plan

logger = logging.getLogger("hf_cocodr.recipe.distill")

# the distillation's default cap on passes over the target queries (docs/adaptation.md says why)
DISTILL_MAX_PASSES = 3.0
MAX_DISTILL_K = 64  # the candidates are the rows' document columns


@dataclass
class DistillSettings:
    """The distillation's options (``distill_*``, ``skip_distill`` and the ``distill`` mapping of
    ``IDROTrainingArguments`` fields)."""

    training_options: ClassVar[str] = "distill"
    length_options: ClassVar[tuple[str, ...]] = ("max_length",)  # the token lengths among its training arguments

    skip_distill: bool | Auto = option(
        AUTO,
        "leave the distill stage out (true), run it when --target-queries are given (false), or as the schedule "
        "says (auto)",
    )
    distill_steps: int | None = option(None, "steps of the distillation (default: planned, or 500)")
    distill_share: float | Auto = option(AUTO, "the distillation's share of the training budget")
    distill_k: int = option(8, "distillation: the teacher's candidates per query (its top-k)")
    distill_teacher_weight: float = option(
        0.5, "distillation: the dense weight of the teacher's fusion (1: the starting model alone, 0: BM25 alone)"
    )
    distill_teacher_temperature: float = option(
        1.0, "distillation: temperature of the teacher's (z-normalised, fused) scores"
    )
    distill_in_batch_weight: float = option(
        1.0, "distillation: weight of the in-batch contrastive term on the teacher's first candidate (0: off)"
    )
    distill_document_gradients: bool = option(
        True,
        "distillation: encode the candidates without back-propagating through them (a forward pass only: cheaper "
        "steps; the queries' side of the loss trains the model)",
    )
    distill_max_passes: float | None = option(
        DISTILL_MAX_PASSES,
        "distillation: at most this many passes over the target queries, however many steps the budget buys "
        "('none': no cap; --distill-steps fixes the steps instead)",
    )
    distill: dict[str, Any] = option(
        help="IDROTrainingArguments fields of the distillation", cli=False, default_factory=dict
    )

    @staticmethod
    def arguments_class() -> type:
        from ...finetuning import IDROTrainingArguments

        return IDROTrainingArguments

    def check(self) -> None:
        """Refuse out-of-range distillation options by name."""
        check_number(self, "distill_share", 0, 1)
        check_number(self, "distill_teacher_weight", 0, 1, allow_auto=False)
        check_number(self, "distill_teacher_temperature", 1e-3, 100, allow_auto=False)
        check_number(self, "distill_in_batch_weight", 0, 100, allow_auto=False)
        check_number(self, "distill_max_passes", 0.01, 1000, allow_auto=False, allow_none=True)
        check_whole(self, "distill_steps", 1, hint="; to leave the stage out set skip_distill: true")
        check_whole(self, "distill_k", 2, allow_none=False)
        if self.distill_k > MAX_DISTILL_K:  # the candidates are the rows' document columns (negative_1 ...)
            raise ConfigError(f"recipe option distill_k must be at most {MAX_DISTILL_K}, got {self.distill_k!r}")
        check_flag(self, "distill_document_gradients")
        check_switch(self, "skip_distill")


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
    ``distill_max_passes`` passes over the queries (:meth:`steps`). Besides its steps it costs the teacher's
    rankings (encoding the corpus unless the teacher's indexes of it are cached, and the queries)."""

    name = "distill"
    title = "distillation"
    settings = DistillSettings
    share_option = "distill_share"
    reads_target_queries = True

    def __init__(self) -> None:
        self.queries_digest: str | None = None  # the target queries' texts, read once per run
        self.num_queries = 0
        self.per_step: int | None = None  # queries a step: on every rank, every accumulated batch
        self.targets: list | None = None  # the routed target corpora and queries, as the probe reads them

    def enabled(self, cfg: RecipeConfig) -> bool:
        return cfg.skip_distill is False and bool(cfg.target_queries)

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
            "settings": trajectory(run.arguments[self.name]),
            "steps": self.steps(run),  # the plan's, or fewer where the cap on passes ends the stage first
        }

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Seconds of one distillation step (the stage's trainer on rows of its shape: target queries and
        documents, see :meth:`Stage.probe`) and of ranking the queries with the teacher (the corpus too when its
        indexes are not cached), measured on the probe trainer's model."""
        from ...retrieval.hybrid import HYBRID_FILE
        from ...retrieval.teacher import teacher_cache_path
        from ..probe import time_trainer_steps

        step_s, trainer = time_trainer_steps(self, run)
        st, teacher_docs, queries, docs = trainer.model, 0, [], []
        for doc_ids, texts, asked in self._targets(run):
            docs += texts[:64]
            queries += asked
            if not (teacher_cache_path(run.fps["model"], doc_ids, texts) / HYBRID_FILE).is_file():
                teacher_docs += len(texts)  # the teacher's indexes of this corpus are to be built
        st.eval()
        # the teacher encodes the queries, and the documents of a corpus it has no cached indexes of, at the model's
        # own length
        st.encode_document(docs[:8], batch_size=8)  # warm-up
        t0 = time.perf_counter()
        st.encode_document(docs[:64], batch_size=64)
        per_doc = (time.perf_counter() - t0) / min(64, len(docs))
        asked = queries[:64]
        t0 = time.perf_counter()
        st.encode_query(asked, batch_size=64)
        per_query = (time.perf_counter() - t0) / len(asked)
        return {
            "distill_step_s": step_s,
            "distill_teacher_s": round(per_doc * teacher_docs + per_query * len(queries), 2),
        }

    def build_trainer(
        self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False, rows=None, info=()
    ):
        """The stage's :class:`~hf_cocodr.finetuning.DistillationTrainer`: ``run.current`` learns
        :class:`~hf_cocodr.finetuning.losses.HybridDistillLoss` on ``rows`` (the teacher's, ``info`` naming their
        queries and corpora; in a probe, rows of their shape drawn from the target queries and documents with random
        teacher scores, since the teacher's rankings are not computed yet)."""
        from ...finetuning import DistillationTrainer, DistillationTrainingArguments
        from ...finetuning.losses.distill import HybridDistillLoss

        if rows is None:
            rows = self._probe_rows(run, max_steps)
        args = self.training_arguments(
            run, DistillationTrainingArguments, max_steps, output_dir=output_dir, probe=probe
        )
        model = load_encoder(run.current)
        return DistillationTrainer(
            model=model,
            args=args,
            train_dataset=rows,
            loss=HybridDistillLoss(model, **self._loss_options(run.cfg, run.similarity)),
            card_methods=["hybrid-teacher distillation"],
            negatives_label="the hybrid teacher's candidates",
            target_queries_read=[i["queries"] for i in info],
            target_corpora_read=[i["corpus"] for i in info],
        )

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ...retrieval.teacher import distill_dataset

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
        if steps < planned:
            logger.info(
                "distillation: %d steps, not the %d planned: at most %g passes over the %d target queries "
                "(distill_max_passes)",
                steps,
                planned,
                cfg.distill_max_passes,
                self.num_queries,
            )
        trainer = self.build_trainer(run, steps, rows=rows, info=info)
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
    def _targets(self, run: RecipeRun) -> list[tuple[list[str], list[str], list[str]]]:
        """``(doc_ids, texts, queries)`` of each target corpus the queries are routed to, read once per run (the
        probe's rows and its timing of the teacher both use them)."""
        from ...data.teacher import route_queries
        from ...retrieval.hybrid import _corpus_ids_texts

        if self.targets is None:
            self.targets = [
                (*_corpus_ids_texts(corpus), list(src.texts))
                for corpus, src in route_queries(run.cfg.target_queries, run.target_corpora)
            ]
        return self.targets

    def _probe_rows(self, run: RecipeRun, steps: int):
        """Rows of the training rows' shape for ``steps`` steps: target queries, target documents drawn at random
        as their candidates, random teacher scores (a probe times the step, not what it learns)."""
        import numpy as np

        from ...data.teacher import teacher_rows

        docs: dict[str, str] = {}
        queries: list[str] = []
        for ids, texts, asked in self._targets(run):
            docs.update(zip(ids, texts))
            queries += asked
        gen, k = np.random.default_rng(0), int(run.cfg.distill_k)
        n = steps * int(run.arguments[self.name]["per_device_train_batch_size"])
        asked = [queries[i] for i in gen.choice(len(queries), n, replace=len(queries) < n)]
        doc_ids = list(docs)

        class _Random:
            def search(self, chunk, kk):
                picks = [[doc_ids[i] for i in gen.choice(len(doc_ids), kk, replace=len(doc_ids) < kk)] for _ in chunk]
                return picks, gen.standard_normal((len(chunk), kk)).tolist()

        return teacher_rows(_Random(), asked, docs, k)

    @staticmethod
    def _fusion(cfg: RecipeConfig):
        from ...retrieval.fusion import FusionConfig

        # z-scores of BM25's hits alone: the teacher the stage's identity has always named (bm25_zeros came later)
        return FusionConfig(dense_weight=float(cfg.distill_teacher_weight), normalize="z", bm25_zeros=False)

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
        return self.queries_digest

    def _read_queries(self, run: RecipeRun) -> None:
        from ...data.target_queries import read_target_queries

        if self.queries_digest is None:
            h, n = hashlib.sha256(), 0
            for spec in run.cfg.target_queries:
                for text in read_target_queries(spec).texts:
                    h.update(text.encode("utf-8", "surrogatepass") + b"\x1e")
                    n += 1
            self.queries_digest, self.num_queries = h.hexdigest()[:16], n

    def steps(self, run: RecipeRun) -> int:
        """The steps the stage trains: the plan's, but at most ``distill_max_passes`` passes over the target queries
        (:func:`pass_cap`) unless ``distill_steps`` fixes them."""
        planned, cap = run.plan.steps_of(self.name), self._cap(run)
        return planned if cap is None else min(planned, cap)

    def _cap(self, run: RecipeRun) -> int | None:
        if run.cfg.distill_steps is not None or run.cfg.distill_max_passes is None:  # fixed steps are yours
            return None
        if self.per_step is None:  # queries a step: on every rank, every accumulated batch
            from ...finetuning import DistillationTrainingArguments

            args = DistillationTrainingArguments.from_arguments(run.arguments[self.name], max_steps=1)
            self.per_step = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
        self._read_queries(run)
        return pass_cap(self.num_queries, self.per_step, run.cfg.distill_max_passes)
