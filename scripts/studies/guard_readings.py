"""Which label-free reading sees what the labels see when the corpus-only recipe adapts a model? (issue 64, item 4)

For every finished corpus-only recipe row of the development suite (:mod:`suite`, ``recipe`` rows) this reads, after
the fact, the adapted model (``OUT/model``) against the starting model on queries neither trained on, drawn from the
documents the training's pseudo-queries did not come from (``OUT/queries/<corpus>.train.jsonl`` says which did):

- ``ict``: a sentence of a held-out document against the rest of its document (the inverse cloze; lexical: the rest
  shares many of its words);
- ``nolex``: the same sentence with every word the rest of its document shares removed (at least 3 words left): BM25
  cannot find the rest from what is left, only meaning can, so the reading is not lexical by construction;
- ``nolex-half``: half of the shared words removed (seeded);
- ``sub-half`` / ``sub-all``: half (all) of the shared words *replaced* by their nearest word in the start model's
  input word embeddings that is a whole word of another stem (``profits`` → ``revenues``, ``heart`` → ``cardiac``;
  a word with no such neighbour is dropped): the query keeps its meaning and loses its words, so BM25 finds the rest
  only through the words left, and no trained pseudo-query is of this form;
- ``para``: a window of at most 12 words of the sentence (question-length) with half of its content words replaced
  so, against its whole document (the answer holds the sentence, as a question's answer does); ``para-all``: all of
  them replaced; ``para-drop``: half of them dropped, none replaced (the trained crops' form, on held-out documents);

each as the dense model's nDCG@10 of the rest (``dense``) and as the hybrid's (``hybrid``: each model with the fusion
its own hybrid would get without queries, the label-free fit), per query paired adapted − start: the mean, its
standard error and a verdict at one SE. Beside them, the labels: the real dev queries' per-query nDCG@10, dense and
hybrid (the recipe's own evaluation fits the hybrid given their text), paired likewise. The table gives, per reading,
how often its verdict agrees with the labels' where the labels see a difference beyond one SE.

    python scripts/studies/guard_readings.py [--work outputs/suite] [--arms default] [--report PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import suite as S  # noqa: E402
from fusion_signals import DEPTH, fused_ranks, ndcg_rows  # noqa: E402

N_HELD = 300
_WORD = re.compile(r"\w+", re.UNICODE)


def verdict(d: np.ndarray) -> dict:
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    m = float(d.mean()) if n else 0.0
    v = "worse" if m < -se else "better" if m > se else "no difference"
    return {"n": n, "difference": round(m, 4), "se": round(se, 4), "verdict": v}


def drop_shared(query: str, rest: str, share: float, rng) -> str:
    shared = {w.lower() for w in _WORD.findall(rest)}
    out = []
    for w in query.split():
        if {x.lower() for x in _WORD.findall(w)} & shared and rng.random() < share:
            continue
        out.append(w)
    return " ".join(out)


class Substitutes:
    """Each word's nearest word in a model's input word embeddings (cosine) that is one word piece, alphabetic and of
    another stem; None where none is among its 16 nearest."""

    def __init__(self, model):
        import Stemmer
        import torch

        first = model[0]
        self.tok = first.tokenizer
        weight = first.auto_model.get_input_embeddings().weight.detach().float()
        self.emb = torch.nn.functional.normalize(weight, dim=-1)
        self.vocab = self.tok.convert_ids_to_tokens(list(range(self.emb.shape[0])))
        self.stem = Stemmer.Stemmer("english").stemWord
        self.memo: dict[str, str | None] = {}

    def __call__(self, word: str) -> str | None:
        key = word.lower()
        if key not in self.memo:
            ids = self.tok(key, add_special_tokens=False).input_ids
            best = None
            if len(ids) == 1:
                top = (self.emb @ self.emb[ids[0]]).topk(16).indices.tolist()
                for t in top[1:]:
                    cand = self.vocab[t]
                    if cand.isalpha() and len(cand) > 2 and self.stem(cand) != self.stem(key):
                        best = cand
                        break
            self.memo[key] = best
        return self.memo[key]


def replace_words(query: str, pick, share: float, rng, subs: Substitutes) -> str:
    """``query`` with a ``share`` of the words ``pick`` accepts replaced by :class:`Substitutes` (dropped where a word
    has none)."""
    out = []
    for w in query.split():
        core = "".join(_WORD.findall(w)).lower()
        if core and pick(core) and rng.random() < share:
            s = subs(core)
            if s:
                out.append(s)
            continue
        out.append(w)
    return " ".join(out)


def held_out_picks(texts: list[str], skip_rows: set[int], seed: int = 7, subs: Substitutes | None = None):
    """The readings' pseudo-queries: ``(row, query, rest)`` per family, from documents outside ``skip_rows``."""
    from bm25s.stopwords import STOPWORDS_EN

    from hf_cocodr.retrieval.pseudo_queries import count_words, split_sentences

    stop = set(STOPWORDS_EN)
    rng = np.random.default_rng(seed)
    fams: dict[str, list] = {"ict": [], "nolex": [], "nolex-half": []}
    if subs is not None:
        fams.update({"sub-half": [], "sub-all": [], "para": [], "para-all": [], "para-drop": []})
    for row in rng.permutation(len(texts)).tolist():
        if row in skip_rows:
            continue
        sents = split_sentences(texts[row])
        usable = [i for i, x in enumerate(sents) if count_words(x) >= 4]
        if len(sents) < 2 or not usable:
            continue
        pick = usable[int(rng.integers(len(usable)))]
        q, rest = sents[pick], " ".join(x for i, x in enumerate(sents) if i != pick)
        fams["ict"].append((row, q, rest))
        for fam, share in (("nolex", 1.0), ("nolex-half", 0.5)):
            q2 = drop_shared(q, rest, share, rng)
            if len(q2.split()) >= 3:
                fams[fam].append((row, q2, rest))
        if subs is not None:
            shared = {w.lower() for w in _WORD.findall(rest)} - stop
            for fam, share in (("sub-half", 0.5), ("sub-all", 1.0)):
                q2 = replace_words(q, shared.__contains__, share, rng, subs)
                if len(q2.split()) >= 3:
                    fams[fam].append((row, q2, rest))
            words = q.split()
            at = int(rng.integers(max(1, len(words) - 11)))
            window = " ".join(words[at : at + 12])
            content = lambda w: w not in stop and len(w) > 2  # noqa: E731
            for fam, q3 in (
                ("para", replace_words(window, content, 0.5, rng, subs)),
                ("para-all", replace_words(window, content, 1.0, rng, subs)),
                (
                    "para-drop",
                    " ".join(
                        w
                        for w in window.split()
                        if not (content("".join(_WORD.findall(w)).lower()) and rng.random() < 0.5)
                    ),
                ),
            ):
                if len(q3.split()) >= 3:
                    fams[fam].append((row, q3, texts[row]))
        if len(fams["ict"]) >= N_HELD:
            break
    return fams


