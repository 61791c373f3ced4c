"""Executors are plugins: from minijit they import only `minijit.extend` (read with ast, not by running them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def minijit_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "minijit"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "minijit":
            found.add(node.module)
    return found


def test_executors_import_only_minijit_extend():
    files = sorted((ROOT / "executors").rglob("*.py"))
    assert len(files) >= 5
    offenders = {str(f.relative_to(ROOT)): sorted(m) for f in files if (m := minijit_imports(f) - {"minijit.extend"})}
    assert not offenders, f"executors must import only minijit.extend from minijit: {offenders}"


def test_example_plugin_imports_only_the_public_api():
    imports = minijit_imports(ROOT / "examples" / "custom_executor.py")
    assert imports <= {"minijit", "minijit.extend"}, imports
