"""Template contexts of the aggregate pages: the view model's data plus the charts drawn from it."""

from __future__ import annotations

from collections import defaultdict

from . import charts
from .model import BenchmarkPage, Board, HistorySeries, RunView, SiteModel, Speedup, variant_order


def _label(v: RunView, precisions: set[str], with_batch: bool = True, compiles: set[str] | None = None) -> str:
    """The framework, and the batch, precision and compile mode where the page shows several."""
    label = v.framework
    if with_batch:
        label += f" · batch {v.batch_size}"
    if len(precisions) > 1:
        label += f" · {v.precision}"
    if compiles is not None and len(compiles) > 1:
        label += f" · {v.compile}"
    return label


def variant_label(variant: tuple, precisions: list[str], compiles: list[str]) -> str:
    """A grid column's heading: precision and compile mode, unless one of them has a single value on
    the page, then the value of each other axis the column has."""
    precision, compile_, *others = variant
    parts = [p for p, many in ((precision, len(precisions) > 1), (compile_, len(compiles) > 1)) if many]
    return " · ".join([*(parts or [precision, compile_]), *(v for v in others if v is not None)])


def speedup_chart(found: list[Speedup], title: str, with_benchmark: bool) -> charts.Markup | None:
    if not found:
        return None
    frameworks = sorted({s.framework for s in found})
    batches = {(s.benchmark, s.batch_size) for s in found}
    precisions = {s.precision for s in found}
    bars = []
    for s in found:
        label = s.framework
        if with_benchmark:
            label = f"{s.benchmark} · {label}"
        if len(batches) > len({b for b, _ in batches}):  # some benchmark at several batch sizes
            label += f" · batch {s.batch_size}"
        if len(precisions) > 1:
            label += f" · {s.precision}"
        bars.append(charts.Bar(label, s.ratio, colour=charts.colour_for(s.framework, frameworks)))
    return charts.hbar_chart(bars, title, "compiled / eager samples/s (1 = no gain)", reference=1.0)


def speedup_matrix(board: Board) -> dict | None:
    """The board's compiled-over-eager ratios as a framework x benchmark table; a cell lists one ratio
    per (batch, precision) the framework ran both modes at."""
    if not board.speedups:
        return None
    benchmarks = sorted({s.benchmark for s in board.speedups})
    frameworks = sorted({s.framework for s in board.speedups})
    pages = {s.benchmark: s.benchmark_page for s in board.speedups}
    cells: dict[tuple[str, str], list[Speedup]] = defaultdict(list)
    for s in board.speedups:  # in batch and precision order (model.speedups)
        cells[(s.framework, s.benchmark)].append(s)
    rows = [(fw, [cells.get((fw, b), []) for b in benchmarks]) for fw in frameworks]
    return {"benchmarks": [(b, pages[b]) for b in benchmarks], "rows": rows,
            "with_batch": len({s.batch_size for s in board.speedups}) > 1,
            "with_precision": len({s.precision for s in board.speedups}) > 1}


def score_chart(board: Board, frameworks: list[str]) -> charts.Markup:
    bars = [charts.Bar(s.framework, s.score, low=s.low, high=s.high, colour=charts.colour_for(s.framework, frameworks),
                       note=f"({s.completed}/{s.total})" if s.completed < s.total else "")
            for s in board.scores]
    return charts.hbar_chart(bars, f"overall score, {board.suite} on {board.hardware}",
                             "geometric mean of throughput relative to the fastest (1 = fastest everywhere), 95% interval",
                             reference=1.0)


def index_context(model: SiteModel) -> dict:
    return {"model": model, "score_charts": {b.anchor: score_chart(b, model.frameworks) for b in model.boards},
            "speedups": {b.anchor: speedup_matrix(b) for b in model.boards}}


