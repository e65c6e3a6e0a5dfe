"""The hybrid as an MTEB model: ``hf-cocodr mteb ... --hybrid`` on the tiny task writes a ``model_meta.json`` with
``model_type`` hybrid and a task JSON that mteb's own ``TaskResult.from_disk`` loads, whose scores equal
``hf-cocodr evaluate --hybrid`` on the same data (never a hard-coded number)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import hf_cocodr.cli.mteb  # noqa: F401  (registers the mteb command)
from hf_cocodr import evaluate_retrieval, load_encoder
from hf_cocodr.cli import main
from hf_cocodr.utils import faiss_available

MODEL_NAME = "test-org/tiny-hybrid"
REVISION = "fedcba9876543210"


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A tiny sentence-transformers model with a wide initialisation (no near-ties between its top scores)."""
    import tiny

    out = tmp_path_factory.mktemp("hybrid_model") / "model"
    bert = tiny.make_tiny_bert(tmp_path_factory.mktemp("hybrid_bert"), seed=4, initializer_range=0.2)
    load_encoder(str(bert)).save(str(out))
    return out


def _mteb(model, data, out, *extra):
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        code = main(
            ["-q", "mteb", str(model), str(data), "--split", "dev", "--task-name", "toy-dev"]
            + ["--model-name", MODEL_NAME, "--revision", REVISION, "--output-folder", str(out), "--batch-size", "16"]
            + list(extra)
        )
    return code, stdout.getvalue()


