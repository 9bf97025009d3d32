"""The dlbench command line (typer). Input is validated here, once; errors exit 2 with one message."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .. import paths
from ..definitions.catalog import SuiteCatalog
from ..definitions.loader import DefinitionError, load_network
from ..definitions.suite import PROFILES, Benchmark
from ..execution.backends import BACKENDS, backend
from ..execution.environments import EnvironmentBuildError, VenvBackend
from ..execution.registry import RunnerRegistry
from ..machine import available_cpus, detect_device, fingerprint, gpus
from ..store.rows import COLUMNS, run_row
from ..store.store import Store
from ..telemetry import TelemetryConfig

if TYPE_CHECKING:
    from ..execution.orchestrator import PlannedRun

app = typer.Typer(help="Cross-framework deep-learning benchmarks.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
env_app = typer.Typer(help="Framework environments: a venv, or a docker image, per framework and device flavour.",
                      no_args_is_help=True)
app.add_typer(env_app, name="env")
store_app = typer.Typer(help="The results store: verify its records, upgrade old ones, merge other stores in.",
                        no_args_is_help=True)
app.add_typer(store_app, name="store")

# Off a terminal rich assumes 80 columns and truncates; tables here are wide, so allow more.
out = Console(width=None if sys.stdout.isatty() else 180)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 180)

StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Results store (default: $DLBENCH_STORE, else ./results).")]


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _store(store: Path | None) -> Store:
    return Store(store or paths.default_store())


def _refresh_index(st: Store) -> None:
    """Bring the row index up to date after writing records, so that the next `results` reads it
    instead of parsing the new records (or, in a store without an index yet, all of them). The
    index is a cache: failing to update it here loses nothing, the next read rebuilds it."""
    from ..store.index import read_rows

    try:
        read_rows(st)
    except Exception:  # noqa: BLE001 - a cache update must never fail the command that wrote the records
        pass


def _catalog() -> SuiteCatalog:
    return SuiteCatalog(paths.suites_dir())


def _registry() -> RunnerRegistry:
    return RunnerRegistry(paths.runners_dir())


def _runner(registry: RunnerRegistry, name: str):
    try:
        return registry.get(name)
    except DefinitionError as e:
        raise fail(str(e)) from None


def _resolve_device(device: str) -> str:
    return detect_device() if device == "auto" else device


def _load_suite(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None):
    catalog = _catalog()
    path = catalog.suite_path(suite)
    if path is None:
        raise fail(f"unknown suite {suite!r}; valid suites: {', '.join(catalog.suite_names() + ['all'])} "
                   "(or a path to a .yaml file)")
    try:
        return catalog.load_suite(path, profile, device, modes)
    except DefinitionError as e:
        raise fail(str(e)) from None


def _load_suites(suite: str, profile: str, device: str, modes: tuple[str, ...] | None = None) -> list:
    """`--suite`: a name, a path, or 'all' (every suite shipped in suites/)."""
    names = _catalog().suite_names() if suite == "all" else [suite]
    return [_load_suite(n, profile, device, modes) for n in names]


def _telemetry_config(device: str, interval_ms: float) -> TelemetryConfig:
    """A cpu run samples no GPU where the host has some (they are not what is measured); on a host
    without any it still asks NVML, so the record says why GPU telemetry is unavailable."""
    host_has_gpus = bool(gpus()["gpus"])
    indices = () if device == "cpu" and host_has_gpus else None
    return TelemetryConfig(interval_s=interval_ms / 1000, gpu_indices=indices)


def _framework_names(registry: RunnerRegistry, given: list[str]) -> list[str]:
    """`--framework` values: names, comma lists, or 'all' (the runners that exist), deduplicated."""
    names = [n.strip() for item in given for n in item.split(",") if n.strip()]
    if not names:
        raise fail(f"no framework given; valid frameworks: {', '.join(registry.names() + ['all'])}")
    for n in names:
        _check_choice("framework", n, registry.names() + ["all"])
    return list(dict.fromkeys(registry.names() if "all" in names else names))


def _check_choice(kind: str, value: str, choices: list[str]) -> None:
    if value not in choices:
        raise fail(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(choices)}")


@app.command("list")
def list_(
    suite: Annotated[Optional[str], typer.Option(help="Only this suite (name or path).")] = None,
    profile: Annotated[str, typer.Option(help="smoke | default | paper")] = "default",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (chooses the default profile's batches)")] = "auto",
) -> None:
    """Suites and their benchmarks: network, mode, batch sizes, parameters, GFLOPs per sample."""
    _check_choice("profile", profile, list(PROFILES))
    _check_choice("device", device, ["auto", "cpu", "cuda"])
    path = _catalog().suite_path(suite) if suite not in (None, "all") else None
    if path is not None:
        try:
            kind = _catalog().suite_kind(path)
        except DefinitionError as e:
            raise fail(str(e)) from None
        if kind in ("distributed", "comm"):
            from .distributed import list_distributed

            list_distributed(path, profile, _resolve_device(device))
            return
        if kind == "kernels":
            from .performance import list_kernels

            list_kernels(path, profile, _resolve_device(device))
            return
    suites = _load_suites(suite or "all", profile, _resolve_device(device))
    table = Table(title=f"dlbench suites (profile {profile})")
    for col in ("suite", "benchmark", "network", "mode", "batch sizes", "params", "GFLOPs/sample"):
        table.add_column(col, justify="right" if col in ("params", "GFLOPs/sample") else "left")
    for s in suites:
        for b in s.benchmarks:
            table.add_row(escape(s.name), escape(b.name), escape(b.network.name), b.mode, ",".join(map(str, b.batch_sizes)),
                          f"{b.network.params:,}", f"{b.network.flops_per_sample / 1e9:.4f}")
    table.caption = (f"frameworks: {', '.join(_registry().names())}; distributed suites (--workers): "
                     f"{', '.join(_catalog().distributed_suite_names())}; kernel suites: "
                     f"{', '.join(_catalog().kernel_suite_names())}")
    out.print(table)


class _ProgressEvents:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def environment(self, framework, line):
        self.progress.update(self.task, description=f"[cyan]{framework} env[/]: {escape(line[:70])}")

    def run_started(self, run: PlannedRun, repeats: int):
        self._label = escape(f"{run.runner.name} {run.benchmark.name} b={run.batch_size}")
        self.progress.update(self.task, description=f"{self._label} (repeat 1/{repeats})")
        self._repeats = repeats

    def repeat_done(self, run, repeat):
        nxt = repeat.index + 2
        if nxt <= self._repeats and repeat.status == "ok":
            self.progress.update(self.task, description=f"{self._label} (repeat {nxt}/{self._repeats})")

    def run_done(self, run, record):
        self.progress.advance(self.task)
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {self._label}: {escape(str(record.reason))}",
                                        highlight=False, soft_wrap=True)


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def _summary_table(records) -> Table:
    t = Table(title="dlbench run")
    for col in ("benchmark", "framework", "batch", "status", "ms/iter", "95% CI ms", "samples/s", "IQR ms",
                "repeats", "stability", "first iter ms"):
        t.add_column(col, justify="left" if col in ("benchmark", "framework", "status", "stability") else "right")
    for r in records:
        row = run_row(r)
        style = {"ok": "green", "skipped": "yellow"}.get(r.status, "red")
        ci = (f"{row['ci_low_ms']:.2f}-{row['ci_high_ms']:.2f} (±{row['ci_pct']:.1f}%)"
              if row["ci_low_ms"] is not None else "")
        stop = {"target_met": " (target met)", "cap_reached": " (cap)"}.get(row["repeat_stop"] or "", "")
        t.add_row(escape(row["benchmark"]), escape(f"{row['framework']} {row['framework_version'] or ''}".strip()),
                  str(row["batch_size"]), f"[{style}]{r.status}[/]", _fmt(row["ms_per_iter"], ".2f"), ci,
                  _fmt(row["samples_per_s"], ".1f"), _fmt(row["iqr_ms"], ".2f"), f"{row['repeats']}{stop}",
                  "[yellow]unstable[/]" if row["stability"] == "unstable" else (row["stability"] or ""),
                  _fmt(row["first_iter_ms"], ".1f"))
    return t


@app.command()
def run(
    suite: Annotated[str, typer.Option(help="Suite name (fcn, cnn, rnn), 'all', or path to a suite file.")],
    framework: Annotated[list[str], typer.Option(help="Framework name, 'all', or a comma list; repeatable.")] = ["all"],
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks (or networks); repeatable.")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(
        help="train | infer; repeatable (default: the profile's choice, which is train only for smoke).")] = None,
    profile: Annotated[str, typer.Option(help="smoke | default | paper")] = "default",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    env: Annotated[str, typer.Option(help="venv (built and cached by dlbench) | current (this interpreter) | "
                                          "docker (the framework's image; the worker runs in a container)")] = "venv",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Threads per worker (default: all available cores).")] = None,
    repeats: Annotated[Optional[int], typer.Option(min=1, help="Worker processes per run (default: the profile's); "
                                                               "with --target-ci, the repeats before the first check.")] = None,
    max_repeats: Annotated[Optional[int], typer.Option(
        "--max-repeats", help="Adaptive repeats: the most worker processes per run (needs --target-ci).")] = None,
    target_ci: Annotated[Optional[float], typer.Option("--target-ci", metavar="PCT", help=(
        "Adaptive repeats: add repeats until the 95% CI half-width of the median is under PCT percent of "
        "it, or --max-repeats is reached."))] = None,
    store: StoreOpt = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a worker process is killed.")] = 1800.0,
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
) -> None:
    """Run a suite on one or more frameworks and record every run in the store."""
    # imported here: the orchestrator brings statistics and scipy, which other commands need not load
    from ..execution.orchestrator import Orchestrator, RunOptions, check_repeat_options, plan

    _check_choice("profile", profile, list(PROFILES))
    _check_choice("device", device, ["auto", "cpu", "cuda"])
    _check_choice("environment backend", env, list(BACKENDS))
    registry = _registry()
    names = _framework_names(registry, framework)
    suite_path = _catalog().suite_path(suite) if suite != "all" else None
    try:
        kind = _catalog().suite_kind(suite_path) if suite_path is not None else "benchmark"
    except DefinitionError as e:
        raise fail(str(e)) from None
    if kind == "kernels":
        from .performance import run_kernel_suite

        run_kernel_suite(suite_path, names, registry, benchmark=benchmark, mode=mode, profile=profile,
                         device=_resolve_device(device), env=env, threads=threads, repeats=repeats,
                         max_repeats=max_repeats, target_ci=target_ci, store=_store(store), timeout=timeout,
                         workers=workers, scaling=scaling, hosts=hosts)
        return
    if kind != "benchmark":
        from .distributed import run_distributed_suite

        run_distributed_suite(suite_path, kind, names, registry, benchmark=benchmark, mode=mode, profile=profile,
                         device=_resolve_device(device), env=env, threads=threads, repeats=repeats,
                         max_repeats=max_repeats, target_ci=target_ci, store=_store(store), timeout=timeout,
                         workers=workers or 2, scaling=scaling, hosts=hosts)
        return
    for option, value in (("--workers", workers), ("--scaling", scaling), ("--hosts", hosts)):
        if value is not None:
            raise fail(f"{option} is for the distributed suites ({', '.join(_catalog().distributed_suite_names())}); "
                       f"suite {suite!r} runs one process per run")
    for m in mode or []:
        _check_choice("mode", m, ["train", "infer"])
    resolved_device = _resolve_device(device)
    suites = _load_suites(suite, profile, resolved_device, tuple(mode) if mode else None)
    available: list[Benchmark] = [b for s in suites for b in s.benchmarks]
    selected = available
    if benchmark:
        # a benchmark named with its mode runs even where the profile would skip that mode
        every_mode = [b for s in _load_suites(suite, profile, resolved_device, tuple(mode or ("train", "infer")))
                      for b in s.benchmarks]
        valid = sorted({b.name for b in every_mode} | {b.network.name for b in every_mode})
        for name in benchmark:
            _check_choice("benchmark", name, valid)
        chosen = {b.name for b in available}
        selected = [b for b in every_mode
                    if b.name in benchmark or (b.network.name in benchmark and b.name in chosen)]
    try:
        check_repeat_options(repeats, max_repeats, target_ci, selected)
    except ValueError as e:
        raise fail(str(e)) from None
    runners = [_runner(registry, n) for n in names]
    options = RunOptions(device=resolved_device, env_backend=env, threads=threads or available_cpus(),
                         repeats=repeats, timeout_s=timeout, cache=paths.cache_dir(),
                         telemetry=None if no_telemetry else _telemetry_config(resolved_device, sample_interval),
                         nvml_module=os.environ.get("DLBENCH_NVML_MODULE", "pynvml"),
                         max_repeats=max_repeats, target_ci_pct=target_ci)
    runs = plan(runners, selected)
    st = _store(store)
    from ..performance.runtime import run_predictor

    predictor, predicted_from = run_predictor(st, fingerprint()["machine_id"], resolved_device, options.threads,
                                              {r.name: r.model for r in runners})
    options = dataclasses.replace(options, predictor=predictor)
    err.print(f"dlbench: suite {', '.join(s.name for s in suites)}, {len(runs)} runs on {resolved_device} "
              f"({', '.join(r.name for r in runners)}), {options.threads} threads, store {st.root}; "
              f"predictions: {predicted_from if predictor else 'none, ' + predicted_from}", highlight=False)
    records = []
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=False) as progress:
            task = progress.add_task("starting", total=len(runs))
            orch = Orchestrator(st, options, _ProgressEvents(progress, task))
            for r in runs:
                records.append(orch.execute_one(r))
            progress.update(task, description="done")
    except KeyboardInterrupt:
        err.print(f"interrupted: workers stopped; {len(records)} complete runs are in the store, none partial")
        raise typer.Exit(130) from None
    _refresh_index(st)
    out.print(_summary_table(records))
    for r in records:
        if r.summary and r.summary.stability and r.summary.stability.unstable:
            err.print(f"[yellow]unstable[/]: {escape(r.benchmark)} on {escape(str(r.framework.get('name')))} "
                      f"b={r.workload.batch_size}: {escape(r.summary.stability.reason)}; with few processes the "
                      "interval may understate where a rerun lands (add repeats: --max-repeats N --target-ci PCT)",
                      highlight=False, soft_wrap=True)
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} runs did not complete; see the reasons above and `dlbench results`", 1)


# rich lays out a table cell by cell (about a second per 500 rows here): beyond this, plain columns.
RICH_TABLE_MAX_ROWS = 200
RESULTS_TABLE_COLUMNS = ("run_id", "benchmark", "framework", "framework_version", "device", "batch_size", "status",
                         "ms_per_iter", "ci_pct", "samples_per_s", "stability", "params", "params_described",
                         "flops_per_sample", "equivalence")


def _cell(value) -> str:
    return "" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))


def _plain_table(title: str, rows: list[dict]) -> str:
    cells = [list(RESULTS_TABLE_COLUMNS)] + [[_cell(row[c]) for c in RESULTS_TABLE_COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(RESULTS_TABLE_COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title, *lines]) + "\n"


def _write_output(path: Path, write) -> None:
    """Into a temporary file beside `path`, then renamed over it: never a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@app.command()
