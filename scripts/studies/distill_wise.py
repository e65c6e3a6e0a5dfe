"""WiSE-FT of query-side students after the fact (issue 49): for each finished student run and each α, the query
route ``(1 − α)·θ_start + α·θ_student`` (the document route stays the start's, so the index is the start's) scored
on the dev splits with the labels, beside the start. No training: each cell costs one encoding of the dev queries.

The question it answers: whether interpolating toward the start gives back on SciFact (whose student over-fits its
372 training queries) what a higher learning rate costs there, while keeping NFCorpus's gain (whose cap is its
teacher). Cells are cached (``--work``/<arm>-seed<N>-a<α>.json) and skipped on a re-run.

    python scripts/studies/distill_wise.py --runs outputs/corpus_only_screen/budget30 \\
        --arms queries,queries-fit-deep-lr --seeds 42,43,44 --alphas 0.5,0.7,0.8,0.9,1
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

from distill_ceiling import CORPORA, ranked_run  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="outputs/corpus_only_screen/budget30", help="folder of ARM/seedN/run")
    ap.add_argument("--arms", required=True)
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--alphas", default="0.5,0.7,0.8,0.9,1")
    ap.add_argument("--data", default="outputs/corpus_only_screen/data")
    ap.add_argument("--cache", default="outputs/corpus_only_screen/cache", help="the HF_COCODR_CACHE the runs shared")
    ap.add_argument("--work", default="outputs/distill_wise")
    ap.add_argument("--out", default="reports/studies/distill_wise")
    ap.add_argument("--lead", default="scifact=0.0556,nfcorpus=0.0312", help="the fitted hybrid's lead per corpus")
    ap.add_argument(
        "--soup",
        action="store_true",
        help="also score each arm's soup: the uniform weight average of its seeds' query routes (one row, 'soup')",
    )
    return ap.parse_args()


def spread(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), (max(values) - min(values)) / 2


def main() -> int:
    ns = parse()
    os.environ["HF_COCODR_CACHE"] = str(Path(ns.cache).absolute())
    from sentence_transformers import SentenceTransformer

    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_qrels, load_queries
    from hf_cocodr.evaluation.metrics import compute_metrics
    from hf_cocodr.modeling.bundled import bundled_model_path
    from hf_cocodr.modeling.precision import resolve_corpus_precision
    from hf_cocodr.modeling.wise import soup, wise_ensemble
    from hf_cocodr.recipe.config import RecipeConfig
    from hf_cocodr.recipe.stages.distill import teacher_fusion
    from hf_cocodr.retrieval.encoding import encode_texts, model_similarity
    from hf_cocodr.retrieval.session import EncodingSession
    from hf_cocodr.retrieval.teacher import teacher_retriever
    from hf_cocodr.rundir.run_record import fingerprint
    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    t0 = time.time()
    data, work = Path(ns.data), Path(ns.work)
    work.mkdir(parents=True, exist_ok=True)
    model = bundled_model_path("all-MiniLM-L6-v2")
    start = SentenceTransformer(model)
    normalize = model_similarity(start) == "cosine"
    precision, _ = resolve_corpus_precision("auto")
    session = EncodingSession(precision)
    fusion = teacher_fusion(RecipeConfig(distill_teacher_weight=0.5))
    lead = {k: float(v) for k, v in (x.split("=") for x in ns.lead.split(","))}
    corpora = {}
    for name in CORPORA:
        folder = data / name
        hybrid, doc_ids, _, _ = teacher_retriever(
            start, fingerprint(model), str(folder), fusion=fusion, session=session
        )
        queries = load_queries(folder)
        text_of = dict(zip(queries["_id"], queries["text"]))
        qrels = load_qrels(folder, "dev")
        qids = [q for q in qrels if q in text_of]
        texts = [text_of[q] for q in qids]
        docs = np.asarray(hybrid.embeddings, np.float32)
        q0 = encode_texts(start, texts, kind="query", normalize=normalize, session=session)
        base = compute_metrics(qrels, ranked_run(qids, q0, docs, doc_ids))["ndcg@10"]
        corpora[name] = (qrels, qids, texts, docs, doc_ids, base)
        print(f"{name}: start dev nDCG@10 {base:.4f}", flush=True)

    def score(st) -> dict:
        cell = {}
        for name, (qrels, qids, texts, docs, doc_ids, base) in corpora.items():
            q = encode_texts(st, texts, kind="query", normalize=normalize, session=session)
            nd = compute_metrics(qrels, ranked_run(qids, q, docs, doc_ids))["ndcg@10"]
            cell[name] = {"ndcg@10": round(nd, 6), "gain": round(nd - base, 6)}
        return cell

    arms, seeds = ns.arms.split(","), [int(s) for s in ns.seeds.split(",")]
    alphas = [float(a) for a in ns.alphas.split(",")]
    cells: dict = {}
    for arm in arms:
        for seed in seeds:
            run = Path(ns.runs) / arm / f"seed{seed}" / "run" / "model"
            if not (run / "modules.json").is_file():
                print(f"skip {arm} seed {seed}: no model at {run}", flush=True)
                continue
            for alpha in alphas:
                cache = work / f"{arm}-seed{seed}-a{alpha:g}.json"
                if cache.is_file():
                    cells[(arm, seed, alpha)] = json.loads(cache.read_text())
                    continue
                st = wise_ensemble(start, load_encoder(str(run)), alpha) if alpha < 1 else load_encoder(str(run))
                cell = score(st)
                atomic_write_json(cache, cell)
                cells[(arm, seed, alpha)] = cell
                print(arm, seed, alpha, json.dumps(cell), f"{time.time() - t0:.0f} s", flush=True)

    soups: dict = {}
    for arm in arms if ns.soup else []:
        runs = [Path(ns.runs) / arm / f"seed{s}" / "run" / "model" for s in seeds]
        runs = [r for r in runs if (r / "modules.json").is_file()]
        if len(runs) < 2:
            continue
        cache = work / f"{arm}-soup-{'-'.join(r.parent.parent.name[4:] for r in runs)}.json"
        if not cache.is_file():
            # the document routes are the start's frozen copy in every run, so averaging them changes nothing
            atomic_write_json(cache, {"seeds": len(runs), **score(soup([load_encoder(str(r)) for r in runs]))})
        soups[arm] = json.loads(cache.read_text())
        print(arm, "soup", json.dumps(soups[arm]), f"{time.time() - t0:.0f} s", flush=True)

    rows = []
    for arm in arms:
        for alpha in alphas:
            got = [cells[(arm, s, alpha)] for s in seeds if (arm, s, alpha) in cells]
            if not got:
                continue
            row = {"arm": arm, "alpha": alpha, "seeds": len(got)}
            for name in CORPORA:
                gains = [c[name]["gain"] for c in got]
                m, h = spread(gains)
                row[name] = {
                    "gains": gains,
                    "mean": round(m, 4),
                    "half_range": round(h, 4),
                    "share_of_lead": round(m / lead[name], 3),
                }
            rows.append(row)
        if arm in soups:  # the soup after the arm's α rows: one model, so no spread; beside it the seeds' mean at α 1
            row = {"arm": arm, "alpha": "soup", "seeds": soups[arm]["seeds"]}
            for name in CORPORA:
                gain = soups[arm][name]["gain"]
                row[name] = {
                    "gains": [gain],
                    "mean": round(gain, 4),
                    "half_range": 0.0,
                    "share_of_lead": round(gain / lead[name], 3),
                }
            rows.append(row)
    command = (
        f"python scripts/studies/distill_wise.py --runs {ns.runs} --arms {ns.arms} --seeds {ns.seeds} "
        f"--alphas {ns.alphas} --work {ns.work} --out {ns.out}" + (" --soup" if ns.soup else "")
    )
    atomic_write_json(
        Path(ns.out + ".json"),
        {
            "precision": precision,
            "rows": rows,
            "command": command,
            "start": {n: round(c[-1], 6) for n, c in corpora.items()},
        },
    )
    lines = ["# WiSE-FT of the query-side students, after the fact", ""]
    findings = Path(ns.out + "_findings.md")  # written by hand from the table, kept when the table is rendered again
    if findings.is_file():
        lines += [f"Findings (written once, beside this table): [{findings.name}]({findings.name})", ""]
    lines += [
        f"Dev nDCG@10 gain over the start (SciFact {corpora['scifact'][-1]:.4f}, NFCorpus {corpora['nfcorpus'][-1]:.4f}"
        f"; corpus vectors in {precision}) of the query route (1 − α)·start + α·student, the document route the "
        "start's; mean ± half-range over seeds; share: of the fitted hybrid's lead over the start "
        f"(SciFact {lead['scifact']}, NFCorpus {lead['nfcorpus']}). α = 1 is the trained student"
        + (
            "; `soup`: the uniform weight average of the arm's seeds' query routes, one model (no spread)."
            if soups
            else "."
        ),
        "",
        "| arm | α | seeds | SciFact dev Δ | NFCorpus dev Δ | NFCorpus share |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, n = r["scifact"], r["nfcorpus"]
        lines.append(
            f"| {r['arm']} | {r['alpha'] if r['alpha'] == 'soup' else format(r['alpha'], 'g')} | {r['seeds']} | "
            f"{s['mean']:+.4f} ± {s['half_range']:.4f} | "
            f"{n['mean']:+.4f} ± {n['half_range']:.4f} | {n['share_of_lead']:.0%} |"
        )
    lines += ["", f"Command: `{command}`."]
    atomic_write_text(Path(ns.out + ".md"), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
