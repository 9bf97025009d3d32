"""The suite kind `benchmark` (suites of single-process benchmarks): its planner and its executor,
the entry of workflows/suite_kinds.py's table that `run_suite` and `dlbench run` dispatch through.

`plan_benchmarks(request, catalog)` makes every check (the store opened; RequestError for bad input,
nothing run or written) and returns the plan; `execute_benchmarks(plan, events)` runs it, every run
recorded in the store, reporting through the events object and printing nothing. Both are called
through suite_kinds.py's `plan_run` and `execute_run`, which first refuse the options this kind does
not honour:

    from dlbench.workflows import RunRequest, run_suite
    records = run_suite(RunRequest(suite="fcn", framework=["torch"], profile="smoke"))
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import paths
from ..axes import SERIES_AXES, Mode, RequestAxis, Scenario
from ..definitions.catalog import SuiteCatalog
from ..definitions.suite import Benchmark, Suite
from ..execution.registry import RunnerInfo, RunnerRegistry
from ..machine import available_cpus, fingerprint, gpus
from ..store.store import Store
from ..telemetry import TelemetryConfig
from . import lookup
from .events import Silent
from .lookup import check_choice, listed_choices
from .requests import RequestError, RunRequest

if TYPE_CHECKING:
    from ..execution.orchestrator import PlannedRun, RunOptions
    from ..store.record import Record

TORCH_COMPILE_MODES = ("default", "max-autotune")


@dataclass(frozen=True)
class BenchmarkPlan:
    """A checked request of kind benchmark: what will run, where, and how it is predicted."""

    request: RunRequest
    suites: list[Suite]
    runners: list[RunnerInfo]
    registry: RunnerRegistry
    runs: list[PlannedRun]
    options: RunOptions
    store: Store
    predicted_from: str  # where the predictions come from, or why there are none
    kind = "benchmark"

    @property
    def steps(self) -> int:
        """The steps of its progress (events.run_done): one per run."""
        return len(self.runs)


def plan_benchmarks(request: RunRequest, suites: SuiteCatalog | None = None) -> BenchmarkPlan:
    """Every check of a request of kind benchmark, the benchmarks chosen and crossed with the axes
    asked for, the runs planned, the store opened (checked writable): RequestError otherwise, with
    nothing run or written. `suites`: the caller's catalog (one per command), else a fresh one.
    The options the kind does not honour are refused before, by suite_kinds.plan_run."""
    # imported here: the orchestrator brings statistics and scipy, which other commands need not load
    from ..execution.orchestrator import RunOptions, check_repeat_options, plan
    from ..performance.runtime import run_predictor

    r = request
    suites = suites or lookup.catalog()
    registry, names = lookup.runs_on(r)
    path = suites.suite_path(r.suite) if r.suite != "all" else None
    if path is not None and lookup.suite_kind(suites, path) != "benchmark":
        raise RequestError(f"suite {r.suite!r} is not of kind benchmark; run it with `dlbench run`")
    for m in r.mode or []:
        check_choice("mode", m, Mode.names())
    asked = {spec.field: axis_values(spec, getattr(r, spec.field)) for spec in SERIES_AXES}
    check_choice("torch.compile mode", r.compile_mode, TORCH_COMPILE_MODES)
    device = lookup.resolved_device(r.device)
    loaded = lookup.load_suites(suites, r.suite, r.profile, device, tuple(r.mode) if r.mode else None)
    selected = _chosen(loaded, r, suites, device)
    selected = with_axes(selected, asked)
    scenarios = listed_choices("scenario", r.scenario, Scenario.names())
    if scenarios is not None:
        selected = with_scenarios(_scenario_benchmarks(selected, scenarios, r), scenarios)
    try:
        check_repeat_options(r.repeats, r.max_repeats, r.target_ci, selected)
    except ValueError as e:
        raise RequestError(str(e)) from None
    runners = [lookup.runner(registry, n) for n in names]
    options = RunOptions(device=device, env_backend=r.env, threads=r.threads or available_cpus(),
                         repeats=r.repeats, timeout_s=r.timeout, cache=paths.cache_dir(),
                         telemetry=None if r.no_telemetry else telemetry_config(device, r.sample_interval),
                         nvml_module=os.environ.get("DLBENCH_NVML_MODULE", "pynvml"),
                         max_repeats=r.max_repeats, target_ci_pct=r.target_ci, compile_mode=r.compile_mode,
                         contention_threshold_pct=r.contention_threshold, max_replacements=r.replace_contended,
                         quiet_wait_s=r.quiet_wait)
    runs = plan(runners, selected)
    store = lookup.writable_store(r.store)  # before the first benchmark: a record must have a place
    predictor, predicted_from = run_predictor(store, fingerprint()["machine_id"], device, options.threads,
                                              {x.name: x.model for x in runners})
    options = dataclasses.replace(options, predictor=predictor)
    return BenchmarkPlan(r, loaded, runners, registry, runs, options, store,
                         predicted_from if predictor else "none, " + predicted_from)


def execute_benchmarks(plan: BenchmarkPlan, events=None, records: list[Record] | None = None) -> list[Record]:
    """Make the equivalence checks the plan lacks (unless the request says no_check), then every
    run, each recorded in the store as it ends; the store's row index brought up to date after the
    last. `events`: the orchestrator's progress events (environment, check_started, run_started,
    repeat_done, run_done) and checks_made(made, seconds) (the checks made before timing and their
    cost); None: none. `records`: the list the records are appended to as they are written (a caller
    interrupted midway keeps what completed)."""
    from ..execution.orchestrator import Orchestrator

    events = events or Silent()
    records = [] if records is None else records
    orch = Orchestrator(plan.store, plan.options, events)
    if not plan.request.no_check:
        reference = plan.registry.get("torch") if "torch" in plan.registry.names() else None
        made, seconds = orch.check_equivalence(plan.runs, reference)
        events.checks_made(made, seconds)
    for run in plan.runs:
        records.append(orch.execute_one(run))
    lookup.refresh_index(plan.store)
    return records


def _chosen(loaded: list[Suite], r: RunRequest, suites: SuiteCatalog, device: str) -> list[Benchmark]:
    """The benchmarks `--benchmark` names (a benchmark named with its mode runs even where the
    profile would skip that mode), and the check that `--mode generate` has one that generates."""
    available = [b for s in loaded for b in s.benchmarks]
    selected = available
    if r.benchmark:
        every_mode = [b for s in lookup.load_suites(suites, r.suite, r.profile, device, tuple(r.mode or Mode.names()))
                      for b in s.benchmarks]
        valid = sorted({b.name for b in every_mode} | {b.network.name for b in every_mode})
        for name in r.benchmark:
            check_choice("benchmark", name, valid)
        chosen = {b.name for b in available}
        selected = [b for b in every_mode
                    if b.name in r.benchmark or (b.network.name in r.benchmark and b.name in chosen)]
    if r.mode and Mode.GENERATE in r.mode and not any(b.mode == Mode.GENERATE for b in selected):
        decoders = [f"{s.name}: {', '.join(b.network.name for b in s.benchmarks if b.mode == Mode.GENERATE)}"
                    for s in lookup.load_suites(suites, "all", r.profile, device, (Mode.GENERATE.value,))
                    if any(b.mode == Mode.GENERATE for b in s.benchmarks)]
        raise RequestError(f"--mode generate: suite {r.suite!r} has no benchmark that generates (only decoder "
                           f"networks do, where a suite lists mode generate with its sizes: "
                           f"{'; '.join(decoders) or 'none'})")
    return selected


def _scenario_benchmarks(selected: list[Benchmark], scenarios: list[str], r: RunRequest) -> list[Benchmark]:
    """`--scenario`'s checks: LoadGen runs inference (generation: the server scenario only), one
    worker whose measurement LoadGen's settings make (no repeats)."""
    training = sorted({b.name for b in selected if b.mode not in (Mode.INFER, Mode.GENERATE)})
    if training:
        raise RequestError(f"--scenario runs inference under LoadGen, but {', '.join(training)} "
                           f"{'is' if len(training) == 1 else 'are'} training (add --mode infer, or --mode generate "
                           "for a decoder's server scenario)")
    not_server = [s for s in scenarios if s != Scenario.SERVER]
    if not_server and any(b.mode == Mode.GENERATE for b in selected):
        raise RequestError(f"--scenario {','.join(not_server)}: generation (--mode generate) runs LoadGen's server "
                           "scenario only, bounded by time to first token and per output token (--scenario server)")
    for option, value in (("--repeats", r.repeats), ("--max-repeats", r.max_repeats), ("--target-ci", r.target_ci)):
        if value is not None:
            raise RequestError(f"{option} does not apply to --scenario: a LoadGen run is one worker, and LoadGen's "
                               "duration and query counts (the profile's `loadgen`) make its measurement")
    return selected


