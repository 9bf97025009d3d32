"""Ranks the data supports: on a leaderboard, frameworks whose difference is not significant share a
rank, and the overall score carries its own interval.

Per benchmark (an entry of a board). Every pair of frameworks with a successful run is compared
with `dlbench compare`'s process-level test (comparison.process_test): the unit is the worker
process, each contributing its median throughput; Welch's t on log throughputs with 2-4 processes
on a side (the profiles' repeats), Mann-Whitney U with 5 or more. The p-values of every pair of
every entry on the board are one family, Holm-adjusted (comparison.holm_adjust), and a pair is
separated when its adjusted p is below ALPHA: family-wise, the chance that any two frameworks of
the board are put apart when they are equally fast is at most ALPHA. A run with a single process
has no process-level test (its iterations are correlated, so an iteration-level test would be
optimistic); a pair involving one is separated only when the two runs' reported intervals
(store/intervals.py) do not overlap, and it is outside the Holm family.

From separations to ranks. A framework's rank is a range: from 1 + the number of frameworks
separated from it and faster, to N - the number separated from it and slower (N: the frameworks
that succeeded on the entry). Separation need not be transitive (A apart from C, neither apart
from B), and ranges say exactly what is known: A 1-2, B 1-3, C 2-3. Where k frameworks all have
the same range of k places (none separated from another, all separated from the rest) they are
tied: shown as "1=". A single place is shown as the number.

The overall score. A framework's score is the geometric mean, over the entries it completed, of its
throughput over the entry's fastest (reporting/model.py). Its interval is a parametric bootstrap
of that whole computation: each run's log throughput is drawn from the distribution its reported
interval describes (Student's t with R - 1 d.o.f. for R processes, normal for a single one, scaled
so that the interval is its central CONFIDENCE range), the relatives and scores are recomputed per
draw (so the best framework of each draw is the reference, as for the point estimate), and the
interval is the central CONFIDENCE range of the drawn scores. Scores are ranked by the same rule as
entries, among frameworks that completed the same number of entries (a score over fewer entries
is not comparable, and ranks after): a pair is separated when its Holm-adjusted two-sided p (twice
the share of draws on the smaller side of equal scores) over the board's score pairs is below ALPHA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from scipy import stats

from .comparison import holm_adjust, process_test

ALPHA = 0.05
CONFIDENCE = 0.95
SCORE_DRAWS = 4000  # Monte Carlo error of a p-value near 0.05: about 0.0035
SEED = 20261201  # fixed: the same store always gives the same ranks and intervals


@dataclass(frozen=True)
class Contestant:
    """One framework's run on one entry: higher is better."""

    name: str
    value: float  # samples/s
    processes: tuple[float, ...] = ()  # each process's median samples/s
    low: float | None = None  # its reported interval of samples/s
    high: float | None = None


@dataclass(frozen=True)
class Pair:
    faster: str
    slower: str
    test: str  # "process (t)" | "process" | "intervals (one process)"
    p: float | None  # None: decided by the intervals
    p_adjusted: float | None = None
    separated: bool = False


@dataclass(frozen=True)
class Placing:
    low: int  # best rank the data allows
    high: int  # worst
    label: str  # "2", "1=", "1-3"


@dataclass
class Score:
    value: float | None
    low: float | None = None
    high: float | None = None


@dataclass
class BoardRanks:
    entries: list[dict[str, Placing]]  # per entry: framework -> placing
    pairs: list[list[Pair]]  # per entry
    scores: dict[str, Score] = field(default_factory=dict)
    score_placings: dict[str, Placing] = field(default_factory=dict)
    score_pairs: list[Pair] = field(default_factory=list)
    tests: int = 0  # the size of the entries' Holm family


def placings(order: Sequence[str], separated: set[frozenset[str]]) -> dict[str, Placing]:
    """Rank ranges of `order` (best first) given which pairs the data separates (module docstring)."""
    n = len(order)
    ranges = {}
    for i, name in enumerate(order):
        better = sum(frozenset((name, other)) in separated for other in order[:i])
        worse = sum(frozenset((name, other)) in separated for other in order[i + 1:])
        ranges[name] = (1 + better, n - worse)
    out = {}
    for name, (low, high) in ranges.items():
        if low == high:
            label = str(low)
        elif sum(r == (low, high) for r in ranges.values()) == high - low + 1:
            label = f"{low}="
        else:
            label = f"{low}–{high}"
        out[name] = Placing(low, high, label)
    return out


def _overlap(a: Contestant, b: Contestant) -> bool:
    if None in (a.low, a.high, b.low, b.high):
        return True  # nothing says how uncertain they are: not separated
    return a.low <= b.high and b.low <= a.high


