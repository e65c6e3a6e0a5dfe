"""The hybrid retriever: fusion rules on hand-made rankings, save/load round trips, and what a load refuses."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tiny

from hf_cocodr.errors import ConfigError
from hf_cocodr.retrieval.hybrid import FusionConfig, HybridRetriever, fuse

# one query: dense ranks rows 0, 1, 2 (scores 3, 2, 1); BM25 ranks rows 2, 3 (scores 10, 5)
DENSE = (np.array([0, 1, 2]), np.array([3.0, 2.0, 1.0]))
BM25 = (np.array([2, 3]), np.array([10.0, 5.0]))


def _fused(rule, w, k=4):
    rows, scores = fuse(DENSE[0], DENSE[1], BM25[0], BM25[1], FusionConfig(rule=rule, dense_weight=w), k)
    return rows.tolist(), scores


def test_convex_fusion_of_z_normalised_scores_by_hand():
    # z(dense) = (1.2247, 0, -1.2247), z(bm25) = (1, -1); a row a system did not return sits 1 below its last
    z = np.sqrt(1.5)
    want = {0: (z, -2.0), 1: (0.0, -2.0), 2: (-z, 1.0), 3: (-z - 1.0, -1.0)}
    for w, order in ((0.5, [2, 0, 1, 3]), (0.2, [2, 3, 0, 1]), (0.8, [0, 1, 2, 3])):
        rows, scores = _fused("convex", w)
        assert rows == order
        np.testing.assert_allclose(scores, [w * want[r][0] + (1 - w) * want[r][1] for r in order], rtol=1e-6)


def test_reciprocal_rank_fusion_by_hand_with_ties_broken_by_the_dense_rank():
    rows, scores = _fused("rrf", 0.5)
    # row 2: 0.5/63 + 0.5/61; row 0: 0.5/61; rows 1 and 3: 0.5/62 each, row 1 first (the dense system ranked it)
    assert rows == [2, 0, 1, 3]
    np.testing.assert_allclose(scores, [0.5 / 63 + 0.5 / 61, 0.5 / 61, 0.5 / 62, 0.5 / 62], rtol=1e-6)


def test_the_weights_ends_are_each_system_alone():
    assert _fused("convex", 1.0, k=3)[0] == [0, 1, 2]  # dense order
    assert _fused("convex", 0.0, k=2)[0] == [2, 3]  # BM25 order
    assert _fused("rrf", 1.0, k=3)[0] == [0, 1, 2] and _fused("rrf", 0.0, k=2)[0] == [2, 3]


@pytest.mark.parametrize("bad", [{"rule": "max"}, {"dense_weight": 1.5}, {"depth": 0}, {"dense_weight": True}])
def test_bad_fusion_settings_are_refused_by_name(bad):
    with pytest.raises(ConfigError, match=next(iter(bad)).split("_")[0]):
        FusionConfig(**bad)


@pytest.fixture(scope="module")
def built(tiny_st_dir, tiny_beir):
    return HybridRetriever.build(str(tiny_st_dir), tiny_beir, fusion={"depth": 20, "dense_weight": 0.5})


def _queries(tiny_beir) -> list[str]:
    lines = (tiny_beir / "queries.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines[:2]] + ["the"]  # "the": a query of stop words only


def test_a_saved_retriever_loads_and_returns_the_same_ids_and_scores(built, tmp_path, tiny_st_dir, tiny_beir):
    ids, scores = built.search(_queries(tiny_beir), k=5)
    assert all(len(x) == 5 for x in ids) and all(s == sorted(s, reverse=True) for s in scores)
    built.save(tmp_path / "h")
    again = HybridRetriever.load(tmp_path / "h", corpus=tiny_beir)
    assert again.search(_queries(tiny_beir), k=5) == (ids, scores)
    assert again.fusion == built.fusion and again.doc_ids == built.doc_ids
    # saving again replaces the retriever's own folder in one step
    built.save(tmp_path / "h")
    assert HybridRetriever.load(tmp_path / "h").search(_queries(tiny_beir), k=5) == (ids, scores)


def test_a_retriever_over_a_built_index_maps_its_rows_back_to_the_documents(built, tiny_beir, tmp_path):
    """``from_index`` takes an index in ``build_index``'s length-sorted order: its dense rows name the right documents
    (each score is that document's vector times the query's), and its vectors, saved, are the corpus-order ones."""
    from hf_cocodr.data import load_corpus
    from hf_cocodr.retrieval.encoding import build_index

    index, order = build_index(built.model, load_corpus(tiny_beir), show_progress_bar=False)
    assert not np.array_equal(order, np.arange(len(order)))  # the index is not in corpus order
    over = HybridRetriever.from_index(built.model, built.doc_ids, index, order, built.bm25, built.fusion, built.meta)
    queries = _queries(tiny_beir)
    scores, rows = over.search_dense(queries, 7)
    q_emb = over.encode_queries(queries)
    np.testing.assert_allclose(scores, np.einsum("qkd,qd->qk", built.embeddings[rows], q_emb), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores, built.search_dense(queries, 7)[0], rtol=1e-5, atol=1e-6)
    over.save(tmp_path / "h")
    np.testing.assert_array_equal(HybridRetriever.load(tmp_path / "h", built.model).embeddings, built.embeddings)


def test_the_hybrid_at_its_ends_is_the_dense_or_the_bm25_ranking(built, tiny_beir):
    dense = HybridRetriever(
        built.model, built.doc_ids, built.embeddings, built.bm25, FusionConfig(dense_weight=1.0, depth=20), built.meta
    )
    # the dense top 5, tie for tie: the tiny model's scores tie, and tied documents may come in either order
    scores, rows = built.search_dense(_queries(tiny_beir)[:2], 20)
    for q_scores, q_rows, ids in zip(scores, rows, dense.search(_queries(tiny_beir)[:2], k=5)[0], strict=True):
        by_id = {built.doc_ids[r]: float(sc) for r, sc in zip(q_rows, q_scores)}
        assert set(ids) <= set(by_id)
        np.testing.assert_allclose([by_id[i] for i in ids], q_scores[:5], rtol=1e-6, atol=1e-7)
    lexical = HybridRetriever(
        built.model, built.doc_ids, built.embeddings, built.bm25, FusionConfig(dense_weight=0.0, depth=20), built.meta
    )
    scores, rows = built.search_bm25(_queries(tiny_beir)[:1], 3)
    assert (scores > 0).all()
    assert lexical.search(_queries(tiny_beir)[:1], k=3)[0] == [[built.doc_ids[r] for r in rows[0]]]


def test_a_changed_corpus_another_model_and_a_foreign_folder_are_refused(
    built, tmp_path, tiny_beir, tiny_bert_dir, tiny_bert_nomlm_dir
):
    built.save(tmp_path / "h")
    changed = tmp_path / "changed"
    shutil.copytree(tiny_beir, changed)
    lines = (changed / "corpus.jsonl").read_text().splitlines()
    doc = json.loads(lines[3])
    doc["text"] += " one more sentence"
    lines[3] = json.dumps(doc)
    (changed / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="not the one .* was built from"):
        HybridRetriever.load(tmp_path / "h", corpus=changed)
    with pytest.raises(ConfigError, match="weights .* are not those"):
        HybridRetriever.load(tmp_path / "h", model=str(tiny_bert_nomlm_dir))
    # the raw checkpoint the model was exported from has the same weights: accepted
    assert HybridRetriever.load(tmp_path / "h", model=str(tiny_bert_dir)).doc_ids == built.doc_ids
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a saved hybrid retriever"):
        built.save(mine)
    assert (mine / "notes.txt").read_text() == "keep"
    with pytest.raises(ConfigError, match="not a saved hybrid retriever"):
        HybridRetriever.load(mine)


def test_evaluate_hybrid_at_its_ends_equals_the_dense_and_the_bm25_evaluation(tiny_st_dir, tiny_beir):
    from hf_cocodr import evaluate_bm25, evaluate_retrieval

    kw = dict(split="train", top_k=50, show_progress_bar=False, k_values=(1, 3, 10))
    dense = evaluate_retrieval(str(tiny_st_dir), tiny_beir, **kw)
    at_one = evaluate_retrieval(
        str(tiny_st_dir), tiny_beir, hybrid=True, fusion={"dense_weight": 1.0, "depth": 20}, **kw
    )
    assert at_one["ndcg@10"] == dense["ndcg@10"] and at_one["dense"]["ndcg@10"] == dense["ndcg@10"]
    bm25 = evaluate_bm25(tiny_beir, "train", top_k=50, k_values=(1, 3, 10))
    at_zero = evaluate_retrieval(
        str(tiny_st_dir), tiny_beir, hybrid=True, fusion={"dense_weight": 0.0, "depth": 20}, **kw
    )
    assert at_zero["ndcg@10"] == bm25["ndcg@10"] == at_zero["bm25"]["ndcg@10"]
    mixed = evaluate_retrieval(str(tiny_st_dir), tiny_beir, hybrid=True, **kw)
    assert mixed["fusion"]["rule"] == "convex" and mixed["num_queries"] == dense["num_queries"]


def test_the_evaluators_hybrid_ranking_is_the_hybrid_retrievers_search(tmp_path):
    """``evaluate_retrieval(hybrid=True)`` ranks with :class:`HybridRetriever`: at the default fusion (convex, the
    normalisation and dense weight fitted to the corpus and calibrated to the queries, depth 200, over 500 documents
    so the depth cuts), each query's run is, id for id, what a retriever built over the same corpus for the same
    queries returns: its default ``search(k=10)`` is the run's top 10, and its every candidate
    (``k = 2 * depth``) is the whole run, scores included. The model is a trained one (the bundled splade-tiny): the
    tiny test BERT ties half its scores, and tied documents come in the order of the index that holds them (the
    evaluator's is length-sorted, a built retriever's in corpus order)."""
    from hf_cocodr import bundled_model_path, evaluate_retrieval, load_encoder
    from hf_cocodr.data import load_beir

    folder = tiny.make_beir(tmp_path / "beir", n_docs=500, n_queries=24, seed=3)
    model = load_encoder(bundled_model_path("splade-tiny"))
    data = load_beir(folder, "train")
    result = evaluate_retrieval(model, data, hybrid=True, return_run=True, show_progress_bar=False)
    default = FusionConfig()
    assert default.needs_fit  # the default: the dense weight fitted to the corpus, without labels
    fitted = {k: v for k, v in result["fusion"].items() if k != "fit"}
    assert fitted == {
        "rule": "convex",
        "dense_weight": fitted["dense_weight"],
        "depth": 200,
        "rrf_k": 60,
        "normalize": fitted["normalize"],
        "bm25_zeros": True,
    }
    assert fitted["normalize"] in ("z", "minmax", "dbsf")
    qids, texts = list(data.queries["_id"]), list(data.queries["text"])
    assert result["fusion"]["fit"]["real_queries"] == len(texts)  # the evaluated queries calibrated the pseudo-queries
    # fits its own fusion on the same corpus for the same queries: the same one
    retriever = HybridRetriever.build(model, folder, queries=texts)
    assert retriever.fusion.dense_weight == fitted["dense_weight"] and retriever.fusion.rule == default.rule
    assert retriever.fusion.normalize == fitted["normalize"]
    top_ids, _ = retriever.search(texts, 10)
    all_ids, all_scores = retriever.search(texts, 2 * default.depth, depth=default.depth)
    cut = 0
    for qid, top, ids, scores in zip(qids, top_ids, all_ids, all_scores, strict=True):
        run = result["run"][qid]
        assert list(run)[:10] == top
        assert list(run) == ids
        np.testing.assert_allclose(list(run.values()), scores, rtol=1e-5, atol=1e-6)
        cut += len(ids) < 500
    assert cut == len(qids)  # the depth left documents out of every query's candidates


def test_the_cli_prints_the_hybrid_with_dense_and_bm25_beside_it(tiny_st_dir, tiny_beir, capsys):
    from hf_cocodr.cli import main

    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--hybrid", "--fusion", "rrf"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"ndcg@10", "dense", "bm25"} <= set(line) and line["fusion"]["rule"] == "rrf"
    assert "ndcg@10" in line["dense"] and "ndcg@10" in line["bm25"]
    assert main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--dense-weight", "0.3"]) == 2
    assert "need --hybrid" in capsys.readouterr().err
    assert (
        main(["evaluate", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--hybrid", "--dense-weight", "1.5"])
        == 2
    )
    assert "dense_weight" in capsys.readouterr().err


def test_within_a_reusing_session_a_corpus_is_encoded_once_per_model(tiny_st_dir, tiny_beir, monkeypatch):
    """The recipe evaluates its final model, then builds its hybrid over the same corpus: given one reusing
    :class:`EncodingSession` the documents are encoded once, and the retriever equals one built afresh (cached ==
    uncached); changed weights are a new model, encoded again; a call without the session keeps nothing."""
    import numpy as np
    import torch

    from hf_cocodr import HybridRetriever, evaluate_retrieval, load_encoder
    from hf_cocodr.retrieval import encoding
    from hf_cocodr.retrieval.session import EncodingSession

    model = load_encoder(str(tiny_st_dir))
    fresh = HybridRetriever.build(model, tiny_beir, fusion={"dense_weight": 0.5})
    calls = []
    real = encoding.encode_texts
    monkeypatch.setattr(
        encoding, "encode_texts", lambda m, texts, **kw: calls.append(kw["kind"]) or real(m, texts, **kw)
    )
    session = EncodingSession().with_reuse()
    evaluate_retrieval(model, tiny_beir, "dev", show_progress_bar=False, session=session)
    reused = HybridRetriever.build(model, tiny_beir, fusion={"dense_weight": 0.5}, session=session)
    assert calls.count("document") == 1
    assert reused.doc_ids == fresh.doc_ids and np.array_equal(reused.embeddings, fresh.embeddings)
    HybridRetriever.build(model, tiny_beir, fusion={"dense_weight": 0.5})  # no session: encoded again
    assert calls.count("document") == 2
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    HybridRetriever.build(model, tiny_beir, fusion={"dense_weight": 0.5}, session=session)
    assert calls.count("document") == 3
