"""The recipe's stages: COCO (one run or a soup of runs), fine-tuning on the source task, target pseudo pairs,
distillation of the hybrid teacher (:mod:`hf_cocodr.recipe.distill`) and WiSE-FT, and :data:`STAGES`, their order.

The runner goes through the stages in order; each starts from the model the stage before it wrote (``run.current``)
and writes into ``OUT/<name>``, with a completion marker (``hf_cocodr_stage.json``) once it finished. A new stage is
a :class:`~hf_cocodr.recipe.stage.Stage` subclass plus one entry in :data:`STAGES` (or in the ``stages`` argument
of :func:`~hf_cocodr.recipe.run_recipe`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..methods import method_target_queries
from ..methods.joint import JointPseudoPairs, TargetPairsObjective
from ..modeling.loading import load_encoder
from ..run_record import digest
from .config import Auto, RecipeConfig, is_joint, uses_wise
from .context import RecipeRun
from .distill import DistillStage
from .outputs import read_marker, save_weight_history, stopped, write_marker, write_soup, write_wise
from .plan import Plan
from .stage import UNBUDGETED_STEPS, Stage, run_arguments, settings, source_identity

logger = logging.getLogger(__name__)

# The share of COCO's steps a fresh MLM head (a model without one) trains before MLM gradients reach the encoder.
MLM_HEAD_WARMUP_SHARE = 0.3


class CocoStage(Stage):
    """COCO continuous contrastive pretraining on the target corpora (and the source corpus), one run or a soup of
    ``coco_runs`` runs with seeds ``seed``, ``seed + 1``, ... whose weights are averaged (``OUT/coco-runs``)."""

    name = "coco"
    share_option = "coco_share"

    def enabled(self, cfg: RecipeConfig) -> bool:
        return not cfg.skip_coco

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        return cfg.coco_steps

    def unbudgeted_steps(self, cfg: RecipeConfig) -> int:
        soup = cfg.coco_runs == Auto.BUDGET
        steps = cfg.coco_steps if cfg.coco_steps or not soup else cfg.coco_run_steps
        return 0 if cfg.skip_coco else (UNBUDGETED_STEPS if steps is None else steps)

    def allot(self, plan: Plan, seconds: float, step_s: float, cfg: RecipeConfig, load_s: float) -> None:
        super().allot(plan, seconds, step_s, cfg, load_s)
        runs, steps = self.runs_for(seconds, step_s, cfg, cfg.coco_steps, load_s)
        plan.coco_runs = runs
        if steps is not None:
            plan.steps[self.name] = steps

    @staticmethod
    def runs_for(
        coco_s: float, step_s: float, cfg: RecipeConfig, given_steps: int | None, load_s: float
    ) -> tuple[int, int | None]:
        """``(runs, steps of each run)`` for ``coco_s`` seconds of COCO (steps None: as planned for one run); see
        :func:`~hf_cocodr.recipe.coco_runs_for`."""
        step_s = max(step_s, 1e-9)
        if cfg.coco_runs == Auto.BUDGET:
            per_run = (given_steps or cfg.coco_run_steps) * step_s + load_s
            runs = max(1, round((coco_s + load_s) / per_run))
        else:
            runs = int(cfg.coco_runs)
        if given_steps is not None:
            return runs, given_steps
        if runs == 1:
            return 1, None
        return runs, max(2, int((coco_s - (runs - 1) * load_s) / (runs * step_s)))

    def optimizer_seconds(self, plan: Plan, step_s: float) -> float:
        return plan.steps_of(self.name) * step_s * plan.coco_runs

    def planned_seconds(self, plan: Plan, step_s: float, load_s: float) -> float:
        return plan.steps_of(self.name) * step_s * plan.coco_runs + (plan.coco_runs - 1) * load_s

    def load_exports(self, cfg: RecipeConfig) -> int:
        return int(not cfg.skip_coco)

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        cfg, similarity = run.cfg, run.similarity
        coco = dict(
            **run_arguments(run, self.name, logging_steps=10, save_steps=100),
            per_device_train_batch_size=32,
            pooling=run.pooling,
            contrastive_similarity=similarity,
            contrastive_temperature=0.05 if similarity == "cosine" else 1.0,
            learning_rate=float(cfg.coco_learning_rate),
            mlm_weight=float(cfg.coco_mlm_weight),
            head_mlm_weight=float(cfg.coco_mlm_weight),
            max_span_length=min(64, cfg.train_max_length),
        )
        return {**coco, **cfg.coco}

    def needs(self, run: RecipeRun) -> set[str]:
        if run.cfg.skip_coco or run.done(self.name):
            return set()
        return {"spans", "source"} if run.cfg.include_source_corpus else {"spans"}

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg, runs = run.cfg, int(run.plan.coco_runs)
        return {
            "stage": "coco",
            "start": start,
            "targets": run.fps["targets"],
            "source": source_identity(run) if cfg.include_source_corpus else None,
            "settings": settings(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
            **({"runs": runs} if runs > 1 else {}),
        }

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        runs, stage_dir = int(run.plan.coco_runs), run.dir(self.name)
        if runs == 1:
            return self._run(run, stage_dir, run.cfg.seed, run.deadlines.get(self.name))
        # A soup: `runs` COCO runs from the starting model with seeds seed, seed + 1, ..., each in its own folder
        # (resumable, skipped once finished), then the uniform average of their weights is the stage's model.
        run_dirs, markers = [], []
        for i in range(runs):
            run_dir, identity = run.out / "coco-runs" / f"run-{i}", digest({"coco": run.ids[self.name], "run": i})
            marker = read_marker(run_dir, identity)
            if marker is None:
                run.log_rerun(run_dir)
                end = run.deadlines.get(self.name)
                # each run ends early enough to leave the runs after it their planned seconds
                marker = self._run(
                    run,
                    run_dir,
                    run.cfg.seed + i,
                    None if end is None else end - (runs - 1 - i) * run.coco_run_seconds,
                )
                marker = {**marker, "identity": identity}
                write_marker(run_dir, marker)
            else:
                logger.info("COCO run %d of %d: already finished (%s), skipped", i + 1, runs, run_dir)
            run_dirs.append(run_dir)
            markers.append(marker)
        write_soup(run_dirs, stage_dir, [run.cfg.seed + i for i in range(runs)])
        stops = [m["stopped_by_deadline_at_step"] for m in markers if "stopped_by_deadline_at_step" in m]
        run_steps = [m["steps"] for m in markers]
        return {
            "steps": min(run_steps),
            "run_steps": run_steps,
            **({"stopped_by_deadline_at_step": min(stops)} if stops else {}),
        }

    def _run(self, run: RecipeRun, run_dir: Path, seed: int, end: float | None) -> dict[str, Any]:
        """One COCO run from the starting model into ``run_dir`` (ending by the clock reading ``end`` if given);
        returns its marker (steps trained, and the step a deadline stopped it at)."""
        from ..pretraining import CocoPretrainer, CocoPretrainingArguments

        steps = run.plan.steps_of(self.name)
        kw = {
            **run.arguments[self.name],
            "output_dir": str(run_dir),
            "seed": seed,
            "max_steps": steps,
            "overwrite_output_dir": True,
        }
        if (
            run.has_mlm is not True
            and "mlm_head_warmup_steps" not in run.cfg.coco
            and CocoPretrainingArguments(**{**kw, "max_steps": 1}).uses_mlm
        ):
            kw["mlm_head_warmup_steps"] = int(MLM_HEAD_WARMUP_SHARE * steps)
            logger.info(
                "the starting model has no MLM head (or it could not be inspected): its head is warmed up "
                "for %d steps before MLM gradients reach the encoder",
                kw["mlm_head_warmup_steps"],
            )
        trainer = CocoPretrainer(run.model, CocoPretrainingArguments(**kw), corpora=run.coco_corpora)
        guard = run.deadline(trainer, self.name, end)
        trainer.train(resume_from_checkpoint=True if run.resume else None)
        trainer.finalize()
        return {"steps": trainer.state.global_step, "seed": seed, **stopped(guard)}


def refresh_interval(steps: int, refreshes: int) -> int:
    """The ``refresh_negatives_every_steps`` that gives at most ``refreshes`` refreshes in ``steps`` steps, evenly
    spaced (0: none). The refresh runs after every multiple of the interval below ``steps``, so the interval is
    rounded up: rounded down, 467 steps with one planned refresh would refresh at steps 233 and 466."""
    if not refreshes or steps < 2:
        return 0
    return max(1, -(-steps // (refreshes + 1)))


def _finetune_defaults(run: RecipeRun) -> dict[str, Any]:
    """The recipe's fine-tuning arguments (before the user's ``finetune`` / ``target`` options)."""
    cfg, similarity = run.cfg, run.similarity
    return dict(
        **run_arguments(run, "finetune", logging_steps=5, save_steps=50),
        per_device_train_batch_size=32,
        num_clusters=50,
        learning_rate=2e-5,
        idro_scale=20.0 if similarity == "cosine" else 1.0,
        num_negatives=1,
        dataloader_drop_last=True,
        warmup_steps=0.1,
        max_length=cfg.train_max_length,
        idro_preset=str(cfg.finetune_preset),
        # tau sets how fast the cluster weights move; the gradient inner products scale with the
        # similarity (cosine x 20 vs raw dot products)
        idro_tau=100.0 if similarity == "cosine" else 3000.0,
    )


def _train_idro(
    run: RecipeRun,
    stage: str,
    args,
    data,
    *,
    methods=(),
    target_corpora=(),
    negatives_label: str = "bm25",
    target_queries=(),
    joint=None,
    deadline: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``run.current`` on ``data`` into ``OUT/<stage>``; returns the stage's marker content."""
    from ..training_api import build_idro_trainer

    trainer = build_idro_trainer(
        load_encoder(run.current),
        args,
        data,
        methods=methods,
        target_corpora=target_corpora,
        negatives_label=negatives_label,
        target_queries=target_queries,
        # joint schedule: target pseudo pairs as a term of every step
        extra_methods=[JointPseudoPairs(joint)] if joint is not None else [],
    )
    guard = deadline(trainer) if deadline is not None else None
    trainer.train(resume_from_checkpoint=True if run.resume else None)
    trainer.finalize()
    save_weight_history(trainer, run.dir(stage))
    return {"steps": trainer.state.global_step, **stopped(guard)}


