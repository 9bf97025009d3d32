"""`dlbench run --suite convergence` (suites of `kind: convergence`): time to a quality target per
framework and task, and the table `run` and `results` print for such records (time to target,
epochs, runs that reached it, input-bound share, the accuracy curve)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from .. import paths
from ..analysis.convergence import median_run
from ..axes import Precision
from ..definitions.convergence import ConvergenceTask
from ..definitions.loader import DefinitionError
from ..machine import available_cpus
from ..store.store import Store
from . import lookup
from .build_progress import show_on_progress_bar
from .console import err, fail, out, progress_bar
from .options import check_choice
from .signals import interrupted

SPARK = "▁▂▃▄▅▆▇█"


def run_convergence_suite(suite_path: Path, names: list[str], registry, *, benchmark, profile: str, device: str,
                          env: str, threads: int | None, repeats: int | None, store: Store, timeout: float,
                          data: Path | None, precision: list[str] | None, catalog) -> None:
    """Every task on every framework, one record per (framework, task); exit 1 if any has no score."""
    from ..execution.convergence import execute_convergence_run, plan_convergence
    from ..execution.datasets import DataError, check_data, digits_folder
    from ..execution.orchestrator import Orchestrator, RunOptions

    # the options this kind does not honour were refused before (workflows/suite_kinds.py)
    chosen_precision = None
    if precision:
        values = [p.strip() for item in precision for p in item.split(",")]
        if len(values) != 1:
            raise fail("--precision: a convergence suite runs one precision at a time")
        check_choice("precision", values[0], Precision.runs())
        chosen_precision = values[0]
    try:
        tasks = catalog.load_convergence_suite(suite_path, profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    if benchmark:
        for name in benchmark:
            check_choice("benchmark", name, [t.name for t in tasks])
        tasks = [t for t in tasks if t.name in benchmark]
    if repeats:
        tasks = [_with_runs(t, repeats) for t in tasks]
    folders: dict[str, Path] = {}
    try:  # every dataset checked before the first worker starts
        for t in tasks:
            if t.dataset.source == "package":
                folders[t.name] = digits_folder(paths.cache_dir(), t.dataset)
            elif data is None:
                raise fail(f"{suite_path}: task {t.name} reads {t.dataset.name} from --data DIR "
                           f"({', '.join(t.dataset.train_files + t.dataset.eval_files)}); give --data")
            else:
                counts = check_data(t.dataset, data)
                _check_counts(t, counts, data)
                folders[t.name] = data.resolve()
    except DataError as e:
        raise fail(str(e)) from None
    threads = threads or available_cpus()
    runners = [lookup.runner(registry, n) for n in names]
    runs = plan_convergence(runners, tasks)
    err.print(f"dlbench: suite {tasks[0].suite if tasks else suite_path.stem} (convergence), {len(runs)} runs ({', '.join(t.name for t in tasks)} "
              f"on {', '.join(names)}; {len(tasks[0].seeds) if tasks else 0} seeds each) on {device}, {threads} "
              f"threads, store {store.root}", highlight=False)
    options = RunOptions(device=device, env_backend=env, threads=threads, repeats=None, timeout_s=timeout,
                         cache=paths.cache_dir(), telemetry=None)
    records = []
    try:
        with progress_bar() as progress:
            bar = progress.add_task("starting", total=sum(len(r.task.seeds) for r in runs))
            events = _Events(progress, bar)
            orch = Orchestrator(store, options, events)
            for r in runs:
                record = execute_convergence_run(orch, r, folders[r.task.name], chosen_precision, events)
                records.append(record)
                if record.status != "ok":
                    progress.console.print(f"[yellow]{record.status}[/]: {escape(r.runner.name)} {escape(r.task.name)}: "
                                           f"{escape(str(record.reason))}", highlight=False, soft_wrap=True)
            progress.update(bar, description="done")
    except KeyboardInterrupt as e:
        interrupted(e, len(records), "runs")
    lookup.refresh_index(store)
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


def _with_runs(task: ConvergenceTask, runs: int) -> ConvergenceTask:
    from dataclasses import replace

    return replace(task, seeds=tuple(task.seeds[0] + k for k in range(runs)) if task.seeds else tuple(range(runs)))


def _check_counts(task: ConvergenceTask, counts: dict[str, int], data: Path) -> None:
    from ..execution.datasets import DataError

    for split in ("train", "eval"):
        asked = getattr(task.spec.dataset, f"{split}_samples")
        if asked is not None and asked > counts[split]:
            raise DataError(data, f"task {task.name} asks for {asked} {split} samples of {task.dataset.name}; "
                                  f"the files hold {counts[split]}")


class _Events:
    def __init__(self, progress, bar):
        self.progress, self.bar = progress, bar

    def environment(self, framework, progress):
        show_on_progress_bar(self.progress, self.bar, progress)

    def seed_started(self, run, seed, index):
        self.progress.update(self.bar, description=escape(f"{run.runner.name} {run.task.name} seed {seed} "
                                                          f"({index + 1}/{len(run.task.seeds)})"))

    def seed_done(self, run, seed_run):
        self.progress.advance(self.bar)


def sparkline(values: list[float], low: float | None = None, high: float | None = None) -> str:
    if not values:
        return ""
    low = min(values) if low is None else low
    high = max(values) if high is None else high
    span = (high - low) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int((v - low) / span * (len(SPARK) - 1) + 0.5)))] for v in values)


def convergence_table(records, title: str) -> Table:
    table = Table(title=title)
    for col, justify in (("framework", "left"), ("task", "left"), ("status", "left"), ("time to target", "right"),
                         ("epochs", "right"), ("reached", "right"), ("init s", "right"), ("input-bound", "right"),
                         ("accuracy by epoch (median run)", "left")):
        table.add_column(col, justify=justify)
    for r in records:
        c = r.convergence
        if c is None:
            continue
        run = median_run(c)
        curve = [e["accuracy"] for e in run.evals] if run else []
        inits = [x.init_s for x in c.runs if x.init_s is not None]
        last = f" {curve[-1]:.3f}" if curve else ""
        table.add_row(
            escape(str(r.framework.get("name"))), escape(c.task), escape(r.status),
            f"{c.score_s:.2f} s" if c.score_s is not None else "—",
            f"{c.epochs_to_target:.1f}" if c.epochs_to_target is not None else "—",
            f"{c.reached}/{len(c.runs)} ≥{c.target:.0%}",
            f"{sum(inits) / len(inits):.1f}" if inits else "—",
            f"{c.input_bound_share:.1%}" if c.input_bound_share is not None else "—",
            escape(sparkline(curve, 0.0, 1.0) + last))
    return table


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
