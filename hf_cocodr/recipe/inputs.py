"""The data a recipe run's stages share: the source task draw, loaded only for the stages that still have to run,
and COCO's corpora."""

from __future__ import annotations

from ..data.training import RetrievalTrainingData
from .context import RecipeRun
from .stage import Stage

# Source queries drawn to time the fine-tuning step when the budget sizes the draw (max_queries unset).
SIZE_PROBE_QUERIES = 1000


def load_data(run: RecipeRun, stages: tuple[Stage, ...]) -> RetrievalTrainingData | None:
    """The source training data, for the stages that still have to run (None: none of them reads it)."""
    needed = {data for s in stages if s.enabled(run.cfg) and not run.done(s.name) for data in reads(s, run.cfg)}
    # (without source data COCO trains on the target corpora alone)
    return (
        draw_source(run, source_queries(run, stages)) if "source" in needed and run.source_data is not None else None
    )


def reads(stage: Stage, cfg) -> set[str]:
    """The data ``stage`` reads when it runs with the settings ``cfg`` (its :attr:`~hf_cocodr.recipe.Stage.reads`:
    each datum always, or where its option is true)."""
    return {data for data, when in stage.reads.items() if when is None or bool(getattr(cfg, when))}


def coco_corpora(run: RecipeRun, train_data: RetrievalTrainingData | None) -> list:
    """COCO's corpora: the target corpora, and the (restricted) source corpus of ``train_data`` when it is included
    and drawn."""
    corpora = list(run.target_corpora)
    if run.cfg.include_source_corpus and train_data is not None:
        corpora.append(source_pool_dataset(train_data))
    return corpora


def sizes_source(run: RecipeRun, stages: tuple[Stage, ...]) -> bool:
    """Whether the budget sizes the source draw: a budgeted run with ``max_queries`` unset whose stage that trains
    on the source task (:attr:`~hf_cocodr.recipe.Stage.draws_source`) still has to run."""
    if run.max_minutes is None or run.cfg.max_queries is not None:
        return False
    return any(s.draws_source and s.enabled(run.cfg) and not run.done(s.name) for s in stages)


def source_queries(run: RecipeRun, stages: tuple[Stage, ...]) -> int | None:
    """The source queries to draw now: ``max_queries``; or the count a saved plan sized; or, before a sized plan
    exists, :data:`SIZE_PROBE_QUERIES` to time the steps on."""
    if not sizes_source(run, stages):
        return run.cfg.max_queries
    if run.plan is not None and run.plan.source_queries is not None:
        return int(run.plan.source_queries)
    return SIZE_PROBE_QUERIES


def draw_source(run: RecipeRun, max_queries: int | None) -> RetrievalTrainingData:
    """The labelled source task, ``max_queries`` of its queries drawn (None: all), with BM25 negatives."""
    cfg = run.cfg
    return RetrievalTrainingData.from_beir(
        run.source_data,
        cfg.source_split,
        negatives="bm25",
        max_queries=max_queries,
        seed=cfg.seed,
        corpus_pool=cfg.corpus_pool,
    )


def source_pool_dataset(train_data):
    """The (restricted) source corpus as a dataset with title/text columns, for COCO."""
    ds = train_data.corpus.select_columns([c for c in ("title", "text") if c in train_data.corpus.column_names])
    ds.info.dataset_name = train_data.name.split(":")[0]
    return ds
