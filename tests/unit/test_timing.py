"""The median's confidence interval and the repeats' agreement, on synthetic iteration times."""

from __future__ import annotations

import math
import statistics as st
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dlbench.analysis import timing
from dlbench.analysis.timing import median_interval, repeat_agreement, summarise
from dlbench.store.record import Repeat, Summary

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from ci_coverage import TRUE_MEDIAN_S, simulate_run  # noqa: E402  (the same simulated runs the script measures)


def repeats_of(per_repeat) -> list[Repeat]:
    return [Repeat(index=i, status="ok", iter_s=list(map(float, times)), first_iter_s=0.5)
            for i, times in enumerate(per_repeat)]


# ---------------------------------------------------------------- the interval


def test_interval_covers_the_true_median_at_about_its_nominal_rate():
    """Seeded simulated runs, 5 repeats of 60 correlated iterations with a small per-process offset:
    the 95% interval must contain the known median about 95% of the time (a loose band: with 150
    trials the rate itself has a standard error near 0.018)."""
    rng = np.random.default_rng(2026)
    trials = 150
    covered = sum(
        (iv := median_interval(simulate_run(rng, 5, 60, 0.005, 0.05, 0.3), resamples=400, seed=t)).low
        <= TRUE_MEDIAN_S <= iv.high
        for t in range(trials))
    assert 0.88 <= covered / trials <= 1.0


def test_interval_narrows_with_more_repeats():
    rng = np.random.default_rng(7)

    def mean_width(repeats):
        return np.mean([(iv := median_interval(simulate_run(rng, repeats, 50, 0.01, 0.05, 0.3),
                                                resamples=400, seed=t)).high - iv.low for t in range(12)])

    few, many = mean_width(3), mean_width(12)
    assert many < 0.7 * few


def test_repeats_are_the_unit_not_iterations():
    """Three processes that each land somewhere else, thousands of iterations each: an iteration-level
    bootstrap claims a tiny interval; the two-level one stays as wide as the processes disagree."""
    rng = np.random.default_rng(3)
    per_repeat = [0.010 * (1 + offset) * np.exp(rng.normal(0, 0.03, 3000)) for offset in (-0.03, 0.0, 0.03)]
    pooled = np.concatenate(per_repeat)
    naive = stats.bootstrap((pooled,), np.median, n_resamples=400, method="percentile",
                            rng=np.random.default_rng(0)).confidence_interval
    iv = median_interval(per_repeat, resamples=400)
    assert iv.method == "two-level bootstrap" and iv.level == "repeats" and iv.units == 3
    assert (iv.high - iv.low) > 5 * (naive.high - naive.low)
    assert iv.low <= np.median(pooled) <= iv.high


def test_one_repeat_is_a_block_bootstrap_over_its_iterations():
    rng = np.random.default_rng(4)
    iv = median_interval([0.01 * np.exp(rng.normal(0, 0.05, 60))])
    assert iv.method == "block bootstrap" and iv.level == "iterations"
    assert iv.units == 60 // math.floor(60 ** (1 / 3))  # blocks of floor(n^(1/3)) iterations
    assert median_interval([np.full(5000, 0.01)]).units == timing.MAX_BLOCKS_PER_REPEAT
    assert iv.low < 0.01 < iv.high


def test_interval_is_reproducible_and_contains_the_median():
    rng = np.random.default_rng(5)
    per_repeat = simulate_run(rng, 4, 80, 0.01, 0.05, 0.3)
    a, b = median_interval(per_repeat), median_interval(per_repeat)
    assert a == b
    assert a.low <= float(np.median(np.concatenate(per_repeat))) <= a.high
    assert median_interval(per_repeat, seed=1) != a  # the seed is what makes it reproducible


def test_interval_edges():
    assert median_interval([]) is None
    assert median_interval([[0.01]]) is None  # one iteration: nothing to resample
    same = median_interval([[0.01] * 20, [0.01] * 20])
    assert same.low == same.high == 0.01


@pytest.mark.parametrize("cells", [timing.GRID_CELLS, 64])
def test_resample_medians_match_numpy(monkeypatch, cells):
    """The pooled median of weighted blocks, read off the cell grid, equals numpy's median of the
    same iterations repeated by weight: exactly with one cell per time, within a cell otherwise."""
    monkeypatch.setattr(timing, "GRID_CELLS", cells)
    rng = np.random.default_rng(6)
    per_repeat = [np.round(rng.normal(10, 1, 90), 2) for _ in range(3)]
    blocks = 9
    grid = timing._BlockCells(per_repeat, blocks)
    split = [b for x in per_repeat for b in np.array_split(x, blocks)]
    weights = rng.integers(0, 4, size=(50, len(split)))
    weights[:, 0] += 1  # never an empty resample
    got = grid.medians(weights)
    want = [np.median(np.concatenate([np.repeat(b, w) for b, w in zip(split, row)])) for row in weights]
    if cells >= 270:
        assert got == pytest.approx(want, abs=1e-12)
    else:
        width = np.max(grid.upper - grid.lower)
        assert np.max(np.abs(got - want)) <= width


# ---------------------------------------------------------------- stability


