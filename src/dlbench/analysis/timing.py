"""What a run's iteration times say: the median, its spread, how sure we are of it, and whether the
repeats agree.

The measurement has two levels. Each repeat is a fresh worker process; inside it, consecutive
iterations share the process's memory layout, thread placement, clocks and caches, so they are
correlated (a slow stretch lasts several iterations) and are not independent draws. The repeats are
the independent units. Two consequences shape everything below:

* A bootstrap that treats all iterations as independent would report an interval far too narrow:
  with thousands of iterations it shrinks towards zero even when every process lands somewhere
  else. An interval built only from the repeat medians (a t-interval or a bootstrap of 3 numbers)
  honours independence but throws the iterations away and is very wide with few repeats
  (t at 2 degrees of freedom is 4.3).

* So the interval is a **two-level bootstrap** (Davison & Hinkley 1997, sec. 3.8; used for
  benchmarks by Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013): each
  resample draws the repeats with replacement (scipy.stats.bootstrap does this level and reads the
  percentile interval off the resampled statistics), then, inside each drawn repeat, draws its
  iterations with replacement in contiguous blocks (a block bootstrap: blocks keep the short-range
  correlation that single iterations would cut; block length ⌊n^(1/3)⌋, the usual rate, at most
  MAX_BLOCKS_PER_REPEAT blocks). The statistic of a resample is the same as the reported one: the
  median of all its pooled iterations. With one repeat only the inner level exists (method
  "block bootstrap", level "iterations"): that interval cannot see process-to-process variation,
  and the record says so.

  A percentile interval from a bootstrap over U units carries the plug-in variance, (U-1)/U of the
  unbiased one: a third too small with 3 repeats. The interval is therefore stretched about the
  median by sqrt(U/(U-1)) (1.22 at 3 repeats, 1.05 at 10). Measured on simulated runs
  (benchmarks/ci_coverage.py: log-normal iteration times, a random per-process offset, AR(1)
  correlation inside a process; 1000 runs each), this interval covers the true median 97-99% of
  the time when the iterations' own noise dominates or matches the processes' (92% from a single
  repeat); when the process-to-process offset dominates, coverage drops to about 78% with 2
  repeats, 84% with 3, 88% with 5, 92% with 10 and 94% with 20 - the price of few independent units. So this is the
  interval the record stores (`Summary.ci`, with its method and level), but not the one dlbench
  reports: store/intervals.py widens it, as the record is read, to Student's t interval on the
  repeat medians where that reaches further (coverage 94-99% in every scenario with 2 or more
  repeats; why, and why on read: that module's docstring).

Throughput is batch / iteration time, a decreasing function, so its interval is batch over the
time interval's ends, swapped.

**Stability.** Repeats "disagree" when both of these hold:

1. a Kruskal-Wallis rank test (scipy.stats.kruskal) across the repeats says they do not come from
   one distribution (p < KRUSKAL_ALPHA). It ranks the medians of the same iteration blocks the
   interval resamples, not single iterations: correlated neighbours would make its p-values far
   too small (on simulated AR(1) iterations with phi 0.3, 10 repeats of 50 iterations, single
   iterations raise 21% false alarms at alpha 0.01, block medians 3%). With few iterations this
   test is the guard against chance, since a handful of iterations per repeat spread their medians
   widely on their own. With many iterations it alone is useless: it detects shifts of a fraction
   of a percent;
2. the spread of the repeat medians (max - min) exceeds SPREAD_TO_IQR times the typical
   within-repeat IQR (the median of the repeats' own IQRs) and MIN_RELATIVE_SPREAD of the median.
   Half an IQR: if the processes were interchangeable their medians would differ by about
   d2(R) * 0.93 * IQR / sqrt(n) (independent normal iterations; d2 the expected range of R
   normals): 0.22 IQR for 3 repeats of 50 iterations, 0.29 for 10 repeats of 100, somewhat more
   when iterations are correlated. Half an IQR is a shift the iterations do not explain, and one
   comparable to the quartile spread a reader is shown, which then understates how far a rerun
   moves the result. The 1% floor keeps very steady devices (GPU IQRs of a few tenths of a
   percent) from flagging differences nobody would cite.
"""

from __future__ import annotations

import math
import statistics as st
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse, stats

from ..store.record import MedianInterval, Repeat, Stability, Summary

CONFIDENCE = 0.95
RESAMPLES = 2000  # Monte Carlo error of a 95% percentile end: about 1.5% of the interval's width
MAX_BLOCKS_PER_REPEAT = 32
GRID_CELLS = 1024  # above this many distinct times, resample medians are read off quantile cells
KRUSKAL_ALPHA = 0.01
SPREAD_TO_IQR = 0.5
MIN_RELATIVE_SPREAD = 0.01
SEED = 20261129  # fixed: the same iterations always give the same interval


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: str  # "two-level bootstrap" | "block bootstrap"
    level: str  # outermost independent unit resampled: "repeats" | "iterations"
    units: int  # how many of those units there were
    resamples: int
    confidence: float


