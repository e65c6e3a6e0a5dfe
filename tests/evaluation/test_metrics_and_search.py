from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_cocodr.evaluation.metrics import compute_metrics
from hf_cocodr.retrieval.index import DenseIndex, kmeans
from hf_cocodr.utils import faiss_available


def test_metrics_hand_computed():
    qrels = {"q1": {"d1": 1, "d2": 1}, "q2": {"d1": 2, "d2": 1}, "q3": {"d9": 1}}
    run = {
        "q1": {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6},
        "q2": {"d2": 0.9, "d1": 0.8},
        # q3 retrieved nothing: it must count as zero, not be dropped.
    }
    per = compute_metrics(qrels, run, k_values=(3, 10), per_query=True)[1]
    l2 = math.log2
    q1_ndcg = (1 / l2(3) + 1 / l2(5)) / (1 + 1 / l2(3))
    q2_ndcg = (1 / l2(2) + 2 / l2(3)) / (2 / l2(2) + 1 / l2(3))  # linear gains, as trec_eval / BEIR / MTEB
    assert per["q1"]["ndcg@10"] == pytest.approx(q1_ndcg, abs=1e-6)
    assert per["q2"]["ndcg@10"] == pytest.approx(q2_ndcg, abs=1e-6)
    assert per["q3"]["ndcg@10"] == 0.0
    assert per["q1"]["mrr@10"] == pytest.approx(0.5)
    assert per["q2"]["mrr@10"] == pytest.approx(1.0)
    assert per["q1"]["recall@3"] == pytest.approx(0.5)
    assert per["q1"]["recall@10"] == pytest.approx(1.0)
    agg = compute_metrics(qrels, run, k_values=(3, 10))
    assert agg["ndcg@10"] == pytest.approx((q1_ndcg + q2_ndcg + 0) / 3, abs=1e-6)
    assert agg["mrr@10"] == pytest.approx((0.5 + 1.0 + 0) / 3)
    # MAP@10 for q1: relevant at ranks 2 and 4 -> (1/2 + 2/4) / 2
    assert per["q1"]["map@10"] == pytest.approx(0.5, abs=1e-6)


def test_zero_grade_docs_are_not_relevant():
    agg = compute_metrics({"q": {"a": 0, "b": 1}}, {"q": {"a": 2.0, "b": 1.0}}, k_values=(10,))
    assert agg["mrr@10"] == pytest.approx(0.5)


@pytest.mark.skipif(not faiss_available(), reason="faiss not installed")
def test_faiss_and_torch_search_agree():
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((1000, 16)).astype(np.float32)
    queries = rng.standard_normal((37, 16)).astype(np.float32)
    out = {}
    for backend in ("faiss", "torch"):
        index = DenseIndex(16, backend=backend, capacity=10)  # small capacity: exercises growth
        for s in range(0, 1000, 300):
            index.add(docs[s : s + 300])
        out[backend] = index.search(queries, 50)
    np.testing.assert_allclose(out["faiss"][0], out["torch"][0], rtol=1e-5, atol=1e-5)
    assert (out["faiss"][1] == out["torch"][1]).mean() > 0.999
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :50]
    assert (out["torch"][1] == exact).all()


@pytest.mark.skipif(not faiss_available(), reason="faiss not installed")
def test_a_presized_faiss_index_equals_a_growing_one():
    """Reserving the storage (capacity) changes no result: exact, too small or none, the same scores and ids."""
    rng = np.random.default_rng(3)
    docs = rng.standard_normal((700, 16)).astype(np.float32)
    queries = rng.standard_normal((9, 16)).astype(np.float32)
    out = []
    for capacity in (None, 700, 100):
        index = DenseIndex(16, backend="faiss", capacity=capacity)
        for s in range(0, 700, 64):
            index.add(docs[s : s + 64])
        assert index.ntotal == 700 and index._index.ntotal == 700
        np.testing.assert_array_equal(index.reconstruct_all(), docs)
        out.append(index.search(queries, 20))
    for scores, ids in out[1:]:
        np.testing.assert_array_equal(scores, out[0][0])
        np.testing.assert_array_equal(ids, out[0][1])


def test_torch_kmeans_recovers_clusters():
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((5, 8)).astype(np.float32) * 10
    x = np.concatenate([c + rng.standard_normal((200, 8)).astype(np.float32) for c in centers])
    truth = np.repeat(np.arange(5), 200)
    c, a = kmeans(x, 5, backend="torch", seed=0, niter=25)
    # same partition up to relabelling
    pairs = set(zip(truth.tolist(), a.tolist()))
    assert len(pairs) == 5
    from sklearn.metrics import pairwise_distances_argmin

    assert (pairwise_distances_argmin(x, c) == a).all()  # every point is assigned its nearest centroid