def results(
    store: StoreOpt = None,
    format: Annotated[str, typer.Option("--format", help="table | csv | json | parquet (parquet needs --out)")] = "table",
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write csv, json or parquet to this file.")] = None,
    framework: Annotated[Optional[list[str]], typer.Option(help="Only these frameworks; repeatable, or a comma list.")] = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks or networks; repeatable.")] = None,
    machine: Annotated[Optional[list[str]], typer.Option(help="Only these hostnames or machine ids; repeatable.")] = None,
    since: Annotated[Optional[str], typer.Option(help="Only runs started at or after this date or datetime "
                                                      "(YYYY-MM-DD[THH:MM[:SS]][+HH:MM]; UTC when no zone).")] = None,
    status: Annotated[Optional[list[str]], typer.Option(help="ok | failed | timeout | skipped; repeatable.")] = None,
) -> None:
    """One row per run in the store; filters combine with AND, repeated values of one filter with OR."""
    from ..store.index import INDEX_DIR, read_rows
    from ..store.selection import STATUSES, Selection, parse_since, split_values

    _check_choice("format", format, ["table", "csv", "json", "parquet"])
    statuses = split_values(status)
    unknown = sorted(statuses - set(STATUSES))
    if unknown:
        raise fail(f"unknown status {unknown[0]!r}; valid statuses: {', '.join(STATUSES)}")
    try:
        since_at = parse_since(since) if since is not None else None
    except ValueError as e:
        raise fail(f"--since: {e}") from None
    if format == "parquet" and out_file is None:
        raise fail("--format parquet writes a binary file, not text for a terminal: give --out FILE")
    if out_file is not None:
        if format == "table":
            raise fail("--out takes csv, json or parquet; the table is for reading in a terminal")
        if out_file.is_dir():
            raise fail(f"--out {out_file}: is a directory; give a file name")
        if not out_file.parent.is_dir():
            raise fail(f"--out {out_file}: directory {out_file.parent} does not exist")
    selection = Selection(frameworks=split_values(framework), benchmarks=split_values(benchmark),
                          machines=split_values(machine), statuses=statuses, since=since_at)
    st = _store(store)
    snapshot = read_rows(st, on_parse=lambda n: err.print(
        f"reading {n} records of {escape(str(st.root))} into its row index (later reads use {INDEX_DIR}/)",
        highlight=False))
    for note in snapshot.notes:
        err.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)
    for p in snapshot.unreadable:
        err.print(f"[yellow]skipped[/] {escape(p.reason)}", highlight=False, soft_wrap=True)
    rows = selection.apply(snapshot.rows)
    if format == "parquet":
        from ..store.frame import runs_frame

        frame = runs_frame(rows)
        _write_output(out_file, lambda tmp: frame.to_parquet(tmp, index=False))
        err.print(f"{len(rows)} runs written to {escape(str(out_file))}", highlight=False)
        return
    if format in ("json", "csv"):
        if format == "json":
            # a run per line: as readable as indent=1 and several times faster (the C encoder)
            plain = [json.dumps({c: row.get(c) for c in COLUMNS}) for row in rows]
            text = "[\n" + ",\n".join(plain) + "\n]\n" if plain else "[]\n"
        else:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\r\n")  # csv.DictWriter's line ending, at a list's speed
            w.writerow(COLUMNS)
            w.writerows([row.get(c) for c in COLUMNS] for row in rows)
            text = buf.getvalue()
        if out_file is None:
            sys.stdout.write(text)
        else:
            _write_output(out_file, lambda tmp: tmp.write_text(text))
            err.print(f"{len(rows)} runs written to {escape(str(out_file))}", highlight=False)
        return
    shown = len(rows) if len(rows) == len(snapshot.rows) else f"{len(rows)} of {len(snapshot.rows)}"
    title = f"{shown} runs in {st.root}"
    if len(rows) > RICH_TABLE_MAX_ROWS:
        sys.stdout.write(_plain_table(title, rows))
        return
    t = Table(title=escape(title))
    for c in RESULTS_TABLE_COLUMNS:
        t.add_column(c, overflow="fold")
    for row in rows:
        t.add_row(*(escape(_cell(row[c])) for c in RESULTS_TABLE_COLUMNS))
    out.print(t)
    if any(row.get("workers") is not None for row in rows):
        from .distributed import print_distributed_details

        print_distributed_details(st, rows)


