"""`dlbench run --suite distributed|comm`: the multi-worker branch of the run command.

Input is checked here, before anything runs (exit 2 with one message): the options that only the
single-process suites take, the placement (--workers, --hosts, Slurm), threads per worker against
the cores, strong scaling's even split of every batch, and --link (its form, two workers at least,
this machine only, root). The link is made once the options hold, measured, used by every job and
removed when the command ends, however it ends (execution/links.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from rich.markup import escape
from rich.progress import Progress

from .. import paths
from ..definitions.loader import DefinitionError
from ..machine import available_cpus
from ..store.store import Store
from . import lookup
from .build_progress import show_on_progress_bar
from .console import err, fail, out, progress_bar
from ..axes import Precision
from .options import check_choice, listed_choices
from .signals import interrupted


class _Events:
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

    def run_done(self, label, record):
        self.progress.advance(self.task)
        if record.status != "ok":
            self.progress.console.print(f"[yellow]{record.status}[/]: {escape(label)}: {escape(str(record.reason))}",
                                        highlight=False, soft_wrap=True)


def run_distributed_suite(suite_path: Path, kind: str, names: list[str], registry, *, benchmark, profile: str,
                          device: str, env: str, threads: int | None, repeats: int | None, store: Path | None,
                          timeout: float, workers: int, scaling: str | None, hosts: str | None,
                          precision: list[str] | None, catalog, link: str | None = None) -> None:
    from ..definitions.distributed import batches
    from ..execution.distributed import DistributedOptions, planned_runs
    from ..execution.placement import PlacementError, detect

    # the options this kind does not honour were refused before (workflows/suite_kinds.py)
    if env == "docker":
        raise fail("--env docker does not run distributed jobs yet; use --env venv or current")
    if scaling is not None:
        check_choice("scaling", scaling, ["strong", "weak"])
    precisions = listed_choices("precision", precision, Precision.runs())
    try:
        suite = catalog.load_distributed_suite(suite_path, profile, device)
    except DefinitionError as e:
        raise fail(str(e)) from None
    chosen = list(suite.benchmarks)
    if benchmark:
        valid = sorted({b.name for b in chosen} | {b.network.name for b in chosen}) if kind == "distributed" \
            else list(suite.comm.collectives)
        for name in benchmark:
            check_choice("benchmark", name, valid)
        if kind == "distributed":
            chosen = [b for b in chosen if b.name in benchmark or b.network.name in benchmark]
    if precisions is not None:  # each benchmark once per precision asked; a runner's refusal is recorded
        chosen = [dataclasses.replace(b, precision=p) for b in chosen for p in precisions]
    comm = suite.comm
    if comm is not None and benchmark:
        comm = type(comm)(**{**comm.__dict__, "collectives": tuple(c for c in comm.collectives if c in benchmark)})
    spec = _link_spec(link, workers, hosts, device) if link is not None else None
    try:
        placement = detect(workers, available_cpus(), hosts)
        per_worker_threads = placement.threads_per_worker(threads)
    except PlacementError as e:
        raise fail(str(e)) from None
    mode_of_scaling = scaling or suite.scaling
    for b in chosen:
        for batch in b.batch_sizes:
            try:
                batches(batch, placement.workers, mode_of_scaling)
            except ValueError as e:
                raise fail(f"{suite_path}: benchmarks: {b.network.name}: {e}") from None
    runners = [lookup.runner(registry, n) for n in names]
    # once the options hold (a refused option leaves no store behind), before the first job
    store = lookup.writable_store(store)
    remote = any(not h.local for h in placement.hosts)
    from ..machine import fingerprint
    from ..performance.runtime import run_predictor

    predictor, predicted_from = run_predictor(store, fingerprint()["machine_id"], device, per_worker_threads,
                                              {r.name: r.model for r in runners})
    options = DistributedOptions(device=device, env_backend=env, placement=placement, threads=per_worker_threads,
                                 scaling=mode_of_scaling, timeout_s=timeout, cache=paths.cache_dir(),
                                 job_root=(store.root / ".jobs") if remote else None, repeats=repeats,
                                 predictor=predictor if kind == "distributed" else None)
    total = sum(planned_runs(chosen, comm, placement.workers) for _ in runners)
    records = []
    try:
        with contextlib.ExitStack() as stack:
            if spec is not None:
                options, placement = _on_link(stack, spec, options, per_worker_threads)
            where = ", ".join(f"{h.address} x{h.slots}" for h in placement.hosts)
            err.print(f"dlbench: suite {suite.name} ({kind}), {total} runs on {device} ({', '.join(names)}), "
                      f"{placement.workers} workers ({placement.variant}: {where}), {per_worker_threads} threads per "
                      "worker" + (f", {mode_of_scaling} scaling" if kind == "distributed" else "")
                      + f", store {store.root}" + (f"; predictions: {predicted_from}" if kind == "distributed" else ""),
                      highlight=False)
            _run_jobs(stack, kind, runners, chosen, comm, store, options, total, records)
    except KeyboardInterrupt as e:
        interrupted(e, len(records), "runs")
    lookup.refresh_index(store)
    _print_records(kind, suite.name, records)
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if bad:
        raise fail(f"{len(bad)} of {len(records)} runs did not complete; see the reasons above and `dlbench results`", 1)


def _link_spec(link: str, workers: int, hosts: str | None, device: str):
    """--link checked before anything runs: its form, two workers at least, this machine, the CPU,
    root."""
    from ..execution.links import parse_link, refusal

    try:
        spec = parse_link(link)
    except ValueError as e:
        raise fail(str(e)) from None
    if workers < 2:
        raise fail(f"--link {link}: a link joins two workers at least (--workers {workers})")
    if hosts is not None:
        raise fail("--link shapes a link between workers on this machine; it does not reach --hosts")
    if device != "cpu":
        raise fail(f"--link runs CPU jobs only (--device cpu): on {device}, NCCL moves the traffic of ranks on one "
                   "machine through shared memory and the GPUs' own links, never through the shaped one")
    why = refusal()
    if why:
        raise fail(why)
    return spec


def _on_link(stack: contextlib.ExitStack, spec, options, threads: int):
    """Make the link (removed when `stack` closes), measure it; the options and placement on it."""
    from ..execution.links import LinkError, shaped_link
    from ..execution.placement import namespace_placement
    from ..execution.wire import measure

    try:
        link = stack.enter_context(shaped_link(spec, options.placement.workers))
        measured = measure(link)
    except LinkError as e:
        stack.close()
        raise fail(str(e)) from None
    err.print(f"link {spec.asked}: workers in namespaces {link.namespace(0)}..{link.namespace(link.workers - 1)} "
              f"({link.subnet}); measured {measured.bandwidth_bps / 1e6:,.1f} Mbit/s, round trip "
              f"{measured.rtt_s * 1e6:,.0f} us", highlight=False)
    placement = namespace_placement([link.address(i) for i in range(link.workers)],
                                    [link.namespace(i) for i in range(link.workers)], options.placement.hosts[0].cpus)
    return dataclasses.replace(options, placement=placement, link=link, link_measured=measured), placement


def _run_jobs(stack, kind, runners, chosen, comm, store, options, total, records) -> None:
    with progress_bar() as progress:
        from ..execution.distributed import DistributedOrchestrator

        task = progress.add_task("starting", total=total)
        orch = DistributedOrchestrator(store, options, _Events(progress, task))
        for runner in runners:
            if kind == "distributed":
                for b in chosen:
                    records += orch.run_distributed(runner, b)
            else:
                records += orch.run_comm(runner, comm)
        progress.update(task, description="done")


def _print_records(kind: str, suite: str, records) -> None:
    from .distributed_tables import bandwidth_table, link_table, training_table

    if kind == "distributed":
        out.print(training_table(records, f"dlbench run: {suite}"))
    else:
        for r in records:
            out.print(bandwidth_table(r) if r.comm else escape(f"{r.benchmark} {r.framework.get('name')}: "
                                                              f"{r.status}: {r.reason}"), highlight=False)
    linked = [r for r in records if r.link is not None]
    if linked:
        out.print(link_table(linked))


def print_distributed_details(store: Store, rows: list[dict]) -> None:
    """Under `dlbench results`' table: the multi-worker runs among `rows`, as tables of their own
    (training: workers, slowest rank, efficiency, exposed communication; collectives: bandwidth
    against message size). Reads just those records."""
    from ..store.store import StoreError
    from .distributed_tables import bandwidth_table, link_table, training_table

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
    linked = [r for r in records if r.link is not None]
    if linked:
        out.print(link_table(linked))


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
