"""The kernels suite and the machine profile on the command line: how `dlbench run --suite kernels`
shows its plan, progress and records (the planning and the runs are workflows/kernels.py's),
`dlbench kernels` and `dlbench calibrate` (workflows/calibration.py). The model itself is
src/dlbench/performance/, `dlbench predict` is prediction.py."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ..axes import KERNEL_DTYPE, Precision
from ..definitions.loader import DefinitionError
from ..performance.probes import BUDGET_S
from ..store.store import Store
from ..workflows.calibration import CalibrateRequest, CalibrationFailed
from ..workflows.calibration import calibrate as workflows_calibrate
from ..workflows.requests import RequestError
from . import lookup
from .build_progress import show_on_progress_bar
from .console import err, fail, out, progress_bar
from .options import (
    DeviceOption,
    FormatOption,
    StoreOption,
    ThreadsOption,
    TimeoutOption,
    axis_option,
    check_format,
)
from .signals import interrupted, stops_on_signals

if TYPE_CHECKING:
    # imported where used: the kernel runs, stores and the model are for these commands only
    from ..store.kernels import KernelRecord
    from ..store.profiles import MachineProfile
    from ..workflows.kernels import KernelPlan

RICH_ROWS_MAX = 150  # more kernels than this: one summary row per run instead


class KernelRunEvents:
    """Kernel runs' events (workflows/calibration.py execute_kernel_runs) on a progress bar: each run's
    label and kernels, one line for each run that did not end ok."""

    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def kernel_runs_planned(self, count: int):
        pass  # the bar was made for them

    def environment(self, framework, progress):
        show_on_progress_bar(self.progress, self.task, progress)

    def kernel_run_started(self, label: str, kernels: int):
        self.progress.update(self.task, description=escape(f"{label} ({kernels} kernels)"))

    def kernel_run_done(self, label: str, record):
        self.progress.advance(self.task)
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {escape(label)}: {escape(str(record.reason))}",
                                        highlight=False, soft_wrap=True)


class _KernelProgress:
    """calibrate's kernel runs (workflows/calibration.py's events), batch after batch: a progress bar
    for each batch of runs, from kernel_runs_planned to its last run's end; `close` ends one cut
    short."""

    def __init__(self):
        self.done, self._bar, self._left = 0, None, 0

    def kernel_runs_planned(self, count: int):
        self.close()
        self._bar = progress_bar()
        progress = self._bar.__enter__()
        self._on_bar, self._left = KernelRunEvents(progress, progress.add_task("starting", total=count)), count
        if not count:
            self.close()

    def environment(self, framework, progress):
        if self._bar:
            self._on_bar.environment(framework, progress)

    def kernel_run_started(self, label: str, kernels: int):
        self._on_bar.kernel_run_started(label, kernels)

    def kernel_run_done(self, label: str, record):
        self.done += 1
        self._left -= 1
        self._on_bar.kernel_run_done(label, record)
        if not self._left:
            self._on_bar.progress.update(self._on_bar.task, description="done")
            self.close()

    def note(self, line: str):
        (self._on_bar.progress.console if self._bar else err).print(escape(line), highlight=False, soft_wrap=True)

    def close(self):
        if self._bar:
            bar, self._bar = self._bar, None
            bar.__exit__(None, None, None)


def _fmt_rate(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    return f"{value / 1e9:,.1f} {'GB/s' if unit == 'B/s' else 'GFLOP/s'}"


def _shape(spec: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in spec["shape"].items())


def kernel_table(records: list[KernelRecord], title: str) -> Table:
    import statistics

    rows = sum(len(r.kernels) for r in records)
    t = Table(title=title)
    if rows > RICH_ROWS_MAX:
        for col in ("framework", "benchmark", "status", "kernels ok", "skipped", "failed", "median % of ceiling",
                    "best"):
            t.add_column(col, justify="left" if col in ("framework", "benchmark", "status") else "right")
        for r in records:
            counts = Counter(k.status for k in r.kernels)
            fractions = [k.fraction for k in r.kernels if k.fraction is not None]
            best = max((k for k in r.kernels if k.achieved and k.unit == "FLOP/s"), key=lambda k: k.achieved,
                       default=None)
            t.add_row(escape(str(r.framework.get("name"))), escape(r.benchmark), _status(r.status),
                      str(counts["ok"]), str(counts["skipped"]), str(counts["failed"]),
                      f"{100 * statistics.median(fractions):.0f}%" if fractions else "",
                      _fmt_rate(best.achieved, best.unit) if best else "")
        t.caption = "one row per run (`dlbench kernels --framework FW --benchmark NAME` lists its kernels)"
        return t
    for col in ("framework", "benchmark", "kernel", "shape", "dtype", "status", "median ms", "achieved",
                "% of ceiling"):
        t.add_column(col, justify="right" if col in ("median ms", "achieved", "% of ceiling") else "left")
    for r in records:
        for k in r.kernels:
            t.add_row(escape(str(r.framework.get("name"))), escape(r.benchmark), k.spec["kind"], _shape(k.spec),
                      k.spec["dtype"], _status(k.status), f"{k.median_s * 1e3:.3f}" if k.median_s is not None else "",
                      _fmt_rate(k.achieved, k.unit), f"{100 * k.fraction:.0f}%" if k.fraction is not None else "")
    ceilings = {r.ceilings for r in records if r.ceilings}
    t.caption = (f"ceilings of machine profile {', '.join(sorted(ceilings))}" if ceilings else
                 "no machine profile when these ran: `dlbench calibrate` measures the ceilings")
    return t


def _status(status: str) -> str:
    return f"[{ {'ok': 'green', 'skipped': 'yellow'}.get(status, 'red') }]{status}[/]"


def _print_skips(records: list[KernelRecord]) -> None:
    reasons = Counter((str(r.framework.get("name")), k.status, k.reason) for r in records for k in r.kernels
                      if k.status != "ok")
    for (framework, status, reason), n in sorted(reasons.items(), key=lambda x: (x[0][0], x[0][1], str(x[0][2]))):
        first = str(reason).splitlines()[0] if reason else ""
        err.print(f"[yellow]{status}[/] {n} kernel{'s' if n != 1 else ''} on {escape(framework)}: {escape(first[:300])}",
                  highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------- list

def list_kernels(path: Path, profile: str, device: str) -> None:
    """`dlbench list --suite kernels`: the suite's benchmarks under this profile."""
    from ..performance.kernel_suite import load_kernel_suite

    try:
        suite = load_kernel_suite(path, lookup.catalog(), profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    t = Table(title=f"dlbench suite {suite.name} (kernels, profile {profile}, {device})")
    for col in ("benchmark", "kernels", "kinds", "dtypes", "shapes from", "repeats"):
        t.add_column(col, justify="right" if col in ("kernels", "repeats") else "left")
    for b in suite.benchmarks:
        t.add_row(escape(b.name), str(len(b.specs)), ", ".join(dict.fromkeys(s.kind for s in b.specs)),
                  ", ".join(dict.fromkeys(s.dtype for s in b.specs)), escape(b.source), str(b.policy.repeats))
    c = suite.ceilings
    t.caption = (f"dlbench calibrate measures: square matmul {', '.join(map(str, c.matmul_sizes))} in "
                 f"{', '.join(c.dtypes)}; copies of {', '.join(f'{b:,}' for b in c.copy_bytes)} B; the "
                 f"smallest operation ({c.dispatch_bytes} B); then a few of the layer shapes above per operation "
                 "class (class probes; --full: all of them)")
    out.print(t)


# ---------------------------------------------------------------------------------------- run

def say_kernel_plan(plan: KernelPlan) -> None:
    """The lines before the kernel runs: what the plan could not find, what runs where, and each dtype
    the device does not compute in."""
    for note in plan.notes:
        err.print(f"[yellow]note[/]: {escape(note)}", highlight=False)
    err.print(f"dlbench: suite {plan.suite.name} (kernels), {len(plan.runs)} runs ({plan.kernels} kernels each "
              f"framework) on {plan.device} ({', '.join(r.name for r in plan.runners)}), {plan.threads} threads, "
              f"store {plan.store.root}", highlight=False)
    for dtype, why in plan.support.items():
        if why:
            fate = "measured as the frameworks emulate it" if plan.device == "cpu" else "skipped"
            err.print(f"[yellow]{dtype}[/]: {fate} on this {plan.device}: {escape(why)}", highlight=False)


def show_kernel_results(plan: KernelPlan, records: list[KernelRecord]) -> None:
    """The kernels' table and why kernels were skipped or failed; exit 1 where a run or a kernel did
    not complete."""
    out.print(kernel_table(records, "dlbench run: kernels"))
    _print_skips(records)
    bad = [r for r in records if r.status in ("failed", "timeout") or any(k.status == "failed" for k in r.kernels)]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} kernel runs did not complete; see the reasons above", 1)


