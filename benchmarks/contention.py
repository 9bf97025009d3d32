"""Does the contention guard keep a CPU burner out of the result? One benchmark, three runs side by side.

The torch runner's fcn5-train (default profile: 2 s measured windows) on every core, three runs in
one invocation: a quiet baseline; the same with a CPU-burning process per core started during
repeats 2 and 3 of 4 and no replacement (`max_replacements=0`, the guard only marks); and the same
burner schedule with the guard (`max_replacements=3`): the contended repeats are kept with status
`contended` and replaced by fresh ones; then the quiet baseline again, since this machine drifts by
several percent over minutes (the two baselines' mean is the reference, their gap the noise floor). Printed: each run's median iteration time and its deviation
from the baseline's, and each repeat's contention as its record holds it. Target: the guarded
median within 5% of the baseline's. The baseline also runs with the guard, so that another job on a
shared machine does not pass for the quiet reference. It burns every core on purpose for the
burner's repeats: about 2 minutes on a 2-core VM.

    .venv/bin/python benchmarks/contention.py [--network fcn5] [--batch 64] [--repeats 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from dlbench import paths
from dlbench.execution.orchestrator import Orchestrator, RunOptions, SilentEvents
from dlbench.machine import available_cpus
from dlbench.store.store import Store
from dlbench.telemetry import TelemetryConfig
from seed_runs import SUITE_OF, torch_training_run

BURN = "while True:\n    pass\n"


class Burner(SilentEvents):
    """Starts one CPU-burning process per core after repeat `on_after` ends, stops them after `off_after`
    (repeat indices as the orchestrator numbers them, replacements included)."""

    def __init__(self, cores: int, on_after: int | None, off_after: int | None):
        self.cores, self.on_after, self.off_after = cores, on_after, off_after
        self.procs: list[subprocess.Popen] = []

    def repeat_done(self, run, repeat):
        if repeat.index == self.on_after:
            self.procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(self.cores)]
        elif repeat.index == self.off_after:
            self.stop()

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--network", default="fcn5", choices=sorted(SUITE_OF))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()

    run = torch_training_run(args.network, args.batch)
    cores = available_cpus()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        # the quiet baseline before and after (ABA): this machine drifts by several percent over
        # minutes, so the reference is the two baselines' mean and their gap is the noise floor
        for label, replacements, burner in (
                ("quiet baseline (guarded)", 3, Burner(cores, None, None)),
                ("burner, no guard", 0, Burner(cores, 0, 2)),
                ("burner, guard", 3, Burner(cores, 0, 2)),
                ("quiet baseline again (guarded)", 3, Burner(cores, None, None))):
            options = RunOptions(device="cpu", env_backend="venv", threads=cores, repeats=args.repeats,
                                 timeout_s=600, cache=paths.cache_dir(),
                                 telemetry=TelemetryConfig(interval_s=0.1, gpu_indices=()),
                                 max_replacements=replacements)
            try:
                record = Orchestrator(store, options, burner).execute_one(run)
            finally:
                burner.stop()
            if record.status != "ok":
                raise SystemExit(f"{label}: run failed: {record.reason}\n{record.output_tail}")
            results[label] = record
    first, again = results["quiet baseline (guarded)"].summary, results["quiet baseline again (guarded)"].summary
    base, base_mean = (first.median_s + again.median_s) / 2, (first.mean_s + again.mean_s) / 2
    floor = abs(first.median_s - again.median_s) / base * 100
    print(f"{args.network}-train b={args.batch}, torch, {cores} threads, {args.repeats} repeats; burner: one "
          f"busy loop per core during repeats 2 and 3 (indices 1-2)")
    print("deviations against the two baselines' mean; the median is over every counted iteration (a "
          "contended repeat's few slow iterations barely move it), the mean weighs them by count")
    for label, record in results.items():
        s = record.summary
        print(f"\n{label}: median {s.median_s * 1e3:.2f} ms ({(s.median_s - base) / base * 100:+.1f}%), mean "
              f"{s.mean_s * 1e3:.2f} ms ({(s.mean_s - base_mean) / base_mean * 100:+.1f}%) over {s.repeats} "
              f"counted repeats; replaced {record.repeat_policy.replaced} (run {record.run_id})")
        for rep in record.repeats:
            c = rep.contention or {}
            median = sorted(rep.iter_s)[len(rep.iter_s) // 2] * 1e3 if rep.iter_s else float("nan")
            figure = (f"other processes {c['contention_pct']:5.1f}% of the cores" if c.get("measured")
                      else f"not measured: {c.get('reason')}")
            print(f"  repeat {rep.index}: {rep.status:9s} median {median:7.2f} ms   {figure}"
                  f"{'   CONTENDED' if c.get('contended') else ''}")
    def off(label: str) -> tuple[float, float]:
        s = results[label].summary
        return abs(s.median_s - base) / base * 100, abs(s.mean_s - base_mean) / base_mean * 100

    (guarded, guarded_mean), (unguarded, unguarded_mean) = off("burner, guard"), off("burner, no guard")
    print(f"\n|deviation| from the quiet baselines (their gap, the noise floor: {floor:.1f}%): median without the "
          f"guard {unguarded:.1f}%, with it {guarded:.1f}%; mean without {unguarded_mean:.1f}%, with "
          f"{guarded_mean:.1f}%; target with the guard <= 5% (median and mean): "
          f"{'met' if max(guarded, guarded_mean) <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