@pytest.mark.skipif(not faiss_available(), reason="faiss not installed")
def test_faiss_and_torch_kmeans_agree_on_small_sets():
    rng = np.random.default_rng(2)
    centers = rng.standard_normal((4, 6)).astype(np.float32) * 8
    x = np.concatenate([c + rng.standard_normal((50, 6)).astype(np.float32) for c in centers])
    init = x[[0, 60, 120, 180]]  # one point per true cluster: both backends start from the same centroids
    cf, af = kmeans(x, 4, backend="faiss", seed=3, init_centroids=init)
    ct, at = kmeans(x, 4, backend="torch", seed=3, init_centroids=init)
    assert (af == at).all()
    np.testing.assert_allclose(cf, ct, atol=1e-4)
    assert len(set(af.tolist())) == 4


def test_kmeans_errors():
    with pytest.raises(ValueError, match="need at least k points"):
        kmeans(np.zeros((3, 2), np.float32), 5, backend="torch")


def test_evaluate_cli_prints_json_last_line(tiny_st_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli import main

    out = tmp_path / "res.json"
    assert (
        main(
            [
                "evaluate",
                str(tiny_st_dir),
                str(tiny_beir),
                "--split",
                "dev",
                "--output",
                str(out),
                "--backend",
                "torch",
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    for key in ("ndcg@10", "recall@100", "mrr@10", "num_queries", "num_docs", "encode_seconds", "search_seconds"):
        assert key in result
    assert result["num_docs"] == 80 and result["num_queries"] == 20
    saved = json.loads(out.read_text())
    assert saved["ndcg@10"] == result["ndcg@10"]
    assert len(saved["run"]) == 20 and all(len(v) <= 100 for v in saved["run"].values())


def test_evaluate_matches_brute_force(tiny_beir, tmp_path):
    """The streamed, length-sorted pipeline equals encoding everything at once and ranking by dot product."""
    import tiny

    from hf_cocodr import evaluate_retrieval, load_beir, load_encoder
    from hf_cocodr.data import doc_text

    # a wide initialisation spreads the embeddings: with the default one the tiny model maps every text to nearly
    # the same vector, the top scores tie within float error and the two rankings may order ties differently. The
    # tiny tokenizer's training breaks frequency ties differently from one process to the next, so the first model
    # whose top-11 scores are all at least 1e-4 apart is taken (a precondition, not the check).
    data = load_beir(tiny_beir, "dev")
    for seed in range(4, 24):
        bert = tiny.make_tiny_bert(tmp_path / f"bert{seed}", seed=seed, initializer_range=0.2)
        load_encoder(str(bert)).save(str(tmp_path / f"st{seed}"))
        model = load_encoder(str(tmp_path / f"st{seed}"))
        docs = model.encode([doc_text(t, x) for t, x in zip(data.corpus["title"], data.corpus["text"])])
        qs = model.encode(list(data.queries["text"]))
        scores = qs @ docs.T
        if np.abs(np.diff(-np.sort(-scores, axis=1)[:, :11], axis=1)).min() > 1e-4:
            break
    else:
        pytest.fail("no tiny model with well-separated top scores in 20 seeds")
    res = evaluate_retrieval(model, data, "dev", return_run=True, show_progress_bar=False, backend="torch")
    ids = list(data.corpus["_id"])
    errors = [
        abs(s - scores[i, ids.index(d)]) for i, q in enumerate(data.queries["_id"]) for d, s in res["run"][q].items()
    ]
    top = -np.sort(-scores, axis=1)[:, :11]
    assert max(errors) < 1e-4 < np.abs(np.diff(top, axis=1)).min(), "scores must agree far closer than they differ"
    run = {q: {ids[j]: float(scores[i, j]) for j in np.argsort(-scores[i])} for i, q in enumerate(data.queries["_id"])}
    assert res["ndcg@10"] == pytest.approx(compute_metrics(data.qrels, run)["ndcg@10"], abs=1e-6)


def test_bm25_cli(tiny_beir, capsys):
    from hf_cocodr.cli import main

    assert main(["bm25", str(tiny_beir), "--split", "dev"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["ndcg@10"] > 0.3  # queries are word samples of their document: BM25 must find most of them


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from hf_cocodr.cli import main

    assert main(["bm25", str(tmp_path / "nope"), "--split", "dev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "BEIR folder not found" in err[0]


def test_a_short_evaluate_command_imports_no_other_commands_modules():
    """``hf-cocodr evaluate`` builds its parser without importing the training, Hub and MTEB commands' modules (a
    fixed cost of every short evaluation); ``--help`` and those commands still load them."""
    import subprocess
    import sys

    probe = (
        "import sys; from hf_cocodr.cli import build_parser; build_parser({argv}); "
        "print(sorted(m for m in ('hf_cocodr.cli.training', 'hf_cocodr.cli.hub', 'hf_cocodr.cli.mteb') "
        "if m in sys.modules))"
    )

    def loaded(argv):
        out = subprocess.run(
            [sys.executable, "-c", probe.format(argv=argv)], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    assert loaded(["-q", "evaluate", "M", "D"]) == "[]"
    assert loaded(["recipe"]) == "['hf_cocodr.cli.hub', 'hf_cocodr.cli.mteb', 'hf_cocodr.cli.training']"
    assert loaded(["--help"]) == "['hf_cocodr.cli.hub', 'hf_cocodr.cli.mteb', 'hf_cocodr.cli.training']"
