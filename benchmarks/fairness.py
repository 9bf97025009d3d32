"""Is dlbench's runner as fast as the framework's own model? Runner throughput ÷ reference throughput.

For ResNet-50 and LSTM-32 training, each framework's dlbench runner (built from the suite's
framework-neutral description) is set against that framework's own reference model, written the way
the framework's model zoo or examples write it (benchmarks/references/<fw>_reference.py):

    torch       torchvision.models.resnet50 (a hand-written torchvision-style model where torchvision
                cannot be imported), torch.nn LSTM
    tensorflow  keras.applications.ResNet50, keras LSTM layers, GradientTape in a tf.function
    jax         flax linen ResNet-50 as in flax's ImageNet example, nn.RNN(OptimizedLSTMCell),
                TrainState, one jitted step with the state donated
    mxnet       gluon model_zoo resnet50_v1, gluon rnn.LSTM, hybridised with static allocation

Both sides run in the same framework environment (the venv dlbench builds), with the same batch,
threads and OpenMP variables, train on the same data (one canonical batch drawn here, given to
dlbench's worker as its `inputs` and to the reference as `--inputs`: the step time can depend on
the data; on MXNet ResNet-50 at batch 4 the reference trained on dlbench's draw of labels took
807-826 ms/step, on its own draw 554-565, in the same quiet minutes) and synchronise after every
step. Rounds alternate the two sides so
that this machine's drift hits both alike; the figure is the median of the paired ratios of mean
step times. Target: >= 0.97 for every framework.

    .venv/bin/python benchmarks/fairness.py [--framework all|torch,jax,...] [--network resnet50,lstm32]
                                            [--rounds 3] [--threads N] [--device cpu|cuda]

The references differ where the framework's own model differs from the suite (keras' ResNet50 has
conv biases; gluon's resnet50_v1 strides its first 1x1 convolution, so does a little less work); the
parameter count of each side is printed so that such differences stay visible.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.environments import EnvironmentBuildError
from dlbench.execution.equivalence import make_inputs
from dlbench.execution.orchestrator import Orchestrator, PlannedRun, RunOptions
from dlbench.execution.registry import RunnerRegistry
from dlbench.machine import available_cpus
from dlbench.store.store import Store

REFERENCES = Path(__file__).resolve().parent / "references"


def reference_frameworks() -> list[str]:
    """The runners (runners/*/runner.toml) that have a reference script, references/<fw>_reference.py."""
    scripts = {p.name.removesuffix("_reference.py") for p in REFERENCES.glob("*_reference.py")}
    return [name for name in RunnerRegistry(paths.runners_dir()).names() if name in scripts]


FRAMEWORKS = reference_frameworks()
NETWORKS = {"resnet50": "cnn", "lstm32": "rnn"}
TARGET = 0.97


def compare(framework: str, network: str, args, console: Console) -> dict:
    catalog = SuiteCatalog(paths.suites_dir())
    suite = catalog.load_suite(catalog.suite_path(NETWORKS[network]), "default", args.device, ("train",))
    bench = next(b for b in suite.benchmarks if b.network.name == network)
    batch = args.batch.get(network) or bench.batch_sizes[0]
    runner = RunnerRegistry(paths.runners_dir()).get(framework)
    measure = bench.policy.measure
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, **make_inputs(bench.network, batch))  # the canonical batch `dlbench check` uses
        options = RunOptions(device=args.device, env_backend="venv", threads=args.threads, repeats=1,
                             timeout_s=1800, cache=paths.cache_dir(), inputs=inputs)
        orch = Orchestrator(Store(Path(tmp)), options)
        env = orch.environment(runner)
        if isinstance(env, EnvironmentBuildError):
            raise SystemExit(f"{framework}: environment could not be built: {env}")
        command = [str(env.python), str(REFERENCES / f"{framework}_reference.py"), "--network", network,
                   "--batch", str(batch), "--threads", str(args.threads), "--device", args.device,
                   "--min-time", str(measure.min_time_s), "--min-iters", str(measure.min_iters),
                   "--learning-rate", str(bench.learning_rate), "--momentum", str(bench.momentum),
                   "--inputs", str(inputs)]
        # the variables dlbench gives its workers, so both sides get the same OpenMP pools
        ref_env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")},
                   "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        ratios, ours, theirs, reference = [], [], [], {}
        for i in range(args.rounds):
            record = orch.execute_one(PlannedRun(runner, bench, batch))
            if record.status != "ok":
                raise SystemExit(f"{framework} {network}: dlbench run {record.status}: {record.reason}\n"
                                 f"{record.output_tail}")
            out = subprocess.run(command, capture_output=True, text=True, env=ref_env, timeout=1800)
            if out.returncode != 0:
                raise SystemExit(f"{framework} {network}: reference failed:\n{out.stderr[-3000:]}")
            reference = json.loads(out.stdout.strip().splitlines()[-1])
            # the reference gives a mean step time: compare dlbench's mean with it, like for like
            ours.append(batch / record.summary.mean_s)
            theirs.append(reference["samples_per_s"])
            ratios.append(ours[-1] / theirs[-1])
            console.print(f"  {framework} {network} round {i + 1}: dlbench {ours[-1]:8.2f} samples/s, "
                          f"reference {theirs[-1]:8.2f}, ratio {ratios[-1]:.3f}", highlight=False)
    return {"framework": framework, "network": network, "batch": batch, "ratio": statistics.median(ratios),
            "low": min(ratios), "high": max(ratios), "ours": statistics.median(ours),
            "theirs": statistics.median(theirs), "params_ours": record.params,
            "params_theirs": reference["params"], "reference": reference["model"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", default="all", help="all, or a comma list of " + ", ".join(FRAMEWORKS))
    ap.add_argument("--network", default="resnet50,lstm32", help="comma list of " + ", ".join(NETWORKS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=available_cpus())
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", action="append", default=[], metavar="NETWORK=B",
                    help="batch size for a network (default: the default profile's for the device)")
    ap.add_argument("--json", type=Path, help="also write the table here as JSON")
    args = ap.parse_args()
    frameworks = tuple(FRAMEWORKS) if args.framework == "all" else tuple(args.framework.split(","))
    networks = tuple(args.network.split(","))
    for name in frameworks:
        if name not in FRAMEWORKS:
            ap.error(f"unknown framework {name!r}; the runners with a reference script: {', '.join(FRAMEWORKS)}")
    for name in networks:
        if name not in NETWORKS:
            ap.error(f"unknown network {name!r}")
    args.batch = {k: int(v) for k, v in (item.split("=", 1) for item in args.batch)}
    console = Console(stderr=True)
    rows = [compare(fw, net, args, console) for net in networks for fw in frameworks]

    table = Table(title=f"dlbench runner ÷ framework reference, training, {args.device}, {args.threads} threads, "
                        f"median of {args.rounds} paired rounds")
    for col in ("framework", "network", "batch", "dlbench samples/s", "reference samples/s", "ratio",
                "range", "params dlbench / reference", "reference model"):
        table.add_column(col)
    for r in rows:
        ok = r["ratio"] >= TARGET
        table.add_row(r["framework"], r["network"], str(r["batch"]), f"{r['ours']:.2f}", f"{r['theirs']:.2f}",
                      f"[{'green' if ok else 'red'}]{r['ratio']:.3f}[/]", f"{r['low']:.3f}-{r['high']:.3f}",
                      f"{r['params_ours']:,} / {r['params_theirs']:,}", r["reference"])
    Console(width=max(Console().width, 220)).print(table)
    missed = [f"{r['framework']} {r['network']}" for r in rows if r["ratio"] < TARGET]
    print(f"target >= {TARGET}: " + ("met by every runner" if not missed else "NOT met by " + ", ".join(missed)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
