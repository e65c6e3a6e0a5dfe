"""CocoPretrainer: continuous contrastive pretraining (COCO) as a transformers Trainer."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sentence_transformers.base.losses.gradcache import RandContext
from sentence_transformers.util import all_gather, all_gather_with_grad
from transformers import Trainer

from .. import distributed as D
from ..data.spans import SpanCorpus
from ..errors import ConfigError, disk_faults
from ..export import export_sentence_transformer
from ..hub import check_push_possible
from ..modeling.condenser import HEAD_CONFIG, HEAD_WEIGHTS, CondenserForPretraining, _mlm_head, _transformer_dir
from ..modeling.limits import check_lengths
from ..modeling.loading import check_model_source, model_source
from ..provenance import source_info as previous_training_info
from ..rundir.run_record import RunFolder, fingerprint, model_fingerprint
from ..storage import staged_directory
from ..trainer_common import TrainerMixin
from .collator import SpanPairBuilder
from .training_args import CocoPretrainingArguments

logger = logging.getLogger(__name__)

COMPONENTS = ("mlm_loss", "head_mlm_loss", "contrastive_loss")


class _DocIndexCollator:
    """Document indices of a batch: ``doc`` (training corpus) or ``eval_doc`` (evaluation corpus)."""

    def __call__(self, features):
        key = "eval_doc" if "eval_doc" in features[0] else "doc"
        return {key: torch.tensor([f[key] for f in features], dtype=torch.long)}


class CocoPretrainer(TrainerMixin, Trainer):
    """COCO: sequence-contrastive learning between two spans of each document plus masked-LM through a Condenser head.

    Loss = ``head_mlm_weight``·MLM(head) + ``mlm_weight``·MLM(backbone) + ``contrastive_weight``·L_co, where L_co
    is the cross-entropy of every span against its partner among all spans of the (gathered) batch. Each term is
    logged (``head_mlm_loss``, ``mlm_loss``, ``contrastive_loss``). With ``gradient_cache_chunk_size`` the batch is
    encoded chunk by chunk with a gradient cache (identical gradients, bounded memory); under DDP the spans of all
    ranks are negatives and the update equals one process with the global batch.

    Args:
        model: a :class:`~hf_cocodr.CondenserForPretraining`, a path (sentence-transformers directory or
            transformers checkpoint) or Hub id to build one from, a loaded ``SentenceTransformer`` (run as the folder it
            was loaded from when unchanged: the same result and provenance) or a ``transformers`` masked-LM model
            (``BertForMaskedLM``: the same; one changed in memory gets its Condenser head there and is recorded by its
            weights' fingerprint).
        args: :class:`~hf_cocodr.CocoPretrainingArguments`.
        corpora: one or several corpora: BEIR folders, JSONL files (``text`` [+ ``title``]) or ``datasets.Dataset``
            objects with a text column. Only documents are read: never queries or labels.
        eval_dataset: held-out documents in the same forms as ``corpora`` (one corpus or a list, mixed). With
            ``eval_strategy`` set, every evaluation reports ``eval_loss`` (the weighted training objective),
            ``eval_contrastive_loss``, ``eval_mlm_loss`` and ``eval_head_mlm_loss`` on the same span pairs and
            masks each time (those of step 0). Evaluation changes neither the model nor the optimizer.
        tokenizer: defaults to the model's own tokenizer.

    Example:
        ::

            from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

            args = CocoPretrainingArguments(output_dir="out/coco", per_device_train_batch_size=64, max_steps=500,
                                            gradient_cache_chunk_size=32)
            trainer = CocoPretrainer("sentence-transformers/all-MiniLM-L6-v2", args,
                                     corpora=["data/scifact", "data/nfcorpus"])
            trainer.train()
            trainer.export("out/coco")  # sentence-transformers directory + condenser_head.safetensors
    """

    def __init__(
        self,
        model,
        args: CocoPretrainingArguments,
        corpora=None,
        tokenizer=None,
        callbacks=None,
        eval_dataset=None,
        **kwargs,
    ):
        import datasets

        model = _model_argument(model)  # a loaded model: the folder it runs as where it is unchanged
        self._check_before_loading(model, args, corpora)
        model, source, tokenizer = self._load_condenser(model, args, tokenizer)
        self.source_model = source
        self._identity = {
            "model": fingerprint(source) if source else model_fingerprint(model.lm),
            "data": fingerprint(corpora),
        }
        self.span_corpus = _span_corpus(corpora, tokenizer, args)
        self.builder = _pair_builder(self.span_corpus, tokenizer, args)
        self._eval_builder = None
        eval_rows = self._eval_rows(eval_dataset, tokenizer, args) if eval_dataset is not None else None
        n_docs = len(self.span_corpus)
        world = max(1, args.world_size)
        if n_docs < args.per_device_train_batch_size * world:
            raise ValueError(
                f"only {n_docs} usable documents for a batch of {args.per_device_train_batch_size} x {world} "
                "devices; lower per_device_train_batch_size or add documents"
            )
        args.remove_unused_columns = False
        rows = datasets.Dataset.from_dict({"doc": np.arange(n_docs, dtype=np.int64)})
        super().__init__(
            model=model,
            args=args,
            train_dataset=rows,
            eval_dataset=eval_rows,
            data_collator=_DocIndexCollator(),
            processing_class=tokenizer,
            callbacks=callbacks,
            **kwargs,
        )
        self.loss_is_scaled_for_ga = False  # compute_loss returns a per-micro-batch mean
        self.model_accepts_loss_kwargs = False
        self._acc = {k: 0.0 for k in COMPONENTS}
        self._acc_n = 0
        self._eval_acc = {k: 0.0 for k in COMPONENTS}
        self._eval_n = 0
        self.last_gradcache_rep_diff: float | None = None
        self._log_setup()

    # ------------------------------------------------------------------------------------------------ helpers
    def _check_before_loading(self, model, args: CocoPretrainingArguments, corpora) -> None:
        """The arguments, the Hub push, the span length and the output folder, checked before a model is loaded."""
        if not isinstance(args, CocoPretrainingArguments):
            raise ValueError("CocoPretrainer needs CocoPretrainingArguments")
        if model is None:
            raise ConfigError(
                "CocoPretrainer needs model=: a CondenserForPretraining or a model folder / Hub id, got None"
            )
        if corpora is None:
            raise ValueError("CocoPretrainer needs corpora=[...] (BEIR folders, JSONL files or datasets)")
        self._hub_token = self._prepare_hub_args(args)
        if args.push_to_hub:  # offline or without a token the push would fail after training
            check_push_possible(args.hub_model_id, self._hub_token)
        if isinstance(model, (str, os.PathLike)):
            check_model_source(model)
        check_lengths(model, {"max_span_length": args.max_span_length})  # before a model is loaded
        if args.should_save:  # refuse a folder of someone else's files before loading anything (train() claims it)
            RunFolder.claim(
                args.output_dir,
                self._command,
                None,
                resume=True,
                overwrite=args.overwrite_output_dir,
                trainer=True,
                dry_run=True,
            )

    @staticmethod
    def _load_condenser(model, args: CocoPretrainingArguments, tokenizer):
        """``model`` as a :class:`CondenserForPretraining` (loaded when given as a folder / Hub id, with fresh heads
        seeded by ``args.seed``), its source path (``None`` for a given model) and the tokenizer (by default the
        model's own); with ``backbone_dropout`` off, the backbone's dropout is set to 0."""
        from transformers import AutoTokenizer

        source = None
        if not isinstance(model, CondenserForPretraining):
            from transformers import set_seed

            set_seed(args.seed)  # reproducible initialisation of the fresh heads
            if isinstance(model, torch.nn.Module):  # a masked-LM model held in memory: its Condenser head added
                model = CondenserForPretraining(model, args.n_head_layers or 2, args.skip_from).eval()
            else:
                source = str(model)
                model = CondenserForPretraining.from_pretrained(
                    source, n_head_layers=args.n_head_layers, skip_from=args.skip_from
                )
        if tokenizer is None:
            name = source or model.lm.config._name_or_path
            tokenizer = AutoTokenizer.from_pretrained(_transformer_dir(name))
        if not args.backbone_dropout:
            for m in model.lm.modules():
                if isinstance(m, torch.nn.Dropout):
                    m.p = 0.0
        return model, source, tokenizer

    def _log_setup(self) -> None:
        st = self.span_corpus.stats
        a = self.args
        world = max(1, a.world_size)
        docs = a.per_device_train_batch_size * world
        per_doc = st["spans"] / max(1, st["documents_used"])
        logger.info(
            "COCO pretraining: %d documents used, %d skipped (fewer than 2 spans) from %s; %.1f spans per document "
            "(%s); contrastive batch %d documents x 2 spans x %d devices = %d spans, %d negatives per span; "
            "gradient cache %s; loss weights head %.2g / mlm %.2g / contrastive %.2g",
            st["documents_used"],
            st["documents_skipped"],
            ", ".join(f"{s['corpus']} ({s['documents'] - s['skipped']}/{s['documents']})" for s in st["sources"]),
            per_doc,
            st["mode"],
            a.per_device_train_batch_size,
            world,
            2 * docs,
            2 * docs - 2,
            f"chunks of {a.gradient_cache_chunk_size} documents" if a.gradient_cache_chunk_size else "off",
            a.head_mlm_weight,
            a.mlm_weight,
            a.contrastive_weight,
        )

    @property
    def condenser(self) -> CondenserForPretraining:
        m = self.model
        while not isinstance(m, CondenserForPretraining) and hasattr(m, "module"):
            m = m.module
        return m

    def _inputs(self, docs: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = self.builder.build(docs.cpu().numpy(), step=self.state.global_step, seed=self.args.seed)
        return {k: v.to(self.args.device) for k, v in batch.items()}

    def _contrastive(self, local: torch.Tensor, all_reps: torch.Tensor, offset: int, rows: slice | None = None):
        """Mean cross-entropy of the ``rows`` spans (global indices ``offset + i``) against their partners."""
        a = self.args
        q = local if rows is None else all_reps[rows]
        k = all_reps
        if a.contrastive_similarity == "cosine":
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        scores = (q @ k.T) / a.contrastive_temperature
        idx = torch.arange(q.shape[0], device=q.device) + offset
        scores = scores.masked_fill(F.one_hot(idx, k.shape[0]).bool(), float("-inf"))
        return F.cross_entropy(scores.float(), idx ^ 1)

    def _gather_with_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        world, rank = D.world()
        if world == 1:
            return x, 0
        return all_gather_with_grad(x), rank * x.shape[0]

    # ------------------------------------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, mlm, head, co = self._loss_terms(model, self._inputs(inputs["doc"]), self._warming_up())
        self._track(mlm, head, co)
        return (loss, {}) if return_outputs else loss

    def _loss_terms(self, model, batch, detach_mlm_inputs: bool):
        """(weighted loss, backbone MLM, head MLM, contrastive) of one batch of span pairs."""
        a = self.args
        world, _ = D.world()
        out = model(**batch, pooling=a.pooling, detach_mlm_inputs=detach_mlm_inputs)
        mlm, head = self._mlm_terms(out, D.all_reduce_sum(self._num_masked(batch)).clamp(min=1), world)
        reps, offset = self._gather_with_grad(out["embedding"])
        co = self._contrastive(out["embedding"], reps, offset)
        return a.mlm_weight * mlm + a.head_mlm_weight * head + a.contrastive_weight * co, mlm, head, co

    @staticmethod
    def _num_masked(batch) -> torch.Tensor:
        labels = batch.get("labels")
        return (labels != -100).sum().float() if labels is not None else torch.zeros(())

    @staticmethod
    def _mlm_terms(out, n_global: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(backbone MLM, head MLM) normalised by the global number of masked tokens; zeros without MLM."""
        if "mlm_sum" not in out:  # contrast-only pretraining: no labels, no MLM forward
            zero = out["embedding"].new_zeros(())
            return zero, zero
        return out["mlm_sum"] / n_global * world, out["head_mlm_sum"] / n_global * world

    def _warming_up(self) -> bool:
        return self.state.global_step < self.args.mlm_head_warmup_steps

    def _track(self, mlm, head, co) -> None:
        if not self.model.training:
            return
        for k, v in zip(COMPONENTS, (mlm, head, co)):
            self._acc[k] += float(v.detach())
        self._acc_n += 1

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self.args.gradient_cache_chunk_size:
            return super().training_step(model, inputs, num_items_in_batch)
        return self._gradient_cache_step(model, inputs)

    def _gradient_cache_step(self, model, inputs):
        """GradCache: no-grad pass for all representations, loss gradient w.r.t. them, then chunk-wise backward."""
        a = self.args
        model.train()
        world, _ = D.world()
        batch = self._inputs(inputs["doc"])
        chunk = 2 * a.gradient_cache_chunk_size  # spans per chunk
        n = batch["input_ids"].shape[0]
        slices = [slice(s, min(s + chunk, n)) for s in range(0, n, chunk)]
        states, reps = [], []
        with torch.no_grad():
            for sl in slices:
                states.append(RandContext(*batch.values()))  # CPU RNG + the RNG of the batch's devices
                reps.append(
                    model(**{k: v[sl] for k, v in batch.items() if k != "labels"}, pooling=a.pooling)["embedding"]
                )
        local = torch.cat(reps).detach().requires_grad_()
        # the other ranks' spans are constants here, our own keep their gradient (all_gather keeps the local tensor)
        all_reps = all_gather(local) if world > 1 else local
        # Every rank computes the loss of the *whole* global batch, so the cached gradient of its own spans includes
        # their role as negatives of the other ranks' spans; x world undoes DDP's gradient averaging.
        co = self._contrastive(None, all_reps, 0, rows=slice(None))
        (grad,) = torch.autograd.grad(co * world, local)
        n_global = D.all_reduce_sum(self._num_masked(batch)).clamp(min=1)
        ga = self.current_gradient_accumulation_steps if hasattr(self, "current_gradient_accumulation_steps") else 1
        mlm_total = head_total = 0.0
        max_diff = 0.0
        for i, sl in enumerate(slices):
            last = i == len(slices) - 1
            ctx = model.no_sync if (not last and hasattr(model, "no_sync")) else contextlib.nullcontext
            with ctx():
                with states[i], self.compute_loss_context_manager():  # replays chunk i's dropout
                    out = model(
                        **{k: v[sl] for k, v in batch.items()}, pooling=a.pooling, detach_mlm_inputs=self._warming_up()
                    )
                emb = out["embedding"]
                max_diff = max(max_diff, float((emb.detach() - local[sl].detach()).abs().max()))
                mlm, head = self._mlm_terms(out, n_global, world)
                surrogate = (
                    a.mlm_weight * mlm + a.head_mlm_weight * head + a.contrastive_weight * (grad[sl] * emb).sum()
                )
                self.accelerator.backward(surrogate / ga)
            mlm_total += float(mlm.detach())
            head_total += float(head.detach())
        self.last_gradcache_rep_diff = max_diff
        mlm_t = torch.tensor(mlm_total)
        head_t = torch.tensor(head_total)
        self._track(mlm_t, head_t, co)
        loss = a.mlm_weight * mlm_total + a.head_mlm_weight * head_total + a.contrastive_weight * float(co.detach())
        return torch.tensor(loss / ga, device=a.device)

    # ------------------------------------------------------------------------------------------------ evaluation
    def _eval_rows(self, corpora, tokenizer=None, args=None):
        """Span pairs of held-out ``corpora`` (the forms of ``corpora=``) → the rows the evaluation loop iterates."""
        import datasets

        args = args or self.args
        tokenizer = tokenizer or self.processing_class
        spans = _span_corpus(corpora, tokenizer, args)
        if len(spans) == 0:
            raise ValueError(f"eval_dataset {corpora}: no document has two spans to contrast")
        self._eval_builder = _pair_builder(spans, tokenizer, args)
        logger.info("COCO evaluation on %s: %d documents", ", ".join(spans.sources), len(spans))
        return datasets.Dataset.from_dict({"eval_doc": np.arange(len(spans), dtype=np.int64)})

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """``trainer.evaluate()`` on the ``eval_dataset`` given to the trainer, or on ``eval_dataset`` (a corpus in
        the forms of ``corpora=``) for this call only."""
        builder = self._eval_builder
        try:
            if eval_dataset is not None:  # a path is a corpus here, not the name of an evaluation set
                eval_dataset = self._eval_rows(eval_dataset)
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._eval_builder = builder

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The training objective on the evaluation spans, without gradients; the same spans and masks at every
        evaluation (those of step 0)."""
        docs = inputs["eval_doc"]
        batch = self._eval_builder.build(docs.cpu().numpy(), step=0, seed=self.args.seed)
        batch = {k: v.to(self.args.device) for k, v in batch.items()}
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, *terms = self._loss_terms(model, batch, detach_mlm_inputs=False)
        for k, v in zip(COMPONENTS, terms):  # weighted by documents, as transformers averages eval_loss
            self._eval_acc[k] += float(v) * len(docs)
        self._eval_n += len(docs)
        return loss.detach(), None, None

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ):
        self._eval_acc, self._eval_n = {k: 0.0 for k in COMPONENTS}, 0
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        sums = torch.tensor([self._eval_acc[k] for k in COMPONENTS] + [self._eval_n], dtype=torch.float64)
        sums = D.all_reduce_sum(sums.to(self.args.device)).cpu()
        if sums[-1] > 0:
            for k, v in zip(COMPONENTS, (sums[:-1] / sums[-1]).tolist()):
                output.metrics[f"{metric_key_prefix}_{k}"] = round(v, 6)
        return output

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._acc_n:
            logs = dict(logs)
            vals = torch.tensor([self._acc[k] / self._acc_n for k in COMPONENTS], dtype=torch.float64)
            world, _ = D.world()
            vals = D.all_reduce_sum(vals.to(self.args.device)).cpu() / world
            for k, v in zip(COMPONENTS, vals.tolist()):
                logs[k] = round(v, 6)
            self._acc = {k: 0.0 for k in COMPONENTS}
            self._acc_n = 0
        return super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------ saving
    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        output_dir = output_dir or self.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        cond = self.condenser
        cond.lm.save_pretrained(output_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        cond.save_head(output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        from transformers import AutoModelForMaskedLM

        cond = self.condenser
        loaded = AutoModelForMaskedLM.from_pretrained(resume_from_checkpoint)
        cond.lm.load_state_dict(loaded.state_dict())
        cond.lm.tie_weights()
        cond.load_head(Path(resume_from_checkpoint) / "condenser_head.safetensors", load_mlm_head=False)
        logger.info("resumed COCO model and Condenser head from %s", resume_from_checkpoint)

    def _load_best_model(self) -> None:
        logger.info(
            "loading the best checkpoint %s (%s %s)",
            self.state.best_model_checkpoint,
            self.args.metric_for_best_model,
            self.state.best_metric,
        )
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    def finalize(self) -> str:
        """Export the encoder + head + card into ``output_dir`` and write ``trainer_state.json`` (once per train())."""
        if not getattr(self, "_finalized", False):
            prev = previous_training_info(self.source_model) if self.source_model else {}
            if "base_model" not in prev and self.source_model and not Path(self.source_model).exists():
                prev["base_model"] = self.source_model
            self._declare_outputs()  # a kill during the export: the re-run owns what it wrote (and writes it again)
            with disk_faults(self.args.output_dir):  # a full disk: one OSError naming the folder
                self.export(self.args.output_dir, prev=prev)
                if self.args.should_save:
                    self.save_state()
            self._finalized = True
            self._record_outputs()
        return self.args.output_dir

    _command = "pretrain"

    def _run_identity(self) -> dict:
        return {**self._identity, "settings": self._trajectory_settings()}

    def stage_info(self) -> dict[str, Any]:
        a = self.args
        return {
            "type": "coco",
            "method": "coco",
            "title": "COCO continuous contrastive pretraining"
            + ("" if a.uses_mlm else " (span contrast only, no MLM)"),
            "corpora": list(self.span_corpus.sources),
            "steps": self.state.global_step,
            "documents per step": a.per_device_train_batch_size * max(1, a.world_size) * a.gradient_accumulation_steps,
            "documents used": self.span_corpus.stats["documents_used"],
            "span mode": a.span_mode,
            "loss weights (head MLM / MLM / contrastive)": f"{a.head_mlm_weight} / {a.mlm_weight} / {a.contrastive_weight}",
            "contrastive similarity": f"{a.contrastive_similarity} / temperature {a.contrastive_temperature}",
            "Condenser head": f"{self.condenser.n_head_layers} layers from layer {self.condenser.skip_from}",
            "learning rate": a.learning_rate,
            "seed": a.seed,
        }

    def export(self, output_dir: str | os.PathLike, prev: dict[str, Any] | None = None) -> None:
        """Write the encoder as a sentence-transformers directory (pooling per ``args.pooling``; dot or cosine per
        ``args.contrastive_similarity``), the Condenser head and the model card into ``output_dir`` (atomically)."""
        if not self.args.should_save:
            return
        cond = self.condenser
        prev = dict(prev or {})
        stage = self.stage_info()
        card = {
            "stages": list(prev.get("stages", [])) + [stage],
            "methods": list(dict.fromkeys(list(prev.get("methods", [])) + ["coco"])),
            "datasets": list(dict.fromkeys(list(prev.get("datasets", [])) + stage["corpora"])),
            "base_model": prev.get("base_model")
            or (self.source_model if self.source_model and not Path(self.source_model).exists() else None),
        }
        if not self.source_model and not prev.get("base_model_source"):  # a model given in memory: its weights
            card["base_model_source"] = {"in_memory": True, **self._identity["model"]}
        with staged_directory(output_dir) as tmp:  # beside output_dir: its file system, not $TMPDIR
            cond.encoder_model.save_pretrained(tmp)
            self.processing_class.save_pretrained(tmp)
            cond.save_head(tmp)
            export_sentence_transformer(
                tmp,
                output_dir,
                pooling=self.args.pooling,
                similarity=self.args.contrastive_similarity,
                max_seq_length=self._export_max_len(),
                card_data=card,
                extra_files={HEAD_WEIGHTS: Path(tmp) / HEAD_WEIGHTS, HEAD_CONFIG: Path(tmp) / HEAD_CONFIG},
                preserve=_checkpoint_dirs(output_dir),
                run_record=False,  # train() claimed output_dir
            )

    def _export_max_len(self) -> int:
        """The starting sentence-transformers model's ``max_seq_length`` (pretraining does not change how the model
        is meant to be used), else min(512, max_position_embeddings) for a raw transformers checkpoint."""
        limit = int(min(512, getattr(self.condenser.config, "max_position_embeddings", 512)))
        declared = _declared_max_seq_length(self.source_model, self.processing_class) if self.source_model else None
        return min(declared, limit) if declared else limit


def _model_argument(model):
    """COCO's ``model=`` as the trainer reads it: a path, a Hub id or a :class:`CondenserForPretraining` as given; a
    ``SentenceTransformer`` as the folder it runs as (:func:`~hf_cocodr.modeling.loading.model_source`); a
    ``transformers`` masked-LM model as the folder it was loaded from when it still holds that folder's weights (the
    same run and provenance as the folder), else as it is (its Condenser head added in memory, its provenance its
    weights' fingerprint)."""
    if model is None or isinstance(model, (str, os.PathLike, CondenserForPretraining)):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"CocoPretrainer: model= must be a folder, a Hub id, a SentenceTransformer, a transformers masked-LM "
            f"model or a CondenserForPretraining, got {type(model).__name__}"
        )
    if not hasattr(model, "config") or not hasattr(model, "base_model_prefix"):  # a SentenceTransformer
        return model_source(model)
    ref = str(getattr(model.config, "_name_or_path", "") or "")
    if ref and Path(ref).expanduser().is_dir():
        from transformers import AutoModelForMaskedLM

        with contextlib.suppress(OSError, ValueError):
            loaded = AutoModelForMaskedLM.from_pretrained(ref)
            loaded.tie_weights()
            if model_fingerprint(loaded) == model_fingerprint(model):
                return ref
    _mlm_head(model)  # one line for a model without an MLM head (COCO needs its *ForMaskedLM form)
    return model


