"""Calibration of `dlbench history`'s step detection on simulated series (no framework, no store).

Noise is Gaussian on log throughput with a given CV (run-to-run spread of run medians; about 5% for
smoke-profile runs on the 2-core development VM, measured from the process-to-process spread of
repeat medians). Prints, per series length:
  - false steps: share of step-free series in which any step is reported;
  - outlier: share of step-free series with one run 3x slower in the middle that report a step;
  - found +-1: share of series with one planted -10% step in the middle reported as exactly one
    step within one run of the truth (and, for reference, how often an oracle that knows there is
    exactly one step places it within one run: least squares over every split).
Usage: .venv/bin/python benchmarks/changepoint_calibration.py [--cv 0.05] [--seeds 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from dlbench.analysis.history import detect_steps


def oracle_split(y: np.ndarray, min_size: int = 3) -> int:
    costs = [((y[:i] - y[:i].mean()) ** 2).sum() + ((y[i:] - y[i:].mean()) ** 2).sum()
             for i in range(min_size, len(y) - min_size + 1)]
    return int(np.argmin(costs)) + min_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cv", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--lengths", default="8,10,15,30,60")
    args = parser.parse_args()
    print(f"noise CV {args.cv:.3f}, step -10%, {args.seeds} seeds per cell")
    print(f"{'runs':>5} {'false steps':>12} {'3x outlier':>11} {'found +-1':>10} {'oracle +-1':>11}")
    for n in (int(x) for x in args.lengths.split(",")):
        false = outlier = found = oracle = 0
        at = n // 2
        for seed in range(args.seeds):
            noise = np.random.default_rng(seed).normal(0.0, args.cv, n)
            false += bool(detect_steps(np.exp(noise)))
            spiked = noise.copy()
            spiked[at] -= np.log(3.0)
            outlier += bool(detect_steps(np.exp(spiked)))
            stepped = noise.copy()
            stepped[at:] += np.log(0.9)
            steps = detect_steps(np.exp(stepped))
            found += len(steps) == 1 and abs(steps[0] - at) <= 1
            oracle += abs(oracle_split(stepped) - at) <= 1
        s = args.seeds
        print(f"{n:>5} {false / s:>12.3f} {outlier / s:>11.3f} {found / s:>10.3f} {oracle / s:>11.3f}", flush=True)


if __name__ == "__main__":
    main()
