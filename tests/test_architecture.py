"""Dependencies point one way: no module imports a module of a higher layer, not even inside a function.

    cli  ->  drivers (recipe, training_api)  ->  trainers (pretraining, finetuning)
         ->  methods, losses, callbacks      ->  data, modeling, evaluation, hub, export, cards, records
         ->  errors, utils

A module may import its own layer and any lower one. The test reads every ``import`` statement of the package
(module level and inside functions) with ``ast``, so a cycle cannot hide behind a function-level import.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hf_cocodr"

# longest matching prefix wins; a smaller number is a higher layer
LAYERS = {
    "cli": 0, "cli_training": 0, "cli_hub": 0, "cli_mteb": 0, "__main__": 0,
    "recipe": 1, "training_api": 1,
    "pretraining": 2, "finetuning": 2, "trainer_common": 2,
    "methods": 3, "finetuning.losses": 3, "finetuning.callbacks": 3, "finetuning.training_args": 3,
    "finetuning.stage_info": 3, "pretraining.training_args": 3, "pretraining.collator": 3,
    "data": 4, "modeling": 4, "evaluation": 4, "metrics": 4, "index": 4, "hub": 4, "export": 4, "model_card": 4,
    "provenance": 4, "run_record": 4, "checkpoints": 4, "state": 4, "distributed": 4,
    "errors": 5, "utils": 5,
}


def layer(module: str) -> int | None:
    """The layer of ``hf_cocodr.a.b`` (None for the package root, which only re-exports)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    return None


def imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    rel = path.relative_to(root.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "hf_cocodr" or target.startswith("hf_cocodr."):
                names = [f"{target}.{a.name}" for a in node.names] if layer(target) is None or not node.module \
                    else [target]
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
