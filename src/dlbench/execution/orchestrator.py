"""Run benchmarks on frameworks: environments, one worker process per repeat, one record per run.

A run is one (framework, benchmark, batch size). Each repeat is a fresh worker process, so every
repeat pays and records its own first iteration and warm-up. Whatever a worker does (crash, hang,
out of memory, skip), the run is recorded with its status and reason and the plan goes on.

Repeats are fixed (the profile's, or --repeats) or adaptive (--target-ci with --max-repeats): from
the fixed number on, after every repeat the median's confidence interval is recomputed and the run
stops once its half-width is within the target, or at the cap. The record's `repeat_policy` says
which, and why the run stopped.

Contention (telemetry/contention.py): with telemetry on, each repeat's measured window says how much
CPU other processes took; above `contention_threshold_pct` the repeat is contended and, while
`max_replacements` allows, kept with status `contended` (its iterations counted nowhere) and
replaced by a fresh repeat. `quiet_wait_s` waits before each repeat for the other processes to
fall under the threshold. Before timing, `check_equivalence` makes the equivalence checks the plan
lacks (execution/equivalence.py: ensure_checks); each record carries the status of its check.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

import psutil

from ..analysis.generation import summarise_generation
from ..analysis.timing import summarise
from ..axes import REQUEST_AXES
from ..definitions.suite import Benchmark
from ..machine import dlbench_provenance, fingerprint
from ..performance import yardstick
from ..store.checks import CheckStore
from ..store.intervals import reported_interval
from ..telemetry.contention import DEFAULT_THRESHOLD_PCT, wait_for_quiet, window_contention
from ..store.loadgen import LoadGenLogError, collect_logs, metric_of, read_detail, result_of, write_logs
from ..store.record import LoadGenInfo, NetworkInfo, Record, Repeat, RepeatPolicy, Settings, Workload, new_run_id
from ..store.store import Store
from ..telemetry import Sampler, TelemetryConfig, derive
from ..telemetry.summary import summarise_repeats
from .backends import Environments, backend
from .environments import BuildProgress, Environment, EnvironmentBuildError
from .interrupts import shielded, temporary_folder
from .equivalence import CheckMade, CheckWanted, ensure_checks
from .launcher import PROTOCOL_VERSION, run_worker, thread_env
from .registry import RunnerInfo


@dataclass(frozen=True)
class RunOptions:
    device: str  # cpu | cuda (already resolved from auto)
    env_backend: str
    threads: int | None
    repeats: int | None  # None: the profile's
    timeout_s: float
    cache: Path
    seed: int = 0
    telemetry: TelemetryConfig | None = None  # None: no sampling (--no-telemetry)
    nvml_module: str = "pynvml"  # the NVML binding the sampler imports (tests substitute a fake)
    max_repeats: int | None = None  # adaptive repeats: the cap (None: fixed repeats)
    target_ci_pct: float | None = None  # adaptive repeats: stop when the reported interval's half-width is this % of the median
    # the performance model's prediction of a run (a dict of store.record.Prediction), made before
    # it runs and kept in its record (performance/runtime.py: RunPredictor); None: nothing predicted
    predictor: Callable[..., dict | None] | None = None
    # a canonical (x, y) .npz every worker trains on instead of its own synthetic batch (the runners
    # load it as `dlbench check` has them do); benchmarks/fairness.py gives both sides the same batch
    inputs: Path | None = None
    compile_mode: str = "default"  # torch.compile's mode for compiled runs (--compile-mode)
    # contention: a repeat whose window had other processes above this share of the worker's cores
    # (or steal above it) is contended; up to max_replacements such repeats per run are replaced by
    # fresh ones (0: marked only); quiet_wait_s: wait up to this long for a quiet machine before
    # each repeat (0: no waiting)
    contention_threshold_pct: float = DEFAULT_THRESHOLD_PCT
    max_replacements: int = 0
    quiet_wait_s: float = 0.0
    total_cores: int | None = None  # the machine's logical CPUs (None: psutil's count)

    def __post_init__(self):
        if (self.max_repeats is None) != (self.target_ci_pct is None):
            raise ValueError("adaptive repeats need both max_repeats and target_ci_pct")

    @property
    def adaptive(self) -> bool:
        return self.target_ci_pct is not None

    def repeat_bounds(self, benchmark: Benchmark) -> tuple[int, int]:
        """(repeats before the first check, most repeats); equal when repeats are fixed."""
        minimum = self.repeats or benchmark.policy.repeats
        return minimum, self.max_repeats if self.adaptive else minimum


def check_repeat_options(repeats: int | None, max_repeats: int | None, target_ci_pct: float | None,
                         benchmarks: list[Benchmark]) -> None:
    """ValueError naming the option when the repeat options do not make sense together."""
    if max_repeats is None and target_ci_pct is None:
        return
    if target_ci_pct is None:
        raise ValueError("--max-repeats needs --target-ci PCT (the confidence-interval half-width to stop at)")
    if max_repeats is None:
        raise ValueError("--target-ci needs --max-repeats N (the most worker processes per run)")
    if not 0 < target_ci_pct < 100:
        raise ValueError(f"--target-ci must be a percentage between 0 and 100 (exclusive), not {target_ci_pct:g}")
    for b in benchmarks:
        minimum = repeats or b.policy.repeats
        source = "--repeats" if repeats else f"profile {b.profile!r} repeats"
        if minimum < 2:
            raise ValueError(f"--target-ci needs at least 2 repeats before the first check ({source} is "
                             f"{minimum}): one worker process cannot show process-to-process variation")
        if max_repeats < minimum:
            raise ValueError(f"--max-repeats {max_repeats} is below the minimum number of repeats "
                             f"({source} is {minimum})")


@dataclass(frozen=True)
class PlannedRun:
    runner: RunnerInfo
    benchmark: Benchmark
    batch_size: int

    @property
    def compile(self) -> str:
        """eager | compiled: the benchmark's mode as this runner resolves it ("default": its own)."""
        return self.runner.compile_mode(self.benchmark.compile)

    @property
    def axes(self) -> dict[str, str | None]:
        """The value of each axis (REQUEST_AXES) this run has, as its runner resolves it: a
        benchmark's `default` (RequestAxis.runner_default) is the runner's own value."""
        b = self.benchmark
        return {field: self.compile if spec.runner_default else getattr(b, field)
                for field, spec in REQUEST_AXES.items()}

    @property
    def refusal(self) -> str | None:
        """Why the runner cannot run this benchmark, from its runner.toml [capabilities] (the first
        axis value it does not list), or None: a refused run starts no worker."""
        for field, value in self.axes.items():
            spec = REQUEST_AXES[field]
            if spec.capability is None or value is None:
                continue
            why = self.runner.capabilities.refusal(self.runner.name, spec.axis(value))
            if why:
                return why
        return None


