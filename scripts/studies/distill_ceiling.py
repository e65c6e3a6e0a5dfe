"""What caps the query-side distillation (issue 49): the frozen document side, the training signal, or
generalisation. For each corpus, side by side:

- the **free-vector ceiling**: for each query, one vector optimised directly for the distillation's loss against the
  starting model's frozen document vectors (:func:`hf_cocodr.finetuning.ceiling.free_query_vectors`), then scored
  with the labels: what no query encoder can pass; and the share of queries whose teacher top-k order any vector can
  reach at all (:func:`~hf_cocodr.finetuning.ceiling.order_reachable`, an exact linear program);
- the **student** (a query-side model the recipe trained on the train pool) on the queries it trained on and on the
  dev queries it never saw, with the starting model and the hybrid teacher beside, all nDCG@10 with the labels;
- the student's **agreement with the teacher** (nDCG@10 of its ranking against the teacher's top 10) on the pool
  queries it trained on and on those its run held out for the guard (``OUT/queries/<corpus>.guard.jsonl``).

The teacher is the distillation's (``teacher_fusion`` of the defaults: the starting model + BM25, z-scores,
dense weight 0.5, depth 100), encoded in the precision the recipe picks on this machine; its indexes are cached
under ``--work``. Reads the data of ``corpus_only.py`` (``distill_study.prepare_data``).

    python scripts/studies/distill_ceiling.py --student outputs/corpus_only/budget15/queries/seed42/run

The free-vector ceiling's code (``hf_cocodr.finetuning.ceiling``) is retired from the library: run this study at
hf_cocodr commit 123371a9ca5c017ea45ef09586cd2a3075201c7f, the last where it lived (``--steps 0`` reads the students
alone with today's code); the held-out user queries it reads are no longer held out (they all train).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPORA = ("scifact", "nfcorpus")
POOL = "pool-distinct"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--student", help="a recipe run folder whose model is a query-side student (required to measure)")
    ap.add_argument("--data", default="outputs/corpus_only/data")
    ap.add_argument("--work", default="outputs/distill_ceiling")
    ap.add_argument("--out", default="reports/studies/distill_ceiling")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reachable-queries", type=int, default=100, help="queries per split checked by the LP")
    ap.add_argument("--report-only", action="store_true", help="re-render the page from the JSON")
    ap.add_argument(
        "--teacher",
        choices=("fixed", "fit"),
        default="fixed",
        help="the teacher: the distillation's fixed fusion (z-scores, weight 0.5, depth 100) or the fusion fitted to "
        "each corpus (fit: the recipe's default teacher given --target-queries since issue 49)",
    )
    ap.add_argument("--cache", default=None, help="the HF_COCODR_CACHE to read the teacher from (default: WORK/cache)")
    return ap.parse_args()


def ranked_run(qids, query_vectors, doc_vectors, doc_ids, depth=100) -> dict:
    scores = query_vectors @ doc_vectors.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    return {q: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(qids)}


def agreement(run: dict, teacher_top: dict) -> float:
    from hf_cocodr.recipe.guard import ndcg_at_10

    vals = [
        ndcg_at_10([d for d, _ in sorted(run[q].items(), key=lambda x: -x[1])[:10]], set(teacher_top[q])) for q in run
    ]
    return round(float(np.mean(vals)), 4) if vals else float("nan")


def main() -> int:
    ns = parse()
    if ns.report_only:
        write_report(ns, json.loads(Path(ns.out + ".json").read_text()))
        return 0
    if not ns.student:
        raise SystemExit("distill_ceiling: --student RUN is required (or --report-only)")
    os.environ["HF_COCODR_CACHE"] = str(Path(ns.cache).absolute() if ns.cache else Path(ns.work).absolute() / "cache")
    from hf_cocodr.finetuning.ceiling import free_query_vectors, order_reachable
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.data.beir import load_qrels, load_queries
    from hf_cocodr.evaluation.metrics import compute_metrics
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.modeling.precision import resolve_corpus_precision
    from hf_cocodr.recipe.config import RecipeConfig
    from hf_cocodr.recipe.stages.distill import teacher_fusion
    from hf_cocodr.retrieval.encoding import encode_texts, model_similarity
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.retrieval.teacher import teacher_retriever
    from hf_cocodr.rundir.run_record import fingerprint
    from hf_cocodr.utils import atomic_write_json

    data, run_dir = Path(ns.data), Path(ns.student)
    model = bundled_model_path("all-MiniLM-L6-v2")
    start, student = SentenceTransformer(model), SentenceTransformer(str(run_dir / "model"))
    similarity = model_similarity(start)
    normalize = similarity == "cosine"
    precision, _ = resolve_corpus_precision("auto")
    fusion = teacher_fusion(RecipeConfig(distill_teacher_weight="fit" if ns.teacher == "fit" else 0.5))
    out: dict = {"student": str(run_dir), "k": ns.k, "steps": ns.steps, "precision": precision, "corpora": {}}
    out["teacher"] = ns.teacher
    out.update(data=ns.data, cache=ns.cache, work=ns.work)
    t0 = time.time()
    session = EncodingSession(precision)  # the precision a recipe run encodes its corpora in
    for name in CORPORA:
        folder = data / name
        hybrid, doc_ids, _, _ = teacher_retriever(
            start, fingerprint(model), str(folder), fusion=fusion, session=session
        )
        docs = np.asarray(hybrid.embeddings, np.float32)
        f = hybrid.fusion
        out.setdefault("fusion", {})[name] = {
            "rule": f.rule, "normalize": f.normalize, "dense_weight": f.dense_weight, "depth": f.depth,
            "bm25_zeros": f.bm25_zeros,
        }  # fmt: skip
        row_of = {d: i for i, d in enumerate(doc_ids)}
        queries = load_queries(folder)
        text_of = dict(zip(queries["_id"], queries["text"]))
        held = {
            json.loads(line)["text"]
            for line in (run_dir / "queries" / f"{name}.guard.jsonl").read_text().splitlines()
            if line.strip() and not json.loads(line).get("doc_id")
        }
        res: dict = {}
        for split in ("dev", POOL):
            qrels = load_qrels(folder, split)
            qids = [q for q in qrels if q in text_of]
            texts = [text_of[q] for q in qids]
            found, fused = hybrid.search(texts, 100)
            teacher_run = {q: {d: float(s) for d, s in zip(f, sc)} for q, f, sc in zip(qids, found, fused)}
            teacher_top = {q: list(f[:10]) for q, f in zip(qids, found)}
            q_start = encode_texts(start, texts, kind="query", normalize=normalize, session=session)
            q_student = encode_texts(student, texts, kind="query", normalize=normalize, session=session)
            cand = np.array([[row_of[d] for d in f[: ns.k]] for f in found])
            t_scores = np.array([sc[: ns.k] for sc in fused], np.float32)
            q_free = free_query_vectors(docs, cand, t_scores, q_start, similarity=similarity, steps=ns.steps)
            runs = {
                "start": ranked_run(qids, q_start, docs, doc_ids),
                "teacher": teacher_run,
                "student": ranked_run(qids, q_student, docs, doc_ids),
                "free_vectors": ranked_run(qids, q_free, docs, doc_ids),
            }
            entry = {name_: round(compute_metrics(qrels, r)["ndcg@10"], 4) for name_, r in runs.items()}
            entry["queries"] = len(qids)
            checked = list(range(min(ns.reachable_queries, len(qids))))
            reach = [order_reachable(docs, cand[i], similarity=similarity) for i in checked]
            entry["teacher_top_k_reachable"] = round(float(np.mean(reach)), 4)
            entry["free_vectors_top_k_as_teacher"] = round(
                float(
                    np.mean([np.argsort(-(docs @ q_free[i]))[: ns.k].tolist() == cand[i].tolist() for i in checked])
                ),
                4,
            )
            for who in ("start", "student", "free_vectors"):
                entry[f"{who}_agreement"] = agreement(runs[who], teacher_top)
            if split == POOL:  # the student's agreement with the teacher: trained queries vs held-out ones
                trained = [q for q in qids if text_of[q] not in held]
                out_q = [q for q in qids if text_of[q] in held]
                for label, subset in (("trained", trained), ("held_out", out_q)):
                    for who in ("start", "student"):
                        entry[f"{who}_agreement_{label}"] = agreement({q: runs[who][q] for q in subset}, teacher_top)
                    entry[f"{label}_queries"] = len(subset)
            res[split] = entry
            print(name, split, json.dumps(entry), f"{time.time() - t0:.0f} s", flush=True)
        out["corpora"][name] = res
    out["seconds"] = round(time.time() - t0, 1)
    out["reachable_queries"] = ns.reachable_queries
    atomic_write_json(Path(ns.out + ".json"), out)
    write_report(ns, out)
    return 0


def write_report(ns, out: dict) -> None:
    from hf_cocodr.utils import atomic_write_text

    run_dir, precision = Path(out["student"]), out["precision"]
    title = "What caps the query-side distillation: the free-vector ceiling, the student on train and on dev"
    if out.get("teacher") == "fit":
        title += ", with the fitted teacher"
    lines = [f"# {title}", ""]
    findings = Path(ns.out + "_findings.md")
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        f"Student: the query-side model of `{run_dir.name}` ({run_dir}). Teacher: "
        + (
            "the hybrid of the start + BM25 with its fusion fitted to each corpus without labels (the recipe's "
            "default teacher given --target-queries). "
            if out.get("teacher") == "fit"
            else "the distillation's hybrid (start + BM25, z-scores, dense weight 0.5, depth 100). "
        )
        + f"nDCG@10 with the labels; corpus encodings in {precision}; free vectors: "
        f"{out['steps']} full-batch Adam steps of the distillation's loss (KL over the teacher's top {out['k']} at the "
        "student's temperature 0.05 + the in-batch contrast), from the starting model's query vectors.",
        "",
        "| corpus | split | queries | start | student | teacher | free-vector ceiling | teacher's top-k reachable | "
        "free vectors give the teacher's top-k | agreement with the teacher: start / student / free |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in out["corpora"].items():
        for split, e in res.items():
            lines.append(
                f"| {name} | {split} | {e['queries']} | {e['start']:.4f} | {e['student']:.4f} | {e['teacher']:.4f} | "
                f"{e['free_vectors']:.4f} | {e['teacher_top_k_reachable']:.0%} | "
                f"{e['free_vectors_top_k_as_teacher']:.0%} | {e['start_agreement']:.4f} / {e['student_agreement']:.4f}"
                f" / {e['free_vectors_agreement']:.4f} |"
            )
    lines += ["", "The student's agreement with the teacher (nDCG@10 against its top 10) on the pool:", ""]
    lines += [
        "| corpus | trained queries | student | start | held-out queries | student | start |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, res in out["corpora"].items():
        e = res[POOL]
        lines.append(
            f"| {name} | {e['trained_queries']} | {e['student_agreement_trained']:.4f} | "
            f"{e['start_agreement_trained']:.4f} | {e['held_out_queries']} | {e['student_agreement_held_out']:.4f} | "
            f"{e['start_agreement_held_out']:.4f} |"
        )
    lines += [
        "",
        f"Reachability checked on the first {out.get('reachable_queries', '?')} queries of each split. Command: "
        f"`python scripts/studies/distill_ceiling.py --student {out['student']} --reachable-queries "
        f"{out.get('reachable_queries', 100)}"
        + (
            f" --teacher fit --data {out['data']} --cache {out['cache']} --work {out['work']} --out {ns.out}"
            if out.get("teacher") == "fit"
            else ""
        )
        + "` (`--report-only` re-renders this page from the JSON).",
    ]
    atomic_write_text(Path(ns.out + ".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
