"""The suite kind `convergence`: time to a quality target, each task trained once per seed on each
framework, one record per (framework, task). Its planner and executor are an entry of
suite_kinds.py's table (`run_suite` and `dlbench run` dispatch through it, refusing first the
options this kind does not honour).

`plan_convergence_suite(request, catalog)` checks the request, every task's dataset included
(RequestError for bad input, nothing run or written); `execute_convergence_suite(plan, events)`
runs it, printing nothing:

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="convergence", framework=["torch"], profile="smoke"))

With --workers N (N > 1) each seed is a data-parallel job of N ranks training on the task's global
batch (each rank its share), once dense and once per --compression method asked (`all`: every
one), on a shaped link with --link; each compressed run is compared seed by seed with the dense one
(execution/convergence.py). On one worker --compression and --link are refused: nothing is
exchanged there. Refused as well: a task batch N does not divide, --env docker (multi-worker jobs
run in venvs), and what the distributed kind refuses of --link (distributed.py _link_spec).
"""

from __future__ import annotations

import contextlib
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
from .lookup import check_choice, listed_compressions
from .requests import RequestError, RunRequest

if TYPE_CHECKING:
    from ..execution.convergence import PlannedConvergenceRun
    from ..execution.distributed import DistributedOptions
    from ..execution.links import LinkSpec
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
    jobs: DistributedOptions | None = None  # --workers N > 1: the data-parallel jobs' placement and threads
    link: LinkSpec | None = None  # --link: the jobs' ranks on a shaped link, made when they start
    kind = "convergence"

    @property
    def workers(self) -> int:
        return self.jobs.placement.workers if self.jobs is not None else 1

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
    jobs, link, compressions = _data_parallel(r, device, tasks, suite_path)
    threads = jobs.threads if jobs is not None else (r.threads or available_cpus())
    runners = [lookup.runner(registry, n) for n in names]
    store = lookup.writable_store(r.store)
    options = RunOptions(device=device, env_backend=r.env, threads=threads, repeats=None, timeout_s=r.timeout,
                         cache=paths.cache_dir(), telemetry=None)
    return ConvergencePlan(r, tasks[0].suite if tasks else suite_path.stem, tasks, runners,
                           plan_convergence(runners, tasks, compressions), folders, precision, options, store,
                           jobs, link)


def _data_parallel(r: RunRequest, device: str, tasks: list[ConvergenceTask], suite_path: Path):
    """(job options, link, methods) of a request with --workers N > 1 (the methods dense first);
    (None, None, None) on one worker, where --compression and --link are refused."""
    from ..execution.distributed import DistributedOptions
    from ..execution.placement import PlacementError, detect
    from .distributed import _link_spec

    workers = r.workers or 1
    if workers == 1:
        for given, flag in ((r.compression, "--compression"), (r.link, "--link")):
            if given:
                raise RequestError(f"{flag}: a convergence task on one worker exchanges no gradients; "
                                   "give --workers 2 or more for data-parallel training")
        return None, None, None
    if r.env == "docker":
        raise RequestError("--env docker does not run multi-worker jobs yet; use --env venv or current")
    for t in tasks:
        if t.spec.batch_size % workers:
            raise RequestError(f"{suite_path}: task {t.name}: batch_size {t.spec.batch_size} does not split evenly "
                               f"over --workers {workers} (each rank trains on an equal share of the global batch)")
    methods = listed_compressions(r.compression) or []
    methods = ["none"] + [m for m in methods if m != "none"]
    link = _link_spec(r, device) if r.link is not None else None
    try:
        placement = detect(workers, available_cpus())
        threads = placement.threads_per_worker(r.threads, oversubscribe=r.oversubscribe)
    except PlacementError as e:
        raise RequestError(str(e)) from None
    jobs = DistributedOptions(device=device, env_backend=r.env, placement=placement, threads=threads,
                              scaling="strong", timeout_s=r.timeout, cache=paths.cache_dir())
    return jobs, link, methods


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
    if plan.jobs is not None:
        return _execute_data_parallel(plan, events, records)
    orch = Orchestrator(plan.store, plan.options, events)
    for run in plan.runs:
        record = execute_convergence_run(orch, run, plan.folders[run.task.name], plan.precision, events)
        records.append(record)
        events.run_done(run, record)
    lookup.refresh_index(plan.store)
    return records


def _execute_data_parallel(plan: ConvergencePlan, events, records: list[Record]) -> list[Record]:
    """The data-parallel runs: with --link the link made and measured first (events.link_ready),
    every job on it, removed however they end (as the distributed kind does); each compressed run
    compared with the dense run of its (task, framework)."""
    from ..execution.convergence import execute_convergence_run
    from ..execution.distributed import DistributedOrchestrator
    from .distributed import on_shaped_link

    dense: dict[tuple[str, str], Record] = {}
    with contextlib.ExitStack() as stack:
        options = plan.jobs
        if plan.link is not None:
            options = on_shaped_link(stack, options, plan.link, events)
        orch = DistributedOrchestrator(plan.store, options, events)
        for run in plan.runs:
            key = (run.runner.name, run.task.name)
            record = execute_convergence_run(orch, run, plan.folders[run.task.name], plan.precision, events,
                                             dense=dense.get(key))
            if run.compression == "none":
                dense[key] = record
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