class Events(Protocol):
    def environment(self, framework: str, progress: BuildProgress) -> None: ...
    def check_started(self, network: str, precision: str, frameworks: list[str]) -> None: ...
    def run_started(self, run: PlannedRun, repeats: int) -> None: ...
    def repeat_done(self, run: PlannedRun, repeat: Repeat) -> None: ...
    def run_done(self, run: PlannedRun, record: Record) -> None: ...


class SilentEvents:
    def environment(self, framework, progress): pass
    def check_started(self, network, precision, frameworks): pass
    def run_started(self, run, repeats): pass
    def repeat_done(self, run, repeat): pass
    def run_done(self, run, record): pass


def _reported_half_width(summary, batch_size: int) -> float | None:
    """The half-width (% of the median) of the interval the tables show for this summary."""
    shown = reported_interval(summary, batch_size)
    return shown.half_width_pct if shown is not None else None


def _workload(b: Benchmark, run: PlannedRun, opts: RunOptions) -> Workload:
    """What a record says was run: the benchmark's mode, batch, precision and compile mode as
    resolved for the runner, and its LoadGen scenario (None: the harness's own timing)."""
    return Workload(batch_size=run.batch_size, compile_requested=b.compile,
                    compile_mode=opts.compile_mode if run.compile == "compiled" else None,
                    learning_rate=b.learning_rate, momentum=b.momentum, device=opts.device, **run.axes)


def plan(runners: list[RunnerInfo], benchmarks: list[Benchmark]) -> list[PlannedRun]:
    """Every (runner, benchmark, batch size). Benchmarks that differ only in an axis run side by side
    (RequestAxis.side_by_side: the compile mode) run one after the other at each batch size, so
    their ratio is measured side by side (the machine's state drifts less between neighbours than
    across the whole invocation); a value that resolves to one already planned for the runner
    (compile "default" and the runner's own) runs once."""
    apart = [field for field, spec in REQUEST_AXES.items() if not spec.side_by_side]
    groups: dict[tuple, list[Benchmark]] = {}
    for b in benchmarks:
        groups.setdefault((b.suite, b.name, b.batch_sizes, *(getattr(b, f) for f in apart)), []).append(b)
    runs, seen = [], set()
    for r in runners:
        for group in groups.values():
            for bs in group[0].batch_sizes:
                for b in group:
                    run = PlannedRun(r, b, bs)
                    key = (r.name, b.suite, b.name, bs, *run.axes.values())
                    if key not in seen:
                        seen.add(key)
                        runs.append(run)
    return runs


