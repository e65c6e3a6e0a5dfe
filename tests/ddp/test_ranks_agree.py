"""What the ranks of a ``torchrun`` launch agree on (issue 66, item 6): a checkpoint is marked complete only after every
rank wrote its files (each rank's random state), a rank given other settings is refused in one line on every rank
before any work, and a refusal on rank 0 ends every rank with rank 0's exit code and one line, without a
traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .launch import launch_env, torchrun

pytestmark = pytest.mark.slow
WORKER = Path(__file__).parent / "rank_worker.py"


def _ranks(cmd: list[str], out: Path, cache: Path) -> list[dict]:
    proc = subprocess.run(cmd, env=launch_env(HF_COCODR_CACHE=str(cache)), capture_output=True, text=True, timeout=600)
    found = [out / f"rank{r}.json" for r in range(2)]
    assert all(f.is_file() for f in found), proc.stderr[-4000:]
    return [json.loads(f.read_text()) for f in found]


def _recipe_argv(model, beir, out: Path) -> list[str]:
    return [
        "-q", "recipe", "--model", str(model), "--target-corpus", str(beir), "--source-data", str(beir),
        "--output_dir", str(out), "--target-queries", f"{beir}:train", "--skip-coco", "true",
        "--wise-alpha", "none", "--distill-steps", "2",
    ]  # fmt: skip


def test_the_checkpoint_marker_waits_for_every_ranks_random_state(tiny_bert_dir, tiny_beir, tmp_path):
    out = tmp_path / "coco2"
    cmd = torchrun(29700) + [str(WORKER), "checkpoint", str(out), str(tiny_bert_dir), str(tiny_beir)]
    assert [r["code"] for r in _ranks(cmd, out, tmp_path / "cache")] == [0, 0]
    marker = json.loads((out / "run" / "checkpoint-1" / "hf_cocodr_checkpoint_complete.json").read_text())
    # rank 1 wrote its random state a second and a half after rank 0 finished its own files: the marker lists it
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(marker["files"]), marker["files"]
    assert marker["world_size"] == 2


def test_a_rank_given_other_distill_steps_is_refused_in_one_line_on_every_rank(tiny_st_dir, tiny_beir, tmp_path):
    out = tmp_path / "runs"
    argv = _recipe_argv(tiny_st_dir, tiny_beir, tmp_path / "OUT")
    cmd = torchrun(29750) + [str(WORKER), "cli", str(out), json.dumps(["--distill-steps", "9"]), "--", *argv]
    for rank in _ranks(cmd, out, tmp_path / "cache"):
        lines = [line for line in rank["stderr"].splitlines() if line.strip()]
        assert rank["code"] == 2 and len(lines) == 1, lines
        assert lines[0].startswith("hf-cocodr recipe: error: the ranks of this launch were given different")
        assert "distill_steps: 9 on rank 1, 2 on rank 0" in lines[0], lines[0]
    assert not (tmp_path / "OUT").exists()  # refused before any work


def test_a_refusal_on_rank_zero_ends_every_rank_with_its_code_and_one_line(tiny_st_dir, tiny_beir, tmp_path):
    target = tmp_path / "OUT"
    target.mkdir()
    (target / "field-notes.txt").write_text("the user's own file")  # rank 0 refuses to claim the folder
    out = tmp_path / "runs"
    cmd = torchrun(29800) + [str(WORKER), "cli", str(out), "[]", "--", *_recipe_argv(tiny_st_dir, tiny_beir, target)]
    zero, one = _ranks(cmd, out, tmp_path / "cache")
    said = [[line for line in r["stderr"].splitlines() if line.strip()] for r in (zero, one)]
    assert zero["code"] == one["code"] == 2, said
    assert all(len(lines) == 1 and "Traceback" not in r["stderr"] for lines, r in zip(said, (zero, one))), said
    assert "field-notes.txt" in said[0][0] or "hf_cocodr did not write" in said[0][0], said[0]
    assert said[1][0].startswith("hf-cocodr recipe: error: rank 0 of 2 stopped the run ("), said[1]
    assert (target / "field-notes.txt").read_text() == "the user's own file"
