"""The development suite's report (``scripts/studies/suite.py``): what the default exports under ``guard: on`` from
rows run under ``guard: record``, what the labels read, and the leave-one-corpus-out choice, on hand-made rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

STUDIES = Path(__file__).resolve().parents[2] / "scripts" / "studies"


def _suite():
    sys.path.insert(0, str(STUDIES))  # (it imports its sibling cpu_budget)
    try:
        spec = importlib.util.spec_from_file_location("suite_under_test", STUDIES / "suite.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (its dataclasses look their module up)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(STUDIES))
    return mod


def _row(dense: float, hybrid: float, verdict: str, leads: bool | None = True) -> dict:
    return {
        "dense": 0.5 + dense,
        "start": 0.5,
        "hybrid": 0.6 + hybrid,
        "start_hybrid": 0.6,
        "guard": {"verdict": verdict},
        "teacher_check": {"leads": leads},
    }


def test_what_guard_on_exports_from_recorded_rows():
    suite = _suite()
    cell = suite.arm_cells(
        {
            42: _row(0.02, 0.01, "better"),  # exported
            43: _row(-0.03, -0.02, "worse"),  # the start kept: no change
            44: _row(0.04, 0.03, "better", leads=False),  # no lead: nothing distilled under guard: on
        }
    )
    assert cell["dense_on"] == pytest.approx([0.02, 0.0, 0.0]) and cell["hybrid_on"] == pytest.approx([0.01, 0.0, 0.0])
    assert cell["holds"] and cell["verdicts"] == ["better", "worse", "better"]
    # the adapted models themselves: the labels see no difference beyond the spread (0.0033 ± 0.035)
    assert cell["labels_see"] == "no difference"


def test_the_labels_read_beyond_the_spread_and_the_margin():
    suite = _suite()
    assert suite.labels_see([0.02, 0.03], [0.0, 0.001]) == "better"
    assert suite.labels_see([0.02, 0.03], [-0.02, -0.01]) == "worse"  # one side worse: worse
    assert suite.labels_see([0.004, 0.001], [0.0, 0.0]) == "no difference"  # within the margin
    assert suite.labels_see([-0.01, 0.03], [0.0, 0.0]) == "no difference"  # within the spread


def test_leave_one_corpus_out_chooses_on_the_others():
    suite = _suite()
    recipe = {
        # "bold" gains most but fails on c; "safe" holds everywhere
        "bold": {"a": {42: _row(0.05, 0.02, "better")}, "b": {42: _row(0.04, 0.02, "better")},
                 "c": {42: _row(-0.05, -0.04, "better")}},
        "safe": {"a": {42: _row(0.01, 0.0, "better")}, "b": {42: _row(0.01, 0.0, "better")},
                 "c": {42: _row(0.0, 0.0, "unverified")}},
    }  # fmt: skip
    rows = {r["held_out"]: r for r in suite.loco(recipe, ["a", "b", "c"])}
    # left out a (or b): chosen on the two others, c among them, where bold fails: safe, which holds on a
    assert rows["a"]["chosen"] == rows["b"]["chosen"] == "safe" and rows["a"]["holds_there"]
    # left out c: bold holds on a and b and gains more there; on c it fails
    assert rows["c"]["chosen"] == "bold" and rows["c"]["holds_there"] is False


def test_the_guards_rules_read_again_from_the_recorded_readings():
    """A row's verdict under a veto at one or two standard errors, by hand: a hybrid reading at −1.4 SE vetoes at one
    and not at two; the dense reading vouches above +1 SE either way."""
    suite = _suite()
    row = _row(0.01, 0.008, "worse")
    row["guard"]["readings"] = {
        "cloze": {"difference": 0.0128, "se": 0.0083},  # +1.5 SE
        "cloze_hybrid": {"difference": -0.0061, "se": 0.0044},  # -1.4 SE
    }
    assert suite.rule_verdict(row, 1.0) == "worse" and suite.rule_verdict(row, 2.0) == "better"
    again = suite.with_rule({"a": {42: row}}, 2.0)  # a copy read again; the recorded row unchanged
    assert again["a"][42]["guard"]["verdict"] == "better" and row["guard"]["verdict"] == "worse"
    row["guard"]["readings"]["cloze"] = {"difference": 0.005, "se": 0.0083}
    assert suite.rule_verdict(row, 2.0) == "unverified"
    row["guard"]["readings"]["cloze_hybrid"] = {"difference": -0.02, "se": 0.0044}
    assert suite.rule_verdict(row, 2.0) == "worse"
    assert suite.rule_verdict({"guard": {"verdict": "not read"}}, 2.0) == "not read"
