"""The TensorFlow runner's GradientExchange against the strategy's dense all-reduce, on 2 workers
of a MultiWorkerMirroredStrategy on this machine (two processes on loopback ports; run in the
tensorflow environment, no dlbench controller needed):
    ~/.cache/dlbench/envs/tensorflow-cpu-*/bin/python benchmarks/compression_arithmetic_tensorflow.py
Rank 0 prints, per method, the largest relative difference from dense's summed gradients and
whether both workers got the same; then, with constant gradients, how far the cumulative update of
the methods with error feedback is from dense's after 1, 10 and 60 steps (it must shrink).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

WORKERS = 2
METHODS = ["fp16", "bf16", "powersgd:2", "topk:1", "topk:0.1"]
FEEDBACK = ["powersgd:2", "topk:0.1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, addresses: list[str]) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the `runners` package
    import numpy as np
    import tensorflow as tf

    from runners.common.contract import Compression
    from runners.tensorflow.distributed import GradientExchange

    ring = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring))
    (device,) = strategy.extended.worker_devices
    runner = SimpleNamespace(device=device, cluster=SimpleNamespace(world_size=WORKERS, rank=rank), implementation=ring)
    shapes = [(20, 30), (30,), (30, 5)]
    trainable = [SimpleNamespace(shape=s) for s in shapes]
    rng = np.random.default_rng(rank)
    with tf.device(device):
        grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]

    def exchanged(fn):
        return [t.numpy() for t in tf.function(lambda: strategy.run(fn))()]

    ctx = tf.distribute.get_replica_context
    dense = exchanged(lambda: ctx().all_reduce(tf.distribute.ReduceOp.SUM, grads))
    report = {}
    for method in METHODS:
        ex = GradientExchange(Compression.parse(method, who="x"), runner, trainable, seed=1)
        out = exchanged(lambda: ex.exchange(grads))
        error = max(float(np.abs(o - d).max() / np.abs(d).max()) for o, d in zip(out, dense))
        report[method] = {"max_relative_error": error, "sum": float(sum(o.sum() for o in out))}
    for method in FEEDBACK:
        ex = GradientExchange(Compression.parse(method, who="x"), runner, trainable, seed=1)
        step = tf.function(lambda: strategy.run(lambda: ex.exchange(grads)))
        total = [np.zeros(s, np.float32) for s in shapes]
        gaps = {}
        for i in range(1, 61):
            total = [t + o.numpy() for t, o in zip(total, step())]
            if i in (1, 10, 60):
                gaps[i] = float(sum(np.abs(t - i * d).sum() for t, d in zip(total, dense))
                                / sum(np.abs(i * d).sum() for d in dense))
        report[method + " feedback"] = gaps
    print(json.dumps({"rank": rank, "report": report}), flush=True)


def main() -> None:
    if len(sys.argv) == 3:
        worker(int(sys.argv[1]), sys.argv[2].split(","))
        return
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(WORKERS)]
    procs = [subprocess.Popen([sys.executable, __file__, str(r), ",".join(addresses)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(WORKERS)]
    reports = [json.loads(p.communicate(timeout=900)[0].strip().splitlines()[-1])["report"] for p in procs]
    for method in METHODS:
        same = reports[0][method]["sum"] == reports[1][method]["sum"]
        print(f"{method:12s} max relative error vs dense {reports[0][method]['max_relative_error']:.2e}  "
              f"both workers the same: {same}")
    for method in FEEDBACK:
        gaps = reports[0][method + " feedback"]
        print(f"{method:12s} cumulative update's distance from dense's after 1, 10, 60 steps: "
              + ", ".join(f"{gaps[k]:.0%}" for k in ("1", "10", "60")))


if __name__ == "__main__":
    main()
