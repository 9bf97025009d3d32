"""`dlbench run`: a suite on one or more frameworks, every run recorded in the store. Suites of
kind distributed and comm go on to distributed.py, the kernels suite to performance.py."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from .. import paths
from ..axes import COMPILE_MODES, PRECISIONS, Scenario
from ..definitions.suite import PROFILES, Benchmark
from ..execution.backends import BACKENDS
from ..execution.interrupts import exit_status, signal_name
from ..machine import available_cpus, fingerprint, gpus
from ..store.checks import worst_error
from ..store.rows import run_row
from ..telemetry import TelemetryConfig
from ..workflows.requests import RunRequest
from ..workflows.suite_kinds import RequestError, refuse_options_not_honoured
from . import lookup, tables
from .signals import say, stops_on_signals
from .console import err, fail, out, progress_bar
from .options import (
    DEVICES,
    MODES,
    DeviceOption,
    FrameworksOption,
    ProfileOption,
    StoreOption,
    ThreadsOption,
    TimeoutOption,
    check_choice,
    listed_choices,
    resolve_device,
)

COMPILE_CHOICES = ("default", *COMPILE_MODES)
TORCH_COMPILE_MODES = ("default", "max-autotune")

if TYPE_CHECKING:
    from ..execution.orchestrator import PlannedRun


@stops_on_signals
@lookup.reports_unsaved_records
def run(
    suite: Annotated[str, typer.Option(help="Suite name (fcn, cnn, rnn), 'all', or path to a suite file.")],
    framework: FrameworksOption = ["all"],
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks (or networks); repeatable.")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(
        help="train | infer | generate (decoder networks: prompt, then new tokens with a key/value cache); "
             "repeatable (default: the profile's choice, which is train only for smoke).")] = None,
    profile: ProfileOption = "default",
    device: DeviceOption = "auto",
    env: Annotated[str, typer.Option(help="venv (built and cached by dlbench) | current (this interpreter) | "
                                          "docker (the framework's image; the worker runs in a container)")] = "venv",
    threads: ThreadsOption = None,
    repeats: Annotated[Optional[int], typer.Option(min=1, help="Worker processes per run (default: the profile's); "
                                                               "with --target-ci, the repeats before the first check.")] = None,
    max_repeats: Annotated[Optional[int], typer.Option(
        "--max-repeats", help="Adaptive repeats: the most worker processes per run (needs --target-ci).")] = None,
    target_ci: Annotated[Optional[float], typer.Option("--target-ci", metavar="PCT", help=(
        "Adaptive repeats: add repeats until the half-width of the median's reported 95% interval (the ±% "
        "the tables show) is under PCT percent of it, or --max-repeats is reached."))] = None,
    store: StoreOption = None,
    timeout: TimeoutOption = 1800.0,
    sample_interval: Annotated[float, typer.Option("--sample-interval", min=10, max=1000,
                                                   help="Telemetry sampling interval in ms (10-1000).")] = 100.0,
    no_telemetry: Annotated[bool, typer.Option("--no-telemetry", help="Do not sample power, clocks, CPU.")] = False,
    workers: Annotated[Optional[int], typer.Option(
        min=1, help="Suites distributed and comm: workers per job (default 2).")] = None,
    scaling: Annotated[Optional[str], typer.Option(
        help="Suite distributed: strong (the suite's batch is the global batch) | weak (it is each worker's).")] = None,
    hosts: Annotated[Optional[str], typer.Option(
        help="Suites distributed and comm: spread the workers over these hosts (comma list; default: this "
             "machine, or the Slurm allocation inside one).")] = None,
    precision: Annotated[Optional[list[str]], typer.Option(
        help=f"{' | '.join(PRECISIONS)}; a comma list or 'all', repeatable (default: each benchmark's, fp32).")] = None,
    compile: Annotated[Optional[list[str]], typer.Option(
        "--compile", help="eager | compiled | default (the framework's own); a comma list or 'all' (eager and "
                          "compiled, run side by side), repeatable (default: each benchmark's, default).")] = None,
    compile_mode: Annotated[str, typer.Option(
        "--compile-mode", help="torch.compile's mode for compiled runs: default | max-autotune.")] = "default",
    scenario: Annotated[Optional[list[str]], typer.Option(
        help=f"MLPerf LoadGen scenarios for infer mode: {' | '.join(Scenario.names())}; a comma list or 'all', repeatable "
             "(default: none, the harness's back-to-back batches); generate mode: server, with time to first token "
             "and per output token bounds. LoadGen's settings: the profile's `loadgen`.")] = None,
    no_check: Annotated[bool, typer.Option(
        "--no-check", help="Do not make the equivalence checks this run lacks before timing (records then carry "
                           "a stored check's status, or unchecked).")] = False,
    contention_threshold: Annotated[float, typer.Option(
        "--contention-threshold", metavar="PCT", min=0, max=1000, help=(
            "A repeat is contended when other processes used more than PCT% of the worker's cores (beyond the "
            "cores it was not given) during its measured window, or steal exceeded PCT%."))] = 10.0,
    replace_contended: Annotated[int, typer.Option(
        "--replace-contended", metavar="N", min=0, max=1000, help=(
            "Replace up to N contended repeats per run by fresh ones (0: mark them only)."))] = 3,
    quiet_wait: Annotated[float, typer.Option(
        "--quiet-wait", metavar="S", min=0, max=86400, help=(
            "Before each repeat, wait up to S seconds for the other processes to fall under the contention "
            "threshold."))] = 0.0,
    data: Annotated[Optional[Path], typer.Option(
        "--data", metavar="DIR", help="Convergence suites: the folder of a task's dataset files (MNIST or "
                                      "Fashion-MNIST IDX, gzipped or not; CIFAR-10 binary); digits need none.")] = None,
) -> None:
    """Run a suite on one or more frameworks and record every run in the store."""
    given = dict(locals())  # the options as given, before any other name is bound here
    # imported here: the orchestrator brings statistics and scipy, which other commands need not load
    from ..execution.orchestrator import Orchestrator, RunOptions, check_repeat_options, plan

    request = RunRequest(**{f.name: given[f.name] for f in dataclasses.fields(RunRequest)})
    check_choice("profile", profile, list(PROFILES))
    check_choice("device", device, DEVICES)
    check_choice("environment backend", env, list(BACKENDS))
    registry = lookup.registry()
    names = lookup.framework_names(registry, framework)
    catalog = lookup.catalog()  # one per command: each suite and network file parsed once
    suite_path = catalog.suite_path(suite) if suite != "all" else None
    kind = lookup.suite_kind(suite_path, catalog) if suite_path is not None else "benchmark"
    try:
        refuse_options_not_honoured(request, kind, suite_path.stem if suite_path is not None else suite)
    except RequestError as e:
        raise fail(str(e)) from None
    if kind == "kernels":
        from .performance import run_kernel_suite

        run_kernel_suite(suite_path, names, registry, benchmark=benchmark, mode=mode, profile=profile,
                         device=resolve_device(device), env=env, threads=threads, repeats=repeats,
                         max_repeats=max_repeats, target_ci=target_ci, store=lookup.writable_store(store),
                         timeout=timeout, workers=workers, scaling=scaling, hosts=hosts)
        return
    if kind == "convergence":
        from .convergence import run_convergence_suite

        run_convergence_suite(suite_path, names, registry, benchmark=benchmark, mode=mode, profile=profile,
                              device=resolve_device(device), env=env, threads=threads, repeats=repeats,
                              max_repeats=max_repeats, target_ci=target_ci, store=lookup.writable_store(store),
                              timeout=timeout, workers=workers, scaling=scaling, hosts=hosts, data=data,
                              precision=precision)
        return
    if kind != "benchmark":
        from .distributed import run_distributed_suite

        run_distributed_suite(suite_path, kind, names, registry, benchmark=benchmark, mode=mode, profile=profile,
                              device=resolve_device(device), env=env, threads=threads, repeats=repeats,
                              max_repeats=max_repeats, target_ci=target_ci, store=store,
                              timeout=timeout, workers=workers or 2, scaling=scaling, hosts=hosts,
                              precision=precision)
        return
    for m in mode or []:
        check_choice("mode", m, MODES)
    precisions = listed_choices("precision", precision, PRECISIONS)
    compiles = listed_choices("compile mode", compile, COMPILE_CHOICES)
    if compiles is not None and any(c.strip() == "all" for item in compile for c in item.split(",")):
        compiles = list(COMPILE_MODES)  # 'all' is the two modes, not "default" beside them
    check_choice("torch.compile mode", compile_mode, TORCH_COMPILE_MODES)
    resolved_device = resolve_device(device)
    suites = lookup.load_suites(suite, profile, resolved_device, tuple(mode) if mode else None, catalog)
    available: list[Benchmark] = [b for s in suites for b in s.benchmarks]
    selected = available
    if benchmark:
        # a benchmark named with its mode runs even where the profile would skip that mode
        every_mode = [b for s in lookup.load_suites(suite, profile, resolved_device, tuple(mode or MODES), catalog)
                      for b in s.benchmarks]
        valid = sorted({b.name for b in every_mode} | {b.network.name for b in every_mode})
        for name in benchmark:
            check_choice("benchmark", name, valid)
        chosen = {b.name for b in available}
        selected = [b for b in every_mode
                    if b.name in benchmark or (b.network.name in benchmark and b.name in chosen)]
    if mode and "generate" in mode and not any(b.mode == "generate" for b in selected):
        decoders = [f"{s.name}: {', '.join(b.network.name for b in s.benchmarks if b.mode == 'generate')}"
                    for s in lookup.load_suites("all", profile, resolved_device, ("generate",), catalog)
                    if any(b.mode == "generate" for b in s.benchmarks)]
        raise fail(f"--mode generate: suite {suite!r} has no benchmark that generates (only decoder networks do, where "
                   f"a suite lists mode generate with its sizes: {'; '.join(decoders) or 'none'})")
    selected = with_axes(selected, precisions, compiles)
    scenarios = listed_choices("scenario", scenario, Scenario.names())
    if scenarios is not None:
        training = sorted({b.name for b in selected if b.mode not in ("infer", "generate")})
        if training:
            raise fail(f"--scenario runs inference under LoadGen, but {', '.join(training)} "
                       f"{'is' if len(training) == 1 else 'are'} training (add --mode infer, or --mode generate "
                       "for a decoder's server scenario)")
        not_server = [s for s in scenarios if s != "server"]
        if not_server and any(b.mode == "generate" for b in selected):
            raise fail(f"--scenario {','.join(not_server)}: generation (--mode generate) runs LoadGen's server "
                       "scenario only, bounded by time to first token and per output token (--scenario server)")
        for option, value in (("--repeats", repeats), ("--max-repeats", max_repeats), ("--target-ci", target_ci)):
            if value is not None:
                raise fail(f"{option} does not apply to --scenario: a LoadGen run is one worker, and LoadGen's "
                           "duration and query counts (the profile's `loadgen`) make its measurement")
        selected = with_scenarios(selected, scenarios)
    try:
        check_repeat_options(repeats, max_repeats, target_ci, selected)
    except ValueError as e:
        raise fail(str(e)) from None
    runners = [lookup.runner(registry, n) for n in names]
    options = RunOptions(device=resolved_device, env_backend=env, threads=threads or available_cpus(),
                         repeats=repeats, timeout_s=timeout, cache=paths.cache_dir(),
                         telemetry=None if no_telemetry else _telemetry_config(resolved_device, sample_interval),
                         nvml_module=os.environ.get("DLBENCH_NVML_MODULE", "pynvml"),
                         max_repeats=max_repeats, target_ci_pct=target_ci, compile_mode=compile_mode,
                         contention_threshold_pct=contention_threshold, max_replacements=replace_contended,
                         quiet_wait_s=quiet_wait)
    runs = plan(runners, selected)
    st = lookup.writable_store(store)  # before the first benchmark: a record must have a place
    from ..performance.runtime import run_predictor

    predictor, predicted_from = run_predictor(st, fingerprint()["machine_id"], resolved_device, options.threads,
                                              {r.name: r.model for r in runners})
    options = dataclasses.replace(options, predictor=predictor)
    err.print(f"dlbench: suite {', '.join(s.name for s in suites)}, {len(runs)} runs on {resolved_device} "
              f"({', '.join(r.name for r in runners)}), {options.threads} threads, store {st.root}; "
              f"predictions: {predicted_from if predictor else 'none, ' + predicted_from}", highlight=False)
    if no_telemetry:
        err.print("contention: not measured (--no-telemetry): no repeat is marked or replaced", highlight=False)
    records = []
    try:
        with progress_bar() as progress:
            task = progress.add_task("starting", total=len(runs))
            orch = Orchestrator(st, options, _ProgressEvents(progress, task))
            if not no_check:
                _check_before_timing(orch, runs, registry, progress)
            for r in runs:
                records.append(orch.execute_one(r))
            progress.update(task, description="done")
    except KeyboardInterrupt as e:
        cut = f"; {escape(_label(runs[len(records)]))} was not recorded" if len(records) < len(runs) else ""
        say(f"interrupted by {signal_name(e)}: workers stopped; {len(records)} complete runs are in the store, "
             f"none partial{cut}")
        raise typer.Exit(exit_status(e)) from None
    lookup.refresh_index(st)
    timed = [r for r in records if r.workload.scenario is None]
    if timed or not records:
        out.print(_summary_table(timed), width=min(out.width, tables.WIDTH))
        generated = [r for r in timed if r.workload.mode == "generate"]
        if generated:
            out.print(tables.rich_table([run_row(r) for r in generated], tables.GENERATION_COLUMNS,
                                        "generation (per request: median and 99th percentile; ms/iter above is a request)"),
                      width=min(out.width, tables.WIDTH))
        for note in tables.footnotes([run_row(r) for r in timed], tables.RUN_COLUMNS):
            out.print(escape(note), highlight=False)
    _loadgen_table([r for r in records if r.workload.scenario is not None])
    _report_contention(records)
    for r in records:
        if r.summary and r.summary.stability and r.summary.stability.unstable:
            err.print(f"[yellow]unstable[/]: {escape(r.benchmark)} on {escape(str(r.framework.get('name')))} "
                      f"b={r.workload.batch_size}: {escape(r.summary.stability.reason)}; with few processes the "
                      "interval may understate where a rerun lands (add repeats: --max-repeats N --target-ci PCT)",
                      highlight=False, soft_wrap=True)
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} runs did not complete; see the reasons above and `dlbench results`", 1)


def _check_before_timing(orch, runs: list[PlannedRun], registry, progress: Progress) -> None:
    """The equivalence checks the plan lacks, against torch where there is a torch runner; one line
    per check made and one for their cost."""
    reference = registry.get("torch") if "torch" in registry.names() else None
    made, seconds = orch.check_equivalence(runs, reference)
    say = progress.console.print
    for c in made:
        if c.error:
            say(f"[red]check failed[/]: {escape(c.network)} {c.precision}: {escape(c.error)}", highlight=False,
                soft_wrap=True)
            continue
        parts = []
        for res in c.results:
            worst = worst_error(res.errors)
            text = f"{res.framework} {res.status}"
            if worst:
                text += f" ({worst['quantity']} {worst['error']:.1e})"
            elif res.status not in ("reference", "equivalent") and res.reason:
                text += f" ({res.reason[:80]})"
            parts.append(text)
        say(f"check {escape(c.network)} {c.precision} ({c.seconds:.1f} s): {escape(', '.join(parts))}",
            highlight=False, soft_wrap=True)
    if made:
        say(f"equivalence checks: {len(made)} made before timing in {seconds:.1f} s "
            f"(--no-check skips them)", highlight=False)
    else:
        say(f"equivalence checks: every network of the plan already checked ({seconds:.1f} s)", highlight=False)


def _report_contention(records) -> None:
    """One line per run with contended repeats: how many, how contended, how many were replaced."""
    for r in records:
        marked = [rep for rep in r.repeats if isinstance(rep.contention, dict) and rep.contention.get("contended")]
        if not marked:
            continue
        worst = max(rep.contention.get("contention_pct") or 0.0 for rep in marked)
        replaced = sum(rep.status == "contended" for rep in marked)
        err.print(f"[yellow]contended[/]: {escape(r.benchmark)} on {escape(str(r.framework.get('name')))} "
                  f"b={r.workload.batch_size}: repeats {', '.join(str(rep.index) for rep in marked)} "
                  f"(others up to {worst:.0f}% of the worker's cores), {replaced} replaced by fresh repeats",
                  highlight=False, soft_wrap=True)


def _telemetry_config(device: str, interval_ms: float) -> TelemetryConfig:
    """A cpu run samples no GPU where the host has some (they are not what is measured); on a host
    without any it still asks NVML, so the record says why GPU telemetry is unavailable."""
    host_has_gpus = bool(gpus()["gpus"])
    indices = () if device == "cpu" and host_has_gpus else None
    return TelemetryConfig(interval_s=interval_ms / 1000, gpu_indices=indices)


def _label(run: PlannedRun) -> str:
    scenario = f" {run.benchmark.scenario}" if run.benchmark.scenario else ""
    return f"{run.runner.name} {run.benchmark.name}{scenario} b={run.batch_size} {run.benchmark.precision} {run.compile}"


class _ProgressEvents:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def environment(self, framework, line):
        self.progress.update(self.task, description=f"[cyan]{framework} env[/]: {escape(line[:70])}")

    def run_started(self, run: PlannedRun, repeats: int):
        self._label = escape(_label(run))
        self.progress.update(self.task, description=f"{self._label} (repeat 1/{repeats})")
        self._repeats = repeats

    def check_started(self, network, precision, frameworks):
        self.progress.update(self.task, description=f"checking {escape(network)} {precision} "
                                                    f"({escape(', '.join(frameworks))})")

    def repeat_done(self, run, repeat):
        nxt = repeat.index + 2
        if repeat.status == "contended":
            self.progress.update(self.task, description=f"{self._label} (repeat {nxt}: replacing a contended one)")
        elif nxt <= self._repeats and repeat.status == "ok":
            self.progress.update(self.task, description=f"{self._label} (repeat {nxt}/{self._repeats})")

    def run_done(self, run, record):
        self.progress.advance(self.task)
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {self._label}: {escape(str(record.reason))}",
                                        highlight=False, soft_wrap=True)


def _loadgen_table(records) -> None:
    """LoadGen's results of the scenario runs, and LoadGen's reason under each INVALID one."""
    if not records:
        return
    styles = {r.run_id: {"ok": "green", "skipped": "yellow"}.get(r.status, "red") for r in records}
    generated = [run_row(r) for r in records if r.workload.mode == "generate"]
    rows = [run_row(r) for r in records if r.workload.mode != "generate"]
    if rows:
        out.print(tables.rich_table(rows, tables.LOADGEN_RUN_COLUMNS, "dlbench run: LoadGen scenarios", styles),
                  width=min(out.width, tables.WIDTH))
    if generated:
        out.print(tables.rich_table(generated, tables.LOADGEN_GENERATION_RUN_COLUMNS,
                                    "dlbench run: LoadGen server on generation (TTFT, TPOT: median and p99 ms; "
                                    "server q/s: the highest rate meeting both p99 bounds)", styles),
                  width=min(out.width, tables.WIDTH))
    rows += generated
    for row in rows:
        if row["loadgen_reason"]:
            out.print(f"INVALID {escape(row['benchmark'])} {escape(str(row['framework']))} {row['scenario']}: "
                      f"{escape(row['loadgen_reason'])}", highlight=False, soft_wrap=True)


def _summary_table(records) -> Table:
    """The key columns in at most tables.WIDTH characters (`dlbench results --wide` has them all)."""
    rows = [run_row(r) for r in records]
    styles = {r.run_id: {"ok": "green", "skipped": "yellow"}.get(r.status, "red") for r in records}
    return tables.rich_table(rows, tables.RUN_COLUMNS, "dlbench run", styles)


def with_scenarios(benchmarks: list[Benchmark], scenarios: list[str]) -> list[Benchmark]:
    """Each (inference) benchmark once per LoadGen scenario, in order; the batch a scenario's worker
    is prepared at is the largest it runs (LoadGenPolicy.batch_sizes), not the suite's."""
    return [dataclasses.replace(b, scenario=s, batch_sizes=(max(b.policy.loadgen.batch_sizes(s, b.mode)),))
            for b in benchmarks for s in scenarios]


def with_axes(benchmarks: list[Benchmark], precisions: list[str] | None, compiles: list[str] | None) -> list[Benchmark]:
    """`--precision` and `--compile` replace the benchmarks' own: every benchmark once per
    (precision, compile mode) asked, in order; an axis not given keeps the suite's values."""
    if precisions is None and compiles is None:
        return benchmarks
    out: list[Benchmark] = []
    seen: set[tuple] = set()
    for b in benchmarks:
        for p in precisions or [b.precision]:
            for c in compiles or [b.compile]:
                key = (b.suite, b.name, p, c)
                if key not in seen:
                    seen.add(key)
                    out.append(dataclasses.replace(b, precision=p, compile=c))
    return out
