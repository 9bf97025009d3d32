"""amp_bf16 over fp32 and compiled over eager, per framework and network, measured side by side.

Runs (unless --no-run) one `dlbench run` of the networks' training benchmarks under
`--precision fp32,amp_bf16 --compile eager,compiled` into a fresh store, so that every pair being
divided was measured in one invocation on one machine state (the plan puts the compile modes of a
benchmark next to each other). Then prints, from the store's records, for each framework and
network at each batch size:
  - bf16/fp32: samples/s of amp_bf16 over fp32, both in the framework's default compile mode;
  - compiled/eager: samples/s of compiled over eager, both fp32;
with each side's status where a run did not complete (a skip says why: tf32 on a CPU, jax eager).
Ratios of medians; the runs' 95% intervals are in `dlbench results --store STORE`.

Usage: .venv/bin/python benchmarks/precision_compile.py [--profile default] [--framework all]
           [--networks alexnet,resnet50,fcn5,lstm32] [--store DIR] [--no-run] [--repeats N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from dlbench.store.store import Store


def measure(store: Path, profile: str, frameworks: str, networks: list[str], repeats: int | None) -> int:
    cmd = [sys.executable, "-m", "dlbench.cli", "run", "--suite", "all", "--framework", frameworks,
           "--profile", profile, "--mode", "train", "--precision", "fp32,amp_bf16", "--compile", "eager,compiled",
           "--store", str(store), *[a for n in networks for a in ("--benchmark", f"{n}-train")]]
    if repeats:
        cmd += ["--repeats", str(repeats)]
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def table(store: Path, networks: list[str]) -> list[tuple]:
    runs: dict[tuple, object] = {}
    for r in Store(store).records():
        if r.network.name in networks and r.workload.mode == "train":
            key = (r.framework.get("name"), r.network.name, r.workload.batch_size, r.workload.precision,
                   r.workload.compile)
            if key not in runs or r.started_at > runs[key].started_at:
                runs[key] = r
    rows = []
    for fw, net, batch in sorted({k[:3] for k in runs}):
        def cell(precision, compile_mode):
            return runs.get((fw, net, batch, precision, compile_mode))

        def ratio(top, bottom) -> str:
            for side in (top, bottom):
                if side is None:
                    return "not run"
                if side.status != "ok":
                    # the whole reason is in `dlbench results`; its start says which kind
                    return f"{side.workload.precision}/{side.workload.compile} {side.status} ({(side.reason or '')[:32]}...)"
            return f"{top.summary.samples_per_s / bottom.summary.samples_per_s:.2f}"

        # the framework's default compile mode: the one its fp32 run without a counterpart would use;
        # both exist here, so the bf16 ratio is given in each compile mode that ran
        bf16 = "; ".join(f"{c}: {ratio(cell('amp_bf16', c), cell('fp32', c))}" for c in ("eager", "compiled")
                         if cell("fp32", c) or cell("amp_bf16", c))
        rows.append((fw, net, batch, bf16, ratio(cell("fp32", "compiled"), cell("fp32", "eager"))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="default")
    parser.add_argument("--framework", default="all")
    parser.add_argument("--networks", default="alexnet,resnet50,fcn5,lstm32")
    parser.add_argument("--store", type=Path)
    parser.add_argument("--no-run", action="store_true", help="only tabulate an existing --store")
    parser.add_argument("--repeats", type=int)
    args = parser.parse_args()
    networks = [n for n in args.networks.split(",") if n]
    store = args.store or Path(tempfile.mkdtemp(prefix="dlbench-precision-compile-"))
    if not args.no_run:
        code = measure(store, args.profile, args.framework, networks, args.repeats)
        print(f"dlbench run exited {code} (failed or skipped runs are shown below)")
    print(f"store {store}")
    print(f"{'framework':<11} {'network':<9} {'batch':>5}  {'bf16/fp32 (samples/s)':<60} compiled/eager (fp32)")
    for fw, net, batch, bf16, compiled in table(store, networks):
        print(f"{fw:<11} {net:<9} {batch:>5}  {bf16:<60} {compiled}")


if __name__ == "__main__":
    main()
