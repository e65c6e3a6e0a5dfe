"""How closely query-side students follow their teacher (issue 49): for each student run, its agreement with the
hybrid teacher (nDCG@10 of its ranking against the teacher's top 10, :func:`distill_ceiling.agreement`) on the pool
queries it trained on, on those its run held out for the guard, and on the dev queries, beside the starting model's;
and its nDCG@10 with the labels on dev. The teacher is the distillation's default (start + BM25, z-scores, weight 0.5,
depth 100), or with ``--teacher fit`` the fusion fitted to each corpus, read from the cache the student's study built
(``--cache``: the teacher's indexes are not encoded again).

    python scripts/studies/distill_agreement.py --cache outputs/corpus_only_screen/cache \\
        --students outputs/corpus_only_screen/budget30/queries/seed42/run,outputs/corpus_only_screen/budget30/queries-deep/seed42/run
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

from distill_ceiling import CORPORA, POOL, agreement, ranked_run  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--students", required=True, help="comma-separated recipe run folders (query-side students)")
    ap.add_argument("--data", default="outputs/corpus_only_screen/data")
    ap.add_argument("--cache", default="outputs/corpus_only_screen/cache", help="the HF_COCODR_CACHE the runs shared")
    ap.add_argument("--out", default="reports/studies/distill_deep_agreement")
    ap.add_argument(
        "--teacher",
        choices=("fixed", "fit"),
        default="fixed",
        help="the teacher agreement is measured against: the distillation's default fusion (fixed) or the fusion "
        "fitted to each corpus (fit: what students trained with --distill-teacher-weight fit followed)",
    )
    ap.add_argument(
        "--trained-split",
        default=None,
        help="the pool split the students trained on (e.g. pool-half, the `half` arms of corpus_only.py): held-out "
        "queries are then the pool's queries outside it (the other half), not the run's guard queries",
    )
    return ap.parse_args()


def main() -> int:
    ns = parse()
    os.environ["HF_COCODR_CACHE"] = str(Path(ns.cache).absolute())
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
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    t0 = time.time()
    data = Path(ns.data)
    model = bundled_model_path("all-MiniLM-L6-v2")
    start = SentenceTransformer(model)
    normalize = model_similarity(start) == "cosine"
    precision, _ = resolve_corpus_precision("auto")
    session = EncodingSession(precision)
    fusion = teacher_fusion(
        RecipeConfig(distill_teacher_weight="fit") if ns.teacher == "fit" else RecipeConfig(distill_teacher_weight=0.5)
    )
    students = [Path(s) for s in ns.students.split(",")]
    out: dict = {"precision": precision, "teacher": ns.teacher, "students": {}}
    for name in CORPORA:
        folder = data / name
        hybrid, doc_ids, _, cached = teacher_retriever(
            start, fingerprint(model), str(folder), fusion=fusion, session=session
        )
        if not cached:
            print(f"{name}: the teacher was not in {ns.cache}; it was built now", flush=True)
        docs = np.asarray(hybrid.embeddings, np.float32)
        queries = load_queries(folder)
        text_of = dict(zip(queries["_id"], queries["text"]))
        splits = {}
        for split in ("dev", POOL):
            qrels = load_qrels(folder, split)
            qids = [q for q in qrels if q in text_of]
            texts = [text_of[q] for q in qids]
            found, _ = hybrid.search(texts, 100)
            top = {q: list(f[:10]) for q, f in zip(qids, found)}
            q_start = encode_texts(start, texts, kind="query", normalize=normalize, session=session)
            splits[split] = (qrels, qids, texts, top, ranked_run(qids, q_start, docs, doc_ids))
        if ns.trained_split:  # the texts outside the split the students trained on (one split for all of them)
            trained_texts = {text_of[q] for q in load_qrels(folder, ns.trained_split) if q in text_of}
            outside = {t for t in text_of.values() if t not in trained_texts}
        for run_dir in students:
            st = SentenceTransformer(str(run_dir / "model"))
            guard = {
                json.loads(line)["text"]
                for line in (run_dir / "queries" / f"{name}.guard.jsonl").read_text().splitlines()
                if line.strip() and not json.loads(line).get("doc_id")
            }
            if ns.trained_split:  # held out: the pool's queries outside the split trained on (its guard left out)
                held, skip = outside, guard
            else:
                held, skip = guard, set()
            entry: dict = {}
            for split, (qrels, qids, texts, top, start_run) in splits.items():
                q = encode_texts(st, texts, kind="query", normalize=normalize, session=session)
                run = ranked_run(qids, q, docs, doc_ids)
                if split == "dev":
                    entry["dev_ndcg@10"] = round(compute_metrics(qrels, run)["ndcg@10"], 4)
                    entry["start_dev_ndcg@10"] = round(compute_metrics(qrels, start_run)["ndcg@10"], 4)
                    entry["dev"] = agreement(run, top)
                    entry["start_dev"] = agreement(start_run, top)
                    continue
                for label, subset in (
                    ("trained", [x for x in qids if text_of[x] not in held and text_of[x] not in skip]),
                    ("held_out", [x for x in qids if text_of[x] in held]),
                ):
                    entry[label] = agreement({x: run[x] for x in subset}, top)
                    entry[f"start_{label}"] = agreement({x: start_run[x] for x in subset}, top)
                    entry[f"{label}_queries"] = len(subset)
            key = f"{run_dir.parent.parent.name}/{run_dir.parent.name}"
            out["students"].setdefault(key, {})[name] = entry
            print(key, name, json.dumps(entry), f"{time.time() - t0:.0f} s", flush=True)
    out["seconds"] = round(time.time() - t0, 1)
    out["command"] = (
        f"python scripts/studies/distill_agreement.py --cache {ns.cache} --teacher {ns.teacher} --out {ns.out} "
        f"--students {ns.students}" + (f" --trained-split {ns.trained_split}" if ns.trained_split else "")
    )
    out["trained_split"] = ns.trained_split
    teacher = (
        "the fusion fitted to each corpus without labels, as the saved hybrid's"
        if ns.teacher == "fit"
        else "start + BM25, z-scores, dense weight 0.5, depth 100"
    )
    atomic_write_json(Path(ns.out + ".json"), out)
    lines = [
        "# The students' agreement with their teacher: trained, held-out and dev queries",
        "",
        f"Agreement: nDCG@10 of the model's ranking against the teacher's top 10 (the distillation's teacher: {teacher}"
        f"), corpus vectors in {precision}. "
        + (
            f"Trained / held-out: the pool queries of the split the run trained on ({ns.trained_split}; its guard "
            "queries left out) / the pool's other queries, which it never saw."
            if ns.trained_split
            else "Trained / held-out: the pool queries the run trained on / held out for its guard."
        )
        + " The starting model's agreement in brackets.",
        "",
        "| student | corpus | trained (start) | held-out (start) | dev (start) | dev nDCG@10 (start) |",
        "|---|---|---|---|---|---|",
    ]
    for key, by_corpus in out["students"].items():
        for name, e in by_corpus.items():
            lines.append(
                f"| {key} | {name} | {e['trained']:.4f} ({e['start_trained']:.4f}), {e['trained_queries']} q | "
                f"{e['held_out']:.4f} ({e['start_held_out']:.4f}), {e['held_out_queries']} q | {e['dev']:.4f} "
                f"({e['start_dev']:.4f}) | {e['dev_ndcg@10']:.4f} ({e['start_dev_ndcg@10']:.4f}) |"
            )
    lines += ["", f"Command: `{out['command']}` ({out['seconds']:.0f} s)."]
    atomic_write_text(Path(ns.out + ".md"), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
