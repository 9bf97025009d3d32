"""JAX rank of a multi-worker job: started by dlbench, one process per rank (see runner.toml)."""

import sys
from pathlib import Path

# Started by path: Python put this folder first on sys.path, where the runner's own module names
# could shadow libraries; the folder that holds the `runners` package takes its place, and every
# module is imported by its package name (runners.common.harness, runners.<fw>....).
sys.path[0] = str(Path(__file__).resolve().parents[2])

from runners.common import distributed_harness  # noqa: E402
from runners.jax.distributed import JaxDistributedRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(distributed_harness.main(JaxDistributedRunner()))
