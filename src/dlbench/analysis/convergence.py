"""The score of a convergence task (issue 21), by MLPerf Training's rule: over N seeded runs, drop
the fastest and the slowest and average the rest (an "olympic" mean), where one run that did not
reach the target may be among them (it counts as the slowest, and is dropped); with fewer than 3
runs nothing can be dropped, so every run must reach the target and the score is their mean."""

from __future__ import annotations

from dataclasses import dataclass

OLYMPIC_MIN_RUNS = 3
ALLOWED_MISSES = 1


@dataclass(frozen=True)
class Score:
    seconds: float | None  # None: no score (`reason`)
    rule: str
    scored: tuple[int, ...]  # indices of the runs averaged
    reason: str | None = None


def score(times: list[float | None]) -> Score:
    """`times`: each run's time to target in seconds, None for a run that did not reach it (or did
    not complete)."""
    n = len(times)
    reached = [(t, i) for i, t in enumerate(times) if t is not None]
    misses = n - len(reached)
    if n == 0:
        return Score(None, "no runs", (), "no runs")
    if n < OLYMPIC_MIN_RUNS:
        rule = f"mean of all {n} run{'s' if n > 1 else ''} (fewer than {OLYMPIC_MIN_RUNS}: none dropped, none may miss)"
        if misses:
            return Score(None, rule, (), f"{misses} of {n} runs did not reach the target")
        return Score(sum(t for t, _ in reached) / n, rule, tuple(i for _, i in reached))
    rule = f"olympic mean of {n} runs: fastest and slowest dropped, at most {ALLOWED_MISSES} may miss the target"
    if misses > ALLOWED_MISSES:
        return Score(None, rule, (), f"{misses} of {n} runs did not reach the target (at most {ALLOWED_MISSES} allowed)")
    ordered = sorted(reached)
    kept = ordered[1:] if misses else ordered[1:-1]  # a miss is the slowest: it is the one dropped at the top
    return Score(sum(t for t, _ in kept) / len(kept), rule, tuple(sorted(i for _, i in kept)))


def median_run(info):
    """The run of a store.record.ConvergenceInfo whose curve stands for it: among the scored runs,
    the one with the median time to target (the lower of the two middle ones); with none scored,
    the first run that evaluated; None when no run did."""
    scored = [r for r in info.runs if r.seed in info.scored_seeds and r.time_to_target_s is not None]
    if not scored:
        return next((r for r in info.runs if r.evals), None)
    return sorted(scored, key=lambda r: r.time_to_target_s)[(len(scored) - 1) // 2]
