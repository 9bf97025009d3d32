"""How often does the median's 95% interval (dlbench.analysis.timing.median_interval) cover the truth?

Simulated runs with a known median: log iteration time = log(10 ms) + a + e, where a ~ N(0, tau^2)
is one offset per worker process (layout, clocks, thread placement) and e is AR(1) noise with
marginal N(0, sigma^2) and lag-one correlation phi inside a process. The marginal log time is
normal with mean log(10 ms), so the true median is exactly 10 ms whatever tau, sigma and phi are.

Prints, per scenario, the share of intervals that contain 10 ms (nominal 0.95; with T trials its
own standard error is about sqrt(0.95 * 0.05 / T), 0.015 at 200), the median half-width and
the stability check's flag rate, and how long one interval took.

    .venv/bin/python benchmarks/ci_coverage.py [--trials 200]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.signal import lfilter

from dlbench.analysis.timing import median_interval, repeat_agreement

TRUE_MEDIAN_S = 0.010

SCENARIOS = [  # repeats, iterations per repeat, tau, sigma, phi
    ("iterations dominate", 3, 50, 0.0, 0.05, 0.3),
    ("iterations dominate", 5, 200, 0.0, 0.05, 0.3),
    ("iterations dominate, one repeat", 1, 200, 0.0, 0.05, 0.3),
    ("both matter", 3, 200, 0.005, 0.05, 0.3),
    ("both matter", 5, 200, 0.005, 0.05, 0.3),
    ("processes dominate", 3, 200, 0.02, 0.05, 0.3),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    print(f"{'scenario':34} {'R':>3} {'n':>5} {'tau':>6} {'sigma':>6} {'phi':>4}  coverage  half-width  flagged  ms/interval")
    for name, repeats, n, tau, sigma, phi in SCENARIOS:
        rng = np.random.default_rng(12345)
        covered, widths, flagged, elapsed = 0, [], 0, 0.0
        for trial in range(args.trials):
            run = simulate_run(rng, repeats, n, tau, sigma, phi)
            started = time.perf_counter()
            interval = median_interval(run, seed=trial)
            elapsed += time.perf_counter() - started
            covered += interval.low <= TRUE_MEDIAN_S <= interval.high
            widths.append(100 * (interval.high - interval.low) / 2 / TRUE_MEDIAN_S)
            flagged += repeat_agreement(run).unstable
        print(f"{name:34} {repeats:>3} {n:>5} {tau:>6} {sigma:>6} {phi:>4}  {covered / args.trials:8.3f}  "
              f"{np.median(widths):9.2f}%  {flagged / args.trials:7.2f}  {1e3 * elapsed / args.trials:11.0f}")


if __name__ == "__main__":
    main()
