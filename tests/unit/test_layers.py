"""The controller's layers and the runners' boundaries, as pyproject.toml's import-linter contracts
say them: each package imports only the layers below it (not even inside a function), no package's
modules import each other in a circle, the controller reads nothing of the runners but their
contract, runners.common knows no framework's runner, and the frameworks' runners do not import
each other. Checked on the tree as it is, and shown to fail on a copy of it that breaks each rule once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(src: Path, config: Path) -> subprocess.CompletedProcess:
    """lint-imports over the packages under `src` (dlbench) and beside it (runners)."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: import-linter is in the test extra (pyproject.toml)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(src.parent)])}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=config.parent,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree_copy(tmp_path):
    """A copy of src/dlbench, runners/ and pyproject.toml to break."""
    shutil.copytree(ROOT / "src" / "dlbench", tmp_path / "src" / "dlbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "runners", tmp_path / "runners", ignore=shutil.ignore_patterns("__pycache__", "*.txt"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


CONTRACTS = ("dlbench imports only downward", "no import cycles between the modules of a package",
             "the controller imports nothing of the runners but the contract",
             "runners.common imports no framework's runner", "the frameworks' runners do not import each other",
             "a runner's modules import only downward")


def test_the_tree_keeps_every_contract():
    result = lint(ROOT / "src", ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in CONTRACTS:
        assert f"{name} KEPT" in result.stdout


def test_the_controller_importing_a_runners_code_breaks_it(tree_copy):
    _append(tree_copy / "src" / "dlbench" / "execution" / "registry.py",
            "def _reach_in():\n    from runners.common import harness\n\n    return harness\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "the controller imports nothing of the runners but the contract BROKEN" in result.stdout
    assert "dlbench.execution.registry -> runners.common.harness" in result.stdout


def test_one_frameworks_runner_importing_another_breaks_it(tree_copy):
    _append(tree_copy / "runners" / "jax" / "__init__.py", "def _borrow():\n    import runners.torch\n\n    return runners.torch\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "the frameworks' runners do not import each other BROKEN" in result.stdout
    assert "runners.common imports no framework's runner KEPT" in result.stdout


def test_runners_common_importing_a_framework_runner_breaks_it(tree_copy):
    _append(tree_copy / "runners" / "common" / "protocol.py",
            "def _know():\n    from runners.torch import __doc__ as doc\n\n    return doc\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "runners.common imports no framework's runner BROKEN" in result.stdout


def test_a_lower_layer_importing_a_higher_one_inside_a_function_breaks_it(tree_copy):
    _append(tree_copy / "src" / "dlbench" / "store" / "store.py",
            "def _reach_up():\n    from ..cli import app\n\n    return app\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "dlbench imports only downward BROKEN" in result.stdout
    assert "dlbench.store.store -> dlbench.cli" in result.stdout


def test_siblings_of_one_layer_may_not_import_each_other(tree_copy):
    _append(tree_copy / "src" / "dlbench" / "analysis" / "history.py",
            "def _sideways():\n    from ..performance import model\n\n    return model\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "dlbench.analysis.history -> dlbench.performance.model" in result.stdout


def test_a_cycle_inside_a_package_breaks_the_other_contract(tree_copy):
    # suite.py imports schema.py; schema importing suite back closes a circle inside definitions
    _append(tree_copy / "src" / "dlbench" / "definitions" / "schema.py",
            "def _circle():\n    from . import suite\n\n    return suite\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "dlbench imports only downward KEPT" in result.stdout
    assert "no import cycles between the modules of a package BROKEN" in result.stdout
    assert "No cycles are allowed in dlbench.definitions" in result.stdout


def test_a_runners_low_module_importing_a_higher_one_breaks_it(tree_copy):
    # precision.py sits below step.py in every runner (docs/extending.md): reaching up, even lazily, is refused
    _append(tree_copy / "runners" / "mxnet" / "precision.py",
            "def _reach_up():\n    from runners.mxnet import step\n\n    return step\n")
    result = lint(tree_copy / "src", tree_copy / "pyproject.toml")
    assert result.returncode != 0
    assert "a runner's modules import only downward BROKEN" in result.stdout
    assert "runners.mxnet.precision -> runners.mxnet.step" in result.stdout
