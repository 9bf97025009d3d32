"""How much does dlbench cost? Throughput through dlbench / throughput of a minimal hand-written loop.

Both sides run the same network in the same torch environment (the venv dlbench builds), with the
same threads, alternating round by round so that drifts of this machine hit both alike. The minimal
loop is what a careful person would write by hand: the network typed out in torch.nn, SGD with
momentum, synthetic data, a warm-up, then one timer around a plain loop. Target: ratio >= 0.98.

    .venv/bin/python benchmarks/overhead.py [--rounds 9] [--threads N] [--network all|fcn5|alexnet_r] [--batch 64]

Each round pairs one dlbench run (one repeat) with one minimal-loop run; the figure is the median
of the paired ratios, with their range, since this kind of machine drifts by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.orchestrator import Orchestrator, PlannedRun, RunOptions
from dlbench.execution.registry import RunnerRegistry
from dlbench.machine import available_cpus
from dlbench.store.store import Store

# The hand-written side. It shares nothing with dlbench's runner code.
MINIMAL_LOOP = r'''
import json, sys, time
import torch
from torch import nn
network, batch, threads, min_time = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
if network == "fcn5":
    model = nn.Sequential(nn.Linear(784, 2048), nn.Sigmoid(), nn.Linear(2048, 4096), nn.Sigmoid(),
                          nn.Linear(4096, 1024), nn.Sigmoid(), nn.Linear(1024, 10))
    x = torch.randn(batch, 784)
elif network == "alexnet_r":
    model = nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2), nn.ReLU(),
                          nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                          nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2),
                          nn.Flatten(), nn.Linear(576, 10))
    x = torch.randn(batch, 3, 32, 32)
else:
    raise SystemExit(f"no hand-written version of {network}")
y = torch.randint(0, 10, (batch,))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(20):
    step()
n, t0 = 0, time.perf_counter()
while True:
    step()
    n += 1
    elapsed = time.perf_counter() - t0
    if n >= 5 and elapsed >= min_time:
        break
print(json.dumps({"samples_per_s": n * batch / elapsed, "iterations": n}))
'''


def compare(network: str, batch: int, rounds: int, threads: int) -> float:
    suite_file = {"fcn5": "fcn.yaml", "alexnet_r": "cnn.yaml"}[network]
    suite = SuiteCatalog(paths.suites_dir()).load_suite(paths.suites_dir() / suite_file, "default", "cpu")
    bench = next(b for b in suite.benchmarks if b.name == f"{network}-train")
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    min_time = bench.policy.measure.min_time_s
    # The same OpenMP variables dlbench gives its workers, so both sides run the same thread pool.
    loop_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}

    with tempfile.TemporaryDirectory() as tmp:
        options = RunOptions(device="cpu", env_backend="venv", threads=threads, repeats=1,
                             timeout_s=600, cache=paths.cache_dir())
        orch = Orchestrator(Store(Path(tmp)), options)
        env = orch.environment(runner)
        ratios = []
        for i in range(rounds):
            record = orch.execute_one(PlannedRun(runner, bench, batch))
            if record.status != "ok":
                raise SystemExit(f"dlbench run failed: {record.reason}\n{record.output_tail}")
            # The minimal loop can only give a mean: compare dlbench's mean with it, like for like.
            via_dlbench = batch / record.summary.mean_s
            out = subprocess.run([str(env.python), "-c", MINIMAL_LOOP, network, str(batch), str(threads),
                                  str(min_time)], capture_output=True, text=True, check=True, env=loop_env)
            minimal = json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]
            ratios.append(via_dlbench / minimal)
            print(f"  round {i + 1}: dlbench {via_dlbench:8.1f} samples/s (reported, from the median: "
                  f"{record.summary.samples_per_s:8.1f})   minimal loop {minimal:8.1f}   ratio {ratios[-1]:.3f}")
    ratio = statistics.median(ratios)
    print(f"{network} train, batch {batch}, {threads} threads: median of {rounds} paired ratios {ratio:.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})\n")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--network", default="all", choices=["all", "fcn5", "alexnet_r"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=available_cpus())
    args = ap.parse_args()
    networks = ["fcn5", "alexnet_r"] if args.network == "all" else [args.network]
    results = {n: compare(n, args.batch, args.rounds, args.threads) for n in networks}
    for n, ratio in results.items():
        print(f"overhead ratio {n}: {ratio:.3f}   target >= 0.98: {'met' if ratio >= 0.98 else 'NOT met'}")


if __name__ == "__main__":
    main()
