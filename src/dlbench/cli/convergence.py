"""Convergence suites (`kind: convergence`, time to a quality target per framework and task) on the
command line: how `dlbench run` shows their plan, progress and records (the planning and the runs are
workflows/convergence.py's), the table `run` and `results` print for such records (time to target,
epochs, runs that reached it, input-bound share, the accuracy curve), and `dlbench list` of such a
suite."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from ..analysis.convergence import median_run
from ..definitions.loader import DefinitionError
from ..store.store import Store
from . import lookup
from .build_progress import show_on_progress_bar
from .console import err, fail, out

if TYPE_CHECKING:
    from ..workflows.convergence import ConvergencePlan

SPARK = "▁▂▃▄▅▆▇█"


def say_plan(plan: ConvergencePlan) -> None:
    """The line before the runs: the tasks, frameworks, seeds, device, threads and store."""
    names = ", ".join(r.name for r in plan.runners)
    seeds = len(plan.tasks[0].seeds) if plan.tasks else 0
    parallel = ""
    if plan.jobs is not None:
        methods = list(dict.fromkeys(r.compression for r in plan.runs))
        parallel = (f"; data-parallel on {plan.workers} workers, {', '.join(methods)}"
                    + (f", link {plan.link.asked}" if plan.link is not None else ""))
    err.print(f"dlbench: suite {plan.suite} (convergence), {len(plan.runs)} runs ({', '.join(t.name for t in plan.tasks)} "
              f"on {names}; {seeds} seeds each{parallel}) on {plan.options.device}, {plan.options.threads} "
              f"threads{' per worker' if plan.jobs is not None else ''}, store {plan.store.root}", highlight=False)
    crowded = plan.jobs.placement.oversubscription(plan.jobs.threads) if plan.jobs is not None else None
    if crowded is not None:
        name, threads, cores = crowded
        err.print(f"[yellow]oversubscribed[/] (--oversubscribe): {threads} threads of {plan.workers} workers share "
                  f"the {cores} cores of {escape(name)}; the kernel time-slices the ranks, so times to target include "
                  "waiting for a core: compare methods on one link with one another, not against fewer workers",
                  highlight=False, soft_wrap=True)


class ProgressEvents:
    """workflows/convergence.py's events on `dlbench run`'s progress bar: each seed's run, one line
    for each run that did not end ok."""

    def __init__(self, progress, bar):
        self.progress, self.bar = progress, bar

    def environment(self, framework, progress):
        show_on_progress_bar(self.progress, self.bar, progress)

    def seed_started(self, run, seed, index):
        self.progress.update(self.bar, description=escape(f"{run.label} seed {seed} "
                                                          f"({index + 1}/{len(run.task.seeds)})"))

    def link_ready(self, link, measured):
        """The shaped link made and measured (--link with --workers), before the first job."""
        self.progress.console.print(
            f"link {link.spec.asked}: workers in namespaces {link.namespace(0)}..{link.namespace(link.workers - 1)} "
            f"({link.subnet}); measured {measured.bandwidth_bps / 1e6:,.1f} Mbit/s, round trip "
            f"{measured.rtt_s * 1e6:,.0f} us", highlight=False)

    def seed_done(self, run, seed_run):
        self.progress.advance(self.bar)

    def run_done(self, run, record):
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {escape(run.label)}: "
                                        f"{escape(str(record.reason))}", highlight=False, soft_wrap=True)


def show_results(plan: ConvergencePlan, records: list) -> None:
    """The time-to-accuracy table; exit 1 where a run has no score."""
    out.print(convergence_table(records, "dlbench run: time to accuracy"))
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} convergence runs have no score; see the reasons above", 1)


def list_convergence(path: Path, profile: str, device: str) -> None:
    """`dlbench list --suite convergence`: each task's network, dataset, target, schedule and seeds."""
    try:
        tasks = lookup.catalog().load_convergence_suite(path, profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    table = Table(title=f"convergence suite {tasks[0].suite if tasks else path.stem} (profile {profile})")
    for col in ("task", "network", "params", "dataset", "batch", "optimiser", "target", "max epochs", "seeds"):
        table.add_column(col)
    for t in tasks:
        o = t.spec.optimizer
        decay = o.decay.kind + (f" at {o.decay.boundaries} x{o.decay.factor:g}" if o.decay.kind == "step" else "")
        table.add_row(escape(t.name), escape(t.network.name), f"{t.network.params:,}", t.dataset.name,
                      str(t.spec.batch_size), f"SGD lr {o.learning_rate:g} m {o.momentum:g} wd {o.weight_decay:g}, "
                      f"warm-up {o.warmup_epochs:g} ep, {decay}", f"{t.spec.target.metric} {t.spec.target.value:g}",
                      str(t.spec.max_epochs), ",".join(map(str, t.seeds)))
    out.print(table)


def sparkline(values: list[float], low: float | None = None, high: float | None = None) -> str:
    if not values:
        return ""
    low = min(values) if low is None else low
    high = max(values) if high is None else high
    span = (high - low) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int((v - low) / span * (len(SPARK) - 1) + 0.5)))] for v in values)