def telemetry_config(device: str, interval_ms: float) -> TelemetryConfig:
    """A cpu run samples no GPU where the host has some (they are not what is measured); on a host
    without any it still asks NVML, so the record says why GPU telemetry is unavailable."""
    host_has_gpus = bool(gpus()["gpus"])
    indices = () if device == "cpu" and host_has_gpus else None
    return TelemetryConfig(interval_s=interval_ms / 1000, gpu_indices=indices)


def with_scenarios(benchmarks: list[Benchmark], scenarios: list[str]) -> list[Benchmark]:
    """Each (inference) benchmark once per LoadGen scenario, in order; the batch a scenario's worker
    is prepared at is the largest it runs (LoadGenPolicy.batch_sizes), not the suite's."""
    return [dataclasses.replace(b, scenario=s, batch_sizes=(max(b.policy.loadgen.batch_sizes(s, b.mode)),))
            for b in benchmarks for s in scenarios]


def axis_values(spec: RequestAxis, given: list[str] | None) -> list[str] | None:
    """An axis's option checked (names, comma lists, 'all': every value a run may ask for, so not
    `default` beside the two compile modes); None where it was not given."""
    valid = [v.value for v in spec.axis.runs()]
    values = listed_choices(spec.noun, given, ["default", *valid] if spec.runner_default else valid)
    if values is not None and any(v.strip() == "all" for item in given for v in item.split(",")):
        return valid
    return values


def with_axes(benchmarks: list[Benchmark], asked: dict[str, list[str] | None]) -> list[Benchmark]:
    """The axes' options (`--precision`, `--compile`, ...: field -> values, None where not given)
    replace the benchmarks' own: every benchmark once per combination of the values asked, in
    order; an axis not given keeps the suite's values."""
    if all(values is None for values in asked.values()):
        return benchmarks
    out: list[Benchmark] = []
    seen: set[tuple] = set()
    for b in benchmarks:
        for values in itertools.product(*(asked[f] or [getattr(b, f)] for f in asked)):
            key = (b.suite, b.name, *values)
            if key not in seen:
                seen.add(key)
                out.append(dataclasses.replace(b, **dict(zip(asked, values))))
    return out