@pytest.fixture(scope="module")
def hybrid_run(wide_model, tiny_beir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mteb_hybrid")
    code, stdout = _mteb(wide_model, tiny_beir, out, "--hybrid")
    return code, out, stdout


def test_the_hybrid_writes_the_leaderboard_layout_that_mteb_reads(hybrid_run, wide_model):
    import mteb

    code, out, stdout = hybrid_run
    assert code == 0
    rev_dir = out / "results" / "test-org__tiny-hybrid" / REVISION
    meta = json.loads((rev_dir / "model_meta.json").read_text())
    assert meta["name"] == MODEL_NAME and meta["revision"] == REVISION and meta["model_type"] == ["hybrid"]
    assert meta["loader"] == "cocodr_hybrid_loader"
    parts = meta["loader_kwargs"]
    assert parts["dense_model"] == wide_model.name == meta["adapted_from"]  # named, never by its local path
    assert parts["lexical_model"].startswith("bm25s")
    assert parts["fusion"]["rule"] == "convex" and parts["fusion"]["dense_weight"] == "fitted per task corpus"
    assert parts["fusion"]["normalize"] == "fitted per task corpus, one of z, minmax, dbsf"
    # the loader the meta names rebuilds the fusion it states: both fitted per corpus
    from hf_cocodr.evaluation.mteb.hybrid import cocodr_hybrid_loader
    from hf_cocodr.retrieval.fusion import FusionConfig

    loaded_model = cocodr_hybrid_loader(MODEL_NAME, dense_model=str(wide_model), fusion=parts["fusion"])
    assert loaded_model.fusion == FusionConfig()
    result = mteb.TaskResult.from_disk(rev_dir / "toy-dev.json")
    assert result.task_name == "toy-dev" and "dev" in result.scores
    line = json.loads(stdout.strip().splitlines()[-1])
    fusion = line["tasks"]["toy-dev"]["fusion"]
    assert isinstance(fusion["dense_weight"], float) and fusion["fit"]["pseudo_queries"] >= 8
    # mteb's own results tooling reads the folder back, the hybrid type included
    cache = mteb.ResultCache(out)
    loaded = cache.load_results(models=[MODEL_NAME], tasks=["toy-dev"], require_model_meta=False)
    assert [m.model_name for m in loaded.model_results] == [MODEL_NAME]


def test_the_hybrids_scores_equal_evaluate_hybrid_on_the_same_data(hybrid_run, wide_model, tiny_beir):
    _, out, stdout = hybrid_run
    task = json.loads((out / "results" / "test-org__tiny-hybrid" / REVISION / "toy-dev.json").read_text())
    entry = task["scores"]["dev"][0]
    ours = evaluate_retrieval(
        load_encoder(wide_model), tiny_beir, "dev", show_progress_bar=False, batch_size=16, hybrid=True
    )
    line = json.loads(stdout.strip().splitlines()[-1])
    assert ours["fusion"] == line["tasks"]["toy-dev"]["fusion"]  # the same rule and weight, fitted the same way
    # mteb writes 5 decimals, evaluate 6: equal up to that rounding
    assert entry["main_score"] == pytest.approx(ours["ndcg@10"], abs=1e-5)
    assert entry["mrr_at_10"] == pytest.approx(ours["mrr@10"], abs=1e-5)
    assert entry["recall_at_100"] == pytest.approx(ours["recall@100"], abs=1e-5)
    # the hybrid is not the dense model: its dense part's own score is in the evaluation beside it
    assert ours["dense"]["ndcg@10"] != ours["ndcg@10"] or ours["bm25"]["ndcg@10"] == ours["ndcg@10"]


def test_a_given_weight_is_used_and_hybrid_options_need_hybrid(wide_model, tiny_beir, tmp_path, capsys):
    code, stdout = _mteb(wide_model, tiny_beir, tmp_path / "o", "--hybrid", "--dense-weight", "0.3")
    assert code == 0
    line = json.loads(stdout.strip().splitlines()[-1])
    assert line["tasks"]["toy-dev"]["fusion"]["dense_weight"] == 0.3
    meta = json.loads(
        (tmp_path / "o" / "results" / "test-org__tiny-hybrid" / REVISION / "model_meta.json").read_text()
    )
    assert (
        meta["loader_kwargs"]["fusion"]["dense_weight"] == 0.3 and meta["loader_kwargs"]["fusion"]["normalize"] == "z"
    )
    capsys.readouterr()
    code, _ = _mteb(wide_model, tiny_beir, tmp_path / "p", "--dense-weight", "0.3")
    assert code == 2 and "need --hybrid" in capsys.readouterr().err
    code, _ = _mteb(wide_model, tiny_beir, tmp_path / "q", "--hybrid", "--dense-weight", "2")
    assert code == 2 and "dense_weight" in capsys.readouterr().err


def test_an_asymmetric_model_is_run_by_mteb_through_its_routes(wide_model, tiny_beir, tmp_path):
    """A query-side model (a Router): mteb encodes the task's queries through the query route and its documents
    through the document route, so its scores equal ``evaluate``'s, which routes the same way (and both differ from
    encoding everything through one route)."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.modeling.asymmetric import query_side_model

    model = query_side_model(SentenceTransformer(str(wide_model)))
    with torch.no_grad():
        for p in model[0].sub_modules["query"].parameters():
            p.mul_(1.5)
    asym = tmp_path / "asym"
    model.save(str(asym))
    texts = ["alpha beta", "gamma"]
    assert not np.allclose(model.encode_query(texts), model.encode_document(texts), atol=1e-4)
    code, _ = _mteb(asym, tiny_beir, tmp_path / "o")
    assert code == 0
    entry = json.loads((tmp_path / "o" / "results" / "test-org__tiny-hybrid" / REVISION / "toy-dev.json").read_text())
    ours = evaluate_retrieval(SentenceTransformer(str(asym)), tiny_beir, "dev", show_progress_bar=False, batch_size=16)
    assert entry["scores"]["dev"][0]["main_score"] == pytest.approx(ours["ndcg@10"], abs=1e-5)
    assert entry["scores"]["dev"][0]["recall_at_100"] == pytest.approx(ours["recall@100"], abs=1e-5)
    # queries through the document route would score as the starting model does: the routes make a difference here
    start = evaluate_retrieval(load_encoder(wide_model), tiny_beir, "dev", show_progress_bar=False, batch_size=16)
    keys = [k for k in ours if k.startswith(("ndcg@", "mrr@", "map@"))]
    assert any(abs(ours[k] - start[k]) > 1e-4 for k in keys)


@pytest.mark.skipif(not faiss_available(), reason="an approximate index needs faiss")
def test_an_approximate_index_is_recorded_per_task_and_sets_the_files_inputs(wide_model, tiny_beir, tmp_path):
    code, stdout = _mteb(wide_model, tiny_beir, tmp_path / "o", "--hybrid", "--index", "ivf")
    assert code == 0
    task = json.loads(stdout.strip().splitlines()[-1])["tasks"]["toy-dev"]
    assert task["index"]["kind"] == "ivf" and 0.0 <= task["index"]["recall@100"] <= 1.0
    assert task["index"]["sample"]["queries"] == 80  # every document of the tiny corpus (fewer than 1,000)
    # the same folder with the default index: a file computed with another index is computed again, not skipped
    code, stdout = _mteb(wide_model, tiny_beir, tmp_path / "o", "--hybrid")
    assert code == 0 and "skipped" not in json.loads(stdout.strip().splitlines()[-1])["tasks"]["toy-dev"]
