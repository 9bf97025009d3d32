"""The planner's page of the report (`dlbench plan --page DIR`): per policy the JCT CDF, the share of
devices held over time and the cost against the average JCT, the summary and what-if tables, and the
throughput matrix with each cell's source and uncertainty. The result is workflows/planning.py's
PlanResult (read by its fields: this layer is below the workflows); the page lands beside the site's
other pages (DIR/plan.html, DIR/static/), so pointing DIR at a report folder adds it there."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from .. import paths
from ..planning.metrics import jct_cdf, utilisation_over_time
from . import charts
from .site import STATIC_FILES, _common, environment

MATRIX_ROWS = 500  # the page lists at most this many cells (the JSON output has them all)


def plan_context(result) -> dict:
    policies = [r.summary.policy for r in result.runs]
    colour = {p: charts.colour_for(p, policies) for p in policies}
    cdf = [charts.Series(r.summary.title, [charts.Point(x / 3600, y) for x, y in jct_cdf(r.simulation)],
                         colour[r.summary.policy]) for r in result.runs]
    held = [charts.Series(r.summary.title, [charts.Point(x / 3600, 100 * y)
                                            for x, y in utilisation_over_time(r.simulation, result.cluster)],
                          colour[r.summary.policy]) for r in result.runs]
    cost = [charts.Series(r.summary.title, [charts.Point(r.summary.average_jct_s / 3600, r.summary.cost_used)],
                          colour[r.summary.policy]) for r in result.runs if r.summary.average_jct_s is not None]
    return {
        "result": result,
        "jct_chart": charts.line_chart(cdf, "JCT CDF", "job completion time (hours, log scale)", "share of jobs",
                                       log_x=all(p.x > 0 for s in cdf for p in s.points), width=960),
        "held_chart": charts.line_chart(held, "devices held over time", "hours since the first arrival",
                                        "% of the cluster's devices", width=960),
        "cost_chart": charts.line_chart(cost, "cost against JCT", "average JCT (hours)",
                                        "cost of the device-hours used (USD)", width=960),
        "matrix": result.matrix[:MATRIX_ROWS],
        "matrix_left_out": max(0, len(result.matrix) - MATRIX_ROWS),
    }


def write_plan_page(result, out_dir: Path) -> Path:
    """DIR/plan.html and the static files it loads; the page written whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    html = environment().get_template("plan.html.j2").render(**_common("", generated, False), **plan_context(result))
    for name in STATIC_FILES:
        target = out_dir / "static" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.reports_dir() / "static" / name, target)
    page = out_dir / "plan.html"
    tmp = page.with_name(f".plan.html.{os.getpid()}.tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, page)
    return page
