"""Gavel's Figure 8 setting, simulated by `dlbench plan`: heterogeneity-agnostic against -aware max-min
fairness (Gavel's "LAS" and "Gavel") on a continuous-single trace, 36 V100 + 36 P100 + 36 K80, the
average JCT of a steady-state window of jobs, at several input job rates.

The setting, as Gavel's repository describes it (EXPERIMENTS.md, "Figure 8"; the trace generator of
scheduler/utils.py, read, not copied): single-GPU jobs whose type is drawn uniformly from the 26 job
types of its table (ResNet-18, ResNet-50, Transformer, LM and Recommendation at 4-5 batch sizes, A3C,
CycleGAN); each job's length drawn from the Philly trace's distribution (10^U(1.5, 3) minutes with
probability 0.8, else 10^U(3, 4)) and turned into steps at the job's V100 throughput; Poisson arrivals
at the input job rate (jobs per hour); rounds of 360 s; the average JCT of jobs 4000 to 5000
(`--measure-jobs`), the simulation running until those are done. Gavel's simulator charges no restart
cost: the cluster file `suites/clusters/gavel-36.yaml` has none either.

Gavel's own numbers for this figure, seed 0, from the outputs saved in its notebook
scheduler/notebooks/figures/evaluation/continuous_jobs.ipynb (average JCT of jobs 4000-5000, hours;
`max_min_fairness` is the agnostic LAS, `max_min_fairness_perf` Gavel's heterogeneity-aware one), are
printed beside this planner's (`GAVEL_FIGURE_8`).

Usage: .venv/bin/python benchmarks/gavel_continuous.py --throughputs TABLE.json
           [--rates 2.0,4.8,5.6] [--first 4000] [--last 5000] [--extra 1000] [--seed 0] [--write-trace F.csv]
TABLE.json: Gavel's scheduler/simulation_throughputs.json, or the excerpt in tests/fixtures/gavel/.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import random
import re
import tempfile
import time
from pathlib import Path

from dlbench.workflows.planning import PlanRequest, plan

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "suites" / "clusters" / "gavel-36.yaml"
REFERENCE = "v100"  # Gavel turns a job's duration into steps at its throughput on this type

# Gavel's notebook, its printed averages for seed 0 (input job rate -> (agnostic LAS, Gavel)), hours;
# at 6.0 jobs/hour the agnostic one has no value (its jobs do not all finish).
GAVEL_FIGURE_8 = {0.4: (23.26, 17.58), 0.8: (23.33, 17.64), 1.2: (23.51, 17.67), 1.6: (23.57, 17.48),
                  2.0: (23.47, 16.95), 2.4: (23.43, 16.39), 2.8: (23.59, 16.04), 3.2: (23.59, 16.08),
                  3.6: (23.57, 16.38), 4.0: (23.49, 16.82), 4.4: (23.81, 17.48), 4.8: (35.79, 18.97),
                  5.2: (63.78, 22.02), 5.6: (95.99, 28.96), 6.0: (None, 41.23)}


def single_gpu_types(table: dict) -> dict[str, float]:
    """The job types with a one-GPU throughput on the reference type -> that throughput (steps/s)."""
    out = {}
    for key, entry in table[REFERENCE].items():
        job_type, scale = ast.literal_eval(key)
        if scale == 1:
            out[job_type] = float(entry["null"])
    return out


def minutes(rng: random.Random) -> float:
    """A job's length on a V100, from the Philly trace's distribution as Gavel draws it."""
    return 10 ** rng.uniform(3, 4) if rng.random() >= 0.8 else 10 ** rng.uniform(1.5, 3)


def write_trace(path: Path, table: dict, jobs: int, rate_per_hour: float, seed: int) -> None:
    types = single_gpu_types(table)
    names = sorted(types)
    rng = random.Random(seed)
    at = 0.0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "arrival_s", "network", "batch", "workers", "iterations"])
        for i in range(jobs):
            job_type = rng.choice(names)
            steps = max(1, round(minutes(rng) * 60 * types[job_type]))
            found = re.search(r"\(batch size (\d+)\)", job_type)
            w.writerow([i, f"{at:.3f}", job_type, found.group(1) if found else 1, 1, steps])
            at += rng.expovariate(rate_per_hour / 3600.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--throughputs", type=Path, required=True)
    ap.add_argument("--rates", default="2.0,4.8,5.6", help="input job rates, jobs per hour")
    ap.add_argument("--first", type=int, default=4000)
    ap.add_argument("--last", type=int, default=5000)
    ap.add_argument("--extra", type=int, default=1000, help="jobs generated after the window (its load)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="maxmin_agnostic,gavel_maxmin")
    ap.add_argument("--write-trace", type=Path, help="only write the trace of the first rate")
    args = ap.parse_args()
    table = json.loads(args.throughputs.read_text())
    rates = [float(r) for r in args.rates.split(",")]
    jobs = args.last + 1 + args.extra
    if args.write_trace:
        write_trace(args.write_trace, table, jobs, rates[0], args.seed)
        return
    print(f"Gavel's Figure 8 setting: {jobs} single-GPU jobs, jobs {args.first}-{args.last} measured, seed {args.seed}")
    print("| jobs/hour | policy | average JCT, jobs measured (h) | Gavel's (h, its seed 0) | LP solves | simulation s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in rates:
            trace = Path(tmp) / f"rate{rate}.csv"
            write_trace(trace, table, jobs, rate, args.seed)
            started = time.perf_counter()
            result = plan(PlanRequest(cluster=CLUSTER, trace=trace, throughputs=args.throughputs,
                                      policies=args.policies.split(","), seed=args.seed,
                                      measure=(args.first, args.last)))
            for run in result.runs:
                s = run.summary
                published = GAVEL_FIGURE_8.get(rate)
                theirs = None if published is None else published[0 if s.policy == "maxmin_agnostic" else 1]
                mine = f"{s.average_jct_s / 3600:.2f}" if s.average_jct_s is not None else "none"
                print(f"| {rate:g} | {s.policy} | {mine} ({s.finished}/{s.jobs} done) | "
                      f"{'' if theirs is None else f'{theirs:.2f}'} | {s.lp_solves} | {run.seconds:.0f} |", flush=True)
            print(f"<!-- rate {rate}: {time.perf_counter() - started:.0f} s in all -->", flush=True)


if __name__ == "__main__":
    main()