def _pairs(entry: Sequence[Contestant]) -> list[Pair]:
    ordered = sorted(entry, key=lambda c: -c.value)
    out = []
    for fast, slow in combinations(ordered, 2):
        tested = process_test(np.asarray(slow.processes), np.asarray(fast.processes))
        if tested is None:
            out.append(Pair(fast.name, slow.name, "intervals (one process)", None, None, not _overlap(fast, slow)))
        else:
            out.append(Pair(fast.name, slow.name, tested[1], tested[0]))
    return out


def _holm(pairs: list[Pair], alpha: float) -> list[Pair]:
    tested = [i for i, p in enumerate(pairs) if p.p is not None]
    adjusted = holm_adjust([pairs[i].p for i in tested])
    out = list(pairs)
    for i, adj in zip(tested, adjusted):
        out[i] = Pair(pairs[i].faster, pairs[i].slower, pairs[i].test, pairs[i].p, float(adj), bool(adj < alpha))
    return out


def _log_draws(c: Contestant, rng: np.random.Generator, draws: int, confidence: float) -> np.ndarray:
    centre = math.log(c.value)
    if c.low is None or c.high is None or not (c.low > 0 and c.high > c.low):
        return np.full(draws, centre)
    dof = len(c.processes) - 1
    quantile = float(stats.t.ppf(0.5 + confidence / 2, dof)) if dof >= 1 else float(stats.norm.ppf(0.5 + confidence / 2))
    noise = rng.standard_t(dof, draws) if dof >= 1 else rng.standard_normal(draws)
    return centre + noise * (math.log(c.high) - math.log(c.low)) / 2 / quantile


def score_draws(entries: Sequence[Sequence[Contestant]], confidence: float = CONFIDENCE, draws: int = SCORE_DRAWS,
                seed: int = SEED) -> dict[str, np.ndarray]:
    """Drawn log scores per framework (the mean over its completed entries of its drawn log
    throughput less the entry's drawn best)."""
    rng = np.random.default_rng(seed)
    relative: dict[str, list[np.ndarray]] = {}
    for entry in entries:
        if not entry:
            continue
        drawn = {c.name: _log_draws(c, rng, draws, confidence) for c in entry}
        best = np.max(np.stack(list(drawn.values())), axis=0)
        for name, d in drawn.items():
            relative.setdefault(name, []).append(d - best)
    return {name: np.mean(np.stack(rs), axis=0) for name, rs in relative.items()}


def rank_board(entries: Sequence[Sequence[Contestant]], scores: dict[str, tuple[float | None, int]] | None = None,
               alpha: float = ALPHA, confidence: float = CONFIDENCE) -> BoardRanks:
    """Placings per entry (Holm over every pair of the board), and, given `scores` (framework ->
    (point score, entries completed)), the scores' intervals and placings."""
    per_entry = [_pairs(e) for e in entries]
    flat = _holm([p for ps in per_entry for p in ps], alpha)
    pairs, at = [], 0
    for ps in per_entry:
        pairs.append(flat[at:at + len(ps)])
        at += len(ps)
    placed = []
    for entry, ps in zip(entries, pairs):
        order = [c.name for c in sorted(entry, key=lambda c: (-c.value, c.name))]
        placed.append(placings(order, {frozenset((p.faster, p.slower)) for p in ps if p.separated}))
    result = BoardRanks(placed, pairs, tests=sum(p.p is not None for p in flat))
    if scores:
        _rank_scores(result, entries, scores, alpha, confidence)
    return result


def _rank_scores(result: BoardRanks, entries, scores: dict[str, tuple[float | None, int]], alpha: float,
                 confidence: float) -> None:
    drawn = score_draws(entries, confidence)
    tail = (1 - confidence) / 2
    for name, (value, _) in scores.items():
        if value is None or name not in drawn:
            result.scores[name] = Score(value)
            continue
        low, high = np.exp(np.quantile(drawn[name], [tail, 1 - tail]))
        result.scores[name] = Score(value, min(float(low), value), max(float(high), value))
    ranked = [n for n in scores if scores[n][0] is not None and n in drawn]
    # completing more entries comes first, then the score (as model._scores orders them)
    ranked.sort(key=lambda n: (-scores[n][1], -scores[n][0], n))
    pairs = []
    for a, b in combinations(ranked, 2):
        if scores[a][1] != scores[b][1]:
            continue
        d = drawn[a] - drawn[b]
        p = min(1.0, 2 * max(min(float(np.mean(d <= 0)), float(np.mean(d >= 0))), 1 / len(d)))
        pairs.append(Pair(a, b, "score draws", p))
    pairs = _holm(pairs, alpha)
    result.score_pairs = pairs
    separated = {frozenset((p.faster, p.slower)) for p in pairs if p.separated}
    # frameworks of different completion counts are always apart (a score over fewer entries ranks after)
    for a, b in combinations(ranked, 2):
        if scores[a][1] != scores[b][1]:
            separated.add(frozenset((a, b)))
    result.score_placings = placings(ranked, separated)
