"""Run inside a framework's environment by tests/integration/test_convergence.py: one runner's
convergence Trainer over a dataset folder, its pipelines read back as numpy (the first epoch's
training batches and every evaluation batch), saved to an .npz.

usage: python convergence_pipeline_probe.py RUNNER_DIR REQUEST.json OUT.npz"""

import importlib
import json
import sys
from pathlib import Path

runner_dir = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(runner_dir.parents[1])]  # the folder holding the runners package

import numpy as np  # noqa: E402

from runners.common.datasets import read_split  # noqa: E402


def host(value):
    for name in ("numpy", "asnumpy"):
        if hasattr(value, name):
            return np.asarray(getattr(value, name)())
    return np.asarray(value)


request = json.loads(Path(sys.argv[2]).read_text())
module = importlib.import_module(f"runners.{runner_dir.name}.runner")
runner = next(v() for k, v in vars(module).items() if k.endswith("Runner") and isinstance(v, type)
              and hasattr(v, "prepare_convergence"))
runner.configure_threads(1)
runner.framework_info("cpu")
trainer = runner.prepare_convergence(request)
train = read_split(request["dataset"], request["data_dir"], "train")
evaluation = read_split(request["dataset"], request["data_dir"], "eval")
trainer.attach(train, evaluation, request["seed"])
out = {}
for i, b in enumerate(trainer.train_batches(1)):
    out[f"train_x{i}"], out[f"train_y{i}"] = host(b[0]), host(b[1])
    trainer.train_step(b, 0.01)
trainer.synchronize()
correct = count = 0
for i, b in enumerate(trainer.eval_batches()):
    out[f"eval_x{i}"], out[f"eval_y{i}"] = host(b[0]), host(b[1])
    if len(b) == 4:  # JAX's padded batch: (x, y, mask, count)
        out[f"eval_n{i}"] = np.asarray(b[3])
    c, n = trainer.eval_step(b)
    correct, count = correct + c, count + n
out["eval_count"] = np.asarray(count)
trainer.close()
np.savez(sys.argv[3], **out)
