"""How often does the median's 95% interval, as dlbench reports it, cover the truth?

The reported interval (dlbench.store.intervals.reported_interval) is the union of a t interval on
the log repeat medians and the stored two-level bootstrap (dlbench.analysis.timing.median_interval);
this script makes both from each simulated run exactly as a run's summary and its reader do, and
prints the bootstrap's own coverage beside the reported one's.

Simulated runs with a known median: log iteration time = log(10 ms) + a + e, where a ~ N(0, tau^2)
is one offset per worker process (layout, clocks, thread placement) and e is AR(1) noise with
marginal N(0, sigma^2) and lag-one correlation phi inside a process. The marginal log time is
normal with mean log(10 ms), so the true median is exactly 10 ms whatever tau, sigma and phi are.

Prints, per scenario, the share of intervals that contain 10 ms (nominal 0.95; with T trials its
own standard error is about sqrt(0.95 * 0.05 / T), 0.007 at 1000), the median half-width, the
same two for the bootstrap alone, the stability check's flag rate, and how long one interval took.
A single repeat's interval is not a 95% interval of the run's median (it sees one process only;
store/intervals.py): its row is marked so.

    .venv/bin/python benchmarks/ci_coverage.py [--trials 1000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.signal import lfilter

from dlbench.analysis.timing import median_interval_record, median_interval, repeat_agreement
from dlbench.store.intervals import reported_interval
from dlbench.store.record import Stability, Summary

TRUE_MEDIAN_S = 0.010

SCENARIOS = [  # repeats, iterations per repeat, tau, sigma, phi
    ("iterations dominate", 3, 50, 0.0, 0.05, 0.3),
    ("iterations dominate", 5, 200, 0.0, 0.05, 0.3),
    ("iterations dominate", 2, 200, 0.0, 0.05, 0.3),
    ("iterations dominate, one repeat", 1, 200, 0.0, 0.05, 0.3),
    ("both matter", 3, 200, 0.005, 0.05, 0.3),
    ("both matter", 5, 200, 0.005, 0.05, 0.3),
    ("between", 3, 200, 0.01, 0.05, 0.3),
    ("processes dominate", 2, 200, 0.02, 0.05, 0.3),
    ("processes dominate", 3, 200, 0.02, 0.05, 0.3),
    ("processes dominate", 3, 50, 0.02, 0.05, 0.3),
    ("processes dominate", 5, 200, 0.02, 0.05, 0.3),
    ("processes dominate", 10, 200, 0.02, 0.05, 0.3),
    ("processes dominate", 20, 200, 0.02, 0.05, 0.3),
]


def simulate_run(rng: np.random.Generator, repeats: int, n: int, tau: float, sigma: float,
                 phi: float) -> list[np.ndarray]:
    """One run's iteration times (seconds), per repeat, with a true median of TRUE_MEDIAN_S."""
    out = []
    for _ in range(repeats):
        offset = rng.normal(0.0, tau)
        innovations = rng.normal(0.0, sigma * math.sqrt(1 - phi ** 2), n)
        innovations[0] = rng.normal(0.0, sigma)  # start in the stationary distribution
        noise = lfilter([1.0], [1.0, -phi], innovations)
        out.append(TRUE_MEDIAN_S * np.exp(offset + noise))
    return out


def summary_of(run: list[np.ndarray], interval) -> Summary:
    """The parts of a run's Summary that the reported interval reads (batch 1)."""
    times = np.concatenate(run)
    median = float(np.median(times))
    return Summary(repeats=len(run), iterations=len(times), median_s=median, mean_s=float(times.mean()), stdev_s=0.0,
                   min_s=float(times.min()), max_s=float(times.max()), q1_s=median, q3_s=median, iqr_s=0.0, cv=0.0,
                   repeat_medians_s=[float(np.median(x)) for x in run], first_iter_s=None, ms_per_iter=median * 1e3,
                   samples_per_s=1 / median, ci=median_interval_record(interval, median, 1),
                   stability=Stability(unstable=False, reason=""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    args = parser.parse_args()
    print(f"{'scenario':34} {'R':>3} {'n':>5} {'tau':>6} {'sigma':>6} {'phi':>4}  coverage  half-width  "
          f"bootstrap alone  flagged  ms/interval")
    for name, repeats, n, tau, sigma, phi in SCENARIOS:
        rng = np.random.default_rng(12345)
        covered, widths, boot_covered, boot_widths, flagged, elapsed = 0, [], 0, [], 0, 0.0
        nominal = True
        for trial in range(args.trials):
            run = simulate_run(rng, repeats, n, tau, sigma, phi)
            started = time.perf_counter()
            boot = median_interval(run, seed=trial)
            shown = reported_interval(summary_of(run, boot), 1)
            elapsed += time.perf_counter() - started
            nominal = shown.nominal
            low, high = shown.median_s
            covered += low <= TRUE_MEDIAN_S <= high
            widths.append(100 * (high - low) / 2 / TRUE_MEDIAN_S)
            boot_covered += boot.low <= TRUE_MEDIAN_S <= boot.high
            boot_widths.append(100 * (boot.high - boot.low) / 2 / TRUE_MEDIAN_S)
            flagged += repeat_agreement(run).unstable
        mark = "" if nominal else "  (one process: not a 95% interval of the run)"
        print(f"{name:34} {repeats:>3} {n:>5} {tau:>6} {sigma:>6} {phi:>4}  {covered / args.trials:8.3f}  "
              f"{np.median(widths):9.2f}%  {boot_covered / args.trials:6.3f} {np.median(boot_widths):7.2f}%  "
              f"{flagged / args.trials:7.2f}  {1e3 * elapsed / args.trials:11.0f}{mark}", flush=True)


if __name__ == "__main__":
    main()