def loadgen_settings(benchmark: Benchmark) -> dict:
    """What a LoadGen run's worker is given (and its record keeps): the profile's LoadGen policy,
    the scenario and the batch sizes it runs (runners/common/loadgen_harness.py)."""
    policy = benchmark.policy.loadgen
    return {**policy.model_dump(), "scenario": benchmark.scenario,
            "batch_sizes": policy.batch_sizes(benchmark.scenario, benchmark.mode)}


def build_request(run: PlannedRun, options: RunOptions) -> dict:
    b = run.benchmark
    return {
        "protocol": PROTOCOL_VERSION,
        "action": "loadgen" if b.scenario else "benchmark",
        **({"loadgen": loadgen_settings(b)} if b.scenario else {}),
        "network": b.network.resolved,
        **{field: value for field, value in run.axes.items() if value is not None},
        "batch_size": run.batch_size,
        **({"compile_mode": options.compile_mode} if run.compile == "compiled" else {}),
        "device": options.device,
        "threads": options.threads,
        "learning_rate": b.learning_rate,
        "momentum": b.momentum,
        "seed": options.seed,
        "policy": {"warmup": b.policy.warmup.model_dump(), "measure": b.policy.measure.model_dump()},
        **({} if b.scenario else {"yardstick": yardstick.request()}),
        **({"inputs": str(options.inputs)} if options.inputs is not None else {}),
        **({"generation": {"prompt_length": b.generation.prompt_length, "new_tokens": b.generation.new_tokens}}
           if b.mode == "generate" and b.generation is not None else {}),
    }


