"""The set-up contract: CI runs the README's test command on every supported Python; executors import only
minijit.extend; `import minijit` leaves torch._dynamo unimported."""

import ast
import os
import pathlib
import re
import subprocess
import sys
import tomllib

from minijit.frontend.versions import VERSIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quick_start, flags=re.S)


def test_readme_quick_start_has_two_commands():
    commands = _readme_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert "examples/quickstart.py" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_on_every_supported_python():
    # .ci/run reads the command from the README; --print shows each lane's command without running it.
    lanes = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True, check=True)
    readme = _readme_commands()[1]
    assert "python3.11 -m venv .venv " in readme
    expected = [readme.replace("python3.11", f"python{v}").replace(".venv", f".venv-{v}") for v in VERSIONS]
    assert lanes.stdout.splitlines() == expected


def test_package_metadata_names_the_supported_pythons():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    last_minor = int(VERSIONS[-1].split(".")[1])
    assert project["requires-python"] == f">={VERSIONS[0]},<3.{last_minor + 1}"
    versions = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]]
    assert {v for v in versions if re.fullmatch(r"3\.\d+", v)} == set(VERSIONS)


def test_executors_import_only_the_plugin_api():
    for path in (ROOT / "executors").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minijit"):
                assert node.module == "minijit.extend", f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("minijit") or alias.name == "minijit.extend", path.name


def test_import_minijit_does_not_import_dynamo():
    """torch._dynamo costs about 0.9 s of a fresh process: minijit imports it only where it is used."""
    code = "import sys, minijit; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False", out.stderr


def test_dynamo_is_compiling_is_true_while_tracing_once_imported():
    import torch._dynamo

    import minijit

    def f(x):
        return x + 1 if torch._dynamo.is_compiling() else x - 1

    x = torch.zeros(2)
    torch.testing.assert_close(minijit.jit(f)(x), x + 1)


def _pins(python: str) -> dict[str, str]:
    """constraints.txt's pinned versions for one Python version (environment markers evaluated)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python}):
            assert req.name not in pins, f"two pins of {req.name} for Python {python}"
            (spec,) = req.specifier
            pins[req.name] = spec.version
    return pins


def test_declared_torch_is_the_tested_torch():
    # Each supported Python gets one pinned torch and Triton; the package declares the pinned torches and no others
    # (3.12 runs the GPU machines' torch, 2.11).
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch_req,) = [Requirement(d) for d in project["dependencies"] if d.startswith("torch")]
    (triton_req,) = [Requirement(d) for d in project["optional-dependencies"]["triton"]]
    pinned = {v: _pins(v) for v in VERSIONS}
    assert pinned["3.12"]["torch"] == "2.11.0"
    for v, pins in pinned.items():
        assert pins["torch"] in torch_req.specifier, f"Python {v}: torch {pins['torch']} is not declared"
        assert pins["triton"] in triton_req.specifier, f"Python {v}: triton {pins['triton']} is not declared"
    tested_minors = {p["torch"].rsplit(".", 1)[0] for p in pinned.values()}
    for minor in ("2.5", "2.10", "2.12", "2.14"):
        assert minor in tested_minors or f"{minor}.0" not in torch_req.specifier, f"torch {minor} is declared, not tested"