def benchmark_context(page: BenchmarkPage, model: SiteModel) -> dict:
    latest = sorted(page.latest.values(), key=lambda v: (v.batch_size, v.framework, variant_order(v.variant)))
    precisions = {v.precision for v in latest}
    compiles = {v.compile for v in latest}
    colour = {fw: charts.colour_for(fw, model.frameworks) for fw in page.frameworks}

    throughput = []
    for batch in page.batch_sizes:
        at_batch = sorted((v for v in latest if v.batch_size == batch), key=lambda v: -(v.samples_per_s or 0))
        if not at_batch:
            continue
        bars = [charts.Bar(_label(v, precisions, False, compiles), v.samples_per_s, v.sps_low, v.sps_high, colour[v.framework],
                           note="" if v.sps_low is not None else "(no CI)")
                for v in at_batch]
        throughput.append((batch, charts.hbar_chart(bars, f"{page.benchmark} throughput at batch {batch}",
                                                    "samples/s (whiskers: confidence interval of the median)")))

    series: dict[tuple, list] = defaultdict(list)
    for v in latest:
        series[(v.framework, v.precision, v.compile)].append(charts.Point(v.batch_size, v.samples_per_s, v.sps_low, v.sps_high))
    scaling = charts.line_chart(
        [charts.Series(" ".join([fw, *([p] if len(precisions) > 1 else []), *([c] if len(compiles) > 1 else [])]), pts,
                       colour[fw]) for (fw, p, c), pts in sorted(series.items())],
        f"{page.benchmark}: throughput against batch size", "batch size (log scale)", "samples/s", log_x=True)

    boxes = [charts.Box(_label(v, precisions, True, compiles), *v.box_ms, points=list(v.repeat_medians_ms), colour=colour[v.framework])
             for v in latest if v.box_ms]
    distribution = charts.box_chart(boxes, f"{page.benchmark}: iteration times",
                                    "ms per iteration (box: quartiles, whiskers: min–max, dots: repeat medians)")

    first = charts.hbar_chart([charts.Bar(_label(v, precisions, True, compiles), v.first_iter_ms, colour=colour[v.framework])
                               for v in latest if v.first_iter_ms is not None],
                              f"{page.benchmark}: first iteration", "ms (compilation, autotuning, allocator warm-up)")

    measured = [v for v in latest if v.joules_per_sample is not None]
    energy = (charts.hbar_chart([charts.Bar(_label(v, precisions, True, compiles), v.joules_per_sample, colour=colour[v.framework])
                                 for v in measured], f"{page.benchmark}: energy per sample", "J/sample")
              if measured else None)
    energy_missing = sorted({v.energy_missing for v in latest if v.joules_per_sample is None and v.energy_missing})
    page_precisions, page_compiles = page.precisions, page.compiles
    grid_columns = [variant_label(v, page_precisions, page_compiles) for v in page.variants]
    speedup = speedup_chart(page.speedups, f"{page.benchmark}: compiled over eager", False)
    newest: dict[str, object] = {}
    for v in page.runs:  # newest first: a convergence run has no throughput, so `latest` never holds it
        if v.mode == "convergence":
            newest.setdefault(v.framework, v)
    converged = list(newest.values())
    convergence_chart = None
    if any(v.accuracy_curve for v in converged):
        curves = [charts.Series(v.framework, [charts.Point(float(e), float(a)) for e, a in v.accuracy_curve],
                                colour[v.framework]) for v in converged if v.accuracy_curve]
        convergence_chart = charts.line_chart(curves, f"{page.benchmark}: top-1 accuracy by epoch (each framework's "
                                                      "median run)", "epoch", "accuracy")
    return {"converged": sorted(converged, key=lambda v: (v.time_to_target_s is None, v.time_to_target_s or 0)),
            "convergence_chart": convergence_chart, **loadgen_context(page, colour), "page": page, "model": model,
            "latest": latest, "throughput": throughput, "scaling": scaling,
            "distribution": distribution, "first": first, "energy": energy, "energy_missing": energy_missing,
            "single_batch": len(page.batch_sizes) == 1, "grid_columns": grid_columns,
            "show_grid": len(page.variants) > 1, "show_compile": len(page_compiles) > 1, "speedup_chart": speedup}


SCENARIO_ORDER = ("single_stream", "multi_stream", "server", "offline")


