"""JAX worker: started by path by the dlbench controller with the jax environment's python."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))

import harness  # noqa: E402
from jax_runner import JaxRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(JaxRunner()))