def _blocks_per_repeat(shortest: int) -> int:
    length = max(1, math.floor(shortest ** (1 / 3)))
    return max(1, min(MAX_BLOCKS_PER_REPEAT, shortest // length))


class _BlockCells:
    """Every block's iterations counted on one grid of time cells, so that the pooled median of any
    weighted combination of blocks is a matrix product and a cumulative sum, not a sort.

    With at most GRID_CELLS distinct times each cell is one time and the medians are exact;
    above that the cells hold equal shares of the pooled iterations and a median is interpolated
    inside its cell (near the median a cell spans about 0.3% of the IQR).
    """

    def __init__(self, per_repeat: list[np.ndarray], blocks: int):
        pooled = np.concatenate(per_repeat)
        distinct = np.unique(pooled)
        if len(distinct) <= GRID_CELLS:
            self.lower = self.upper = distinct
            cell_of = lambda x: np.searchsorted(distinct, x)  # noqa: E731
        else:
            edges = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, GRID_CELLS + 1)))
            self.lower, self.upper = edges[:-1], edges[1:]
            cell_of = lambda x: np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)  # noqa: E731
        cells = len(self.lower)
        # A resample holds at most (repeats x the longest repeat) iterations; float32 counts them
        # exactly below 2**24 and halves the work of the product and the running sums.
        most = len(per_repeat) * max(len(x) for x in per_repeat)
        self.dtype = np.float32 if most < 2 ** 24 else np.float64
        counts = np.stack([np.bincount(cell_of(block), minlength=cells)
                           for times in per_repeat for block in np.array_split(times, blocks)]).astype(self.dtype)
        # Every iteration sits in one block and one cell, so short blocks leave the matrix mostly
        # zeros; then a sparse product is several times cheaper (and uses no BLAS threads).
        self.counts = sparse.csr_array(counts) if 8 * np.count_nonzero(counts) < counts.size else counts

    def medians(self, weights: np.ndarray) -> np.ndarray:
        """Pooled median for each row of block weights (resamples x blocks)."""
        weights = weights.astype(self.dtype)
        counts = (self.counts.T @ weights.T).T if sparse.issparse(self.counts) else weights @ self.counts
        cumulative = np.add.accumulate(counts, axis=1)  # several times faster than np.cumsum here
        total = cumulative[:, -1]
        rows = np.arange(len(counts))

        def value_of_rank(rank: np.ndarray) -> np.ndarray:  # rank counted from 1
            cell = (cumulative < rank[:, None]).sum(axis=1)
            in_cell = counts[rows, cell]
            share = (rank - (cumulative[rows, cell] - in_cell) - 0.5) / in_cell
            return self.lower[cell] + (self.upper[cell] - self.lower[cell]) * share

        return (value_of_rank(np.floor((total + 1) / 2)) + value_of_rank(np.floor(total / 2) + 1)) / 2


def median_interval(per_repeat: Sequence[Sequence[float]], confidence: float = CONFIDENCE,
                    resamples: int = RESAMPLES, seed: int = SEED) -> Interval | None:
    """Confidence interval of the pooled median iteration time (see the module docstring for the
    method); None when there is nothing to resample (fewer than two iterations in all)."""
    times = [np.asarray(x, dtype=np.float64) for x in per_repeat if len(x)]
    if not times or sum(len(x) for x in times) < 2:
        return None
    repeats = len(times)
    blocks = _blocks_per_repeat(min(len(x) for x in times))
    cells = _BlockCells(times, blocks)
    units = repeats if repeats > 1 else blocks
    inner = np.random.default_rng(seed)
    all_blocks = repeats * blocks

    def statistic(drawn: np.ndarray, axis: int = -1) -> np.ndarray:
        shape = np.shape(drawn)[:-1]
        drawn = np.asarray(drawn, dtype=np.int64).reshape(-1, units)  # resamples x drawn units
        resample = np.arange(len(drawn))[:, None]
        if repeats > 1:
            # each drawn repeat draws its own `blocks` blocks, with replacement
            picked = drawn[:, :, None] * blocks + inner.integers(0, blocks, size=(*drawn.shape, blocks))
            picked = picked.reshape(len(drawn), -1)
        else:
            picked = drawn  # the units are the blocks of the one repeat
        weights = np.bincount((resample * all_blocks + picked).ravel(), minlength=len(drawn) * all_blocks)
        return cells.medians(weights.reshape(len(drawn), all_blocks)).reshape(shape)

    if units < 2:  # one repeat too short to split: every resample is the data itself
        median = float(np.median(times[0]))
        low = high = median
    else:
        result = stats.bootstrap((np.arange(units),), statistic, vectorized=True, n_resamples=resamples,
                                 confidence_level=confidence, method="percentile", batch=500,
                                 rng=np.random.default_rng(seed + 1))
        median = float(np.median(np.concatenate(times)))
        stretch = math.sqrt(units / (units - 1))
        low = median - (median - float(result.confidence_interval.low)) * stretch
        high = median + (float(result.confidence_interval.high) - median) * stretch
    # the median cannot lie below the fastest iteration, however far the stretch reaches
    return Interval(low=max(low, float(min(x.min() for x in times))), high=high,
                    method="two-level bootstrap" if repeats > 1 else "block bootstrap",
                    level="repeats" if repeats > 1 else "iterations",
                    units=units, resamples=resamples, confidence=confidence)


