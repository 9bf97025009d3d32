"""`calibrate`: this machine's ceilings, each operation class's efficiency (class probes), its kernel
times and all-reduce and all-to-all fits, as a new machine profile in the store; printing nothing.
The command line (cli/performance.py) renders the profile it returns.

    from dlbench.workflows import CalibrateRequest, calibrate
    result = calibrate(CalibrateRequest(framework=["torch"], quick=True))

Progress goes to `events`, an object with any of: environment(framework, progress) (an environment
being built: execution/environments.py's progress), kernel_runs_planned(count), kernel_run_started(label, kernels), kernel_run_done(label, record),
note(line) (a phase begun, a run that did not complete, an unreadable file: one line each)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..axes import KERNEL_DTYPE
from ..definitions.loader import DefinitionError
from ..execution.backends import BACKENDS
from ..machine import available_cpus, dlbench_provenance, dtype_support, fingerprint, gpu_capability
from ..performance.probes import BUDGET_S
from ..store.store import Store
from . import lookup
from .events import Silent
from .lookup import check_choice, resolved_device
from .requests import RequestError

if TYPE_CHECKING:
    from ..execution.kernels import PlannedKernelRun
    from ..execution.registry import RunnerInfo
    from ..store.kernels import KernelRecord
    from ..store.profiles import MachineProfile


@dataclass(frozen=True)
class CalibrateRequest:
    """`dlbench calibrate`'s options: the frameworks to measure with; `full`: every layer shape of the
    kernels suite too (of `suite`'s networks and `precision`'s dtypes only, when given); `quick`: small
    and short, for tests; `budget`: seconds allowed for each framework's class probes; `workers`: fit
    the all-reduce of only this many workers."""

    framework: list[str] = field(default_factory=lambda: ["all"])
    workers: int | None = None
    full: bool = False
    suite: list[str] | None = None
    precision: list[str] | None = None
    quick: bool = False
    budget: float = BUDGET_S
    device: str = "auto"
    env: str = "venv"
    threads: int | None = None
    timeout: float = 900.0
    store: Path | None = None


@dataclass(frozen=True)
class Calibration:
    """What a calibration stored: the profile and its file, the runners that measured it, how long each
    phase took (seconds by phase name) and the notes of the all-reduce fits."""

    profile: MachineProfile
    path: Path
    runners: list[RunnerInfo]
    seconds: dict[str, float]
    notes: list[str]


class CalibrationFailed(RuntimeError):
    """No framework could measure the ceilings; nothing was stored (the reasons went to events.note)."""


def dtype_support_of(device: str) -> dict:
    """dtype -> None (the device computes in it) or why not."""
    return dtype_support(device, capability=gpu_capability() if device == "cuda" else None)


def execute_kernel_runs(runs: list[PlannedKernelRun], store: Store, device: str, env: str, threads: int,
                        timeout: float, support: dict, machine_profile: MachineProfile | None,
                        events=None, records: list[KernelRecord] | None = None) -> list[KernelRecord]:
    """Each kernel run in turn, its record written to the store's kernels as it ends. `records`: the
    list the records are appended to as they are written (a caller interrupted midway keeps what
    completed)."""
    from ..execution.kernels import execute_kernel_run
    from ..execution.orchestrator import Orchestrator, RunOptions
    from ..store.kernels import KernelStore

    events = events or Silent()
    kernel_store = KernelStore(store)
    options = RunOptions(device=device, env_backend=env, threads=threads, repeats=None, timeout_s=timeout,
                         cache=paths.cache_dir(), telemetry=None)
    orch = Orchestrator(store, options, events)
    events.kernel_runs_planned(len(runs))
    records = [] if records is None else records
    for run in runs:
        label = f"{run.runner.name} {run.benchmark.name}"
        events.kernel_run_started(label, len(run.benchmark.specs))
        record = execute_kernel_run(orch, run, kernel_store, support, machine_profile)
        records.append(record)
        events.kernel_run_done(label, record)
    return records


def calibrate(request: CalibrateRequest, events=None) -> Calibration:
    """Measure and store a machine profile as `request` asks. RequestError for bad input (nothing run
    or stored); CalibrationFailed where no framework measured the ceilings."""
    from ..execution.kernels import flush_bytes, plan_kernel_runs
    from ..performance import probes as class_probes
    from ..performance.calibration import build_profile, calibration_benchmarks, comm_fits
    from ..performance.kernel_suite import load_kernel_suite
    from ..store.kernels import KernelStore
    from ..store.profiles import ProfileStore
    from ..store.store import Unreadable

    r = request
    events = events or Silent()
    check_choice("environment backend", r.env, list(BACKENDS))
    if r.full and r.quick:
        raise RequestError("--full and --quick exclude each other")
    if (r.suite or r.precision) and not r.full:
        raise RequestError(f"--{'suite' if r.suite else 'precision'} chooses the layer shapes of --full; give --full too")
    for p in r.precision or []:
        check_choice("precision", p, list(KERNEL_DTYPE))
    if r.env == "docker":
        raise RequestError("--env docker does not calibrate yet; use --env venv or current")
    device = resolved_device(r.device)
    registry = lookup.registry()
    names = lookup.framework_names(registry, r.framework)
    store = lookup.open_store(r.store)
    mode = "full" if r.full else "quick" if r.quick else "probes"
    full_dtypes = [KERNEL_DTYPE[p] for p in r.precision] if r.precision else None
    catalog = lookup.catalog()
    kernel_suites = catalog.kernel_suite_names()
    if not kernel_suites:
        raise RequestError(f"no suite of kind kernels in {catalog.root}: its `ceilings` say what to measure")
    suite_path = catalog.root / f"{kernel_suites[0]}.yaml"
    shapes_profile = "smoke" if mode == "quick" else "default"
    try:
        suite = load_kernel_suite(suite_path, catalog, shapes_profile, device)
        layer_names = class_probes.layer_benchmarks(suite_path, catalog.suite_names())
        if mode == "full":
            class_probes.layer_sets(suite, layer_names, r.suite, full_dtypes)  # a bad --suite, before timing
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    except ValueError as e:
        raise RequestError(f"--suite {e}") from None
    threads = r.threads or available_cpus()
    support = dtype_support_of(device)
    bench, cold_bench = calibration_benchmarks(suite, suite_path, support)
    if mode == "quick":  # the same kernels, timed briefly
        short = {"warmup_iters": 1, "min_iters": 2, "min_time_s": 0.0, "max_iters": 3}
        bench = replace(bench, policy=bench.policy.model_copy(update=short))
        cold_bench = replace(cold_bench, policy=cold_bench.policy.model_copy(update=short))
    runners = [lookup.runner(registry, n) for n in names]
    machine = fingerprint()
    started = time.monotonic()

    def execute(runs):
        return execute_kernel_runs(runs, store, device, r.env, threads, r.timeout, support, None, events)

    events.note(f"dlbench calibrate: ceilings on {device} with {', '.join(names)} ({len(bench.specs)} kernels "
                f"each), {threads} threads, store {store.root}")
    every = execute(plan_kernel_runs(runners, [bench, cold_bench]))
    records = [x for x in every if x.benchmark == bench.name]
    results = {str(x.framework.get("name")): x.kernels for x in records if x.status == "ok"}
    for x in records:
        if x.status != "ok":
            events.note(f"{x.status}: {x.framework.get('name')}: {x.reason}")
    if not results:
        raise CalibrationFailed("no framework could measure the ceilings (reasons above); nothing stored")
    cold_records = [x for x in every if x.benchmark == cold_bench.name]
    ceilings_only = build_profile(machine=machine, provenance=dlbench_provenance(), device=device, threads=threads,
                                  ceiling_records=records, cold_records=cold_records,
                                  dispatch_bytes=suite.ceilings.dispatch_bytes, latest={}, fits=[], notes=[])
    seconds = {"ceilings": time.monotonic() - started, "class probes": 0.0}

    # the operation classes' efficiencies: a few layer shapes per class, within the budget
    base_policy = next((b.policy for b in suite.benchmarks if b.name in layer_names), bench.policy)
    policy = class_probes.probe_policy(base_policy, shapes_profile)
    flush = flush_bytes(policy, device)
    flush_s = flush / ceilings_only.bandwidth(flush) if flush and ceilings_only.bandwidth(flush) else 0.0
    call = max(ceilings_only.dispatch_cold_s.values(), default=0.0)
    plan = class_probes.plan_probes(class_probes.candidates(suite, layer_names, support), policy, shapes_profile,
                                    "calibrate", class_probes.call_estimate(ceilings_only, call, flush_s), r.budget,
                                    class_probes.candidate_uses(suite, layer_names))
    measured = [x for x in runners if x.name in results]
    probe_records: list = []
    if plan.benchmarks:
        kernels = sum(len(b.specs) for b in plan.benchmarks)
        events.note(f"dlbench calibrate: class probes, {kernels} layer shapes of {plan.classes} operation classes "
                    f"per framework in {len(plan.benchmarks)} runs (estimated at most {plan.estimated_s:,.0f} s per "
                    f"framework, budget {r.budget:g} s)"
                    + (f"; {len(plan.left_out)} shapes left out as too slow" if plan.left_out else ""))
        before = time.monotonic()
        probe_records = execute(plan_kernel_runs(measured, list(plan.benchmarks)))
        seconds["class probes"] = time.monotonic() - before
        for x in probe_records:
            if x.status != "ok":
                events.note(f"{x.status}: {x.framework.get('name')} {x.benchmark}: {x.reason}")
    if mode == "full":
        shapes = class_probes.layer_sets(suite, layer_names, r.suite, full_dtypes)
        events.note(f"dlbench calibrate --full: every layer shape of {', '.join(b.name for b in shapes)} "
                    f"({sum(len(b.specs) for b in shapes)} kernels per framework)")
        before = time.monotonic()
        execute(plan_kernel_runs(measured, shapes))
        seconds["every layer shape"] = time.monotonic() - before
    problems: list[str] = []
    latest = KernelStore(store).latest_times(machine["machine_id"], device, threads, problems)
    for p in problems:
        events.note(f"unreadable {p}")
    unreadable: list[Unreadable] = []
    fits, notes = comm_fits(store.records(unreadable), machine["machine_id"], device, r.workers)
    probe_runs: dict[str, list[str]] = {}
    for x in probe_records:
        if x.status == "ok":
            probe_runs.setdefault(str(x.framework.get("name")), []).append(x.run_id)
    profile = build_profile(machine=machine, provenance=dlbench_provenance(), device=device, threads=threads,
                            ceiling_records=records, cold_records=cold_records,
                            dispatch_bytes=suite.ceilings.dispatch_bytes, latest=latest, fits=fits, notes=notes,
                            class_probes=class_probes.class_probes(probe_records), probe_runs=probe_runs,
                            probe_records=probe_records)
    stored = ProfileStore(store).write(profile)
    seconds["total"] = time.monotonic() - started
    return Calibration(stored, ProfileStore(store).path(stored.machine_id, stored.revision), measured, seconds, notes)
