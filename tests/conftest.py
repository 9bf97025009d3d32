"""Shared by every test: the repository root on the import path, after everything else.

Tests import runner code by its package name (runners.common.harness, runners.jax.distributed);
the controller's editable install already puts the repository root on the path, this keeps it so
for an interpreter that has dlbench installed otherwise. Appended, so that nothing of the
controller's or a test's own can be shadowed by it.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)