def test_planted_disagreement_is_flagged_with_a_reason():
    rng = np.random.default_rng(8)
    per_repeat = [0.010 * (1 + shift) * np.exp(rng.normal(0, 0.02, 200)) for shift in (0.0, 0.0, 0.15)]
    s = repeat_agreement(per_repeat)
    assert s.unstable
    assert s.kruskal_p < timing.KRUSKAL_ALPHA and s.spread_to_iqr > timing.SPREAD_TO_IQR
    assert s.reason.startswith("repeats disagree") and "Kruskal-Wallis" in s.reason and "\n" not in s.reason


def test_homogeneous_repeats_are_not_flagged():
    rng = np.random.default_rng(9)
    flagged = sum(repeat_agreement(simulate_run(rng, 5, 100, 0.0, 0.05, 0.3)).unstable for _ in range(60))
    assert flagged <= 2
    s = repeat_agreement(simulate_run(rng, 3, 100, 0.0, 0.05, 0.0))
    assert s.reason.startswith("repeats agree")


def test_a_few_iterations_scattering_by_chance_are_not_flagged():
    # 4 iterations per repeat: medians span well over half an IQR by chance; the rank test stops it
    rng = np.random.default_rng(10)
    runs = [simulate_run(rng, 3, 4, 0.0, 0.05, 0.0) for _ in range(60)]
    assert sum(repeat_agreement(r).spread_to_iqr > timing.SPREAD_TO_IQR for r in runs) > 10
    assert sum(repeat_agreement(r).unstable for r in runs) <= 2


def test_a_significant_but_tiny_difference_is_not_flagged():
    # a steady device: IQR of 0.2%, repeats 0.5% apart - real (p tiny), far more than half an IQR,
    # but under the 1% floor
    rng = np.random.default_rng(11)
    per_repeat = [0.010 * (1 + shift) * np.exp(rng.normal(0, 0.0015, 2000)) for shift in (0.0, 0.005)]
    s = repeat_agreement(per_repeat)
    assert s.kruskal_p < 1e-6 and s.spread_to_iqr > 1
    assert not s.unstable


def test_stability_edges():
    one = repeat_agreement([[0.01, 0.02, 0.03]])
    assert not one.unstable and one.kruskal_p is None and "not tested" in one.reason
    identical = repeat_agreement([[0.01] * 10, [0.01] * 10])
    assert not identical.unstable and identical.kruskal_p == 1.0


# ---------------------------------------------------------------- the summary


def test_summary_carries_interval_throughput_and_stability():
    rng = np.random.default_rng(12)
    per_repeat = simulate_run(rng, 3, 40, 0.005, 0.05, 0.3)
    s = summarise(repeats_of(per_repeat), batch_size=64)
    pooled = np.concatenate(per_repeat)
    assert s.median_s == pytest.approx(float(np.median(pooled)))
    ci = s.ci
    assert ci.confidence == 0.95 and ci.method == "two-level bootstrap" and ci.level == "repeats" and ci.units == 3
    low, high = ci.median_s
    assert low <= s.median_s <= high
    assert ci.samples_per_s == pytest.approx((64 / high, 64 / low))
    assert ci.samples_per_s[0] <= s.samples_per_s <= ci.samples_per_s[1]
    assert ci.half_width_pct == pytest.approx(100 * (high - low) / 2 / s.median_s)
    assert s.stability is not None and not s.stability.unstable
    assert s.iqr_s == pytest.approx(stats.iqr(pooled), rel=0.05)
    assert s.cv == pytest.approx(st.stdev(pooled) / st.fmean(pooled))


def test_summary_skips_failed_repeats_and_round_trips():
    good = repeats_of([[0.010, 0.011, 0.012, 0.010], [0.011, 0.012, 0.010, 0.011]])
    failed = Repeat(index=2, status="failed", reason="boom")
    s = summarise([*good, failed], batch_size=8)
    assert s.repeats == 2 and s.ci.units == 2
    assert Summary.model_validate_json(s.model_dump_json()) == s
    assert summarise([failed], batch_size=8) is None


def test_summary_of_an_older_record_reads_without_the_new_fields():
    older = {"repeats": 1, "iterations": 2, "median_s": 0.01, "mean_s": 0.01, "stdev_s": 0.0, "min_s": 0.01,
             "max_s": 0.01, "q1_s": 0.01, "q3_s": 0.01, "iqr_s": 0.0, "cv": 0.0, "repeat_medians_s": [0.01],
             "first_iter_s": None, "ms_per_iter": 10.0, "samples_per_s": 100.0}
    s = Summary.model_validate(older)
    assert s.ci is None and s.stability is None


def test_compile_time_is_the_median_first_iteration_beyond_each_repeats_median():
    from dlbench.analysis.timing import compile_time

    reps = [Repeat(index=0, status="ok", iter_s=[0.010, 0.012, 0.011], first_iter_s=2.011),
            Repeat(index=1, status="ok", iter_s=[0.020, 0.020, 0.020], first_iter_s=3.020),
            Repeat(index=2, status="ok", iter_s=[0.010, 0.010, 0.010], first_iter_s=4.010)]
    assert compile_time(reps) == pytest.approx(3.0)
    assert summarise(reps, batch_size=2).compile_s == pytest.approx(3.0)
    assert compile_time([Repeat(index=0, status="ok", iter_s=[0.01])]) is None  # no first iteration timed