def loadgen_context(page: BenchmarkPage, colour: dict[str, str]) -> dict:
    """LoadGen's scenarios on a benchmark page: per framework, a chart of the per-sample latency at
    each percentile LoadGen reports, one line per scenario (its latest completed run); and the rows
    of the table under it."""
    scenarios = sorted({s for _, s in page.loadgen}, key=lambda s: (SCENARIO_ORDER.index(s)
                                                                     if s in SCENARIO_ORDER else 9, s))
    charts_by_framework = []
    for fw in sorted({f for f, _ in page.loadgen}):
        series = [charts.Series(f"{scenario} ({page.loadgen[(fw, scenario)].loadgen_validity})",
                                [charts.Point(pct, ms) for pct, ms in page.loadgen[(fw, scenario)].latency_pct_ms],
                                charts.PALETTE[i % len(charts.PALETTE)])
                  for i, scenario in enumerate(scenarios) if (fw, scenario) in page.loadgen]
        charts_by_framework.append((fw, charts.percentile_chart(
            series, f"{page.benchmark} on {fw}: LoadGen latency percentiles", "ms per sample")))
    rows = sorted(page.loadgen.values(), key=lambda v: (v.framework, scenarios.index(v.scenario)))
    return {"loadgen_charts": charts_by_framework, "loadgen_rows": rows}


def history_chart(s: HistorySeries, frameworks: list[str]) -> charts.Markup:
    points = [charts.DatedPoint(v.started_at, v.samples_per_s, v.framework_version) for v in s.points]
    marks = [charts.ChangeMark(c["when"], f"{c['step_pct']:+.1f}%") for c in s.change_points if c.get("when")]
    return charts.date_chart(points, marks, s.label, "samples/s", charts.colour_for(s.key[5], frameworks))


def history_context(model: SiteModel) -> dict:
    groups: dict[tuple, list[HistorySeries]] = defaultdict(list)
    for s in model.history:
        groups[s.key[:2]].append(s)
    return {"model": model, "groups": sorted(groups.items()),
            "charts": {s.anchor: history_chart(s, model.frameworks) for s in model.history}}


KEY_LABELS = {"batch_size": "batch"}


def compare_context(report, model: SiteModel) -> dict:
    """Rows of `dlbench compare`'s table (dlbench.analysis.comparison.ComparisonReport) with links to the
    runs on each side, and a chart of the ratios with their intervals."""
    pages_by_run = {v.run_id: v.page for v in model.runs}
    ordered = [f for f in ("suite", "benchmark", "framework", "batch_size", "precision", "compile", "device", "machine")
               if f in report.key_fields]
    # a key field with one value in every row is said once above the table, not repeated per row
    constant = {f: str(report.comparisons[0].key[f]) for f in ordered
                if len({str(c.key[f]) for c in report.comparisons}) == 1}
    shown_key = [f for f in ordered if f not in constant] or ordered[1:2]
    rows = []
    for c in report.comparisons:
        base, cand = c.baseline.describe(), c.candidate.describe()
        rows.append({
            "key": [str(c.key[f]) for f in shown_key],
            "varied": [(c.baseline.label(f), c.candidate.label(f)) for f in report.varied_fields],
            "versions": (c.baseline.label("version"), c.candidate.label("version")),
            "base_runs": [(r, pages_by_run.get(r)) for r in base["runs"]],
            "cand_runs": [(r, pages_by_run.get(r)) for r in cand["runs"]],
            "base_sps": base["samples_per_s"], "cand_sps": cand["samples_per_s"],
            "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "change_pct": c.change_pct,
            "unit": c.unit, "units": (base["iterations"], cand["iterations"]) if c.unit == "iteration"
            else (base["processes"], cand["processes"]),
            "p": c.p_value, "p_adjusted": c.p_adjusted, "significant": c.significant, "verdict": c.verdict,
        })
    bars = [charts.Bar(" · ".join(r["key"]) or "all", r["ratio"], r["ci_low"], r["ci_high"],
                       charts.PALETTE[5] if r["verdict"] == "slower" else
                       charts.PALETTE[2] if r["verdict"] == "faster" else "#8c959f",
                       note={"slower": "▼ significant", "faster": "▲ significant"}.get(r["verdict"], ""))
            for r in rows]
    chart = charts.hbar_chart(bars, "candidate throughput / baseline throughput",
                              "ratio (whiskers: bootstrap interval; 1 = no change)", reference=1.0, width=760)
    return {"report": report, "rows": rows, "key_names": [KEY_LABELS.get(f, f) for f in shown_key],
            "varied_names": [KEY_LABELS.get(f, f) for f in report.varied_fields], "chart": chart,
            "constant": [(KEY_LABELS.get(f, f), v) for f, v in constant.items() if f not in shown_key],
            "geomean": report.geometric_mean_ratio}
