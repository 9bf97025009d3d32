"""How fast `dlbench plan` simulates a large cluster: 10,000 jobs on 2,048 devices of 5 types
(datasheet machines: 512 H100, 512 H200, 512 A100, 256 L4, 256 MI300X), every policy.

The trace is generated here, deterministic per --seed: six networks of suites/networks/ at their
usual batch sizes, half of the jobs `framework: any`, workers drawn as Gavel draws them from the
Philly trace (70% 1, 10% 2, 15% 4, 5% 8), each job's length 10^U(1.5, 3.5) minutes on an H100 (as
`seconds` on h100, converted to iterations by the matrix), Poisson arrivals at a rate that offers the
cluster about --load of its H100-equivalent capacity. Prints, per policy, the simulation's wall time
and the process's CPU time over it (the target: under a minute for each non-LP policy on this
machine; on a shared VM the CPU time is the steadier of the two) and its average JCT; the LP
policies' point here is their solve time per round, which grows with the jobs active: they run on
the first N jobs of the same trace all arriving at once (Gavel's static form), N = --lp-jobs, for
--lp-rounds rounds each, and print the mean and largest solve time.

Usage: .venv/bin/python benchmarks/planner_scale.py [--jobs 10000] [--lp-jobs 100,500,2000] [--lp-rounds 3]
       .venv/bin/python benchmarks/planner_scale.py --write-trace FILE.csv [--jobs N] [--h100s H] [--load L]
       .venv/bin/python benchmarks/planner_scale.py --write-trace FILE.csv [--jobs N] [--h100s H] [--load L]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import tempfile
import time
from pathlib import Path

from dlbench.planning.policies import LP_POLICIES, POLICIES
from dlbench.workflows.planning import PlanRequest, plan

CLUSTER = """name: scale-2048
description: 2,048 devices of 5 types, 8 per node
round_s: 360
preemption_s: 30
network: {alpha_us: 10, gb_per_s: 25}
types:
  h100: {machine: h100, nodes: 64, gpus_per_node: 8, price_per_hour: 3.0}
  h200: {machine: h200, nodes: 64, gpus_per_node: 8, price_per_hour: 3.8}
  a100: {machine: a100, nodes: 64, gpus_per_node: 8, price_per_hour: 1.8}
  l4: {machine: l4, nodes: 32, gpus_per_node: 8, price_per_hour: 0.8}
  mi300x: {machine: mi300x, nodes: 32, gpus_per_node: 8, price_per_hour: 3.5}
"""
NETWORKS = (("resnet50", 64), ("resnet56", 128), ("fcn5", 256), ("lstm32", 64), ("transformer_tiny", 64),
            ("gpt2_small", 8))
FRAMEWORKS = ("torch", "jax", "tensorflow", "mxnet")
H100_EQUIVALENTS = 0.6 * 2048  # a rough guess of the cluster's capacity in H100s, for the arrival rate only


def workers(rng: random.Random) -> int:
    r = rng.random()
    return 1 if r < 0.7 else 2 if r < 0.8 else 4 if r < 0.95 else 8


def write_trace(path: Path, jobs: int, load: float, seed: int, h100s: float = H100_EQUIVALENTS) -> None:
    rng = random.Random(seed)
    mean_minutes = (10 ** 3.5 - 10 ** 1.5) / (2 * math.log(10))
    rate = load * h100s / (1.9 * mean_minutes * 60)  # jobs per second; 1.9 = mean workers
    at = 0.0
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "arrival_s", "network", "framework", "precision", "batch", "workers", "seconds", "seconds_on"])
        for i in range(jobs):
            network, batch = NETWORKS[rng.randrange(len(NETWORKS))]
            flexible = rng.random() < 0.5
            out.writerow([f"j{i}", f"{at:.1f}", network, "any" if flexible else rng.choice(FRAMEWORKS),
                          "any" if flexible else "fp32", batch, workers(rng), f"{60 * 10 ** rng.uniform(1.5, 3.5):.0f}", "h100"])
            at += rng.expovariate(rate)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--lp-rounds", type=int, default=3)
    parser.add_argument("--lp-jobs", default="100,500,2000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-trace", type=Path, help="Only write the trace to this CSV file (for another cluster: "
                                                         "--h100s, its capacity in H100s, sets the arrival rate).")
    parser.add_argument("--h100s", type=float, default=H100_EQUIVALENTS)
    args = parser.parse_args()
    if args.write_trace:
        write_trace(args.write_trace, args.jobs, args.load, args.seed, args.h100s)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cluster, trace = Path(tmp) / "cluster.yaml", Path(tmp) / "trace.csv"
        cluster.write_text(CLUSTER)
        write_trace(trace, args.jobs, args.load, args.seed)
        store = Path(tmp) / "store"
        heuristics = [p for p in POLICIES if p not in LP_POLICIES]
        started = time.perf_counter()
        result = plan(PlanRequest(cluster=cluster, trace=trace, policies=heuristics, seed=args.seed, store=store))
        total = time.perf_counter() - started
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        print(f"{len(result.jobs):,} jobs on {result.cluster.devices:,} devices of {len(result.cluster.types)} types; "
              f"matrix {len(result.matrix)} cells in {result.matrix_s:.1f} s; whole plan {total:.1f} s")
        print(f"{'policy':16} {'simulate s':>10} {'CPU s':>7} {'rounds':>7} {'avg JCT h':>10} {'p99 JCT h':>10} {'makespan h':>11} "
              f"{'finished':>9} {'spread':>7}")
        for r in result.runs:
            s = r.summary
            print(f"{s.policy:16} {r.seconds:10.1f} {r.cpu_seconds:7.1f} {s.rounds:7d} {s.average_jct_s / 3600:10.2f} {s.p99_jct_s / 3600:10.2f} "
                  f"{s.makespan_s / 3600:11.1f} {s.finished:9,d} {s.spread_starts:7d}")
        print(f"LP policies: the first N jobs all at t = 0, {args.lp_rounds} rounds (HiGHS, one solve per round "
              "whose jobs changed)")
        print(f"{'policy':16} {'jobs':>6} {'solves':>6} {'mean s':>8} {'max s':>8}")
        rows = list(csv.reader(trace.open()))
        for n in (int(x) for x in args.lp_jobs.split(",")):
            static = Path(tmp) / f"static-{n}.csv"
            with static.open("w", newline="") as f:
                csv.writer(f).writerows([rows[0]] + [[r[0], "0", *r[2:]] for r in rows[1:n + 1]])
            lp = plan(PlanRequest(cluster=cluster, trace=static, policies=list(LP_POLICIES), seed=args.seed,
                                  store=store, max_rounds=args.lp_rounds))
            for r in lp.runs:
                s = r.summary
                print(f"{s.policy:16} {n:6d} {s.lp_solves:6d} {s.lp_solve_mean_s:8.3f} {s.lp_solve_max_s:8.3f}")
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")

if __name__ == "__main__":
    main()
