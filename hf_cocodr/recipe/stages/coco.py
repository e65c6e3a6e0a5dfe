"""The COCO stage: continuous contrastive pretraining on the target corpora (and the source corpus), one run or a
soup of runs whose weights are averaged. Its settings (:class:`CocoSettings`) are recipe options."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ...rundir.run_record import digest
from ..outputs import read_marker, write_marker, write_soup
from ..settings import (
    AUTO,
    Auto,
    check_flag,
    check_number,
    check_switch,
    check_whole,
    device_batch_size,
    gpu_bf16_default,
    option,
)
from ..stage import Cost, Stage, run_arguments, source_identity, split_runs, trajectory, unbudgeted_steps

if TYPE_CHECKING:
    from ..config import RecipeConfig
    from ..context import RecipeRun
    from ..plan import Plan

logger = logging.getLogger("hf_cocodr.recipe")

COCO_BATCH_SIZE, COCO_GPU_BATCH_CAP = 32, 128  # documents a step on a CPU, and at most on a GPU (device_batch_size)
# The share of COCO's steps a fresh MLM head (a model without one) trains before MLM gradients reach the encoder.
MLM_HEAD_WARMUP_SHARE = 0.3
NO_BUDGET_COCO_RUNS = 3  # coco_runs "budget" without a budget: this many runs of coco_run_steps steps


@dataclass
class CocoSettings:
    """The COCO stage's options (``coco_*``, ``skip_coco``, ``include_source_corpus`` and the ``coco`` mapping of
    ``CocoPretrainingArguments`` fields)."""

    training_options: ClassVar[str] = "coco"
    length_options: ClassVar[tuple[str, ...]] = ("max_span_length",)  # the token lengths among its training arguments

    include_source_corpus: bool = option(True, "do not also train COCO on the (restricted) source corpus")
    coco_steps: int | None = option(None, "steps of each COCO run (default: planned from --max-minutes, or 500)")
    coco_mlm_weight: float | Auto = option(AUTO, "weight of COCO's MLM terms; 0 = contrast-only (no MLM forward)")
    coco_learning_rate: float | Auto = option(AUTO, "COCO learning rate", flag="--coco-lr")
    coco_runs: int | Auto = option(
        AUTO,
        "COCO runs (seeds seed, seed+1, ...) averaged into one encoder, a model soup; "
        "'budget': as many runs of about --coco-run-steps steps as the budget affords",
    )
    coco_run_steps: int = option(76, "with --coco-runs budget: the length of one run")
    coco_share: float | Auto = option(
        AUTO, "COCO's share of the training budget (renormalised over the stages that run)"
    )
    skip_coco: bool | Auto = option(
        AUTO, "leave the coco stage out (true), run it (false), or as the schedule says (auto)"
    )
    coco: dict[str, Any] = option(
        help="CocoPretrainingArguments fields of the COCO stage", cli=False, default_factory=dict
    )

    @staticmethod
    def arguments_class() -> type:
        from ...pretraining import CocoPretrainingArguments

        return CocoPretrainingArguments

    def check(self) -> None:
        """Refuse out-of-range COCO options by name."""
        check_number(self, "coco_mlm_weight", 0, 100)
        check_number(self, "coco_learning_rate", 1e-8, 1)
        check_number(self, "coco_share", 0, 1)
        check_whole(self, "coco_steps", 1, hint="; to leave the stage out set skip_coco: true")
        check_whole(self, "coco_run_steps", 1, allow_none=False)
        if self.coco_runs not in (Auto.AUTO, Auto.BUDGET):
            check_whole(self, "coco_runs", 1, allow_none=False, hint=" (or auto / budget)")
        check_flag(self, "include_source_corpus")
        check_switch(self, "skip_coco")


class CocoStage(Stage):
    """COCO continuous contrastive pretraining on the target corpora (and the source corpus), one run or a soup of
    ``coco_runs`` runs with seeds ``seed``, ``seed + 1``, ... whose weights are averaged (``OUT/coco-runs``)."""

    name = "coco"
    title = "COCO"
    settings = CocoSettings
    share_option = "coco_share"
    reads = {"source": "include_source_corpus"}  # the (restricted) source corpus, where it is included
    entries = ("coco-runs",)  # a soup's runs

    def enabled(self, cfg: RecipeConfig) -> bool:
        return not cfg.skip_coco

    def cost(
        self,
        throughput: dict[str, float],
        cfg: RecipeConfig,
        *,
        budget_s: float | None = None,
        plan: Plan | None = None,
        **sizes: Any,
    ) -> Cost:
        """Its steps in ``coco_runs`` runs (``"budget"``: as many runs of about ``coco_run_steps`` steps as its
        seconds afford, :data:`NO_BUDGET_COCO_RUNS` without a budget), and a model load + export when it runs."""
        cost = super().cost(throughput, cfg, budget_s=budget_s, plan=plan)
        soup = cfg.coco_runs == Auto.BUDGET
        if budget_s is None and plan is None:  # no budget: a soup's runs are coco_run_steps long
            runs = NO_BUDGET_COCO_RUNS if soup else int(cfg.coco_runs)
            steps = cfg.coco_steps if cfg.coco_steps or not soup else cfg.coco_run_steps
            cost.steps = unbudgeted_steps(not cfg.skip_coco, steps)
        else:
            runs = plan.runs_of(self.name) if plan is not None else None if soup else int(cfg.coco_runs)
        cost.runs, cost.run_steps, cost.loads = runs, cfg.coco_run_steps, int(self.enabled(cfg))
        # (a plan records the runs the budget gives a running COCO; 1 otherwise)
        cost.plan = {"coco_runs": runs if budget_s is None and plan is None else 1}
        return cost

    @staticmethod
    def runs_for(
        coco_s: float, step_s: float, cfg: RecipeConfig, given_steps: int | None, load_s: float
    ) -> tuple[int, int | None]:
        """``(runs, steps of each run)`` for ``coco_s`` seconds of COCO (steps None: as planned for one run), as the
        planner shares them (:func:`~hf_cocodr.recipe.stage.split_runs`): ``coco_runs: "budget"``: as many runs
        of about ``coco_run_steps`` steps (``coco_steps`` when given) as fit; a whole number of runs shares the
        seconds between that many. Every run after the first costs a model load + export (``load_s``)."""
        runs = None if cfg.coco_runs == Auto.BUDGET else int(cfg.coco_runs)
        return split_runs(coco_s, step_s, runs, cfg.coco_run_steps, given_steps, load_s)

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        cfg, similarity = run.cfg, run.similarity
        coco = dict(
            **run_arguments(run, self.name, logging_steps=10, save_steps=100),
            per_device_train_batch_size=device_batch_size(COCO_BATCH_SIZE, COCO_GPU_BATCH_CAP),
            pooling=run.pooling,
            contrastive_similarity=similarity,
            contrastive_temperature=0.05 if similarity == "cosine" else 1.0,
            learning_rate=float(cfg.coco_learning_rate),
            mlm_weight=float(cfg.coco_mlm_weight),
            head_mlm_weight=float(cfg.coco_mlm_weight),
            max_span_length=min(64, cfg.train_max_length),
        )
        return {**coco, **gpu_bf16_default(cfg.coco), **cfg.coco}  # bf16 on a GPU with native bf16

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg, runs = run.cfg, run.plan.runs_of(self.name)
        return {
            "stage": "coco",
            "start": start,
            "targets": run.fps["targets"],
            "source": source_identity(run) if cfg.include_source_corpus else None,
            "settings": trajectory(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
            **({"runs": runs} if runs > 1 else {}),
        }

    def build_trainer(self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False, seed=None):
        """A :class:`~hf_cocodr.pretraining.CocoPretrainer` from the starting model on ``run.coco_corpora`` (the
        span corpus is built as the trainer's arguments say, and cached); ``seed``: a soup run's seed."""
        from ...pretraining import CocoPretrainer, CocoPretrainingArguments

        forced = {"seed": run.cfg.seed if seed is None else seed}
        args = self.training_arguments(
            run, CocoPretrainingArguments, max_steps, output_dir=output_dir, probe=probe, forced=forced
        )
        if run.has_mlm is not True and "mlm_head_warmup_steps" not in run.cfg.coco and args.uses_mlm:
            forced["mlm_head_warmup_steps"] = int(MLM_HEAD_WARMUP_SHARE * max_steps)
            args = self.training_arguments(
                run, CocoPretrainingArguments, max_steps, output_dir=output_dir, probe=probe, forced=forced
            )
            if not probe:
                logger.info(
                    "the starting model has no MLM head (or it could not be inspected): its head is warmed up "
                    "for %d steps before MLM gradients reach the encoder",
                    args.mlm_head_warmup_steps,
                )
        return CocoPretrainer(run.model, args, corpora=run.coco_corpora)

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        """One run (the default :meth:`~hf_cocodr.recipe.Stage.train`), or a soup of the plan's runs."""
        runs, stage_dir = run.plan.runs_of(self.name), run.dir(self.name)
        if runs == 1:
            return {**super().train(run), "seed": run.cfg.seed}
        # A soup: `runs` COCO runs from the starting model with seeds seed, seed + 1, ..., each in its own folder
        # (resumable, skipped once finished), then the uniform average of their weights is the stage's model.
        run_dirs, markers = [], []
        # planned seconds of one run (its steps and its load + export): each run ends early enough to leave the runs
        # after it theirs
        step_s = self.cost(run.plan.throughput or {}, run.cfg, plan=run.plan).step_s
        from ...distributed import is_main

        run_s = run.plan.steps_of(self.name) * step_s + run.load_s
        for i in range(runs):
            run_dir, identity = run.out / "coco-runs" / f"run-{i}", digest({"coco": run.ids[self.name], "run": i})
            marker = read_marker(run_dir, identity)
            if marker is None:
                run.log_rerun(run_dir)
                end = run.deadlines.get(self.name)
                marker = self._run(
                    run, run_dir, run.cfg.seed + i, None if end is None else end - (runs - 1 - i) * run_s
                )
                marker = {**marker, "identity": identity}
                if is_main():  # (under torch.distributed rank 0 writes the run's files)
                    write_marker(run_dir, marker)
            else:
                logger.info("COCO run %d of %d: already finished (%s), skipped", i + 1, runs, run_dir)
            run_dirs.append(run_dir)
            markers.append(marker)
        if is_main():
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
        trainer = self.build_trainer(run, run.plan.steps_of(self.name), output_dir=run_dir, seed=seed)
        return {**self.run_trainer(run, trainer, end), "seed": seed}