def repeat_agreement(per_repeat: Sequence[Sequence[float]]) -> Stability:
    """Do the repeats agree within their own spread? (criteria and thresholds: module docstring)"""
    times = [np.asarray(x, dtype=np.float64) for x in per_repeat if len(x)]
    if len(times) < 2:
        return Stability(unstable=False, reason="one repeat: agreement between processes not tested")
    medians = [float(np.median(x)) for x in times]
    spread = max(medians) - min(medians)
    within_iqr = float(np.median([stats.iqr(x) for x in times]))
    pooled_median = float(np.median(np.concatenate(times)))
    blocks = _blocks_per_repeat(min(len(x) for x in times))
    block_medians = [[float(np.median(b)) for b in np.array_split(x, blocks)] for x in times]
    if len({m for ms in block_medians for m in ms}) == 1:
        p = 1.0  # every block alike: nothing to rank (scipy would answer nan)
    else:
        p = float(stats.kruskal(*block_medians).pvalue)
    ratio = spread / within_iqr if within_iqr > 0 else (math.inf if spread > 0 else 0.0)
    relative = spread / pooled_median if pooled_median > 0 else 0.0
    unstable = p < KRUSKAL_ALPHA and ratio > SPREAD_TO_IQR and relative > MIN_RELATIVE_SPREAD
    ratio_text = "no within-repeat spread" if math.isinf(ratio) else f"{ratio:.2g}x the within-repeat IQR"
    reason = (f"repeats {'disagree' if unstable else 'agree'}: medians {min(medians) * 1e3:.4g}-"
              f"{max(medians) * 1e3:.4g} ms span {relative:.1%} of the median, {ratio_text} "
              f"(Kruskal-Wallis p={p:.2g})")
    return Stability(unstable=unstable, reason=reason, kruskal_p=p,
                     spread_to_iqr=None if math.isinf(ratio) else ratio)


def summarise(repeats: list[Repeat], batch_size: int) -> Summary | None:
    """Pool the measured iterations of the successful repeats; None when there are none."""
    good = [r for r in repeats if r.status == "ok" and r.iter_s]
    times = [t for r in good for t in r.iter_s]
    if not times:
        return None
    median = st.median(times)
    mean = st.fmean(times)
    stdev = st.stdev(times) if len(times) > 1 else 0.0
    q1, _, q3 = st.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (times[0],) * 3
    firsts = [r.first_iter_s for r in good if r.first_iter_s is not None]
    per_repeat = [r.iter_s for r in good]
    interval = median_interval(per_repeat)
    return Summary(
        repeats=len(good), iterations=len(times), median_s=median, mean_s=mean, stdev_s=stdev,
        min_s=min(times), max_s=max(times), q1_s=q1, q3_s=q3, iqr_s=q3 - q1, cv=stdev / mean if mean else 0.0,
        repeat_medians_s=[st.median(r.iter_s) for r in good],
        first_iter_s=st.median(firsts) if firsts else None,
        ms_per_iter=median * 1e3, samples_per_s=batch_size / median,
        ci=median_interval_record(interval, median, batch_size) if interval and interval.low > 0 else None,
        stability=repeat_agreement(per_repeat),
        compile_s=compile_time(good),
    )


def compile_time(repeats: list[Repeat]) -> float | None:
    """Median over repeats of (first iteration - that repeat's median iteration): the one-off cost
    of the first step (tracing, compiling, autotuning, first allocations) beyond a steady one."""
    extra = [r.first_iter_s - st.median(r.iter_s) for r in repeats if r.first_iter_s is not None and r.iter_s]
    return st.median(extra) if extra else None


def median_interval_record(interval: Interval, median: float, batch_size: int) -> MedianInterval:
    return MedianInterval(
        confidence=interval.confidence, method=interval.method, level=interval.level, units=interval.units,
        resamples=interval.resamples, median_s=(interval.low, interval.high),
        samples_per_s=(batch_size / interval.high, batch_size / interval.low),
        half_width_pct=100 * (interval.high - interval.low) / 2 / median,
    )
