"""TensorFlow rank of a multi-worker job: started by dlbench, one process per rank (see runner.toml)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))

import distributed_harness  # noqa: E402
from tensorflow_distributed import TensorFlowDistributedRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(distributed_harness.main(TensorFlowDistributedRunner()))
