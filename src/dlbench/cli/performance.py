"""The performance model's commands: `dlbench run --suite kernels`, `dlbench kernels`, `dlbench calibrate`
and `dlbench predict` (with `--accuracy`). Input is checked before anything runs (exit 2, one
message naming what is wrong); the model itself is src/dlbench/performance/."""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .. import paths
from ..definitions.loader import DefinitionError
from ..execution.kernels import PlannedKernelRun, execute_kernel_run, plan_kernel_runs
from ..machine import available_cpus, dlbench_provenance, dtype_support, fingerprint, gpu_capability
from ..performance.accuracy import accuracy_table_rows, prediction_errors
from ..performance.kernel_suite import KernelBenchmark, load_kernel_suite
from ..performance.kernels import KernelSpec
from ..store.kernels import KernelRecord, KernelStore
from ..store.profiles import MachineProfile, ProfileError, ProfileStore
from ..store.store import Store
from . import _catalog, _check_choice, _runner, err, fail, out

RICH_ROWS_MAX = 150  # more kernels than this: one summary row per run instead


def _support(device: str) -> dict:
    return dtype_support(device, capability=gpu_capability() if device == "cuda" else None)


def _machine_profile(store: Store, device: str, threads: int | None) -> MachineProfile | None:
    try:
        return ProfileStore(store).latest_matching(fingerprint()["machine_id"], device, threads)
    except ProfileError as e:
        err.print(f"[yellow]note[/]: {escape(str(e))}; fractions of the ceiling are left empty", highlight=False)
        return None


def _orchestrator(store: Store, device: str, env: str, threads: int, timeout: float, events):
    from ..execution.orchestrator import Orchestrator, RunOptions

    options = RunOptions(device=device, env_backend=env, threads=threads, repeats=None, timeout_s=timeout,
                         cache=paths.cache_dir(), telemetry=None)
    return Orchestrator(store, options, events)


class _EnvEvents:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def environment(self, framework, line):
        self.progress.update(self.task, description=f"[cyan]{framework} env[/]: {escape(line[:70])}")