def _span_corpus(corpora, tokenizer, args: CocoPretrainingArguments) -> SpanCorpus:
    return SpanCorpus.build(
        corpora,
        tokenizer,
        mode=args.span_mode,
        span_max_tokens=args.span_max_tokens,
        span_break_prob=args.span_break_prob,
        span_len=args.span_len,
        min_span_tokens=args.min_span_tokens,
        sentence_splitter=args.sentence_splitter,
        seed=args.seed,
        text_column=args.text_column,
    )


def _pair_builder(spans: SpanCorpus, tokenizer, args: CocoPretrainingArguments) -> SpanPairBuilder:
    return SpanPairBuilder(
        spans,
        tokenizer,
        mlm_probability=args.mlm_probability,
        max_length=args.max_span_length,
        span_len=args.span_len,
        mask=args.uses_mlm,
    )


def _declared_max_seq_length(source: str, tokenizer) -> int | None:
    """``max_seq_length`` of a sentence-transformers model (local directory or Hub id); None for a raw checkpoint.

    The 5.x layout stores it in ``sentence_bert_config.json``; the 6.x layout as the tokenizer's
    ``model_max_length``.
    """

    def fetch(name: str) -> Path | None:
        if Path(source).exists():
            return Path(source) / name if (Path(source) / name).is_file() else None
        try:
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(source, name))
        except Exception:  # offline, or not a file of this repo
            return None

    if fetch("modules.json") is None:
        return None
    cfg = fetch("sentence_bert_config.json")
    try:
        value = json.loads(cfg.read_text()).get("max_seq_length") if cfg else None
    except (OSError, ValueError):
        value = None
    if value is None:
        value = getattr(tokenizer, "model_max_length", None)
    return int(value) if isinstance(value, int) and 0 < value < 1_000_000 else None


def _checkpoint_dirs(output_dir) -> list[str]:
    p = Path(output_dir)
    if not p.is_dir():
        return []
    return [
        c.name for c in p.iterdir() if c.name.startswith("checkpoint-") or c.name in ("trainer_state.json", "runs")
    ]
