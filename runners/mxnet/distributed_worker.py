"""Apache MXNet process of a multi-worker job (launch style "ps-lite", see runner.toml): a worker
(one rank), or, by DMLC_ROLE, the job's ps-lite scheduler or one of its servers."""

import os
import sys
import warnings
from pathlib import Path

# mxnet 1.9.1 imports with DeprecationWarnings (numpy aliases, distutils, ...): see worker.py
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module=r"mxnet(\.|$)")

# Started by path: Python put this folder first on sys.path, where the runner's own module names
# could shadow libraries; the folder that holds the `runners` package takes its place, and every
# module is imported by its package name (runners.common.harness, runners.<fw>....).
sys.path[0] = str(Path(__file__).resolve().parents[2])


def serve(role: str) -> int:
    """Scheduler or server: `import mxnet` runs the role's loop (mxnet.kvstore.kvstore_server) until
    the workers leave the job, then exits the process. The engine's threads: one CPU worker (the
    servers' sums), OpenMP as the launcher set it (the ranks' threads)."""
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    print(f"kvstore {role}: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
          f"MXNET_CPU_WORKER_NTHREADS={os.environ['MXNET_CPU_WORKER_NTHREADS']}", flush=True)
    import mxnet  # noqa: F401  - does not return for these roles

    print(f"kvstore {role}: import mxnet returned; was this process started as a ps-lite node?", file=sys.stderr)
    return 1


if __name__ == "__main__":
    role = os.environ.get("DMLC_ROLE")
    if role in ("scheduler", "server"):
        sys.exit(serve(role))

    from runners.common import distributed_harness  # noqa: E402
    from runners.mxnet.distributed import MXNetDistributedRunner  # noqa: E402

    sys.exit(distributed_harness.main(MXNetDistributedRunner()))
