"""Layers point one way (docs/design.md, Layers), read from the source with ast, not by running it.

    errors  <-  ir, environment  <-  ops  <-  frontend, transforms  <-  extend  <-  runtime  <-  minijit/__init__.py
                                                              ^
                                                          executors/*

A module imports only from its own layer or the layers to its left; `frontend` and
`transforms` are one layer of two packages that do not import each other (capture
records, passes rewrite). `errors` (the exception classes) sits under everything, and `environment` (minijit's environment
variables, checked) just above it;
`extend` (the plugin API) hands executors the symbols, traces and `Region` of the
layers under it, and `runtime` asks it for executors by name. Every import counts:
module level, inside functions, under `TYPE_CHECKING`, and `importlib.import_module`
with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Package (or module) -> layer; a module belongs to the longest package naming it.
LAYERS = {
    "minijit.errors": 0,
    "minijit.environment": 1,
    "minijit.ir": 1,
    "minijit.ops": 2,
    "minijit.frontend": 3,
    "minijit.transforms": 3,
    "minijit.extend": 4,
    "minijit.runtime": 5,
    "minijit": 6,
}

# (importing module, imported module) -> why the import is allowed although it goes against the order.
EXCEPTIONS = {
    ("minijit.frontend.autograd_function", "minijit.transforms.functionalize"): (
        "a custom autograd.Function is a function inside the function: its forward's sub-trace becomes the "
        "decomposition of one bound symbol of the caller's trace, and its backward's sub-trace that symbol's VJP "
        "rule, so both must be functional when capture records the symbol; and eager's errors (forward modifies "
        "an input, backward reads a tensor the forward modified after saving it) are raised there, at the user's line"
    ),
    ("minijit.frontend.autograd_function", "minijit.transforms.vjp"): (
        "the symbol of a traced custom Function is made for that one call, so capture gives it its VJP rule "
        "(in VJP_RULES) at once, built from the backward sub-trace"
    ),
    ("minijit.frontend.func_transforms", "minijit.transforms.functionalize"): (
        "vmap batches the ops of the function traced once on a sample (frontend/batching.py), which must be "
        "functional first: an in-place op on a sample's intermediate becomes the functional op it stands for"
    ),
    ("minijit.frontend.func_transforms", "minijit.transforms.inline_grad"): (
        "vmap of a function taking gradients (per-sample gradients, `vmap(grad(f))`) batches the backward's ops, "
        "so the sample's `grad_of` is expanded into them before its ops are batched"
    ),
    ("minijit.frontend.module_hooks", "minijit.transforms.vjp"): (
        "the identity op at a hooked module's boundary is made per number of tensors when capture first meets "
        "one, so capture gives it its VJP rule at once: the call of the module's backward hooks"
    ),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    """`minijit/ops/prims.py` -> `minijit.ops.prims`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, absolute name) of every minijit module `path` imports, wherever the import stands."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            # `from minijit.ops import prims` imports the module minijit.ops.prims, where there is one.
            targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}", root) else base for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        else:
            continue
        for target in targets:
            if target == "minijit" or target.startswith("minijit."):
                yield node.lineno, target


def _is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def layer_of(module: str) -> tuple[str, int]:
    """The package of `module` that has a layer, and that layer."""
    package = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return package, LAYERS[package]


def _excepted(importer: str, target: str) -> bool:
    return any(importer == a and (target == b or target.startswith(b + ".")) for a, b in EXCEPTIONS)


def offending_imports(root: Path = ROOT) -> list[str]:
    """Every import of a minijit module that goes against the layer order, as `file:line: what`."""
    found = []
    for path in sorted((root / "minijit").rglob("*.py")):
        importer = module_name(path, root)
        package, layer = layer_of(importer)
        for line, target in imports(path, root):
            target_package, target_layer = layer_of(target)
            if target_package == package or target_layer < layer or _excepted(importer, target):
                continue
            found.append(f"{path.relative_to(root)}:{line}: {importer} (layer {package}) imports {target} "
                         f"(layer {target_package})")
    return found


