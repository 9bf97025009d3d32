"""How long does `dlbench report` take over a large store? Target: <= 30 s at 10,000 runs.

The synthetic store is the one benchmarks/store_scale.py builds (its template is one real run of
the fake runner: 3 repeats of ~130 iterations of 15 ms, GPU (scripted NVML) and psutil telemetry
sampled every 100 ms, about 24 samples of some twenty columns per repeat; each synthetic run varies
benchmark, batch size, framework, machine, date and status, with 3 repeats of 50-200 iteration
times), so the records have a real run's shape and size (about 53 KiB each).

The report is timed end to end as a subprocess, the way a user or the nightly CI meets it: every
record read and its checksum verified, one page per run (with its telemetry and iteration charts),
one per benchmark, the leaderboards, history and the list of runs. Printed: the time of each build
into an empty folder (--builds of them), then of a rebuild over the existing site, with the CPU
seconds of all the processes, the load average when each started, the number of pages and the
site's size. Other work on the machine shows in the wall time and even in the CPU seconds (this
VM's cores slow down under load): compare figures within one output, at a similar load.

    .venv/bin/python benchmarks/report_scale.py [--runs 10000] [--store DIR] [--keep-site DIR] [--builds N]

--store keeps the built store for the next time (reused when it holds --runs records).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_scale import synthetic_store  # noqa: E402 - the same synthetic store, one definition

TARGET_S = 30.0


def timed_report(store: Path, out: Path) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and its worker processes, its output)."""
    cmd = [sys.executable, "-m", "dlbench.cli", "report", "--store", str(store), "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, done.stdout.strip()


def site_size(out: Path) -> tuple[int, int]:
    files = [p for p in out.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--store", type=Path, help="keep (or reuse) the synthetic store here")
    ap.add_argument("--keep-site", type=Path, help="write the site here (kept) instead of a temporary folder")
    ap.add_argument("--builds", type=int, default=1, help="builds into an empty folder, one after the other")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = synthetic_store(args.store or work / "store", work, args.runs)
        sizes = [p.stat().st_size for p in store.paths()]
        print(f"store {store.root}: {len(sizes):,} records, {sum(sizes) / 2**20:.0f} MiB")
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count()
        print(f"{cpus} CPUs available to this process; load average {os.getloadavg()[0]:.1f} before the builds")

        out = args.keep_site or work / "site"
        rows = []
        labels = [f"build into an empty folder{f' ({i + 1})' if args.builds > 1 else ''}" for i in range(args.builds)]
        for label in [*labels, "rebuild over the existing site"]:
            if label in labels:
                shutil.rmtree(out, ignore_errors=True)  # from nothing
            load = os.getloadavg()[0]
            wall, cpu, said = timed_report(store.root, out)
            rows.append((label, wall, cpu, load))
        files, total = site_size(out)
        print(said)
        print(f"site: {files:,} files, {total / 2**20:.0f} MiB")
        print(f"\n{len(sizes):,} runs; target <= {TARGET_S:.0f} s wall")
        for label, wall, cpu, load in rows:
            print(f"  {label:<32} {wall:6.1f} s wall  {'met' if wall <= TARGET_S else 'NOT met'}"
                  f"  ({cpu:.0f} CPU-s over all processes; load average {load:.1f} when it started)")


if __name__ == "__main__":
    main()
