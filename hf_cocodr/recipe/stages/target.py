"""The target pseudo-pairs stage: fine-tuning on pseudo pairs of the target corpora (a title or one sentence against
the rest of its document, BM25 negatives from the target corpus). No labels are read. Its settings
(:class:`TargetSettings`) are recipe options; under the joint schedule the pairs are a term of the source steps
instead (:class:`~hf_cocodr.recipe.stages.finetune.FinetuneStage`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..settings import AUTO, Auto, check_choice, check_number, check_whole, gpu_bf16_default, is_joint, option
from ..stage import Cost, Stage, trajectory, unbudgeted_steps
from .finetune import _finetune_defaults, idro_trainer, train_idro

if TYPE_CHECKING:
    from ..config import RecipeConfig
    from ..context import RecipeRun
    from ..plan import Plan

# hf_cocodr.data.pseudo_pairs.PSEUDO_PAIR_MODES, named here so the options load without numpy (a test keeps them equal)
PSEUDO_PAIR_MODES = ("title_body", "ict")


@dataclass
class TargetSettings:
    """The target pseudo pairs' options (``target_*``, ``joint_weight`` and the ``target`` mapping of
    ``IDROTrainingArguments`` fields)."""

    training_options: ClassVar[str] = "target"
    length_options: ClassVar[tuple[str, ...]] = ("max_length",)  # the token lengths among its training arguments

    target_steps: int | None = option(None, "steps of the target pseudo pairs (default: planned, or 500)")
    target_pairs: str = option(
        AUTO,
        "fine-tune on pseudo pairs of the target corpora (title or sentence vs. the rest)",
        choices=("auto", "none", *PSEUDO_PAIR_MODES),
    )
    target_schedule: str = option(
        AUTO,
        "target pairs as a stage after the source fine-tuning (sequential) or a term of its steps (joint)",
        choices=("auto", "sequential", "joint"),
    )
    joint_weight: float = option(1.0, "weight of the target-pairs term under the joint schedule")
    target_share: float | Auto = option(AUTO, "the target pseudo pairs' share of the training budget")
    target: dict[str, Any] = option(
        help="IDROTrainingArguments fields of the target pseudo pairs", cli=False, default_factory=dict
    )

    @staticmethod
    def arguments_class() -> type:
        from ...finetuning import IDROTrainingArguments

        return IDROTrainingArguments

    def check(self) -> None:
        """Refuse out-of-range target-pairs options by name."""
        check_number(self, "target_share", 0, 1)
        check_whole(self, "target_steps", 1, hint="; to leave the stage out set target_pairs: none")
        check_choice(
            self, "target_pairs", ("auto", "none", *PSEUDO_PAIR_MODES), f"auto, none, {' or '.join(PSEUDO_PAIR_MODES)}"
        )
        check_choice(self, "target_schedule", ("auto", "sequential", "joint"), "auto, sequential or joint")
        check_number(self, "joint_weight", 0, 100, allow_auto=False)


class TargetPairsStage(Stage):
    """Fine-tuning on pseudo pairs of the target corpora (a title or one sentence against the rest of its
    document, BM25 negatives from the target corpus), after the source fine-tuning (the sequential schedule)."""

    name = "target"
    title = "target pseudo pairs"
    settings = TargetSettings
    share_option = "target_share"
    reads = {"target_pairs": None}

    def enabled(self, cfg: RecipeConfig) -> bool:
        return cfg.target_pairs != "none" and not is_joint(cfg)

    def cost(
        self,
        throughput: dict[str, float],
        cfg: RecipeConfig,
        *,
        budget_s: float | None = None,
        plan: Plan | None = None,
        **sizes: Any,
    ) -> Cost:
        """Its steps; none of its own in the joint schedule (the pairs' step is a term of the source steps), though
        a plan without a budget still lists the steps it would train (they go unused)."""
        cost = super().cost(throughput, cfg, budget_s=budget_s, plan=plan)
        if is_joint(cfg):
            cost.step_s = 0.0
        if budget_s is None and plan is None:
            cost.steps = unbudgeted_steps(cfg.target_pairs != "none", cfg.target_steps)
        return cost

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        # Pseudo pairs have no query types to rebalance: plain contrastive loss, BM25 negatives from the target corpus
        target = {**_finetune_defaults(run), "output_dir": str(run.dir(self.name)), "idro_preset": "uniform"}
        return {**target, **gpu_bf16_default(run.cfg.target), **run.cfg.target}

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        cfg = run.cfg
        return {
            "stage": "target",
            "start": start,
            "targets": run.fps["targets"],
            "pairs": cfg.target_pairs,
            "seed": cfg.seed,
            "settings": trajectory(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
        }

    def build_trainer(self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False):
        """An :class:`~hf_cocodr.finetuning.IDROTrainer` on the target pseudo pairs (no negative refreshes)."""
        from ...finetuning import IDROTrainingArguments

        args = self.training_arguments(
            run,
            IDROTrainingArguments,
            max_steps,
            output_dir=output_dir,
            probe=probe,
            refresh_negatives_every_steps=0,
        )
        return idro_trainer(run, args, run.target_data, negatives_label="bm25 (within the target corpora)")

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        return train_idro(self, run, self.build_trainer(run, run.plan.steps_of(self.name)))