class FinetuneStage(Stage):
    """Fine-tuning on the labelled source task (iDRO and the methods asked for), with the target pseudo pairs as a
    term of every step under the joint schedule."""

    name = "finetune"
    share_option = "finetune_share"

    def enabled(self, cfg: RecipeConfig) -> bool:
        return not cfg.skip_finetune

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        return cfg.finetune_steps

    def share(self, cfg: RecipeConfig) -> float:  # the joint pairs train inside these steps: their share too
        return float(float(cfg.finetune_share) + (float(cfg.target_share) if is_joint(cfg) else 0.0))

    def step_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        return throughput.get("finetune_step_s", 0.0) + (
            throughput.get("target_step_s", 0.0) if is_joint(cfg) else 0.0
        )

    def planned_seconds(self, plan: Plan, step_s: float, load_s: float) -> float:
        seconds = plan.steps_of(self.name) * step_s
        if plan.steps_of(self.name):  # its refreshes and the first K-Means
            seconds += plan.refreshes * (plan.refresh_seconds_each or 0.0) + (plan.kmeans_seconds or 0.0)
        return seconds

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        return {**_finetune_defaults(run), **run.cfg.finetune}

    def needs(self, run: RecipeRun) -> set[str]:
        if run.cfg.skip_finetune or run.done(self.name):
            return set()
        return {"source", "target_pairs"} if is_joint(run.cfg) else {"source"}

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg, fps = run.cfg, run.fps
        joint = (
            {
                "pairs": cfg.target_pairs,
                "weight": cfg.joint_weight,
                "targets": fps["targets"],
                "settings": settings(run.arguments["target"]),
            }
            if is_joint(cfg)
            else None
        )
        return {
            "stage": "finetune",
            "start": start,
            "source": source_identity(run),
            "settings": settings(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
            "refreshes": run.plan.refreshes,
            "methods": list(cfg.methods),
            "targets": fps["targets"] if cfg.methods else None,
            "target_queries": method_target_queries(cfg.methods, cfg.target_queries),
            "joint": joint,
        }

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ..finetuning import IDROTrainingArguments

        cfg, steps, refreshes = run.cfg, run.plan.steps_of(self.name), run.plan.refreshes
        every = refresh_interval(steps, refreshes)
        args = IDROTrainingArguments(
            **{
                "refresh_negatives_every_steps": every,
                **run.arguments[self.name],
                "max_steps": steps,
                "overwrite_output_dir": True,
            }
        )
        joint = None
        if is_joint(cfg):
            kw = run.arguments["target"]
            joint = TargetPairsObjective(
                run.target_data,
                cfg.joint_weight,
                batch_size=kw["per_device_train_batch_size"],
                num_negatives=kw["num_negatives"],
                similarity=run.similarity,
                scale=kw["idro_scale"],
                max_length=kw["max_length"],
                seed=cfg.seed,
            )
        return _train_idro(
            run,
            self.name,
            args,
            run.train_data,
            methods=run.methods,
            target_corpora=list(run.target_corpora),
            negatives_label="bm25",
            target_queries=method_target_queries(cfg.methods, cfg.target_queries),
            joint=joint,
            deadline=lambda t: run.deadline(t, self.name),
        )


class TargetPairsStage(Stage):
    """Fine-tuning on pseudo pairs of the target corpora (a title or one sentence against the rest of its
    document, BM25 negatives from the target corpus), after the source fine-tuning (the sequential schedule)."""

    name = "target"
    share_option = "target_share"

    def enabled(self, cfg: RecipeConfig) -> bool:
        return cfg.target_pairs != "none" and not is_joint(cfg)

    def fixed_steps(self, cfg: RecipeConfig) -> int | None:
        return cfg.target_steps

    def step_seconds(self, throughput: dict[str, float], cfg: RecipeConfig) -> float:
        return 0.0 if is_joint(cfg) else throughput.get("target_step_s", 0.0)

    def unbudgeted_steps(self, cfg: RecipeConfig) -> int:  # (a joint plan's target steps go unused)
        return (
            0 if cfg.target_pairs == "none" else (UNBUDGETED_STEPS if cfg.target_steps is None else cfg.target_steps)
        )

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        # Pseudo pairs have no query types to rebalance: plain contrastive loss, BM25 negatives from the target corpus
        target = {**_finetune_defaults(run), "output_dir": str(run.dir(self.name)), "idro_preset": "uniform"}
        return {**target, **run.cfg.target}

    def needs(self, run: RecipeRun) -> set[str]:
        return {"target_pairs"} if self.enabled(run.cfg) and not run.done(self.name) else set()

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg = run.cfg
        return {
            "stage": "target",
            "start": start,
            "targets": run.fps["targets"],
            "pairs": cfg.target_pairs,
            "seed": cfg.seed,
            "settings": settings(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
        }

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ..finetuning import IDROTrainingArguments

        args = IDROTrainingArguments(
            **{
                "refresh_negatives_every_steps": 0,
                **run.arguments[self.name],
                "max_steps": run.plan.steps_of(self.name),
                "overwrite_output_dir": True,
            }
        )
        return _train_idro(
            run,
            self.name,
            args,
            run.target_data,
            negatives_label="bm25 (within the target corpora)",
            deadline=lambda t: run.deadline(t, self.name),
        )


class WiseStage(Stage):
    """WiSE-FT: the weights ``(1 − α)·θ_start + α·θ_adapted`` of the starting and the adapted model."""

    name = "wise"
    trains = False

    def enabled(self, cfg: RecipeConfig) -> bool:
        return uses_wise(cfg)

    def should_run(self, run: RecipeRun) -> bool:
        return self.planned(run) and run.current != run.model  # nothing adapted: nothing to interpolate

    def load_exports(self, cfg: RecipeConfig) -> int:
        return int(uses_wise(cfg))

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        return {"stage": "wise", "start": run.fps["model"], "adapted": start, "alpha": run.cfg.wise_alpha}

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        write_wise(run.model, run.current, run.dir(self.name), float(run.cfg.wise_alpha), run.ids[self.name])
        return None  # the marker is written with the model, in one atomic step


# The recipe's stages, in order. A new stage: a Stage subclass and one line here.
STAGES: tuple[Stage, ...] = (CocoStage(), FinetuneStage(), TargetPairsStage(), DistillStage(), WiseStage())


def stage_switches(cfg: RecipeConfig, stages: tuple[Stage, ...] = STAGES) -> dict[str, tuple[bool, int | None]]:
    """Whether each training stage runs, and its fixed step count (None: planned from the budget). In the joint
    schedule the target pairs train inside the source steps, so the target stage does not run on its own."""
    return {s.name: (s.enabled(cfg), s.fixed_steps(cfg)) for s in stages if s.trains}


def stage_step_seconds(
    tp: dict[str, float], cfg: RecipeConfig, stages: tuple[Stage, ...] = STAGES
) -> dict[str, float]:
    """Measured seconds of one optimizer step of each training stage. In the joint schedule the target pairs are a
    term of every source step, so their cost goes to that stage (and the target stage has no steps of its own)."""
    return {s.name: s.step_seconds(tp, cfg) for s in stages if s.trains}
