"""The source fine-tuning stage: iDRO (and the methods asked for) on the labelled source task. Its settings
(:class:`FinetuneSettings`) are recipe options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ...modeling.loading import load_encoder
from ..outputs import save_weight_history
from ..settings import (
    AUTO,
    Auto,
    check_choice,
    check_number,
    check_switch,
    check_whole,
    device_batch_size,
    gpu_bf16_default,
    option,
)
from ..stage import Cost, Stage, run_arguments, source_identity, trajectory

if TYPE_CHECKING:
    from ..config import RecipeConfig
    from ..context import RecipeRun
    from ..plan import Plan

# the losses of the source fine-tune (hf_cocodr.finetuning.losses.PRESETS, named here to keep this module torch-free)
FINETUNE_PRESETS = ("paper", "reference", "groupdro", "uniform")
FINETUNE_BATCH_SIZE, FINETUNE_GPU_BATCH_CAP = 32, 128  # queries a step on a CPU, and at most on a GPU
REFRESH_BUDGET_SHARE = 0.1  # self-negative refreshes are planned only while they cost at most this share of the budget
MAX_PLANNED_REFRESHES = 2


@dataclass
class FinetuneSettings:
    """The source fine-tuning's options (``finetune_*``, ``refreshes``, ``skip_finetune``, ``methods`` and the
    ``finetune`` mapping of ``IDROTrainingArguments`` fields)."""

    training_options: ClassVar[str] = "finetune"
    length_options: ClassVar[tuple[str, ...]] = ("max_length",)  # the token lengths among its training arguments

    finetune_steps: int | None = option(None, "steps of the source fine-tuning (default: planned, or 500)")
    refreshes: int | None = option(None, "self-negative refreshes, each re-clusters (default: as the budget affords)")
    finetune_preset: str = option(
        AUTO,
        "the source fine-tune's loss: iDRO (paper, reference), GroupDRO, or the plain contrastive loss (uniform); "
        "auto: by the starting model. A finetune: {idro_preset: ...} in --config sets it too",
        choices=("auto", *FINETUNE_PRESETS),
    )
    finetune_share: float | Auto = option(AUTO, "the source fine-tuning's share of the training budget")
    skip_finetune: bool | Auto = option(
        AUTO, "leave the finetune stage out (true), run it (false), or as the schedule says (auto)"
    )
    methods: list[str] = option(
        help="extra method(s) for the fine-tuning stage, e.g. COCO -> iDRO + BERM: a name "
        "registered in hf_cocodr.methods.registry (built in: modir, berm, rmsc); repeatable",
        flag="--method",
        metavar="NAME",
        default_factory=list,
    )
    finetune: dict[str, Any] = option(
        help="IDROTrainingArguments fields of the source fine-tuning", cli=False, default_factory=dict
    )

    @staticmethod
    def arguments_class() -> type:
        from ...finetuning import IDROTrainingArguments

        return IDROTrainingArguments

    def check(self) -> None:
        """Refuse out-of-range fine-tuning options by name."""
        check_number(self, "finetune_share", 0, 1)
        check_whole(self, "finetune_steps", 1, hint="; to leave the stage out set skip_finetune: true")
        check_whole(self, "refreshes", 0)
        check_choice(
            self, "finetune_preset", ("auto", *FINETUNE_PRESETS), f"auto or one of {', '.join(FINETUNE_PRESETS)}"
        )
        check_switch(self, "skip_finetune")


def refresh_interval(steps: int, refreshes: int) -> int:
    """The ``refresh_negatives_every_steps`` that gives at most ``refreshes`` refreshes in ``steps`` steps, evenly
    spaced (0: none). The refresh runs after every multiple of the interval below ``steps``, so the interval is
    rounded up: rounded down, 467 steps with one planned refresh would refresh at steps 233 and 466."""
    if not refreshes or steps < 2:
        return 0
    return max(1, -(-steps // (refreshes + 1)))


def _finetune_defaults(run: RecipeRun) -> dict[str, Any]:
    """The recipe's fine-tuning arguments (before the user's ``finetune`` options)."""
    cfg, similarity = run.cfg, run.similarity
    return dict(
        **run_arguments(run, "finetune", logging_steps=5, save_steps=50),
        per_device_train_batch_size=device_batch_size(FINETUNE_BATCH_SIZE, FINETUNE_GPU_BATCH_CAP),
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


def idro_trainer(
    run: RecipeRun,
    args,
    data,
    *,
    methods=(),
    target_corpora=(),
    negatives_label: str = "bm25",
    target_queries=(),
):
    """An :class:`~hf_cocodr.finetuning.IDROTrainer` for ``run.current`` on ``data`` (the fine-tuning's trainer)."""
    from ...training_api import build_idro_trainer

    return build_idro_trainer(
        load_encoder(run.current),
        args,
        data,
        methods=methods,
        target_corpora=target_corpora,
        negatives_label=negatives_label,
        target_queries=target_queries,
    )


def train_idro(stage: Stage, run: RecipeRun, trainer) -> dict[str, Any]:
    """Train ``trainer`` (the stage's) under the stage's deadline, export it and keep its cluster-weight history;
    returns the stage's marker content."""
    marker = stage.run_trainer(run, trainer)
    save_weight_history(trainer, run.dir(stage.name))
    return marker


class FinetuneStage(Stage):
    """Fine-tuning on the labelled source task (iDRO and the methods asked for). Besides its steps it costs the first K-Means over the source
    queries and its self-negative refreshes (each encodes the mining pool and the queries again)."""

    name = "finetune"
    title = "source fine-tuning"
    settings = FinetuneSettings
    share_option = "finetune_share"
    draws_source = True
    reads = {"source": None}  # the source task

    def enabled(self, cfg: RecipeConfig) -> bool:
        return not cfg.skip_finetune

    def cost(
        self,
        throughput: dict[str, float],
        cfg: RecipeConfig,
        *,
        budget_s: float | None = None,
        plan: Plan | None = None,
        pool_docs: int = 0,
        n_queries: int = 0,
        idro: bool | None = None,
        **sizes: Any,
    ) -> Cost:
        """Its steps, the first K-Means over the ``n_queries``
        source queries (iDRO only) and the self-negative refreshes (``refreshes``; unset: as many as cost at most
        :data:`REFRESH_BUDGET_SHARE` of ``budget_s``, at most :data:`MAX_PLANNED_REFRESHES`; 1 without a budget),
        each encoding the ``pool_docs`` mining pool and the queries again; of a ``plan``, its refreshes as planned."""
        cost = super().cost(throughput, cfg, budget_s=budget_s, plan=plan)
        if plan is not None:  # the plan's refreshes and K-Means (charged where the stage trains)
            fields = plan.stage_fields
            cost.fixed_s = fields.get("refreshes", 0) * (fields.get("refresh_seconds_each") or 0.0) + (
                fields.get("kmeans_seconds") or 0.0
            )
            return cost
        if budget_s is None:
            cost.plan = {"refreshes": 1 if cfg.refreshes is None else cfg.refreshes}
            return cost
        if not self.enabled(cfg):
            cost.plan = {"refreshes": cfg.refreshes or 0, "refresh_seconds_each": 0.0, "kmeans_seconds": 0.0}
            return cost
        cost.share = float(cfg.finetune_share)
        if idro is None:
            idro = str(cfg.finetune.get("idro_preset", cfg.finetune_preset)) != "uniform"
        encode_doc, encode_query = throughput.get("encode_doc_s", 0.0), throughput.get("encode_query_s", 0.0)
        # (probed in one process) the ranks share the pool's encoding and K-Means's queries; rank 0 ranks the queries
        from ...distributed import world

        ranks = world()[0]
        refresh_s = encode_doc * pool_docs / ranks + (encode_query * n_queries if idro else 0.0)
        kmeans_s = encode_query * n_queries / ranks if idro else 0.0
        refreshes = cfg.refreshes
        if refreshes is None:
            affordable = (REFRESH_BUDGET_SHARE * budget_s) // refresh_s if refresh_s > 0 else 0
            refreshes = int(min(MAX_PLANNED_REFRESHES, affordable))
        cost.fixed_s = kmeans_s + refreshes * refresh_s
        cost.plan = {
            "refreshes": int(refreshes),
            "refresh_seconds_each": round(refresh_s, 1),
            "kmeans_seconds": round(kmeans_s, 1),
        }
        return cost

    def arguments(self, run: RecipeRun) -> dict[str, Any]:
        # bf16 on a GPU with native bf16 unless the options say otherwise
        return {**_finetune_defaults(run), **gpu_bf16_default(run.cfg.finetune), **run.cfg.finetune}

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        from ...methods import method_target_queries

        cfg, fps = run.cfg, run.fps
        return {
            "stage": "finetune",
            "start": start,
            "source": source_identity(run),
            "settings": trajectory(run.arguments[self.name]),
            "steps": run.plan.steps_of(self.name),
            "refreshes": run.plan.stage_fields.get("refreshes", 0),
            "methods": list(cfg.methods),
            "targets": fps["targets"] if cfg.methods else None,
            "target_queries": method_target_queries(cfg.methods, cfg.target_queries),
            "joint": None,  # (the retired joint target pseudo pairs: kept, so that earlier identities still match)
        }

    def probe(self, run: RecipeRun) -> dict[str, float]:
        """Its step (the real trainer's, see :meth:`Stage.probe`), and the seconds per encoded document and query
        its K-Means and refreshes cost, measured on the probe trainer's model."""
        import numpy as np

        from ..probe import time_call, time_trainer_steps

        step_s, trainer = time_trainer_steps(self, run)
        st, data, kw = trainer.model, run.train_data, run.arguments[self.name]
        st.eval()
        rows = np.random.default_rng(0).choice(len(data.corpus), min(128, len(data.corpus)), replace=False)
        texts, queries = data.doc_texts(rows), data.query_texts[:128]
        length = {"processing_kwargs": {"text": {"max_length": kw["max_length"]}}} if kw.get("max_length") else {}
        doc_s = time_call(lambda: st.encode_document(texts, batch_size=64, **length)) / len(texts)
        query_s = time_call(lambda: st.encode_query(queries, batch_size=64)) / len(queries)
        return {"finetune_step_s": step_s, "encode_doc_s": doc_s, "encode_query_s": query_s}

    def build_trainer(self, run: RecipeRun, max_steps: int, *, output_dir=None, probe: bool = False):
        """The :class:`~hf_cocodr.finetuning.IDROTrainer` on the source task, refreshing its negatives as often as the plan says (never in a probe)."""
        from ...finetuning import IDROTrainingArguments
        from ...methods import method_target_queries

        cfg = run.cfg
        every = (
            0 if probe else refresh_interval(max_steps, run.plan.stage_fields.get("refreshes", 0) if run.plan else 0)
        )
        args = self.training_arguments(
            run,
            IDROTrainingArguments,
            max_steps,
            output_dir=output_dir,
            probe=probe,
            forced={"refresh_negatives_every_steps": 0} if probe else None,
            refresh_negatives_every_steps=every,
            # the self-mined negatives' corpus encodings in the run's corpus precision unless the finetune options set
            # it (a default below the user's options, out of the stage's identity as the run's precision always was)
            negatives_encode_precision=run.encode_precision,
        )
        return idro_trainer(
            run,
            args,
            run.train_data,
            methods=run.methods,
            target_corpora=list(run.target_corpora),
            negatives_label="bm25",
            target_queries=method_target_queries(cfg.methods, cfg.target_queries),
        )

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        return train_idro(self, run, self.build_trainer(run, run.plan.steps_of(self.name)))
