"""Does the label-free fitted fusion pick a good dense weight for starts of different strength?

For each start model and dev split (SciFact ``train`` claims, NFCorpus ``dev``, SQuAD passages ``dev``; documents at
256 tokens) the corpus and the queries are encoded once and cached under ``--work`` (so arms are resumable); then:

- the fixed convex fusion at every dense weight ``w`` in 0, 0.1, ..., 1 (0: BM25 alone, 1: the dense model alone),
  for each normalisation of :data:`~hf_cocodr.retrieval.fusion_fit.FIT_NORMALIZATIONS` (z-scores, min-max, dbsf);
- the fitted fusion (:func:`hf_cocodr.retrieval.fusion_fit.fit_fusion` at its defaults: the normalisation and the
  weight chosen over pseudo-queries drawn from the corpus, no qrels), and the former rule (z-scores, the weight alone
  fitted: the best weight of the same fit's z-score curve);
- mteb's own :class:`~mteb.models.hybrid_wrappers.HybridSearch` (rrf / dbsf / rsf, equal weights) over the same two
  top-``depth`` lists (the same dense model and the package's bm25s index), in the same process.

    python scripts/studies/hybrid_fit_study.py [--starts all-MiniLM-L6-v2,splade-tiny] [--corpora scifact,nfcorpus,squad]

Writes ``reports/studies/hybrid_fit.md`` / ``.json`` (rows are rewritten as each arm finishes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPORA = {
    "scifact": ("scifact", "train", "SciFact dev"),
    "nfcorpus": ("nfcorpus", "dev", "NFCorpus dev"),
    "squad": ("squad-v1.1-devsub", "dev", "SQuAD dev (subsample)"),
    # the claims a distilled start of the distillation / cpu_budget studies did not train on (it trained on the even
    # ids); the documents are SciFact's, so their vectors are shared with "scifact"
    "scifact-odd": ("scifact-odd", "dev", "SciFact dev (odd-id half)"),
}
DOCUMENTS = {"scifact-odd": "scifact"}  # corpora whose documents (and their cached vectors) are another's
SQUAD_QUERIES = 1000
WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
NORMS = ("z", "minmax", "dbsf")
MTEB_RULES = ("rrf", "dbsf", "rsf")


def squad_subsample(root: Path, work: Path, n_queries: int = SQUAD_QUERIES, seed: int = 0) -> Path:
    """SQuAD v1.1 passages as a third dev corpus, cut to what this CPU can encode: every passage of the dev articles
    (the 2,067 that dev questions are judged against; the 18,891 train passages are left out) and ``n_queries`` dev
    questions drawn at random (``seed``), with their judgments. Lines are copied verbatim into
    ``work/squad-v1.1-devsub`` (a BEIR folder, written once)."""
    out = work / "squad-v1.1-devsub"
    if (out / "qrels" / "dev.tsv").is_file():
        return out
    src = root / "squad-v1.1"
    qrels = [line.split("\t") for line in (src / "qrels" / "dev.tsv").read_text().splitlines()[1:]]
    passages = {doc for _, doc, _ in qrels}
    qids = sorted({q for q, _, _ in qrels})
    picked = set(random.Random(seed).sample(qids, min(n_queries, len(qids))))
    tmp = work / "squad-v1.1-devsub.tmp"
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    with open(src / "corpus.jsonl") as f, open(tmp / "corpus.jsonl", "w") as g:
        g.writelines(line for line in f if json.loads(line)["_id"] in passages)
    with open(src / "queries.jsonl") as f, open(tmp / "queries.jsonl", "w") as g:
        g.writelines(line for line in f if json.loads(line)["_id"] in picked)
    rows = ["query-id\tcorpus-id\tscore"] + ["\t".join(r) for r in qrels if r[0] in picked]
    (tmp / "qrels" / "dev.tsv").write_text("\n".join(rows) + "\n")
    os.replace(tmp, out)
    return out


def scifact_odd(root: Path, work: Path) -> Path:
    """SciFact's ``train`` claims with an odd id as a ``dev`` split (``work/scifact-odd``: the corpus and the queries
    linked, the judgments of those claims copied), the half the distillation study holds out."""
    out = work / "scifact-odd"
    if (out / "qrels" / "dev.tsv").is_file():
        return out
    src = root / "scifact"
    tmp = work / "scifact-odd.tmp"
    (tmp / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (tmp / name).exists():
            (tmp / name).symlink_to((src / name).resolve())
    lines = (src / "qrels" / "train.tsv").read_text().splitlines()
    odd = [line for line in lines[1:] if int(line.split("\t")[0]) % 2 == 1]
    (tmp / "qrels" / "dev.tsv").write_text("\n".join([lines[0], *odd]) + "\n")
    os.replace(tmp, out)
    return out


def data_folder(corpus: str, root: Path, work: Path) -> Path:
    """The BEIR folder of one of :data:`CORPORA` (SQuAD's subsample and SciFact's odd half are built under ``work`` on
    first use)."""
    if corpus == "squad":
        return squad_subsample(root, work)
    if corpus == "scifact-odd":
        return scifact_odd(root, work)
    return root / CORPORA[corpus][0]


def start_name(start: str) -> str:
    """A start's name in tags and tables: ``NAME=PATH`` names a model folder, else its last path part."""
    return start.split("=", 1)[0] if "=" in start else Path(start).name