def _fmt_rate(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    return f"{value / 1e9:,.1f} {'GB/s' if unit == 'B/s' else 'GFLOP/s'}"


def _shape(spec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in spec["shape"].items())


def kernel_table(records: list[KernelRecord], title: str) -> Table:
    rows = sum(len(r.kernels) for r in records)
    t = Table(title=title)
    if rows > RICH_ROWS_MAX:
        for col in ("framework", "benchmark", "status", "kernels ok", "skipped", "failed", "median % of ceiling",
                    "best"):
            t.add_column(col, justify="left" if col in ("framework", "benchmark", "status") else "right")
        for r in records:
            counts = Counter(k.status for k in r.kernels)
            fractions = [k.fraction for k in r.kernels if k.fraction is not None]
            best = max((k for k in r.kernels if k.achieved and k.unit == "FLOP/s"), key=lambda k: k.achieved,
                       default=None)
            t.add_row(escape(str(r.framework.get("name"))), escape(r.benchmark), _status(r.status),
                      str(counts["ok"]), str(counts["skipped"]), str(counts["failed"]),
                      f"{100 * statistics.median(fractions):.0f}%" if fractions else "",
                      _fmt_rate(best.achieved, best.unit) if best else "")
        t.caption = "one row per run (`dlbench kernels --framework FW --benchmark NAME` lists its kernels)"
        return t
    for col in ("framework", "benchmark", "kernel", "shape", "dtype", "status", "median ms", "achieved",
                "% of ceiling"):
        t.add_column(col, justify="right" if col in ("median ms", "achieved", "% of ceiling") else "left")
    for r in records:
        for k in r.kernels:
            t.add_row(escape(str(r.framework.get("name"))), escape(r.benchmark), k.spec["kind"], _shape(k.spec),
                      k.spec["dtype"], _status(k.status), f"{k.median_s * 1e3:.3f}" if k.median_s is not None else "",
                      _fmt_rate(k.achieved, k.unit), f"{100 * k.fraction:.0f}%" if k.fraction is not None else "")
    ceilings = {r.ceilings for r in records if r.ceilings}
    t.caption = (f"ceilings of machine profile {', '.join(sorted(ceilings))}" if ceilings else
                 "no machine profile when these ran: `dlbench calibrate` measures the ceilings")
    return t


def _status(status: str) -> str:
    return f"[{ {'ok': 'green', 'skipped': 'yellow'}.get(status, 'red') }]{status}[/]"


def _print_skips(records: list[KernelRecord]) -> None:
    reasons = Counter((str(r.framework.get("name")), k.status, k.reason) for r in records for k in r.kernels
                      if k.status != "ok")
    for (framework, status, reason), n in sorted(reasons.items(), key=lambda x: (x[0][0], x[0][1], str(x[0][2]))):
        first = str(reason).splitlines()[0] if reason else ""
        err.print(f"[yellow]{status}[/] {n} kernel{'s' if n != 1 else ''} on {escape(framework)}: {escape(first[:300])}",
                  highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------- list

def list_kernels(path: Path, profile: str, device: str) -> None:
    try:
        suite = load_kernel_suite(path, _catalog(), profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    t = Table(title=f"dlbench suite {suite.name} (kernels, profile {profile}, {device})")
    for col in ("benchmark", "kernels", "kinds", "dtypes", "shapes from", "repeats"):
        t.add_column(col, justify="right" if col in ("kernels", "repeats") else "left")
    for b in suite.benchmarks:
        t.add_row(escape(b.name), str(len(b.specs)), ", ".join(dict.fromkeys(s.kind for s in b.specs)),
                  ", ".join(dict.fromkeys(s.dtype for s in b.specs)), escape(b.source), str(b.policy.repeats))
    c = suite.ceilings
    t.caption = (f"dlbench calibrate measures: square matmul {', '.join(map(str, c.matmul_sizes))} in "
                 f"{', '.join(c.dtypes)}; copies of {', '.join(f'{b:,}' for b in c.copy_bytes)} B; the "
                 f"smallest operation ({c.dispatch_bytes} B)")
    out.print(t)


# ---------------------------------------------------------------------------------------- run

def run_kernel_suite(suite_path: Path, names: list[str], registry, *, benchmark, mode, profile: str, device: str,
                     env: str, threads: int | None, repeats: int | None, max_repeats, target_ci, store: Store,
                     timeout: float, workers, scaling, hosts) -> None:
    for option, value in (("--mode", mode), ("--max-repeats", max_repeats), ("--target-ci", target_ci),
                          ("--workers", workers), ("--scaling", scaling), ("--hosts", hosts)):
        if value:
            raise fail(f"{option} is not taken by suite {suite_path.stem!r}: it times kernels, each with the "
                       "policy of its profile (see the suite file)")
    if env == "docker":
        raise fail("--env docker does not run the kernels suite yet; use --env venv or current")
    try:
        suite = load_kernel_suite(suite_path, _catalog(), profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    chosen = list(suite.benchmarks)
    if benchmark:
        valid = [b.name for b in suite.benchmarks]
        for name in benchmark:
            _check_choice("benchmark", name, valid)
        chosen = [b for b in chosen if b.name in benchmark]
    if repeats:
        chosen = [KernelBenchmark(b.suite, b.name, b.specs, b.profile, b.policy.model_copy(update={"repeats": repeats}),
                                  b.source) for b in chosen]
    threads = threads or available_cpus()
    runners = [_runner(registry, n) for n in names]
    runs = plan_kernel_runs(runners, chosen)
    support = _support(device)
    machine_profile = _machine_profile(store, device, threads)
    kernels = sum(len(b.specs) for b in chosen)
    err.print(f"dlbench: suite {suite.name} (kernels), {len(runs)} runs ({kernels} kernels each framework) on "
              f"{device} ({', '.join(names)}), {threads} threads, store {store.root}", highlight=False)
    for dtype, why in support.items():
        if why:
            err.print(f"[yellow]{dtype}[/]: skipped on this {device}: {escape(why)}", highlight=False)
    records = _execute(runs, store, device, env, threads, timeout, support, machine_profile)
    out.print(kernel_table(records, "dlbench run: kernels"))
    _print_skips(records)
    bad = [r for r in records if r.status in ("failed", "timeout") or any(k.status == "failed" for k in r.kernels)]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} kernel runs did not complete; see the reasons above", 1)


def _execute(runs: list[PlannedKernelRun], store: Store, device: str, env: str, threads: int, timeout: float,
             support: dict, machine_profile: MachineProfile | None) -> list[KernelRecord]:
    kernel_store = KernelStore(store)
    records: list[KernelRecord] = []
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=False) as progress:
            task = progress.add_task("starting", total=len(runs))
            orch = _orchestrator(store, device, env, threads, timeout, _EnvEvents(progress, task))
            for run in runs:
                label = f"{run.runner.name} {run.benchmark.name}"
                progress.update(task, description=escape(f"{label} ({len(run.benchmark.specs)} kernels)"))
                record = execute_kernel_run(orch, run, kernel_store, support, machine_profile)
                records.append(record)
                progress.advance(task)
                if record.status != "ok":
                    progress.console.print(f"[yellow]{record.status}[/]: {escape(label)}: {escape(str(record.reason))}",
                                           highlight=False, soft_wrap=True)
            progress.update(task, description="done")
    except KeyboardInterrupt:
        err.print(f"interrupted: workers stopped; {len(records)} complete kernel runs are in the store, none partial")
        raise typer.Exit(130) from None
    return records


# ---------------------------------------------------------------------------------------- kernels

def show_kernels(store: Store, frameworks: list[str] | None, benchmarks: list[str] | None, fmt: str) -> None:
    problems: list[str] = []
    latest: dict[tuple[str, str], KernelRecord] = {}
    for r in KernelStore(store).records(problems):
        latest[(str(r.framework.get("name")), r.benchmark)] = r  # oldest first: the latest wins
    for p in problems:
        err.print(f"[red]unreadable[/] {escape(p)}", highlight=False, soft_wrap=True)
    chosen = [r for (fw, b), r in sorted(latest.items())
              if (not frameworks or fw in frameworks) and (not benchmarks or b in benchmarks)]
    if not chosen:
        raise fail(f"no kernel records{' matching' if frameworks or benchmarks else ''} in {store.root / 'kernels'} "
                   "(`dlbench run --suite kernels` makes them)", 1)
    chosen = [_with_ceilings(store, r) for r in chosen]
    if fmt == "json":
        sys.stdout.write(json.dumps([json.loads(r.model_dump_json(exclude={"output_tail"})) for r in chosen],
                                    indent=1) + "\n")
        return
    table = kernel_table(chosen, f"kernels in {store.root} (latest run of each framework and benchmark)")
    out.print(table)
    _print_skips(chosen)


def _with_ceilings(store: Store, record: KernelRecord) -> KernelRecord:
    """A record that ran before its machine had a profile, with the fractions of the ceilings of the
    latest profile for its machine, device and threads (its `ceilings` names that profile)."""
    from ..performance.kernel_suite import ceiling_of

    if record.ceilings is not None:
        return record
    try:
        profile = ProfileStore(store).latest_matching(str(record.machine.get("machine_id")), record.device,
                                                      record.threads_requested)
    except ProfileError:
        return record
    if profile is None:
        return record
    kernels = []
    for k in record.kernels:
        ceiling = ceiling_of(KernelSpec.from_dict(k.spec), profile)
        kernels.append(k.model_copy(update={"ceiling": ceiling, "fraction": k.achieved / ceiling
                                            if k.achieved and ceiling else None}))
    return record.model_copy(update={"kernels": kernels, "ceilings": f"{profile.ref} (measured after this run)"})


# ---------------------------------------------------------------------------------------- calibrate

def calibrate(*, names: list[str], registry, device: str, env: str, threads: int | None, timeout: float,
              store: Store, workers: int | None) -> None:
    from ..performance.calibration import calibration_specs, ceilings, comm_fits, kernel_times
    from ..performance.kernel_suite import KernelPolicy
    from ..store.profiles import MachineProfile

    if env == "docker":
        raise fail("--env docker does not calibrate yet; use --env venv or current")
    catalog = _catalog()
    kernel_suites = catalog.kernel_suite_names()
    if not kernel_suites:
        raise fail(f"no suite of kind kernels in {catalog.root}: its `ceilings` say what to measure")
    suite_path = catalog.root / f"{kernel_suites[0]}.yaml"
    try:
        suite = load_kernel_suite(suite_path, catalog, "smoke", device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    threads = threads or available_cpus()
    support = _support(device)
    specs = calibration_specs(suite.ceilings, support)
    policy = KernelPolicy(**suite.ceilings.policy.model_dump())
    bench = KernelBenchmark(suite.name, "ceilings", tuple(specs), "calibrate", policy,
                            f"ceilings of {suite_path.name}")
    # the smallest operation again, timed cold as the kernels suite times kernels: what a call costs
    # a framework whose code and data were evicted with the operands (model.op_time takes it off)
    smallest = KernelSpec.of("copy", "float32", elements=max(1, suite.ceilings.dispatch_bytes // 8))
    cold_bench = KernelBenchmark(suite.name, "smallest-cold", (smallest,), "calibrate",
                                 policy.model_copy(update={"cache": "cold"}), "the smallest operation, timed cold")
    runners = [_runner(registry, n) for n in names]
    machine = fingerprint()
    err.print(f"dlbench calibrate: ceilings on {device} with {', '.join(names)} ({len(specs)} kernels each), "
              f"{threads} threads, store {store.root}", highlight=False)
    every = _execute(plan_kernel_runs(runners, [bench, cold_bench]), store, device, env, threads, timeout, support,
                     None)
    records = [r for r in every if r.benchmark == bench.name]
    dispatch_cold = {str(r.framework.get("name")): k.median_s for r in every
                     if r.benchmark == cold_bench.name and r.status == "ok"
                     for k in r.kernels if k.status == "ok" and k.median_s}
    results = {str(r.framework.get("name")): r.kernels for r in records if r.status == "ok"}
    for r in records:
        if r.status != "ok":
            err.print(f"[yellow]{r.status}[/]: {escape(str(r.framework.get('name')))}: {escape(str(r.reason))}",
                      highlight=False, soft_wrap=True)
    if not results:
        raise fail("no framework could measure the ceilings (reasons above); nothing stored", 1)
    peak, bandwidth, dispatch, elementwise = ceilings(results, suite.ceilings.dispatch_bytes)
    problems: list[str] = []
    latest = KernelStore(store).latest_times(machine["machine_id"], device, threads, problems)
    for p in problems:
        err.print(f"[red]unreadable[/] {escape(p)}", highlight=False, soft_wrap=True)
    from ..store.store import Unreadable

    unreadable: list[Unreadable] = []
    fits, notes = comm_fits(store.records(unreadable), machine["machine_id"], device, workers)
    profile = MachineProfile(
        machine_id=machine["machine_id"], created_at=datetime.now(timezone.utc), dlbench=dlbench_provenance(),
        machine=machine, device=device, threads=threads, matmul_peak=peak, copy_bandwidth=bandwidth,
        dispatch_s=dispatch, dispatch_cold_s=dispatch_cold, elementwise_bandwidth=elementwise,
        kernels=kernel_times(latest), comm=fits,
        sources={"ceilings": {str(r.framework.get("name")): {"run_id": r.run_id, "status": r.status,
                                                             "version": r.framework.get("version")}
                              for r in records},
                 "kernels": {fw: sorted({run_id for _, run_id, _ in times.values()}) for fw, times in latest.items()},
                 "comm": [run for f in fits for run in f.run_ids]},
        notes=notes)
    stored = ProfileStore(store).write(profile)
    _print_profile(stored, ProfileStore(store).path(stored.machine_id, stored.revision))
    for n in notes:
        err.print(f"[yellow]note[/]: {escape(n)}", highlight=False, soft_wrap=True)
    if not latest:
        err.print("[yellow]note[/]: no kernel records of this machine yet: predictions will use the roofline for "
                  "every operation (`dlbench run --suite kernels`, then calibrate again)", highlight=False)


def _print_profile(p: MachineProfile, path: Path) -> None:
    t = Table(title=f"machine profile {p.ref} ({p.device}, {p.threads} threads)")
    t.add_column("ceiling")
    t.add_column("value", justify="right")
    t.add_column("by")
    for dtype, c in sorted(p.matmul_peak.items()):
        t.add_row(f"peak matmul {dtype}", f"{c.flops_per_s / 1e9:,.1f} GFLOP/s", escape(f"{c.framework}: {c.kernel}"))
    for b in p.copy_bandwidth:
        t.add_row(f"copy bandwidth, {b.bytes / 2**20:g} MiB moved", f"{b.bytes_per_s / 1e9:,.1f} GB/s", escape(b.framework))
    for fw, s in sorted(p.dispatch_s.items()):
        cold = p.dispatch_cold_s.get(fw)
        t.add_row("smallest operation" + (", warm / cold" if cold else ""),
                  f"{s * 1e6:,.1f}" + (f" / {cold * 1e6:,.1f}" if cold else "") + " µs", escape(fw))
    for fw, points in sorted(p.elementwise_bandwidth.items()):
        t.add_row("element-wise (relu) bandwidth", ", ".join(f"{b.bytes_per_s / 1e9:,.1f}" for b in points) + " GB/s",
                  escape(f"{fw}, at {', '.join(f'{b.bytes / 2**20:g}' for b in points)} MiB"))
    for fw, times in sorted(p.kernels.items()):
        t.add_row("kernel times", f"{len(times)} kernels", escape(fw))
    for c in p.comm:
        t.add_row(f"all-reduce, {c.workers} workers", f"{c.startup_s * 1e6:,.1f} µs + {c.per_byte_s * 1e9:.3f} ns/B",
                  escape(f"{c.framework}: α {c.alpha_s * 1e6:.1f} µs, β {c.beta_s_per_byte * 1e9:.3f} ns/B, "
                         f"R² {c.r2:.3f}, {c.points} sizes"))
    t.caption = f"stored as {path}"
    out.print(t)


# ---------------------------------------------------------------------------------------- predict

def _network_summary(network: str):
    from ..definitions.loader import load_network

    catalog = _catalog()
    path = catalog.networks_dir / f"{network}.yaml"
    if not path.is_file():
        candidate = Path(network)
        if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
            path = candidate
        else:
            raise fail(f"unknown network {network!r}; valid networks: {', '.join(catalog.network_names())} "
                       "(or a path to a .yaml file)")
    try:
        return load_network(path)
    except DefinitionError as e:
        raise fail(str(e)) from None


def predict_command(*, network: str, framework: str, batch: int, mode: str, workers: int, machine: str | None,
                    schedule: str | None, precision: str, threads: int | None, io_bandwidth: float | None,
                    store: Store, fmt: str, layers: bool) -> None:
    from ..performance.model import DataPath, PredictionError, predict
    from ..performance.workload import decompose

    summary = _network_summary(network)
    try:
        profile = ProfileStore(store).resolve(machine, fingerprint()["machine_id"])
    except ProfileError as e:
        raise fail(str(e)) from None
    work = decompose(summary.resolved, batch, mode, precision)
    path = DataPath(work.input_bytes_per_sample, read_bytes_per_s=io_bandwidth * 1e9 if io_bandwidth else None)
    try:
        p = predict(work, framework, profile, workers, schedule, data_path=path, threads=threads)
    except PredictionError as e:
        raise fail(str(e)) from None
    if fmt == "json":
        data = {"network": summary.name, "framework": framework, "batch_per_worker": batch, "mode": mode,
                "precision": precision, **p.to_record(),
                "layers": [{"index": l.index, "label": l.label, "params": l.params, "forward_s": l.forward_s,
                            "backward_s": l.backward_s, "update_s": l.update_s, "measured_s": l.measured_s,
                            "estimated_s": l.estimated_s} for l in p.layers],
                "unmeasured": p.unmeasured}
        if p.schedule is not None:
            data["messages"] = p.schedule.groups
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
        return
    title = (f"predicted {summary.name} {mode}, {framework}, batch {batch}"
             + (f" per worker x {workers} workers ({p.schedule.kind})" if workers > 1 else "")
             + f"; machine profile {p.profile}")
    t = Table(title=escape(title))
    for col in ("phase", "ms", "share"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    total = p.iteration_s
    rows = [("data path (not hidden)", p.io_exposed_s), ("step call", p.step_call_s), ("forward", p.forward_s),
            ("backward", p.backward_s), ("update", p.update_s)]
    if workers > 1:
        rows.append(("communication (not hidden)", p.communication_exposed_s))
    for name, seconds in rows:
        t.add_row(name, f"{seconds * 1e3:.3f}", f"{100 * seconds / total:.1f}%" if total else "")
    t.add_row("[bold]iteration[/]", f"[bold]{total * 1e3:.3f}[/]", "100%")
    if workers > 1:
        t.add_row("communication, all of it", f"{p.communication_s * 1e3:.3f}",
                  f"{len(p.schedule.groups)} messages")
    t.caption = (f"{100 * p.measured_share:.0f}% of the compute time from measured kernel times; "
                 f"{len(p.unmeasured)} kernels estimated by the roofline; {total and batch * workers / total:,.1f} "
                 "samples/s")
    out.print(t)
    if layers:
        lt = Table(title="per layer (ms)")
        for col in ("layer", "params", "forward", "backward", "update", "measured"):
            lt.add_column(col, justify="left" if col == "layer" else "right")
        for l in p.layers:
            busy = l.measured_s + l.estimated_s
            lt.add_row(escape(l.label), f"{l.params:,}", f"{l.forward_s * 1e3:.3f}", f"{l.backward_s * 1e3:.3f}",
                       f"{l.update_s * 1e3:.3f}", f"{100 * l.measured_s / busy:.0f}%" if busy else "")
        out.print(lt)
    for n in p.notes:
        err.print(f"note: {escape(n)}", highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------- accuracy


def accuracy(*, store: Store, suites: list[str] | None, frameworks: list[str] | None, recompute: bool,
             machine: str | None, fmt: str, runs: bool) -> None:
    from ..store.store import Unreadable

    profile = None
    if recompute:
        try:
            profile = ProfileStore(store).resolve(machine, fingerprint()["machine_id"])
        except ProfileError as e:
            raise fail(str(e)) from None
    unreadable: list[Unreadable] = []
    records = [r for r in store.records(unreadable)
               if (not suites or r.suite in suites) and (not frameworks or r.framework.get("name") in frameworks)]
    for u in unreadable:
        err.print(f"[red]unreadable[/] {escape(u.reason)}", highlight=False, soft_wrap=True)
    rows = prediction_errors(records, profile)
    if not rows:
        raise fail(f"no completed runs{' matching' if suites or frameworks else ''} in {store.root}", 1)
    table_rows = accuracy_table_rows(rows)
    if fmt == "json":
        sys.stdout.write(json.dumps({"groups": table_rows, "runs": rows}, indent=1) + "\n")
        return
    how = f"predicted again from profile {profile.ref}" if profile else "as predicted before each run"
    t = Table(title=f"prediction error in {store.root} ({how})")
    for col in ("suite", "framework", "runs", "predicted", "median |error|", "within 25%", "median error"):
        t.add_column(col, justify="left" if col in ("suite", "framework") else "right")
    for g in table_rows:
        style = "bold" if g["framework"] == "all" else ""
        cells = [g["suite"], g["framework"], str(g["runs"]), str(g["predicted"]),
                 f"{100 * g['median_abs_error']:.1f}%" if g["median_abs_error"] is not None else "",
                 f"{100 * g['within_25']:.0f}%" if g["within_25"] is not None else "",
                 f"{100 * g['median_error']:+.1f}%" if g["median_error"] is not None else ""]
        t.add_row(*(f"[{style}]{escape(c)}[/]" if style else escape(c) for c in cells))
    t.caption = "error = predicted / measured median iteration time - 1; runs without a prediction are counted, not scored"
    out.print(t)
    if runs:
        rt = Table(title="runs")
        for col in ("suite", "benchmark", "framework", "batch", "workers", "measured ms", "predicted ms", "error"):
            rt.add_column(col, justify="left" if col in ("suite", "benchmark", "framework") else "right")
        for row in rows:
            rt.add_row(escape(row["suite"]), escape(row["benchmark"]), escape(row["framework"]), str(row["batch"]),
                       str(row["workers"]), f"{row['measured_s'] * 1e3:.2f}",
                       f"{row['predicted_s'] * 1e3:.2f}" if row["predicted_s"] else "",
                       f"{100 * row['error']:+.1f}%" if row["error"] is not None else "")
        out.print(rt)
