"""Worker for the sharded corpus encoding tests: every caller that encodes a corpus, dumped for comparison.

torchrun --nproc_per_node 2 shard_worker.py MODEL_DIR BEIR_DIR OUT_DIR CHUNK_DOCS   (two ranks, gloo)
python shard_worker.py MODEL_DIR BEIR_DIR OUT_DIR CHUNK_DOCS                        (one process, no process group)

Writes ``rank<R>.json`` (the index's vectors, search results and rankings of each caller, the negatives a refresh
installs) and ``rank<R>.npz``.
"""

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    model_dir, beir, out, chunk = sys.argv[1:5]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the same threads in both runs: the same float reductions
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    from hf_cocodr import distributed as D
    from hf_cocodr import load_encoder
    from hf_cocodr.data.beir import load_beir
    from hf_cocodr.evaluation.retrieval import evaluate_retrieval
    from hf_cocodr.retrieval import encoding
    from hf_cocodr.retrieval.encoding import build_index, encode_documents, encode_texts
    from hf_cocodr.retrieval.hybrid import HybridRetriever
    from hf_cocodr.retrieval.teacher import teacher_rankings

    encoding.CHUNK_DOCS = int(chunk)  # several chunks over a tiny corpus: both ranks encode
    size, rank = D.world()
    model = load_encoder(model_dir)
    model.eval()
    data = load_beir(beir, "dev")
    corpus = data.corpus
    queries = [str(q) for q in data.queries["text"]]
    record = {"world_size": size, "rank": rank}
    arrays = {}

    # build_index (evaluation, negatives refresh, guard): the exact index, its order and a search
    index, order = build_index(model, corpus, show_progress_bar=False)
    q = encode_texts(model, queries, kind="query")
    scores, rows = index.search(q, 10)
    arrays["index_vectors"] = index.reconstruct_all()
    record["index_order"] = order.tolist()
    record["index_rows"] = rows.tolist()
    arrays["index_scores"] = scores

    # a one-document corpus: every rank but one has an empty slice
    one = corpus.select([0])
    one_index, one_order = build_index(model, one, show_progress_bar=False)
    arrays["one_vectors"] = one_index.reconstruct_all()
    record["one_order"] = one_order.tolist()
    arrays["one_texts"] = encode_documents(model, ["a single text"])
    arrays["texts"] = encode_documents(model, [f"text number {i} of a list" for i in range(7)], chunk_docs=2)

    # the evaluation (dense and hybrid: the fusion fit's documents too)
    result = evaluate_retrieval(model, data, "dev", hybrid=True, return_run=True)
    record["evaluation"] = _timeless(result)

    # the hybrid build (HybridRetriever.build: dense part, BM25, the fitted fusion) and its rankings
    hybrid = HybridRetriever.build(model, corpus, queries=queries)
    arrays["hybrid_embeddings"] = hybrid.embeddings
    ids, hscores = hybrid.search(queries, 10)
    record["hybrid_ids"] = ids
    record["hybrid_scores"] = hscores
    record["hybrid_fusion"] = repr(hybrid.fusion)

    # the distillation teacher (its hybrid over the corpus, built without the cache)
    t_ids, t_scores, *_ = teacher_rankings(model, "tiny", corpus, queries, 10, cache=False)
    record["teacher_ids"] = t_ids
    record["teacher_scores"] = t_scores

    # the hard-negatives refresh (HardNegativeRefreshCallback.refresh: every rank encodes its chunks of the training
    # corpus through build_index, rank 0 ranks the queries and broadcasts the table and, to re-cluster, the queries'
    # embeddings, which the K-Means callback receives: a stand-in records them)
    from hf_cocodr.data.training import RetrievalTrainingData
    from hf_cocodr.finetuning import HardNegativeRefreshCallback

    class KMeansSpy:
        def cluster(self, reason, embeddings=None, step=0):
            arrays["refresh_query_embeddings"] = embeddings

    rows = RetrievalTrainingData.from_beir(beir, "train", negatives="bm25")
    record["bm25_neg_idx"] = rows.neg_idx.tolist()
    refresh = HardNegativeRefreshCallback(every_steps=1, top_k=20, skip_top=1, recluster=True)
    refresh.bind(model=model, rows=rows, kmeans=KMeansSpy())
    refresh.refresh(step=3)
    record["refresh_source"] = rows.negatives_source
    record["refresh_neg_ptr"] = rows.neg_ptr.tolist()
    record["refresh_neg_idx"] = rows.neg_idx.tolist()
    record["refresh_queries"] = len(rows)

    np.savez(out / f"rank{rank}.npz", **arrays)
    (out / f"rank{rank}.json").write_text(json.dumps(record, default=_plain))
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()


def _timeless(d):
    """``d`` without its timings (``*_seconds``, at any depth)."""
    if isinstance(d, dict):
        return {k: _timeless(v) for k, v in d.items() if not str(k).endswith("_seconds")}
    return d


def _plain(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


if __name__ == "__main__":
    main()