class Orchestrator:
    def __init__(self, store: Store, options: RunOptions, events: Events | None = None):
        self.store = store
        self.options = options
        self.events = events or SilentEvents()
        self.environments = Environments(backend(options.env_backend, options.cache), options.device,
                                         self.events.environment)

    def environment(self, runner: RunnerInfo) -> Environment | EnvironmentBuildError:
        return self.environments.get(runner)

    def _telemetry_summary(self, repeats: list[Repeat], batch_size: int) -> dict:
        if self.options.telemetry is None:
            return {"enabled": False, "reason": "--no-telemetry"}
        measured = [r for r in repeats if r.derived is not None]
        gpu = next((r.telemetry["gpu"] for r in repeats if r.telemetry and "gpu" in r.telemetry), None)
        return {
            "enabled": True,
            "interval_s": self.options.telemetry.interval_s,
            "gpu": {"available": gpu["available"], "reason": gpu["reason"]} if gpu else None,
            "summary": summarise_repeats([r.derived for r in measured], batch_size,
                                         [len(r.iter_s) for r in measured]) if measured else None,
        }

    def check_equivalence(self, runs: list[PlannedRun], reference: RunnerInfo | None = None,
                          timeout_s: float = 900) -> tuple[list[CheckMade], float]:
        """Before timing: the equivalence checks these runs lack, made and stored; ([checks], seconds)."""
        wanted = [CheckWanted(r.runner, r.benchmark.network, r.benchmark.precision, r.benchmark.learning_rate,
                              r.benchmark.momentum) for r in runs if r.benchmark.network.resolved.get("layers")]
        return ensure_checks(wanted, self.environment, CheckStore(self.store.root), self.options.device, reference,
                             min(timeout_s, self.options.timeout_s), self.events.check_started)

    def _contention(self, series: dict | None, window: list, derived: dict | None, waited: dict | None) -> dict | None:
        """The repeat's contention (telemetry/contention.py), with its quiet wait; None without telemetry."""
        opts = self.options
        if series is None:
            return None
        total = opts.total_cores or psutil.cpu_count() or 1
        given = min(opts.threads or total, total)
        if series.get("error") or not window:
            out = {"measured": False, "reason": series.get("error") or "no measured window",
                   "threshold_pct": opts.contention_threshold_pct, "contended": False}
        else:
            out = window_contention(series["cpu"], series["t_ns"], tuple(window), given, total,
                                    opts.contention_threshold_pct, (derived or {}).get("mean_steal_pct"))
        if waited is not None:
            out["quiet_wait"] = waited
        return out

    def execute(self, runs: list[PlannedRun]) -> list[Record]:
        return [self.execute_one(run) for run in runs]

    def execute_one(self, run: PlannedRun) -> Record:
        refusal = run.refusal  # a refused scenario run is recorded here too: LoadGen never starts
        if run.benchmark.scenario and refusal is None:
            return self.execute_loadgen(run)
        opts = self.options
        b = run.benchmark
        min_repeats, max_repeats = opts.repeat_bounds(b)
        started = datetime.now(timezone.utc)
        # the performance model predicts a training or inference step, not a generation request
        prediction = opts.predictor(network=b.network.resolved, batch=run.batch_size, mode=b.mode,
                                    precision=b.precision, framework=run.runner.name) \
            if opts.predictor and b.mode != "generate" else None
        self.events.run_started(run, max_repeats)
        env = self.environment(run.runner) if refusal is None else None
        repeats: list[Repeat] = []
        last_result: dict = {}
        tail = ""
        status, reason = "ok", None
        summary = None  # of `repeats` as they stand (kept between the adaptive checks)
        stopped = "fixed" if not opts.adaptive else "cap_reached"
        replaced = 0
        if refusal is not None:  # the runner says it cannot: no environment built, no worker started
            status, reason, env_info, stopped = "skipped", refusal, {"backend": opts.env_backend}, "not_started"
        elif isinstance(env, EnvironmentBuildError):
            status, reason, env_info = "failed", str(env), {"backend": opts.env_backend, "error": str(env)}
            stopped = "not_started"
        else:
            env_info = env.describe()
            request = build_request(run, opts)
            index = 0
            while len([r for r in repeats if r.status != "contended"]) < max_repeats:
                waited = None
                if opts.quiet_wait_s > 0:
                    total = opts.total_cores or psutil.cpu_count() or 1
                    waited = wait_for_quiet(opts.quiet_wait_s, min(opts.threads or total, total), total,
                                            opts.contention_threshold_pct)
                sampler = Sampler(opts.telemetry, None, opts.nvml_module) if opts.telemetry else None
                outcome = run_worker(env.python, run.runner.worker, request, opts.timeout_s,
                                     thread_env(opts.threads), sampler, container=env.container)
                res = outcome.result or {}  # validated at the boundary (launcher: worker_result.py)
                series = sampler.result if sampler else None
                window = res.get("window_monotonic_ns") or []
                derived = (derive(series, tuple(window), len(res["iter_s"]), run.batch_size)
                           if series is not None and outcome.status == "ok" and window and res.get("iter_s")
                           else None)
                last_result = res or last_result
                tail = outcome.output_tail
                contention = self._contention(series, window, derived, waited) if outcome.status == "ok" else None
                repeat_status = outcome.status
                if contention and contention.get("contended") and replaced < opts.max_replacements:
                    repeat_status, replaced = "contended", replaced + 1  # kept, counted nowhere, run again
                rep = Repeat(
                    index=index, status=repeat_status, reason=outcome.reason if repeat_status != "contended"
                    else f"contended: {contention.get('reason')}; replaced by a fresh repeat",
                    first_iter_s=res.get("first_iter_s"), warmup_iter_s=res.get("warmup_iter_s", []),
                    warmup_settled=res.get("warmup_settled"), iter_s=res.get("iter_s", []),
                    window_monotonic_ns=res.get("window_monotonic_ns", []), wall_s=outcome.wall_s,
                    telemetry=series, derived=derived, memory=res.get("memory"), compile=res.get("compile"),
                    contention=contention, generation=res.get("generation"),
                    yardstick=yardstick.times(res.get("yardstick")),
                )
                repeats.append(rep)
                index += 1
                self.events.repeat_done(run, rep)
                summary = None
                if rep.status == "contended":
                    continue
                if outcome.status != "ok":
                    # A crash, hang or skip repeats itself; do not spend the timeout again.
                    status, reason, stopped = outcome.status, outcome.reason, "failed_repeat"
                    break
                if opts.adaptive and len([r for r in repeats if r.status == "ok"]) >= min_repeats:
                    # judged on the interval the tables show (store/intervals.py), not the bootstrap alone
                    summary = summarise(repeats, run.batch_size)
                    shown = reported_interval(summary, run.batch_size)
                    if shown is not None and shown.half_width_pct <= opts.target_ci_pct:
                        stopped = "target_met"
                        break
        if status != "ok":
            summary = None
        elif summary is None:
            summary = summarise(repeats, run.batch_size)
        threads = last_result.get("threads", {})
        record = Record(
            run_id=new_run_id(started), started_at=started, ended_at=datetime.now(timezone.utc),
            dlbench=dlbench_provenance(), suite=b.suite, benchmark=b.name,
            network=NetworkInfo.of(b.network, b.network_file),
            workload=_workload(b, run, opts),
            framework=last_result.get("framework", {"name": run.runner.name}),
            environment=env_info, machine=fingerprint(),
            settings=Settings(profile=b.profile, repeats=min_repeats, threads_requested=opts.threads,
                              threads_effective=threads, timeout_s=opts.timeout_s,
                              policy={"warmup": b.policy.warmup.model_dump(), "measure": b.policy.measure.model_dump()},
                              runner=last_result.get("settings", {})),
            repeats=repeats, summary=summary, params=last_result.get("params"),
            status=status, reason=reason, output_tail=tail if status != "ok" else "",
            repeat_policy=RepeatPolicy(
                kind="adaptive" if opts.adaptive else "fixed", min_repeats=min_repeats, max_repeats=max_repeats,
                target_ci_pct=opts.target_ci_pct, stopped=stopped,
                achieved_ci_pct=summary.ci.half_width_pct if summary and summary.ci else None,
                target_interval="reported" if opts.adaptive else None,
                achieved_reported_ci_pct=_reported_half_width(summary, run.batch_size),
                contention_threshold_pct=opts.contention_threshold_pct if opts.telemetry else None,
                max_replacements=opts.max_replacements, replaced=replaced,
                quiet_wait_s=opts.quiet_wait_s or None),
            prediction=prediction,
        )
        record.telemetry = self._telemetry_summary(repeats, run.batch_size)
        if b.mode == "generate" and b.generation is not None:
            record.generation = summarise_generation(repeats if status == "ok" else [], b.generation.prompt_length,
                                                     b.generation.new_tokens, run.batch_size)
        record.equivalence = CheckStore(self.store.root).status_for_run(
            b.network.name, b.network.definition_hash, run.runner.name, record.framework.get("version"), b.precision)
        with shielded():  # a signal now still lets the finished run's record land whole
            self.store.write(record)
        self.events.run_done(run, record)
        return record

    def execute_loadgen(self, run: PlannedRun) -> Record:
        """A LoadGen scenario run: one worker process, which is LoadGen's system under test; LoadGen's
        logs (in a folder shared with the worker) are read for the record's figures and kept in the
        store beside it (store/loadgen.py). LoadGen's own duration and query counts make the
        measurement, so there are no repeats: a record's `repeats` holds the one worker."""
        opts = self.options
        b = run.benchmark
        started = datetime.now(timezone.utc)
        self.events.run_started(run, 1)
        env = self.environment(run.runner)
        settings = loadgen_settings(b)
        generation = ({"prompt_length": b.generation.prompt_length, "new_tokens": b.generation.new_tokens}
                      if b.mode == "generate" and b.generation is not None else None)
        res: dict = {}
        tail, status, reason, info, files = "", "ok", None, None, {}
        repeats: list[Repeat] = []
        if isinstance(env, EnvironmentBuildError):
            status, reason, env_info = "failed", str(env), {"backend": opts.env_backend, "error": str(env)}
        else:
            env_info = env.describe()
            with temporary_folder("dlbench-loadgen-") as logs:
                request = build_request(run, opts)
                request["loadgen"]["log_dir"] = str(logs)
                sampler = Sampler(opts.telemetry, None, opts.nvml_module) if opts.telemetry else None
                outcome = run_worker(env.python, run.runner.worker, request, opts.timeout_s, thread_env(opts.threads),
                                     sampler, container=env.container, shared_dirs=(logs,))
                res, tail = outcome.result or {}, outcome.output_tail
                status, reason = outcome.status, outcome.reason
                repeats.append(Repeat(index=0, status=outcome.status, reason=outcome.reason, wall_s=outcome.wall_s,
                                      telemetry=sampler.result if sampler else None, memory=res.get("memory"),
                                      compile=res.get("compile")))
                if status == "ok":
                    try:
                        files = collect_logs(logs, [t["log_dir"] for t in res["loadgen"]["runs"]])
                        info = loadgen_info(res["loadgen"], settings, files, generation)
                    except LoadGenLogError as e:
                        status, reason = "failed", f"LoadGen's log: {e}"
            self.events.repeat_done(run, repeats[0])
        run_id = new_run_id(started)
        if info is not None:
            with shielded():  # the logs first: a record never lists a log that is not there
                info.logs = write_logs(self.store, run_id, files)
        threads = res.get("threads", {})
        record = Record(
            run_id=run_id, started_at=started, ended_at=datetime.now(timezone.utc),
            dlbench=dlbench_provenance(), suite=b.suite, benchmark=b.name,
            network=NetworkInfo.of(b.network, b.network_file),
            workload=_workload(b, run, opts),
            framework=res.get("framework", {"name": run.runner.name}),
            environment=env_info, machine=fingerprint(),
            settings=Settings(profile=b.profile, repeats=1, threads_requested=opts.threads,
                              threads_effective=threads, timeout_s=opts.timeout_s,
                              policy={"loadgen": settings}, runner=res.get("settings", {})),
            repeats=repeats, summary=None, params=res.get("params"),
            status=status, reason=reason, output_tail=tail if status != "ok" else "",
            repeat_policy=RepeatPolicy(kind="fixed", min_repeats=1, max_repeats=1,
                                       stopped="fixed" if status == "ok" else "failed_repeat" if repeats
                                       else "not_started"),
            loadgen=info,
        )
        record.telemetry = ({"enabled": True, "interval_s": opts.telemetry.interval_s, "summary": None,
                             "reason": "LoadGen runs keep the series of their one worker; no measured window is derived"}
                            if opts.telemetry else {"enabled": False, "reason": "--no-telemetry"})
        record.equivalence = CheckStore(self.store.root).status_for_run(
            b.network.name, b.network.definition_hash, run.runner.name, record.framework.get("version"), b.precision)
        with shielded():
            self.store.write(record)
        self.events.run_done(run, record)
        return record


