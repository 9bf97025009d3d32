"""The multi-worker suites (kinds distributed and comm) on the command line: how `dlbench run` shows
their plan, progress and records (the planning and the jobs are workflows/distributed.py's), the
tables `results` prints under its own for such records, and `dlbench list` of such a suite."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.progress import Progress

from ..definitions.loader import DefinitionError
from ..store.store import Store
from . import lookup
from .build_progress import show_on_progress_bar
from .console import err, fail, out

if TYPE_CHECKING:
    from ..workflows.distributed import DistributedPlan


def say_plan(plan: DistributedPlan) -> None:
    """The line before the jobs: what runs where, with how many workers and threads."""
    placement, data_parallel = plan.options.placement, plan.kind == "distributed"
    where = ", ".join(f"{h.address} x{h.slots}" for h in placement.hosts)
    names = ", ".join(r.name for r in plan.runners)
    err.print(f"dlbench: suite {plan.suite.name} ({plan.kind}), {plan.steps} runs on {plan.options.device} ({names}), "
              f"{placement.workers} workers ({placement.variant}: {where}), {plan.options.threads} threads per worker"
              + (f", {plan.options.scaling} scaling" if data_parallel else "") + f", store {plan.store.root}"
              + (f"; predictions: {plan.predicted_from}" if data_parallel else ""),
              highlight=False)
    crowded = placement.oversubscription(plan.options.threads)
    if crowded is not None:
        name, threads, cores = crowded
        err.print(f"[yellow]oversubscribed[/] (--oversubscribe): {threads} threads of {placement.workers} workers share "
                  f"the {cores} cores of {escape(name)}; the kernel time-slices the ranks, so iteration times include "
                  "waiting for a core: only comparisons bound by the link (a slow --link) are meaningful, not "
                  "scaling efficiency or compute time", highlight=False, soft_wrap=True)
    elif plan.request.oversubscribe:
        err.print("--oversubscribe: not needed, every worker's threads have cores of their own", highlight=False)


class ProgressEvents:
    """workflows/distributed.py's events on `dlbench run`'s progress bar: a job's label and repeat,
    one line for each run that did not end ok."""

    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task
        self._repeats = 1

    def environment(self, framework, progress):
        show_on_progress_bar(self.progress, self.task, progress)

    def run_started(self, label, repeats):
        self._label, self._repeats = escape(label), repeats
        self.progress.update(self.task, description=f"{self._label} (job 1/{repeats})")

    def repeat_done(self, label, index, status):
        if index + 2 <= self._repeats and status == "ok":
            self.progress.update(self.task, description=f"{self._label} (job {index + 2}/{self._repeats})")

    def link_ready(self, link, measured):
        """The shaped link made and measured (--link), before the first job."""
        self.progress.console.print(
            f"link {link.spec.asked}: workers in namespaces {link.namespace(0)}..{link.namespace(link.workers - 1)} "
            f"({link.subnet}); measured {measured.bandwidth_bps / 1e6:,.1f} Mbit/s, round trip "
            f"{measured.rtt_s * 1e6:,.0f} us", highlight=False)

    def run_done(self, label, record):
        self.progress.advance(self.task)
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {escape(label)}: {escape(str(record.reason))}",
                                        highlight=False, soft_wrap=True)


def show_training(plan: DistributedPlan, records: list) -> None:
    """Kind distributed: the training table (workers, slowest rank, efficiency, exposed
    communication); exit 1 where a run did not complete."""
    from .distributed_tables import training_table

    out.print(training_table(records, f"dlbench run: {plan.suite.name}"))
    _show_links(records)
    _fail_incomplete(records)


def show_collectives(plan: DistributedPlan, records: list) -> None:
    """Kind comm: each collective's bandwidth against message size (or why it has none); exit 1
    where a run did not complete."""
    from .distributed_tables import bandwidth_table

    for r in records:
        out.print(bandwidth_table(r) if r.comm else escape(f"{r.benchmark} {r.framework.get('name')}: "
                                                          f"{r.status}: {r.reason}"), highlight=False)
    _show_links(records)
    _fail_incomplete(records)


def _show_links(records: list) -> None:
    """The runs on a shaped link (--link): the link as asked and measured, bytes on the wire."""
    from .distributed_tables import link_table

    linked = [r for r in records if r.link is not None]
    if linked:
        out.print(link_table(linked))


def _fail_incomplete(records: list) -> None:
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} runs did not complete; see the reasons above and `dlbench results`", 1)


def print_distributed_details(store: Store, rows: list[dict]) -> None:
    """Under `dlbench results`' table: the multi-worker runs among `rows`, as tables of their own
    (training: workers, slowest rank, efficiency, exposed communication; collectives: bandwidth
    against message size). Reads just those records."""
    from ..store.store import StoreError
    from .distributed_tables import bandwidth_table, training_table

    chosen = [row for row in rows if row.get("workers") is not None and row.get("status") == "ok"]
    records = []
    for row in chosen:
        try:
            records.append(store.read(store.runs / f"{row['run_id']}.json"))
        except (StoreError, OSError) as e:
            err.print(f"[yellow]skipped[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    training = [r for r in records if r.comm is None]
    if training:
        out.print(training_table(training, "distributed training runs"))
    for r in records:
        if r.comm is not None:
            out.print(bandwidth_table(r))
    _show_links(records)


def list_distributed(path: Path, profile: str, device: str) -> None:
    """`dlbench list --suite distributed|comm`: what the suite runs under this profile."""
    from rich.table import Table

    from .distributed_tables import human_bytes

    try:
        suite = lookup.catalog().load_distributed_suite(path, profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    if suite.kind == "comm":
        c = suite.comm
        table = Table(title=f"suite {suite.name} (comm, profile {profile}): {c.dtype}, "
                            f"{c.policy.warmup_iters} warm-up + {c.policy.measure_iters} measured iterations, "
                            f"{c.policy.repeats} job(s)")
        table.add_column("collective")
        table.add_column("sizes")
        for name in c.collectives:
            table.add_row(name, f"{human_bytes(c.sizes[0])} .. {human_bytes(c.sizes[-1])} ({len(c.sizes)} sizes)")
    else:
        p = suite.benchmarks[0].policy if suite.benchmarks else None
        table = Table(title=f"suite {suite.name} (distributed, profile {profile}, {suite.scaling} scaling by default)"
                            + (f": {p.warmup_iters} warm-up + {p.measure_iters} measured iterations, "
                               f"{p.repeats} job(s)" if p else ""))
        for col in ("benchmark", "network", "batch sizes (global when strong, per worker when weak)", "params"):
            table.add_column(col)
        for b in suite.benchmarks:
            table.add_row(escape(b.name), escape(b.network.name), ",".join(map(str, b.batch_sizes)),
                          f"{b.network.params:,}")
    out.print(table)
