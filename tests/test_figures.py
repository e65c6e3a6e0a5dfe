"""The figures registry (``reports/figures.md``): every four-decimal figure the README and the user's guide state is
listed under an entry that gives the command reproducing it and the report holding its rows, and every entry the
README's table links exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "reports" / "figures.md"
PAGES = [ROOT / "README.md", ROOT / "docs" / "adaptation.md"]
FIGURE = re.compile(r"(?<![\w.])\d\.\d{4}(?![\d])")


def entries(text: str) -> dict[str, str]:
    """``{"F1": its text, ...}``: each ``## NAME`` section of the registry."""
    parts = re.split(r"^## (\w+)\s*$", text, flags=re.M)
    return {name: body for name, body in zip(parts[1::2], parts[2::2])}


def figures(text: str) -> set[str]:
    """The four-decimal figures of a page's prose and tables (link targets and code blocks left out: an arXiv id is
    no figure)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", "", text)
    return set(FIGURE.findall(text))


def test_every_entry_has_its_figures_a_command_and_a_report():
    found = entries(REGISTRY.read_text())
    assert found, "reports/figures.md has no entry"
    for name, body in found.items():
        assert re.search(r"^- figures: .*\d\.\d{4}", body, flags=re.M), f"{name}: no figures line"
        assert re.search(r"^- command: `[^`]+`", body, flags=re.M), f"{name}: no command"
        reports = re.findall(r"^- report: \[[^\]]+\]\(([^)]+)\)", body, flags=re.M)
        assert reports, f"{name}: no report"
        for rel in reports:
            assert (REGISTRY.parent / rel).is_file(), f"{name}: its report {rel} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_of_the_page_is_in_the_registry(page):
    listed = set()
    for body in entries(REGISTRY.read_text()).values():
        line = re.search(r"^- figures: (.*)$", body, flags=re.M)
        listed |= set(FIGURE.findall(line.group(1))) if line else set()
    missing = sorted(figures(page.read_text()) - listed)
    assert not missing, f"{page.name} states figures reports/figures.md does not list: {missing}"


def test_the_readme_table_links_each_row_to_an_entry():
    text = (ROOT / "README.md").read_text()
    table = re.search(r"^\| system \|.*?(?=\n\n)", text, flags=re.M | re.S).group(0)
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    assert rows
    known = {name.lower() for name in entries(REGISTRY.read_text())}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(len(c) <= 160 for c in cells), f"a cell over 160 characters: {row}"
        anchors = re.findall(r"reports/figures\.md#(\w+)", row)
        assert anchors and all(a in known for a in anchors), f"a row without its registry entry: {row}"


def test_the_figure_pattern_by_hand():
    assert figures("0.6761 and +0.0234 ± 0.0032, not 2210.15212 nor [x](https://arxiv.org/abs/2210.15212)") == {
        "0.6761",
        "0.0234",
        "0.0032",
    }
