"""Which label-free signal tells the fusion fit when BM25 adds nothing to the dense model? (issue 64, item 2)

For each corpus of the development suite (:mod:`suite`) the start model's vectors, its real queries' two top-200
lists and several families of pseudo-queries are computed once and cached under ``--work`` (``signals/<corpus>.json``:
curves only, a few kB). From them:

- the **real curve**: nDCG@10 (graded, as pytrec_eval's ``ndcg_cut_10``) of the fused ranking over the real queries at
  every (normalisation, dense weight) of the fit's grid, the judgments read *only here*, to score the rules;
- each **pseudo-query family's curve** (the fit's mean nDCG@10 of the source document, per query, so a rule can take
  standard errors): ``ict`` (today's fit without queries: a sentence against the rest of its document), ``ict-cal``
  (today's fit given the queries' text: the share of the sentence's words left in the rest chosen by BM25's top-score
  z), ``span`` / ``keywords`` / ``title`` (the recipe's training kinds, their document unchanged), ``ict-nolex`` (a
  sentence with every word the rest of its document shares removed: BM25 cannot find the rest from what is left, only
  meaning can);
- label-free **statistics of the real queries' text** (no judgments): the two systems' top-10 agreement, BM25's and
  the dense model's top-score z, and the same for each family.

:data:`RULES` map what a corpus gives without labels to a (normalisation, weight); the table scores each rule on every
corpus against max(dense, BM25) − 0.005, and ``--loco`` reports the rule chosen on the others for each corpus.

    python scripts/studies/fusion_signals.py [--corpora ...] [--extra NAME=PATH:SPLIT] [--report PATH]
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

NORMS = ("z", "minmax", "dbsf")
GRID = tuple(round(0.05 * i, 2) for i in range(21))
DEPTH = 200
N_PSEUDO = 400
MAX_REAL = 1000
FAMILIES = ("ict", "ict-cal", "span", "keywords", "title", "ict-nolex")
_WORD = re.compile(r"\w+", re.UNICODE)


# -------------------------------------------------------------------------------------------------------- rankings
def fused_ranks(d_rows, d_scores, b_rows, b_scores, norm: str, targets: dict[int, float] | None = None):
    """For one query, over every weight of :data:`GRID` at once, the fused top 10's gains: ``(len(GRID), 10)`` array
    of each rank's relevance (``targets``: row -> grade)."""
    from hf_cocodr.retrieval.fusion import FusionConfig, candidate_parts

    cfg = FusionConfig(dense_weight=0.5, normalize=norm, depth=DEPTH)
    cand, dp, bp, drank = candidate_parts(d_rows, d_scores, b_rows, b_scores, cfg)
    rel = np.array([targets.get(int(r), 0.0) for r in cand])
    out = np.zeros((len(GRID), 10))
    for i, w in enumerate(GRID):
        fused = w * dp + (1 - w) * bp
        order = np.lexsort((cand, drank, -fused))[:10]
        out[i, : len(order)] = rel[order]
    return out


def ndcg_rows(gains: np.ndarray, ideal: list[float]) -> np.ndarray:
    disc = 1.0 / np.log2(np.arange(2, 12))
    idcg = sum(g * d for g, d in zip(sorted(ideal, reverse=True)[:10], disc))
    return (gains * disc).sum(axis=-1) / idcg if idcg > 0 else np.zeros(gains.shape[:-1])


def curves(rankings, targets_list, ideals) -> dict[str, list[list[float]]]:
    """Per normalisation, the (query, weight) nDCG@10 matrix, as lists (``rankings``: one (d_rows, d_scores, b_rows,
    b_scores) per query)."""
    out = {}
    for norm in NORMS:
        m = np.stack([ndcg_rows(fused_ranks(*r, norm, t), i) for r, t, i in zip(rankings, targets_list, ideals)])
        out[norm] = np.round(m, 5).tolist()
    return out


def top_z(scores: np.ndarray) -> np.ndarray:
    s = np.asarray(scores, np.float64)
    std = s.std(axis=1)
    return np.where(std > 0, (s[:, 0] - s.mean(axis=1)) / np.where(std > 0, std, 1), 0.0)


