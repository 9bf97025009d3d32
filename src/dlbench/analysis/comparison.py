"""`dlbench compare`: two selections of runs from the store, paired per benchmark and tested.

Selectors
    A selector is `key=value` terms joined by commas (AND); a value may list alternatives with `|`
    (OR), e.g. `framework=torch,version=2.13.0`, `machine=host1|host2`, `since=2026-11-01`,
    `run=20261130T101500Z-1a2b3c4d5e6f`. `run=` also takes a unique prefix of a run id. `since=` and
    `until=` take an ISO date or date-time (UTC when no zone is given) and are inclusive: a bare date
    in `until=` means the end of that day.

Pairing
    A run is identified by its workload and where it ran: suite, benchmark (which includes the mode),
    batch size, device, framework, machine (hostname) and the value of each axis that pairs runs
    (dlbench.axes.PAIRING_AXES: precision, compile mode, LoadGen scenario). Those fields are the
    pairing key,
    except the ones the two selectors set to different values: `--baseline framework=torch
    --candidate framework=jax` pairs torch with jax per benchmark, `machine=a` vs `machine=b` pairs
    machines. Framework version, date and run id are never part of the key: they are what a
    comparison usually varies. Several runs of one key on one side are pooled.

Statistics
    Everything is computed on seconds per sample (iteration time / batch size), so throughput is
    1 / median, exactly `samples_per_s` of a single run's summary. The ratio is candidate throughput
    / baseline throughput (> 1: the candidate is faster).

    Iterations inside one worker process are correlated (same memory layout, same thread placement,
    same neighbours on a shared machine), so the honest unit of independent evidence is the process.
    - At least MIN_PROCESSES processes on both sides: the Mann-Whitney U test compares the process
      medians and the bootstrap resamples whole processes (a cluster bootstrap). Rank-based, because
      process medians still carry the long tail of a disturbed process.
    - 2 to MIN_PROCESSES-1 on a side (the profiles' 2-3 repeats): a rank test cannot be significant
      (3 vs 3: the smallest two-sided p is 0.1) and a bootstrap over 2-3 clusters has a handful of
      distinct resamples, so Welch's t-test on the logarithms of the process throughputs gives the
      p-value and its interval of the difference of mean logs, exponentiated, the ratio's interval.
      Log throughputs of whole processes are close to normal; the test is labelled "process (t)".
    - Fewer than 2 on a side: only the pooled iterations are left. That treats correlated iterations
      as independent (p and interval optimistic), so the result is labelled "iteration", shown for
      information, and never counts as a regression for --fail-on-regression: measured on this
      machine, two back-to-back runs of one smoke benchmark under load differed by 23% "significantly"
      at the iteration level.

    The confidence interval is scipy's percentile bootstrap (BCa's jackknife is unstable for a
    median over a handful of processes), with a fixed seed so the same store gives the same output.
    p-values are Holm-Bonferroni adjusted over all comparisons of one invocation (family-wise error
    at alpha; statsmodels is not a dependency, so `holm_adjust` is the few lines of the procedure).
    The geometric mean of the ratios (scipy.stats.gmean) summarises them: ratios multiply, so their
    mean must be geometric.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Iterable

import numpy as np
from scipy import stats

from ..axes import PAIRING_AXES
from ..store.record import Record

MIN_PROCESSES = 5
BOOTSTRAP_RESAMPLES = 4999
BOOTSTRAP_BATCH = 500  # resamples evaluated at once: bounds the memory of the cluster bootstrap

# The pairing key: the workload and where it ran, then the axes a run may lack (RequestAxis.optional:
# a LoadGen scenario, schema 9, None for the harness's own timing), which runs pair on too.
KEY_FIELDS = ("suite", "benchmark", "batch_size", "device",
              *(a.field for a in PAIRING_AXES if not a.optional), "framework", "machine",
              *(a.field for a in PAIRING_AXES if a.optional))
# Identity of a run: selector key -> attribute of the pairing key (an axis: its field, both).
IDENTITY_KEYS = {("batch" if f == "batch_size" else f): f for f in KEY_FIELDS}
SELECTOR_KEYS = ("run", "framework", "version", "machine", "since", "until",
                 "benchmark", "suite", "device", "batch", *(a.field for a in PAIRING_AXES))

class SelectorError(ValueError):
    """A selector that cannot be parsed, or two that overlap; the message says which (bad input)."""


class NothingToCompare(LookupError):
    """Valid selectors, but the store holds nothing to compare: a side matches no completed run, or no
    benchmark was run under both."""


def record_identity(r: Record) -> dict:
    return {"suite": r.suite, "benchmark": r.benchmark, "batch_size": r.workload.batch_size,
            "device": r.workload.device, "framework": r.framework.get("name"), "machine": r.machine.get("hostname"),
            **{a.field: getattr(r.workload, a.field) for a in PAIRING_AXES}}


def _parse_instant(option: str, key: str, value: str) -> datetime:
    """since= starts at the given instant (a date: its midnight); until= ends at it (a date: the next midnight)."""
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            moment = datetime.combine(day + timedelta(days=1) if key == "until" else day, time(), timezone.utc)
        else:
            moment = datetime.fromisoformat(value)
    except ValueError:
        raise SelectorError(f"{option}: {key}={value!r} is not an ISO date (2026-11-30) or date-time "
                            "(2026-11-30T14:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Selector:
    text: str
    terms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # key -> accepted alternatives
    since: datetime | None = None
    until: datetime | None = None  # exclusive for a bare date (next midnight), inclusive for a date-time
    until_is_date: bool = False

    def matches(self, r: Record) -> bool:
        ident = record_identity(r)
        for key, values in self.terms.items():
            if key == "run":
                if not any(r.run_id.startswith(v) for v in values):
                    return False
            elif key == "version":
                if str(r.framework.get("version")) not in values:
                    return False
            elif key == "machine":  # a hostname, or the machine id of the hardware fingerprint
                if not {str(r.machine.get("hostname")), str(r.machine.get("machine_id"))} & set(values):
                    return False
            elif str(ident[IDENTITY_KEYS[key]]) not in values:
                return False
        started = r.started_at if r.started_at.tzinfo else r.started_at.replace(tzinfo=timezone.utc)
        if self.since is not None and started < self.since:
            return False
        if self.until is not None and (started >= self.until if self.until_is_date else started > self.until):
            return False
        return True

    def identity_values(self, key_field: str) -> frozenset[str] | None:
        """The values this selector allows for one pairing-key field, None where it does not restrict it."""
        for key, attr in IDENTITY_KEYS.items():
            if attr == key_field and key in self.terms:
                return frozenset(self.terms[key])
        return None


def parse_selector(text: str, option: str = "selector") -> Selector:
    """`key=value[|value...][,key=value...]` -> Selector; SelectorError names the option, term and reason."""
    if not text or not text.strip():
        raise SelectorError(f"{option}: empty selector; give terms like framework=torch,version=2.13.0 "
                            f"(keys: {', '.join(SELECTOR_KEYS)})")
    terms: dict[str, tuple[str, ...]] = {}
    since = until = None
    until_is_date = False
    for raw in text.split(","):
        term = raw.strip()
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise SelectorError(f"{option}: {term!r} is not key=value (keys: {', '.join(SELECTOR_KEYS)})")
        if key not in SELECTOR_KEYS:
            raise SelectorError(f"{option}: unknown key {key!r}; valid keys: {', '.join(SELECTOR_KEYS)}")
        if key in terms or (key == "since" and since) or (key == "until" and until):
            raise SelectorError(f"{option}: {key} given twice; terms are joined by AND, so list alternatives "
                                f"with '|' ({key}=a|b)")
        alternatives = tuple(v.strip() for v in value.split("|"))
        if not value or any(not v for v in alternatives):
            raise SelectorError(f"{option}: {key}= has an empty value")
        if key in ("since", "until"):
            if len(alternatives) > 1:
                raise SelectorError(f"{option}: {key}= takes one date, not alternatives")
            moment = _parse_instant(option, key, value)
            if key == "since":
                since = moment
            else:
                until, until_is_date = moment, len(value) == 10
            continue
        if key == "batch":
            bad = [v for v in alternatives if not v.isdigit() or int(v) < 1]
            if bad:
                raise SelectorError(f"{option}: batch={bad[0]!r} is not a positive integer")
            alternatives = tuple(str(int(v)) for v in alternatives)
        if key == "device":
            bad = [v for v in alternatives if v not in ("cpu", "cuda")]
            if bad:
                raise SelectorError(f"{option}: device={bad[0]!r}; valid devices: cpu, cuda")
        terms[key] = alternatives
    if since and until and since >= until:
        raise SelectorError(f"{option}: since= is not before until=; the selector matches nothing")
    return Selector(text=text.strip(), terms=terms, since=since, until=until, until_is_date=until_is_date)


def holm_adjust(pvalues: Iterable[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values, in the input order.

    The i-th smallest of m p-values is multiplied by (m - i + 1); adjusted values are made
    non-decreasing in that order (each is at least the one before) and capped at 1. Rejecting where
    the adjusted value is below alpha is Holm's step-down procedure: family-wise error <= alpha.
    """
    p = np.asarray(list(pvalues), dtype=float)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


