"""Summary statistics of a run's iteration times (the standard library's, not hand-rolled)."""

from __future__ import annotations

import statistics as st

from .store.record import Repeat, Summary


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
    return Summary(
        repeats=len(good), iterations=len(times), median_s=median, mean_s=mean, stdev_s=stdev,
        min_s=min(times), max_s=max(times), q1_s=q1, q3_s=q3, iqr_s=q3 - q1, cv=stdev / mean if mean else 0.0,
        repeat_medians_s=[st.median(r.iter_s) for r in good],
        first_iter_s=st.median(firsts) if firsts else None,
        ms_per_iter=median * 1e3, samples_per_s=batch_size / median,
    )
