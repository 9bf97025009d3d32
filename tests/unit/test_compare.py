"""`dlbench compare`: selectors, pairing, the statistics (ratio, CI, Mann-Whitney, Holm, geometric mean)
and the exit codes, on synthetic records with noise like this machine's.

Simulated noise: each worker process gets its own level (lognormal, 5% sd: the process-to-process
spread of repeat medians in the smoke store here was 8.5% at the median, 6-12% IQR, so 5% is on the
quiet side of what this VM does), and each iteration a further 5% around it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from scipy import stats
from store_records import record_from_times
from typer.testing import CliRunner

from dlbench.analysis.comparison import (
    MIN_PROCESSES,
    NothingToCompare,
    SelectorError,
    Side,
    compare,
    compare_sides,
    holm_adjust,
    parse_selector,
)
from dlbench.cli import app
from dlbench.store.record import Record
from dlbench.store.store import Store

ANSI = re.compile(r"\x1b\[[0-9;]*m")
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
PROCESS_CV = ITERATION_CV = 0.05


def process_times(rng, processes: int, iterations: int = 10, scale: float = 1.0, base_s: float = 0.05,
                  process_cv: float = PROCESS_CV) -> list[list[float]]:
    levels = base_s * scale * rng.lognormal(0.0, process_cv, processes)
    return [list(level * rng.lognormal(0.0, ITERATION_CV, iterations)) for level in levels]


def make_run(times: list[list[float]], *, started: datetime = T0, benchmark: str = "fcn5-train",
             framework: str = "torch", version: str = "1.0", machine: str = "hostA", batch_size: int = 16,
             machine_id: str | None = None) -> Record:
    return record_from_times(times, started=started, benchmark=benchmark, framework=framework, version=version,
                             machine=machine, batch_size=batch_size, machine_id=machine_id)


def side(times: list[list[float]], batch_size: int = 16) -> Side:
    return Side(runs=[], processes=[np.asarray(t) / batch_size for t in times])


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


# ---------------------------------------------------------------- selectors


def test_selector_parses_terms_alternatives_and_dates():
    s = parse_selector("framework=torch|jax, version=2.13.0,since=2026-11-01,until=2026-11-02", "--baseline")
    assert s.terms == {"framework": ("torch", "jax"), "version": ("2.13.0",)}
    assert s.since == datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert s.until == datetime(2026, 11, 3, tzinfo=timezone.utc) and s.until_is_date  # the whole of Nov 2


@pytest.mark.parametrize("text, message", [
    ("", "empty selector"),
    ("torch", "'torch' is not key=value"),
    ("fw=torch", "unknown key 'fw'; valid keys: run, framework"),
    ("framework=", "framework= has an empty value"),
    ("framework=torch|", "framework= has an empty value"),
    ("framework=torch,framework=jax", "framework given twice"),
    ("since=yesterday", "since='yesterday' is not an ISO date"),
    ("since=2026-11-02,until=2026-11-01", "since= is not before until="),
    ("since=2026-11-01|2026-11-02", "takes one date"),
    ("batch=sixteen", "batch='sixteen' is not a positive integer"),
    ("device=tpu", "device='tpu'; valid devices: cpu, cuda"),
])
def test_selector_errors_name_the_option_and_the_problem(text, message):
    with pytest.raises(SelectorError) as e:
        parse_selector(text, "--candidate")
    assert str(e.value).startswith("--candidate: ") and message in str(e.value)


def test_selector_matching():
    rng = np.random.default_rng(0)
    r = make_run(process_times(rng, 2), started=datetime(2026, 11, 2, 23, 59, tzinfo=timezone.utc),
                 version="2.13.0", machine="host1", machine_id="m-123")
    assert parse_selector(f"run={r.run_id}").matches(r)
    assert parse_selector(f"run={r.run_id[:15]}").matches(r)  # a prefix of a run id
    assert not parse_selector("run=20250101").matches(r)
    assert parse_selector("framework=jax|torch,version=2.13.0,batch=16,device=cpu").matches(r)
    assert not parse_selector("version=2.13").matches(r)  # versions are exact
    assert parse_selector("machine=host1").matches(r) and parse_selector("machine=m-123").matches(r)
    assert parse_selector("until=2026-11-02").matches(r)  # a bare date includes its whole day
    assert not parse_selector("until=2026-11-02T12:00").matches(r)
    assert not parse_selector("since=2026-11-03").matches(r)
    assert parse_selector("since=2026-11-02T23:59").matches(r)  # inclusive


# ---------------------------------------------------------------- Holm


def test_holm_by_hand():
    # sorted: 0.01*3 = 0.03; 0.03*2 = 0.06; 0.04*1 = 0.04 -> raised to 0.06 (never below the one before)
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjust([0.02]) == pytest.approx([0.02])
    assert len(holm_adjust([])) == 0


def test_holm_is_between_raw_and_bonferroni():
    p = np.random.default_rng(3).uniform(0, 0.2, 12)
    adjusted = holm_adjust(p)
    assert np.all(adjusted >= p) and np.all(adjusted <= np.minimum(p * len(p), 1.0) + 1e-12)
    order = np.argsort(p)
    assert np.all(np.diff(adjusted[order]) >= 0)


# ---------------------------------------------------------------- the statistics on one pair


def test_unit_is_the_process_unless_a_side_has_a_single_one():
    rng = np.random.default_rng(1)
    one = compare_sides({}, side(process_times(rng, 1)), side(process_times(rng, 8)))
    few = compare_sides({}, side(process_times(rng, MIN_PROCESSES - 1)), side(process_times(rng, 8)))
    enough = compare_sides({}, side(process_times(rng, MIN_PROCESSES)), side(process_times(rng, MIN_PROCESSES)))
    assert one.unit == "iteration" and few.unit == "process (t)" and enough.unit == "process"


def test_few_processes_use_welch_on_log_throughput():
    """3 vs 3 processes (the default profile's repeats): a 20% slowdown with 5% process noise is found
    with its size inside the interval in most seeds, and identical distributions are rarely flagged."""
    found = covered = false_alarms = 0
    for seed in range(40):
        rng = np.random.default_rng(300 + seed)
        slow = compare_sides({}, side(process_times(rng, 3)), side(process_times(rng, 3, scale=1.2)))
        same = compare_sides({}, side(process_times(rng, 3)), side(process_times(rng, 3)))
        assert slow.unit == same.unit == "process (t)"
        found += slow.p_value < 0.05
        covered += slow.ci_low < 1 / 1.2 < slow.ci_high
        false_alarms += same.p_value < 0.05
    assert found >= 30 and covered >= 34 and false_alarms <= 5


def test_iteration_level_results_never_fail_the_gate():
    """One process a side: a real 30% difference is significant on iterations, and shown so, but the
    evidence is too correlated to fail a CI job on."""
    rng = np.random.default_rng(2)
    c = compare_sides({}, side(process_times(rng, 1, iterations=40)),
                      side(process_times(rng, 1, iterations=40, scale=1.3)))
    c.p_adjusted, c.significant = c.p_value, c.p_value < 0.05
    assert c.unit == "iteration" and c.significant and c.change_pct < -10
    assert not c.is_regression(10)


def test_identical_distributions_are_rarely_significant():
    """40 seeds, 6 vs 6 processes from one distribution: Mann-Whitney at 0.05 rejects about 5% of the
    time by construction; allow 4 of 40 (P(>= 5 | 5%) = 0.05)."""
    rejected = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        c = compare_sides({}, side(process_times(rng, 6)), side(process_times(rng, 6)), seed=seed)
        assert c.unit == "process"
        rejected += c.p_value < 0.05
    assert rejected <= 4


def test_planted_slowdown_is_found_with_its_size_in_the_interval():
    """Candidate iterations 20% longer (throughput ratio 1/1.2 = 0.833), 6 vs 6 processes. Simulated
    over 200 seeds: p < 0.05 in 99.5%, and the 95% interval holds 0.833 in 94.5% (nominal coverage).
    Here 20 seeds: significant in every one, the interval below 1 in every one and holding the truth
    in at least 17 (P(<= 16 of 20 | 94.5%) = 1.7%)."""
    covered = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        c = compare_sides({}, side(process_times(rng, 6)), side(process_times(rng, 6, scale=1.2)), seed=seed)
        assert c.p_value < 0.05 and c.ci_high < 1
        covered += c.ci_low < 1 / 1.2 < c.ci_high
    assert covered >= 17


def test_ratio_is_the_summaries_throughput_ratio():
    rng = np.random.default_rng(5)
    base, cand = make_run(process_times(rng, 3)), make_run(process_times(rng, 3, scale=0.9), version="2.0")
    (c,) = compare([base, cand], parse_selector("version=1.0"), parse_selector("version=2.0")).comparisons
    assert c.ratio == pytest.approx(cand.summary.samples_per_s / base.summary.samples_per_s, rel=1e-12)


# ---------------------------------------------------------------- pairing


def test_pairing_by_framework_and_geometric_mean():
    """torch vs jax on two benchmarks: jax twice as fast on one, half as fast on the other. The pairs
    are per benchmark (framework left out of the key); the geometric mean is 1, where an arithmetic
    mean of the ratios would say 1.25."""
    rng = np.random.default_rng(7)
    runs = [make_run(process_times(rng, 3), benchmark="fcn5-train", framework="torch"),
            make_run(process_times(rng, 3, scale=0.5), benchmark="fcn5-train", framework="jax"),
            make_run(process_times(rng, 3), benchmark="fcn8-train", framework="torch"),
            make_run(process_times(rng, 3, scale=2.0), benchmark="fcn8-train", framework="jax"),
            make_run(process_times(rng, 3), benchmark="lstm32-train", framework="torch")]
    report = compare(runs, parse_selector("framework=torch"), parse_selector("framework=jax"))
    assert report.varied_fields == ("framework",) and "framework" not in report.key_fields
    assert [c.key["benchmark"] for c in report.comparisons] == ["fcn5-train", "fcn8-train"]
    assert report.comparisons[0].ratio == pytest.approx(2.0, rel=0.1)
    assert report.comparisons[1].ratio == pytest.approx(0.5, rel=0.1)
    assert report.geometric_mean_ratio == pytest.approx(stats.gmean([c.ratio for c in report.comparisons]))
    assert report.geometric_mean_ratio == pytest.approx(1.0, abs=0.1)
    assert [k["benchmark"] for k in report.baseline_only] == ["lstm32-train"] and report.candidate_only == []


def test_versions_pair_within_framework_and_machine():
    rng = np.random.default_rng(8)
    runs = [make_run(process_times(rng, 3), framework=f, version=v, machine=m)
            for f in ("torch", "jax") for v in ("1.0", "2.0") for m in ("hostA", "hostB")]
    report = compare(runs, parse_selector("version=1.0"), parse_selector("version=2.0"))
    assert report.varied_fields == ()
    assert sorted((c.key["framework"], c.key["machine"]) for c in report.comparisons) == [
        ("jax", "hostA"), ("jax", "hostB"), ("torch", "hostA"), ("torch", "hostB")]
    assert all(len(c.baseline.runs) == len(c.candidate.runs) == 1 for c in report.comparisons)


def test_several_runs_on_a_side_are_pooled_as_processes():
    rng = np.random.default_rng(9)
    runs = [make_run(process_times(rng, 3), started=T0 + timedelta(days=d), version="1.0" if d < 2 else "2.0")
            for d in range(4)]
    (c,) = compare(runs, parse_selector("until=2026-11-02"), parse_selector("since=2026-11-03")).comparisons
    assert len(c.baseline.runs) == 2 and len(c.baseline.processes) == 6 and c.unit == "process"


def test_overlapping_and_empty_selections_are_refused():
    rng = np.random.default_rng(10)
    runs = [make_run(process_times(rng, 3), version="1.0"), make_run(process_times(rng, 3), version="2.0")]
    with pytest.raises(SelectorError, match="matches both --baseline and --candidate"):
        compare(runs, parse_selector("framework=torch"), parse_selector("version=2.0"))
    with pytest.raises(NothingToCompare, match="--candidate 'version=3.0' matches no completed run"):
        compare(runs, parse_selector("version=1.0"), parse_selector("version=3.0"))
    runs.append(make_run(process_times(rng, 3), version="3.0", batch_size=32))
    with pytest.raises(NothingToCompare, match="no benchmark was run under both"):
        compare(runs, parse_selector("version=1.0"), parse_selector("version=3.0"))


# ---------------------------------------------------------------- the command and its exit codes


def write_store(path, runs) -> str:
    store = Store(path)
    for r in runs:
        store.write(r)
    return str(path)


def test_cli_identical_runs_exit_0(tmp_path):
    rng = np.random.default_rng(20)
    store = write_store(tmp_path, [make_run(process_times(rng, 6), version=v) for v in ("1.0", "1.1")])
    code, out, err = invoke("compare", "--store", store, "--baseline", "version=1.0", "--candidate", "version=1.1",
                            "--fail-on-regression", "10")
    assert code == 0, err
    assert "fcn5-train" in out and "no change" in out and "process (6/6)" in out


def test_cli_planted_slowdown_exits_3_and_prints_the_table(tmp_path):
    rng = np.random.default_rng(21)
    store = write_store(tmp_path, [make_run(process_times(rng, 6), version="1.0"),
                                   make_run(process_times(rng, 6, scale=1.2), version="1.1")])
    args = ("compare", "--store", store, "--baseline", "version=1.0", "--candidate", "version=1.1")
    code, out, err = invoke(*args, "--fail-on-regression", "10")
    assert code == 3
    assert "slower" in out and "regression fcn5-train: throughput -1" in err
    code, _, _ = invoke(*args)  # without the option a regression is reported, not an error
    assert code == 0
    code, _, _ = invoke(*args, "--fail-on-regression", "20")  # a 16.7% loss is within 20%
    assert code == 0
    code, out, _ = invoke(*args, "--fail-on-regression", "10", "--format", "json")
    data = json.loads(out)
    assert code == 3 and data["regressions"] == [data["comparisons"][0]["key"]]
    assert data["comparisons"][0]["verdict"] == "slower" and data["comparisons"][0]["p_adjusted"] < 0.05


def test_cli_holm_turns_a_borderline_regression_into_no_decision(tmp_path):
    """Five processes each side, fully separated: the exact two-sided Mann-Whitney p is 2/252 = 0.0079.
    Alone, that is significant and a 20% slowdown exits 3. Compared together with six other
    benchmarks, Holm multiplies the smallest p by 7 (0.056 > 0.05): no longer significant, exit 0."""
    base_t = [[0.050 + 0.001 * i] * 4 for i in range(5)]
    cand_t = [[0.060 + 0.001 * i] * 4 for i in range(5)]
    runs = [make_run(base_t, version="1.0"), make_run(cand_t, version="1.1")]
    alone = write_store(tmp_path / "alone", runs)
    args = ("--baseline", "version=1.0", "--candidate", "version=1.1", "--fail-on-regression", "10", "--format", "json")
    code, out, _ = invoke("compare", "--store", alone, *args)
    (c,) = json.loads(out)["comparisons"]
    assert code == 3 and c["p_value"] == pytest.approx(2 / 252) and c["significant"]
    rng = np.random.default_rng(22)
    others = [make_run(process_times(rng, 5), version=v, benchmark=f"net{i}-train")
              for i in range(6) for v in ("1.0", "1.1")]
    family = write_store(tmp_path / "family", runs + others)
    code, out, _ = invoke("compare", "--store", family, *args)
    data = json.loads(out)
    (c,) = [c for c in data["comparisons"] if c["key"]["benchmark"] == "fcn5-train"]
    assert len(data["comparisons"]) == 7
    assert c["p_value"] == pytest.approx(2 / 252) and c["p_adjusted"] == pytest.approx(7 * 2 / 252)
    assert not c["significant"] and c["verdict"] == "no change" and code == 0


def test_cli_input_errors(tmp_path):
    rng = np.random.default_rng(23)
    store = write_store(tmp_path, [make_run(process_times(rng, 2), version=v) for v in ("1.0", "1.1")])
    code, _, err = invoke("compare", "--store", store, "--baseline", "vers=1.0", "--candidate", "version=1.1")
    assert code == 2 and "--baseline: unknown key 'vers'" in err
    code, _, err = invoke("compare", "--store", store, "--baseline", "version=1.0", "--candidate", "framework=torch")
    assert code == 2 and "matches both" in err
    code, _, err = invoke("compare", "--store", store, "--baseline", "version=1.0", "--candidate", "version=9")
    assert code == 1 and "--candidate 'version=9' matches no completed run" in err
    code, _, err = invoke("compare", "--store", store, "--baseline", "version=1.0", "--candidate", "version=1.1",
                          "--format", "xml")
    assert code == 2 and "unknown format 'xml'" in err


def _in_mode(r: Record, compile_mode: str) -> Record:
    return r.model_copy(update={"workload": r.workload.model_copy(update={"compile": compile_mode})})


def test_compile_mode_is_part_of_the_pairing_key_and_can_be_compared():
    """compiled vs eager of one framework pairs per benchmark; version 1.0 vs 2.0 pairs eager with
    eager and compiled with compiled, never across modes."""
    rng = np.random.default_rng(11)
    runs = [_in_mode(make_run(process_times(rng, 3, scale=s), version=v), mode)
            for v in ("1.0", "2.0") for mode, s in (("eager", 1.0), ("compiled", 0.5))]
    by_mode = compare(runs, parse_selector("compile=eager,version=1.0"), parse_selector("compile=compiled,version=1.0"))
    assert "compile" in by_mode.varied_fields and "compile" not in by_mode.key_fields
    (c,) = by_mode.comparisons
    assert c.ratio == pytest.approx(2.0, rel=0.15)  # compiled takes half the time: twice the throughput
    by_version = compare(runs, parse_selector("version=1.0"), parse_selector("version=2.0"))
    assert sorted(c.key["compile"] for c in by_version.comparisons) == ["compiled", "eager"]
    assert all(c.ratio == pytest.approx(1.0, rel=0.15) for c in by_version.comparisons)