# ---------------------------------------------------------------- one side of one comparison


@dataclass
class Side:
    """The runs of one pairing key matched by one selector, as seconds per sample per process."""

    runs: list[Record]
    processes: list[np.ndarray]  # per ok repeat: its measured iterations, seconds per sample

    @classmethod
    def of(cls, runs: list[Record]) -> "Side":
        processes = [np.asarray(rep.iter_s, dtype=float) / r.workload.batch_size
                     for r in runs for rep in r.repeats if rep.status == "ok" and rep.iter_s]
        return cls(sorted(runs, key=lambda r: r.started_at), processes)

    @property
    def iterations(self) -> np.ndarray:
        return np.concatenate(self.processes)

    @property
    def samples_per_s(self) -> float:
        return float(1.0 / np.median(self.iterations))

    def process_throughputs(self) -> np.ndarray:
        return np.array([1.0 / np.median(p) for p in self.processes])

    def values(self, key_field: str) -> list[str]:
        """The distinct values of one pairing-key field (or "version") among this side's runs."""
        if key_field == "version":
            return sorted({str(r.framework.get("version")) for r in self.runs})
        return sorted({str(record_identity(r)[key_field]) for r in self.runs})

    def label(self, key_field: str) -> str:
        return "|".join(self.values(key_field))

    def describe(self) -> dict:
        return {
            "runs": [r.run_id for r in self.runs],
            "frameworks": self.values("framework"),
            "versions": self.values("version"),
            "machines": self.values("machine"),
            "processes": len(self.processes),
            "iterations": int(sum(len(p) for p in self.processes)),
            "samples_per_s": self.samples_per_s,
        }


