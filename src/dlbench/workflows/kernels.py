"""The suite kind `kernels`: each framework times the suite's kernels (matmuls, copies, each layer
shape of the networks) in their own dtypes, one kernel record per (framework, benchmark) in the
store's kernels/. Its planner and executor are an entry of suite_kinds.py's table (`run_suite` and
`dlbench run` dispatch through it, refusing first the options this kind does not honour).

`plan_kernels(request, catalog)` checks the request and opens the store (RequestError for bad
input, nothing run or written); `execute_kernels(plan, events)` runs it, printing nothing:

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="kernels", framework=["torch"], profile="smoke", benchmark=["square"]))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..definitions.catalog import SuiteCatalog
from ..definitions.loader import DefinitionError
from ..execution.registry import RunnerInfo
from ..machine import available_cpus, fingerprint
from ..store.store import Store
from . import lookup
from .calibration import dtype_support_of, execute_kernel_runs
from .lookup import check_choice
from .requests import RequestError, RunRequest

if TYPE_CHECKING:
    from ..execution.kernels import PlannedKernelRun
    from ..performance.kernel_suite import KernelBenchmark, KernelSuite
    from ..store.kernels import KernelRecord
    from ..store.profiles import MachineProfile


@dataclass(frozen=True)
class KernelPlan:
    """A checked request of kind kernels: the kernel runs, the device's dtypes, and the machine
    profile whose ceilings each kernel's time is a fraction of (None: none matches, see notes)."""

    request: RunRequest
    suite: KernelSuite
    benchmarks: list[KernelBenchmark]
    runners: list[RunnerInfo]
    runs: list[PlannedKernelRun]
    store: Store
    device: str
    threads: int
    support: dict  # dtype -> None (the device computes in it) or why not
    machine_profile: MachineProfile | None
    notes: list[str]  # what the plan could not find (an unreadable machine profile)
    kind = "kernels"

    @property
    def steps(self) -> int:
        """The steps of its progress (events.kernel_run_done): one per kernel run."""
        return len(self.runs)

    @property
    def kernels(self) -> int:
        """The kernels each framework times."""
        return sum(len(b.specs) for b in self.benchmarks)


def plan_kernels(request: RunRequest, suites: SuiteCatalog | None = None) -> KernelPlan:
    """Every check of a request of kind kernels, the runs planned, the store opened (checked
    writable): RequestError otherwise, nothing run or written. The options this kind does not
    honour are refused before, by suite_kinds.plan_run."""
    from ..execution.kernels import plan_kernel_runs
    from ..performance.kernel_suite import load_kernel_suite

    r = request
    suites = suites or lookup.catalog()
    registry, names = lookup.runs_on(r)
    suite_path = suites.suite_path(r.suite)
    device = lookup.resolved_device(r.device)
    if r.env == "docker":
        raise RequestError("--env docker does not run the kernels suite yet; use --env venv or current")
    try:
        suite = load_kernel_suite(suite_path, suites, r.profile, device)
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    chosen = list(suite.benchmarks)
    if r.benchmark:
        valid = [b.name for b in suite.benchmarks]
        for name in r.benchmark:
            check_choice("benchmark", name, valid)
        chosen = [b for b in chosen if b.name in r.benchmark]
    if r.repeats:
        chosen = [replace(b, policy=b.policy.model_copy(update={"repeats": r.repeats})) for b in chosen]
    threads = r.threads or available_cpus()
    runners = [lookup.runner(registry, n) for n in names]
    store = lookup.writable_store(r.store)
    notes: list[str] = []
    profile = _machine_profile(store, device, threads, notes)
    return KernelPlan(r, suite, chosen, runners, plan_kernel_runs(runners, chosen), store, device, threads,
                      dtype_support_of(device), profile, notes)


def execute_kernels(plan: KernelPlan, events=None, records: list[KernelRecord] | None = None) -> list[KernelRecord]:
    """Each kernel run of the plan, its record written to the store's kernels/ as it ends. `events`:
    kernel_runs_planned(count), environment(framework, progress), kernel_run_started(label,
    kernels), kernel_run_done(label, record); None: none. `records`: the list the records are
    appended to as they are written (a caller interrupted midway keeps what completed)."""
    r = plan.request
    return execute_kernel_runs(plan.runs, plan.store, plan.device, r.env, plan.threads, r.timeout, plan.support,
                               plan.machine_profile, events, records)


def _machine_profile(store: Store, device: str, threads: int, notes: list[str]) -> MachineProfile | None:
    """The latest profile of this machine, device and threads; None (and a note on `notes` where the
    profiles cannot be read) when there is none."""
    from ..store.profiles import ProfileError, ProfileStore

    try:
        return ProfileStore(store).latest_matching(fingerprint()["machine_id"], device, threads)
    except ProfileError as e:
        notes.append(f"{e}; fractions of the ceiling are left empty")
        return None
