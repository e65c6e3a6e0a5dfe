"""The README is a first page whose claims hold: at most 200 lines; every public name it imports (its Python
blocks' ``from hf_cocodr... import ...``), calls or names by its dotted path (here and in docs/reference.md) is
importable from where it says; every file it links or names exists; every ``make`` target it names is one; and
``make bench`` runs exactly the benchmarks it lists."""

from __future__ import annotations

import ast
import importlib
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _inline_code(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def _resolve(dotted: str):
    """The object ``a.b.C`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    assert not re.search(r"\b\d+ tests\b", README.read_text()), "no test count in the README"


def test_every_name_the_readme_imports_is_importable_from_where_it_says():
    imports = []
    for block in _python_blocks(README.read_text()):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hf_cocodr":
                imports += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imports += [(alias.name, None) for alias in node.names if alias.name.startswith("hf_cocodr")]
    assert imports, "the README's Python example imports from hf_cocodr"
    for module, name in imports:
        mod = importlib.import_module(module)
        if name is not None:
            assert hasattr(mod, name), f"from {module} import {name}"


@pytest.mark.parametrize("doc", [README, REFERENCE], ids=lambda p: p.name)
def test_every_dotted_hf_cocodr_name_resolves(doc):
    names = set()
    for code in _inline_code(doc.read_text()):
        names |= set(re.findall(r"\bhf_cocodr(?:\.[A-Za-z_]\w*)+", code.replace("/", " ")))
    assert names
    for dotted in sorted(names):
        _resolve(dotted)


def test_every_name_the_readme_calls_is_a_public_name_of_the_package():
    import hf_cocodr

    called = set()
    for code in _inline_code(README.read_text()):
        called |= set(re.findall(r"(?<![.\w])([A-Z]\w*)(?:\.[a-z_]\w*)?\(", code))
    called -= {"SentenceTransformer", "Trainer"}  # (sentence-transformers' and transformers' own)
    assert {"CocoPretrainer", "IDROTrainer", "RetrievalTrainingData"} <= called
    for name in sorted(called):
        assert name in hf_cocodr.__all__, f"from hf_cocodr import {name}"
        getattr(hf_cocodr, name)


def _expand(path: str) -> list[str]:
    """``a/{x,y}.py`` -> ``a/x.py``, ``a/y.py``."""
    parts = re.split(r"\{([^}]*)\}", path)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*options)]


@pytest.mark.parametrize("doc", [README, REFERENCE], ids=lambda p: p.name)
def test_every_file_it_links_or_names_exists(doc):
    text = doc.read_text()
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    named = []
    for code in _inline_code(text):
        for token in code.split():
            token = token.strip("(),;:")
            if re.match(r"(hf_cocodr|tests|scripts|docs|reports|examples)/", token) and "<" not in token:
                named += _expand(token)
    assert links or named
    for rel in [x for x in links if x] + named:
        assert (doc.parent / rel).exists() or (ROOT / rel).exists(), f"{doc.name} names {rel}"


def test_every_make_target_it_names_exists_and_bench_runs_what_it_lists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    text = README.read_text()
    for target in set(re.findall(r"\bmake ([a-z][\w-]*)", text)):
        assert target in targets, f"make {target}"
    listed = re.search(r"`make bench` runs (.*?)\. That", text, flags=re.S).group(1)
    listed = set(re.findall(r"`(bench_\w+)`", listed))
    benches = set(re.search(r"^BENCHES := (.*?)\n\n", makefile, flags=re.S | re.M).group(1).replace("\\", " ").split())
    modules = {"bench_scale", "bench_million"}  # (run as modules: python -m scripts.benchmarks.NAME)
    assert listed == benches | modules and all(f"scripts.benchmarks.{m}" in makefile for m in modules)
    every = {p.stem for p in (ROOT / "scripts" / "benchmarks").glob("bench_*.py")}
    left_out = every - listed
    assert left_out == {"bench_distill_side", "bench_encode_bf16"}
    assert all(f"`{name}`" in text for name in left_out), "the README says which benchmarks make bench leaves out"
