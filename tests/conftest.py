"""Shared by every test: runners/common on the import path, after everything else.

A runner's modules import the contract and the protocol (runners/common/contract.py, protocol.py)
as top-level modules, which their worker.py puts on sys.path; a test that imports a runner's module
(runners/<fw>/ on sys.path, e.g. tests/unit/test_jax_distributed_placement.py) gets them here.
Appended, so that nothing of the controller's or a test's own can be shadowed by them.
"""

import sys
from pathlib import Path

COMMON = str(Path(__file__).resolve().parents[1] / "runners" / "common")
if COMMON not in sys.path:
    sys.path.append(COMMON)