def test_minijit_modules_import_only_their_layer_and_below():
    assert len(list((ROOT / "minijit").rglob("*.py"))) > 50
    offenders = offending_imports()
    assert not offenders, "imports against the layer order (docs/design.md, Layers):\n" + "\n".join(offenders)


def test_each_exception_is_still_needed():
    used = {(module_name(p), t) for p in (ROOT / "minijit").rglob("*.py") for _, t in imports(p)}
    stale = [pair for pair in EXCEPTIONS if not any(_excepted(a, t) and a == pair[0] for a, t in used)]
    assert not stale, f"exceptions no import needs any more (remove them): {stale}"


def test_the_scan_finds_imports_against_the_order(tmp_path):
    # A tree with the wrong imports in every form the scan reads, and one right one.
    files = {
        "minijit/__init__.py": "",
        "minijit/errors.py": "",
        "minijit/ir/__init__.py": "from minijit.errors import X\n",
        "minijit/ir/trace.py": "def f():\n    from ..runtime import jit\n",
        "minijit/ops/__init__.py": "import importlib\nimportlib.import_module('minijit.transforms.dce')\n",
        "minijit/frontend/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import minijit.transforms\n",
        "minijit/transforms/__init__.py": "from minijit import frontend\n",
        "minijit/transforms/dce.py": "",
        "minijit/runtime/__init__.py": "from minijit import jit\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert offending_imports(tmp_path) == [
        "minijit/frontend/__init__.py:3: minijit.frontend (layer minijit.frontend) imports minijit.transforms "
        "(layer minijit.transforms)",
        "minijit/ir/trace.py:2: minijit.ir.trace (layer minijit.ir) imports minijit.runtime (layer minijit.runtime)",
        "minijit/ops/__init__.py:2: minijit.ops (layer minijit.ops) imports minijit.transforms.dce "
        "(layer minijit.transforms)",
        "minijit/runtime/__init__.py:1: minijit.runtime (layer minijit.runtime) imports minijit (layer minijit)",
        "minijit/transforms/__init__.py:1: minijit.transforms (layer minijit.transforms) imports minijit.frontend "
        "(layer minijit.frontend)",
    ]


def op_declarations_outside_ops(root: Path = ROOT) -> list[str]:
    """`file:line` of each use of `ltorch_op` (declaring an op) in a module outside minijit/ops."""
    found = []
    for path in sorted((root / "minijit").rglob("*.py")):
        if path.is_relative_to(root / "minijit" / "ops"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if "ltorch_op" in names or (isinstance(node, ast.Name | ast.Attribute)
                                        and getattr(node, "id", getattr(node, "attr", None)) == "ltorch_op"):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_ops_are_declared_in_ops_only(tmp_path):
    # Each fact about an op is declared once, in minijit/ops (the backward ops that VJP rules call too).
    assert not op_declarations_outside_ops(), op_declarations_outside_ops()
    rule = tmp_path / "minijit" / "transforms" / "rule.py"
    rule.parent.mkdir(parents=True)
    rule.write_text("from minijit.ops.registry import ltorch_op\n\n@ltorch_op('x_backward')\ndef f(): ...\n")
    assert op_declarations_outside_ops(tmp_path) == ["minijit/transforms/rule.py:1", "minijit/transforms/rule.py:3"]


def test_executors_import_only_minijit_extend():
    files = sorted((ROOT / "executors").rglob("*.py"))
    assert len(files) >= 5
    offenders = {str(f.relative_to(ROOT)): sorted(m) for f in files
                 if (m := {t for _, t in imports(f)} - {"minijit.extend"})}
    assert not offenders, f"executors must import only minijit.extend from minijit: {offenders}"


def test_example_plugin_imports_only_the_public_api():
    found = {t for _, t in imports(ROOT / "examples" / "custom_executor.py")}
    assert found <= {"minijit", "minijit.extend"}, found
