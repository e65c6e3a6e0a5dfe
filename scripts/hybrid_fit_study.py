"""Does the label-free fitted fusion pick a good dense weight for starts of different strength?

For each start model and dev split (SciFact ``train`` claims, NFCorpus ``dev``, SQuAD passages ``dev``; documents at
256 tokens) the corpus and the queries are encoded once and cached under ``--work`` (so arms are resumable); then:

- the fixed convex fusion at every dense weight ``w`` in 0, 0.1, ..., 1 (0: BM25 alone, 1: the dense model alone);
- the fitted weight (:func:`hf_cocodr.fusion.fit_dense_weight` over pseudo-queries drawn from the corpus, no qrels);
- mteb's own :class:`~mteb.models.hybrid_wrappers.HybridSearch` (rrf / dbsf / rsf, equal weights) over the same two
  top-``depth`` lists (the same dense model and the package's bm25s index), in the same process.

    python scripts/hybrid_fit_study.py [--starts all-MiniLM-L6-v2,splade-tiny] [--corpora scifact,nfcorpus,squad]

Writes ``reports/hybrid_fit.md`` / ``.json`` (rows are rewritten as each arm finishes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPORA = {
    "scifact": ("scifact", "train", "SciFact dev"),
    "nfcorpus": ("nfcorpus", "dev", "NFCorpus dev"),
    "squad": ("squad-v1.1", "dev", "SQuAD dev"),
}
WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
MTEB_RULES = ("rrf", "dbsf", "rsf")


def _model(start: str):
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.bundled import BUNDLED_MODELS, bundled_model_path

    return load_encoder(bundled_model_path(start) if start in BUNDLED_MODELS else start)


def encodings(start: str, folder: Path, split: str, work: Path, doc_max_length: int):
    """The BEIR data, the corpus vectors (corpus order) and the split's query vectors, cached as ``.npy``."""
    import numpy as np

    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.evaluation.retrieval import build_index, encode_texts

    data = load_beir(folder, split)
    tag = f"{Path(start).name}-{folder.name}-len{doc_max_length}"
    docs_f, q_f = work / f"{tag}-docs.npy", work / f"{tag}-{split}-queries.npy"
    st = None
    work.mkdir(parents=True, exist_ok=True)
    if not docs_f.is_file():
        st = st or _model(start)
        t0 = time.time()
        index, order = build_index(st, data.corpus, max_length=doc_max_length, show_progress_bar=False)
        emb = np.empty((len(order), index.reconstruct_all().shape[1]), np.float32)
        emb[order] = index.reconstruct_all()
        np.save(work / f"{tag}-docs.tmp.npy", emb)
        os.replace(work / f"{tag}-docs.tmp.npy", docs_f)
        print(f"encoded {tag}: {len(emb)} documents in {time.time() - t0:.0f} s", flush=True)
    if not q_f.is_file():
        st = st or _model(start)
        q = encode_texts(st, list(data.queries["text"]), kind="query")
        np.save(work / f"{tag}-{split}-queries.tmp.npy", q)
        os.replace(work / f"{tag}-{split}-queries.tmp.npy", q_f)
    return data, np.load(docs_f), np.load(q_f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", default="all-MiniLM-L6-v2,splade-tiny")
    ap.add_argument("--corpora", default="scifact,nfcorpus,squad")
    ap.add_argument("--doc-max-length", type=int, default=256)
    ap.add_argument("--work", default="outputs/hybrid_fit")
    ap.add_argument("--encode-only", action="store_true", help="only fill the encoding cache")
    ns = ap.parse_args()

    from hf_cocodr.utils import get_data_root, setup_logging

    setup_logging()
    root = get_data_root()
    for corpus in ns.corpora.split(","):
        for start in ns.starts.split(","):
            folder, split, _label = CORPORA[corpus]
            encodings(start, root / folder, split, Path(ns.work), ns.doc_max_length)
    if ns.encode_only:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
