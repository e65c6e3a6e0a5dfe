"""The index chosen by size: ``auto`` is today's exact index under its threshold; HNSW and IVF reach their recorded
recall@100, which a recomputation gives again; a saved hybrid with an approximate index searches as it did; a bad
choice is one line naming the flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_cli

from hf_cocodr.cli.main import build_parser
from hf_cocodr.errors import ConfigError
from hf_cocodr.evaluation.retrieval import evaluate_retrieval
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval import ann
from hf_cocodr.retrieval.ann import ApproximateIndex, IndexChoice, build_approximate, index_choice
from hf_cocodr.retrieval.encoding import build_index
from hf_cocodr.retrieval.hybrid import ANN_FILE, HYBRID_FILE, HybridRetriever
from hf_cocodr.retrieval.index import DenseIndex
from hf_cocodr.utils import faiss_available

needs_faiss = pytest.mark.skipif(not faiss_available(), reason="the approximate indexes need faiss")


def _vectors(n: int = 2000, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Unit vectors around 40 random centres (embeddings cluster by topic; isotropic noise has no structure an
    approximate index could use)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim))
    x = centres[rng.integers(0, 40, n)] + 0.5 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_auto_is_exact_up_to_the_threshold_and_hnsw_beyond():
    choice = IndexChoice(exact_max_docs=500)
    assert choice.resolve(500) == "exact" and IndexChoice().resolve(1_000_000) == "exact"
    if faiss_available():
        assert choice.resolve(501) == "hnsw"
    assert choice.resolve(501, backend="torch") == "exact"  # no faiss to build HNSW with: exact, with a warning


def test_auto_under_the_threshold_is_todays_exact_index(tiny_st_dir, tiny_beir):
    from hf_cocodr.data.beir import load_corpus

    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    today, order = build_index(model, corpus, show_progress_bar=False)
    auto, auto_order = build_index(model, corpus, show_progress_bar=False, index="auto")
    assert type(today) is DenseIndex and type(auto) is DenseIndex and np.array_equal(order, auto_order)
    q = _vectors(20, model.get_embedding_dimension(), seed=3)
    for a, b in zip(today.search(q, 50), auto.search(q, 50)):
        assert np.array_equal(a, b)
    kw = dict(split="dev", show_progress_bar=False, return_run=True)
    exact = evaluate_retrieval(model, tiny_beir, index="exact", **kw)
    chosen = evaluate_retrieval(model, tiny_beir, index="auto", **kw)
    assert "index" not in chosen  # exact search records nothing: its JSON is today's
    for key in ("run", "ndcg@10", "recall@100"):
        assert chosen[key] == exact[key]


@needs_faiss
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_recall_is_recorded_and_recomputes(kind):
    x = _vectors()
    choice = IndexChoice(kind=kind, recall_sample=300, seed=5)
    index = build_approximate(x, kind, choice)
    record = index.record
    assert record["kind"] == kind and record["params"] == choice.params(kind, len(x))
    assert record["sample"] == {"queries": 300, "from": "documents", "seed": 5}
    assert record["recall@100"] >= 0.9
    # the recomputation: the same seeded rows as queries, exact top-100 by brute force, the index's own top-100
    rows = np.sort(np.random.default_rng(5).choice(len(x), 300, replace=False))
    exact_top = np.argsort(-(x[rows] @ x.T), axis=1, kind="stable")[:, :100]
    _, got = index.search(x[rows], 100)
    recall = np.mean([len(set(e.tolist()) & set(g.tolist())) / 100 for e, g in zip(exact_top, got)])
    assert record["recall@100"] == pytest.approx(recall, abs=1e-6)
    assert recall < 1.0 or kind == "hnsw"  # IVF scans a share of the clusters: it does miss neighbours


@needs_faiss
def test_evaluate_records_the_approximate_index_beyond_the_threshold(tiny_st_dir, tiny_beir):
    model = load_encoder(str(tiny_st_dir))
    result = evaluate_retrieval(
        model, tiny_beir, "dev", show_progress_bar=False, index=IndexChoice(exact_max_docs=10, recall_sample=30)
    )
    assert result["index"]["kind"] == "hnsw" and result["index"]["sample"]["queries"] == 30
    assert 0.0 <= result["index"]["recall@100"] <= 1.0 and result["num_docs"] == 80


@needs_faiss
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_a_saved_hybrid_with_an_approximate_index_loads_and_searches_identically(
    kind, tiny_st_dir, tiny_beir, tmp_path
):
    built = HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"depth": 20, "dense_weight": 0.5}, index=kind)
    assert isinstance(built.dense_index, ApproximateIndex) and built.meta["index"]["kind"] == kind
    queries = [json.loads(line)["text"] for line in (tiny_beir / "queries.jsonl").read_text().splitlines()]
    built.save(tmp_path / "h")
    saved = json.loads((tmp_path / "h" / HYBRID_FILE).read_text())
    assert saved["index"] == built.meta["index"] and (tmp_path / "h" / ANN_FILE).is_file()
    loaded = HybridRetriever.load(tmp_path / "h")
    assert isinstance(loaded.dense_index, ApproximateIndex) and loaded.dense_index.params == built.dense_index.params
    assert loaded.search(queries, 10) == built.search(queries, 10)
    assert np.array_equal(loaded.search_dense(queries, 30)[1], built.search_dense(queries, 30)[1])
    (tmp_path / "h" / ANN_FILE).unlink()
    with pytest.raises(ConfigError, match=f"{ANN_FILE}: missing") as err:
        HybridRetriever.load(tmp_path / "h")
    assert "\n" not in str(err.value)


def test_an_exact_hybrid_saves_no_faiss_index(tiny_st_dir, tiny_beir, tmp_path):
    built = HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"depth": 20, "dense_weight": 0.5})
    built.save(tmp_path / "h")
    assert "index" not in json.loads((tmp_path / "h" / HYBRID_FILE).read_text())
    assert not (tmp_path / "h" / ANN_FILE).exists()
    assert type(HybridRetriever.load(tmp_path / "h").dense_index) is DenseIndex


@pytest.mark.parametrize(
    "choice, backend, needle",
    [
        (IndexChoice(kind="annoy"), "auto", "--index must be one of exact, hnsw, ivf, auto, got 'annoy'"),
        (IndexChoice(kind="hnsw"), "torch", "--index hnsw is a faiss index; it cannot run on --backend torch"),
        (IndexChoice(exact_max_docs=0), "auto", "--index-exact-max-docs must be a whole number >= 1, got 0"),
        (IndexChoice(kind="ivf", ivf_nprobe=-2), "auto", "the --index parameter ivf_nprobe must be a whole number"),
    ],
)
def test_a_bad_choice_is_one_line_naming_the_flag(choice, backend, needle):
    with pytest.raises(ConfigError) as err:
        choice.check(backend)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_an_approximate_kind_without_faiss_names_the_extra(monkeypatch):
    monkeypatch.setattr(ann, "faiss_available", lambda: False)
    with pytest.raises(ConfigError, match=r"--index ivf needs faiss: pip install 'hf-cocodr\[faiss-cpu\]'"):
        index_choice("ivf")
    assert index_choice("exact").kind == "exact"


def test_a_bad_choice_is_refused_before_any_work(tiny_beir):
    with pytest.raises(ConfigError, match="--index must be one of"):
        evaluate_retrieval(object(), tiny_beir, "dev", index="flat")  # (the object is no model: never reached)
    with pytest.raises(ConfigError, match="--index must be one of"):
        HybridRetriever.build(object(), tiny_beir, index="flat")


def test_the_cli_parses_the_index_flags():
    args = build_parser().parse_args(["evaluate", "m", "d", "--index", "ivf", "--index-exact-max-docs", "7"])
    assert (args.index, args.index_exact_max_docs) == ("ivf", 7)
    args = build_parser().parse_args(["evaluate", "m", "d"])
    assert (args.index, args.index_exact_max_docs) == ("auto", 1_000_000)
    args = build_parser().parse_args(["mteb", "m", "d", "--model-name", "o/n", "--hybrid", "--index", "hnsw"])
    assert args.index == "hnsw"


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--index", "flat"], "--index must be one of exact, hnsw, ivf, auto"),
        (["--index-exact-max-docs", "0"], "--index-exact-max-docs must be positive"),
        (["--index", "hnsw", "--backend", "torch"], "--index hnsw is a faiss index"),
    ],
)
def test_the_cli_refuses_a_bad_index_in_one_line(flags, needle, tiny_st_dir, tiny_beir, capsys):
    assert needle in run_cli(["evaluate", tiny_st_dir, tiny_beir, "--split", "dev", *flags], capsys)


def test_mteb_takes_the_index_with_hybrid_only(tiny_st_dir, tiny_beir, tmp_path, capsys):
    args = ["mteb", tiny_st_dir, tiny_beir, "--split", "dev", "--model-name", "o/n", "--output-folder", tmp_path]
    assert "--index / --index-exact-max-docs need --hybrid" in run_cli([*args, "--index", "hnsw"], capsys)