def row_readings(row_dir: Path, corpus: S.Corpus, ns) -> dict | None:
    out_file = row_dir / ns.cache_name
    if out_file.is_file():
        return json.loads(out_file.read_text())
    if ns.cached:
        return None
    run = row_dir / "run"
    if not (run / "model").is_dir() or not (run / "eval.json").is_file():
        return None
    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.encoding_cache import document_encoder_key
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.fusion_fit import _bm25_side, _pseudo_rankings, fit_fusion
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.session import EncodingSession

    t0 = time.time()
    data = load_beir(S.folder(corpus, Path(ns.work)), corpus.split)
    start, adapted = load_encoder(S.model_path()), load_encoder(str(run / "model"))
    if document_encoder_key(start) != document_encoder_key(adapted):
        return {"skipped": "the adapted model's documents are not the start's (a full-side run)"}
    session = EncodingSession(precision="bf16", cache=True)  # (as the recipe encodes here)
    hybrid = HybridRetriever.build(start, data.corpus, fusion=FusionConfig(dense_weight=0.5), fit=False,
                                   session=session)  # fmt: skip
    texts, ids, emb = list(hybrid._texts), hybrid.doc_ids, hybrid.embeddings
    row_of = {d: i for i, d in enumerate(ids)}
    trained_docs = set()
    for f in (run / "queries").glob("*.train.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                d = json.loads(line).get("doc_id")
                if d in row_of:
                    trained_docs.add(row_of[d])
    enc = {
        name: (lambda q, m=m: encode_texts(m, q, kind="query", batch_size=64, session=session))
        for name, m in (("start", start), ("adapted", adapted))
    }
    enc_d = lambda d: encode_documents(start, d, batch_size=64, session=session)  # noqa: E731
    fusions = {
        name: fit_fusion(FusionConfig(), texts, emb, enc[name], enc_d, bm25=hybrid.bm25)
        for name in ("start", "adapted")
    }
    result: dict = {"fusions": {k: [v.normalize, v.dense_weight] for k, v in fusions.items()}, "readings": {}}
    for fam, picks in held_out_picks(texts, trained_docs, subs=Substitutes(start) if ns.subs else None).items():
        if len(picks) < 8:
            continue
        side = _bm25_side(picks, texts, DEPTH)
        per = {}
        for name in ("start", "adapted"):
            rankings = _pseudo_rankings(picks, DEPTH, emb, enc[name], enc_d, side)
            f = fusions[name]
            dense, hyb = [], []
            for r in rankings:
                g = fused_ranks(*r[:4], f.normalize, {r[4]: 1.0})
                dense.append(ndcg_rows(g[-1], [1.0]))
                w_i = int(round(float(f.dense_weight) / 0.05))
                hyb.append(ndcg_rows(g[w_i], [1.0]))
            per[name] = (np.array(dense), np.array(hyb))
        result["readings"][f"{fam}-dense"] = verdict(per["adapted"][0] - per["start"][0])
        result["readings"][f"{fam}-hybrid"] = verdict(per["adapted"][1] - per["start"][1])
        result["readings"][f"{fam}-dense"]["start"] = round(float(per["start"][0].mean()), 4)
        # the teacher's lead: the start's hybrid (its fusion fitted without queries, the corpus-only teacher's)
        # against the start alone
        result["readings"][f"{fam}-lead"] = verdict(per["start"][1] - per["start"][0])
    # the labels: the real queries, per query (dense; hybrid with each model's fusion fitted given their text)
    qmap = dict(zip(data.queries["_id"], data.queries["text"]))
    qids = [q for q in data.qrels if q in qmap and any(g > 0 for g in data.qrels[q].values())]
    qtexts = [qmap[q] for q in qids]
    b_s, b_r = hybrid.search_bm25(qtexts, DEPTH)
    labels = {}
    for name in ("start", "adapted"):
        qv = enc[name](qtexts)
        d_s, d_r = hybrid.search_dense(qtexts, DEPTH, query_embeddings=qv)
        f = fit_fusion(FusionConfig(), texts, emb, enc[name], enc_d, queries=qtexts, bm25=hybrid.bm25)
        w_i = int(round(float(f.dense_weight) / 0.05))
        dense, hyb = [], []
        for q, ds, dr, bs, br in zip(qids, d_s, d_r, b_s, b_r):
            t = {row_of[d]: float(g) for d, g in data.qrels[q].items() if d in row_of and g > 0}
            g = fused_ranks(dr, ds, br, bs, f.normalize, t)
            dense.append(ndcg_rows(g[-1], list(t.values())))
            hyb.append(ndcg_rows(g[w_i], list(t.values())))
        labels[name] = (np.array(dense), np.array(hyb))
        if name == "start":  # the teacher, as the corpus-only recipe fits it (no queries)
            w_t = int(round(float(fusions["start"].dense_weight) / 0.05))
            lead = []
            for q, ds, dr, bs, br in zip(qids, d_s, d_r, b_s, b_r):
                t = {row_of[d]: float(g) for d, g in data.qrels[q].items() if d in row_of and g > 0}
                g = fused_ranks(dr, ds, br, bs, fusions["start"].normalize, t)
                lead.append(ndcg_rows(g[w_t], list(t.values())) - ndcg_rows(g[-1], list(t.values())))
    result["labels"] = {
        "dense": verdict(labels["adapted"][0] - labels["start"][0]),
        "hybrid": verdict(labels["adapted"][1] - labels["start"][1]),
        "lead": verdict(np.array(lead)),
    }
    result["seconds"] = round(time.time() - t0, 1)
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def row_readings_v2(row_dir: Path, corpus: S.Corpus, ns) -> dict | None:
    """The library's held-out cloze readings (:mod:`hf_cocodr.retrieval.held_out`) of one finished row: the teacher's
    lead over the start on the plain sentences (the corpus-only teacher: z-scores at weight 0.5), and the adapted
    model against the start on the dropped sentences, dense and hybrid (each model's fusion fitted without queries),
    beside the labels; cached in ``guard_v2.json``."""
    out_file = row_dir / "guard_v2.json"
    if out_file.is_file():
        return json.loads(out_file.read_text())
    run = row_dir / "run"
    if not (run / "model").is_dir() or not (row_dir / "guard_readings.json").is_file():
        return None
    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.fusion_fit import fit_fusion
    from hf_cocodr.retrieval.held_out import HeldOutView, draw_clozes, paired
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.session import EncodingSession

    t0 = time.time()
    data = load_beir(S.folder(corpus, Path(ns.work)), corpus.split)
    start, adapted = load_encoder(S.model_path()), load_encoder(str(run / "model"))
    session = EncodingSession(precision="bf16", cache=True)
    hybrid = HybridRetriever.build(start, data.corpus, fusion=FusionConfig(dense_weight=0.5), fit=False,
                                   session=session)  # fmt: skip
    texts, ids, emb = list(hybrid._texts), hybrid.doc_ids, hybrid.embeddings
    row_of = {d: i for i, d in enumerate(ids)}
    trained = set()
    for f in (run / "queries").glob("*.train.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line).get("doc_id") if line.strip() else None
            if d in row_of:
                trained.add(row_of[d])
    held = [r for r in np.random.default_rng(7).permutation(len(ids)).tolist() if r not in trained][: ns.held]
    clozes = draw_clozes(ids, texts, held, seed=7)
    enc_d = lambda d: encode_documents(start, d, batch_size=64, session=session)  # noqa: E731
    view = HeldOutView(texts, emb, ids, clozes, enc_d)
    enc = {n: (lambda q, m=m: encode_texts(m, q, kind="query", batch_size=64, session=session))
           for n, m in (("start", start), ("adapted", adapted))}  # fmt: skip
    plain, dropped = [c.sentence for c in view.clozes], [c.dropped for c in view.clozes]
    teacher = FusionConfig(dense_weight=0.5, normalize="z", bm25_zeros=False, depth=100)
    qv_plain = enc["start"](plain)
    lead = paired(view.dense_scores(qv_plain), view.hybrid_scores(plain, qv_plain, teacher))
    fusions = {n: fit_fusion(FusionConfig(), texts, emb, enc[n], enc_d, bm25=hybrid.bm25) for n in enc}
    dense, hyb = {}, {}
    for n in enc:
        qv = enc[n](dropped)
        dense[n], hyb[n] = view.dense_scores(qv), view.hybrid_scores(dropped, qv, fusions[n])
    result = {
        "held_out_docs": len(held),
        "clozes": len(view.clozes),
        "teacher_lead": lead,
        "cloze_dense": paired(dense["start"], dense["adapted"]),
        "cloze_hybrid": paired(hyb["start"], hyb["adapted"]),
        "fusions": {n: [f.normalize, f.dense_weight] for n, f in fusions.items()},
        "labels": json.loads((row_dir / "guard_readings.json").read_text())["labels"],
        "seconds": round(time.time() - t0, 1),
    }
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def decision_v2(r: dict) -> str:
    """What the new default would export: the start where the teacher does not lead it (the distillation would not
    run) or where the guard cannot vouch for the adapted model (its dense cloze reading not better, or its hybrid's
    worse), else the adapted model."""
    if r["teacher_lead"]["verdict"] != "better":
        return "start (teacher does not lead)"
    if r["cloze_dense"]["verdict"] == "worse" or r["cloze_hybrid"]["verdict"] == "worse":
        return "start (worse)"
    if r["cloze_dense"]["verdict"] != "better":
        return "start (unverified)"
    return "adapted"


def report_v2(rows: list) -> str:
    lines = ["| arm | corpus | seed | labels dense | labels hybrid | teacher lead | cloze dense | cloze hybrid | "
             "exports | dense gain | hybrid gain |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    cell = lambda v: f"{v['difference']:+.4f} ± {v['se']:.4f}" if "se" in v else v["verdict"]  # noqa: E731
    for arm, c, seed, r in rows:
        lab, what = r["labels"], decision_v2(r)
        keep = what == "adapted"
        lines.append(f"| {arm} | {c} | {seed} | {cell(lab['dense'])} | {cell(lab['hybrid'])} | {cell(r['teacher_lead'])} "
                     f"| {cell(r['cloze_dense'])} | {cell(r['cloze_hybrid'])} | {what} | "
                     f"{lab['dense']['difference'] if keep else 0:+.4f} | {lab['hybrid']['difference'] if keep else 0:+.4f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="outputs/suite")
    p.add_argument("--corpora", default=None)
    p.add_argument("--extra", action="append")
    p.add_argument("--arms", default="default")
    p.add_argument("--budget-minutes", type=float, default=15.0)
    p.add_argument("--report", default=None)
    p.add_argument("--held", type=int, default=400, help="held-out documents the v2 readings draw from")
    p.add_argument("--v2", action="store_true", help="the library's held-out cloze readings and the new decision")
    p.add_argument("--subs", action="store_true", help="also the families of replaced words (sub-half, sub-all, para)")
    p.add_argument("--cached", action="store_true", help="report the rows already read, read no other")
    p.add_argument("--cache-name", default="guard_readings.json", help="the file each row's readings are cached in")
    ns = p.parse_args()
    suite = S.corpora(ns)
    rows = []
    for arm in ns.arms.split(","):
        for c, corpus in suite.items():
            for row_dir in sorted((Path(ns.work) / f"recipe{ns.budget_minutes:g}" / arm / c).glob("seed*")):
                r = row_readings(row_dir, corpus, ns)
                if ns.v2 and r and "readings" in r:
                    r2 = row_readings_v2(row_dir, corpus, ns)
                    if r2:
                        rows.append((arm, c, row_dir.name, r2))
                        print(arm, c, row_dir.name, decision_v2(r2), flush=True)
                    continue
                if r and "readings" in r:
                    rows.append((arm, c, row_dir.name, r))
                    print(arm, c, row_dir.name, r["labels"], {k: v["verdict"] for k, v in r["readings"].items()},
                          flush=True)  # fmt: skip
    if ns.v2:
        text = report_v2(rows)
        print(text)
        if ns.report:
            Path(ns.report).with_suffix(".md").write_text(text)
        return 0
    names = sorted({k for *_, r in rows for k in r["readings"]})
    lines = ["# Label-free guard readings against the labels (corpus-only recipe rows of the suite)", "",
             "| arm | corpus | seed | labels dense | labels hybrid | labels: teacher lead | " + " | ".join(names) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(names)]  # fmt: skip
    agree = {n: [0, 0] for n in names}
    vouched = {n: [0, 0] for n in names}  # reads better where the labels do not: of the rows where they do not
    for arm, c, seed, r in rows:
        lab = r["labels"]
        cells = []
        for n in names:
            v = r["readings"].get(n)
            if not v:
                cells.append("–")
                continue
            cells.append(f"{v['difference']:+.4f} ± {v['se']:.4f}")
            side = "hybrid" if n.endswith("hybrid") else "lead" if n.endswith("lead") else "dense"
            if side not in lab:
                continue
            target = lab[side]["verdict"]
            if target != "better":
                vouched[n][1] += 1
                vouched[n][0] += v["verdict"] == "better"
            if target != "no difference":
                agree[n][1] += 1
                agree[n][0] += v["verdict"] == target
        lines.append(f"| {arm} | {c} | {seed} | {lab['dense']['difference']:+.4f} ± {lab['dense']['se']:.4f} | "
                     f"{lab['hybrid']['difference']:+.4f} ± {lab['hybrid']['se']:.4f} | "
                     + (f"{lab['lead']['difference']:+.4f} ± {lab['lead']['se']:.4f}" if "lead" in lab else "–")
                     + " | " + " | ".join(cells) + " |")  # fmt: skip
    lines += ["", "Agreement with the labels where they see a difference beyond one SE (dense readings against the "
              "dense labels, hybrid against hybrid, the teacher's lead against its lead on the labels):", ""]  # fmt: skip
    lines += [f"- `{n}`: {a} of {t}; reads `better` where the labels do not: {vouched[n][0]} of {vouched[n][1]}"
              for n, (a, t) in agree.items()]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if ns.report:
        Path(ns.report).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
