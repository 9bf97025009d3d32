"""Orchestrator.execute with the fake runner in the current interpreter: one record per run, whatever happens."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from dlbench.execution.orchestrator import Orchestrator, RunOptions, build_request, plan
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fast(fast_fake_runner):
    pass


class Recorder:
    def __init__(self):
        self.events = []

    def environment(self, framework, line):
        self.events.append(("environment", framework))

    def run_started(self, run, repeats):
        self.events.append(("started", run.benchmark.name, run.batch_size, repeats))

    def repeat_done(self, run, repeat):
        self.events.append(("repeat", run.benchmark.name, repeat.index, repeat.status))

    def run_done(self, run, record):
        self.events.append(("done", run.benchmark.name, record.status))


def orchestrate(tmp_path, timeout_s=60.0, repeats=None, threads=1):
    store = Store(tmp_path / "store")
    options = RunOptions(device="cpu", env_backend="current", threads=threads, repeats=repeats,
                         timeout_s=timeout_s, cache=tmp_path / "cache")
    events = Recorder()
    return store, Orchestrator(store, options, events), events


def test_suite_fixture_shape(suite):
    # what the tests below rely on: fcn smoke = 2 networks x 2 modes, one batch size each, 3 repeats
    assert [b.name for b in suite.benchmarks] == ["fcn5-train", "fcn5-infer", "fcn8-train", "fcn8-infer"]
    assert all(b.batch_sizes == (16,) and b.policy.repeats == 3 for b in suite.benchmarks)


def test_ok_runs(tmp_path, suite, fake):
    store, orch, events = orchestrate(tmp_path)
    runs = plan([fake], list(suite.benchmarks))
    records = orch.execute(runs)
    assert len(records) == len(runs) == 4
    on_disk = {r.run_id: r for r in store.records()}
    assert set(on_disk) == {r.run_id for r in records}
    assert sorted((r.benchmark, r.workload.batch_size) for r in on_disk.values()) == \
        sorted((b.name, bs) for b in suite.benchmarks for bs in b.batch_sizes)
    windows = []
    for run, rec in zip(runs, records):
        b = run.benchmark
        assert rec.status == "ok" and rec.reason is None and rec.output_tail == ""
        assert rec.suite == "fcn" and rec.workload.mode == b.mode and rec.workload.device == "cpu"
        assert rec.framework["name"] == "fake" and rec.framework["version"] == "0.0"
        assert rec.environment["backend"] == "current" and rec.environment["python"] == sys.executable
        assert rec.settings.repeats == 3 and rec.settings.profile == "smoke"
        assert rec.settings.threads_effective == {"requested": 1, "effective": 1}
        assert rec.settings.runner["fake"] is True
        assert (rec.settings.runner["precision"], rec.settings.runner["compile"]) == ("fp32", "eager")
        assert (rec.workload.precision, rec.workload.compile, rec.workload.compile_requested) == ("fp32", "eager", "default")
        assert [r.index for r in rec.repeats] == [0, 1, 2]
        for rep in rec.repeats:
            assert rep.status == "ok"
            assert rep.first_iter_s is not None and rep.first_iter_s > 0  # each repeat pays its own first step
            assert len(rep.iter_s) >= b.policy.measure.min_iters
            assert len(rep.window_monotonic_ns) == 2 and rep.window_monotonic_ns[0] < rep.window_monotonic_ns[1]
            windows.append(tuple(rep.window_monotonic_ns))
        # network description vs what the runner built
        assert rec.network.params_described == b.network.params
        assert rec.params == b.network.params
        assert rec.network.hash == b.network.definition_hash
        assert rec.network.flops_per_sample == b.network.flops_per_sample
        s = rec.summary
        assert s is not None and s.repeats == 3
        assert s.iterations == sum(len(r.iter_s) for r in rec.repeats)
        assert s.samples_per_s == pytest.approx(16 / s.median_s)
    # 12 repeats in 12 separate, sequential worker processes: measured windows never overlap
    assert len(set(windows)) == 12
    ordered = sorted(windows)
    assert all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))
    assert [e for e in events.events if e[0] == "done"] == [("done", b.name, "ok") for b in suite.benchmarks]
    assert sum(e[0] == "repeat" for e in events.events) == 12


def test_repeats_option_overrides_profile(tmp_path, suite, fake):
    store, orch, _ = orchestrate(tmp_path, repeats=2)
    rec = orch.execute_one(plan([fake], [suite.benchmarks[1]])[0])
    assert rec.status == "ok" and len(rec.repeats) == 2 and rec.summary.repeats == 2
    assert rec.settings.repeats == 2


def test_threads_reach_the_worker_environment(tmp_path, suite, fake, monkeypatch):
    from dlbench.execution import orchestrator as orch_mod

    seen = []
    real = orch_mod.run_worker

    def spy(python, worker, request, timeout_s, extra_env=None, monitor=None, **launch):
        seen.append(extra_env)
        return real(python, worker, request, timeout_s, extra_env, monitor, **launch)

    monkeypatch.setattr(orch_mod, "run_worker", spy)
    _, orch, _ = orchestrate(tmp_path, repeats=1, threads=3)
    orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert seen == [{"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}]


def test_failures_are_recorded_and_the_plan_goes_on(tmp_path, suite, fake, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "raise")
    store, orch, events = orchestrate(tmp_path)
    runs = plan([fake], list(suite.benchmarks))
    records = orch.execute(runs)
    assert len(records) == 4
    assert len(list(store.records())) == 4
    for rec in records:
        assert rec.status == "failed"
        assert rec.reason == "RuntimeError: fake failure while building the network"
        assert len(rec.repeats) == 1 and rec.repeats[0].status == "failed"  # a failure is not repeated
        assert rec.summary is None
        assert rec.framework["name"] == "fake"
    assert [e[1] for e in events.events if e[0] == "started"] == [b.name for b in suite.benchmarks]


def test_worker_crash_is_recorded_with_output_tail(tmp_path, suite, fake, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "exit")
    store, orch, _ = orchestrate(tmp_path)
    rec = orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert rec.status == "failed" and "status 3" in rec.reason
    assert "fake worker is exiting abruptly" in rec.output_tail
    assert rec.framework == {"name": "fake"}  # no result: the runner's name at least
    assert [r.run_id for r in store.records()] == [rec.run_id]


def test_hang_is_timeout_after_a_single_repeat(tmp_path, suite, fake, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "hang")
    store, orch, events = orchestrate(tmp_path, timeout_s=2)
    rec = orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert rec.status == "timeout"
    assert "timeout of 2 s" in rec.reason
    assert len(rec.repeats) == 1 and rec.repeats[0].status == "timeout"
    assert 2.0 <= rec.repeats[0].wall_s < 5.0
    assert rec.summary is None and rec.settings.timeout_s == 2
    assert len(list(store.records())) == 1
    assert sum(e[0] == "repeat" for e in events.events) == 1


def test_skip_is_skipped(tmp_path, suite, fake, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "skip")
    store, orch, _ = orchestrate(tmp_path)
    records = orch.execute(plan([fake], list(suite.benchmarks[:2])))
    for rec in records:
        assert rec.status == "skipped" and rec.reason == "fake runner skips on request"
        assert len(rec.repeats) == 1 and rec.summary is None
    assert len(list(store.records())) == 2


def test_environment_that_cannot_be_used_is_recorded_as_failed(tmp_path, suite, fake):
    from dataclasses import replace

    broken = replace(fake, import_name="surely_not_an_importable_module_xyz")
    store, orch, _ = orchestrate(tmp_path)
    records = orch.execute(plan([broken], list(suite.benchmarks[:2])))
    for rec in records:
        assert rec.status == "failed" and "not importable" in rec.reason
        assert rec.repeats == [] and rec.environment["backend"] == "current"
    assert len(list(store.records())) == 2


def test_build_request(suite, fake):
    b = suite.benchmarks[2]
    opts = RunOptions(device="cpu", env_backend="current", threads=4, repeats=None, timeout_s=10,
                      cache=Path("/nonexistent"), seed=7)
    req = build_request(plan([fake], [b])[0], opts)
    assert req["protocol"] == 1 and req["action"] == "benchmark"
    assert req["network"] == b.network.resolved and req["network"]["params"] == b.network.params
    assert req["batch_size"] == 16 and req["threads"] == 4 and req["seed"] == 7 and req["device"] == "cpu"
    assert req["policy"]["warmup"] == b.policy.warmup.model_dump()
    assert req["policy"]["measure"] == b.policy.measure.model_dump()
    assert (req["learning_rate"], req["momentum"]) == (0.05, 0.9)
    assert os.environ.get("DLBENCH_FAKE_BEHAVIOUR") is None
    assert "inputs" not in req  # each worker draws its own synthetic batch
    given = build_request(plan([fake], [b])[0], dataclasses.replace(opts, inputs=Path("/data/batch.npz")))
    assert given["inputs"] == "/data/batch.npz"  # unless told which batch (benchmarks/fairness.py)


def test_worker_that_cannot_be_started_is_recorded_and_the_plan_goes_on(tmp_path, suite, fake):
    """An environment whose interpreter is gone (e.g. a cached venv whose base Python was removed)."""
    from dlbench.execution.environments import Environment

    class GoneInterpreter:
        def ensure(self, runner, flavour, on_output=None):
            return Environment(runner.name, "venv", flavour, tmp_path / "gone" / "bin" / "python", "k", tmp_path / "gone")

    store, orch, _ = orchestrate(tmp_path)
    orch.environments.backend = GoneInterpreter()
    records = orch.execute(plan([fake], list(suite.benchmarks[:2])))
    assert len(records) == 2 and len(list(store.records())) == 2
    for rec in records:
        assert rec.status == "failed" and "could not start" in rec.reason and "gone" in rec.reason
        assert len(rec.repeats) == 1 and rec.summary is None


def test_a_run_the_runner_does_not_list_is_skipped_without_a_worker(tmp_path, suite, fake):
    """runner.toml [capabilities]: a precision (or compile mode, mode, scenario) the runner does not
    list is recorded as skipped, naming what it runs, before any environment or worker is started;
    the plan goes on."""
    from dlbench.axes import Compile, Mode, Precision, Scenario
    from dlbench.execution.registry import Capabilities

    fp32_only = dataclasses.replace(fake, capabilities=Capabilities.of({
        Precision: frozenset({Precision.FP32}), Compile: frozenset({Compile.EAGER}),
        Mode: frozenset({Mode.TRAIN, Mode.INFER}), Scenario: frozenset()}))
    store, orch, events = orchestrate(tmp_path)
    train = next(b for b in suite.benchmarks if b.name == "fcn5-train")
    benchmarks = [dataclasses.replace(train, precision="amp_bf16"), dataclasses.replace(train, compile="compiled"), train]
    records = orch.execute(plan([fp32_only], benchmarks))
    assert [r.status for r in records] == ["skipped", "skipped", "ok"]
    assert records[0].reason == ("fake runner: precision amp_bf16 is not one it runs "
                                 "(runner.toml [capabilities]: fp32)")
    assert records[1].reason.startswith("fake runner: compile compiled is not one it runs")
    assert records[0].repeats == [] and records[0].repeat_policy.stopped == "not_started"
    assert {r.run_id for r in store.records()} == {r.run_id for r in records}
    assert ("environment", "fake") not in events.events[:2]  # nothing built for the refused runs
