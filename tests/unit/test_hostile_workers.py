"""Workers that misbehave (issue 18, class 1 and the process faults): every misbehaviour of the
faulty fixture runner (tests/fixtures/runners/faulty/worker.py) becomes a record with the right
status and a reason naming what was wrong, and the plan goes on to the next run.

One plan runs them all: batch size b of the benchmark does the b-th fault of $DLBENCH_FAULTS, so
every run is followed by another that must run, the last of them by one that behaves.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import time
from pathlib import Path

import psutil
import pytest

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution import launcher
from dlbench.execution.orchestrator import Orchestrator, RunOptions, plan
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store
from dlbench.telemetry import TelemetryConfig

ROOT = Path(__file__).resolve().parents[2]
FAULTY = ROOT / "tests" / "fixtures" / "runners" / "faulty"

def _fault_names() -> list[str]:
    """The keys of the fixture's FAULTS table (read, not imported: the worker puts the runners'
    folder first on sys.path)."""
    tree = ast.parse((FAULTY / "worker.py").read_text())
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "FAULTS" for t in node.targets))
    return [key.value for key in table.keys]


FAULTS = _fault_names()

RESULT = "worker result"
# fault -> (status, pattern the reason must match)
EXPECTED = {
    "not_utf8": ("failed", rf"^{RESULT}: not UTF-8 text \(byte 0xff at offset 0\)$"),
    "json_list": ("failed", rf"^{RESULT}: not a JSON object but a JSON array$"),
    "json_string": ("failed", rf"^{RESULT}: not a JSON object but 'ok'$"),
    "json_number": ("failed", rf"^{RESULT}: not a JSON object but 42$"),
    "json_null": ("failed", rf"^{RESULT}: not a JSON object but null$"),
    "deep_nesting": ("failed", rf"^{RESULT}: not valid JSON \(recursion limit exceeded"),
    "truncated_json": ("failed", rf"^{RESULT}: not valid JSON \(EOF while parsing"),
    "empty_result": ("failed", rf"^{RESULT}: not valid JSON \(EOF while parsing a value"),
    "bare_ok": ("failed", rf"^{RESULT} field 'framework': an ok result names its framework$"),
    "unknown_status": ("failed", rf"^{RESULT} field 'status': .* not 'great'$"),
    "missing_status": ("failed", rf"^{RESULT} field 'status': Field required$"),
    "iter_s_string": ("failed", rf"^{RESULT} field 'iter_s': Input should be a valid array, not 'fast'$"),
    "iter_s_text_numbers": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be a valid number, not '"),
    "iter_s_nested": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be a valid number, not a JSON array"),
    "empty_iter_s": ("failed", rf"^{RESULT} field 'iter_s': an ok result has no measured iterations$"),
    "no_iter_s": ("failed", rf"^{RESULT} field 'iter_s': an ok result has no measured iterations$"),
    "first_iter_s_list": ("failed", rf"^{RESULT} field 'first_iter_s': Input should be a valid number, not a JSON array$"),
    "first_iter_s_negative": ("failed", rf"^{RESULT} field 'first_iter_s': Input should be greater than 0, not -0.5$"),
    "warmup_nan": ("failed", rf"^{RESULT} field 'warmup_iter_s\[0\]': Input should be a finite number, not nan$"),
    "params_text": ("failed", rf"^{RESULT} field 'params': Input should be a valid integer, not 'many'$"),
    "params_bool": ("failed", rf"^{RESULT} field 'params': Input should be a valid integer, not True$"),
    "params_float": ("failed", rf"^{RESULT} field 'params': Input should be a valid integer, not 1e\+30$"),
    "params_huge": ("failed", rf"^{RESULT} field 'params': Input should be less than or equal to 9223372036854775807"),
    "params_negative": ("failed", rf"^{RESULT} field 'params': Input should be greater than or equal to 0, not -5$"),
    "threads_number": ("failed", rf"^{RESULT} field 'threads': Input should be an object, not 4$"),
    "framework_string": ("failed", rf"^{RESULT} field 'framework': Input should be an object, not 'faulty'$"),
    "framework_version_number": ("failed", rf"^{RESULT} field 'framework.version': Input should be a valid string, not 2$"),
    "settings_list": ("failed", rf"^{RESULT} field 'settings': Input should be an object, not a JSON array$"),
    "settings_infinity": ("failed", rf"^{RESULT} field 'settings.scale': holds inf, which JSON cannot store$"),
    "memory_huge_integer": ("failed", rf"^{RESULT} field 'memory.peak_allocated_bytes': holds an integer outside int64$"),
    "zero_times": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be greater than 0, not 0.0 \(and 4 more"),
    "nan_times": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be a finite number, not nan"),
    "negative_times": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be greater than 0, not -1.0"),
    "infinite_times": ("failed", rf"^{RESULT} field 'iter_s\[0\]': Input should be a finite number, not inf"),
    "window_reversed": ("failed", rf"^{RESULT} field 'window_monotonic_ns': the end \d+ is not after the start \d+$"),
    "window_one_mark": ("failed", rf"^{RESULT} field 'window_monotonic_ns': needs two marks \[start, end\], not 1$"),
    "window_three_marks": ("failed", rf"^{RESULT} field 'window_monotonic_ns': needs two marks \[start, end\], not 3$"),
    "window_text": ("failed", rf"^{RESULT} field 'window_monotonic_ns\[0\]': Input should be a valid integer, not '\d+'"),
    "window_outside_lifetime": ("failed", rf"^{RESULT} field 'window_monotonic_ns': \[1, 2\] lies outside the "
                                          r"worker's lifetime"),
    "no_window": ("failed", rf"^{RESULT} field 'window_monotonic_ns': an ok result has no measured window$"),
    "extra_field": ("failed", rf"^{RESULT} field 'surprise': Extra inputs are not permitted$"),
    "huge_result": ("failed", rf"^{RESULT}: \d+ bytes, more than the 1 MiB a result may have$"),
    "result_symlink": ("failed", rf"^{RESULT}: cannot be opened \("),
    "result_fifo": ("failed", rf"^{RESULT}: is not a regular file$"),
    "result_directory": ("failed", rf"^{RESULT}: is not a regular file$"),
    "raise": ("failed", r"^RuntimeError: faulty runner: an exception while building the network$"),
    "exit_3": ("failed", r"^worker exited with status 3 without a result: faulty worker: exiting with status 3$"),
    "exit_0_without_result": ("failed", r"^worker exited with status 0 without a result$"),
    "segfault": ("failed", r"^worker killed by signal SIGSEGV$"),
    "abort": ("failed", r"^worker killed by signal SIGABRT$"),
    "sigterm_self": ("failed", r"^worker killed by signal SIGTERM$"),
    "sigkill_self": ("failed", r"^worker killed by SIGKILL \(most often the kernel's out-of-memory killer\)$"),
    "sigint_self": ("failed", r"^worker killed by signal SIGINT$"),
    "hang": ("timeout", r"^worker exceeded its timeout of 1.5 s and was killed$"),
    "result_then_hang": ("timeout", r"^worker exceeded its timeout of 1.5 s and was killed$"),
    "hang_with_child": ("timeout", r"^worker exceeded its timeout of 1.5 s and was killed$"),
    "stubborn_with_child": ("timeout", r"^worker exceeded its timeout of 1.5 s and was killed$"),
    "stdout_flood": ("ok", None),
    "stderr_flood_then_crash": ("failed", r"^worker exited with status 1 without a result: faulty worker: crashing after"),
    "endless_output": ("failed", r"^worker wrote more than 16 MiB of output \(stdout and stderr\) and was stopped$"),
    "child_left_behind": ("ok", None),
    "escaped_child": ("ok", None),
}
HANGS = {name for name, (status, _) in EXPECTED.items() if status == "timeout"}


def test_every_fault_is_expected():
    assert set(EXPECTED) == set(FAULTS)
    assert len(FAULTS) >= 25


@pytest.fixture(scope="module")
def faulty():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("faulty")


@pytest.fixture(scope="module")
def fcn5_train():
    suite = SuiteCatalog(ROOT / "suites").load_suite(ROOT / "suites" / "fcn.yaml", "smoke", "cpu", ("train",))
    return next(b for b in suite.benchmarks if b.network.name == "fcn5")


def _faults(monkeypatch, tmp_path, names) -> Path:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("DLBENCH_FAULTS", ",".join(names))
    monkeypatch.setenv("DLBENCH_FAULT_PIDFILE", str(pidfile))
    monkeypatch.setenv("DLBENCH_FAULT_HUGE_BYTES", str(2 * 2**20))
    monkeypatch.setattr(launcher, "RESULT_LIMIT_BYTES", 2**20)
    monkeypatch.setattr(launcher, "OUTPUT_LIMIT_BYTES", 16 * 2**20)
    return pidfile


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_every_misbehaviour_is_recorded_and_the_next_run_goes_on(tmp_path, monkeypatch, faulty, fcn5_train):
    names = list(EXPECTED)
    pidfile = _faults(monkeypatch, tmp_path, names)
    bench = dataclasses.replace(fcn5_train, batch_sizes=tuple(range(1, len(names) + 2)))  # + one that behaves
    store = Store(tmp_path / "store")
    options = RunOptions(device="cpu", env_backend="current", threads=1, repeats=1, timeout_s=60,
                         cache=tmp_path / "cache")
    orch = Orchestrator(store, options)
    records = []
    for run in plan([faulty], [bench]):
        hangs = run.batch_size <= len(names) and names[run.batch_size - 1] in HANGS
        # the hangs wait out a short timeout; the rest get a long one (a loaded machine is no failure)
        orch.options = dataclasses.replace(options, timeout_s=1.5 if hangs else 60)
        records.append(orch.execute_one(run))

    assert len(records) == len(names) + 1
    wrong = []
    for name, record in zip(names, records):
        status, pattern = EXPECTED[name]
        if record.status != status or (pattern and not re.search(pattern, record.reason or "")):
            wrong.append(f"{name}: {record.status}: {record.reason}")
        if status != "ok":
            assert record.summary is None and record.telemetry is not None
    assert not wrong, "\n".join(wrong)
    last = records[-1]
    assert last.status == "ok" and last.summary is not None and last.summary.median_s > 0
    # every run was stored (the index and statistics read them back)
    assert len(list(store.runs.glob("*.json"))) == len(records)
    # what the faults started is gone: the children left behind, escaped or hanging, and the stubborn ones
    started = [int(line) for line in pidfile.read_text().split()]
    assert len(started) == 6  # hang_with_child, stubborn_with_child: 2 each; the others 1
    assert [pid for pid in started if not _gone(pid)] == []


def test_a_flood_keeps_only_the_tail(tmp_path, monkeypatch, faulty, fcn5_train):
    _faults(monkeypatch, tmp_path, ["stderr_flood_then_crash"])
    bench = dataclasses.replace(fcn5_train, batch_sizes=(1,))
    record = Orchestrator(Store(tmp_path / "store"), RunOptions(
        device="cpu", env_backend="current", threads=1, repeats=1, timeout_s=60, cache=tmp_path / "cache"),
    ).execute(plan([faulty], [bench]))[0]
    assert record.status == "failed"
    assert len(record.output_tail) <= launcher.STDERR_TAIL_CHARS
    assert record.output_tail.rstrip().endswith("faulty worker: crashing after its flood")


def test_with_telemetry_a_bad_result_never_reaches_the_window_figures(tmp_path, monkeypatch, faulty, fcn5_train):
    """derive() refused reversed windows and the summary NaN times with a traceback: now the
    result is refused first, and the run after it gets its figures."""
    names = ["window_reversed", "nan_times"]
    _faults(monkeypatch, tmp_path, names)
    bench = dataclasses.replace(fcn5_train, batch_sizes=(1, 2, 3))
    records = Orchestrator(Store(tmp_path / "store"), RunOptions(
        device="cpu", env_backend="current", threads=1, repeats=1, timeout_s=60, cache=tmp_path / "cache",
        telemetry=TelemetryConfig(interval_s=0.02, gpu_indices=()))).execute(plan([faulty], [bench]))
    assert [r.status for r in records] == ["failed", "failed", "ok"]
    assert "window_monotonic_ns" in records[0].reason and "iter_s[0]" in records[1].reason
    assert records[0].repeats[0].derived is None and records[1].repeats[0].derived is None
    assert records[2].repeats[0].derived is not None and records[2].repeats[0].derived["window_s"] > 0