def overlap10(a_rows: np.ndarray, b_rows: np.ndarray, b_scores: np.ndarray) -> np.ndarray:
    out = []
    for a, b, s in zip(a_rows, b_rows, b_scores):
        bb = set(int(x) for x, v in zip(b[:10], s[:10]) if v > 0)
        out.append(len(set(int(x) for x in a[:10]) & bb) / 10)
    return np.array(out)


# ----------------------------------------------------------------------------------------------------- one corpus
def no_lexical(query: str, rest: str) -> str:
    """``query`` without every word ``rest`` shares (case folded)."""
    shared = {w.lower() for w in _WORD.findall(rest)}
    return " ".join(w for w in query.split() if not ({x.lower() for x in _WORD.findall(w)} & shared))


DROP_SHARES = (0.25, 0.5, 0.75)


def drop_shared(query: str, rest: str, share: float, rng) -> str:
    """``query`` with each word ``rest`` shares dropped with probability ``share``."""
    shared = {w.lower() for w in _WORD.findall(rest)}
    out = [w for w in query.split() if not ({x.lower() for x in _WORD.findall(w)} & shared and rng.random() < share)]
    return " ".join(out)


def corpus_signals(corpus: S.Corpus, ns) -> dict:
    out_file = Path(ns.work) / "signals" / f"{corpus.name}.json"
    if out_file.is_file():
        return json.loads(out_file.read_text())
    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.fusion_fit import _bm25_side, _pseudo_rankings, fit_fusion
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.pseudo_queries import PseudoQueryDrawer, inverse_cloze
    from hf_cocodr.retrieval.session import EncodingSession

    t0 = time.time()
    data = load_beir(S.folder(corpus, Path(ns.work)), corpus.split)
    model = load_encoder(S.model_path())
    session = EncodingSession(precision="bf16", cache=True)  # (as the recipe encodes here)
    hybrid = HybridRetriever.build(
        model, data.corpus, fusion=FusionConfig(dense_weight=0.5), fit=False, session=session
    )
    texts = list(hybrid._texts) if hybrid._texts is not None else None
    ids = hybrid.doc_ids
    row_of = {d: i for i, d in enumerate(ids)}
    if texts is None:
        from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

        _, texts = _corpus_ids_texts(data.corpus)
    emb = hybrid.embeddings
    qmap = dict(zip(data.queries["_id"], data.queries["text"]))
    qids = [q for q in data.qrels if q in qmap and any(g > 0 for g in data.qrels[q].values())][:MAX_REAL]
    qtexts = [qmap[q] for q in qids]
    enc_q = lambda q: encode_texts(model, q, kind="query", batch_size=64, session=session)  # noqa: E731
    enc_d = lambda d: encode_documents(model, d, batch_size=64, session=session)  # noqa: E731
    d_s, d_r = hybrid.search_dense(qtexts, DEPTH)
    b_s, b_r = hybrid.search_bm25(qtexts, DEPTH)
    real_t = [{row_of[d]: float(g) for d, g in data.qrels[q].items() if d in row_of and g > 0} for q in qids]
    real = {
        "curves": curves(list(zip(d_r, d_s, b_r, b_s)), real_t, [list(t.values()) for t in real_t]),
        "stats": {
            "bm25_top_z": float(np.median(top_z(b_s))),
            "dense_top_z": float(np.median(top_z(d_s))),
            "overlap10": float(np.mean(overlap10(d_r, b_r, b_s))),
            "words": float(np.median([len(q.split()) for q in qtexts])),
        },
        "queries": len(qids),
    }
    fams: dict[str, dict] = {}
    # the fit's own families: the inverse cloze at share 0 and at the share today's fit calibrates to the queries
    fitted = fit_fusion(FusionConfig(), texts, emb, enc_q, enc_d, queries=qtexts, bm25=hybrid.bm25)
    share = float(fitted.fit.get("keep_share", 0.0))
    drawer = PseudoQueryDrawer(ids, data.corpus["title"], data.corpus["text"], seed=0)
    picks_by = {
        "ict": inverse_cloze(texts, N_PSEUDO, 0),
        "ict-cal": inverse_cloze(texts, N_PSEUDO, 0, keep_share=share),
    }
    nolex = []
    for row, q, rest in inverse_cloze(texts, N_PSEUDO, 0):
        q2 = no_lexical(q, rest)
        if len(q2.split()) >= 3:
            nolex.append((row, q2, rest))
    picks_by["ict-nolex"] = nolex
    # between the two: a share of the words the rest shares dropped from the sentence (seeded per word)
    for drop in DROP_SHARES:
        rng = np.random.default_rng([0, 2])
        dropped = []
        for row, q, rest in inverse_cloze(texts, N_PSEUDO, 0):
            q2 = drop_shared(q, rest, drop, rng)
            if len(q2.split()) >= 3:
                dropped.append((row, q2, rest))
        picks_by[f"drop-{drop:g}"] = dropped
    for kind in ("span", "keywords", "title"):
        if not drawer.available(kind):
            continue
        drawn = drawer.draw(N_PSEUDO, {kind: 1.0})
        picks_by[kind] = [(row_of[p.doc_id], p.text, texts[row_of[p.doc_id]]) for p in drawn]
    for fam, picks in picks_by.items():
        if len(picks) < 8:
            continue
        side = _bm25_side(picks, texts, DEPTH)
        rankings = _pseudo_rankings(picks, DEPTH, emb, enc_q, enc_d, side)
        targets = [{r[4]: 1.0} for r in rankings]
        fams[fam] = {
            "curves": curves([r[:4] for r in rankings], targets, [[1.0]] * len(rankings)),
            "stats": {
                "bm25_top_z": float(np.median(top_z(side[0]))),
                "dense_top_z": float(np.median(top_z(np.stack([r[1] for r in rankings])))),
                "overlap10": float(np.mean(overlap10(np.stack([r[0] for r in rankings]), side[1], side[0]))),
                "words": float(np.median([len(p[1].split()) for p in picks])),
            },
            "queries": len(picks),
        }
    result = {
        "corpus": corpus.name,
        "docs": len(ids),
        "real": real,
        "families": fams,
        "today": {"normalize": fitted.normalize, "dense_weight": fitted.dense_weight, "keep_share": share},
        "seconds": round(time.time() - t0, 1),
    }
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, out_file)
    return result