# how generation's server serves its requests (runners/common/loadgen_harness.py, GenerationServerRun)
GENERATION_SERVING = ("one request at a time, first come first served: a server thread takes the oldest queued "
                      "request and runs its prefill and every decode (batch 1) before the next; no batching "
                      "across requests")


def loadgen_info(outcome: dict, settings: dict, files: dict[str, bytes], generation: dict | None = None) -> LoadGenInfo:
    """The record's `loadgen` from the worker's account of its tests and LoadGen's detail logs (the
    figures are the logs'): the chosen test's result, and every test of a server search. `generation`
    (prompt and new tokens) for generation's server, whose bounds and serving policy it records."""
    scenario = outcome["scenario"]
    results, details = {}, {}
    for test in outcome["runs"]:
        name = test["log_dir"]
        details[name] = read_detail(files[f"{name}/mlperf_log_detail.txt"].decode("utf-8", "replace"))
        results[name] = result_of(details[name], scenario, name, f"{name}/mlperf_log_detail.txt")
    chosen = results[outcome["chosen"]]
    metric, value = metric_of(scenario, chosen)
    detail = details[outcome["chosen"]]
    return LoadGenInfo(
        scenario=scenario, loadgen_version=detail.get("loadgen_version"),
        mode=str(detail.get("effective_test_mode") or "PerformanceOnly"), metric=metric, metric_value=value,
        settings=settings, effective={k: v for k, v in detail.items() if k.startswith("effective_")},
        batching=({"max_batch": 1, "batch_sizes": settings["batch_sizes"], "applies": GENERATION_SERVING}
                  if generation is not None else
                  {"max_batch": max(settings["batch_sizes"]), "timeout_ms": settings["batch_timeout_ms"],
                   "batch_sizes": settings["batch_sizes"],
                   "applies": "server (a batch waits at most timeout_ms after its first sample) and offline"
                   if scenario in ("server", "offline") else "none: each query is one batch"}),
        generation=({**generation, "ttft_ms": settings["server_ttft_ms"], "tpot_ms": settings["server_tpot_ms"],
                     "percentile": 0.99, "serving": GENERATION_SERVING} if generation is not None else {}),
        warmup_latency_s=outcome["warmup_latency_s"], result=chosen,
        search=[results[t["log_dir"]] for t in outcome["runs"]] if scenario == "server" else [])
