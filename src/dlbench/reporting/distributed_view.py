"""A multi-worker run on its run page: how the job was laid out, and for a collective its bus and
algorithm bandwidth against message size (log2 axis), from the record's `comm` field; on a shaped
link, the link (`link`: as asked, as measured, bytes on the wire per iteration)."""

from __future__ import annotations

from markupsafe import Markup

from ..store.record import Record
from . import charts


def bandwidth_chart(record: Record) -> Markup | None:
    c = record.comm
    if c is None:
        return None
    measured = [s for s in c.sizes if s.busbw_gbps is not None and s.bytes]
    # bus bandwidth drawn last: where the factor is 1 it covers the algorithm bandwidth exactly
    series = [charts.Series("algorithm bandwidth", [charts.Point(float(s.bytes), s.algbw_gbps) for s in measured],
                            charts.PALETTE[1]),
              charts.Series("bus bandwidth", [charts.Point(float(s.bytes), s.busbw_gbps) for s in measured],
                            charts.PALETTE[0])]
    return charts.line_chart(series, f"{c.collective}: bandwidth against message size ({c.workers} workers)",
                             "message size (bytes, log scale)", "GB/s", log_x=True)


def distributed_context(record: Record, flatten) -> dict:
    """What run.html.j2 shows of a multi-worker run (empty for a single-process one); `flatten`
    turns the job's facts into the page's key-value rows (run_page.flatten)."""
    if record.distributed is None:
        return {}
    c = record.comm
    return {
        "distributed_rows": flatten(record.distributed.model_dump(exclude_none=True)),
        "bandwidth_chart": bandwidth_chart(record),
        "bandwidth_rows": [s.model_dump() for s in c.sizes] if c else [],
        "bus_factor": c.bus_factor if c else None,
        # ranks time-sliced on too few cores (--oversubscribe): said above the job's facts
        "oversubscribed": record.distributed.oversubscribed,
        # a job on a shaped link (--link): the link as asked and as measured, bytes on the wire
        "link_rows": flatten(record.link.model_dump(exclude_none=True)) if record.link else [],
    }