# ---------------------------------------------------------------------------------------- kernels

def kernels(
    store: StoreOption = None,
    framework: Annotated[Optional[list[str]], typer.Option(help="Only these frameworks; repeatable.")] = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these kernel benchmarks; repeatable.")] = None,
    format: FormatOption = "table",
) -> None:
    """The kernel suite's results in the store: the latest run of each framework and kernel benchmark."""
    from ..store.kernels import KernelStore

    check_format(format)
    st, frameworks, benchmarks = lookup.existing_store(store, "dlbench run --suite kernels"), framework, benchmark
    problems: list[str] = []
    latest: dict[tuple[str, str], KernelRecord] = {}
    for r in KernelStore(st).records(problems):
        latest[(str(r.framework.get("name")), r.benchmark)] = r  # oldest first: the latest wins
    for p in problems:
        err.print(f"[red]unreadable[/] {escape(p)}", highlight=False, soft_wrap=True)
    chosen = [r for (fw, b), r in sorted(latest.items())
              if (not frameworks or fw in frameworks) and (not benchmarks or b in benchmarks)]
    if not chosen:
        raise fail(f"no kernel records{' matching' if frameworks or benchmarks else ''} in {st.root / 'kernels'} "
                   "(`dlbench run --suite kernels` makes them)", 1)
    chosen = [_with_ceilings(st, r) for r in chosen]
    if format == "json":
        sys.stdout.write(json.dumps([json.loads(r.model_dump_json(exclude={"output_tail"})) for r in chosen],
                                    indent=1) + "\n")
        return
    table = kernel_table(chosen, f"kernels in {st.root} (latest run of each framework and benchmark)")
    out.print(table)
    _print_skips(chosen)


