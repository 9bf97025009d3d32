"""The kinds of suite, one table: for each, which of `dlbench run`'s options it honours, its planner
and its executor. `plan_run`, `execute_run` and `run_suite` dispatch through it (the command line
and notebooks alike), so a new kind is one entry here, its workflow module and its display in
cli/run.py.

    from dlbench.workflows import RunRequest, plan_run, execute_run, run_suite
    records = run_suite(RunRequest(suite="comm", framework=["torch"], profile="smoke"))
    plan = plan_run(RunRequest(suite="kernels", framework=["jax"]))   # every check; nothing run or written
    records = execute_run(plan, events)

A planner takes the request and the command's suite catalog and returns its kind's plan (each has
`kind`, `store` and `steps`, the units of progress its executor reports) or raises RequestError
with nothing run or written; an executor takes the plan, an events object (None: none) and the list
to append each record to as it is written (a caller interrupted midway keeps what completed), and
returns the records. Each kind's events are named in its executor's docstring.

An option a kind does not honour is refused (RequestError: the option, the suite, its kind, what the
option is for and which kinds take it), never dropped: `run --suite distributed --precision amp_bf16`
used to run fp32 and say nothing. An option left at its default asks for nothing, so it is not
refused (`--compile-mode default` on a distributed suite changes nothing).

Why each kind honours what it does (an axis's option: the kinds its RequestAxis names):
  benchmark    every option but --workers, --scaling, --hosts, --data, --link and --oversubscribe, and every axis of
               today's: it is the single-process harness those options were written for.
  distributed  --precision is passed on in each job's request: torch's data-parallel runner trains
               at every run precision, JAX's at all but amp_fp16, TensorFlow's and MXNet's at fp32
               only. What a runner's step trains in is its runner.toml's [distributed] precisions:
               another is recorded as a skipped run naming them, before any job starts
               (execution/distributed.py), as a single-process run its [capabilities] exclude is.
               Refusing the option for the whole kind would hide torch's mixed-precision data
               parallelism; passing it on unchecked ran fp32 silently before. --compression the
               same way: each job's request says how its gradients are exchanged, and a method
               a runner's [distributed] compressions leave out is a skipped run giving its reason
               (compression_refused). No --compile: the data-parallel request carries none, each runner compiles
               (or not) as its own step does. No --mode, --scenario, adaptive repeats: jobs train
               for a fixed number of iterations. No equivalence check before timing (--no-check),
               no telemetry or contention options: the job launcher samples none.
               --link: the workers in network namespaces joined by a shaped link
               (execution/links.py), on this machine (so not with --hosts: refused there).
               --oversubscribe: more ranks (x threads) on a machine than it has cores, refused
               without it; the records say so (distributed.oversubscribed), as does the header.
  comm         as distributed, less --precision (collectives run in the suite's dtype),
               --compression (no gradients) and --scaling (no batch to scale).
  kernels      kernels timed per framework in each kernel's own dtype, with the profile's policy:
               no precision, compile, mode, scenario, adaptive repeats, telemetry, placement.
  convergence  trains each task to its target once per seed (--repeats: the seeds): --precision
               (one at a time) and --data (the datasets' folder); nothing else beyond the common ones.
               No --link: its tasks train on one worker (none of them is distributed yet), so a link
               would carry nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from ..axes import REQUEST_AXES
from ..definitions.catalog import SuiteCatalog
from . import lookup
from .convergence import ConvergencePlan, execute_convergence_suite, plan_convergence_suite
from .distributed import DistributedPlan, execute_distributed, plan_distributed
from .kernels import KernelPlan, execute_kernels, plan_kernels
from .requests import RequestError, RunRequest
from .run import BenchmarkPlan, execute_benchmarks, plan_benchmarks

SuitePlan = Union[BenchmarkPlan, DistributedPlan, KernelPlan, ConvergencePlan]

# each of `dlbench run`'s options (its Python name) -> (its flag, what it is for); an axis's option
# is its RequestAxis' (runners/common/contract.py REQUEST_AXES), and so are the kinds that take it
RUN_OPTIONS: dict[str, tuple[str, str]] = {
    "suite": ("--suite", "the suite to run"),
    "framework": ("--framework", "the frameworks to run it on"),
    "store": ("--store", "the results store"),
    "benchmark": ("--benchmark", "choosing some of the suite's benchmarks"),
    "profile": ("--profile", "the profile's sizes and policy"),
    "device": ("--device", "the device"),
    "env": ("--env", "the environment the workers run in"),
    "threads": ("--threads", "threads per worker"),
    "timeout": ("--timeout", "the time before a worker is killed"),
    "repeats": ("--repeats", "how often each run is repeated"),
    "max_repeats": ("--max-repeats", "adaptive repeats: adding worker processes until --target-ci holds"),
    "target_ci": ("--target-ci", "adaptive repeats: the confidence interval to reach"),
    "sample_interval": ("--sample-interval", "the telemetry sampler's interval"),
    "no_telemetry": ("--no-telemetry", "turning off the telemetry sampled beside a worker process"),
    "contention_threshold": ("--contention-threshold", "marking a worker process's repeat as contended"),
    "replace_contended": ("--replace-contended", "replacing contended repeats by fresh ones"),
    "quiet_wait": ("--quiet-wait", "waiting for other processes to quieten before a repeat"),
    "workers": ("--workers", "the workers of a multi-worker job"),
    "scaling": ("--scaling", "strong or weak scaling of a data-parallel job's batch"),
    "hosts": ("--hosts", "the hosts a multi-worker job is spread over"),
    "compile_mode": ("--compile-mode", "torch.compile's mode for compiled runs"),
    "no_check": ("--no-check", "skipping the equivalence checks made before timing"),
    "data": ("--data", "the folder of a convergence task's dataset files"),
    "link": ("--link", "a shaped link (rate, delay) between the workers of a multi-worker job"),
    "oversubscribe": ("--oversubscribe", "letting a multi-worker job's ranks share cores (time-sliced)"),
    **{field: (spec.flag, spec.purpose) for field, spec in REQUEST_AXES.items()},
}

COMMON = frozenset({"suite", "framework", "store", "benchmark", "profile", "device", "env", "threads", "timeout",
                    "repeats"})


@dataclass(frozen=True)
class SuiteKind:
    """A kind of suite (a suite file's `kind`, definitions/catalog.py SUITE_KINDS): what it runs, in
    words for an error message, which of `dlbench run`'s options it honours, its planner
    (request, catalog) -> plan and its executor (plan, events, records) -> records."""

    name: str
    runs: str
    options: frozenset[str]  # the options beyond the axes' that it honours
    plan: Callable[[RunRequest, SuiteCatalog], SuitePlan]
    execute: Callable[..., list]

    @property
    def honours(self) -> frozenset[str]:
        """Its options and the axes whose RequestAxis.suite_kinds name it."""
        return self.options | {field for field, spec in REQUEST_AXES.items() if self.name in spec.suite_kinds}


SUITE_KIND_TABLE: dict[str, SuiteKind] = {k.name: k for k in (
    SuiteKind("benchmark", "single-process benchmarks",
              frozenset(RUN_OPTIONS) - set(REQUEST_AXES) - {"workers", "scaling", "hosts", "data", "link",
                                                                   "oversubscribe"},
              plan_benchmarks,
              execute_benchmarks),
    SuiteKind("distributed", "data-parallel jobs that train for a fixed number of iterations",
              COMMON | {"workers", "scaling", "hosts", "link", "oversubscribe"}, plan_distributed, execute_distributed),
    SuiteKind("comm", "collectives in the suite's own dtype for a fixed number of iterations",
              COMMON | {"workers", "hosts", "link", "oversubscribe"}, plan_distributed, execute_distributed),
    SuiteKind("kernels", "kernels in their own dtypes, each with its profile's policy", COMMON, plan_kernels,
              execute_kernels),
    SuiteKind("convergence", "training each task to its quality target once per seed", COMMON | {"data"},
              plan_convergence_suite, execute_convergence_suite),
)}


def kind_of(request: RunRequest, suites: SuiteCatalog) -> str:
    """The kind of the request's suite ('all', and a name no suite has, are of kind benchmark, whose
    planner says which suites there are); RequestError for an option the kind does not honour."""
    path = suites.suite_path(request.suite) if request.suite != "all" else None
    kind = lookup.suite_kind(suites, path) if path is not None else "benchmark"
    refuse_options_not_honoured(request, kind, path.stem if path is not None else request.suite)
    return kind


def plan_run(request: RunRequest, suites: SuiteCatalog | None = None) -> SuitePlan:
    """Every check of `request` (an option its suite's kind does not honour first, then its kind's
    planner): the plan of its kind, or RequestError with nothing run or written. `suites`: the
    caller's catalog (one per command: each suite file parsed once), else a fresh one."""
    suites = suites or lookup.catalog()
    return SUITE_KIND_TABLE[kind_of(request, suites)].plan(request, suites)