def window_cloze(texts, count_tokens, max_tokens: int, n: int, seed: int, keep_share: float) -> list[tuple]:
    """The inverse cloze of :func:`~hf_cocodr.retrieval.pseudo_queries.inverse_cloze` with the sentence drawn among
    those that end within the first ``max_tokens`` tokens of their document (what the dense model reads of it): the
    same draw rule, the same kept words."""
    from hf_cocodr.retrieval.pseudo_queries import count_words, split_sentences

    rng = np.random.default_rng(seed)
    words_rng = np.random.default_rng([seed, 1])
    out = []
    for row in rng.permutation(len(texts)).tolist():
        sentences = split_sentences(texts[row])
        if len(sentences) < 2:
            continue
        ends, acc = [], ""
        for x in sentences:
            acc = f"{acc} {x}".strip()
            ends.append(count_tokens(acc))
        usable = [i for i, x in enumerate(sentences) if count_words(x) >= 4 and ends[i] <= max_tokens]
        if not usable:
            continue
        pick = usable[int(rng.integers(len(usable)))]
        words = sentences[pick].split()
        kept = [w for w, u in zip(words, words_rng.random(len(words))) if u < keep_share]
        parts = [" ".join(kept) if i == pick else x for i, x in enumerate(sentences)]
        out.append((row, sentences[pick], " ".join(x for x in parts if x)))
        if len(out) == n:
            break
    return out


