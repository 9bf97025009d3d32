"""What a run's page shows, from its full record: provenance, settings, raw statistics, and the
telemetry over each repeat's measured window.

Telemetry layout (see telemetry/sampler.py and telemetry/derive.py): each repeat keeps the
sampler's columns — `t_ns` (time.monotonic_ns, the clock the harness marks its window with),
`gpu.series[i]` (one dict of columns per GPU), `cpu.series` (psutil) and `cpu.rapl.series` (raw
energy counters) — and `window_monotonic_ns` marks the measured window. Every source that was not
available says why (`gpu.reason`, `gpu.unsupported`, `cpu.unavailable`, `cpu.rapl.reason`); the
page shows what exists and the reason for what does not.

Records are data written by other processes and perhaps by hand; a layout this code does not
expect costs the telemetry section (with a note saying so), never the page or the site.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from markupsafe import Markup

from ..store.record import Record
from . import charts
from .distributed_view import distributed_context
from .model import benchmark_page_name, board_anchor, hardware_label, run_view, series_anchor

MIB = 2**20
GIB = 2**30


@dataclass
class Figure:
    title: str
    chart: Markup


def flatten(value: Any, prefix: str = "", limit: int = 400) -> list[tuple[str, str]]:
    """Nested dicts as (dotted key, text) rows; lists of scalars joined; long text cut."""
    rows: list[tuple[str, str]] = []
    if isinstance(value, dict):
        if not value and prefix:
            rows.append((prefix, "{}"))
        for k, v in value.items():
            rows.extend(flatten(v, f"{prefix}.{k}" if prefix else str(k), limit))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            rows.extend(flatten(v, f"{prefix}[{i}]", limit))
    else:
        if isinstance(value, (list, tuple)):
            text = ", ".join("null" if v is None else str(v) for v in value)
        else:
            text = "null" if value is None else str(value)
        rows.append((prefix, text if len(text) <= limit else text[: limit - 1] + "…"))
    return rows


def _episodes(t_s: np.ndarray, active: np.ndarray, interval_s: float) -> list[tuple[float, float]]:
    """Contiguous stretches of active samples, each to the next sample (the last one: one interval
    on; a sample stands for the interval it starts)."""
    if not active.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], active.astype(np.int8), [0]]))).tolist()
    ends = np.append(t_s, t_s[-1] + interval_s)
    return [(float(t_s[a]), float(ends[b])) for a, b in zip(edges[::2], edges[1::2])]


def _floats(values) -> np.ndarray | None:
    """A column as floats, None as NaN (numpy converts None to NaN for a float array)."""
    try:
        return np.array(values, dtype=float)
    except (TypeError, ValueError):
        return None


@dataclass
class _Frame:
    """One repeat's samples, with what every chart of it shares (computed once per repeat)."""

    label: str
    tel: dict
    t_s: np.ndarray  # seconds from the repeat's first sample
    windows: list[tuple[float, float]]
    converted: dict = field(default_factory=dict)  # GPU index -> {column: floats}, converted once


def _frames(record: Record) -> list[_Frame]:
    frames = []
    for rep in record.repeats:
        tel = rep.telemetry
        if not tel or tel.get("error") or not tel.get("t_ns"):
            continue
        t_ns = np.array(tel["t_ns"], dtype=np.int64)
        t0 = int(t_ns[0])
        t_s = (t_ns - t0) / 1e9
        windows = []
        if len(rep.window_monotonic_ns) == 2:
            windows = [((rep.window_monotonic_ns[0] - t0) / 1e9, (rep.window_monotonic_ns[1] - t0) / 1e9)]
        frames.append(_Frame(f"repeat {rep.index + 1}", tel, t_s, windows))
    return frames


def _panel(frames: list[_Frame], title: str, unit: str, columns: dict, scale: float = 1.0,
           colours: dict[str, str] | None = None) -> charts.Panel | None:
    """One quantity over the repeats; columns: line name -> (_Frame -> values). None when no
    repeat sampled it."""
    lines = {}
    for name, column in columns.items():
        per_frame = []
        for frame in frames:
            values = column(frame)
            # fmax.reduce is NaN only where every value is: a repeat that never sampled this has no line
            ok = (values is not None and values.ndim == 1 and len(values) == len(frame.t_s) and values.size
                  and not np.isnan(np.fmax.reduce(values)))
            per_frame.append((values * scale if scale != 1.0 else values) if ok else None)
        if any(v is not None for v in per_frame):
            lines[name] = per_frame
    if not lines:
        return None
    colours = {name: (colours or {}).get(name, LINE_COLOURS.get(name, charts.PALETTE[0])) for name in lines}
    return charts.Panel(title, unit, lines, colours)


