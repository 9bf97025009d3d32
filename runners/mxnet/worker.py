"""Apache MXNet worker: started by path by the dlbench controller with the mxnet environment's python."""

import sys
import warnings
from pathlib import Path

# mxnet 1.9.1 imports with DeprecationWarnings (numpy aliases, distutils, ...) that would only
# pollute the worker's output; silence them before anything imports mxnet.
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module=r"mxnet(\.|$)")

# Started by path: Python put this folder first on sys.path, where the runner's own module names
# could shadow libraries; the folder that holds the `runners` package takes its place, and every
# module is imported by its package name (runners.common.harness, runners.<fw>....).
sys.path[0] = str(Path(__file__).resolve().parents[2])

from runners.common import harness  # noqa: E402
from runners.mxnet.runner import MXNetRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(MXNetRunner()))
