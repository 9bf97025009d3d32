"""Every runner as MLPerf LoadGen's system under test, in its real environment: one smoke-profile
`dlbench run --scenario` of the smallest network (fcn5) per runner. The server scenario exercises the
whole harness (runners/common/loadgen_harness.py): the batch sizes warmed up, the batcher, padding,
the bounded search of Poisson rates over LoadGen tests; torch also runs single_stream. Each record
holds LoadGen's own verdict (VALID, or INVALID with LoadGen's reason) and its logs, which the
store verifies."""

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