def _converted(frame: _Frame, source: str | int, columns: dict, wanted: tuple[str, ...]) -> dict[str, np.ndarray | None]:
    """The `wanted` columns of one source (a GPU's index, or "cpu") as floats (None reads as NaN):
    converted together, in one numpy call, where they are lists of the same length (the usual
    case), else one by one; once per repeat and source."""
    if source not in frame.converted:
        names = [n for n in wanted if n in columns.keys()]
        converted = None
        try:
            table = np.array([columns[n] for n in names], dtype=float)
            if table.ndim == 2 and table.shape[0] == len(names):
                converted = dict(zip(names, table))
        except (TypeError, ValueError):  # columns of other lengths or kinds
            pass
        frame.converted[source] = converted if converted is not None else {n: _floats(columns[n]) for n in names}
    return frame.converted[source]


def _gpu_columns(frame: _Frame, device: int) -> dict[str, np.ndarray | None]:
    series = (frame.tel.get("gpu") or {}).get("series") or []
    return _converted(frame, device, series[device] if device < len(series) else {}, GPU_COLUMNS)


def _gpu_column(device: int, name: str):
    def read(frame: _Frame):
        return _gpu_columns(frame, device).get(name)
    return read


def _throttle_episodes(device: int):
    """Samples with a clock-event reason other than idle set: the GPU ran below the clock it could."""
    def find(frame: _Frame) -> list[tuple[float, float]]:
        masks = _gpu_columns(frame, device).get("clock_events")
        if masks is None or not masks.size or not np.fmax.reduce(np.abs(masks), axis=None) > 0:
            return []  # no sample with any bit set (fmax passes over NaN, a sample not known)
        gpu = frame.tel.get("gpu") or {}
        idle = int((gpu.get("clock_event_bits") or {}).get("gpu_idle", 0))
        known = ~np.isnan(masks)
        active = known & ((np.where(known, masks, 0).astype(np.int64) & ~idle) != 0)
        return _episodes(frame.t_s, active, float(frame.tel.get("interval_s") or 0.1))
    return find


def _cpu_column(name: str):
    def read(frame: _Frame):
        series = (frame.tel.get("cpu") or {}).get("series") or {}
        return _converted(frame, "cpu", series, CPU_COLUMNS).get(name) if name in CPU_COLUMNS else _floats(series.get(name))
    return read


def _mean_over_cores(frame: _Frame):
    rows = ((frame.tel.get("cpu") or {}).get("series") or {}).get("util_pct_per_core")
    if rows is None:
        return None
    table = _floats(rows)
    if table is not None and table.ndim == 2 and table.size and not np.isnan(np.add.reduce(table, axis=None)):
        # every core sampled every time (the usual case): the same arithmetic as below, without the NaN steps
        return table.mean(axis=1) * table.shape[1] / table.shape[1]
    if table is not None and table.ndim == 2:
        with np.errstate(all="ignore"):
            return np.where(np.isnan(table).all(axis=1), np.nan, np.nanmean(np.where(np.isnan(table), 0, table), axis=1)
                            * table.shape[1] / np.maximum((~np.isnan(table)).sum(axis=1), 1))
    # a sample without a per-core list (None) makes the table ragged: one row at a time
    return np.array([np.nan if not r else float(np.mean(r)) for r in rows], dtype=float)


def _rapl_power(zone: str):
    """Watts between consecutive readings of one RAPL counter (a wrap or a gap: no value)."""
    def read(frame: _Frame):
        rapl = (frame.tel.get("cpu") or {}).get("rapl") or {}
        counter = _floats((rapl.get("series") or {}).get(zone))
        if counter is None or counter.size < 2:
            return None
        dt = np.diff(np.array(frame.tel["t_ns"], dtype=np.int64)) / 1e9
        with np.errstate(all="ignore"):
            watts = np.diff(counter) / 1e6 / dt
        watts[(watts < 0) | (dt <= 0)] = np.nan
        return np.concatenate([[np.nan], watts])
    return read