def start_path(start: str) -> str:
    return start.split("=", 1)[1] if "=" in start else start


def _model(start: str):
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.bundled import BUNDLED_MODELS, bundled_model_path

    start = start_path(start)
    return load_encoder(bundled_model_path(start) if start in BUNDLED_MODELS else start)


def encodings(start: str, folder: Path, split: str, work: Path, doc_max_length: int):
    """The BEIR data, the corpus vectors (corpus order) and the split's query vectors, cached as ``.npy``."""
    import numpy as np

    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.retrieval.encoding import build_index, encode_texts

    data = load_beir(folder, split)
    tag = f"{start_name(start)}-{folder.name}-len{doc_max_length}"
    docs_tag = f"{start_name(start)}-{DOCUMENTS.get(folder.name, folder.name)}-len{doc_max_length}"
    docs_f, q_f = work / f"{docs_tag}-docs.npy", work / f"{tag}-{split}-queries.npy"
    st = None
    work.mkdir(parents=True, exist_ok=True)
    if not docs_f.is_file():
        st = st or _model(start)
        t0 = time.time()
        index, order = build_index(st, data.corpus, max_length=doc_max_length, show_progress_bar=False)
        emb = np.empty((len(order), index.reconstruct_all().shape[1]), np.float32)
        emb[order] = index.reconstruct_all()
        np.save(work / f"{docs_tag}-docs.tmp.npy", emb)
        os.replace(work / f"{docs_tag}-docs.tmp.npy", docs_f)
        print(f"encoded {docs_tag}: {len(emb)} documents in {time.time() - t0:.0f} s", flush=True)
    if not q_f.is_file():
        st = st or _model(start)
        q = encode_texts(st, list(data.queries["text"]), kind="query")
        np.save(work / f"{tag}-{split}-queries.tmp.npy", q)
        os.replace(work / f"{tag}-{split}-queries.tmp.npy", q_f)
    return data, np.load(docs_f), np.load(q_f)


class _Cached:
    """An mteb search model that returns rankings computed beforehand (one sub-model of mteb's HybridSearch)."""

    def __init__(self, name: str, results: dict[str, dict[str, float]]):
        from mteb.models.model_meta import ModelMeta

        self.results = results
        self.mteb_model_meta = ModelMeta.create_empty(overwrites={"name": name})

    def index(self, corpus, **kwargs) -> None:
        pass

    def search(self, queries, *, top_k: int, **kwargs) -> dict[str, dict[str, float]]:
        return {q: self.results.get(q, {}) for q in queries["id"]}


