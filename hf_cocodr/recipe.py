"""The COCO-DR recipe in one call: COCO on the target corpora, iDRO on the source labels, export, card, evaluation.

Stages write into ``OUT/coco`` and ``OUT/finetune``; the final model is ``OUT/model`` and the evaluation
``OUT/eval.json``. Each stage is resumable (``--resume_from_checkpoint`` semantics: the latest complete
checkpoint of the stage) and a finished stage (``hf_cocodr_stage.json`` present) is skipped on a re-run.
``max_minutes`` sizes the stages from throughput measured on this machine and logs the plan.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .utils import atomic_write_json

logger = logging.getLogger(__name__)

STAGE_MARKER = "hf_cocodr_stage.json"


@dataclass
class RecipeConfig:
    """Settings of :func:`run_recipe`. ``coco`` and ``finetune`` hold extra ``CocoPretrainingArguments`` /
    ``IDROTrainingArguments`` fields (they win over the recipe's defaults)."""

    source_split: str = "train"
    include_source_corpus: bool = True
    max_queries: int | None = None  # source queries used for fine-tuning (None: all)
    corpus_pool: int | None = 5  # restrict the source corpus to positives + BM25 top-k of the kept queries
    coco_steps: int | None = None  # None: planned from max_minutes (or 500)
    finetune_steps: int | None = None  # None: planned from max_minutes (or 500)
    refreshes: int = 1  # self-negative refreshes (each re-clusters)
    coco_share: float = 0.4  # share of the training time given to COCO when planning
    skip_coco: bool = False
    skip_finetune: bool = False
    seed: int = 42
    eval_batch_size: int = 64
    methods: list[str] = field(default_factory=list)  # extra fine-tuning methods: "modir", "berm", "rmsc"
    target_queries: list[str] = field(default_factory=list)  # unlabelled target queries for MoDIR (optional)
    coco: dict[str, Any] = field(default_factory=dict)
    finetune: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecipeConfig:
        known = {f for f in cls.__dataclass_fields__}
        from .errors import ConfigError

        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown recipe option(s) {unknown}; known: {sorted(known)}")
        for stage in ("coco", "finetune"):
            sub = data.get(stage) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"recipe option {stage!r} must be a mapping of training arguments")
            bad = [k for k in sub if k.endswith("_dir")]
            if bad:
                raise ConfigError(f"recipe option {stage}.{bad[0]}: the recipe places every stage inside --output_dir; "
                                  "remove it")
        return cls(**data)


def _stage_done(path: Path) -> dict | None:
    marker = path / STAGE_MARKER
    if marker.is_file():
        try:
            return json.loads(marker.read_text())
        except ValueError:
            return None
    return None


def _mark_done(path: Path, info: dict) -> None:
    atomic_write_json(path / STAGE_MARKER, info)


def _model_similarity(model_path: str) -> tuple[str, str]:
    """(pooling, similarity) the starting model declares; raw checkpoints follow COCO-DR (cls, dot)."""
    from .modeling.loading import load_encoder, pooling_mode

    st = load_encoder(model_path)
    return pooling_mode(st) or "cls", str(st.similarity_fn_name or "dot")


