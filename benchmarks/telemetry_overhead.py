"""What does sampling cost the measured workload? Throughput with telemetry at 100 ms / without.

The same dlbench run (torch runner, default profile, one repeat per round) alternates between
sampling on and off, so machine drift hits both; the figure is the median of the paired ratios,
with their range. Target: >= 0.99.

    .venv/bin/python benchmarks/telemetry_overhead.py [--rounds 9] [--network fcn5|alexnet_r] [--batch 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from dlbench import paths
from dlbench.execution.orchestrator import Orchestrator, RunOptions
from dlbench.machine import available_cpus
from dlbench.store.store import Store
from dlbench.telemetry import TelemetryConfig
from seed_runs import SUITE_OF, torch_training_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--network", default="alexnet_r", choices=sorted(SUITE_OF))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    args = ap.parse_args()

    run = torch_training_run(args.network, args.batch)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        def orchestrator(telemetry):
            options = RunOptions(device="cpu", env_backend="venv", threads=available_cpus(), repeats=1,
                                 timeout_s=600, cache=paths.cache_dir(), telemetry=telemetry)
            return Orchestrator(Store(Path(tmp)), options)

        sampled = orchestrator(TelemetryConfig(interval_s=args.interval_ms / 1000, gpu_indices=None))
        plain = orchestrator(None)
        for i in range(args.rounds):
            on, off = sampled.execute_one(run), plain.execute_one(run)
            for r in (on, off):
                if r.status != "ok":
                    raise SystemExit(f"run failed: {r.reason}\n{r.output_tail}")
            ratios.append(on.summary.samples_per_s / off.summary.samples_per_s)
            samples = on.telemetry["summary"]["samples"]
            print(f"  round {i + 1}: with sampling {on.summary.samples_per_s:8.1f} samples/s ({samples} samples "
                  f"in the window)   without {off.summary.samples_per_s:8.1f}   ratio {ratios[-1]:.3f}")
    ratio = statistics.median(ratios)
    print(f"{args.network} train, batch {args.batch}, sampling every {args.interval_ms:g} ms: median of "
          f"{args.rounds} paired ratios {ratio:.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
          f"target >= 0.99: {'met' if ratio >= 0.99 else 'NOT met'}")


if __name__ == "__main__":
    main()