def convergence_table(records, title: str) -> Table:
    table = Table(title=title)
    shown = [r for r in records if r.convergence is not None]
    # data-parallel runs (schema 19): their workers, link and compression, and the speedup over dense
    parallel = any(r.distributed is not None for r in shown)
    columns = [("framework", "left"), ("task", "left")]
    if parallel:
        columns += [("workers", "right"), ("link", "left"), ("compression", "left")]
    columns += [("status", "left"), ("time to target", "right")]
    if parallel:
        columns += [("vs dense", "right")]
    columns += [("epochs", "right"), ("reached", "right"), ("init s", "right"), ("input-bound", "right"),
                ("accuracy by epoch (median run)", "left")]
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for r in shown:
        c = r.convergence
        run = median_run(c)
        curve = [e["accuracy"] for e in run.evals] if run else []
        inits = [x.init_s for x in c.runs if x.init_s is not None]
        last = f" {curve[-1]:.3f}" if curve else ""
        cells = [escape(str(r.framework.get("name"))), escape(c.task)]
        if parallel:
            cells += [str(r.distributed.workers) if r.distributed else "1",
                      escape(r.link.asked) if r.link else "—", escape(r.workload.compression or "—")]
        cells += [escape(r.status), f"{c.score_s:.2f} s" if c.score_s is not None else "—"]
        if parallel:
            cells.append(against_dense_cell(c))
        table.add_row(
            *cells,
            f"{c.epochs_to_target:.1f}" if c.epochs_to_target is not None else "—",
            f"{c.reached}/{len(c.runs)} ≥{c.target:.0%}",
            f"{sum(inits) / len(inits):.1f}" if inits else "—",
            f"{c.input_bound_share:.1%}" if c.input_bound_share is not None else "—",
            escape(sparkline(curve, 0.0, 1.0) + last))
    return table


def against_dense_cell(c) -> str:
    """The score's speedup over the dense run of its invocation (×), each seed's after it; "—" for
    the dense run itself, "no score" where either has none."""
    d = c.against_dense
    if d is None:
        return "—"
    seeds = " ".join(f"{s.speedup:.2f}" if s.speedup is not None else "✗" for s in d.seeds)
    head = f"{d.score_speedup:.2f}×" if d.score_speedup is not None else "no score"
    return f"{head} ({seeds})"


def print_convergence_details(store: Store, rows: list[dict]) -> None:
    """Under `dlbench results`' table: the convergence runs among `rows` (time to target, epochs,
    runs that reached it, input-bound share, the accuracy curve of the median run). Reads just
    those records."""
    from ..store.store import StoreError

    records = []
    for row in rows:
        if row.get("mode") != "convergence":
            continue
        try:
            records.append(store.read(store.runs / f"{row['run_id']}.json"))
        except (StoreError, OSError) as e:
            err.print(f"[yellow]skipped[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    if records:
        out.print(convergence_table(records, "time to accuracy"))