# (title, unit, scale, {line name: column}); lines of one panel share its axes
GPU_PANELS = (
    ("power", "W", 1.0, {"power": "power_w"}),
    ("clocks", "MHz", 1.0, {"SM": "sm_clock_mhz", "memory": "mem_clock_mhz"}),
    ("temperature", "°C", 1.0, {"temperature": "temp_c"}),
    ("utilisation", "%", 1.0, {"GPU": "gpu_util_pct", "memory controller": "mem_util_pct"}),
    ("memory used", "GiB", 1 / GIB, {"memory used": "mem_used_bytes"}),
)
GPU_COLUMNS = (*(c for *_, lines in GPU_PANELS for c in lines.values()), "power_instant_w", "clock_events")
CPU_PANELS = (
    ("CPU", "%", 1.0, {"utilisation (mean of cores)": _mean_over_cores, "steal": _cpu_column("steal_pct")}),
    ("memory", "GiB", 1 / GIB, {"worker resident": _cpu_column("rss_bytes"), "host used": _cpu_column("mem_used_bytes")}),
)
CPU_COLUMNS = ("steal_pct", "rss_bytes", "mem_used_bytes")  # the host's one-value-per-sample columns drawn
LINE_COLOURS = {"SM": charts.PALETTE[0], "memory": charts.PALETTE[1], "GPU": charts.PALETTE[0],
                "memory controller": charts.PALETTE[1], "utilisation (mean of cores)": charts.PALETTE[2],
                "steal": charts.PALETTE[5], "worker resident": charts.PALETTE[2], "host used": charts.PALETTE[4]}


def telemetry_section(record: Record) -> dict:
    """Charts of what was sampled and the reasons for what was not."""
    tel = record.telemetry or {}
    out: dict = {"enabled": bool(tel.get("enabled")), "reason": tel.get("reason"), "gpu_panels": [],
                 "cpu_panels": [], "unavailable": [], "summary": [], "problem": None}
    if not out["enabled"]:
        out["unavailable"].append(("telemetry", tel.get("reason") or "not sampled for this run"))
        return out
    summary = tel.get("summary") or {}
    missing = summary.get("missing") or {}
    for key, value in summary.items():
        if key == "missing" or isinstance(value, (dict, list)):
            continue
        out["summary"].append((key, charts.fmt(value, 4) if isinstance(value, float) else str(value),
                               missing.get(key) if value is None else None))
    samples = [r.telemetry for r in record.repeats if r.telemetry]
    errors = sorted({str(t.get("error")) for t in samples if t.get("error")})
    for e in errors:
        out["unavailable"].append(("sampler", e))
    try:
        first = next((t for t in samples if not t.get("error")), None)
        if first is None:
            if not errors:
                out["unavailable"].append(("telemetry", "no repeat kept its samples"))
            return out
        frames = _frames(record)
        gpu = first.get("gpu") or {}
        if not gpu.get("available"):
            out["unavailable"].append(("GPU (NVML)", gpu.get("reason") or (tel.get("gpu") or {}).get("reason")
                                       or "not sampled"))
        for i, static in enumerate(gpu.get("static") or []):
            name = f"GPU {static.get('index', i)}" + (f" {static['name']}" if static.get("name") else "")
            for query, why in ((gpu.get("unsupported") or [{}] * (i + 1))[i] or {}).items():
                out["unavailable"].append((f"{name}: {query}", why))
            lost = (gpu.get("lost") or [None] * (i + 1))[i]
            if lost:
                out["unavailable"].append((f"{name}: lost", lost.get("reason")))
            episodes = [_throttle_episodes(i)(f) for f in frames]
            tracks = [charts.Track(f.label, f.t_s, f.windows, e) for f, e in zip(frames, episodes)]
            panels = []
            for title, unit, scale, lines in GPU_PANELS:
                panel = _panel(frames, title, unit, {line: _gpu_column(i, column) for line, column in lines.items()}, scale)
                if title == "power" and panel is None:  # the instant field where GetPowerUsage is not
                    panel = _panel(frames, title, unit, {"power": _gpu_column(i, "power_instant_w")})
                if panel is not None:
                    panels.append(panel)
            if panels:
                out["gpu_panels"].append(Figure(name, charts.time_panels(tracks, panels, f"{name} telemetry")))
        cpu = first.get("cpu") or {}
        for column, why in (cpu.get("unavailable") or {}).items():
            out["unavailable"].append((f"CPU: {column}", why))
        if cpu.get("rss_stopped"):
            out["unavailable"].append(("worker memory after the worker exited", cpu["rss_stopped"].get("reason")))
        panels = [_panel(frames, title, unit, columns, scale) for title, unit, scale, columns in CPU_PANELS]
        rapl = cpu.get("rapl") or {}
        if rapl.get("available"):
            for domain in rapl.get("domains") or []:
                title = f"RAPL {domain.get('name')} power ({domain.get('zone')})"
                panels.append(_panel(frames, title, "W", {title: _rapl_power(str(domain.get("zone")))},
                                     colours={title: charts.PALETTE[5]}))
        else:
            out["unavailable"].append(("CPU energy (RAPL)", rapl.get("reason") or "not sampled"))
        panels = [p for p in panels if p is not None]
        if panels:
            tracks = [charts.Track(f.label, f.t_s, f.windows) for f in frames]
            out["cpu_panels"].append(Figure("host (CPU, memory)", charts.time_panels(tracks, panels, "host telemetry")))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        out["problem"] = f"telemetry in an unexpected layout, not drawn: {type(e).__name__}: {e}"
    return out


