"""Every runner as MLPerf LoadGen's system under test, in its real environment: one smoke-profile
`dlbench run --scenario` of the smallest network (fcn5) per runner. The server scenario exercises the
whole harness (runners/common/loadgen_harness.py): the batch sizes warmed up, the batcher, padding,
the bounded search of Poisson rates over LoadGen tests; torch also runs single_stream. Each record
holds LoadGen's own verdict (VALID, or INVALID with LoadGen's reason) and its logs, which the
store verifies. Each runner also serves transformer_tiny's generation under the server scenario
with LoadGen's token latencies (time to first token, time per output token)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dlbench import paths
from dlbench.cli import app
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store
from dlbench.store.verify import verify

pytestmark = pytest.mark.integration

SCENARIOS = {"torch": "single_stream,server", "tensorflow": "server", "jax": "server", "mxnet": "server"}


@pytest.mark.parametrize("framework", sorted(RunnerRegistry(paths.runners_dir()).names()))
def test_the_runner_serves_loadgen(tmp_path, framework):
    store = tmp_path / "store"
    scenarios = SCENARIOS.get(framework, "server")
    result = CliRunner().invoke(app, ["run", "--suite", "fcn", "--benchmark", "fcn5-infer", "--framework", framework,
                                      "--device", "cpu", "--profile", "smoke", "--scenario", scenarios, "--no-check",
                                      "--threads", "1", "--store", str(store)], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    records = {r.workload.scenario: r for r in Store(store).records()}
    assert set(records) == set(scenarios.split(","))
    for scenario, r in records.items():
        assert r.status == "ok", r.reason
        info = r.loadgen
        assert info.scenario == scenario and info.loadgen_version.startswith("6.0.17")
        assert info.result.validity == "VALID" or info.result.invalid_reasons  # INVALID says LoadGen's why
        assert info.result.latency_ns["99.00"] > 0 and info.result.query_count > 0
        assert set(info.warmup_latency_s) == {str(b) for b in info.batching["batch_sizes"]}
        assert r.framework["name"] == framework and r.params == r.network.params_described
    server = records["server"].loadgen
    assert server.batching["batch_sizes"] == [1, 2, 4, 8] and len(server.search) == 3
    assert server.result.samples_per_s > 0
    assert verify(Store(store)).problems == []


@pytest.mark.parametrize("framework", sorted(RunnerRegistry(paths.runners_dir()).names()))
def test_the_runner_serves_generation_under_loadgen(tmp_path, framework):
    """transformer_tiny's generation (smoke: prompt 8, 8 new tokens) under LoadGen's server with its
    token latencies: each query one request, served one at a time through the runner's Generator."""
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["run", "--suite", "transformer", "--benchmark", "transformer_tiny",
                                      "--mode", "generate", "--framework", framework, "--device", "cpu",
                                      "--profile", "smoke", "--scenario", "server", "--no-check", "--threads", "1",
                                      "--store", str(store)], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout + result.stderr
    (r,) = Store(store).records()
    assert r.status == "ok", r.reason
    info = r.loadgen
    assert r.workload.mode == "generate" and r.workload.batch_size == 1 and info.scenario == "server"
    assert info.generation["new_tokens"] == 8 and len(info.search) == 3
    assert info.result.validity == "VALID" or info.result.invalid_reasons
    for test in info.search:
        assert 0 < test.ttft_ns["50.00"] <= test.ttft_ns["99.00"] and 0 < test.tpot_ns["99.00"]
        assert test.meets_bound == (test.ttft_ns["99.00"] <= 100e6 and test.tpot_ns["99.00"] <= 25e6)
    assert r.framework["name"] == framework and r.settings.runner["generation"]["new_tokens"] == 8
    assert verify(Store(store)).problems == []
