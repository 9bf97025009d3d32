"""The suite kind `convergence`: time to a quality target, each task trained once per seed on each
framework, one record per (framework, task). Its planner and executor are an entry of
suite_kinds.py's table (`run_suite` and `dlbench run` dispatch through it, refusing first the
options this kind does not honour).

`plan_convergence_suite(request, catalog)` checks the request, every task's dataset included
(RequestError for bad input, nothing run or written); `execute_convergence_suite(plan, events)`
runs it, printing nothing:

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="convergence", framework=["torch"], profile="smoke"))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..axes import Precision
from ..definitions.catalog import SuiteCatalog
from ..definitions.convergence import ConvergenceTask
from ..definitions.loader import DefinitionError
from ..execution.registry import RunnerInfo
from ..machine import available_cpus
from ..store.store import Store
from . import lookup
from .events import Silent
from .lookup import check_choice
from .requests import RequestError, RunRequest

if TYPE_CHECKING:
    from ..execution.convergence import PlannedConvergenceRun
    from ..execution.orchestrator import RunOptions
    from ..store.record import Record


@dataclass(frozen=True)
class ConvergencePlan:
    """A checked request of kind convergence: the (framework, task) runs, each task's dataset folder,
    the precision asked (None: each task's own)."""

    request: RunRequest
    suite: str  # the suite's name
    tasks: list[ConvergenceTask]
    runners: list[RunnerInfo]
    runs: list[PlannedConvergenceRun]
    folders: dict[str, Path]  # task -> the folder its dataset is read from
    precision: str | None
    options: RunOptions
    store: Store
    kind = "convergence"

    @property
    def steps(self) -> int:
        """The steps of its progress (events.seed_done): one per seed of each run."""
        return sum(len(r.task.seeds) for r in self.runs)


def plan_convergence_suite(request: RunRequest, suites: SuiteCatalog | None = None) -> ConvergencePlan:
    """Every check of a request of kind convergence, the datasets checked before the first worker
    starts, the store opened (checked writable): RequestError otherwise, nothing run or written.
    The options this kind does not honour are refused before, by suite_kinds.plan_run."""
    from ..execution.convergence import plan_convergence
    from ..execution.datasets import DataError, check_data, digits_folder
    from ..execution.orchestrator import RunOptions

    r = request
    suites = suites or lookup.catalog()
    registry, names = lookup.runs_on(r)
    suite_path = suites.suite_path(r.suite)
    device = lookup.resolved_device(r.device)
    precision = None
    if r.precision:
        values = [p.strip() for item in r.precision for p in item.split(",")]
        if len(values) != 1:
            raise RequestError("--precision: a convergence suite runs one precision at a time")
        check_choice("precision", values[0], Precision.runs())
        precision = values[0]
    try:
        tasks = suites.load_convergence_suite(suite_path, r.profile, device)
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    if r.benchmark:
        for name in r.benchmark:
            check_choice("benchmark", name, [t.name for t in tasks])
        tasks = [t for t in tasks if t.name in r.benchmark]
    if r.repeats:
        tasks = [_with_runs(t, r.repeats) for t in tasks]
    folders: dict[str, Path] = {}
    try:  # every dataset checked before the first worker starts
        for t in tasks:
            if t.dataset.source == "package":
                folders[t.name] = digits_folder(paths.cache_dir(), t.dataset)
            elif r.data is None:
                raise RequestError(f"{suite_path}: task {t.name} reads {t.dataset.name} from --data DIR "
                                   f"({', '.join(t.dataset.train_files + t.dataset.eval_files)}); give --data")
            else:
                _check_counts(t, check_data(t.dataset, r.data), r.data)
                folders[t.name] = r.data.resolve()
    except DataError as e:
        raise RequestError(str(e)) from None
    threads = r.threads or available_cpus()
    runners = [lookup.runner(registry, n) for n in names]
    store = lookup.writable_store(r.store)
    options = RunOptions(device=device, env_backend=r.env, threads=threads, repeats=None, timeout_s=r.timeout,
                         cache=paths.cache_dir(), telemetry=None)
    return ConvergencePlan(r, tasks[0].suite if tasks else suite_path.stem, tasks, runners,
                           plan_convergence(runners, tasks), folders, precision, options, store)


def execute_convergence_suite(plan: ConvergencePlan, events=None, records: list[Record] | None = None) -> list[Record]:
    """Every (framework, task) of the plan, each seed in a fresh worker, each record written to the
    store as it ends; the store's row index brought up to date after the last. `events`:
    environment(framework, progress), seed_started(run, seed, index), seed_done(run, seed_run),
    run_done(run, record); None: none. `records`: the list the records are appended to as they are
    written (a caller interrupted midway keeps what completed)."""
    from ..execution.convergence import execute_convergence_run
    from ..execution.orchestrator import Orchestrator

    events = events or Silent()
    records = [] if records is None else records
    orch = Orchestrator(plan.store, plan.options, events)
    for run in plan.runs:
        record = execute_convergence_run(orch, run, plan.folders[run.task.name], plan.precision, events)
        records.append(record)
        events.run_done(run, record)
    lookup.refresh_index(plan.store)
    return records


def _with_runs(task: ConvergenceTask, runs: int) -> ConvergenceTask:
    """The task trained `runs` times: its seeds from its first on (0 on, where it names none)."""
    return replace(task, seeds=tuple(task.seeds[0] + k for k in range(runs)) if task.seeds else tuple(range(runs)))


def _check_counts(task: ConvergenceTask, counts: dict[str, int], data: Path) -> None:
    from ..execution.datasets import DataError

    for split in ("train", "eval"):
        asked = getattr(task.spec.dataset, f"{split}_samples")
        if asked is not None and asked > counts[split]:
            raise DataError(data, f"task {task.name} asks for {asked} {split} samples of {task.dataset.name}; "
                                  f"the files hold {counts[split]}")