def arm(start: str, corpus: str, ns, root: Path, work: Path) -> dict:
    """Every fusion of one start on one dev split: fixed weights, the fitted one, mteb's rrf / dbsf / rsf."""

    import numpy as np

    from hf_cocodr.data.beir import column_numpy, corpus_texts
    from hf_cocodr.evaluation.retrieval import summarize
    from hf_cocodr.retrieval.encoding import encode_texts
    from hf_cocodr.retrieval.fusion import FusionConfig, fuse
    from hf_cocodr.retrieval.fusion_fit import fit_fusion
    from hf_cocodr.retrieval.index import BM25Index, DenseIndex

    folder, split, label = CORPORA[corpus]
    data, docs, q_emb = encodings(start, data_folder(corpus, root, work), split, work, ns.doc_max_length)
    qids = list(data.queries["_id"])
    doc_ids = np.asarray(column_numpy(data.corpus, "_id"), dtype=object)
    texts = [t for _, batch in corpus_texts(data.corpus) for t in batch]
    depth = ns.depth
    index = DenseIndex(docs.shape[1], capacity=len(docs))
    index.add(docs)
    ds, di = index.search(q_emb, depth)
    bm25 = BM25Index(texts)
    bs, bi = bm25.search(list(data.queries["text"]), depth)

    def run_of(cfg: FusionConfig) -> dict:
        run = {}
        for i, qid in enumerate(qids):
            rows, fused = fuse(di[i], ds[i], bi[i], bs[i], cfg, 2 * depth)
            run[qid] = dict(zip(doc_ids[rows].tolist(), fused.astype(float).tolist()))
        return run

    def ndcg(run) -> float:
        return round(summarize(data.qrels, run, k_values=(10,))["ndcg@10"], 4)

    row: dict = {"start": start_name(start), "corpus": label, "queries": len(data.qrels)}
    row["fixed"] = {
        n: {f"{w:g}": ndcg(run_of(FusionConfig(dense_weight=w, normalize=n, depth=depth))) for w in WEIGHTS}
        for n in NORMS
    }
    seed_tag = f"-s{ns.fit_seed}" if ns.fit_seed else ""  # seed 0's files keep their names
    fit_file = (
        work / f"{start_name(start)}-{folder}-len{ns.doc_max_length}-fit5-d{depth}-n{ns.fit_queries}{seed_tag}.json"
    )
    if fit_file.is_file():
        cfg = FusionConfig(**json.loads(fit_file.read_text()))
    else:
        st = _model(start)
        t0 = time.time()
        cfg = fit_fusion(
            FusionConfig(depth=depth),
            texts,
            docs,
            lambda q: encode_texts(st, q, kind="query"),
            lambda d: encode_texts(st, d, kind="document", max_length=ns.doc_max_length),
            queries=list(data.queries["text"]),  # as evaluate --hybrid passes them: their text only
            n_queries=ns.fit_queries,
            seed=ns.fit_seed,
        )
        cfg.fit["seconds"] = round(time.time() - t0, 1)
        from dataclasses import asdict

        fit_file.write_text(json.dumps(asdict(cfg)))
    row["keep_share"] = cfg.fit.get("keep_share", 0.0)
    row["fitted_weight"] = cfg.dense_weight
    row["fitted_normalize"] = cfg.normalize
    row["fit"] = cfg.fit
    fitted_run = run_of(cfg)
    row["fitted"] = ndcg(fitted_run)
    # the former rule: z-scores, the weight alone fitted (the best of the same fit's z curve, rounded to 1e-4 as the
    # record keeps it; equal values go to the weight nearest 0.5, as fit_choice breaks them)
    z_curve = {float(w): v for w, v in cfg.fit["grid_ndcg_at_10"]["z"].items()}
    top = max(z_curve.values())
    row["fitted_z_weight"] = min((w for w, v in z_curve.items() if v == top), key=lambda w: (abs(w - 0.5), w))
    row["fitted_z"] = ndcg(run_of(FusionConfig(dense_weight=row["fitted_z_weight"], normalize="z", depth=depth)))

    import mteb
    from mteb.models.hybrid_wrappers import HybridSearch
    from mteb.models.model_implementations.bm25 import BM25Search

    from hf_cocodr.evaluation.mteb import beir_split_data, beir_task

    # mteb's own sub-models where running them costs little: its bm25s baseline over the task's corpus; the dense one
    # returns the top-depth lists of the same vectors computed above (encoding the corpus again in mteb would only
    # repeat them)
    task = beir_task(data_folder(corpus, root, work), split, f"{folder}-{split}")
    split_data = beir_split_data(data)
    judged = split_data["queries"].filter(lambda r: r["id"] in data.qrels)
    where = dict(task_metadata=task.metadata, hf_split=split, hf_subset="default", encode_kwargs={})
    dense_res = {q: {doc_ids[j]: float(x) for j, x in zip(di[i], ds[i])} for i, q in enumerate(qids)}
    subs = [BM25Search(), _Cached(start_name(start), dense_res)]
    # as mteb.get_model("mteb/baseline-bm25s") attaches it (its registry entry, read offline)
    subs[0].mteb_model_meta = mteb.get_model_meta("mteb/baseline-bm25s", fetch_from_hf=False)
    subs[0].index(split_data["corpus"], **where)
    row["mteb_bm25s"] = ndcg(subs[0].search(judged, top_k=depth, **where))
    row["mteb"] = {}
    mteb_runs = {}
    for rule in MTEB_RULES:
        # each sub-model is asked for max(top_k, sub_model_top_k) = depth: the same two lists the package fuses
        hs = HybridSearch(models=subs, fusion_strategy=rule, sub_model_top_k=depth)
        mteb_runs[rule] = hs.search(judged, top_k=depth, **where)
        row["mteb"][rule] = ndcg(mteb_runs[rule])
    f = row["fixed"]["z"]
    row["dense"], row["bm25"], row["w0.5"] = f["1"], f["0"], f["0.5"]
    row["best_fixed_w"] = max(f, key=f.get)  # z-scores, the former rule
    row["best_fixed"] = f[row["best_fixed_w"]]
    n, w = max(((n, w) for n in NORMS for w in row["fixed"][n]), key=lambda nw: row["fixed"][nw[0]][nw[1]])
    row["best_any"], row["best_any_at"] = row["fixed"][n][w], f"{n} {w}"
    row["mteb_best"] = max(row["mteb"].values())
    # the paired standard error of fitted − mteb's best over the judged queries (a difference within it is none)
    best_rule = max(row["mteb"], key=row["mteb"].get)
    a, b = per_query_ndcg(data.qrels, fitted_run), per_query_ndcg(data.qrels, mteb_runs[best_rule])
    diff = np.array([a.get(q, 0.0) - b.get(q, 0.0) for q in data.qrels])
    row["vs_mteb_best_se"] = round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 4)
    return row