# ---------------------------------------------------------------------------------------------- planning
def _time_it(fn, repeats: int = 2) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_throughput(model_path: str, coco_args, ft_args, spans, train_data, eval_folders: list[str],
                       pool_docs: int, pooling: str, skip_finetune: bool = False) -> dict[str, float]:
    """Seconds per COCO step, per fine-tuning step, and per encoded document, measured on this machine."""
    import torch

    from .finetuning.losses.idro import IDROLoss
    from .modeling.condenser import CondenserForPretraining
    from .modeling.loading import load_encoder
    from .pretraining.collator import SpanPairBuilder

    out: dict[str, float] = {}
    if spans is not None:
        from transformers import AutoTokenizer

        from .modeling.condenser import _transformer_dir

        cond = CondenserForPretraining.from_pretrained(model_path, n_head_layers=coco_args.n_head_layers,
                                                       skip_from=coco_args.skip_from)
        tok = AutoTokenizer.from_pretrained(_transformer_dir(model_path))
        builder = SpanPairBuilder(spans, tok, mlm_probability=coco_args.mlm_probability,
                                  max_length=coco_args.max_span_length)
        docs = np.arange(min(len(spans), coco_args.per_device_train_batch_size))

        def coco_step():
            batch = builder.build(docs, step=0, seed=0)
            o = cond(**batch, pooling=pooling)
            (o["mlm_sum"] / o["num_masked"] + o["head_mlm_sum"] / o["num_masked"] + o["embedding"].sum() * 0).backward()
            cond.zero_grad(set_to_none=True)

        out["coco_step_s"] = _time_it(coco_step)
        del cond
    if train_data is not None and not skip_finetune:
        st = load_encoder(model_path)
        st.train()
        loss = IDROLoss(st, preset=ft_args.idro_preset, num_clusters=4, tau=1.0,
                        scale=20.0 if str(st.similarity_fn_name) == "cosine" else 1.0)
        rows = np.arange(min(len(train_data), ft_args.per_device_train_batch_size))
        labels = torch.as_tensor(rows % 4)

        def ft_step():
            cols, dk, pk = train_data.sample(rows, step=0, seed=0, num_negatives=ft_args.num_negatives)
            kw = {"max_length": ft_args.max_length} if ft_args.max_length else {}
            feats = [st.preprocess(c, **kw) for c in cols]
            loss(feats, labels, doc_keys=torch.as_tensor(dk), pos_keys=torch.as_tensor(pk)).backward()
            st.zero_grad(set_to_none=True)

        out["finetune_step_s"] = _time_it(ft_step)
        rng = np.random.default_rng(0)
        rows = rng.choice(len(train_data.corpus), min(128, len(train_data.corpus)), replace=False)
        texts = train_data.doc_texts(rows)
        st.eval()
        kw = {"processing_kwargs": {"text": {"max_length": ft_args.max_length}}} if ft_args.max_length else {}
        out["refresh_doc_s"] = _time_it(lambda: st.encode_document(texts, batch_size=64, **kw), repeats=1) / len(texts)
    out["refresh_s"] = out.get("refresh_doc_s", 0.05) * pool_docs
    out["eval_s"] = 0.0
    if eval_folders:
        from .data.beir import column_numpy, doc_text, load_corpus
        from .modeling.loading import load_encoder

        st = load_encoder(model_path)
        for folder in eval_folders:
            corpus = load_corpus(folder)
            rng = np.random.default_rng(0)
            rows = rng.choice(len(corpus), min(96, len(corpus)), replace=False)
            b = corpus.select(rows)
            texts = [doc_text(t, x) for t, x in zip(column_numpy(b, "title"), column_numpy(b, "text"))]
            per_doc = _time_it(lambda texts=texts: st.encode_document(texts, batch_size=64), repeats=1) / len(texts)
            out["eval_s"] += per_doc * len(corpus)
    return out


def plan_steps(budget_s: float, tp: dict[str, float], cfg: RecipeConfig, fixed_s: float) -> dict[str, int]:
    """Split the training time left after evaluation/refresh/overhead between COCO and fine-tuning."""
    left = max(0.0, budget_s - fixed_s - tp.get("eval_s", 0) - cfg.refreshes * tp.get("refresh_s", 0))
    coco_s = 0.0 if cfg.skip_coco else left * cfg.coco_share
    ft_s = left - coco_s
    coco_steps = int(coco_s / tp["coco_step_s"]) if "coco_step_s" in tp else 0
    ft_steps = int(ft_s / tp["finetune_step_s"]) if "finetune_step_s" in tp else 0
    return {"coco_steps": max(coco_steps, 0 if cfg.skip_coco else 10),
            "finetune_steps": max(ft_steps, 0 if cfg.skip_finetune else 2 * (cfg.refreshes + 1))}


