"""`dlbench history`: per series, median throughput over time and versions, with its steps found.

A series is one workload on one framework on one machine: (benchmark, framework, machine) as asked,
plus batch size, device and the axes that pair runs (dlbench.axes.SERIES_AXES: precision, compile
mode), since throughput at another batch size is another quantity.
Its points are the completed runs in start order, each valued at its `samples_per_s` (batch size /
median iteration time).

Change points: ruptures' PELT on the log of throughput (a step is then relative, and a 10% drop has
the same size at any speed), with the L1 cost (deviations from each segment's median) and segments
of at least MIN_SEGMENT runs. Why L1: on a shared machine a run caught by a neighbour's job can be
several times slower; with the L2 cost such a lone outlier is cut out as two steps in almost every
series (measured: 100% of simulated 30-run series with one 3x outlier), with L1 in about 1%. Why
PELT: it finds any number of steps exactly for a given penalty, and its cost for histories of tens
to hundreds of runs is small; binary segmentation is an approximation of the same criterion.

The penalty scales with the series' own noise: sigma is estimated from successive differences of
log throughput (median absolute deviation, scaled to a normal sd, / sqrt 2), which a step disturbs
in one difference only; then penalty = sigma * (PENALTY_OFFSET + ln n). Calibrated by simulation
(Gaussian noise on log throughput, 300 step-free series per length): the penalty at which PELT
stops reporting a step exceeds sigma * (3 + ln n) in about 5% of series of 8-10 runs and 2-4% of
series of 15-100 runs, so a step-free series reports a false step with probability of about 5% or
less. Series shorter than MIN_RUNS are shown without detection: their noise cannot be estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import ruptures
from scipy.stats import median_abs_deviation

from ..axes import SERIES_AXES
from ..store.record import Record

MIN_SEGMENT = 3  # a level must hold for three runs to count as a step; a lone slow run does not
MIN_RUNS = 10
PENALTY_OFFSET = 3.5
NOISE_FLOOR = 1e-3  # sigma of log throughput never taken below 0.1%: identical values are not infinitely precise


def noise_sigma(log_values: np.ndarray) -> float:
    """Robust sd of the run-to-run noise on log throughput, from successive differences."""
    diffs = np.diff(log_values)
    return max(float(median_abs_deviation(diffs, scale="normal")) / np.sqrt(2.0), NOISE_FLOOR)


def detect_steps(throughputs: list[float] | np.ndarray) -> list[int]:
    """Indices of the first run of each new level (empty for short or step-free series)."""
    values = np.asarray(throughputs, dtype=float)
    n = len(values)
    if n < MIN_RUNS:
        return []
    y = np.log(values)
    penalty = noise_sigma(y) * (PENALTY_OFFSET + np.log(n))
    algo = ruptures.Pelt(model="l1", min_size=MIN_SEGMENT, jump=1).fit(y.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=penalty)[:-1]]  # the last breakpoint is always n


@dataclass(frozen=True)
class SeriesKey:
    benchmark: str
    framework: str
    machine: str
    batch_size: int
    device: str
    axes: tuple[str | None, ...]  # the run's value of each of SERIES_AXES (precision, compile mode, ...), in order

    @classmethod
    def of(cls, r: Record) -> "SeriesKey":
        return cls(r.benchmark, str(r.framework.get("name")), str(r.machine.get("hostname")),
                   r.workload.batch_size, r.workload.device, tuple(getattr(r.workload, a.field) for a in SERIES_AXES))

    def __getattr__(self, name: str):
        """An axis's value by its field's name (key.precision, key.compile)."""
        for spec, value in zip(SERIES_AXES, self.__dict__.get("axes", ())):
            if spec.field == name:
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def fields(self) -> dict:
        """The key as named fields, each axis by its own name."""
        return {"benchmark": self.benchmark, "framework": self.framework, "machine": self.machine,
                "batch_size": self.batch_size, "device": self.device,
                **{a.field: value for a, value in zip(SERIES_AXES, self.axes)}}


@dataclass(frozen=True)
class Point:
    run_id: str
    started_at: datetime
    version: str
    samples_per_s: float


@dataclass(frozen=True)
class Step:
    index: int  # position in the series of the first run at the new level
    run_id: str
    started_at: datetime
    version_before: str
    version: str
    before_samples_per_s: float  # median of the level that ends here
    after_samples_per_s: float  # median of the level that starts here

    @property
    def change_pct(self) -> float:
        return (self.after_samples_per_s / self.before_samples_per_s - 1.0) * 100.0


@dataclass
class Series:
    key: SeriesKey
    points: list[Point]
    steps: list[Step] = field(default_factory=list)
    noise_cv: float | None = None  # run-to-run sigma of log throughput (~ CV); None when too short

    @property
    def detected(self) -> bool:
        return self.noise_cv is not None

    def to_dict(self) -> dict:
        return {
            **self.key.fields(),
            "runs": len(self.points), "noise_cv": self.noise_cv, "detected": self.detected,
            "points": [{"run_id": p.run_id, "started_at": p.started_at.isoformat(timespec="seconds"),
                        "version": p.version, "samples_per_s": p.samples_per_s} for p in self.points],
            "steps": [{"index": s.index, "run_id": s.run_id, "started_at": s.started_at.isoformat(timespec="seconds"),
                       "version_before": s.version_before, "version": s.version,
                       "before_samples_per_s": s.before_samples_per_s, "after_samples_per_s": s.after_samples_per_s,
                       "change_pct": s.change_pct} for s in self.steps],
        }


def analyse(key: SeriesKey, points: list[Point]) -> Series:
    points = sorted(points, key=lambda p: (p.started_at, p.run_id))
    values = np.array([p.samples_per_s for p in points])
    series = Series(key, points)
    if len(points) < MIN_RUNS:
        return series
    series.noise_cv = noise_sigma(np.log(values))
    bounds = [0, *detect_steps(values), len(points)]
    for prev_start, start, end in zip(bounds, bounds[1:], bounds[2:]):
        first = points[start]
        series.steps.append(Step(index=start, run_id=first.run_id, started_at=first.started_at,
                                 version_before=points[start - 1].version, version=first.version,
                                 before_samples_per_s=float(np.median(values[prev_start:start])),
                                 after_samples_per_s=float(np.median(values[start:end]))))
    return series


def build_history(records, *, benchmarks=None, frameworks=None, machines=None) -> list[Series]:
    """Every series of completed runs that passes the filters (None or empty: no filter), sorted by key.
    A benchmark filter also takes network names (fcn5 = fcn5-train and fcn5-infer), a machine filter
    hostnames or machine ids, as `dlbench results` does."""
    grouped: dict[SeriesKey, list[Point]] = {}
    for r in records:
        if r.status != "ok" or r.summary is None:
            continue
        key = SeriesKey.of(r)
        if ((benchmarks and key.benchmark not in benchmarks and r.network.name not in benchmarks)
                or (frameworks and key.framework not in frameworks)
                or (machines and key.machine not in machines and str(r.machine.get("machine_id")) not in machines)):
            continue
        grouped.setdefault(key, []).append(
            Point(r.run_id, r.started_at, str(r.framework.get("version")), r.summary.samples_per_s))
    return [analyse(k, pts) for k, pts in sorted(grouped.items(), key=lambda kv: tuple(map(str, kv[0].fields().values())))]


def history_table(series: list[Series], title: str):
    """The rich table `dlbench history` prints: one row per series, its steps listed in the last column."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title))
    for col in ("benchmark", "framework", "machine", "batch", "device", "runs", "from", "to", "versions",
                "last samples/s", "noise", "steps"):
        t.add_column(col, justify="right" if col in ("batch", "runs", "last samples/s", "noise") else "left")
    for s in series:
        first, last = s.points[0], s.points[-1]
        versions = list(dict.fromkeys(p.version for p in s.points))
        if not s.detected:
            steps = f"[dim]not tested: fewer than {MIN_RUNS} runs[/]"
        elif not s.steps:
            steps = "none"
        else:
            steps = "\n".join(
                f"[{'red' if st.change_pct < 0 else 'green'}]{st.change_pct:+.1f}%[/] at {escape(st.run_id)} "
                f"({escape(st.started_at.date().isoformat())}"
                + (f", {escape(st.version_before)} → {escape(st.version)}" if st.version != st.version_before else "")
                + ")" for st in s.steps)
        t.add_row(escape(s.key.benchmark), escape(s.key.framework), escape(s.key.machine), str(s.key.batch_size),
                  s.key.device, str(len(s.points)), first.started_at.date().isoformat(),
                  last.started_at.date().isoformat(),
                  escape(" → ".join(versions) if len(versions) <= 3 else f"{versions[0]} → … → {versions[-1]}"),
                  f"{last.samples_per_s:.4g}", "" if s.noise_cv is None else f"{s.noise_cv:.1%}", steps)
    t.caption = (f"steps: ruptures PELT (L1 cost on log throughput, levels of ≥ {MIN_SEGMENT} runs, penalty "
                 f"σ·({PENALTY_OFFSET:g} + ln n), σ = the series' run-to-run noise); a step-free series "
                 "shows a false step in about 5% of cases or fewer")
    return t
