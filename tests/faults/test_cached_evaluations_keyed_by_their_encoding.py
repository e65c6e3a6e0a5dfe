"""Every cached evaluation is keyed by everything that changes its vectors (issue 66, item 5): the starting model's
evaluation (``OUT/start_eval.json``) by the corpus-encoding precision, the batch size and the token lengths besides
the model and the data; the encoding cache and the teacher's cache by the batch size too (their precision and length
keys are tested in tests/retrieval/test_encoding_cache.py)."""

from __future__ import annotations

import pytest

from hf_cocodr.retrieval.session import EncodingSession

pytestmark = pytest.mark.usefixtures("own_cache")


@pytest.fixture
def counted(monkeypatch):
    """The start evaluation's calls to ``evaluate_retrieval`` (each call's settings), the model load skipped."""
    import hf_cocodr.recipe.runner as runner

    calls = []

    def evaluated(model, folder, split, session=None, **kw):
        calls.append({"precision": session.precision if session else "fp32", **kw})
        channel = {"ndcg@10": 0.3 + 0.1 * len(calls), "recall@100": 0.6, "mrr@10": 0.25}
        dense = {**channel, "num_queries": 2, "num_docs": 5}
        return {**channel, "dense": dense, "bm25": channel, "fusion": {"rule": "stub"}}

    monkeypatch.setattr(runner, "load_encoder", lambda model: None)
    monkeypatch.setattr(runner, "evaluate_retrieval", evaluated)
    return runner._run_start_eval, calls


def test_a_start_evaluation_in_fp32_after_one_in_bf16_is_computed_again(counted, tiny_beir, tmp_path):
    start_eval, calls = counted
    out, spec = tmp_path / "OUT", f"{tiny_beir}:dev"
    out.mkdir()
    bf16 = start_eval("lab/retriever-small", [spec], out, 24, EncodingSession("bf16"))[spec]
    fp32 = start_eval("lab/retriever-small", [spec], out, 24, EncodingSession("fp32"))[spec]
    assert [c["precision"] for c in calls] == ["bf16", "fp32"]
    assert fp32 != bf16  # this run's, not the bf16 run's
    assert start_eval("lab/retriever-small", [spec], out, 24, EncodingSession("fp32"))[spec] == fp32
    assert len(calls) == 2  # the same settings again: reused


def test_a_start_evaluation_at_another_batch_or_length_is_computed_again(counted, tiny_beir, tmp_path):
    start_eval, calls = counted
    out, spec = tmp_path / "OUT", f"{tiny_beir}:dev"
    out.mkdir()
    start_eval("lab/retriever-small", [spec], out, 24)
    start_eval("lab/retriever-small", [spec], out, 40)
    start_eval("lab/retriever-small", [spec], out, 40, doc_max_length=48)
    start_eval("lab/retriever-small", [spec], out, 40, doc_max_length=48)
    assert [(c["batch_size"], c["doc_max_length"]) for c in calls] == [(24, None), (40, None), (40, 48)]


def test_the_encoding_and_teacher_caches_are_keyed_by_the_batch_size(tiny_st_dir, tiny_beir):
    from hf_cocodr.data.beir import load_corpus
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.retrieval import encoding_cache
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts
    from hf_cocodr.retrieval.teacher import teacher_cache_path

    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    keys = [encoding_cache.encoding_key(model, corpus, None, True, batch_size=b) for b in (8, 8, 48)]
    assert keys[0] == keys[1] != keys[2]
    ids, texts = _corpus_ids_texts(str(tiny_beir))
    assert teacher_cache_path("w", ids, texts, batch_size=12) != teacher_cache_path("w", ids, texts, batch_size=20)


def test_a_corpus_encoded_at_one_batch_size_is_not_served_at_another(tiny_st_dir, tiny_beir):
    """Through the disk cache: a recipe session encodes the corpus at batch 4, then asks for it at batch 32 (encoded
    again: its vectors are another batch size's) and at batch 4 again (read from the cache)."""
    from hf_cocodr.data.beir import load_corpus
    from hf_cocodr.modeling.loading import load_encoder
    from hf_cocodr.retrieval.encoding import build_index

    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    session = EncodingSession(cache=True)
    for batch in (4, 32, 4):
        build_index(model, corpus, batch_size=batch, show_progress_bar=False, session=session)
    assert [r["source"] for r in session.record] == ["encoded", "encoded", "disk cache"]


def test_an_mteb_result_of_another_batch_size_is_computed_again(tiny_st_dir, tiny_beir, tmp_path):
    import contextlib
    import io
    import json

    import hf_cocodr.cli.mteb  # noqa: F401  (registers the mteb command)
    from hf_cocodr.cli import main

    def mteb(batch: int) -> dict:
        argv = ["-q", "mteb", str(tiny_st_dir), str(tiny_beir), "--split", "dev", "--task-name", "bx-dev"]
        argv += ["--model-name", "lab/bx", "--revision", "r1", "--output-folder", str(tmp_path / "board")]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main([*argv, "--batch-size", str(batch)]) == 0
        return json.loads(out.getvalue().strip().splitlines()[-1])["tasks"]["bx-dev"]

    assert "main_score" in mteb(12)
    assert "skipped" in mteb(12)  # the same inputs: its file is this run's
    assert "main_score" in mteb(28)  # another batch size: computed again, never reported as skipped
