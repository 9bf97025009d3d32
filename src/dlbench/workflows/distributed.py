"""The suite kinds `distributed` (data-parallel training jobs) and `comm` (collectives): their
planner and executor, entries of suite_kinds.py's table (`run_suite` and `dlbench run` dispatch
through it, refusing first the options these kinds do not honour).

`plan_distributed(request, catalog)` checks what the table cannot: the environment backend, the
scaling, the precisions, the benchmarks, the placement (--workers, --hosts, Slurm), threads per
worker against the cores (unless --oversubscribe), strong scaling's even split of every batch, --link (its form, two
workers at least, this machine, the CPU, root); then it opens the store (RequestError for bad
input, nothing run or written). `execute_distributed(plan, events)` runs every job, each record
written to the store as it ends, printing nothing; with --link it first makes the link
(execution/links.py), measures it (events.link_ready(link, measured)), runs every job on it and
removes it however the jobs end (LinkError where it cannot be made):

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="comm", framework=["torch"], profile="smoke", workers=2))
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import paths
from ..axes import Parallelism, Precision
from ..definitions.catalog import SuiteCatalog
from ..definitions.loader import DefinitionError
from ..execution.registry import RunnerInfo
from ..machine import available_cpus, fingerprint
from ..store.store import Store
from . import lookup
from .events import Silent
from .lookup import check_choice, listed_choices, listed_compressions
from .requests import RequestError, RunRequest

if TYPE_CHECKING:
    # imported where used: the job launcher and the model are for these kinds only
    from ..definitions.distributed import CommBenchmark, DistributedBenchmark, DistributedSuite
    from ..execution.distributed import DistributedOptions
    from ..execution.links import LinkSpec
    from ..store.record import Record

SCALINGS = ("strong", "weak")
DEFAULT_WORKERS = 2


@dataclass(frozen=True)
class DistributedPlan:
    """A checked request of kind distributed or comm: the jobs to run, where, and on what."""

    request: RunRequest
    kind: str  # distributed | comm
    suite: DistributedSuite
    benchmarks: list[DistributedBenchmark]  # kind distributed: one per (benchmark, precision, compression asked)
    comm: CommBenchmark | None  # kind comm: the collectives asked
    runners: list[RunnerInfo]
    options: DistributedOptions
    store: Store
    steps: int  # the records the plan writes: its progress (events.run_done)
    predicted_from: str  # kind distributed: where the predictions come from, or why there are none
    link: LinkSpec | None = None  # --link: the jobs run on a shaped link, made when they start


def plan_distributed(request: RunRequest, suites: SuiteCatalog | None = None) -> DistributedPlan:
    """Every check of a request of kind distributed or comm (the suite file's kind says which), the
    placement detected, the store opened (checked writable): RequestError otherwise, nothing run or
    written. The options these kinds do not honour are refused before, by suite_kinds.plan_run."""
    from ..definitions.distributed import batches
    from ..execution.distributed import DistributedOptions, planned_runs
    from ..execution.placement import PlacementError, detect
    from ..performance.runtime import run_predictor

    r = request
    suites = suites or lookup.catalog()
    registry, names = lookup.runs_on(r)
    suite_path = suites.suite_path(r.suite)
    device = lookup.resolved_device(r.device)
    if r.env == "docker":
        raise RequestError("--env docker does not run distributed jobs yet; use --env venv or current")
    if r.scaling is not None:
        check_choice("scaling", r.scaling, list(SCALINGS))
    precisions = listed_choices("precision", r.precision, Precision.runs())
    compressions = listed_compressions(r.compression)  # RequestError: one that does not parse
    parallelisms = listed_choices("parallelism", r.parallelism, Parallelism.runs())
    try:
        suite = suites.load_distributed_suite(suite_path, r.profile, device)
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    kind = suite.kind
    chosen = list(suite.benchmarks)
    if r.benchmark:
        valid = sorted({b.name for b in chosen} | {b.network.name for b in chosen}) if kind == "distributed" \
            else list(suite.comm.collectives)
        for name in r.benchmark:
            check_choice("benchmark", name, valid)
        if kind == "distributed":
            chosen = [b for b in chosen if b.name in r.benchmark or b.network.name in r.benchmark]
    if precisions is not None:  # each benchmark once per precision asked; a runner's refusal is recorded
        chosen = [dataclasses.replace(b, precision=p) for b in chosen for p in precisions]
    if compressions is not None:  # and once per compression asked, a runner's refusal recorded as well
        chosen = [dataclasses.replace(b, compression=c) for b in chosen for c in compressions]
    if parallelisms is not None:  # and once per parallelism asked (expert: checked below, with the workers)
        chosen = [dataclasses.replace(b, parallelism=p) for b in chosen for p in parallelisms]
    comm = suite.comm
    if comm is not None and r.benchmark:
        comm = dataclasses.replace(comm, collectives=tuple(c for c in comm.collectives if c in r.benchmark))
    link = _link_spec(r, device) if r.link is not None else None
    try:
        placement = detect(r.workers or DEFAULT_WORKERS, available_cpus(), r.hosts)
        threads = placement.threads_per_worker(r.threads, oversubscribe=r.oversubscribe)
    except PlacementError as e:
        raise RequestError(str(e)) from None
    scaling = r.scaling or suite.scaling
    _check_expert_parallel(chosen, placement.workers, suite_path, suite.benchmarks)
    for b in chosen:
        for batch in b.batch_sizes:
            try:
                batches(batch, placement.workers, scaling)
            except ValueError as e:
                raise RequestError(f"{suite_path}: benchmarks: {b.network.name}: {e}") from None
    runners = [lookup.runner(registry, n) for n in names]
    # once the options hold (a refused option leaves no store behind), before the first job
    store = lookup.writable_store(r.store)
    remote = any(not h.local for h in placement.hosts)
    predictor, predicted_from = run_predictor(store, fingerprint()["machine_id"], device, threads,
                                              {x.name: x.model for x in runners})
    options = DistributedOptions(device=device, env_backend=r.env, placement=placement, threads=threads,
                                 scaling=scaling, timeout_s=r.timeout, cache=paths.cache_dir(),
                                 job_root=(store.root / ".jobs") if remote else None, repeats=r.repeats,
                                 predictor=predictor if kind == "distributed" else None)
    steps = sum(planned_runs(chosen, comm, placement.workers) for _ in runners)
    return DistributedPlan(r, kind, suite, chosen, comm, runners, options, store, steps, predicted_from, link)


def _check_expert_parallel(chosen: list[DistributedBenchmark], workers: int, suite_path,
                           suite_benchmarks=()) -> None:
    """--parallelism expert asks for something only a network with Mixture-of-Experts layers has,
    sharded whole over two workers at least: a network without experts, too few workers, experts
    that do not split evenly over them, or a gradient compression (data parallelism's) with it are
    refused before anything runs."""
    from ..definitions.distributed import moe_experts

    expert = [b for b in chosen if b.parallelism == Parallelism.EXPERT.value]
    if not expert:
        return
    if workers < 2:
        raise RequestError(f"--parallelism expert shards the experts over 2 workers at least (--workers {workers})")
    for b in expert:
        experts = moe_experts(b.network.resolved)
        if not experts:
            with_experts = sorted({c.network.name for c in (*chosen, *suite_benchmarks)
                                   if moe_experts(c.network.resolved)})
            hint = (f"choose {', '.join(with_experts)} with --benchmark" if with_experts
                    else "this suite has none")
            raise RequestError(f"{suite_path}: benchmarks: {b.network.name}: --parallelism expert needs "
                               f"Mixture-of-Experts layers to shard, and {b.network.name} has none ({hint})")
        if b.compression != "none":
            raise RequestError(f"--parallelism expert with --compression {b.compression}: an expert-parallel job "
                               "all-reduces the gradients of the weights it does not shard densely (compression "
                               "is data parallelism's); ask for the two in separate runs")
        uneven = sorted({e for e in experts if e % workers})
        if uneven:
            raise RequestError(f"{suite_path}: benchmarks: {b.network.name}: --parallelism expert: "
                               f"{uneven[0]} experts do not split evenly over {workers} workers")


def _link_spec(r: RunRequest, device: str) -> LinkSpec:
    """--link checked before anything runs: its form, two workers at least, this machine, the CPU,
    root."""
    from ..execution.links import parse_link, refusal

    try:
        spec = parse_link(r.link)
    except ValueError as e:
        raise RequestError(str(e)) from None
    workers = r.workers or DEFAULT_WORKERS
    if workers < 2:
        raise RequestError(f"--link {r.link}: a link joins two workers at least (--workers {workers})")
    if r.hosts is not None:
        raise RequestError("--link shapes a link between workers on this machine; it does not reach --hosts")
    if device != "cpu":
        raise RequestError(f"--link runs CPU jobs only (--device cpu): on {device}, NCCL moves the traffic of ranks "
                           "on one machine through shared memory and the GPUs' own links, never through the shaped one")
    why = refusal(spec)
    if why:
        raise RequestError(why)
    return spec


def on_shaped_link(stack: contextlib.ExitStack, options: DistributedOptions, asked, events) -> DistributedOptions:
    """`options` with its workers on a shaped link of the kind `asked` (execution.links): the link
    made for them and removed when `stack` closes, however it closes; measured, announced
    (events.link_ready), and recorded in the options with each worker's address and namespace."""
    from ..execution.links import shaped_link
    from ..execution.placement import namespace_placement
    from ..execution.wire import measure

    link = stack.enter_context(shaped_link(asked, options.placement.workers))
    measured = measure(link)
    events.link_ready(link, measured)
    return dataclasses.replace(options, link=link, link_measured=measured, placement=namespace_placement(
        [link.address(i) for i in range(link.workers)], [link.namespace(i) for i in range(link.workers)],
        options.placement.hosts[0].cpus))


def execute_distributed(plan: DistributedPlan, events=None, records: list[Record] | None = None) -> list[Record]:
    """Every job of the plan, framework by framework, each record written to the store as it ends;
    the store's row index brought up to date after the last. `events`: environment(framework,
    progress), run_started(label, repeats), repeat_done(label, index, status), run_done(label,
    record); None: none. `records`: the list the records are appended to as they are written (a
    caller interrupted midway keeps what completed)."""
    from ..execution.distributed import DistributedOrchestrator

    records = [] if records is None else records
    events = events or Silent()
    with contextlib.ExitStack() as stack:
        options = plan.options
        if plan.link is not None:
            options = on_shaped_link(stack, options, plan.link, events)
        orch = DistributedOrchestrator(plan.store, options, events)
        for runner in plan.runners:
            if plan.kind == "distributed":
                for b in plan.benchmarks:
                    records += orch.run_distributed(runner, b)
            else:
                records += orch.run_comm(runner, plan.comm)
    lookup.refresh_index(plan.store)
    return records
