"""Probe: how far does one iDRO step move the cluster weights ω, for each bundled start and each preset?

The paper's rule moves ``log ω_i`` by ``(1/τ) Σ_j (ℓ_iℓ_j)^β ⟨∇ℓ_i, ∇ℓ_j⟩``: the step scales with the raw gradient
inner products, so a τ chosen for one encoder can be orders of magnitude off for another. The reference code's rule
uses the cosine of the gradients (bounded) and pulls ω back towards uniform every step (ω^0.1), so its step does not
depend on the gradient scale. This probe takes real SQuAD batches (BM25 negatives, K-Means clusters of the start's
query embeddings, as the recipe's first step sees them) and reports, per start and preset: the loss, the mean diagonal
of the gradient Gram, the median |Δ log ω| of the present clusters, and the largest weight and the weight perplexity
(exp of the entropy over K, divided by K: 1 = uniform) after 1 and after ``--steps`` updates (``paper-diag``: the
paper's rule with the Gram over its mean diagonal, ``gram_normalization="diag"``, at tau 50) (no optimizer step: the
encoder stays the start, so this isolates the rule from learning).

    python scripts/studies/probe_idro_scale.py [--steps 20] [--queries 2000]

Writes ``reports/studies/probe_idro_scale.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The recipe's iDRO settings per similarity (hf_cocodr.recipe): scale 20 for cosine models, 1 for dot; tau 100 / 3000.
SETTINGS = {"cosine": {"scale": 20.0, "tau": 100.0}, "dot": {"scale": 1.0, "tau": 3000.0}}
DIAG_TAU = 50.0  # preset "paper-diag": the paper rule with gram_normalization="diag" at this tau


def perplexity(w) -> float:
    import torch

    w = w.double().clamp(min=1e-300)
    return float(torch.exp(-(w * w.log()).sum()) / w.numel())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", default="splade-tiny,all-MiniLM-L6-v2")
    ap.add_argument("--presets", default="paper,paper-diag,reference")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--output", default="reports/studies/probe_idro_scale.json")
    ns = ap.parse_args()

    import numpy as np
    import torch

    from hf_cocodr import load_encoder
    from hf_cocodr.data.training import RetrievalTrainingData
    from hf_cocodr.finetuning.losses.idro import IDROLoss
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.retrieval.index import kmeans
    from hf_cocodr.utils import get_data_root

    torch.manual_seed(0)
    data = RetrievalTrainingData.from_beir(
        get_data_root() / "squad-v1.1", "train", negatives="bm25", max_queries=ns.queries, seed=42, corpus_pool=2
    )
    rows_out = []
    for start in ns.starts.split(","):
        st = load_encoder(bundled_model_path(start))
        sim = "cosine" if str(st.similarity_fn_name) == "cosine" else "dot"
        with torch.no_grad():
            q = st.encode_query(data.query_texts, batch_size=128, convert_to_numpy=True)
        _, assign = kmeans(q, 50, seed=42)
        gen = np.random.default_rng(0)
        batches = [np.sort(gen.choice(len(data), ns.batch_size, replace=False)) for _ in range(ns.steps)]
        st.train()
        for preset in ns.presets.split(","):
            diag = preset == "paper-diag"  # the Gram over its mean diagonal, at the tau of the study's gnorm arms
            loss = IDROLoss(
                st,
                preset="paper" if diag else preset,
                num_clusters=50,
                tau=DIAG_TAU if diag else SETTINGS[sim]["tau"],
                scale=SETTINGS[sim]["scale"],
                gram_normalization="diag" if diag else "none",
            )
            t0, per_step = time.time(), []
            for i, rows in enumerate(batches):
                cols, dk, pk = data.sample(rows, step=i, seed=0, num_negatives=1)
                feats = [st.preprocess(c, max_length=128) for c in cols]
                before = loss.log_weights.clone()
                value = loss(
                    feats, torch.as_tensor(assign[rows]), doc_keys=torch.as_tensor(dk), pos_keys=torch.as_tensor(pk)
                )
                stats = loss.last_stats
                present = stats["cluster_ids"]
                moved = (loss.log_weights - before)[present].abs()
                w = loss.weights
                per_step.append(
                    {
                        "loss": float(value.detach()),
                        "gram_diag_mean": float(stats["grad_gram"].diagonal().mean()),
                        "median_abs_dlogw": float(moved.median()),
                        "w_max": float(w.max()),
                        "perplexity": perplexity(w),
                        "present": int(present.numel()),
                    }
                )
                st.zero_grad(set_to_none=True)
            row = {
                "start": start,
                "similarity": sim,
                "preset": preset,
                **SETTINGS[sim],
                **({"tau": DIAG_TAU} if diag else {}),
                "step1": per_step[0],
                f"step{ns.steps}": per_step[-1],
                "seconds": round(time.time() - t0, 1),
            }
            rows_out.append(row)
            print(
                f"{start:17s} {preset:9s} loss {per_step[0]['loss']:7.3f}  gram diag {per_step[0]['gram_diag_mean']:10.3g}  "
                f"|Δlogω| {per_step[0]['median_abs_dlogw']:9.3g}  w_max {per_step[0]['w_max']:.4f} -> "
                f"{per_step[-1]['w_max']:.4f}  perplexity {per_step[0]['perplexity']:.3f} -> "
                f"{per_step[-1]['perplexity']:.3f}",
                flush=True,
            )
        del st
    from hf_cocodr.utils import atomic_write_json

    atomic_write_json(
        ns.output,
        {
            "queries": ns.queries,
            "batch_size": ns.batch_size,
            "steps": ns.steps,
            "settings": SETTINGS,
            "rows": rows_out,
            "command": "python scripts/studies/probe_idro_scale.py " + " ".join(sys.argv[1:]),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