def _with_ceilings(store: Store, record: KernelRecord) -> KernelRecord:
    """A record that ran before its machine had a profile, with the fractions of the ceilings of the
    latest profile for its machine, device and threads (its `ceilings` names that profile)."""
    from ..performance.kernel_suite import ceiling_of
    from ..performance.kernels import KernelSpec
    from ..store.profiles import ProfileError, ProfileStore

    if record.ceilings is not None:
        return record
    try:
        profile = ProfileStore(store).latest_matching(str(record.machine.get("machine_id")), record.device,
                                                      record.threads_requested)
    except ProfileError:
        return record
    if profile is None:
        return record
    kernels = []
    for k in record.kernels:
        ceiling = ceiling_of(KernelSpec.from_dict(k.spec), profile)
        kernels.append(k.model_copy(update={"ceiling": ceiling, "fraction": k.achieved / ceiling
                                            if k.achieved and ceiling else None}))
    return record.model_copy(update={"kernels": kernels, "ceilings": f"{profile.ref} (measured after this run)"})


# ---------------------------------------------------------------------------------------- calibrate


@stops_on_signals
@lookup.reports_unsaved_records
def calibrate(
    framework: Annotated[list[str], typer.Option(help="Frameworks to measure the ceilings with; 'all' or a comma list.")] = ["all"],
    workers: Annotated[Optional[int], typer.Option(min=2, help=(
        "Fit the all-reduce and all-to-all lines of only this many workers from the comm suite's records "
        "(default: every worker count found).")) ] = None,
    full: Annotated[bool, typer.Option("--full", help=(
        "Also time every layer shape of the kernels suite's layer_shapes benchmarks at the default profile "
        "(what `run --suite kernels` times; many minutes per framework): predictions then come from measured "
        "shapes.")) ] = False,
    suite: Annotated[Optional[list[str]], typer.Option(help=(
        "With --full: time the layer shapes of these suites only (cnn, fcn, rnn, transformer). Repeatable.")) ] = None,
    precision: Annotated[Optional[list[Precision]], axis_option(
        Precision, accepted=list(KERNEL_DTYPE), lists=True, help=(
            "With --full: time the layer shapes of these precisions only (default: every one the device computes "
            "in); a comma list, repeatable."))] = None,
    quick: Annotated[bool, typer.Option("--quick", help=(
        "Seconds, for tests: short ceilings and one probe per operation class from the smoke profile's shapes.")) ] = False,
    budget: Annotated[float, typer.Option(min=1.0, metavar="SECONDS", help=(
        "Estimated time allowed for the class probes of each framework (shapes estimated to take longer "
        "are left out).")) ] = BUDGET_S,
    device: DeviceOption = "auto",
    env: Annotated[str, typer.Option(help="venv | current")] = "venv",
    threads: ThreadsOption = None,
    timeout: TimeoutOption = 900.0,
    store: StoreOption = None,
) -> None:
    """Measure this machine's ceilings and each operation class's efficiency, gather its kernel times and
    all-reduce and all-to-all fits: a new machine profile."""
    precision = [p.value for p in precision] if precision else None  # the axis's members: plain names
    request = CalibrateRequest(framework=framework, workers=workers, full=full, suite=suite, precision=precision,
                               quick=quick, budget=budget, device=device, env=env, threads=threads, timeout=timeout,
                               store=store)
    events = _KernelProgress()
    try:
        result = workflows_calibrate(request, events)
    except RequestError as e:
        raise fail(str(e)) from None
    except CalibrationFailed as e:
        raise fail(str(e), 1) from None
    except KeyboardInterrupt as e:
        interrupted(e, events.done, "kernel runs")
    finally:
        events.close()
    stored = result.profile
    _print_profile(stored, result.path)
    _print_classes(stored, {r.name: r.model for r in result.runners})
    timing = ", ".join(f"{phase} {s:,.1f} s" for phase, s in result.seconds.items() if phase != "total")
    count = len(result.runners)
    err.print(f"dlbench calibrate took {result.seconds['total']:,.1f} s for {count} "
              f"framework{'s' if count != 1 else ''} ({timing})", highlight=False)
    for n in result.notes:
        err.print(f"[yellow]note[/]: {escape(n)}", highlight=False, soft_wrap=True)
    if not stored.class_probes:
        err.print("[yellow]note[/]: no class probe was measured: kernels not timed at their shape will be roofline "
                  "estimates at the ceilings", highlight=False)


