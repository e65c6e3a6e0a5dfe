"""Levers on the cost of encoding a corpus on one CPU core (issue 39): seconds to encode a sample of SciFact with
all-MiniLM-L6-v2 at 256 tokens, and how far each lever moves the vectors from the fp32 reference (cosine of each
document's vector with its fp32 vector: min and mean).

A cold first run of the recipe with target queries spends most of its budget encoding the target corpora with the
starting model; this measures what could make that cheaper without changing what is retrieved. Levers: the batch size
(sentence-transformers sorts by length, so a batch pads little), eager attention instead of SDPA, and torch's dynamic
int8 quantization of the linear layers (per tensor, per channel, and only some layers).

    taskset -c 0 env OMP_NUM_THREADS=1 python scripts/benchmarks/bench_encode_levers.py --docs 400
    # prints a table, writes reports/benchmarks/bench_encode_levers.json
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _quantized(model, layers=None, per_channel=False):
    import torch
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and (layers is None or layers(n))]
    with warnings.catch_warnings():  # eager-mode quantization is marked as moving to torchao; it still works
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model).eval(), {n: qconfig for n in names}, dtype=torch.qint8
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=400, help="documents drawn from SciFact (seed 0)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--output", default="reports/benchmarks/bench_encode_levers.json")
    ns = ap.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import load_corpus
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.utils import atomic_write_json, get_data_root

    ds = load_corpus(os.path.join(get_data_root(), "scifact"))
    texts = [(r["title"] + " " + r["text"]).strip() for r in ds]
    texts = random.Random(0).sample(texts, min(ns.docs, len(texts)))
    path = bundled_model_path("all-MiniLM-L6-v2")
    model = SentenceTransformer(path, device="cpu")
    eager = SentenceTransformer(path, device="cpu", model_kwargs={"attn_implementation": "eager"})
    not_ffn_out = lambda n: not (n.endswith("output.dense") and "attention" not in n)  # noqa: E731
    arms = [
        ("fp32, batch 64 (the default)", model, 64),
        ("fp32, batch 16", model, 16),
        ("fp32, batch 4", model, 4),
        ("fp32, batch 256", model, 256),
        ("fp32, eager attention, batch 64", eager, 64),
        ("int8 dynamic, per tensor, all linear layers", _quantized(model), 64),
        ("int8 dynamic, per channel, all linear layers", _quantized(model, per_channel=True), 64),
        ("int8 per channel, all but the FFN output", _quantized(model, not_ffn_out, True), 64),
        ("int8 per channel, q/k/v only", _quantized(model, lambda n: n.endswith(("query", "key", "value")), True), 64),
    ]
    rows, reference = [], None
    for name, m, batch in arms:
        m.max_seq_length = ns.max_length
        m.encode(texts[:8], batch_size=8)  # warm-up
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        vectors = m.encode(texts, batch_size=batch, convert_to_numpy=True, normalize_embeddings=True)
        seconds = time.perf_counter() - t0
        if reference is None:
            reference = (vectors, seconds)
        cos = (vectors * reference[0]).sum(1)
        rows.append(
            {
                "lever": name,
                "seconds": round(seconds, 2),
                "docs_per_s": round(len(texts) / seconds, 2),
                "speedup": round(reference[1] / seconds, 3),
                "cosine_min": round(float(cos.min()), 5),
                "cosine_mean": round(float(cos.mean()), 6),
                "load_before": round(load0, 2),
            }
        )
        print(
            f"{name:48s} {seconds:7.2f} s  x{reference[1] / seconds:5.2f}  cos min {cos.min():.4f} mean {cos.mean():.5f}"
        )
    out = {
        "docs": len(texts),
        "max_length": ns.max_length,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "rows": rows,
    }
    atomic_write_json(ns.output, out)
    print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