def _padded(processes: list[np.ndarray]) -> np.ndarray:
    width = max(len(p) for p in processes)
    out = np.full((len(processes), width), np.nan)
    for i, p in enumerate(processes):
        out[i, : len(p)] = p
    return out


def _ratio_ci(base: Side, cand: Side, unit: str, confidence: float, seed: int) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of candidate/baseline throughput (scipy.stats.bootstrap)."""
    if unit == "process":
        # cluster bootstrap: resample process indices; the statistic pools the chosen processes' iterations
        b_mat, c_mat = _padded(base.processes), _padded(cand.processes)

        def statistic(bi, ci, axis=-1):
            b = b_mat[bi.astype(int)].reshape(*bi.shape[:-1], -1)
            c = c_mat[ci.astype(int)].reshape(*ci.shape[:-1], -1)
            return np.nanmedian(b, axis=-1) / np.nanmedian(c, axis=-1)

        data = (np.arange(len(base.processes)), np.arange(len(cand.processes)))
    else:
        def statistic(b, c, axis=-1):
            return np.median(b, axis=axis) / np.median(c, axis=axis)

        data = (base.iterations, cand.iterations)
    if min(len(d) for d in data) < 2:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples (all equal) give NaN bounds, handled below
        res = stats.bootstrap(data, statistic, n_resamples=BOOTSTRAP_RESAMPLES, batch=BOOTSTRAP_BATCH,
                              vectorized=True, confidence_level=confidence, method="percentile",
                              rng=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return (None, None) if not (np.isfinite(lo) and np.isfinite(hi)) else (float(lo), float(hi))


@dataclass
class Comparison:
    key: dict
    baseline: Side
    candidate: Side
    ratio: float  # candidate throughput / baseline throughput
    ci_low: float | None
    ci_high: float | None
    unit: str  # "process" | "process (t)" | "iteration": what the test treats as independent
    p_value: float
    p_adjusted: float = float("nan")
    significant: bool = False

    @property
    def change_pct(self) -> float:
        """Throughput change of the candidate in percent (negative: slower)."""
        return (self.ratio - 1.0) * 100.0

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "no change"
        return "faster" if self.ratio > 1 else "slower"

    def is_regression(self, threshold_pct: float) -> bool:
        """Significant after correction, on process-level evidence, and a throughput loss larger than
        threshold_pct percent (iteration-level results are too optimistic to fail a job on)."""
        return self.significant and self.unit != "iteration" and -self.change_pct > threshold_pct

    def to_dict(self) -> dict:
        return {
            "key": self.key, "baseline": self.baseline.describe(), "candidate": self.candidate.describe(),
            "ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high, "change_pct": self.change_pct,
            "unit": self.unit, "p_value": self.p_value, "p_adjusted": self.p_adjusted,
            "significant": self.significant, "verdict": self.verdict,
        }


def _welch_log(base: Side, cand: Side, confidence: float) -> tuple[float, float | None, float | None]:
    """Welch's t-test on log process throughputs: (p, ratio CI low, high)."""
    return welch_log(base.process_throughputs(), cand.process_throughputs(), confidence)


