"""`dlbench run`: the command line of workflows/suite_kinds.py. It parses the options into a
RunRequest, has the workflow plan it (the suite's kind refuses the options it does not honour, its
planner checks the rest) and execute it, and shows it: the same steps for every kind of suite,
through DISPLAYS, each kind's header, progress and tables (kind benchmark here; distributed and comm
in distributed.py, kernels in performance.py, convergence in convergence.py). An interrupt ends
every kind alike, saying how many complete records the store holds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ..axes import REQUEST_AXES, Mode
from ..axes import Compression  # its values carry a parameter: checked by the distributed plan
from ..store.checks import worst_error
from ..store.rows import run_row
from ..execution.links import LinkError
from ..workflows.requests import RunRequest
from ..workflows.suite_kinds import execute_run, plan_run
from . import convergence, distributed, lookup, performance, tables
from .console import err, fail, out, progress_bar
from .options import (
    DeviceOption,
    FrameworksOption,
    ProfileOption,
    StoreOption,
    ThreadsOption,
    TimeoutOption,
    axis_option,
    run_axis_option,
)
from .signals import interrupted, stops_on_signals

if TYPE_CHECKING:
    from ..execution.orchestrator import PlannedRun
    from ..workflows.run import BenchmarkPlan


@stops_on_signals
@lookup.reports_unsaved_records
def run(
    suite: Annotated[str, typer.Option(help="Suite name (fcn, cnn, rnn), 'all', or path to a suite file.")],
    framework: FrameworksOption = ["all"],
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks (or networks); repeatable.")] = None,
    mode: Annotated[Optional[list[Mode]], axis_option(Mode, lists=True, help=(
        "What to time (generate: decoder networks, a prompt, then new tokens with a key/value cache); a comma "
        "list, repeatable (default: the profile's choice, which is train only for smoke)."))] = None,
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
    precision: Annotated[Optional[list[str]], run_axis_option(
        REQUEST_AXES["precision"], help="A comma list or 'all', repeatable (default: each benchmark's, fp32).")] = None,
    compile: Annotated[Optional[list[str]], run_axis_option(
        REQUEST_AXES["compile"], help="default: the framework's own; a comma list or 'all' (eager and compiled, run "
                                      "side by side), repeatable (default: each benchmark's, default).")] = None,
    compile_mode: Annotated[str, typer.Option(
        "--compile-mode", help="torch.compile's mode for compiled runs: default | max-autotune.")] = "default",
    scenario: Annotated[Optional[list[str]], run_axis_option(
        REQUEST_AXES["scenario"],
        help="MLPerf LoadGen scenarios for infer mode; a comma list or 'all', repeatable (default: none, the "
             "harness's back-to-back batches); generate mode: server, with time to first token and per output "
             "token bounds. LoadGen's settings: the profile's `loadgen`.")] = None,
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
    link: Annotated[Optional[str], typer.Option(
        "--link", metavar="RATE[,DELAY]", help=(
            "Suites distributed and comm: each worker in a network namespace of its own, joined to the others by "
            "a link shaped to RATE (100mbit, 1gbit, 10gbit...) and DELAY per direction (50us, 1ms; needs the "
            "kernel's netem), measured before the jobs; needs root. Records say the link as asked and as "
            "measured, and the bytes on the wire per iteration."))] = None,
    compression: Annotated[Optional[list[str]], typer.Option(
        "--compression", help=f"Suite distributed: how the gradients are exchanged: {' | '.join(Compression.names())} "
                              "(e.g. powersgd:4, topk:0.01); a comma list or 'all' (none, fp16, bf16, powersgd:4, "
                              "topk:0.01, gtopk:0.01), repeatable (default: none, dense all-reduce).")] = None,
    oversubscribe: Annotated[bool, typer.Option(
        "--oversubscribe", help="Suites distributed and comm: allow more workers (x --threads) on a machine than it has "
                                "cores; the kernel time-slices the ranks, so iteration times include waiting for a core "
                                "(only comparisons bound by a slow --link say something). Recorded in each run.")] = False,
) -> None:
    """Run a suite on one or more frameworks and record every run in the store."""
    given = dict(locals())  # the options as given, before any other name is bound here
    given = {name: [str(v) for v in value] if isinstance(value, list) else value  # the axes' members: plain names
             for name, value in given.items()}
    request = RunRequest(**{f.name: given[f.name] for f in dataclasses.fields(RunRequest)})
    plan = lookup.refused(plan_run, request, lookup.catalog())  # one catalog: each suite file parsed once
    display = DISPLAYS[plan.kind]
    display.header(plan)
    records: list = []
    try:
        with progress_bar() as progress:
            task = progress.add_task("starting", total=plan.steps)
            execute_run(plan, display.events(progress, task), records)
            progress.update(task, description="done")
    except KeyboardInterrupt as e:
        interrupted(e, len(records), display.what, display.cut(plan, len(records)))
    except LinkError as e:  # --link: the link could not be made or measured (nothing ran on it)
        raise fail(str(e)) from None
    display.results(plan, records)


def _say_plan(plan: BenchmarkPlan) -> None:
    options = plan.options
    err.print(f"dlbench: suite {', '.join(s.name for s in plan.suites)}, {len(plan.runs)} runs on {options.device} "
              f"({', '.join(r.name for r in plan.runners)}), {options.threads} threads, store {plan.store.root}; "
              f"predictions: {plan.predicted_from}", highlight=False)
    if plan.request.no_telemetry:
        err.print("contention: not measured (--no-telemetry): no repeat is marked or replaced", highlight=False)


def _show_results(plan: BenchmarkPlan, records: list) -> None:
    """The runs' table (and generation's), LoadGen's, the contended and unstable runs; exit 1 where
    a run did not complete."""
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


def _cut(plan: BenchmarkPlan, done: int) -> str | None:
    """The run an interrupt cut short: the next after the `done` recorded."""
    return _label(plan.runs[done]) if done < len(plan.runs) else None


def _say_checks(progress: Progress, made, seconds: float) -> None:
    """The equivalence checks made before timing: one line per check and one for their cost."""
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


def _label(run: PlannedRun) -> str:
    scenario = f" {run.benchmark.scenario}" if run.benchmark.scenario else ""
    return f"{run.runner.name} {run.benchmark.name}{scenario} b={run.batch_size} {run.benchmark.precision} {run.compile}"


class _ProgressEvents:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def checks_made(self, made, seconds: float):
        _say_checks(self.progress, made, seconds)

    def environment(self, framework, progress):
        from .build_progress import show_on_progress_bar

        show_on_progress_bar(self.progress, self.task, progress)

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


@dataclass(frozen=True)
class SuiteDisplay:
    """How `dlbench run` shows a plan of one suite kind (workflows/suite_kinds.py SUITE_KIND_TABLE):
    `header(plan)` before it runs, `events(progress, task)` its executor's progress on the bar,
    `results(plan, records)` the tables after (and exit 1 where records did not complete); `what`
    its records are called when an interrupt counts them, `cut(plan, done)` the one an interrupt cut
    short where the plan knows (None: it does not say)."""

    what: str
    header: Callable[..., None]
    events: Callable[[Progress, object], object]
    results: Callable[..., None]
    cut: Callable[..., str | None] = lambda plan, done: None


DISPLAYS: dict[str, SuiteDisplay] = {
    "benchmark": SuiteDisplay("runs", _say_plan, _ProgressEvents, _show_results, _cut),
    "distributed": SuiteDisplay("runs", distributed.say_plan, distributed.ProgressEvents, distributed.show_training),
    "comm": SuiteDisplay("runs", distributed.say_plan, distributed.ProgressEvents, distributed.show_collectives),
    "kernels": SuiteDisplay("kernel runs", performance.say_kernel_plan, performance.KernelRunEvents,
                            performance.show_kernel_results),
    "convergence": SuiteDisplay("runs", convergence.say_plan, convergence.ProgressEvents, convergence.show_results),
}