# ---------------------------------------------------------------------------------------------- the recipe
def run_recipe(
    model: str,
    target_corpora: list[str],
    source_data: str,
    output_dir: str | os.PathLike,
    *,
    evals: list[str] | tuple[str, ...] = (),
    config: RecipeConfig | dict | None = None,
    max_minutes: float | None = None,
    resume: bool = True,
) -> dict[str, Any]:
    """Run COCO → iDRO → export → card → evaluation. Returns ``{eval_spec: {"ndcg@10", "recall@100", ...}}``.

    Args:
        model: starting encoder (sentence-transformers directory, raw checkpoint or Hub id). Its pooling and
            similarity are kept (raw checkpoints: CLS + dot, the COCO-DR convention).
        target_corpora: BEIR folders / JSONL files of the target domain (only their documents are read).
        source_data: a BEIR folder with labelled ``qrels/<source_split>.tsv``.
        output_dir: ``OUT``; stages go to ``OUT/coco`` and ``OUT/finetune``, the final model to ``OUT/model``.
        evals: ``DIR:SPLIT`` specifications evaluated on the final model.
        max_minutes: plan the step counts so the whole run takes about this long on this machine.
        resume: continue unfinished stages from their latest complete checkpoint and skip finished ones.
    """
    from .cli_training import parse_eval_spec
    from .data.spans import SpanCorpus
    from .data.training import RetrievalTrainingData
    from .finetuning import IDROTrainingArguments
    from .pretraining import CocoPretrainingArguments

    t_start = time.perf_counter()
    cfg = config if isinstance(config, RecipeConfig) else RecipeConfig.from_dict(dict(config or {}))
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for spec in evals:
        parse_eval_spec(spec)  # fail early on a bad --eval
    from .methods import validate_methods

    methods = validate_methods(cfg.methods, target_corpora, cfg.target_queries)  # fail before any stage runs
    if not cfg.skip_coco and not target_corpora:
        from .errors import ConfigError

        raise ConfigError("at least one target corpus is needed for COCO (or set skip_coco)")
    pooling, similarity = _model_similarity(model)
    logger.info("recipe: starting model %s (%s pooling, %s similarity); targets %s; source %s:%s",
                model, pooling, similarity, ", ".join(map(str, target_corpora)), source_data, cfg.source_split)
    coco_dir, ft_dir, final_dir = out / "coco", out / "finetune", out / "model"

    # ----------------------------------------------------------------------------------- data (cheap, cached)
    train_data = None
    need_source = (not cfg.skip_finetune and not _stage_done(ft_dir)) or (
        not cfg.skip_coco and cfg.include_source_corpus and not _stage_done(coco_dir))
    if need_source:
        train_data = RetrievalTrainingData.from_beir(source_data, cfg.source_split, negatives="bm25",
                                                     max_queries=cfg.max_queries, seed=cfg.seed,
                                                     corpus_pool=cfg.corpus_pool)
    coco_corpora = list(target_corpora)
    if cfg.include_source_corpus and train_data is not None:
        coco_corpora.append(_source_pool_dataset(train_data))
    coco_defaults = dict(output_dir=str(coco_dir), seed=cfg.seed, report_to="none", logging_steps=10,
                         logging_first_step=True, save_strategy="steps", save_steps=100, save_total_limit=1,
                         per_device_train_batch_size=32, pooling=pooling, contrastive_similarity=similarity,
                         contrastive_temperature=0.05 if similarity == "cosine" else 1.0, learning_rate=2e-5,
                         use_cpu=_no_gpu(), disable_tqdm=True, max_span_length=64)
    ft_defaults = dict(output_dir=str(ft_dir), seed=cfg.seed, report_to="none", logging_steps=5,
                       logging_first_step=True, save_strategy="steps", save_steps=50, save_total_limit=1,
                       per_device_train_batch_size=32, num_clusters=50, learning_rate=2e-5, use_cpu=_no_gpu(),
                       disable_tqdm=True, idro_scale=20.0 if similarity == "cosine" else 1.0, num_negatives=1,
                       dataloader_drop_last=True, warmup_steps=0.1, max_length=128,
                       # tau sets how fast the cluster weights move; the gradient inner products scale with the
                       # similarity (cosine x 20 vs raw dot products), see reports/reproduction.md for the sweep
                       idro_tau=100.0 if similarity == "cosine" else 3000.0)
    coco_kw = {**coco_defaults, **cfg.coco}
    ft_kw = {**ft_defaults, **cfg.finetune}

    # ----------------------------------------------------------------------------------- planning
    plan = {"coco_steps": cfg.coco_steps or 500, "finetune_steps": cfg.finetune_steps or 500}
    spans = None
    if not cfg.skip_coco and not _stage_done(coco_dir):
        from transformers import AutoTokenizer

        from .modeling.condenser import _transformer_dir

        probe_args = CocoPretrainingArguments(**{**coco_kw, "max_steps": 1})
        spans = SpanCorpus.build(coco_corpora, AutoTokenizer.from_pretrained(_transformer_dir(model)),
                                 mode=probe_args.span_mode, span_max_tokens=probe_args.span_max_tokens,
                                 span_break_prob=probe_args.span_break_prob, seed=cfg.seed)
    if max_minutes is not None and (cfg.coco_steps is None or cfg.finetune_steps is None):
        tp = measure_throughput(model, CocoPretrainingArguments(**{**coco_kw, "max_steps": 1}),
                                IDROTrainingArguments(**{**ft_kw, "max_steps": 1}), spans, train_data,
                                [parse_eval_spec(s)[0] for s in evals],
                                len(train_data.corpus) if train_data is not None else 0, pooling,
                                cfg.skip_finetune)
        elapsed = time.perf_counter() - t_start
        fixed = elapsed + 60.0  # model loading, K-Means, exports
        planned = plan_steps(max_minutes * 60.0, tp, cfg, fixed)
        plan = {"coco_steps": cfg.coco_steps or planned["coco_steps"],
                "finetune_steps": cfg.finetune_steps or planned["finetune_steps"]}
        logger.info("recipe plan for %.0f minutes: measured %s; COCO %d steps, fine-tuning %d steps with %d "
                    "negative refresh(es); evaluation of %d documents", max_minutes,
                    {k: round(v, 3) for k, v in tp.items()}, plan["coco_steps"], plan["finetune_steps"],
                    cfg.refreshes, sum(_corpus_size(parse_eval_spec(s)[0]) for s in evals))
        atomic_write_json(out / "plan.json", {"max_minutes": max_minutes, "throughput": tp, **plan})

    # ----------------------------------------------------------------------------------- stage 1: COCO
    current = model
    if not cfg.skip_coco:
        if _stage_done(coco_dir):
            logger.info("stage coco: already finished (%s), skipped", coco_dir)
        else:
            from .modeling.condenser import checkpoint_has_mlm_head
            from .pretraining import CocoPretrainer

            kw = {**coco_kw, "max_steps": plan["coco_steps"]}
            if checkpoint_has_mlm_head(model) is False and "mlm_head_warmup_steps" not in cfg.coco:
                kw["mlm_head_warmup_steps"] = int(0.3 * plan["coco_steps"])
                logger.info("the starting model has no MLM head: its fresh head is warmed up for %d steps before MLM "
                            "gradients reach the encoder", kw["mlm_head_warmup_steps"])
            args = CocoPretrainingArguments(**kw)
            trainer = CocoPretrainer(model, args, corpora=coco_corpora)  # seeds before building the heads
            trainer.train(resume_from_checkpoint=True if resume else None)
            trainer.finalize()
            _mark_done(coco_dir, {"steps": trainer.state.global_step})
            del trainer
        current = str(coco_dir)

    # ----------------------------------------------------------------------------------- stage 2: iDRO
    if not cfg.skip_finetune:
        if _stage_done(ft_dir):
            logger.info("stage finetune: already finished (%s), skipped", ft_dir)
        else:
            from .modeling.loading import load_encoder

            steps = plan["finetune_steps"]
            every = max(1, steps // (cfg.refreshes + 1)) if cfg.refreshes else 0
            args = IDROTrainingArguments(**{"refresh_negatives_every_steps": every, **ft_kw, "max_steps": steps})
            from .training_api import build_idro_trainer

            trainer = build_idro_trainer(load_encoder(current), args, train_data, methods=methods,
                                         target_corpora=list(target_corpora), negatives_label="bm25",
                                         target_queries=list(cfg.target_queries))
            trainer.train(resume_from_checkpoint=True if resume else None)
            trainer.finalize()
            _save_weight_history(trainer, ft_dir)
            _mark_done(ft_dir, {"steps": trainer.state.global_step})
            del trainer
        current = str(ft_dir)

    # ----------------------------------------------------------------------------------- export + evaluation
    _export_final(Path(current), final_dir)
    from .modeling.loading import load_encoder
    from .training_api import evaluate_all

    results = evaluate_all(load_encoder(str(final_dir)), list(evals), final_dir, batch_size=cfg.eval_batch_size)
    summary = {spec: {k: r[k] for k in ("ndcg@10", "recall@100", "mrr@10", "num_queries", "num_docs")}
               for spec, r in results.items()}
    from .model_card import write_model_card

    write_model_card(final_dir, load_encoder(str(final_dir)))
    atomic_write_json(out / "eval.json", summary)
    atomic_write_json(out / "recipe.json", {"model": model, "target_corpora": list(map(str, target_corpora)),
                                            "source_data": str(source_data), "evals": list(evals),
                                            "config": asdict(cfg), "plan": plan,
                                            "wall_seconds": round(time.perf_counter() - t_start, 1)})
    logger.info("recipe finished in %.1f minutes", (time.perf_counter() - t_start) / 60)
    return summary


def _export_final(src: Path, dst: Path) -> None:
    """Copy the model files of the last stage (not its checkpoints) to ``dst``, atomically."""
    from .utils import atomic_directory

    skip = {"trainer_state.json", "training_args.bin", STAGE_MARKER, "eval.json", "idro_weights.json"}
    with atomic_directory(dst) as tmp:
        for p in src.iterdir():
            if p.name.startswith("checkpoint-") or p.name in skip or p.name.startswith("."):
                continue
            if p.is_dir():
                shutil.copytree(p, tmp / p.name)
            else:
                shutil.copy2(p, tmp / p.name)


def _save_weight_history(trainer, out: Path) -> None:
    atomic_write_json(out / "idro_weights.json", {
        "weights": trainer.weight_history,
        "clusterings": trainer.kmeans_callback.history if trainer.kmeans_callback else [],
        "log_history": trainer.state.log_history,
    })


def _source_pool_dataset(train_data):
    """The (restricted) source corpus as a dataset with title/text columns, for COCO."""
    ds = train_data.corpus.select_columns([c for c in ("title", "text") if c in train_data.corpus.column_names])
    ds.info.dataset_name = train_data.name.split(":")[0]
    return ds


def _corpus_size(folder: str) -> int:
    from .data.beir import load_corpus

    return len(load_corpus(folder))


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()
