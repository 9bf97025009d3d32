"""The controller's layers, as pyproject.toml's import-linter contracts say them: each package
imports only the layers below it (not even inside a function), and no package's modules import
each other in a circle. Checked on the tree as it is, and shown to fail on a copy of it that breaks
each rule once."""

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
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: import-linter is in the test extra (pyproject.toml)")
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=config.parent,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree_copy(tmp_path):
    """A copy of src/dlbench and pyproject.toml to break."""
    shutil.copytree(ROOT / "src" / "dlbench", tmp_path / "src" / "dlbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


def test_the_tree_keeps_both_contracts():
    result = lint(ROOT / "src", ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dlbench imports only downward KEPT" in result.stdout
    assert "no import cycles between the modules of a package KEPT" in result.stdout


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
