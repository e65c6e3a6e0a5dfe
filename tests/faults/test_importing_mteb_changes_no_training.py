"""Importing mteb seeds Python's, NumPy's and torch's global generators (its task objects call ``random.seed``,
``np.random.seed`` and ``torch.manual_seed`` at import time). hf_cocodr imported it lazily from a checkpoint's card
(the registry lookup of a titled card), so the steps after a process's first checkpoint drew other dropout masks:
a second run in the same process, or a run resumed in another process, trained other weights (issue 66, item 9:
resume bit for bit). Every mteb import of the package goes through ``import_mteb``, which keeps the states."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import numpy as np
import torch

PACKAGE = Path(__file__).resolve().parents[2] / "hf_cocodr"


def test_import_mteb_keeps_every_random_state(tmp_path, monkeypatch):
    from hf_cocodr.utils import import_mteb

    fake = tmp_path / "mteb"  # a stand-in that seeds like the real one, so the test imports in milliseconds
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import random, numpy, torch\nrandom.seed(42)\nnumpy.random.seed(42)\ntorch.manual_seed(42)\nSTANDIN = 1\n"
    )
    for name in [n for n in sys.modules if n == "mteb" or n.startswith("mteb.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    assert import_mteb().STANDIN == 1
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])
    # the stand-in goes for good (monkeypatch.delitem would put it back at teardown, where mteb was not imported
    # before this test); the real mteb's entries, if it was imported before, come back at teardown
    sys.modules.pop("mteb")


def test_every_mteb_import_of_the_package_goes_through_import_mteb():
    unguarded = []
    for path in sorted(PACKAGE.rglob("*.py")):  # (utils.py holds import_mteb itself)
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if path.name != "utils.py" and re.match(r"^\s*(import mteb\b|from mteb[.\w]* import )", line):
                before = lines[i - 1].strip() if i else ""
                if not before.startswith(("import_mteb()", "mteb = import_mteb()")):
                    unguarded.append(f"{path.relative_to(PACKAGE.parent)}:{i + 1}: {line.strip()}")
    assert not unguarded, unguarded