def _operand_terms(fit) -> str:
    """A matmul fit's time per operand element and, in the `outputs` form, per output element more."""
    cells = [f"{fit.per_operand_s * 1e9:,.3f} ns"] if fit.per_operand_s or fit.form != "affine" else []
    if fit.form == "outputs":
        cells.append(f"+ {fit.per_output_s * 1e9:,.3f} ns per output")
    return " ".join(cells)


def _print_classes(p: MachineProfile, facts: dict) -> None:
    """Each framework's probes per operation class: each one's efficiency (of the roofline at the
    ceilings, net of the call) and the class's fit, overhead + roofline / efficiency."""
    from ..performance.model import class_fits, class_points

    for fw in sorted(p.class_probes):
        compiled = facts[fw].compiled if fw in facts else False
        points, fits = class_points(p, fw, compiled), class_fits(p, fw, compiled)  # the fits `predict` uses
        t = Table(title=f"{fw}: efficiency per operation class")
        for col in ("class", "probes", "probe efficiencies", "fit: overhead", "fit: efficiency", "fit: per operand"):
            t.add_column(col, justify="left" if col == "class" else "right")
        for cls, pts in sorted(points.items()):
            pts = sorted(pts, key=lambda q: q.roofline_s)
            fit = fits[cls]
            t.add_row(escape(cls), str(len(pts)),
                      ", ".join(f"{100 * q.efficiency:.1f}%{'*' if q.overhead_bound else ''}" for q in pts),
                      f"{fit.overhead_s * 1e6:,.1f} µs", f"{100 * fit.efficiency:.1f}%",
                      _operand_terms(fit))
        t.caption = ("probe efficiency: roofline time at the ceilings (a matmul's: its FLOPs at the peak) / time net "
                     "of the call, smallest probe first (* overhead-bound: left out of the fit where three others "
                     "remain); a shape not timed takes overhead + "
                     "roofline / efficiency (+ per operand x its operands' elements: a matmul's mk + kn + mn; + per output x mn "
                     "where its probes chose that form)")
        out.print(t)