def execute_run(plan: SuitePlan, events=None, records: list | None = None) -> list:
    """Run a plan of any kind (its kind's executor): its records, each also in the store. `events`:
    the progress events of the plan's kind (None: none); `records`: the list the records are
    appended to as they are written."""
    return SUITE_KIND_TABLE[plan.kind].execute(plan, events, records)


def run_suite(request: RunRequest, events=None) -> list:
    """Run a suite of any kind as `request` asks and return its records (each also in the store).
    RequestError for bad input, with nothing run or written."""
    return execute_run(plan_run(request), events)


def refuse_options_not_honoured(request: RunRequest, kind: str, suite: str) -> None:
    """RequestError for the first option `request` sets (away from its default) that suites of
    `kind` do not honour; `suite` is the suite's name, for the message."""
    entry = SUITE_KIND_TABLE[kind]
    for name in request.given():
        if name not in RUN_OPTIONS:
            raise KeyError(f"RunRequest.{name} has no entry in RUN_OPTIONS")  # a new option needs its row
        if name in entry.honours:
            continue
        flag, purpose = RUN_OPTIONS[name]
        takers = [k.name for k in SUITE_KIND_TABLE.values() if name in k.honours]
        raise RequestError(f"{flag} is not taken by suite {suite!r} of kind {kind} ({entry.runs}): {flag} is for "
                           f"{purpose}, which suites of kind {' and '.join(takers)} take")
