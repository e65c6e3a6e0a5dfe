"""The step-time probe of the planner: seconds per training step of each stage and per encoded document and
query, measured on this machine with the settings the stages will use (:func:`measure_throughput`).

Each step is timed :data:`STEP_TIMINGS` times after an untimed warm-up step, and the median is planned by: single
steps vary by a third in either direction.
"""

from __future__ import annotations

import time

import numpy as np

from ..modeling.loading import load_encoder
from ..modeling.precision import encoding_precision

STEP_TIMINGS = 3  # timed training steps per stage (after a warm-up step); their median is planned by


def _time_it(fn, repeats: int = 1) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _timing_optimizer(model):
    """An AdamW over ``model``'s parameters, so a timed step includes the update the Trainer makes (the model timed
    is a throwaway copy: its weights may change)."""
    import torch

    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-8)


def _finetune_step_seconds(st, data, ft_args) -> float:
    """Seconds of one fine-tuning step (forward + backward of the loss the stage uses) on ``data``."""
    import torch

    from ..finetuning.losses.idro import IDROLoss

    st.train()
    # A batch like the stage's: random rows (the first rows of a dataset can be atypically short), cluster labels
    # drawn from the stage's clusters (iDRO's cost grows with the clusters present in a batch), and the optimizer
    # update.
    gen = np.random.default_rng(0)
    k = max(1, int(getattr(ft_args, "num_clusters", 0) or 50))
    loss = IDROLoss(st, preset=ft_args.idro_preset, num_clusters=k, tau=1.0, scale=ft_args.idro_scale)
    rows = np.sort(gen.choice(len(data), min(len(data), ft_args.per_device_train_batch_size), replace=False))
    labels = torch.as_tensor(gen.integers(0, k, len(rows)))
    opt = _timing_optimizer(st)

    def step():
        cols, dk, pk = data.sample(rows, step=0, seed=0, num_negatives=ft_args.num_negatives)
        kw = {"max_length": ft_args.max_length} if ft_args.max_length else {}
        feats = [st.preprocess(c, **kw) for c in cols]
        # in the precision the stage's Trainer runs its forward in, so the probed step costs what its steps will
        with encoding_precision(st, "bf16" if ft_args.bf16 else "fp32"):
            value = loss(feats, labels, doc_keys=torch.as_tensor(dk), pos_keys=torch.as_tensor(pk))
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = _time_it(step, repeats=STEP_TIMINGS)
    st.eval()
    return out


def measure_throughput(
    model_path: str, coco_args, ft_args, spans, train_data, pooling: str, *, target_args=None, target_data=None
) -> dict[str, float]:
    """Seconds per COCO step, per source / target fine-tuning step, and per encoded document and query, measured
    on this machine with the settings the stages will use."""

    out: dict[str, float] = {}
    if spans is not None:
        from transformers import AutoTokenizer

        from ..modeling.condenser import CondenserForPretraining, _transformer_dir
        from ..pretraining.collator import SpanPairBuilder

        cond = CondenserForPretraining.from_pretrained(
            model_path, n_head_layers=coco_args.n_head_layers, skip_from=coco_args.skip_from
        )
        tok = AutoTokenizer.from_pretrained(_transformer_dir(model_path))
        builder = SpanPairBuilder(
            spans,
            tok,
            mlm_probability=coco_args.mlm_probability,
            max_length=coco_args.max_span_length,
            mask=coco_args.uses_mlm,
        )
        docs = np.sort(
            np.random.default_rng(0).choice(
                len(spans), min(len(spans), coco_args.per_device_train_batch_size), replace=False
            )
        )
        opt = _timing_optimizer(cond)
        # train mode (dropout on), as the Trainer runs the step
        cond.train()

        def coco_step():
            batch = builder.build(docs, step=0, seed=0)
            with encoding_precision(cond, "bf16" if coco_args.bf16 else "fp32"):
                o = cond(**batch, pooling=pooling)
                total = o["embedding"].square().sum()
                if "mlm_sum" in o:
                    total = total + o["mlm_sum"] / o["num_masked"] + o["head_mlm_sum"] / o["num_masked"]
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["coco_step_s"] = _time_it(coco_step, repeats=STEP_TIMINGS)
        del cond
    st = load_encoder(model_path)
    if train_data is not None:
        out["finetune_step_s"] = _finetune_step_seconds(st, train_data, ft_args)
        rows = np.random.default_rng(0).choice(len(train_data.corpus), min(128, len(train_data.corpus)), replace=False)
        texts = train_data.doc_texts(rows)
        kw = {"processing_kwargs": {"text": {"max_length": ft_args.max_length}}} if ft_args.max_length else {}
        out["encode_doc_s"] = _time_it(lambda: st.encode_document(texts, batch_size=64, **kw), repeats=1) / len(texts)
        queries = train_data.query_texts[:128]
        out["encode_query_s"] = _time_it(lambda: st.encode_query(queries, batch_size=64), repeats=1) / len(queries)
    if target_data is not None:
        out["target_step_s"] = _finetune_step_seconds(st, target_data, target_args)
    return out