def _print_profile(p: MachineProfile, path: Path) -> None:
    t = Table(title=f"machine profile {p.ref} ({p.device}, {p.threads} threads)")
    t.add_column("ceiling")
    t.add_column("value", justify="right")
    t.add_column("by")
    for dtype, c in sorted(p.matmul_peak.items()):
        t.add_row(f"peak matmul {dtype}", f"{c.flops_per_s / 1e9:,.1f} GFLOP/s", escape(f"{c.framework}: {c.kernel}"))
    for b in p.copy_bandwidth:
        t.add_row(f"copy bandwidth, {b.bytes / 2**20:g} MiB moved", f"{b.bytes_per_s / 1e9:,.1f} GB/s", escape(b.framework))
    for fw, s in sorted(p.dispatch_s.items()):
        cold = p.dispatch_cold_s.get(fw)
        t.add_row("smallest operation" + (", warm / cold" if cold else ""),
                  f"{s * 1e6:,.1f}" + (f" / {cold * 1e6:,.1f}" if cold else "") + " µs", escape(fw))
    for fw, points in sorted(p.elementwise_bandwidth.items()):
        t.add_row("element-wise (relu) bandwidth", ", ".join(f"{b.bytes_per_s / 1e9:,.1f}" for b in points) + " GB/s",
                  escape(f"{fw}, at {', '.join(f'{b.bytes / 2**20:g}' for b in points)} MiB"))
    for fw, times in sorted(p.kernels.items()):
        t.add_row("kernel times", f"{len(times)} kernels", escape(fw))
    for fw, probes in sorted(p.class_probes.items()):
        from ..performance.class_efficiency import efficiency_class
        from ..performance.kernels import KernelSpec

        classes = {efficiency_class(KernelSpec.from_dict(q.spec)) for q in probes}
        t.add_row("class probes", f"{len(probes)} shapes of {len(classes)} classes", escape(fw))
    for fw, y in sorted(p.yardstick.items()):
        t.add_row("yardstick (512³ matmul, 16 MiB relu)",
                  " / ".join(f"{seconds * 1e3:,.2f}" for seconds in y.median_s.values()) + " ms",
                  escape(f"{fw}: median of {y.workers} workers, slowest {y.slowest:.2f}x, fastest {y.fastest:.2f}x"))
    for c in p.comm:
        t.add_row(f"{c.collective.replace('_', '-')}, {c.workers} workers",
                  f"{c.startup_s * 1e6:,.1f} µs + {c.per_byte_s * 1e9:.3f} ns/B",
                  escape(f"{c.framework}: α {c.alpha_s * 1e6:.1f} µs, β {c.beta_s_per_byte * 1e9:.3f} ns/B, "
                         f"R² {c.r2:.3f}, {c.points} sizes"))
    t.caption = f"stored as {path}"
    out.print(t)