def welch_log(base: np.ndarray, cand: np.ndarray, confidence: float = 0.95) -> tuple[float, float | None, float | None]:
    """Welch's t-test on the logs of two sets of process throughputs: (p, ratio CI low, high)."""
    b, c = np.log(np.asarray(base, dtype=float)), np.log(np.asarray(cand, dtype=float))
    if np.ptp(np.concatenate([b, c])) == 0:
        return 1.0, 1.0, 1.0
    if np.var(b) == 0 and np.var(c) == 0:  # no spread at all yet different: Welch is undefined
        return 0.0, float(np.exp(c.mean() - b.mean())), float(np.exp(c.mean() - b.mean()))
    res = stats.ttest_ind(c, b, equal_var=False)
    ci = res.confidence_interval(confidence_level=confidence)
    return float(res.pvalue), float(np.exp(ci.low)), float(np.exp(ci.high))


def mann_whitney(base: np.ndarray, cand: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value; 1 when every value is equal (scipy would warn and answer NaN)."""
    if np.ptp(np.concatenate([base, cand])) == 0:
        return 1.0
    return float(stats.mannwhitneyu(cand, base, alternative="two-sided").pvalue)


def process_test(base: np.ndarray, cand: np.ndarray) -> tuple[float, str] | None:
    """The p-value of `dlbench compare`'s process-level test of two sets of process throughputs and
    its unit ("process": Mann-Whitney U, "process (t)": Welch's t on logs); None with fewer than 2
    processes on a side, where only iterations could be tested (see the module docstring)."""
    fewest = min(len(base), len(cand))
    if fewest < 2:
        return None
    if fewest < MIN_PROCESSES:
        return welch_log(base, cand)[0], "process (t)"
    return mann_whitney(np.asarray(base, dtype=float), np.asarray(cand, dtype=float)), "process"


def compare_sides(key: dict, base: Side, cand: Side, confidence: float = 0.95, seed: int = 0) -> Comparison:
    fewest = min(len(base.processes), len(cand.processes))
    if 2 <= fewest < MIN_PROCESSES:
        p, lo, hi = _welch_log(base, cand, confidence)
        return Comparison(key=key, baseline=base, candidate=cand, ratio=cand.samples_per_s / base.samples_per_s,
                          ci_low=lo, ci_high=hi, unit="process (t)", p_value=p)
    unit = "process" if fewest >= MIN_PROCESSES else "iteration"
    if unit == "process":
        b_units, c_units = base.process_throughputs(), cand.process_throughputs()
    else:
        b_units, c_units = 1.0 / base.iterations, 1.0 / cand.iterations
    p = mann_whitney(b_units, c_units)
    lo, hi = _ratio_ci(base, cand, unit, confidence, seed)
    return Comparison(key=key, baseline=base, candidate=cand, ratio=cand.samples_per_s / base.samples_per_s,
                      ci_low=lo, ci_high=hi, unit=unit, p_value=p)


# ---------------------------------------------------------------- the whole comparison


@dataclass
class ComparisonReport:
    baseline: Selector
    candidate: Selector
    key_fields: tuple[str, ...]
    varied_fields: tuple[str, ...]
    alpha: float
    confidence: float
    comparisons: list[Comparison]
    baseline_only: list[dict]
    candidate_only: list[dict]

    @property
    def geometric_mean_ratio(self) -> float | None:
        return float(stats.gmean([c.ratio for c in self.comparisons])) if self.comparisons else None

    def regressions(self, threshold_pct: float) -> list[Comparison]:
        return [c for c in self.comparisons if c.is_regression(threshold_pct)]

    def to_dict(self, threshold_pct: float | None = None) -> dict:
        out = {
            "baseline": self.baseline.text, "candidate": self.candidate.text,
            "key_fields": list(self.key_fields), "varied_fields": list(self.varied_fields),
            "alpha": self.alpha, "confidence": self.confidence,
            "test": "Mann-Whitney U, two-sided, Holm-Bonferroni adjusted",
            "geometric_mean_ratio": self.geometric_mean_ratio,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "baseline_only": self.baseline_only, "candidate_only": self.candidate_only,
        }
        if threshold_pct is not None:
            out["fail_on_regression_pct"] = threshold_pct
            out["regressions"] = [c.key for c in self.regressions(threshold_pct)]
        return out


def varied_fields(baseline: Selector, candidate: Selector) -> tuple[str, ...]:
    """Pairing-key fields that both selectors set, to different values: those are compared, not matched."""
    varied = []
    for f in KEY_FIELDS:
        b, c = baseline.identity_values(f), candidate.identity_values(f)
        if b is not None and c is not None and b != c:
            varied.append(f)
    return tuple(varied)


def usable(r: Record) -> bool:
    return r.status == "ok" and r.summary is not None and any(rep.status == "ok" and rep.iter_s for rep in r.repeats)


def compare(records: Iterable[Record], baseline: Selector, candidate: Selector, *, alpha: float = 0.05,
            confidence: float = 0.95, seed: int = 0) -> ComparisonReport:
    """Pair the runs the two selectors match per key and compare each pair. SelectorError when a run
    matches both selectors; NothingToCompare when a side matches no completed run or no key is on both."""
    records = [r for r in records if usable(r)]
    base = [r for r in records if baseline.matches(r)]
    cand = [r for r in records if candidate.matches(r)]
    for option, sel, found in (("--baseline", baseline, base), ("--candidate", candidate, cand)):
        if not found:
            raise NothingToCompare(f"{option} {sel.text!r} matches no completed run")
    both = sorted({r.run_id for r in base} & {r.run_id for r in cand})
    if both:
        raise SelectorError(f"run {both[0]} matches both --baseline and --candidate"
                            f"{f' (and {len(both) - 1} more)' if len(both) > 1 else ''}; make the selectors disjoint")
    varied = varied_fields(baseline, candidate)
    key_fields = tuple(f for f in KEY_FIELDS if f not in varied)

    def grouped(runs: list[Record]) -> dict[tuple, list[Record]]:
        groups: dict[tuple, list[Record]] = {}
        for r in runs:
            ident = record_identity(r)
            groups.setdefault(tuple(ident[f] for f in key_fields), []).append(r)
        return groups

    b_groups, c_groups = grouped(base), grouped(cand)
    comparisons = []
    for k in sorted(set(b_groups) & set(c_groups), key=lambda k: tuple(map(str, k))):
        comparisons.append(compare_sides(dict(zip(key_fields, k)), Side.of(b_groups[k]), Side.of(c_groups[k]),
                                         confidence, seed))
    if not comparisons:
        raise NothingToCompare(f"no benchmark was run under both selectors (paired on {', '.join(key_fields)}); "
                               f"baseline has {len(b_groups)} benchmark keys, candidate {len(c_groups)}")
    adjusted = holm_adjust([c.p_value for c in comparisons])
    for c, p in zip(comparisons, adjusted):
        c.p_adjusted = float(p)
        c.significant = bool(p < alpha)

    def unpaired(mine: dict, other: dict) -> list[dict]:
        return [dict(zip(key_fields, k)) for k in sorted(set(mine) - set(other), key=lambda k: tuple(map(str, k)))]

    return ComparisonReport(baseline, candidate, key_fields, varied, alpha, confidence, comparisons,
                            unpaired(b_groups, c_groups), unpaired(c_groups, b_groups))


# ---------------------------------------------------------------- LoadGen scenario runs


@dataclass
class LoadGenComparison:
    """One pairing key of LoadGen scenario runs: each side's figure of the scenario (LoadGen's, one per
    run; several runs of a side are pooled by their median) and the candidate's speed relative to the
    baseline: baseline / candidate for a latency, candidate / baseline for a rate, so > 1 is faster
    either way. LoadGen gives one figure per test and no spread, so there is no test and no interval."""

    key: dict
    metric: str
    lower_is_better: bool
    baseline: list[float]
    candidate: list[float]
    baseline_validity: list[str]
    candidate_validity: list[str]
    baseline_versions: list[str]
    candidate_versions: list[str]

    @property
    def speedup(self) -> float | None:
        if not self.baseline or not self.candidate:
            return None
        b, c = float(np.median(self.baseline)), float(np.median(self.candidate))
        if b <= 0 or c <= 0:
            return None
        return b / c if self.lower_is_better else c / b

    def to_dict(self) -> dict:
        return {"key": self.key, "metric": self.metric, "lower_is_better": self.lower_is_better,
                "baseline": self.baseline, "candidate": self.candidate, "speedup": self.speedup,
                "baseline_validity": self.baseline_validity, "candidate_validity": self.candidate_validity,
                "baseline_versions": self.baseline_versions, "candidate_versions": self.candidate_versions}


def loadgen_usable(r: Record) -> bool:
    return r.status == "ok" and r.loadgen is not None


def compare_loadgen(records: Iterable[Record], baseline: Selector, candidate: Selector) -> list[LoadGenComparison]:
    """The LoadGen scenario runs the selectors match, paired as `compare` pairs runs (scenario
    included); a run whose scenario found no figure (a server search that met the bound nowhere)
    counts on its side's validity only."""
    records = [r for r in records if loadgen_usable(r)]
    varied = varied_fields(baseline, candidate)
    key_fields = tuple(f for f in KEY_FIELDS if f not in varied)
    groups: dict[tuple, tuple[list[Record], list[Record]]] = {}
    for r in records:
        ident = record_identity(r)
        k = tuple(ident[f] for f in key_fields)
        if baseline.matches(r) and not candidate.matches(r):
            groups.setdefault(k, ([], []))[0].append(r)
        elif candidate.matches(r) and not baseline.matches(r):
            groups.setdefault(k, ([], []))[1].append(r)
    out = []
    for k in sorted(groups, key=lambda k: tuple(map(str, k))):
        base, cand = groups[k]
        scenario = base[0].loadgen.scenario if base else None
        if not base or not cand or {r.loadgen.scenario for r in base + cand} != {scenario}:
            continue  # one side only, or different scenarios (their figures measure different things)
        out.append(LoadGenComparison(
            dict(zip(key_fields, k)), base[0].loadgen.metric, scenario in ("single_stream", "multi_stream"),
            [r.loadgen.metric_value for r in base if r.loadgen.metric_value is not None],
            [r.loadgen.metric_value for r in cand if r.loadgen.metric_value is not None],
            [r.loadgen.result.validity for r in base], [r.loadgen.result.validity for r in cand],
            sorted({str(r.framework.get("version")) for r in base}),
            sorted({str(r.framework.get("version")) for r in cand})))
    return out


def loadgen_table(comparisons: list[LoadGenComparison], baseline: Selector, candidate: Selector):
    """The rich table of LoadGen comparisons (`dlbench compare`)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"LoadGen scenarios: candidate [{candidate.text}] vs baseline [{baseline.text}]"))
    for col in ("benchmark", "framework", "scenario", "figure", "versions (base → cand)", "base", "cand",
                "LoadGen (base → cand)", "speed-up"):
        t.add_column(col, justify="right" if col in ("base", "cand", "speed-up") else "left")
    for c in comparisons:
        def fig(values):
            return f"{float(np.median(values)):.4g}" if values else "none"

        t.add_row(escape(str(c.key.get("benchmark", ""))), escape(str(c.key.get("framework", ""))),
                  escape(str(c.key.get("scenario", ""))), escape(c.metric),
                  escape(f"{', '.join(c.baseline_versions)} → {', '.join(c.candidate_versions)}"),
                  fig(c.baseline), fig(c.candidate),
                  f"{'/'.join(c.baseline_validity)} → {'/'.join(c.candidate_validity)}",
                  "" if c.speedup is None else f"{c.speedup:.3f}")
    t.caption = ("speed-up: baseline/candidate latency, candidate/baseline rate (> 1: the candidate is faster); "
                 "one LoadGen figure per run, the median where a side has several: no test, no interval")
    return t


# ---------------------------------------------------------------- the terminal table


def comparison_table(report: ComparisonReport):
    """The rich table `dlbench compare` prints (rich is imported here: the analysis does not need it)."""
    from rich.markup import escape
    from rich.table import Table

    shown_key = [f for f in ("benchmark", "framework", "batch_size", "device", "machine") if f in report.key_fields]
    t = Table(title=escape(f"candidate [{report.candidate.text}] vs baseline [{report.baseline.text}]"))
    header = {"batch_size": "batch"}
    for col in [*(header.get(f, f) for f in shown_key), *(f"{header.get(f, f)} (base → cand)" for f in report.varied_fields),
                "versions (base → cand)", "runs", "base samples/s", "cand samples/s", "ratio",
                f"{report.confidence:.0%} CI", "unit (n)", "p", "p Holm", "verdict"]:
        t.add_column(escape(col), no_wrap=col == "benchmark",
                     justify="right" if col in ("batch", "base samples/s", "cand samples/s", "ratio", "p", "p Holm")
                     else "left")
    for c in report.comparisons:
        b, d = c.baseline.describe(), c.candidate.describe()
        varied = [f"{c.baseline.label(f)} → {c.candidate.label(f)}" for f in report.varied_fields]
        ci = "" if c.ci_low is None else f"{c.ci_low:.3f}–{c.ci_high:.3f}"
        n = (f"{b['iterations']}/{d['iterations']}" if c.unit == "iteration" else f"{b['processes']}/{d['processes']}")
        style = {"faster": "green", "slower": "red"}.get(c.verdict, "")
        verdict = f"[{style}]{c.verdict}[/]" if style else c.verdict
        t.add_row(*(escape(str(c.key[f])) for f in shown_key), *(escape(v) for v in varied),
                  escape(f"{c.baseline.label('version')} → {c.candidate.label('version')}"),
                  f"{len(b['runs'])}/{len(d['runs'])}", f"{b['samples_per_s']:.4g}", f"{d['samples_per_s']:.4g}",
                  f"{c.ratio:.3f}", ci, f"{c.unit}{'*' if c.unit == 'iteration' else ''} ({n})",
                  f"{c.p_value:.2g}", f"{c.p_adjusted:.2g}", verdict)
    notes = []
    gm = report.geometric_mean_ratio
    if gm is not None:
        notes.append(f"geometric mean of the {len(report.comparisons)} ratios (candidate/baseline throughput): "
                     f"{gm:.3f} ({(gm - 1) * 100:+.1f}%)")
    notes.append(f"two-sided tests: Mann-Whitney U on process medians (process), Welch's t on log process "
                 f"throughputs with 2-{MIN_PROCESSES - 1} processes a side (process (t)); p Holm-adjusted over "
                 f"{len(report.comparisons)} comparisons; significant where p Holm < {report.alpha:g}")
    if any(c.unit == "iteration" for c in report.comparisons):
        notes.append("* one process on a side: tested on iterations, which are correlated within a process, so p "
                     "and CI are optimistic; shown for information, never a regression for --fail-on-regression")
    t.caption = escape("\n".join(notes))
    return t