def iteration_chart(record: Record) -> Markup:
    """Every iteration of every repeat in order: warm-up, then the measured ones (shaded)."""
    segments = []
    for rep in record.repeats:
        values = [*rep.warmup_iter_s, *rep.iter_s]
        if not values:
            continue
        t = np.arange(len(values), dtype=float)
        window = [(float(len(rep.warmup_iter_s)), float(len(values) - 1))] if rep.iter_s else []
        segments.append(charts.Segment(f"repeat {rep.index + 1}", t, {"iteration time": np.array(values) * 1e3},
                                       window))
    return charts.time_chart(segments, "iteration times", "ms", charts.PALETTE[0], height=170, gap_s=2,
                             x_label="iteration of each repeat: warm-up, then measured (shaded)")


def _repeat_rows(record: Record) -> list[dict]:
    rows = []
    for rep in record.repeats:
        median = sorted(rep.iter_s)[len(rep.iter_s) // 2] if rep.iter_s else None
        window = ((rep.window_monotonic_ns[1] - rep.window_monotonic_ns[0]) / 1e9
                  if len(rep.window_monotonic_ns) == 2 else None)
        derived = rep.derived or {}
        memory = rep.memory if isinstance(rep.memory, dict) else {}
        peak = _number(memory.get("peak_allocated_bytes"))
        rows.append({"alloc_peak_mb": peak / 1e6 if peak is not None else None,
                     "alloc_note": (memory.get("source") if peak is not None else memory.get("unavailable")) or None,
                     "index": rep.index + 1, "status": rep.status, "reason": rep.reason,
                     "first_iter_ms": rep.first_iter_s * 1e3 if rep.first_iter_s is not None else None,
                     "warmup": len(rep.warmup_iter_s), "settled": rep.warmup_settled,
                     "measured": len(rep.iter_s), "median_ms": median * 1e3 if median is not None else None,
                     "window_s": window, "wall_s": rep.wall_s,
                     "samples": derived.get("samples"), "covered": derived.get("covered"),
                     **_contention_cell(rep.contention)})
    return rows


def _contention_cell(contention: Any) -> dict:
    """Other processes' CPU during the window (% of the worker's cores beyond its spare ones), whether
    it was contended, and the details for the cell's title (schema 7; absent before)."""
    if not isinstance(contention, dict):
        return {"contention_pct": None, "contended": False, "contention_note": None}
    pct = _number(contention.get("contention_pct")) if contention.get("measured") else None
    notes = [f"other processes: {contention['other_cpu_pct']:.1f}% of {contention.get('given_cores')} cores"
             if _number(contention.get("other_cpu_pct")) is not None else contention.get("reason")]
    if _number(contention.get("steal_pct")) is not None:
        notes.append(f"steal {contention['steal_pct']:.1f}%")
    if _number(contention.get("threshold_pct")) is not None:
        notes.append(f"threshold {contention['threshold_pct']:g}%")
    wait = contention.get("quiet_wait")
    if isinstance(wait, dict) and _number(wait.get("waited_s")) is not None:
        notes.append(f"waited {wait['waited_s']:.1f} s for a quiet machine" + ("" if wait.get("quiet") else ", in vain"))
    return {"contention_pct": pct, "contended": bool(contention.get("contended")),
            "contention_note": "; ".join(str(n) for n in notes if n) or None}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compilation_context(record: Record, view) -> dict:
    """Compile mode and time, the allocator's peak (or why there is none), each repeat's compiler
    counters (Repeat.compile, schema 6)."""
    counters = [(f"repeat {rep.index + 1}", flatten(_rounded(rep.compile)))
                for rep in record.repeats if isinstance(rep.compile, dict) and rep.compile]
    return {"compile": view.compile, "compile_mode": view.compile_mode, "compile_ms": view.compile_ms,
            "first_iter_ms": view.first_iter_ms, "alloc_peak_mb": view.alloc_peak_mb, "alloc_note": view.alloc_note,
            "counters": counters}


def _repeat_policy(record: Record) -> dict:
    policy = getattr(record, "repeat_policy", None)  # how many repeats and why (records of schema 4 on)
    return {"repeat_policy": _rounded(policy.model_dump())} if policy is not None else {}


def _rounded(value: Any) -> Any:
    """Floats as 5 significant digits for reading; the rest as it is."""
    if isinstance(value, float):
        return charts.fmt(value, 5)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def network_definition(record: Record) -> str:
    return json.dumps(record.network.definition, indent=1, sort_keys=True, default=str)


# what each source of a prediction (performance/model.py SOURCES) reads as on a run page
SOURCE_NAMES = {"shape": "kernels measured at their shape", "class": "measured class efficiencies",
                "ceilings": "the roofline at the measured ceilings", "datasheet": "datasheet figures"}


def prediction_context(record: Record) -> dict | None:
    """The performance model's prediction kept in the record, against what the run measured."""
    p = getattr(record, "prediction", None)
    if p is None:
        return None
    measured = record.summary.median_s if record.summary is not None else None
    return {"profile": p.profile, "workers": p.workers, "schedule": p.schedule, "problem": p.error,
            # a shipped datasheet's figures x stated efficiencies (performance/datasheet.py), not a measured profile
            "datasheet": p.profile.startswith("datasheet:"),
            "predicted_ms": p.iteration_s * 1e3 if p.iteration_s else None,
            "measured_ms": measured * 1e3 if measured else None,
            "error_pct": 100 * (p.iteration_s / measured - 1) if p.iteration_s and measured else None,
            "phases": [(name.replace("_", " "), seconds * 1e3) for name, seconds in p.phases.items() if seconds],
            "measured_pct": 100 * p.measured_share if p.measured_share is not None else None,
            # the share from each source (record schema 12; older records have none)
            "sources": [(SOURCE_NAMES.get(name, name), 100 * share) for name, share in p.sources.items()],
            "notes": p.notes}


def loadgen_context(record: Record) -> dict | None:
    """A LoadGen scenario run's section: LoadGen's verdict and figures, its latency chart, the
    server's search, the settings given and taken, and the logs kept in the store."""
    info = record.loadgen
    if info is None:
        return None
    from .charts import Point, Series, percentile_chart

    pct = [(float(k), v / 1e6) for k, v in info.result.latency_ns.items() if k.replace(".", "").isdigit()]
    chart = percentile_chart([Series(f"{info.scenario} ({info.result.validity})", [Point(p, ms) for p, ms in pct])],
                             f"{record.benchmark} on {record.framework.get('name')}: LoadGen latency percentiles",
                             "ms per sample")
    return {"info": info, "chart": chart,
            "figures": flatten(_rounded(info.result.figures)),
            "settings": flatten({"given": info.settings, "batching": info.batching,
                                 "warmup_latency_s": info.warmup_latency_s,
                                 **({"generation": info.generation} if info.generation else {})}),
            "effective": flatten(info.effective),
            "search": info.search, "logs": info.logs}


def generation_context(record: Record) -> dict | None:
    """Mode generate: the request's shape and, per quantity, the distribution over its requests."""
    g = record.generation
    if g is None:
        return None
    rows = []
    for label, dist, scale in (("time to first token (ms)", g.ttft, 1e3), ("time per output token (ms)", g.tpot, 1e3),
                               ("tokens/s per request", g.tokens_per_s, 1.0)):
        if dist is not None:
            rows.append({"label": label, "requests": dist.requests,
                         **{k: getattr(dist, k) * scale for k in ("median", "mean", "p90", "p99", "min", "max")},
                         "repeat_medians": [m * scale for m in dist.repeat_medians]})
    return {"prompt_length": g.prompt_length, "new_tokens": g.new_tokens, "batch_size": g.batch_size,
            "first_ttft_ms": g.first_ttft_s * 1e3 if g.first_ttft_s is not None else None, "rows": rows,
            "how": (record.settings.runner or {}).get("generation") or {}}


def convergence_context(record: Record) -> dict | None:
    """A convergence run's page part: the score, the accuracy at every evaluation of every seed
    (one line per seed, the target drawn as a line of its own) and a row per seed."""
    c = record.convergence
    if c is None:
        return None
    series = [charts.Series(f"seed {r.seed}", [charts.Point(float(e["epoch"]), float(e["accuracy"])) for e in r.evals],
                            charts.PALETTE[i % len(charts.PALETTE)])
              for i, r in enumerate(c.runs) if r.evals]
    epochs = [float(e["epoch"]) for r in c.runs for e in r.evals]
    if series and epochs:
        series.append(charts.Series(f"target {c.target:g}", [charts.Point(min(epochs), c.target),
                                                             charts.Point(max(epochs), c.target)], "#888888"))
    rows = [{"seed": r.seed, "status": r.status, "reason": r.reason, "reached": r.reached, "epochs": r.epochs,
             "epochs_to_target": r.epochs_to_target, "time_to_target_s": r.time_to_target_s, "init_s": r.init_s,
             "input_bound_pct": r.input_bound_share * 100 if r.input_bound_share is not None else None,
             "last_accuracy": r.evals[-1]["accuracy"] if r.evals else None, "mllog": r.mllog,
             "scored": r.seed in c.scored_seeds} for r in c.runs]
    return {"score_s": c.score_s, "rule": c.score_rule, "reason": c.reason, "target": c.target, "metric": c.metric,
            "epochs_to_target": c.epochs_to_target, "reached": c.reached, "runs": len(c.runs),
            "input_bound_pct": c.input_bound_share * 100 if c.input_bound_share is not None else None,
            "chart": charts.line_chart(series, "top-1 accuracy on the evaluation split, per seed", "epoch",
                                       "accuracy") if series else None,
            "rows": rows,
            "task": flatten({k: v for k, v in c.model_dump().items()
                             if k in ("dataset", "optimizer", "augmentation", "batch_size", "max_epochs",
                                      "eval_every_epochs", "loader_workers", "max_init_s")})}


def run_context(record: Record, page: str | None = None, peaks=None) -> dict:
    view = run_view(record, page, peaks)
    hardware = hardware_label(record)
    bench_key = (record.suite, hardware, record.benchmark)
    # fields a record of an older schema lacks (the interval, the stability verdict) are left out
    stats = (flatten(_rounded({k: v for k, v in record.summary.model_dump().items() if v is not None}))
             if record.summary is not None else [])
    environment = dict(record.environment)
    packages = environment.pop("packages", None) or []
    return {
        "view": view,
        "record": record,
        "benchmark_page": benchmark_page_name(bench_key),
        "board_anchor": board_anchor(bench_key[:2]),
        "series_anchor": series_anchor((record.suite, hardware, record.benchmark, record.workload.batch_size,
                                        record.workload.precision, view.framework, view.hostname,
                                        record.workload.compile)),
        "stats": stats,
        "repeats": _repeat_rows(record),
        "iteration_chart": (iteration_chart(record)
                            if any(r.iter_s or r.warmup_iter_s for r in record.repeats) else None),
        "provenance": flatten({"dlbench": record.dlbench, "machine": record.machine}),
        "framework": flatten(record.framework),
        "environment": flatten(environment),
        "packages": [str(p) for p in packages],
        "network": flatten({k: v for k, v in record.network.model_dump().items() if k != "definition"}),
        "definition_page": view.network_page,
        "workload": flatten(record.workload.model_dump()),
        "settings": flatten({**record.settings.model_dump(), **_repeat_policy(record)}),
        "equivalence_rows": flatten(record.equivalence),
        "telemetry": telemetry_section(record),
        "distributed": distributed_context(record, flatten),  # distributed and comm runs (distributed_view.py)
        "prediction": prediction_context(record),
        "compilation": compilation_context(record, view),
        "loadgen": loadgen_context(record),
        "generation": generation_context(record),
        "convergence": convergence_context(record),
    }
