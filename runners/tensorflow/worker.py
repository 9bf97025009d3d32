"""TensorFlow worker: started by path by the dlbench controller with the tensorflow environment's python."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))

import harness  # noqa: E402
from tensorflow_runner import TensorFlowRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(TensorFlowRunner()))
