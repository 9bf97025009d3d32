"""Does `dlbench results` answer quickly over a large store? Target: <= 3 s at 10,000 runs.

Builds (or reuses) a store of synthetic but realistic records and times the command end to end, as
a subprocess, the way a user meets it:

- a template record comes from one real run of the fake runner (tests/fixtures/runners/fake) on the
  default profile with 3 repeats of about 130 iterations each and telemetry sampled every 100 ms
  through the scripted NVML (tests/fixtures/fake_pynvml.py), so its GPU and CPU series have the
  size a real run's have;
- each synthetic run varies it: a benchmark and batch size of the shipped suites (with that
  network's real description), one of four frameworks, one of five machines, a start time spread
  over a year, a status mix (mostly ok), 3 repeats of 50-200 iteration times each, re-summarised
  with dlbench's own statistics, and written through Store.write.

Times: cold (no index: every record parsed, the index built), warm (index current), after adding
and after removing records (incremental), after the index was corrupted (rebuilt), and
`dlbench.load` in process. Each warm figure is the median of --rounds subprocess runs measured in
this one run; this VM's timings drift by tens of percent, so compare figures within one output.

    .venv/bin/python benchmarks/store_scale.py [--runs 10000] [--store DIR] [--rounds 3]

--store keeps the built store for the next time (it is reused when it holds --runs records).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from dlbench.analysis.timing import summarise
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.store.index import INDEX_DIR, INDEX_FILE
from dlbench.store.record import NetworkInfo, Record, Repeat, Workload, new_run_id
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TARGET_S = 3.0
FRAMEWORKS = {"torch": "2.13.0", "tensorflow": "2.21.0", "jax": "0.7.2", "mxnet": "1.9.1"}
STATUS_MIX = (["ok"] * 93) + (["failed"] * 3) + (["timeout"] * 2) + (["skipped"] * 2)


def _gpu_trace(samples: int = 400) -> str:
    """A scripted H100 for the template run: power, clocks, temperature, utilisation, memory, energy."""
    rng = np.random.default_rng(1)
    power = (350_000 + rng.normal(0, 15_000, samples)).astype(int)
    frames = [{"power_mw": int(p), "power_instant_mw": int(p + 5_000), "power_avg_mw": int(p - 2_000),
               "energy_mj": int(100 * k * p / 1000), "sm_mhz": 1980 - (k % 7) * 15, "mem_mhz": 2619,
               "graphics_mhz": 1980, "temp_c": 55 + k // 40, "util_gpu": 97, "util_mem": 60,
               "mem_used": 30 * 2**30 + k * 2**20, "pstate": 0, "fan": 0, "reasons": 0}
              for k, p in enumerate(power)]
    return json.dumps({"driver": "550.54.15", "cuda_driver": 12040, "devices": [{
        "static": {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-template", "power_limit_mw": 700_000,
                   "max_sm_mhz": 1980, "max_mem_mhz": 2619, "memory_total": 80 * 2**30,
                   "ecc": [1, 1], "persistence": 1},
        "frames": frames}]})


def template_record(work: Path) -> Record:
    """One real run of the fake runner: fcn5-train, default profile, 3 repeats, 15 ms steps."""
    project = work / "project"
    (project / "runners").mkdir(parents=True)
    for name in ("suites", "reports"):
        (project / name).symlink_to(ROOT / name)
    (project / "runners" / "fake").symlink_to(FIXTURES / "runners" / "fake")
    (project / "runners" / "common").symlink_to(ROOT / "runners" / "common")
    env = {**os.environ, "DLBENCH_ROOT": str(project), "DLBENCH_FAKE_STEP_S": "0.015",
           "DLBENCH_NVML_MODULE": "fake_pynvml", "DLBENCH_FAKE_NVML": _gpu_trace(),
           "PYTHONPATH": os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")])}
    env.pop("DLBENCH_FAKE_BEHAVIOUR", None)
    store = work / "template"
    cmd = [sys.executable, "-m", "dlbench.cli", "run", "--suite", "fcn", "--framework", "fake", "--benchmark",
           "fcn5-train", "--profile", "default", "--device", "cpu", "--env", "current", "--repeats", "3",
           "--threads", "1", "--store", str(store)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"template run failed:\n{done.stdout}\n{done.stderr}")
    (record,) = Store(store).records()
    return record


def _catalog_benchmarks() -> list:
    catalog = SuiteCatalog(ROOT / "suites")
    return [b for name in catalog.suite_names()
            for b in catalog.load_suite(catalog.suite_path(name), "paper", "cuda").benchmarks]


def synthesise(template: Record, store: Store, runs: int, seed: int = 7,
               start: datetime = datetime(2025, 12, 1, tzinfo=timezone.utc)) -> None:
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    benchmarks = _catalog_benchmarks()
    machines = []
    for i in range(5):
        m = dict(template.machine, hostname=f"bench-{i:02d}")
        if "machine_id" in m:
            m["machine_id"] = f"{i:02d}" + m["machine_id"][2:]
        machines.append(m)
    step = timedelta(days=365) / runs
    tele = [(rep.telemetry, rep.derived) for rep in template.repeats]
    for i in range(runs):
        b = rng.choice(benchmarks)
        framework = rng.choice(list(FRAMEWORKS))
        batch = rng.choice(b.batch_sizes)
        device = "cuda" if rng.random() < 0.7 else "cpu"
        status = rng.choice(STATUS_MIX)
        started = start + i * step + timedelta(seconds=rng.randrange(60))
        base = 0.002 * (1 + b.network.flops_per_sample / 1e8) * batch / 64 * (1 if device == "cuda" else 20)
        repeats = []
        if status != "skipped":
            for r in range(3):
                n = rng.randint(50, 200)
                times = base * nprng.lognormal(0, 0.05, n)
                ok = status == "ok" or r < 2
                telemetry, derived = tele[r % len(tele)]
                repeats.append(Repeat(index=r, status="ok" if ok else status,
                                      reason=None if ok else "synthetic failure",
                                      first_iter_s=float(base * 40),
                                      warmup_iter_s=(base * nprng.lognormal(0, 0.2, 8)).tolist(),
                                      warmup_settled=True, iter_s=times.tolist() if ok else [],
                                      window_monotonic_ns=[0, int(times.sum() * 1e9)], wall_s=float(times.sum() + 3),
                                      telemetry=telemetry, derived=derived))
        summary = summarise(repeats, batch) if status == "ok" else None
        record = template.model_copy(update={
            "run_id": new_run_id(started), "started_at": started,
            "ended_at": started + timedelta(seconds=sum(r.wall_s or 0 for r in repeats) + 5),
            "suite": b.suite, "benchmark": b.name,
            "network": NetworkInfo(name=b.network.name, file=b.network_file, hash=b.network.definition_hash,
                                   params_described=b.network.params, flops_per_sample=b.network.flops_per_sample,
                                   definition=b.network.resolved),
            "workload": Workload(mode=b.mode, batch_size=batch, precision=b.precision, learning_rate=b.learning_rate,
                                 momentum=b.momentum, device=device),
            "framework": {"name": framework, "version": FRAMEWORKS[framework], "build": {}, "devices": []},
            "machine": machines[i % len(machines)],
            "repeats": repeats, "summary": summary, "params": b.network.params if status == "ok" else None,
            "status": status, "reason": None if status == "ok" else f"synthetic {status}",
        })
        store.write(record)
        if (i + 1) % 1000 == 0:
            print(f"  {i + 1} records written", flush=True)


def synthetic_store(root: Path, work: Path, runs: int) -> Store:
    """The store at `root` holding `runs` synthetic records: reused when it has them, built when
    empty, refused when it holds some other number (never mixed with a half-built one)."""
    store = Store(root)
    if len(store.paths()) != runs:
        if store.root.exists() and store.paths():
            raise SystemExit(f"{store.root} holds {len(store.paths())} records, not {runs}; "
                             "give an empty or new --store")
        t0 = time.perf_counter()
        template = template_record(work)
        print(f"template run: {len(template.repeats)} repeats of "
              f"{[len(r.iter_s) for r in template.repeats]} iterations, "
              f"{len(template.repeats[0].telemetry['t_ns'])} telemetry samples in its first repeat, "
              f"{time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        synthesise(template, store, runs)
        print(f"wrote {runs} records in {time.perf_counter() - t0:.0f} s")
    return store


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--store", type=Path, help="keep (or reuse) the synthetic store here")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = synthetic_store(args.store or work / "store", work, args.runs)
        sizes = [p.stat().st_size for p in store.paths()]
        print(f"store {store.root}: {len(sizes)} records, median {statistics.median(sizes) / 1024:.0f} KiB, "
              f"total {sum(sizes) / 2**20:.0f} MiB")

        results = [sys.executable, "-m", "dlbench.cli", "results", "--store", str(store.root)]
        index = store.root / INDEX_DIR / INDEX_FILE
        shutil.rmtree(store.root / INDEX_DIR, ignore_errors=True)
        rows: list[tuple[str, float]] = []
        rows.append(("cold: no index, every record parsed (csv)", timed([*results, "--format", "csv"])))

        def warm(label: str, *extra: str) -> None:
            rows.append((f"warm: {label}", statistics.median(timed([*results, *extra]) for _ in range(args.rounds))))

        warm("table (default)")
        warm("csv", "--format", "csv")
        warm("json", "--format", "json")
        warm("filtered: --framework torch --since 2026-06-01 --status ok",
             "--framework", "torch", "--since", "2026-06-01", "--status", "ok")
        warm("parquet --out", "--format", "parquet", "--out", str(work / "runs.parquet"))
        baseline = [sys.executable, "-c", "import dlbench.cli"]
        rows.append(("(python start-up and `import dlbench.cli` alone)",
                     statistics.median(timed(baseline) for _ in range(args.rounds))))

        # incremental: 20 records merged in from another store (copied with their mtimes), then removed
        other = Store(work / "other")
        synthesise(store.read(store.paths()[0]), other, 20, seed=11, start=datetime(2027, 1, 1, tzinfo=timezone.utc))
        added = []
        for p in other.paths():
            shutil.copy2(p, store.runs / p.name)
            added.append(store.runs / p.name)
        rows.append(("after 20 records copied in (csv)", timed([*results, "--format", "csv"])))
        for p in added:
            p.unlink()
        rows.append(("after 20 records removed (csv)", timed([*results, "--format", "csv"])))
        index.write_bytes(b"this is not an sqlite database" * 100)
        rows.append(("index corrupted: removed and rebuilt (csv)", timed([*results, "--format", "csv"])))

        load = ("import time, dlbench, dlbench.store.frame; t = time.perf_counter(); "
                "df = dlbench.load({root!r}, iterations={it}); print(len(df), time.perf_counter() - t)")
        for it in (False, True):
            done = subprocess.run([sys.executable, "-c", load.format(root=str(store.root), it=it)],
                                  capture_output=True, text=True, check=True)
            n, secs = done.stdout.split()
            rows.append((f"dlbench.load(iterations={it}) in process (pandas imported), warm index: {int(n):,} rows",
                         float(secs)))

        width = max(len(label) for label, _ in rows)
        print(f"\n{len(sizes):,} runs; target <= {TARGET_S:.0f} s for `dlbench results` with a current index")
        for label, secs in rows:
            verdict = ""
            if label.startswith("warm") or label.startswith("after"):
                verdict = "  met" if secs <= TARGET_S else "  NOT met"
            print(f"  {label.ljust(width)}  {secs:6.2f} s{verdict}")


if __name__ == "__main__":
    main()
