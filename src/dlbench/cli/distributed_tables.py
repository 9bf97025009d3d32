"""Terminal tables of multi-worker runs, for `dlbench run` and `dlbench results`."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..store.record import Record


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def training_table(records: list[Record], title: str = "distributed training") -> Table:
    """One row per run; the column `oversubscribed` only where a run's ranks were time-sliced on too
    few cores (--oversubscribe), its caption saying what that does to the figures."""
    crowded = any(r.distributed and r.distributed.oversubscribed for r in records)
    t = Table(title=title, caption=OVERSUBSCRIBED_NOTE if crowded else None)
    for col in ("benchmark", "framework", "workers", "global batch", "compression", "status", "ms/iter (slowest)",
                "ms/iter rank 0", "samples/s", "efficiency", "× dense", "exposed comm ms", "grad MB/iter",
                "sent MB/iter/rank", "threads/worker", *(("oversubscribed",) if crowded else ())):
        t.add_column(col, justify="left" if col in ("benchmark", "framework", "status", "compression",
                                                     "oversubscribed") else "right")
    dense = {_exchange_key(r): r.summary.median_s for r in records
             if r.workload.compression == "none" and r.status == "ok" and r.summary}
    for r in records:
        d = r.distributed
        s = r.summary
        style = {"ok": "green", "skipped": "yellow"}.get(r.status, "red")
        scaling = d.scaling if d else None
        eff = ""
        if scaling and scaling.efficiency is not None:
            eff = f"{scaling.efficiency:.2f} ({scaling.mode})"
        t.add_row(escape(r.benchmark), escape(f"{r.framework.get('name')} {r.framework.get('version') or ''}".strip()),
                  str(d.workers if d else ""), str(r.workload.batch_size), escape(r.workload.compression or ""),
                  f"[{style}]{r.status}[/]",
                  _fmt(s.ms_per_iter if s else None, ".2f"),
                  _fmt(d.rank0_median_s * 1e3 if d and d.rank0_median_s else None, ".2f"),
                  _fmt(s.samples_per_s if s else None, ".1f"), eff,
                  _fmt(dense[_exchange_key(r)] / s.median_s if s and r.workload.compression not in (None, "none")
                       and _exchange_key(r) in dense else None, ".2f"),
                  _fmt(d.exposed_comm_s * 1e3 if d and d.exposed_comm_s is not None else None, ".2f"),
                  _fmt(d.grad_bytes / 1e6 if d and d.grad_bytes else None, ".2f"),
                  _fmt(d.exchange.bytes_per_rank / 1e6 if d and d.exchange else None, ".3g"),
                  str(d.threads_per_worker if d else ""),
                  *((_oversubscribed(r),) if crowded else ()))
    return t


OVERSUBSCRIBED_NOTE = ("oversubscribed (--oversubscribe): more threads than cores, the ranks time-sliced; their iteration "
                       "times include waiting for a core, so only link-bound comparisons are meaningful")


def _oversubscribed(r: Record) -> str:
    o = r.distributed.oversubscribed if r.distributed else None
    return f"{o.threads} threads on {o.cores} cores" if o else ""


def _exchange_key(r: Record) -> tuple:
    """What a compressed run is compared with a dense one on: all but the compression."""
    d = r.distributed
    return (r.benchmark, r.framework.get("name"), r.workload.batch_size, r.workload.precision,
            d.workers if d else None, d.threads_per_worker if d else None)


def bandwidth_table(r: Record) -> Table:
    """Bandwidth against message size for one collective run."""
    c = r.comm
    n = c.workers if c else (r.distributed.workers if r.distributed else "?")
    backend = r.distributed.backend if r.distributed else None
    t = Table(title=escape(f"{r.benchmark}: {r.framework.get('name')} {r.framework.get('version') or ''} "
                           f"({backend or '?'}, {n} workers, bus factor {c.bus_factor:.3g}) run {r.run_id}"
                           + (f"; oversubscribed: {_oversubscribed(r)}, time-sliced"
                              if r.distributed and r.distributed.oversubscribed else "")
                           if c else f"{r.benchmark} run {r.run_id}: {r.status}"))
    for col in ("size", "bytes run", "time us", "algbw GB/s", "busbw GB/s", "result"):
        t.add_column(col, justify="right" if col != "result" else "left")
    for s in (c.sizes if c else []):
        if s.skipped:
            t.add_row(human_bytes(s.size_bytes), "", "", "", "", f"[yellow]not run[/]: {escape(s.skipped)}")
            continue
        check = "[green]correct[/]" if s.correct else f"[red]wrong[/]: {escape(str(s.error))}"
        t.add_row(human_bytes(s.size_bytes), str(s.bytes), _fmt(s.time_s * 1e6 if s.time_s else None, ".1f"),
                  _fmt(s.algbw_gbps, ".4g"), _fmt(s.busbw_gbps, ".4g"), check)
    return t


def link_table(records: list[Record]) -> Table:
    """The runs on a shaped link: the link asked for and as measured, and for training the bytes
    each worker put on the wire per iteration beside a ring all-reduce's analytical figure."""
    t = Table(title="shaped link (asked, measured before the jobs; bytes on the wire per iteration)")
    for col in ("benchmark", "framework", "status", "link", "measured Mbit/s", "rtt us", "ms/iter",
                "wire MB/iter/worker", "ring MB", "wire/ring"):
        t.add_column(col, justify="left" if col in ("benchmark", "framework", "status", "link") else "right")
    for r in records:
        k, m, w = r.link, r.link.measured, r.link.wire
        t.add_row(escape(r.benchmark), escape(str(r.framework.get("name"))), r.status, escape(k.asked),
                  _fmt(m.bandwidth_bps / 1e6 if m else None, ",.1f"), _fmt(m.rtt_s * 1e6 if m else None, ",.0f"),
                  _fmt(r.summary.ms_per_iter if r.summary else None, ".2f"),
                  _fmt(w.mean_per_worker / 1e6 if w else None, ".3f"),
                  _fmt(w.ring_allreduce_bytes / 1e6 if w and w.ring_allreduce_bytes else None, ".3f"),
                  _fmt(w.mean_per_worker / w.ring_allreduce_bytes if w and w.ring_allreduce_bytes else None, ".3f"))
    return t
