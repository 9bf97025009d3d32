"""A TensorFlow rank that records its copy of the weights (for test_tensorflow_distributed.py):
after the strategy built the model, after the synchronised steps, and after the steps without the
exchange, as rank<R>-<when>.npz in $DLBENCH_TF_PROBE_OUT. Otherwise the shipped runner, unchanged."""

import os
import sys
from pathlib import Path

RUNNERS = Path(__file__).resolve().parents[2] / "runners"
sys.path.insert(0, str(RUNNERS.parent))  # the folder holding the runners package

from runners.common import distributed_harness  # noqa: E402
import numpy as np  # noqa: E402
from runners.tensorflow.distributed import TensorFlowDistributedRunner  # noqa: E402


class ProbingRunner(TensorFlowDistributedRunner):
    def prepare_data_parallel(self, request, cluster):
        dp = super().prepare_data_parallel(request, cluster)
        out = Path(os.environ["DLBENCH_TF_PROBE_OUT"])

        def save(when):
            np.savez(out / f"rank{cluster.rank}-{when}.npz", *dp.weights())

        save("initial")
        local = dp.step_without_sync
        first_local = []

        def step_without_sync():
            if not first_local:  # every synchronised step has run
                save("synced")
                first_local.append(True)
            local()

        dp.step_without_sync = step_without_sync
        self._save_final = lambda: save("local")
        return dp

    def leave(self):
        self._save_final()
        super().leave()


if __name__ == "__main__":
    sys.exit(distributed_harness.main(ProbingRunner()))
