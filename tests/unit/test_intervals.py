"""The reported interval of a run's median (store/intervals.py): the t interval on the log repeat
medians, widened to the stored two-level bootstrap's where that reaches further; one process is
marked as not a 95% interval of the run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dlbench.analysis.timing import median_interval_record, median_interval
from dlbench.store.intervals import repeat_t_interval, reported_interval
from dlbench.store.record import Summary


def summary(per_repeat: list[np.ndarray], with_ci: bool = True) -> Summary:
    times = np.concatenate(per_repeat)
    median = float(np.median(times))
    ci = median_interval_record(median_interval(per_repeat), median, 8) if with_ci else None
    return Summary(repeats=len(per_repeat), iterations=len(times), median_s=median, mean_s=float(times.mean()),
                   stdev_s=float(times.std()), min_s=float(times.min()), max_s=float(times.max()), q1_s=median,
                   q3_s=median, iqr_s=0.0, cv=0.0, repeat_medians_s=[float(np.median(x)) for x in per_repeat],
                   first_iter_s=None, ms_per_iter=median * 1e3, samples_per_s=8 / median, ci=ci)


def test_the_t_interval_is_students_on_the_log_repeat_medians():
    medians = [0.010, 0.0105, 0.0098]
    logs = np.log(medians)
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert repeat_t_interval(medians) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert repeat_t_interval([0.01]) is None


def test_processes_apart_get_the_t_interval_and_it_holds_the_bootstrap_and_the_median():
    rng = np.random.default_rng(3)
    runs = [0.01 * np.exp(offset + rng.normal(0, 0.02, 100)) for offset in (-0.05, 0.0, 0.06)]
    s = summary(runs)
    got = reported_interval(s, 8)
    t = repeat_t_interval(s.repeat_medians_s)
    assert got.median_s[0] <= min(t[0], s.ci.median_s[0]) and got.median_s[1] >= max(t[1], s.ci.median_s[1])
    assert got.median_s[0] < s.median_s < got.median_s[1]
    assert got.method.startswith("t (2 d.o.f.) on 3 repeat medians") and got.nominal and got.level == "repeats"
    assert got.samples_per_s == pytest.approx((8 / got.median_s[1], 8 / got.median_s[0]))
    # far wider than the bootstrap alone, which 3 processes cannot make honest
    assert got.half_width_pct > 2 * s.ci.half_width_pct


def test_a_record_without_a_stored_interval_gets_the_t_interval_and_one_process_is_marked():
    rng = np.random.default_rng(4)
    runs = [0.01 * np.exp(rng.normal(0, 0.02, 100)) for _ in range(3)]
    old = reported_interval(summary(runs, with_ci=False), 8)  # a record before schema 4
    assert old is not None and old.method == "t (2 d.o.f.) on 3 repeat medians"
    one = reported_interval(summary(runs[:1]), 8)
    assert not one.nominal and one.level == "iterations" and "not a 95% interval" in one.note
