"""The state one :func:`~hf_cocodr.recipe.run_recipe` call carries from stage to stage (:class:`RecipeRun`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..retrieval.session import EncodingSession
from .outputs import STAGE_MARKER, lost_output, read_json_marker
from .plan import Plan

if TYPE_CHECKING:
    from .config import RecipeConfig

logger = logging.getLogger("hf_cocodr.recipe")


@dataclass
class RecipeRun:
    """What the stages of one recipe run share: its inputs and settings, the plan, the data drawn, each stage's
    training arguments and identity, the deadlines, and the model the next stage starts from (``current``). What
    only one stage needs lives on that stage (stages are instantiated per run).

    Args:
        model: the starting model.
        target_corpora: the target corpora (BEIR folders, JSONL files or datasets).
        source_data: the labelled source task (a BEIR folder), or None where no stage fine-tunes on one.
        out: the output folder; stage ``name`` writes into ``out / name``.
        evals: the ``DIR:SPLIT`` evaluations asked for.
        cfg: the settings, every ``"auto"`` resolved (see :func:`~hf_cocodr.recipe.choose_schedule`).
        choice: the record of the schedule choice.
        has_mlm: whether the starting model has a trained MLM head (None: could not be inspected).
        methods: the fine-tuning methods, checked.
        max_minutes: the training budget (None: fixed steps).
        resume: whether unfinished stages resume from their checkpoints.
        t_start: ``time.perf_counter()`` when the run began (the budget counts from it).
        fps: fingerprints of the inputs (``model``, ``targets``, ``source``).
        pooling: the starting model's pooling.
        similarity: the starting model's similarity function.
    """

    model: str
    target_corpora: list
    source_data: str | None
    out: Path
    evals: list[str]
    cfg: RecipeConfig
    choice: dict[str, Any]
    has_mlm: bool | None
    methods: list
    max_minutes: float | None
    resume: bool
    t_start: float
    fps: dict[str, Any]
    pooling: str = "cls"
    similarity: str = "dot"
    plan: Plan | None = None
    plan_id: str = ""
    arguments: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> its training arguments
    ids: dict[str, str] = field(default_factory=dict)  # stage -> identity of its inputs (skipped when unchanged)
    deadlines: dict[str, float] = field(default_factory=dict)  # stage -> perf_counter reading it must end by
    load_s: float = 0.0  # the planned seconds of a model load + export (a budgeted run's)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    train_data: Any = None  # the source task draw (the fine-tuning's data, and COCO's source corpus)
    coco_corpora: list = field(default_factory=list)
    current: str = ""
    precision: dict[str, Any] = field(default_factory=dict)
    encode_precision: str = "fp32"  # the corpus encodings' (resolve_corpus_precision of cfg.encode_precision)
    encode_precision_why: str = ""
    # every corpus encoding the run's session did or reused (hf_cocodr.retrieval.encoding_cache), for recipe.json
    corpus_encodings: list[dict[str, Any]] = field(default_factory=list)
    # the run's corpus encodings: their precision, the encoding cache (recording into corpus_encodings), the fits
    # computed once; passed to the teacher, the guard, the evaluations and the hybrids (made by the runner)
    encodings: EncodingSession = field(default_factory=EncodingSession)
    meters: dict[str, Any] = field(default_factory=dict)  # stage -> its ThroughputMeter (texts/s, tokens/s, GPU use)
    queries: list = field(default_factory=list)  # each target corpus's query files (hf_cocodr.recipe.queries)
    guard: dict[str, Any] | None = None  # the label-free guard's reading and verdict (hf_cocodr.recipe.guard)

    def __post_init__(self) -> None:
        self.current = self.current or self.model

    @property
    def budget_s(self) -> float | None:
        """The training budget in seconds (None: no budget, fixed steps)."""
        return None if self.max_minutes is None else float(self.max_minutes) * 60.0

    def dir(self, stage: str) -> Path:
        """The folder stage ``stage`` writes into."""
        return self.out / stage

    def done(self, stage: str) -> bool:
        """Whether ``stage`` finished with the inputs it has now (its marker holds its current identity) and its
        outputs are as it left them (every file its marker lists, at its size; else a warning names the file and
        the stage runs again)."""
        marker = read_json_marker(self.dir(stage))
        if stage not in self.ids or marker.get("identity") != self.ids[stage]:
            return False
        lost = lost_output(self.dir(stage), marker)
        if lost is not None:
            logger.warning("stage %s: finished before, but %s: running it again", stage, lost)
            return False
        return True

    def log_rerun(self, stage_dir: Path) -> None:
        """Say that a stage that finished before runs again (its inputs changed)."""
        if (stage_dir / STAGE_MARKER).is_file():
            logger.info("stage %s: its inputs changed since it finished; running it again", stage_dir.name)

    def deadline(self, trainer, stage: str, end: float | None = None):
        """Give ``trainer`` the stage's throughput meter (:meth:`meter`) and its wall-clock deadline (or ``end``;
        budgeted runs only); returns the deadline's callback or None."""
        self.meter(trainer, stage)
        log_to_logger(trainer, stage)
        if stage not in self.deadlines:
            return None
        from ..finetuning.callbacks import WallClockDeadline

        guard = WallClockDeadline(self.deadlines[stage] if end is None else end, name=f"recipe stage {stage}")
        logger.info("stage %s: must end within %.0f s (its share of the budget)", stage, guard.seconds_left())
        trainer.add_callback(guard)
        return guard

    def meter(self, trainer, stage: str):
        """Give ``trainer`` the stage's :class:`~hf_cocodr.finetuning.callbacks.ThroughputMeter` (one per stage: the
        runs of a soup add up); the runner records its summary in the stage's marker and in ``recipe.json``."""
        from ..finetuning.callbacks import ThroughputMeter

        meter = self.meters.setdefault(stage, ThroughputMeter())
        if meter not in trainer.callback_handler.callbacks:
            trainer.add_callback(meter)
        return meter


def log_to_logger(trainer, stage: str) -> None:
    """Send ``trainer``'s training logs (loss, learning rate, ...) to the ``hf_cocodr.recipe`` logger (stderr, shown
    at INFO) instead of transformers' ``PrinterCallback``, which prints them on stdout where the recipe's command
    prints its one result line (``hf-cocodr -q recipe ... | jq`` reads that line alone)."""
    from transformers.trainer_callback import PrinterCallback, TrainerCallback

    class _LogCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                logs = {k: v for k, v in logs.items() if k != "total_flos"}
                logger.info("stage %s, step %d: %s", stage, state.global_step, logs)

    if any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks):
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(_LogCallback())