def per_query_ndcg(qrels, run) -> dict[str, float]:
    """nDCG@10 of each judged query (pytrec_eval; a query with no ranking scores 0)."""
    import pytrec_eval

    judged = {q: {d: int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    ranked = {q: {d: float(x) for d, x in run.get(q, {}).items()} for q in judged}
    out = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10"}).evaluate(ranked)
    return {q: out.get(q, {}).get("ndcg_cut_10", 0.0) for q in judged}


def report(rows: list[dict], ns) -> str:
    lines = [
        "# Hybrid retriever: the fusion fitted without labels, on the dev splits",
        "",
        "nDCG@10 on the dev splits (SciFact `train` claims, NFCorpus `dev`, SQuAD passages `dev`: see the notes for the "
        f"SQuAD subsample), documents at {ns.doc_max_length} tokens, each system's top {ns.depth} fused per query. "
        "*fitted*: the normalisation (z-scores, min-max or dbsf) and the dense weight `fit_fusion` picks from "
        f"{ns.fit_queries} inverse-cloze pseudo-queries drawn from the corpus (seed {ns.fit_seed}; no qrels read), made as easy "
        "for BM25 as the split's queries (their text only: *keep* is the share of the sentence's words left in its "
        "document, chosen so the pseudo-queries' median BM25 top-score z meets the queries'), the weight nearest 0.5 "
        "within one standard error of the pseudo-queries' best mean; the default; "
        "*fitted z*: the former default (z-scores, the weight alone fitted); *z w=0.5*: the fixed default before "
        "that; *best fixed z* / *best fixed any*: the best of w = 0, 0.1, ..., 1 with z-scores / with any of the three "
        "normalisations (chosen on the judgments, an upper bound no label-free rule is promised); *mteb rrf / dbsf / "
        "rsf*: `mteb.models.hybrid_wrappers.HybridSearch` with equal weights over mteb's own `BM25Search` (the "
        f"`mteb/baseline-bm25s` model, run here on the task's corpus) and the same dense model, each system's top {ns.depth} as the package fuses (its vectors "
        "computed once and shared by every arm), in the same process; *mteb bm25s*: that BM25 alone (the package's "
        "BM25 is the *BM25* column). Command: `python scripts/studies/hybrid_fit_study.py --starts START[,START] "
        "--corpora CORPUS[,CORPUS]` (each arm is kept under `--work`; the report holds every arm run so far).",
        "",
        "| start | split | dense | BM25 | mteb bm25s | z w=0.5 | best fixed z (w) | best fixed any | fitted z (w) "
        "| fitted (keep, rule, w) | **fitted** | mteb rrf | mteb dbsf | mteb rsf | fitted − max(parts) | fitted − best fixed "
        "z | fitted − mteb best (± paired SE) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        parts = max(r["dense"], r["bm25"])
        lines.append(
            f"| {r['start']} | {r['corpus']} | {r['dense']:.4f} | {r['bm25']:.4f} | {r['mteb_bm25s']:.4f} | "
            f"{r['w0.5']:.4f} | {r['best_fixed']:.4f} ({r['best_fixed_w']}) | {r['best_any']:.4f} ({r['best_any_at']}) "
            f"| {r['fitted_z']:.4f} ({r['fitted_z_weight']:g}) | {r.get('keep_share', 0):g}, {r['fitted_normalize']} "
            f"{r['fitted_weight']:g} | "
            f"**{r['fitted']:.4f}** | {r['mteb']['rrf']:.4f} | {r['mteb']['dbsf']:.4f} | {r['mteb']['rsf']:.4f} | "
            f"{r['fitted'] - parts:+.4f} | {r['fitted'] - r['best_fixed']:+.4f} | "
            f"{r['fitted'] - r['mteb_best']:+.4f} (± {r.get('vs_mteb_best_se', float('nan')):.4f}) |"
        )
    lines += [
        "",
        "Fixed weights (nDCG@10 at w = 0, 0.1, ..., 1, per normalisation) and the fit's pseudo-query curves:",
        "",
    ]
    for r in rows:
        fit = r["fit"]
        curves = fit["grid_ndcg_at_10"]
        peaks = ", ".join(f"{n} {max(c.values()):.4f} at w {max(c, key=c.get)}" for n, c in curves.items())
        lines.append(
            f"- {r['start']}, {r['corpus']}: fixed "
            + "; ".join(f"{n} " + " ".join(f"{v:.4f}" for v in c.values()) for n, c in r["fixed"].items())
            + f". Pseudo-query nDCG@10: dense {fit.get('dense_alone')}, BM25 {fit.get('bm25_alone')}, peaks {peaks}"
            f" ({fit['pseudo_queries']} pseudo-queries, fit {fit.get('seconds', '?')} s)"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", default="all-MiniLM-L6-v2,splade-tiny")
    ap.add_argument("--corpora", default="scifact,nfcorpus,squad")
    ap.add_argument("--doc-max-length", type=int, default=256)
    ap.add_argument("--work", default="outputs/hybrid_fit")
    ap.add_argument("--encode-only", action="store_true", help="only fill the encoding cache")
    ap.add_argument("--depth", type=int, default=200)
    ap.add_argument("--fit-queries", type=int, default=400)
    ap.add_argument("--fit-seed", type=int, default=0, help="the pseudo-queries' draw (0: the library's default)")
    ap.add_argument("--report", default="reports/studies/hybrid_fit")
    ns = ap.parse_args()

    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    for corpus in ns.corpora.split(","):
        for start in ns.starts.split(","):
            folder, split, _label = CORPORA[corpus]
            encodings(start, data_folder(corpus, root, Path(ns.work)), split, Path(ns.work), ns.doc_max_length)
    if ns.encode_only:
        return 0

    from hf_cocodr.utils import atomic_write_json, atomic_write_text

    work = Path(ns.work)
    (work / "rows").mkdir(parents=True, exist_ok=True)
    seed_tag = f"-s{ns.fit_seed}" if ns.fit_seed else ""  # another draw of pseudo-queries: rows and report apart
    report_path = f"{ns.report}{seed_tag.replace('-s', '_seed')}"
    for corpus in ns.corpora.split(","):
        for start in ns.starts.split(","):
            row_file = (
                work / "rows" / f"{start_name(start)}-{corpus}-d{ns.depth}-n{ns.fit_queries}-fit5{seed_tag}.json"
            )
            if row_file.is_file():
                continue
            r = arm(start, corpus, ns, root, work)
            row_file.write_text(json.dumps(r))
            print(
                f"{start} {r['corpus']}: dense {r['dense']:.4f} bm25 {r['bm25']:.4f} w0.5 {r['w0.5']:.4f} best "
                f"{r['best_fixed']:.4f}@{r['best_fixed_w']} fitted {r['fitted']:.4f}@{r['fitted_normalize']} "
                f"{r['fitted_weight']:g} (z: {r['fitted_z']:.4f}@{r['fitted_z_weight']:g}) "
                f"mteb {r['mteb']}",
                flush=True,
            )
    # every arm finished so far (this run's and earlier ones'), corpora in the study's order
    order = {label: i for i, (_, _, label) in enumerate(CORPORA.values())}
    rows = [
        json.loads(f.read_text())
        for f in sorted((work / "rows").glob(f"*-d{ns.depth}-n{ns.fit_queries}-fit5{seed_tag}.json"))
    ]
    rows.sort(key=lambda r: (order[r["corpus"]], r["start"]))
    Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(f"{report_path}.md", report(rows, ns))
    atomic_write_json(f"{report_path}.json", {"depth": ns.depth, "fit_queries": ns.fit_queries, "rows": rows})
    print(report(rows, ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
