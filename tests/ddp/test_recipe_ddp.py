"""``torchrun --nproc_per_node 2 -m hf_cocodr recipe``: every rank trains and shares the corpus encodings, rank 0
alone writes the run's files and prints; with SGD, no dropout and a loss without in-batch negatives, 2 ranks of
batch 4 adapt the model as one process of batch 8 does, and print the same result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from .launch import ranks_checked, run_checked, torchrun

pytestmark = pytest.mark.slow


def _torchrun() -> list[str]:
    return torchrun(29300) + ["--tee", "1"]


@pytest.fixture(scope="module")
def nodrop_st(tmp_path_factory):
    import tiny

    from hf_cocodr.export import export_sentence_transformer

    # initializer_range 0.2: at BERT's 0.02 this 2-layer, hidden-32 model maps every text to nearly one vector (every
    # query-document score 32.000 ± 0.0004, their gaps at float32's resolution there), so the 1e-9 by which 2 ranks'
    # all-reduced SGD steps differ from one process's reorders tied documents and the fusion fit chooses otherwise
    # on some CPUs; with scores that differ beyond float noise both runs rank, fit and fuse alike
    raw = tiny.make_tiny_bert(
        tmp_path_factory.mktemp("recipe_ddp_raw"), dropout=0.0, seed=3, mlm=False, initializer_range=0.2
    )
    out = tmp_path_factory.mktemp("recipe_ddp_st") / "model"
    export_sentence_transformer(str(raw), out)
    return out


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    import tiny

    return tiny.make_beir(tmp_path_factory.mktemp("recipe_ddp_beir") / "b", n_docs=60, n_queries=40)


def _recipe(launch: list[str] | None, model, beir, out: Path, batch: int, cache: Path):
    """The recipe launched by ``launch`` (its result), or with ``None`` as two ranks forked from the suite's fork server
    in the environment torchrun gives its ranks (each rank's result)."""
    config = out.parent / f"{out.name}.yaml"
    config.write_text(
        "distill:\n"
        f"  per_device_train_batch_size: {batch}\n"
        "  optim: sgd\n"
        "  learning_rate: 0.05\n"
        "  warmup_steps: 0\n"
        "  save_steps: 2\n"
        "  weight_decay: 0.0\n"
    )
    cmd = (launch or [sys.executable]) + [
        "-m", "hf_cocodr", "-q", "recipe",
        "--model", str(model), "--target-corpus", str(beir), "--source-data", str(beir),
        "--output_dir", str(out), "--config", str(config),
        "--target-queries", f"{beir}:train", "--eval", f"{beir}:dev",
        "--skip-coco", "true", "--wise-alpha", "none",
        "--distill-steps", "3", "--distill-k", "4", "--distill-side", "query",
        "--distill-in-batch-weight", "0", "--guard", "record",
    ]  # fmt: skip
    if launch is not None:
        return run_checked(cmd, cwd=out.parent, HF_COCODR_CACHE=str(cache))
    return ranks_checked(cmd, cwd=out.parent, HF_COCODR_CACHE=str(cache))


def _printed(proc) -> list[dict]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return [json.loads(line.split("]:", 1)[1] if line.startswith("[") else line) for line in lines]


def _close(a, b, tol=1e-5):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            if not str(k).endswith("_seconds"):
                _close(a[k], b[k], tol)
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=tol)
    else:
        assert a == b


def test_two_ranks_run_the_recipe_as_one_process_with_their_joint_batch(nodrop_st, beir, tmp_path):
    # two ranks as torchrun starts them (its environment), against one process with their joint batch
    two = _recipe(None, nodrop_st, beir, tmp_path / "two", 4, tmp_path / "cache2")
    one = _recipe([sys.executable], nodrop_st, beir, tmp_path / "one", 8, tmp_path / "cache1")
    assert _printed(two[1]) == [], two[1].stdout  # rank 0's result only
    printed = _printed(two[0])
    assert len(printed) == 1, two[0].stdout
    (single,) = _printed(one)
    _close(printed[0], single)  # the adapted and the starting model's metrics, dense and hybrid
    rec_two = json.loads((tmp_path / "two" / "recipe.json").read_text())
    rec_one = json.loads((tmp_path / "one" / "recipe.json").read_text())
    assert rec_two["ranks"] == 2 and rec_one["ranks"] == 1
    assert rec_two["steps_trained"] == rec_one["steps_trained"] == {"distill": 3}
    assert rec_two["guard"]["verdict"] == rec_one["guard"]["verdict"]
    # the query route trained alike: 2 ranks x 4 queries a step == 8 queries a step (SGD: equal gradients)
    a = load_file(str(next((tmp_path / "two" / "model").glob("query_0_*/model.safetensors"))))
    b = load_file(str(next((tmp_path / "one" / "model").glob("query_0_*/model.safetensors"))))
    start = load_file(str(next(nodrop_st.glob("**/model.safetensors"))))
    assert a.keys() == b.keys()
    moved = [k for k in a if not torch.equal(a[k], start[k])]
    assert len(moved) > 5  # it trained
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)
    # one set of files, written once by rank 0: the card, the saved hybrid, the stage's marker and checkpoints
    for out in ("two", "one"):
        assert (tmp_path / out / "model" / "README.md").is_file()
        assert (tmp_path / out / "hybrid" / "b" / "hybrid.json").is_file()
    names = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "one").iterdir())
    np.testing.assert_allclose(
        json.loads((tmp_path / "two" / "eval.json").read_text())[f"{beir}:dev"]["ndcg@10"],
        json.loads((tmp_path / "one" / "eval.json").read_text())[f"{beir}:dev"]["ndcg@10"],
        atol=1e-5,
    )


def test_a_budgeted_recipe_under_torchrun_plans_once_and_every_rank_trains_its_steps(nodrop_st, beir, tmp_path):
    """Every rank probes (a probe's steps are a distributed trainer's), rank 0's measurements plan them all: the
    ranks train the same steps (a rank that stopped early would leave the other waiting in a collective), the plan
    is written once and the one result line printed."""
    out = tmp_path / "budget"
    config = tmp_path / "budget.yaml"
    config.write_text("distill:\n  per_device_train_batch_size: 4\n")
    cmd = _torchrun() + [
        "-m", "hf_cocodr", "-q", "recipe",
        "--model", str(nodrop_st), "--target-corpus", str(beir), "--source-data", str(beir),
        "--output_dir", str(out), "--config", str(config), "--target-queries", f"{beir}:train",
        "--eval", f"{beir}:dev", "--skip-coco", "true", "--distill-side", "query",
        "--max-minutes", "1.5", "--distill-max-passes", "3",
    ]  # fmt: skip
    proc = run_checked(cmd, HF_COCODR_CACHE=str(tmp_path / "cache"))
    (result,) = _printed(proc)
    assert set(result) == {f"{beir}:dev"}
    record = json.loads((out / "recipe.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert record["ranks"] == 2 and plan["distill_steps"] > 0
    # the steps the plan bought, capped at 3 passes over the train queries (8 a step: 2 ranks x 4)
    from hf_cocodr.data.target_queries import read_target_queries

    queries = len(read_target_queries(f"{beir}:train").texts)
    assert record["steps_trained"]["distill"] == min(plan["distill_steps"], 3 * (queries // 8)) > 1
