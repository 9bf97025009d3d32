"""The worker result parser (execution/worker_result.py) against arbitrary input (issue 18): it
returns a result that keeps every promise the controller relies on, or raises ResultError naming
a field; never anything else."""

from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dlbench.execution.worker_result import INT64_MAX, ResultError, WorkerResult, parse_result

FIELDS = set(WorkerResult.model_fields)
LIFETIME = (1_000, 10_000_000)
GOOD = {
    "protocol": 1, "status": "ok", "framework": {"name": "fake", "version": "0.0"},
    "threads": {"requested": 1}, "params": 1234, "output_shape": [10], "settings": {"fake": True},
    "first_iter_s": 0.01, "warmup_iter_s": [0.002, 0.001], "warmup_settled": True,
    "iter_s": [0.001, 0.0011], "window_monotonic_ns": [2_000, 9_000], "memory": {"unavailable": "none"},
}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=20)


def _check(result: WorkerResult, action: str = "benchmark") -> None:
    """What a parsed result promises."""
    for t in [*result.iter_s, *result.warmup_iter_s, *([result.first_iter_s] if result.first_iter_s else [])]:
        assert type(t) is float and math.isfinite(t) and t > 0
    if result.params is not None:
        assert type(result.params) is int and 0 <= result.params <= INT64_MAX
    if result.window_monotonic_ns:
        start, end = result.window_monotonic_ns
        assert LIFETIME[0] <= start < end <= LIFETIME[1]
    if result.status == "ok" and action == "benchmark":
        assert result.iter_s and result.framework is not None
    json.dumps(result.model_dump(exclude_unset=True), allow_nan=False)  # storable as strict JSON
    orjson.dumps(result.model_dump(exclude_unset=True))  # and by the store's checksum (64-bit integers)


def _parse(data, action: str = "benchmark") -> None:
    try:
        result = parse_result(data, action, LIFETIME)
    except ResultError as e:
        assert e.field and e.problem and str(e).startswith("worker result")
        head = e.field.split(".")[0].split("[")[0]
        assert e.field == "result" or head in FIELDS or (isinstance(data, (str, bytes)) and head in str(data))
        return
    _check(result, action)


def test_a_good_result_parses():
    result = parse_result(json.dumps(GOOD), "benchmark", LIFETIME)
    _check(result)
    assert result.model_dump(exclude_unset=True) == GOOD


@SETTINGS
@given(st.binary(max_size=200))
@example(b"\xff\xfe{}")
@example(b"[" * 10_000)
@example(b'{"status": "ok"}\x00')
def test_any_bytes(data):
    _parse(data)


@SETTINGS
@given(json_values, st.sampled_from(["benchmark", "kernels", "check"]))
def test_any_json_value(value, action):
    _parse(json.dumps(value), action)


@SETTINGS
@given(st.sampled_from(sorted(FIELDS | {"surprise"})), json_values)
def test_a_good_result_with_one_field_replaced(field, value):
    _parse(json.dumps({**GOOD, field: value}))


@SETTINGS
@given(st.sets(st.sampled_from(sorted(GOOD))))
def test_a_good_result_with_fields_left_out(missing):
    _parse(json.dumps({k: v for k, v in GOOD.items() if k not in missing}))


@SETTINGS
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5) | st.booleans(), max_size=5),
       st.lists(st.integers(min_value=-1, max_value=2**64), max_size=3))
def test_any_times_and_window(times, window):
    _parse(json.dumps({**GOOD, "iter_s": times, "window_monotonic_ns": window}))


@pytest.mark.parametrize("data, field", [
    (b"\xff", "result"), ("[]", "result"), ('"ok"', "result"), ("{" * 5000, "result"),
    ('{"status": "ok"}', "framework"),
    (json.dumps({**GOOD, "iter_s": []}), "iter_s"),
    (json.dumps({**GOOD, "iter_s": [0.0, 0.1]}), "iter_s[0]"),
    (json.dumps({**GOOD, "iter_s": [0.1, -1.0]}), "iter_s[1]"),
    (json.dumps({**GOOD, "first_iter_s": float("nan")}), "first_iter_s"),
    (json.dumps({**GOOD, "params": True}), "params"),
    (json.dumps({**GOOD, "threads": [1]}), "threads"),
    (json.dumps({**GOOD, "framework": "fake"}), "framework"),
    (json.dumps({**GOOD, "window_monotonic_ns": [9_000, 2_000]}), "window_monotonic_ns"),
    (json.dumps({**GOOD, "window_monotonic_ns": [1, 2]}), "window_monotonic_ns"),
    (json.dumps({**GOOD, "kernels": [{"spec": {}, "status": "ok"}]}), "kernels[0]"),
    (json.dumps({**GOOD, "settings": {"a": [1, float("inf")]}}), "settings.a[1]"),
    (json.dumps({**GOOD, "memory": {"peak": 2**70}}), "memory.peak"),
])
def test_the_error_names_the_field(data, field):
    with pytest.raises(ResultError) as e:
        parse_result(data, "benchmark", LIFETIME)
    assert e.value.field == field


def test_a_kernels_result_needs_no_iterations_but_its_kernels():
    kernels = {"protocol": 1, "status": "ok", "framework": {"name": "fake"},
               "kernels": [{"spec": {"kind": "matmul"}, "status": "ok", "first_s": 0.1, "times_s": [0.01],
                            "median_s": 0.01}]}
    assert parse_result(json.dumps(kernels), "kernels").kernels[0].median_s == 0.01
    with pytest.raises(ResultError, match="kernels"):
        parse_result(json.dumps({**kernels, "kernels": None}), "kernels")


def test_long_reasons_are_cut_not_refused():
    result = parse_result(json.dumps({"status": "failed", "reason": "x" * 100_000}))
    assert result.status == "failed" and len(result.reason) < 5000


def test_a_long_reason_keeps_its_head_and_a_long_traceback_its_tail():
    # (rank files, execution/rank_result.py, use the same two field types)
    from dlbench.execution.worker_result import REASON_CHARS, TRACEBACK_CHARS, WorkerResult

    result = WorkerResult.model_validate({"status": "failed", "reason": "r" * REASON_CHARS + "TAIL",
                                          "traceback": "HEAD" + "t" * TRACEBACK_CHARS})
    assert result.reason.endswith(" [...]") and "TAIL" not in result.reason
    assert result.traceback.startswith("[...] ") and "HEAD" not in result.traceback
    assert len(result.traceback) == TRACEBACK_CHARS + len("[...] ")
