"""The stage identities of a default run do not move: a finished stage of a run folder written by an earlier version
is skipped on a re-run only if its identity is the one that version computed.

Each case is one default schedule (no option set but the inputs), its inputs fixed by hand (the fingerprints, the
distillation's training queries), on a CPU without native bf16 (the suite's machine) and, for the distillation, with
it (bf16 by default). The digests were computed by the code before the distillation's loss settings moved onto the
loss classes and before the retired levers left the library (issue 65); they are the one pinned value here, and
what they prove is that those changes left every default identity as it was.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from hf_cocodr.recipe import RecipeConfig, RecipeRun, choose_schedule
from hf_cocodr.recipe.planner import fixed_plan, plan_identities, stage_ids
from hf_cocodr.recipe.queries import CorpusQueries
from hf_cocodr.recipe.stages import instantiate

FPS = {"model": "model-fingerprint", "targets": "targets-fingerprint", "source": "source-fingerprint"}
QUERIES = [f"what does protein {i} do in cell type {i % 7}" for i in range(40)]

# digests of stage_ids() for each default schedule, as the code before issue 65 computed them
PINNED = {
    "mlm_head": {"coco": "74c7eb22dcf25dc1", "finetune": "830b5ab5abb6c41e"},
    "no_mlm_head_queries": {"distill": "09d38e2064417cce"},
    "no_mlm_head": {"distill": "35a6f1c2f04bf414", "wise": "91017500bf0135d1"},
    "no_mlm_head_queries+bf16": {"distill": "f68ad1c27325d005"},
}
# the identity of a budgeted default run's plan (OUT/plan.json), as the code before issue 65 computed it
PINNED_PLANS = {
    "mlm_head": "a82bb3d02b1cdb5f",
    "no_mlm_head_queries": "7d6b7e344aabd72a",
    "no_mlm_head": "021a5a16a146515d",
}


def default_run(tmp_path, monkeypatch, has_mlm: bool, *, queries: bool, bf16: bool = False, minutes=None):
    """A default run: the schedule for ``has_mlm`` (with ``--target-queries`` where ``queries``), every option at its
    default, the distillation's training file written by hand, ``minutes`` its budget."""
    monkeypatch.setattr("hf_cocodr.recipe.schedules.no_gpu", lambda: True)
    monkeypatch.setenv("HF_COCODR_NATIVE_BF16", "1" if bf16 else "0")
    user = RecipeConfig(target_queries=["queries.jsonl"]) if queries else RecipeConfig()
    cfg, choice = choose_schedule(user, has_mlm)
    out = tmp_path / "out"
    tmp_path.mkdir(parents=True, exist_ok=True)
    return RecipeRun("model", ["corpus"], "source", out, [], cfg, choice, has_mlm, [], minutes, True, 0.0, FPS)


def default_ids(tmp_path, monkeypatch, has_mlm: bool, *, queries: bool, bf16: bool = False) -> dict[str, str]:
    """``stage_ids`` of a default run (:func:`default_run`) without a budget."""
    run = default_run(tmp_path, monkeypatch, has_mlm, queries=queries, bf16=bf16)
    cfg = run.cfg
    train = tmp_path / "train.jsonl"
    train.write_text("".join(f'{{"_id": "q{i}", "text": "{t}"}}\n' for i, t in enumerate(QUERIES)))
    run.queries = [CorpusQueries("corpus", "corpus", train=train, label="queries")]
    stages = instantiate()
    run.arguments = {s.name: s.arguments(run) for s in stages}
    run.plan = fixed_plan(cfg, stages)
    return stage_ids(run, stages)


@pytest.mark.parametrize(
    "case, has_mlm, queries, bf16",
    [
        ("mlm_head", True, False, False),
        ("no_mlm_head_queries", False, True, False),
        ("no_mlm_head", False, False, False),
        ("no_mlm_head_queries+bf16", False, True, True),
    ],
)
def test_the_stage_identities_of_a_default_run_are_the_ones_earlier_versions_computed(
    tmp_path, monkeypatch, case, has_mlm, queries, bf16
):
    ids = default_ids(tmp_path, monkeypatch, has_mlm, queries=queries, bf16=bf16)
    assert ids == PINNED[case]


def test_the_identities_depend_on_the_inputs_not_on_the_folders(tmp_path, monkeypatch):
    """The pin is of what the run computes from its inputs: the same inputs in other folders give the same ids, and
    another training query gives the distillation (and WiSE-FT after it) other ones."""
    first = default_ids(tmp_path / "a", monkeypatch, False, queries=False)
    assert default_ids(tmp_path / "b", monkeypatch, False, queries=False) == first
    QUERIES.append("one more query")
    try:
        other = default_ids(tmp_path / "c", monkeypatch, False, queries=False)
    finally:
        QUERIES.pop()
    assert set(other) == set(first) == {"distill", "wise"}
    assert other["distill"] != first["distill"] and other["wise"] != first["wise"]


@pytest.mark.parametrize(
    "case, has_mlm, queries",
    [("mlm_head", True, False), ("no_mlm_head_queries", False, True), ("no_mlm_head", False, False)],
)
def test_a_default_run_accepts_the_plan_an_earlier_version_saved(tmp_path, monkeypatch, case, has_mlm, queries):
    """A budgeted default run keeps the ``plan.json`` an earlier version wrote for the same inputs (its identity is
    among those the run accepts), so its finished stages keep their steps and are skipped."""
    run = default_run(tmp_path, monkeypatch, has_mlm, queries=queries, minutes=30.0)
    assert PINNED_PLANS[case] in plan_identities(run, asdict(run.cfg))
