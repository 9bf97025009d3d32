"""PyTorch worker: started by path by the dlbench controller with the torch environment's python."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))

import harness  # noqa: E402
from torch_runner import TorchRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(TorchRunner()))
