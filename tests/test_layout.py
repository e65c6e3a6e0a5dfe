"""The repository's paths as its texts name them: every script and report that README, docs/, the Makefile, the
reports and the scripts mention exists where they say, and no script edits ``sys.path`` to find its helpers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a script by its file (python scripts/studies/x.py) or as a module (python -m scripts.benchmarks.x); a report file,
# or the prefix a study writes its .md and .json under (reports/studies/distill_gpu)
SCRIPT_FILE = re.compile(r"(?<![\w/.])scripts/[\w/]+\.py\b")
SCRIPT_MODULE = re.compile(r"python -m (scripts(?:\.\w+)+)")
REPORT = re.compile(r"(?<![\w/.])reports/[\w/.-]*\w")


def texts(root: Path = ROOT) -> list[Path]:
    found = [root / "README.md", root / "Makefile", *sorted((root / "docs").glob("*.md"))]
    found += sorted(p for p in (root / "reports").rglob("*") if p.suffix in (".md", ".json"))
    return found + sorted((root / "scripts").rglob("*.py"))


def mentions(pattern: re.Pattern, root: Path = ROOT) -> set[tuple[str, str]]:
    return {(str(p.relative_to(root)), m) for p in texts(root) for m in pattern.findall(p.read_text())}


def missing(root: Path = ROOT) -> list[str]:
    """``FILE: PATH`` for every script, script module or report a text names that is not there."""
    out = [f"{w}: {p}" for w, p in mentions(SCRIPT_FILE, root) if not (root / p).is_file()]
    out += [
        f"{w}: {m}" for w, m in mentions(SCRIPT_MODULE, root) if not (root / (m.replace(".", "/") + ".py")).is_file()
    ]
    for where, path in mentions(REPORT, root):
        target = root / path
        if not (target.exists() or (target.parent.is_dir() and any(target.parent.glob(target.name + ".*")))):
            out.append(f"{where}: {path}")
    return sorted(out)


def test_every_script_and_report_the_texts_name_exists():
    assert len(mentions(SCRIPT_FILE)) > 20 and len(mentions(REPORT)) > 20 and mentions(SCRIPT_MODULE)  # not vacuous
    assert missing() == []


def test_a_stale_path_is_found(tmp_path):
    """The scan on a small made-up repository: one script, one report, and a README naming them and three that
    are not there (a moved script, a module, a report)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts" / "studies").mkdir(parents=True)
    (tmp_path / "reports" / "studies").mkdir(parents=True)
    (tmp_path / "scripts" / "studies" / "x.py").write_text("")
    (tmp_path / "reports" / "studies" / "x.md").write_text("")
    (tmp_path / "Makefile").write_text("demo:\n\tpython scripts/studies/x.py --out reports/studies/x\n")
    (tmp_path / "README.md").write_text(
        "`python scripts/x.py` writes reports/studies/x.md; `python -m scripts.studies.y`; see reports/y.json.\n"
    )
    assert missing(tmp_path) == [
        "README.md: reports/y.json",
        "README.md: scripts.studies.y",
        "README.md: scripts/x.py",
    ]


def test_no_script_edits_its_import_path():
    assert [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").rglob("*.py")) if "sys.path" in p.read_text()
    ] == []
