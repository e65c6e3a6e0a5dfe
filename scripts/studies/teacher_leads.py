"""Does the teacher check read the teacher's lead the labels see? (issue 64, item 3)

The recipe's teacher check (:func:`hf_cocodr.retrieval.teacher.teacher_lead`) reads the distillation's teacher, the
start's hybrid with BM25 at the fixed fusion the corpus-only default distils (z-scores, dense weight 0.5, BM25's top
100), against the start alone on the fit's inverse-cloze pseudo-queries. This probe reads, on each corpus of the
development suite (:mod:`suite`), that reading for two teachers, the fixed one and the start's hybrid with its fusion
fitted to the corpus without labels (the hybrid the recipe saves), and beside each what the corpus's labelled dev
queries read: the teacher's nDCG@10 minus the start's (the labels' lead). Only the start model is read: no training.

    python scripts/studies/teacher_leads.py [--work outputs/suite] [--corpora ...] [--report PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import suite as S  # noqa: E402


def corpus_leads(corpus: S.Corpus, ns) -> dict:
    out_file = Path(ns.work) / "teacher_leads" / f"{corpus.name}.json"
    if out_file.is_file():
        return json.loads(out_file.read_text())
    from hf_cocodr import load_encoder
    from hf_cocodr.evaluation.retrieval import evaluate_retrieval
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.fusion_fit import lead_gains
    from hf_cocodr.retrieval.held_out import paired
    from hf_cocodr.retrieval.hybrid import HybridRetriever, _corpus_ids_texts
    from hf_cocodr.retrieval.session import EncodingSession

    t0 = time.time()
    folder = str(S.folder(corpus, Path(ns.work)))
    model = load_encoder(S.model_path())
    session = EncodingSession()
    teachers = {
        "fixed (z, 0.5)": FusionConfig(dense_weight=0.5, normalize="z", bm25_zeros=False, depth=100),
        "fitted": None,  # fitted to the corpus without labels
    }
    result: dict = {"corpus": corpus.name, "teachers": {}}
    for name, fusion in teachers.items():
        hybrid = HybridRetriever.build(model, folder, fusion=fusion, batch_size=64, session=session)
        fused = hybrid.fusion
        ids, texts = _corpus_ids_texts(folder)
        assert list(ids) == list(hybrid.doc_ids)
        dense_g, hybrid_g = lead_gains(
            fused,
            list(texts),
            hybrid.embeddings,
            lambda q: encode_texts(model, q, kind="query", batch_size=64, session=session),
            lambda t: encode_documents(model, t, batch_size=64, session=session),
        )
        ev = evaluate_retrieval(model, folder, corpus.split, hybrid=True, fusion=fused, show_progress_bar=False,
                                session=session)  # fmt: skip
        result["teachers"][name] = {
            "fusion": {"normalize": fused.normalize, "dense_weight": fused.dense_weight},
            "check": paired(dense_g, hybrid_g),
            "labels": {
                "dense": ev["dense"]["ndcg@10"],
                "teacher": ev["ndcg@10"],
                "lead": round(ev["ndcg@10"] - ev["dense"]["ndcg@10"], 4),
            },  # fmt: skip
        }
        print(corpus.name, name, result["teachers"][name], flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="outputs/suite")
    p.add_argument("--corpora", default=None)
    p.add_argument("--extra", action="append")
    p.add_argument("--report", default=None)
    ns = p.parse_args()
    rows = [corpus_leads(c, ns) for c in S.corpora(ns).values()]
    lines = ["| corpus | teacher | fusion | check: lead on the inverse clozes | verdict | labels: start | teacher | "
             "lead |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for name, t in r["teachers"].items():
            c, lab = t["check"], t["labels"]
            lines.append(f"| {r['corpus']} | {name} | {t['fusion']['normalize']} {t['fusion']['dense_weight']} | "
                         f"{c['difference']:+.4f} ± {c['se']:.4f} | {c['verdict']} | {lab['dense']:.4f} | "
                         f"{lab['teacher']:.4f} | {lab['lead']:+.4f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if ns.report:
        Path(ns.report).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