EXIT_REGRESSION = 3  # `compare --fail-on-regression`: 1 stays "error", 2 "bad input"


def _readable_records(st: Store) -> list:
    problems: list = []
    records = list(st.records(problems))
    for p in problems:
        err.print(f"[yellow]skipped[/] {escape(p.reason)}", highlight=False, soft_wrap=True)
    return records


@app.command()
def compare(
    baseline: Annotated[str, typer.Option(help="Selector of the baseline runs: key=value terms joined by ',' (AND), "
                                               "alternatives with '|'; keys: run, framework, version, machine, since, "
                                               "until, benchmark, suite, device, batch, precision.")],
    candidate: Annotated[str, typer.Option(help="Selector of the candidate runs (same syntax).")],
    store: StoreOpt = None,
    fail_on_regression: Annotated[Optional[float], typer.Option(
        "--fail-on-regression", min=0, metavar="PCT",
        help=f"Exit {EXIT_REGRESSION} when a comparison is significant after Holm correction and the candidate's "
             "throughput is more than PCT percent lower.")] = None,
    alpha: Annotated[float, typer.Option(min=0.001, max=0.5, help="Family-wise significance level.")] = 0.05,
    format: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """Candidate vs baseline per benchmark: throughput ratio with a bootstrap CI, Mann-Whitney U, Holm, geometric mean."""
    from ..analysis.comparison import NothingToCompare, SelectorError, comparison_table, parse_selector
    from ..analysis.comparison import compare as compare_runs

    _check_choice("format", format, ["table", "json"])
    try:
        base_sel, cand_sel = parse_selector(baseline, "--baseline"), parse_selector(candidate, "--candidate")
    except SelectorError as e:
        raise fail(str(e)) from None
    st = _store(store)
    try:
        result = compare_runs(_readable_records(st), base_sel, cand_sel, alpha=alpha)
    except SelectorError as e:
        raise fail(str(e)) from None
    except NothingToCompare as e:
        raise fail(f"{e} (store {st.root})", 1) from None
    if format == "json":
        sys.stdout.write(json.dumps(result.to_dict(fail_on_regression), indent=1) + "\n")
    else:
        out.print(comparison_table(result))
    for side, keys in (("baseline", result.baseline_only), ("candidate", result.candidate_only)):
        for k in keys:
            err.print(f"[yellow]unpaired[/] only in the {side}: {escape(', '.join(f'{f}={v}' for f, v in k.items()))}",
                      highlight=False, soft_wrap=True)
    if fail_on_regression is not None:
        regressions = result.regressions(fail_on_regression)
        for c in regressions:
            err.print(f"[bold red]regression[/] {escape(c.key['benchmark'])}: throughput {c.change_pct:+.1f}% "
                      f"(p Holm {c.p_adjusted:.2g}), beyond --fail-on-regression {fail_on_regression:g}%",
                      highlight=False, soft_wrap=True)
        if regressions:
            raise typer.Exit(EXIT_REGRESSION)


@app.command()
def history(
    store: StoreOpt = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks or networks; repeatable, or a comma list.")] = None,
    framework: Annotated[Optional[list[str]], typer.Option(help="Only these frameworks; repeatable, or a comma list.")] = None,
    machine: Annotated[Optional[list[str]], typer.Option(help="Only these hostnames or machine ids; repeatable.")] = None,
    format: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """Median throughput per benchmark, framework and machine over time and versions, with detected steps."""
    from ..analysis.history import build_history, history_table
    from ..store.selection import split_values

    _check_choice("format", format, ["table", "json"])
    st = _store(store)
    records = [r for r in _readable_records(st) if r.status == "ok" and r.summary is not None]
    filters = {"benchmark": split_values(benchmark), "framework": split_values(framework),
               "machine": split_values(machine)}
    present = {
        "benchmark": {r.benchmark for r in records} | {r.network.name for r in records},
        "framework": {str(r.framework.get("name")) for r in records},
        "machine": {str(r.machine.get("hostname")) for r in records} | {str(r.machine.get("machine_id"))
                                                                         for r in records if r.machine.get("machine_id")},
    }
    for kind, values in filters.items():
        for v in sorted(values - present[kind]):
            raise fail(f"--{kind} {v!r}: no completed run in {st.root}; "
                       f"{kind}s there: {', '.join(sorted(present[kind])) or 'none'}")
    series = build_history(records, benchmarks=filters["benchmark"], frameworks=filters["framework"],
                           machines=filters["machine"])
    if format == "json":
        sys.stdout.write(json.dumps([s.to_dict() for s in series], indent=1) + "\n")
        return
    if not series:
        raise fail(f"no completed runs in {st.root}; run `dlbench run` first", 1)
    out.print(history_table(series, f"{len(series)} series in {st.root}"))


@app.command()
def report(
    store: StoreOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the site into (replaced when it is a site dlbench wrote).")] = Path("site"),
    open_: Annotated[bool, typer.Option("--open", help="Open the leaderboard in a web browser afterwards.")] = False,
    compare: Annotated[Optional[tuple[str, str]], typer.Option(
        "--compare", metavar="BASELINE CANDIDATE",
        help="Also write compare.html: the `dlbench compare` table of two selectors.")] = None,
) -> None:
    """Write the static site: leaderboards, benchmark, run, history (and comparison) pages."""
    from ..reporting.site import SiteError, build_site, open_in_browser

    st = _store(store)
    try:
        result = build_site(st.root, out_dir, compare)
    except SiteError as e:
        raise fail(str(e), e.code) from None
    for path, reason in result.problems:
        err.print(f"[yellow]skipped[/] {escape(reason)}", highlight=False, soft_wrap=True)
    out.print(f"report: {result.index} ({result.runs} runs, {result.pages} pages)")
    if open_ and not open_in_browser(result.index):
        err.print("no web browser to open; the site is at the path above", highlight=False)


@app.command()
def check(
    framework: Annotated[list[str], typer.Option(help="Framework name, 'all', or a comma list; repeatable.")] = ["all"],
    network: Annotated[Optional[list[str]], typer.Option(help="Only these networks; repeatable (default: all).")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "cpu",
    env: Annotated[str, typer.Option(help="venv | current | docker")] = "venv",
    store: StoreOpt = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a worker process is killed.")] = 900.0,
) -> None:
    """Prove the frameworks build the same networks: shared weights and input, compared outputs and updates."""
    from ..execution.equivalence import check_network
    from ..store.checks import CheckStore

    _check_choice("device", device, ["auto", "cpu", "cuda"])
    _check_choice("environment backend", env, list(BACKENDS))
    registry = _registry()
    runners = [_runner(registry, n) for n in _framework_names(registry, framework)]
    # torch is the reference when it is asked for: the others are compared against it.
    runners.sort(key=lambda r: r.name != "torch")
    catalog = _catalog()
    names = network or catalog.network_names()
    for n in names:
        _check_choice("network", n, catalog.network_names())
    try:
        summaries = [load_network(catalog.networks_dir / f"{n}.yaml") for n in names]
    except DefinitionError as e:
        raise fail(str(e)) from None
    resolved_device = _resolve_device(device)
    flavour = "cuda" if resolved_device == "cuda" else "cpu"
    envs = []
    chosen = backend(env, paths.cache_dir())
    for r in runners:
        with err.status(f"environment for {r.name}") as status:
            try:
                envs.append((r, chosen.ensure(r, flavour, lambda line, n=r.name: status.update(f"{n}: {escape(line[:90])}"))))
            except EnvironmentBuildError as e:
                envs.append((r, e))
    # One step with the hyper-parameters each network trains with in its suite.
    step = {}
    for s in _load_suites("all", "smoke", "cpu"):
        for b in s.benchmarks:
            if b.mode == "train":
                step.setdefault(b.network.name, (b.learning_rate, b.momentum))
    checks = CheckStore(_store(store).root)
    table = Table(title=f"dlbench check ({resolved_device}; reference: {runners[0].name})")
    for col in ("network", "framework", "version", "params", "status", "logits", "loss", "weights", "update",
                "worst tensor", "round trip"):
        table.add_column(col, justify="right" if col in ("params", "logits", "loss", "weights", "update", "round trip")
                         else "left")
    bad = 0
    for summary in summaries:
        lr, momentum = step.get(summary.name, (0.01, 0.9))
        with err.status(f"checking {summary.name}"):
            results = check_network(summary, envs, resolved_device, timeout, learning_rate=lr, momentum=momentum)
        for res in results:
            checks.save(res)
            bad += not res.ok
            style = {"equivalent": "green", "reference": "cyan", "skipped": "yellow"}.get(res.status, "red")
            e = res.errors
            table.add_row(summary.name, res.framework, escape(res.framework_version or ""),
                          f"{res.params:,}" if res.params is not None else "", f"[{style}]{res.status}[/]",
                          *(f"{e[k]:.1e}" if k in e else "" for k in ("logits", "loss", "weights", "update")),
                          escape(res.worst_tensor or ""), f"{e['roundtrip']:.0e}" if "roundtrip" in e else "")
            if res.reason and res.status != "equivalent":
                err.print(f"[{style}]{res.status}[/] {summary.name} on {res.framework}: {escape(res.reason)}",
                          highlight=False, soft_wrap=True)
    out.print(table)
    if bad:
        raise fail(f"{bad} framework/network pairs are not equivalent or could not be checked", 1)


@app.command()
def kernels(
    store: StoreOpt = None,
    framework: Annotated[Optional[list[str]], typer.Option(help="Only these frameworks; repeatable.")] = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these kernel benchmarks; repeatable.")] = None,
    format: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """The kernel suite's results in the store: the latest run of each framework and kernel benchmark."""
    from .performance import show_kernels

    _check_choice("format", format, ["table", "json"])
    show_kernels(_store(store), framework, benchmark, format)


@app.command()
def calibrate(
    framework: Annotated[list[str], typer.Option(help="Frameworks to measure the ceilings with; 'all' or a comma list.")] = ["all"],
    workers: Annotated[Optional[int], typer.Option(min=2, help=(
        "Fit the all-reduce of only this many workers from the comm suite's records (default: every "
        "worker count found).")) ] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    env: Annotated[str, typer.Option(help="venv | current")] = "venv",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Threads per worker (default: all available cores).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before a worker process is killed.")] = 900.0,
    store: StoreOpt = None,
) -> None:
    """Measure this machine's ceilings, gather its kernel times and all-reduce fits: a new machine profile."""
    from .performance import calibrate as run_calibration

    _check_choice("device", device, ["auto", "cpu", "cuda"])
    _check_choice("environment backend", env, list(BACKENDS))
    registry = _registry()
    run_calibration(names=_framework_names(registry, framework), registry=registry, device=_resolve_device(device),
                    env=env, threads=threads, timeout=timeout, store=_store(store), workers=workers)


@app.command()
def predict(
    network: Annotated[Optional[str], typer.Option(help="A network of suites/networks, or a path to its .yaml.")] = None,
    framework: Annotated[Optional[str], typer.Option(help="Whose measured kernel times to use.")] = None,
    batch: Annotated[Optional[int], typer.Option(min=1, help="Batch size (per worker).")] = None,
    mode: Annotated[str, typer.Option(help="train | infer")] = "train",
    workers: Annotated[int, typer.Option(min=1, help="Synchronous data-parallel workers.")] = 1,
    machine: Annotated[Optional[str], typer.Option(help=(
        "Machine profile: a file, or a machine id or hostname with @REVISION for an older one "
        "(default: this machine's latest).")) ] = None,
    schedule: Annotated[Optional[str], typer.Option(help=(
        "Gradient communication: none | wfbp | mgwfbp (default: the framework's engine, "
        "as its runners/FW/runner.toml [model] states it).")) ] = None,
    precision: Annotated[str, typer.Option(help="float32 | amp_fp16 | amp_bf16")] = "float32",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Threads the run would use (a note if the profile's differ).")] = None,
    io_bandwidth: Annotated[Optional[float], typer.Option("--io-bandwidth", metavar="GBPS", help=(
        "Read the data at this many GB/s (default: synthetic data already in memory).")) ] = None,
    accuracy: Annotated[bool, typer.Option("--accuracy", help=(
        "Instead: the prediction error of the runs in the store, per suite and framework.")) ] = False,
    recompute: Annotated[bool, typer.Option("--recompute", help=(
        "With --accuracy: predict every run again from the profile (--machine) instead of using the "
        "prediction its record kept.")) ] = False,
    suite: Annotated[Optional[list[str]], typer.Option(help="With --accuracy: only these suites; repeatable.")] = None,
    runs: Annotated[bool, typer.Option("--runs", help="With --accuracy: list every run too.")] = False,
    layers: Annotated[bool, typer.Option("--layers", help="The time of every layer too.")] = False,
    format: Annotated[str, typer.Option("--format", help="table | json")] = "table",
    store: StoreOpt = None,
) -> None:
    """Predict an iteration's time per phase from a machine profile (--accuracy: score stored predictions)."""
    from ..performance.communication import SCHEDULES
    from .performance import accuracy as prediction_accuracy
    from .performance import predict_command

    _check_choice("format", format, ["table", "json"])
    if accuracy:
        given = [o for o, v in (("--network", network), ("--batch", batch), ("--schedule", schedule),
                                ("--io-bandwidth", io_bandwidth)) if v is not None]
        if given or workers != 1:
            raise fail(f"--accuracy scores the runs in the store; {', '.join(given) or '--workers'} is for one prediction")
        prediction_accuracy(store=_store(store), suites=suite, frameworks=[framework] if framework else None,
                            recompute=recompute, machine=machine, fmt=format, runs=runs)
        return
    if recompute or suite or runs:
        raise fail("--recompute, --suite and --runs go with --accuracy")
    missing = [o for o, v in (("--network", network), ("--framework", framework), ("--batch", batch)) if v is None]
    if missing:
        raise fail(f"predict needs {', '.join(missing)} (or --accuracy)")
    _check_choice("framework", framework, _registry().names())
    _check_choice("mode", mode, ["train", "infer"])
    _check_choice("precision", precision, ["float32", "amp_fp16", "amp_bf16"])
    if schedule is not None:
        _check_choice("schedule", schedule, list(SCHEDULES))
    if workers > 1 and mode != "train":
        raise fail("--workers above 1 needs --mode train: only training exchanges gradients")
    predict_command(network=network, framework=framework, batch=batch, mode=mode, workers=workers, machine=machine,
                    schedule=schedule, precision=precision, threads=threads, io_bandwidth=io_bandwidth,
                    store=_store(store), fmt=format, layers=layers)


@app.command()
def info(
    format: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """What this machine offers to measure with: CPU, GPUs and their NVML capabilities, RAPL domains."""
    from ..machine import machine_capabilities

    _check_choice("format", format, ["table", "json"])
    caps = machine_capabilities(os.environ.get("DLBENCH_NVML_MODULE", "pynvml"))
    caps["machine"] = fingerprint()
    if format == "json":
        sys.stdout.write(json.dumps(caps, indent=1, default=str) + "\n")
        return
    m = caps["machine"]
    out.print(f"[bold]CPU[/] {escape(str(m['cpu_model']))}: {m['cpu_physical']} cores, {m['cpu_logical']} threads, "
              f"{m['cpu_available']} available to dlbench; memory {m['memory_bytes'] / 2**30:.1f} GiB; {escape(m['os'])}")
    gpu = caps["gpu"]
    if not gpu.get("available"):
        out.print(f"[bold]GPU[/] none usable: {escape(str(gpu.get('reason')))}")
    for g in gpu.get("devices", []):
        if "unavailable" in g:
            out.print(f"[bold]GPU {g['index']}[/] unavailable: {escape(str(g['unavailable']))}")
            continue
        t = Table(title=escape(f"GPU {g.get('index')}: {g.get('name')} ({g.get('uuid')})"))
        t.add_column("NVML query")
        t.add_column("status")
        for query in sorted(g.get("supported", [])):
            t.add_row(escape(query), "[green]supported[/]")
        for query, why in sorted(g.get("unsupported", {}).items()):
            t.add_row(escape(query), escape(f"unsupported: {why}"))
        out.print(t)
    rapl = caps["rapl"]
    zones = ", ".join(escape(f"{z.get('zone')} ({z.get('name')}): {'readable' if z.get('readable') else z.get('reason')}")
                      for z in rapl.get("zones", []))
    if rapl.get("available"):
        out.print(f"[bold]RAPL[/] {zones}")
    else:
        out.print(f"[bold]RAPL[/] unavailable: {escape(str(rapl.get('reason')))}" + (f" ({zones})" if zones else ""))


@env_app.command("list")
def env_list() -> None:
    """Cached environments and docker images, and whether each runner's is built for its current files."""
    venv = VenvBackend(paths.cache_dir())
    t = Table(title=f"environments in {venv.root}")
    for c in ("framework", "flavour", "state", "path", "built"):
        t.add_column(c)
    current = set()
    registry = _registry()
    runners = [_runner(registry, n) for n in registry.names()]
    for runner in runners:
        for flavour in ("cpu", "cuda"):
            path = venv.path_for(runner, flavour)
            current.add(str(path))
            found = venv.existing(runner, flavour)
            t.add_row(runner.name, flavour, "ready" if found else "not built", str(path),
                      json.loads((path / ".dlbench-env.json").read_text())["built_at"] if found else "")
    for meta in venv.list():
        if meta["path"] not in current:
            t.add_row(meta["framework"], meta["flavour"], "stale (requirements changed)", meta["path"], meta["built_at"])
    out.print(t)
    _image_list(runners)


def _image_list(runners) -> None:
    """The docker images: one row per runner and flavour (its current tag), then dlbench's other images."""
    docker = backend("docker", paths.cache_dir())
    try:
        images = docker.list()
    except EnvironmentBuildError as e:
        out.print(f"docker images: not listed ({escape(str(e))})", highlight=False, soft_wrap=True)
        return
    built = {row["tag"]: row for row in images}
    t = Table(title=f"docker images (Dockerfiles in {docker.docker_dir})")
    for c in ("framework", "flavour", "state", "image", "id", "created", "size"):
        t.add_column(c)
    expected = set()
    for runner in runners:
        for flavour in ("cpu", "cuda"):
            try:
                tag, _, _ = docker.image_for(runner, flavour)
            except EnvironmentBuildError:
                t.add_row(runner.name, flavour, "no Dockerfile", "", "", "", "")
                continue
            expected.add(tag)
            row = built.get(tag)
            t.add_row(runner.name, flavour, "ready" if row else "not built", tag,
                      *((row["id"], row["created"], row["size"]) if row else ("", "", "")))
    for row in images:
        if row["tag"] not in expected:
            t.add_row(row["framework"], row["flavour"], "stale (Dockerfile or requirements changed)", row["tag"],
                      row["id"], row["created"], row["size"])
    out.print(t)


BUILDABLE = ("venv", "docker")  # `current` is the interpreter dlbench runs in: nothing to build


@env_app.command("create")
def env_create(
    framework: Annotated[str, typer.Argument(help="Framework name, or 'all'.")],
    device: Annotated[str, typer.Option(help="auto | cpu | cuda: which flavour to build")] = "auto",
    env: Annotated[str, typer.Option(help="venv (a virtual environment) | docker (an image)")] = "venv",
) -> None:
    """Build (or find) the cached environment or the docker image of a framework."""
    registry = _registry()
    _check_choice("framework", framework, registry.names() + ["all"])
    _check_choice("device", device, ["auto", "cpu", "cuda"])
    _check_choice("environment backend", env, list(BUILDABLE))
    flavour = _resolve_device(device)
    names = registry.names() if framework == "all" else [framework]
    chosen = backend(env, paths.cache_dir())
    for name in names:
        runner = _runner(registry, name)
        with err.status(f"building {name} ({flavour})") as status:
            try:
                built = chosen.ensure(runner, flavour, lambda line: status.update(f"{name}: {escape(line[:90])}"))
            except EnvironmentBuildError as e:
                raise fail(str(e), 1) from None
        out.print(f"{name} ({flavour}): {built.path or built.key}")


@env_app.command("remove")
def env_remove(
    framework: Annotated[str, typer.Argument(help="Framework name, or 'all'.")],
    env: Annotated[str, typer.Option(help="venv (its environments) | docker (its images)")] = "venv",
) -> None:
    """Delete the cached environments (or docker images) of a framework, every flavour and version."""
    registry = _registry()
    _check_choice("framework", framework, registry.names() + ["all"])
    _check_choice("environment backend", env, list(BUILDABLE))
    chosen = backend(env, paths.cache_dir())
    for name in registry.names() if framework == "all" else [framework]:
        try:
            removed = chosen.remove(name)
        except EnvironmentBuildError as e:
            raise fail(str(e), 1) from None
        for item in removed:
            out.print(f"removed {item}")


def _print_problems(label: str, problems) -> None:
    for path, reason in problems:
        out.print(f"[red]{label}[/] {escape(reason)}", highlight=False, soft_wrap=True)


@store_app.command("verify")
def store_verify(store: StoreOpt = None) -> None:
    """Check every record (schema, checksum, name) and check file; exit 1 if any is damaged."""
    from ..store.verify import verify

    st = _store(store)
    if not st.root.is_dir():
        raise fail(f"no store at {st.root}")
    report = verify(st)
    _print_problems("problem", [(p.path, p.reason) for p in report.problems])
    by_version: dict[int, int] = {}
    for _, version in report.unverified:
        by_version[version] = by_version.get(version, 0) + 1
    old = ", ".join(f"schema {v}: {n}" for v, n in sorted(by_version.items()))
    total = len(report.verified) + len(report.unverified) + sum(p.path.parent == st.runs for p in report.problems)
    out.print(f"{st.root}: {total} records: {len(report.verified)} verified by checksum, "
              f"{len(report.unverified)} unverified (written before checksums{': ' + old if old else ''}), "
              f"{len(report.problems)} problems; {report.checks} equivalence checks, {report.kernels} kernel records, "
              f"{report.profiles} machine profiles", highlight=False, soft_wrap=True)
    if report.leftovers:
        out.print(f"{len(report.leftovers)} temporary files in {st.incoming} ({len(report.stale)} left by writers "
                  "that died or are over an hour old: the next write removes them)", highlight=False, soft_wrap=True)
    if report.problems:
        raise fail(f"{len(report.problems)} damaged or invalid files in {st.root} (listed above)", 1)


@store_app.command("upgrade")
def store_upgrade(store: StoreOpt = None) -> None:
    """Rewrite older records at the current schema, atomically; originals kept in STORE/.upgraded/."""
    from ..store.record import SCHEMA_VERSION
    from ..store.store import UpgradeReport

    st = _store(store)
    if not st.root.is_dir():
        raise fail(f"no store at {st.root}")
    report = UpgradeReport()
    try:
        st.upgrade(report)
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(report.upgraded)} records upgraded, each whole; run it again to finish")
        raise typer.Exit(130) from None
    _print_problems("not upgraded", [(p.path, p.reason) for p in report.problems])
    by_version: dict[int, int] = {}
    for _, version in report.upgraded:
        by_version[version] = by_version.get(version, 0) + 1
    old = ", ".join(f"from {v}: {n}" for v, n in sorted(by_version.items()))
    out.print(f"{st.root}: {len(report.upgraded)} records upgraded to schema {SCHEMA_VERSION}"
              f"{' (' + old + '), originals in ' + str(st.upgraded) if old else ''}; {report.current} already current",
              highlight=False, soft_wrap=True)
    if report.problems:
        raise fail(f"{len(report.problems)} records could not be read and were left as they are (listed above)", 1)


@store_app.command("merge")
def store_merge(
    sources: Annotated[list[Path], typer.Argument(help="Stores to merge in (directories with runs/ and checks/).")],
    store: StoreOpt = None,
) -> None:
    """Copy other stores' records and checks in; duplicates skipped, conflicts and damage reported."""
    from ..store.merge import MergeError, MergeReport, check_sources, merge

    st = _store(store)
    try:
        check_sources(st, sources)
    except MergeError as e:
        raise fail(str(e)) from None
    report = MergeReport()
    try:
        merge(st, sources, report)
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(report.added)} files copied, each whole; run the merge again to finish")
        raise typer.Exit(130) from None
    _refresh_index(st)
    _print_problems("conflict", report.conflicts)
    _print_problems("unreadable", report.unreadable)
    t = Table(title=f"merge into {st.root} from {len(sources)} store{'s' if len(sources) != 1 else ''}")
    for col in ("added", "duplicates", "conflicts", "unreadable"):
        t.add_column(col, justify="right")
    t.add_row(*(str(len(x)) for x in (report.added, report.duplicates, report.conflicts, report.unreadable)))
    out.print(t)
    if not report.clean:
        raise fail(f"{len(report.conflicts)} conflicts and {len(report.unreadable)} unreadable files were not "
                   "merged (listed above)", 1)

