"""The compression page (issue 44): what gradient compression buys on a shaped link. From the
data-parallel training runs on a link (`dlbench run --suite distributed --link ... --compression
...`): each method's throughput over dense's, same framework, network, workers, precision, batch
and link, against the link's bandwidth (one chart per network and workers, a series per framework
and method); beside it, the time to accuracy of the data-parallel convergence runs (`dlbench run
--suite convergence --workers N --compression ...`), each compressed run against the dense run of
its invocation. A run that did not complete, or a method that never reached the target, is a row
saying so (status and reason), never a missing one."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from markupsafe import Markup

from . import charts
from .model import RunView, SiteModel

METHOD = ("Speedup over dense: the method's throughput (global batch over the median iteration of the slowest rank) "
          "divided by the dense run's (compression none) of the same framework, network, workers, precision, batch "
          "and link; the latest run of each. A value above 1: the method's smaller exchange pays for its compress and "
          "decompress work on that link. Time to accuracy: each data-parallel convergence run's score (MLPerf's rule "
          "over its seeds), and a compressed run's against the dense run of the same invocation (dense score over its "
          "score; each seed's ratio is on the run's page).")


@dataclass
class SpeedupRow:
    framework: str
    network: str
    workers: int
    precision: str
    batch_size: int
    link: str
    link_rate_bps: float
    compression: str
    status: str
    reason: str | None
    samples_per_s: float | None
    dense_samples_per_s: float | None
    speedup: float | None
    page: str
    dense_page: str | None


def _group(v: RunView) -> tuple:
    return (v.framework, v.network, v.workers, v.precision, v.batch_size, v.link)


def speedup_rows(runs: list[RunView]) -> list[SpeedupRow]:
    """One row per (framework, network, workers, precision, batch, link, method): its latest run
    (runs are newest first), against the latest ok dense run of its group."""
    shaped = [v for v in runs if v.mode == "train" and (v.workers or 1) > 1 and v.link and v.compression]
    latest: dict[tuple, RunView] = {}
    for v in shaped:
        latest.setdefault((*_group(v), v.compression), v)
    dense = {}
    for v in shaped:
        if v.compression == "none" and v.ok:
            dense.setdefault(_group(v), v)
    rows = []
    for v in latest.values():
        base = dense.get(_group(v))
        speedup = v.samples_per_s / base.samples_per_s if v.ok and base is not None else None
        reason = v.reason
        if v.ok and base is None:
            reason = "no completed dense run on this link to compare with"
        rows.append(SpeedupRow(v.framework, v.network, v.workers, v.precision, v.batch_size, v.link,
                               float(v.link_rate_bps or 0), v.compression, v.status, reason, v.samples_per_s,
                               base.samples_per_s if base else None, speedup, v.page, base.page if base else None))
    rows.sort(key=lambda r: (r.network, r.workers, r.framework, r.link_rate_bps, r.compression != "none",
                             r.compression))
    return rows


def speedup_charts(rows: list[SpeedupRow]) -> list[tuple[str, Markup]]:
    """(title, chart) per (network, workers, precision, batch): speedup over dense against the
    link's rate, a series per framework and method (dense itself left out: 1 everywhere)."""
    groups: dict[tuple, dict[str, list[charts.Point]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.speedup is not None and r.compression != "none":
            key = (r.network, r.workers, r.precision, r.batch_size)
            groups[key][f"{r.framework} {r.compression}"].append(charts.Point(r.link_rate_bps / 1e9, r.speedup))
    out = []
    for (network, workers, precision, batch), by_series in sorted(groups.items()):
        names = sorted(by_series)
        series = [charts.Series(name, points, charts.PALETTE[i % len(charts.PALETTE)])
                  for i, (name, points) in enumerate((n, by_series[n]) for n in names)]
        title = f"{network}, {workers} workers, {precision}, batch {batch}: speedup over dense against link bandwidth"
        out.append((title, charts.line_chart(series, title, "link rate (Gbit/s, log scale)", "× dense", log_x=True)))
    return out


def convergence_rows(runs: list[RunView]) -> list[RunView]:
    """The data-parallel convergence runs, grouped by benchmark (task, workers, link) and framework,
    dense first, newest first within a method."""
    chosen = [v for v in runs if v.mode == "convergence" and (v.workers or 1) > 1]
    order = {v.run_id: i for i, v in enumerate(chosen)}
    return sorted(chosen, key=lambda v: (v.benchmark, v.framework, v.compression != "none", v.compression or "",
                                         order[v.run_id]))


def compression_context(model: SiteModel) -> dict:
    rows = speedup_rows(model.runs)
    return {"model": model, "speedup_rows": rows, "speedup_charts": speedup_charts(rows),
            "convergence_rows": convergence_rows(model.runs), "method": METHOD}