def window_signals(corpus: S.Corpus, ns) -> dict:
    """The inverse cloze within the dense model's window (:func:`window_cloze`), at share 0 (``win``) and at the
    share today's calibration picks for it from the real queries' BM25 top-score z (``win-cal``)."""
    out_file = Path(ns.work) / "signals" / f"{corpus.name}.win.json"
    if out_file.is_file():
        return json.loads(out_file.read_text())
    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.fusion import FusionConfig
    from hf_cocodr.retrieval.fusion_fit import KEEP_SHARES, _bm25_side, _pseudo_rankings, keep_share_for
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.session import EncodingSession

    data = load_beir(S.folder(corpus, Path(ns.work)), corpus.split)
    model = load_encoder(S.model_path())
    tok = model.tokenizer
    count = lambda t: len(tok(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    session = EncodingSession(precision="bf16", cache=True)
    hybrid = HybridRetriever.build(
        model, data.corpus, fusion=FusionConfig(dense_weight=0.5), fit=False, session=session
    )
    texts, emb = list(hybrid._texts), hybrid.embeddings
    qmap = dict(zip(data.queries["_id"], data.queries["text"]))
    qids = [q for q in data.qrels if q in qmap and any(g > 0 for g in data.qrels[q].values())][:MAX_REAL]
    target = float(np.median(top_z(hybrid.search_bm25([qmap[q] for q in qids], DEPTH)[0])))
    enc_q = lambda q: encode_texts(model, q, kind="query", batch_size=64, session=session)  # noqa: E731
    enc_d = lambda d: encode_documents(model, d, batch_size=64, session=session)  # noqa: E731
    window = int(model.max_seq_length) - 2
    sides, medians, picks_at = {}, {}, {}
    for share in KEEP_SHARES:
        picks_at[share] = window_cloze(texts, count, window, N_PSEUDO, 0, share)
        if len(picks_at[share]) < 8:
            break
        sides[share] = _bm25_side(picks_at[share], texts, DEPTH)
        medians[share] = float(np.median(top_z(sides[share][0])))
        if medians[share] >= target:
            break
    fams = {}
    if medians:
        share = keep_share_for(medians, target)
        for fam, sh in (("win", 0.0), ("win-cal", share)):
            picks = picks_at[sh]
            rankings = _pseudo_rankings(picks, DEPTH, emb, enc_q, enc_d, sides[sh])
            fams[fam] = {
                "curves": curves([r[:4] for r in rankings], [{r[4]: 1.0} for r in rankings], [[1.0]] * len(rankings)),
                "stats": {
                    "bm25_top_z": medians[sh],
                    "dense_top_z": float(np.median(top_z(np.stack([r[1] for r in rankings])))),
                    "overlap10": float(
                        np.mean(overlap10(np.stack([r[0] for r in rankings]), sides[sh][1], sides[sh][0]))
                    ),
                    "words": float(np.median([len(p[1].split()) for p in picks])),
                    "keep_share": sh,
                },
                "queries": len(picks),
            }
    out_file.write_text(json.dumps({"families": fams, "window": window}) + "\n")
    return {"families": fams, "window": window}


# ---------------------------------------------------------------------------------------------------------- rules
def mean_curve(fam: dict, norm: str) -> np.ndarray:
    return np.asarray(fam["curves"][norm]).mean(axis=0)


def real_at(sig: dict, norm: str, w: float) -> float:
    return float(mean_curve(sig["real"], norm)[GRID.index(w)])


def choose_today(sig: dict) -> tuple[str, float]:
    t = sig["today"]
    return t["normalize"], float(t["dense_weight"])


def walk(fam: dict, toward: float) -> tuple[str, float]:
    """The peak of ``fam``'s curves, then toward weight ``toward`` while within one SE of the peak (today's rule with a
    target other than 0.5)."""
    per = {n: np.asarray(fam["curves"][n]) for n in NORMS}
    best = max((per[n].mean(axis=0)[i], -k, n, w) for k, n in enumerate(NORMS) for i, w in enumerate(GRID))
    _, _, norm, w = best
    peak = per[norm][:, GRID.index(w)]
    j = GRID.index(w)
    step = 1 if toward > w else -1
    while 0 <= j + step < len(GRID) and abs(GRID[j + step] - toward) < abs(GRID[j] - toward):
        ok = []
        for n in NORMS:
            d = peak - per[n][:, j + step]
            if d.mean() <= d.std(ddof=1) / math.sqrt(len(d)) + 1e-12:
                ok.append(n)
        if not ok:
            break
        j += step
        norm = norm if norm in ok else ok[0]
    return norm, GRID[j]


def stronger(fam: dict) -> float:
    c = mean_curve(fam, "z")
    return 1.0 if c[-1] >= c[0] else 0.0


RULES = {
    "today": lambda sig: choose_today(sig),
    "ict walk to 0.5": lambda sig: walk(sig["families"]["ict"], 0.5),
    "ict walk to stronger": lambda sig: walk(sig["families"]["ict"], stronger(sig["families"]["ict"])),
    "ict-cal walk to stronger": lambda sig: walk(sig["families"]["ict-cal"], stronger(sig["families"]["ict-cal"])),
    "ict-nolex walk to 0.5": lambda sig: walk(sig["families"]["ict-nolex"], 0.5),
}


def rule_rows(sigs: dict[str, dict]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for name, rule in RULES.items():
        for c, sig in sigs.items():
            try:
                norm, w = rule(sig)
            except KeyError:
                continue
            dense, bm25 = real_at(sig, "z", 1.0), real_at(sig, "z", 0.0)
            got = real_at(sig, norm, w)
            out.setdefault(name, {})[c] = {"normalize": norm, "w": w, "ndcg": got, "short": got - max(dense, bm25)}
    return out


def report(sigs: dict[str, dict], ns) -> str:
    lines = ["# Label-free signals for the fusion fit, on the development suite", ""]
    lines += ["| corpus | docs | queries | dense | BM25 | best on the labels (norm w) | today's fit (norm w) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c, sig in sigs.items():
        dense, bm25 = real_at(sig, "z", 1.0), real_at(sig, "z", 0.0)
        best = max((real_at(sig, n, w), n, w) for n in NORMS for w in GRID)
        t = sig["today"]
        lines.append(f"| {c} | {sig['docs']} | {sig['real']['queries']} | {dense:.4f} | {bm25:.4f} | {best[0]:.4f} "
                     f"({best[1]} {best[2]}) | {real_at(sig, t['normalize'], t['dense_weight']):.4f} "
                     f"({t['normalize']} {t['dense_weight']}, share {t['keep_share']}) |")  # fmt: skip
    lines += ["", "Label-free statistics (medians; real queries' text, and each pseudo-query family):", "",
              "| corpus | family | queries | words | BM25 top z | dense top z | top-10 overlap | dense alone | BM25 alone |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c, sig in sigs.items():
        for fam, f in [("real", sig["real"]), *sig["families"].items()]:
            st = f["stats"]
            cz = mean_curve(f, "z")
            lines.append(f"| {c} | {fam} | {f['queries']} | {st['words']:.0f} | {st['bm25_top_z']:.2f} | "
                         f"{st['dense_top_z']:.2f} | {st['overlap10']:.2f} | {cz[-1]:.4f} | {cz[0]:.4f} |")  # fmt: skip
    rows = rule_rows(sigs)
    lines += ["", "Rules: the real nDCG@10 at the (norm, weight) each chooses, and its lead over max(dense, BM25):", "",
              "| rule | " + " | ".join(sigs) + " | holds everywhere |", "|---|" + "---|" * (len(sigs) + 1)]  # fmt: skip
    for name, by in rows.items():
        cells = [f"{by[c]['ndcg']:.4f} ({by[c]['normalize']} {by[c]['w']}; {by[c]['short']:+.4f})" if c in by else "–"
                 for c in sigs]  # fmt: skip
        holds = all(c in by and by[c]["short"] >= -S.MARGIN for c in sigs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if holds else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="outputs/suite")
    p.add_argument("--corpora", default=None)
    p.add_argument("--extra", action="append")
    p.add_argument("--report", default=None)
    ns = p.parse_args()
    sigs = {}
    for c, corpus in S.corpora(ns).items():
        sigs[c] = corpus_signals(corpus, ns)
        sigs[c]["families"].update(window_signals(corpus, ns)["families"])
        print(f"{c}: {sigs[c]['seconds']} s", flush=True)
    text = report(sigs, ns)
    print(text)
    if ns.report:
        Path(ns.report).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
