"""The controller never imports a deep-learning framework, and both sides speak one protocol."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from dlbench.execution.registry import RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dlbench"
RUNNERS = RunnerRegistry(ROOT / "runners")
# every runner's framework (its runner.toml import_name), and the libraries that come with some of them
FRAMEWORKS = {RUNNERS.get(name).import_name for name in RUNNERS.names()} | {"jaxlib", "flax", "keras"}


def framework_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):  # every level: module, function bodies, try/except, if TYPE_CHECKING
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in FRAMEWORKS]
    return found


def test_importing_the_controller_loads_no_framework():
    code = ("import dlbench.cli, dlbench.execution.orchestrator, dlbench.reporting.site, sys; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FRAMEWORKS)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_subprocess_check_can_see_an_import():
    out = subprocess.run([sys.executable, "-c", "import sys, json; print(sorted(m for m in sys.modules if m == 'json'))"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['json']"


def test_no_source_file_imports_a_framework():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) >= 10
    offenders = []
    for path in files:
        for line, name in framework_imports(ast.parse(path.read_text(), filename=str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert offenders == []


@pytest.mark.parametrize("source", [
    "import torch",
    "import numpy, torch.nn as nn",
    "from tensorflow import keras",
    "from jax.numpy import ones",
    "def f():\n    import jaxlib\n",
    "try:\n    import mxnet\nexcept ImportError:\n    pass\n",
    "class C:\n    def m(self):\n        from flax import linen\n",
    "import importlib\nimportlib.import_module('keras')\n",
])
def test_the_scan_finds_every_form(source):
    assert framework_imports(ast.parse(source))


@pytest.mark.parametrize("source", ["import torchvision_like_name_not", "from .torch import x", "import numpy"])
def test_the_scan_ignores_lookalikes(source):
    assert framework_imports(ast.parse(source)) == []


def _protocol(path: Path) -> int:
    values = [node.value.value for node in ast.parse(path.read_text()).body
              if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROTOCOL_VERSION" for t in node.targets)
              and isinstance(node.value, ast.Constant)]
    assert len(values) == 1, f"{path}: expected one PROTOCOL_VERSION assignment"
    return values[0]


def test_protocol_versions_match():
    controller = _protocol(SRC / "execution" / "worker_result.py")
    worker = _protocol(ROOT / "runners" / "common" / "harness.py")
    assert isinstance(controller, int) and controller == worker

    from dlbench.execution import launcher, orchestrator
    assert launcher.PROTOCOL_VERSION == orchestrator.PROTOCOL_VERSION == controller
