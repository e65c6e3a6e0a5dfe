"""Sharded corpus encoding: two CPU ranks (gloo; started in torchrun's environment, the commands under torchrun itself)
== one process, for every caller that encodes a corpus (the index of the evaluation, the hybrid build, the teacher,
the fusion fit's documents, the hard-negatives refresh), a corpus whose size does not divide by the ranks and a rank
with an empty slice included; the ``evaluate`` and ``mteb --hybrid`` commands print the same JSON (``mteb`` writes
the same results files, once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .launch import ranks_checked, run_checked, torchrun

WORKER = Path(__file__).parent / "shard_worker.py"
CHUNK = 8  # 81 documents: 11 chunks (the last of one document), dealt 5 / 6 to the two ranks


def _torchrun() -> list[str]:
    return torchrun(29700)


@pytest.fixture(scope="module")
def shard_beir(tmp_path_factory):
    import tiny

    return tiny.make_beir(tmp_path_factory.mktemp("shard_beir") / "b", n_docs=81, n_queries=24)


@pytest.fixture(scope="module")
def shard_runs(tiny_st_dir, shard_beir, tmp_path_factory):
    base = tmp_path_factory.mktemp("shard_runs")
    args = [str(WORKER), str(tiny_st_dir), str(shard_beir)]
    # two ranks as torchrun starts them, forked from the suite's fork server (the commands below launch torchrun)
    ranks_checked([sys.executable] + args + [str(base / "two"), str(CHUNK)])
    run_checked([sys.executable] + args + [str(base / "one"), str(CHUNK)])

    def load(folder, rank):
        return json.loads((folder / f"rank{rank}.json").read_text()), dict(np.load(folder / f"rank{rank}.npz"))

    return [load(base / "two", 0), load(base / "two", 1)], load(base / "one", 0)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_two_ranks_build_the_index_one_process_builds(shard_runs):
    ranks, (one, one_arr) = shard_runs
    assert one["world_size"] == 1
    for rec, arr in ranks:
        assert rec["world_size"] == 2
        _close(arr["index_vectors"], one_arr["index_vectors"])
        assert rec["index_order"] == one["index_order"]
        assert rec["index_rows"] == one["index_rows"]
        _close(arr["index_scores"], one_arr["index_scores"])
        # a one-document corpus (rank 1's slice is empty) and texts in uneven chunks
        _close(arr["one_vectors"], one_arr["one_vectors"])
        assert rec["one_order"] == one["one_order"] == [0]
        _close(arr["one_texts"], one_arr["one_texts"])
        _close(arr["texts"], one_arr["texts"])
    # every rank holds the same vectors, bit for bit (broadcast from the rank that encoded them)
    assert np.array_equal(ranks[0][1]["index_vectors"], ranks[1][1]["index_vectors"])


@pytest.mark.slow
def test_two_ranks_evaluate_as_one_process(shard_runs):
    ranks, (one, _) = shard_runs
    for rec, _ in ranks:
        ev, ref = rec["evaluation"], one["evaluation"]
        assert ev["run"] == ref["run"]  # the hybrid's fused rankings and scores
        assert {k: v for k, v in ev.items() if k != "run"} == {k: v for k, v in ref.items() if k != "run"}


@pytest.mark.slow
def test_two_ranks_build_the_hybrid_one_process_builds(shard_runs):
    ranks, (one, one_arr) = shard_runs
    for rec, arr in ranks:
        _close(arr["hybrid_embeddings"], one_arr["hybrid_embeddings"])
        assert rec["hybrid_fusion"] == one["hybrid_fusion"]
        assert rec["hybrid_ids"] == one["hybrid_ids"]
        _close(rec["hybrid_scores"], one["hybrid_scores"])


@pytest.mark.slow
def test_two_ranks_rank_as_the_teacher_of_one_process(shard_runs):
    ranks, (one, _) = shard_runs
    for rec, _ in ranks:
        assert rec["teacher_ids"] == one["teacher_ids"]
        _close(rec["teacher_scores"], one["teacher_scores"])


@pytest.mark.slow
def test_two_ranks_refresh_the_negatives_one_process_refreshes(shard_runs):
    """``HardNegativeRefreshCallback.refresh`` on two ranks (each encodes its chunks of the training corpus, rank 0
    ranks the queries and broadcasts) installs on both ranks the negatives one process installs, and hands K-Means
    the same query embeddings."""
    ranks, (one, one_arr) = shard_runs
    assert one["refresh_source"] == "self-mined@3" and one["refresh_queries"] == 12
    assert one["refresh_neg_idx"] != one["bm25_neg_idx"]  # the refresh replaced the BM25 warm-up table
    assert np.diff(one["refresh_neg_ptr"]).tolist() == [19] * 12  # ranks [1, 20) of the documents not positive
    for rec, arr in ranks:
        assert rec["refresh_source"] == one["refresh_source"]
        assert rec["refresh_neg_ptr"] == one["refresh_neg_ptr"]
        assert rec["refresh_neg_idx"] == one["refresh_neg_idx"]
        assert arr["refresh_query_embeddings"].shape == one_arr["refresh_query_embeddings"].shape == (12, 32)
        _close(arr["refresh_query_embeddings"], one_arr["refresh_query_embeddings"])
    # rank 1 installed what rank 0 broadcast, bit for bit
    assert np.array_equal(ranks[0][1]["refresh_query_embeddings"], ranks[1][1]["refresh_query_embeddings"])


@pytest.mark.slow
def test_evaluate_command_under_torchrun_prints_one_process_json(tiny_st_dir, shard_beir, tmp_path):
    """``torchrun -m hf_cocodr evaluate --hybrid`` prints on rank 0 the JSON one process prints (its timings
    aside), and nothing on rank 1; ``--output`` is written once. The corpus is one chunk here: rank 1's slice is
    empty."""
    common = ["-q", "evaluate", str(tiny_st_dir), str(shard_beir), "--split", "dev", "--hybrid"]
    two = run_checked(
        _torchrun() + ["--tee", "1", "-m", "hf_cocodr"] + common + ["--output", str(tmp_path / "two.json")]
    )
    one = run_checked([sys.executable, "-m", "hf_cocodr"] + common + ["--output", str(tmp_path / "one.json")])

    def timeless(d):
        if isinstance(d, dict):
            return {k: timeless(v) for k, v in d.items() if not k.endswith("_seconds")}
        return d

    def result(line: str) -> dict:
        return timeless(json.loads(line))

    printed = [line for line in two.stdout.splitlines() if line.strip()]
    assert len(printed) == 1, two.stdout  # rank 0's line only (torchrun --tee prefixes ranks' lines)
    line = printed[0].split("]:", 1)[1] if printed[0].startswith("[") else printed[0]
    assert result(line) == result(one.stdout.strip().splitlines()[-1])
    written = json.loads((tmp_path / "two.json").read_text())
    assert written["run"] == json.loads((tmp_path / "one.json").read_text())["run"]


@pytest.mark.slow
def test_mteb_hybrid_command_under_torchrun_prints_and_writes_one_process_results(tiny_st_dir, shard_beir, tmp_path):
    """``torchrun -m hf_cocodr mteb --hybrid`` prints on rank 0 the JSON one process prints (its paths and timings
    aside), and nothing on rank 1; the results folder and the predictions are written once, by rank 0, with the
    files one process writes; rank 1 computed into a scratch copy that it removed. The corpus is one chunk here:
    rank 1's slice is empty."""
    common = ["-q", "mteb", str(tiny_st_dir), str(shard_beir), "--split", "dev", "--task-name", "toy-dev"]
    common += ["--model-name", "test-org/tiny-hybrid", "--revision", "fedcba9876543210", "--batch-size", "16"]
    common += ["--hybrid"]

    def launch(name: str, launcher: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
        out, tmp = tmp_path / name, tmp_path / f"{name}_tmp"
        tmp.mkdir()
        argv = common + ["--output-folder", str(out / "results"), "--prediction-folder", str(out / "predictions")]
        proc = run_checked(launcher + argv, TMPDIR=str(tmp), HF_COCODR_CACHE=str(tmp_path / f"{name}_cache"))
        assert not list(tmp.glob("hf-cocodr-mteb-rank-*"))  # rank 1's scratch copy is gone
        return proc, out

    two, two_out = launch("two", _torchrun() + ["--tee", "1", "-m", "hf_cocodr"])
    one, one_out = launch("one", [sys.executable, "-m", "hf_cocodr"])

    def result(line: str, out: Path) -> dict:
        return json.loads(line.replace(str(out), "OUT"), object_hook=_timeless)

    printed = [line for line in two.stdout.splitlines() if line.strip()]
    assert len(printed) == 1 and printed[0].startswith("[default0]:"), two.stdout  # rank 0's line only
    line = printed[0].split("]:", 1)[1]
    reference = result(one.stdout.strip().splitlines()[-1], one_out)
    assert result(line, two_out) == reference
    assert "skipped" not in reference["tasks"]["toy-dev"] and "fusion" in reference["tasks"]["toy-dev"]

    def files(out: Path) -> dict:
        found = {}
        for f in sorted(p for p in out.rglob("*") if p.is_file()):
            rel = f.relative_to(out).as_posix()
            text = f.read_text().replace(str(out), "OUT")
            found[rel] = json.loads(text, object_hook=_timeless) if f.suffix == ".json" else text
        return found

    two_files, one_files = files(two_out), files(one_out)
    assert sorted(two_files) == sorted(one_files)
    assert "results/hf_cocodr_run.json" in one_files and any(r.startswith("predictions/") for r in one_files)
    task = "results/results/test-org__tiny-hybrid/fedcba9876543210/toy-dev.json"
    assert two_files[task]["scores"] == one_files[task]["scores"]
    for rel in one_files:  # the task's scores, the meta, the owner record (its provenance per file), predictions
        assert two_files[rel] == one_files[rel], rel


_TIMES = {"date", "evaluation_time", "started", "updated", "run_id", "start", "end"}


def _timeless(d: dict) -> dict:
    """A JSON object without its timings (``*_seconds``, mteb's time stamps, the run's id)."""
    return {k: v for k, v in d.items() if not k.endswith("_seconds") and k not in _TIMES}


def test_planner_divides_the_teacher_encoding_by_the_ranks(monkeypatch):
    from hf_cocodr import distributed as D
    from hf_cocodr.recipe import RecipeConfig
    from hf_cocodr.recipe.stages.distill import DistillStage

    throughput = {
        "distill_step_s": 0.1,
        "distill_teacher_encode_s": 40.0,
        "distill_teacher_bm25_s": 2.0,
        "distill_teacher_rank_s": 1.0,
        "distill_teacher_s": 43.0,
    }
    cfg = RecipeConfig(target_queries=["q"])
    one = DistillStage().cost(throughput, cfg)
    monkeypatch.setattr(D, "world", lambda: (4, 0))
    four = DistillStage().cost(throughput, cfg)
    assert one.fixed_s == pytest.approx(43.0) and one.parts["distill_teacher_encode"] == 40.0
    assert four.fixed_s == pytest.approx(13.0) and four.parts["distill_teacher_encode"] == 10.0
    assert four.parts["distill_teacher_bm25"] == 2.0 and four.parts["distill_teacher_rank"] == 1.0
