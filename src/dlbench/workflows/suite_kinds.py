"""Which of `dlbench run`'s options each suite kind honours: one table, read before anything runs.

An option a kind does not honour is refused (RequestError: the option, the suite, its kind, what the
option is for and which kinds take it), never dropped: `run --suite distributed --precision amp_bf16`
used to run fp32 and say nothing. An option left at its default asks for nothing, so it is not
refused (`--compile-mode default` on a distributed suite changes nothing).

Why each kind honours what it does (an axis's option: the kinds its RequestAxis names):
  benchmark    every option but --workers, --scaling, --hosts and --data, and every axis of today's:
               it is the single-process harness those options were written for.
  distributed  --precision is passed on in each job's request: torch's data-parallel runner trains
               at every run precision, JAX's at all but amp_fp16, TensorFlow's and MXNet's at fp32
               only. What a runner's step trains in is its runner.toml's [distributed] precisions:
               another is recorded as a skipped run naming them, before any job starts
               (execution/distributed.py), as a single-process run its [capabilities] exclude is.
               Refusing the option for the whole kind would hide torch's mixed-precision data
               parallelism; passing it on unchecked ran fp32 silently before. No --compile: the data-parallel request carries none, each runner compiles
               (or not) as its own step does. No --mode, --scenario, adaptive repeats: jobs train
               for a fixed number of iterations. No equivalence check before timing (--no-check),
               no telemetry or contention options: the job launcher samples none.
  comm         as distributed, less --precision (collectives run in the suite's dtype) and
               --scaling (no batch to scale).
  kernels      kernels timed per framework in each kernel's own dtype, with the profile's policy:
               no precision, compile, mode, scenario, adaptive repeats, telemetry, placement.
  convergence  trains each task to its target once per seed (--repeats: the seeds): --precision
               (one at a time) and --data (the datasets' folder); nothing else beyond the common ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..axes import REQUEST_AXES
from .requests import RunRequest

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
    **{field: (spec.flag, spec.purpose) for field, spec in REQUEST_AXES.items()},
}

COMMON = frozenset({"suite", "framework", "store", "benchmark", "profile", "device", "env", "threads", "timeout",
                    "repeats"})


@dataclass(frozen=True)
class SuiteKind:
    """A kind of suite (a suite file's `kind`, definitions/catalog.py SUITE_KINDS): what it runs, in
    words for an error message, and which of `dlbench run`'s options it honours."""

    name: str
    runs: str
    options: frozenset[str]  # the options beyond the axes' that it honours

    @property
    def honours(self) -> frozenset[str]:
        """Its options and the axes whose RequestAxis.suite_kinds name it."""
        return self.options | {field for field, spec in REQUEST_AXES.items() if self.name in spec.suite_kinds}


SUITE_KIND_TABLE: dict[str, SuiteKind] = {k.name: k for k in (
    SuiteKind("benchmark", "single-process benchmarks",
              frozenset(RUN_OPTIONS) - set(REQUEST_AXES) - {"workers", "scaling", "hosts", "data"}),
    SuiteKind("distributed", "data-parallel jobs that train for a fixed number of iterations",
              COMMON | {"workers", "scaling", "hosts"}),
    SuiteKind("comm", "collectives in the suite's own dtype for a fixed number of iterations",
              COMMON | {"workers", "hosts"}),
    SuiteKind("kernels", "kernels in their own dtypes, each with its profile's policy", COMMON),
    SuiteKind("convergence", "training each task to its quality target once per seed", COMMON | {"data"}),
)}


class RequestError(ValueError):
    """A request that cannot run as asked (one message naming what and why); nothing was run or
    written. The command line prints it and exits 2."""


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
