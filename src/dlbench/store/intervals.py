"""The interval of a run's median iteration time that dlbench reports, derived from the record when it
is read (results rows, the report, the end-of-run table); never stored.

Why a t interval on the repeat medians. The repeats (fresh worker processes) are the independent
units of a run; iterations inside one process are correlated and share its offset (memory layout,
clocks, thread placement, neighbours). The stored interval, `Summary.ci`, is the two-level
bootstrap of analysis/timing.py (repeats, then iteration blocks). A bootstrap over R units reads
its ends off the resampled statistic as if R were large: with 3 repeats it cannot know how far a
fourth process may land, so when the process-to-process offsets dominate, its "95%" interval
covered the true median in only 78% of simulated runs at 2 repeats, 84% at 3, 88% at 5, 92% at 10
and 94% at 20 (benchmarks/ci_coverage.py). The textbook answer for the mean of R independent units of unknown
spread is Student's t with R - 1 degrees of freedom: on the logarithms of the repeat medians (log
times are what the offsets shift; the throughput's interval is then batch over the ends, so it is
the same interval on either scale), mean +- t(R-1) s / sqrt(R). It honours the process-to-process
spread whatever its share, and makes no use of the within-process detail, so it is wide with few
repeats (t at 2 d.o.f. is 4.30): that is what 3 processes can say.

Why widened to the bootstrap's. Three repeat medians can land close together by chance (the t
interval's own width is random); then the iterations still say how far each median could be off.
So the reported interval is the union of the t interval and the stored two-level bootstrap, never
narrower than either, and it always holds the reported median. Which method set the ends is in
`method`. Measured (benchmarks/ci_coverage.py, 1000 simulated runs per scenario): coverage 94-99%
in every scenario with 2 or more repeats, whether the iterations, the processes or both dominate;
the price is width where iterations dominate at 2-3 repeats (at 3 x 50 iterations about 1.3x the
bootstrap's half-width, at 2 repeats about 3x), where 2-3 processes cannot rule out an offset.

One repeat. There is no second process, so nothing can say how far another process would land:
the interval is the stored block bootstrap over that process's iterations (`level` "iterations"),
an interval of this process's median, not a 95% interval of the run's (`nominal` is False, and the
tables mark it). Even with no process offset at all it covered 90-92% in simulation.

Derived on read, like utilisation.py's figures: the record keeps what was computed when it was
written (the bootstrap interval, its method and level, and the repeat medians), so no stored field
changes meaning, and records of every schema version get the same reported interval; the row
index's fingerprint covers this file, so a changed formula never serves stale rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .record import Summary

CONFIDENCE = 0.95  # for records whose summary holds no interval to take it from (before schema 4)


@dataclass(frozen=True)
class ReportedInterval:
    median_s: tuple[float, float]  # low, high of the median iteration time
    samples_per_s: tuple[float, float]  # batch / (high, low)
    half_width_pct: float  # (high - low) / 2, % of the median
    confidence: float
    level: str  # "repeats" | "iterations" (one process)
    units: int  # repeats, or the iteration blocks of one repeat
    method: str  # what set the ends
    nominal: bool  # False: not a `confidence` interval of the run's median (one process)

    @property
    def note(self) -> str:
        """One line for a tooltip or a footnote."""
        if not self.nominal:
            return (f"{self.method} over one process's iterations: it cannot see how far another process lands, "
                    f"so it is not a {100 * self.confidence:.0f}% interval of the run's median")
        return f"{100 * self.confidence:.0f}% interval of the median: {self.method}"


@lru_cache(maxsize=256)
def t_quantile(confidence: float, dof: int) -> float:
    """Two-sided Student t quantile (scipy.special: the light part of scipy, imported when needed)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, 0.5 + confidence / 2))


def repeat_t_interval(repeat_medians_s: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """exp(mean +- t(R-1) s / sqrt(R)) of the log repeat medians; None with fewer than 2 repeats."""
    logs = [math.log(m) for m in repeat_medians_s if m > 0]
    r = len(logs)
    if r < 2:
        return None
    mean = sum(logs) / r
    s = math.sqrt(sum((x - mean) ** 2 for x in logs) / (r - 1))
    half = t_quantile(confidence, r - 1) * s / math.sqrt(r)
    return math.exp(mean - half), math.exp(mean + half)


def reported_interval(summary: Summary | None, batch_size: int) -> ReportedInterval | None:
    """The interval dlbench shows for a run (module docstring: how and why); None without one."""
    if summary is None:
        return None
    ci = summary.ci
    confidence = ci.confidence if ci is not None else CONFIDENCE
    t = repeat_t_interval(summary.repeat_medians_s, confidence) if summary.repeats > 1 else None
    boot = tuple(ci.median_s) if ci is not None else None
    if t is None and boot is None:
        return None
    if t is None:
        low, high = boot
        method = ci.method
    elif boot is None:
        (low, high), method = t, f"t ({summary.repeats - 1} d.o.f.) on {summary.repeats} repeat medians"
    else:
        low, high = min(t[0], boot[0]), max(t[1], boot[1])
        name = f"t ({summary.repeats - 1} d.o.f.) on {summary.repeats} repeat medians"
        if (low, high) == t:
            method = name
        elif (low, high) == boot:
            method = f"{ci.method} (wider than the {name})"
        else:
            method = f"{name} and {ci.method}, the wider end of each"
    median = summary.median_s
    low, high = min(low, median), max(high, median)
    if not low > 0:
        return None
    nominal = summary.repeats > 1
    return ReportedInterval(
        median_s=(low, high), samples_per_s=(batch_size / high, batch_size / low),
        half_width_pct=100 * (high - low) / 2 / median, confidence=confidence,
        level="repeats" if nominal else "iterations",
        units=summary.repeats if nominal else (ci.units if ci is not None else 1),
        method=method, nominal=nominal)
