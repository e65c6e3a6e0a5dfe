"""Does the guard's cloze reading see more with several clozes per held-out document? (issue 64, item 4)

The guard reads one cloze per held-out document (``OUT/queries/<corpus>.guard.jsonl``) and compares the two models
query by query; on the small corpora of the suite (NQ-UTD: about 180 clozes) a gain the labels see lies within one
standard error. This probe reads, after the fact, each finished corpus-only row of :mod:`suite` (``recipe`` rows with
their run folder) with ``--rounds`` clozes per held-out document (distinct sentences of it, each dropped as the guard
drops them, each against its own rest; round 1 is the guard's own draw rule), the two models' per-document mean
compared document by document (mean, standard error, verdict at one SE), dense and hybrid (both with the start's
fusion, as the recipe's hybrids keep it). Beside each row: what the labels read (``row.json``).

    python scripts/studies/cloze_rounds.py [--work outputs/suite] [--rounds 1,3,5] [--report PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import suite as S  # noqa: E402


def clozes_of(doc_ids, texts, rows, seed: int, rounds: int) -> list[list]:
    """``rounds`` lists of clozes: round r holds, for each document of ``rows`` that has an r-th usable sentence, the
    cloze of that sentence (each document's sentences in a seeded order)."""
    from hf_cocodr.retrieval.held_out import (
        DROP_SHARE,
        MIN_LEFT,
        Cloze,
        _stemmer,
        drop_shared_words,
    )
    from hf_cocodr.retrieval.pseudo_queries import MIN_SENTENCE_WORDS, count_words, split_sentences

    rng, stem = np.random.default_rng([seed, 29]), _stemmer()
    out: list[list] = [[] for _ in range(rounds)]
    for row in rows:
        sentences = split_sentences(texts[row])
        usable = [i for i, x in enumerate(sentences) if count_words(x) >= MIN_SENTENCE_WORDS]
        if len(sentences) < 2:
            continue
        for r, pick in enumerate(rng.permutation(usable).tolist()[:rounds]):
            rest = " ".join(x for i, x in enumerate(sentences) if i != pick)
            dropped = drop_shared_words(sentences[pick], rest, DROP_SHARE, rng, stem)
            if count_words(dropped) >= MIN_LEFT:
                out[r].append(Cloze(str(doc_ids[row]), sentences[pick], dropped, rest))
    return out


def per_doc_paired(start: dict[str, list[float]], adapted: dict[str, list[float]]) -> dict:
    docs = sorted(start)
    d = np.array([np.mean(adapted[k]) - np.mean(start[k]) for k in docs])
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    m = float(d.mean()) if n else 0.0
    return {"docs": n, "clozes": sum(len(v) for v in start.values()), "difference": round(m, 4), "se": round(se, 4),
            "verdict": "better" if m > se else "worse" if m < -se else "no difference"}  # fmt: skip


def row_probe(row_dir: Path, corpus: S.Corpus, ns) -> dict | None:
    out_file = row_dir / f"cloze_rounds_{ns.tag}.json"
    if out_file.is_file():
        return json.loads(out_file.read_text())
    run = row_dir / "run"
    if not (run / "model").is_dir() or not (run / "recipe.json").is_file():
        return None
    from hf_cocodr import load_encoder
    from hf_cocodr.retrieval.encoding import encode_documents, encode_texts
    from hf_cocodr.retrieval.encoding_cache import document_encoder_key
    from hf_cocodr.retrieval.held_out import HeldOutView
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.session import EncodingSession

    t0 = time.time()
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts

    folder = str(S.folder(corpus, Path(ns.work)))
    start, adapted = load_encoder(S.model_path()), load_encoder(str(run / "model"))
    if document_encoder_key(start) != document_encoder_key(adapted):
        return {"skipped": "a full-side model"}
    hybrid = HybridRetriever.build(start, folder, batch_size=64, session=EncodingSession())  # the start's fit
    emb, fusion = hybrid.embeddings, hybrid.fusion
    ids, texts = _corpus_ids_texts(folder)
    assert list(ids) == list(hybrid.doc_ids)
    row_of = {d: i for i, d in enumerate(ids)}
    from hf_cocodr.recipe.guard import read_rows

    guard_rows = [r for f in (run / "queries").glob("*.guard.jsonl") for r in read_rows(f)]
    held = [row_of[r["doc_id"]] for r in guard_rows if r.get("kind") == "cloze" and r["doc_id"] in row_of]
    seed = json.loads(row_dir.joinpath("row.json").read_text())["seed"]
    rounds = clozes_of(ids, texts, held, seed, max(ns.rounds))
    scores: dict[str, dict[str, dict[str, list[float]]]] = {
        ch: {"start": {}, "adapted": {}} for ch in ("dense", "hybrid")
    }
    out = {"fusion": {"normalize": fusion.normalize, "dense_weight": fusion.dense_weight}, "readings": {}}
    for r, clozes in enumerate(rounds):
        if not clozes:
            break
        view = HeldOutView(texts, emb, ids, clozes,
                           lambda rests: encode_documents(start, rests, batch_size=64))  # fmt: skip
        queries = [c.dropped for c in view.clozes]
        for name, model in (("start", start), ("adapted", adapted)):
            vec = encode_texts(model, queries, kind="query", batch_size=64)
            for ch, vals in (("dense", view.dense_scores(vec)), ("hybrid", view.hybrid_scores(queries, vec, fusion))):
                for c, v in zip(view.clozes, vals):
                    scores[ch][name].setdefault(c.doc_id, []).append(v)
        if r + 1 in ns.rounds:
            out["readings"][r + 1] = {ch: per_doc_paired(s["start"], s["adapted"]) for ch, s in scores.items()}
    out["seconds"] = round(time.time() - t0, 1)
    out_file.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="outputs/suite")
    p.add_argument("--corpora", default=None)
    p.add_argument("--extra", action="append")
    p.add_argument("--rounds", default="1,3,5")
    p.add_argument("--tag", default="v1")
    p.add_argument("--budget-minutes", type=float, default=15.0)
    p.add_argument("--report", default=None)
    ns = p.parse_args()
    ns.rounds = [int(x) for x in ns.rounds.split(",")]
    lines = [
        "| corpus | seed | labels: dense | hybrid | "
        + " | ".join(f"{k} per doc: dense | hybrid" for k in ns.rounds)
        + " |",
        "|---|---|---|---|" + "---|---|" * len(ns.rounds),
    ]
    rows = {}
    for name, corpus in S.corpora(ns).items():
        for row_dir in sorted((Path(ns.work) / f"recipe{ns.budget_minutes:g}" / "default" / name).glob("seed*")):
            if not (row_dir / "row.json").is_file():
                continue
            got = row_probe(row_dir, corpus, ns)
            if not got or "readings" not in got:
                continue
            row = json.loads((row_dir / "row.json").read_text())
            rows[f"{name}/{row_dir.name}"] = got
            cells = []
            for k in ns.rounds:
                rd = got["readings"].get(str(k)) or got["readings"].get(k)
                cells += [f"{rd[ch]['difference']:+.4f} ± {rd[ch]['se']:.4f} ({rd[ch]['clozes']})" if rd else "–"
                          for ch in ("dense", "hybrid")]  # fmt: skip
            lines.append(f"| {name} | {row['seed']} | {row['dense'] - row['start']:+.4f} | "
                         f"{row['hybrid'] - row['start_hybrid']:+.4f} | " + " | ".join(cells) + " |")  # fmt: skip
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if ns.report:
        Path(ns.report).with_suffix(".md").write_text(
            "# The guard's cloze reading with several clozes per held-out document\n\n" + (__doc__ or "").split(
                "\n\n")[1] + "\n\n" + text + "\n")  # fmt: skip
        Path(ns.report).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
