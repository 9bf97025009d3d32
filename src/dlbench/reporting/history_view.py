"""Change points on the history page, found as `dlbench history` finds them (dlbench.analysis.history:
PELT on log throughput with a penalty from each series' own noise)."""

from __future__ import annotations

from markupsafe import Markup

from ..analysis.history import MIN_RUNS, Point, SeriesKey, analyse
from .model import SiteModel

METHOD = Markup(f"Change points are found as <code>dlbench history</code> finds them: PELT (ruptures) on the log of "
          f"throughput, L1 cost, a penalty scaled to the series' own run-to-run noise; a series of fewer than "
          f"{MIN_RUNS} successful runs is drawn without detection. A dashed red line marks the first run at a new "
          f"level, with the step between the medians of the levels.")


def attach_change_points(model: SiteModel) -> None:
    for series in model.history:
        if len(series.points) < MIN_RUNS:
            continue
        # the report's series key (RunView.series_key) as `dlbench history`'s: the axes in SERIES_AXES' order
        suite, hardware, benchmark, batch, precision, framework, host, compile_, *others = series.key
        device = series.points[0].device
        key = SeriesKey(benchmark, framework, host, batch, device, (precision, compile_, *others))
        points = [Point(v.run_id, v.started_at, v.framework_version, v.samples_per_s) for v in series.points]
        pages = {v.run_id: v.page for v in series.points}
        for step in analyse(key, points).steps:
            series.change_points.append({"run_id": step.run_id, "when": step.started_at, "step_pct": step.change_pct,
                                         "version_before": step.version_before, "version": step.version,
                                         "page": pages.get(step.run_id)})
    model.history_method = METHOD
