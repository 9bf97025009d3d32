"""The Apache MXNet runner in its real, dlbench-built venv (about three minutes on two cores)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dlbench import paths
from dlbench.definitions.loader import load_network
from dlbench.execution.environments import VenvBackend
from dlbench.execution.equivalence import check_network
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry

pytestmark = pytest.mark.integration

NETWORKS = ["fcn5", "fcn8", "alexnet_r", "resnet56", "alexnet", "resnet50", "lstm32", "lstm64"]
SMOKE_POLICY = {"warmup": {"min_iters": 1, "max_iters": 3, "max_time_s": 5, "window": 1, "tolerance": 0.5},
                "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}

@pytest.fixture(scope="module")
def registry():
    return RunnerRegistry(paths.runners_dir())


@pytest.fixture(scope="module")
def mxnet_env(registry):
    runner = registry.get("mxnet")
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


def _summary(name: str):
    return load_network(paths.suites_dir() / "networks" / f"{name}.yaml")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, threads: int | None = 1) -> dict:
    return {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
            "batch_size": batch, "precision": "float32", "device": "cpu", "threads": threads,
            "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}


def test_environment_is_isolated_and_pinned(mxnet_env):
    runner, env = mxnet_env
    assert env.python != Path(sys.executable)
    packages = [p.lower() for p in env.packages]
    assert "mxnet==1.9.1" in packages
    assert "numpy==1.23.5" in packages  # numpy >= 1.24 removed np.bool, which mxnet 1.9.1 uses
    assert not any(p.startswith("typer==") for p in packages)


@pytest.mark.parametrize("name", NETWORKS)
def test_parameter_count_built_by_mxnet_equals_description(mxnet_env, name):
    runner, env = mxnet_env
    summary = _summary(name)
    outcome = run_worker(env.python, runner.worker, _request(summary.resolved, "inspect"), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert res["params"] == summary.params
    assert tuple(res["output_shape"]) == summary.output_shape
    assert res["framework"]["version"] == "1.9.1"
    assert res["settings"]["hybridize"] == {"static_alloc": True, "static_shape": True}
    # the worker's output carries no import-time warnings of mxnet
    assert "Warning" not in outcome.output_tail


@pytest.mark.parametrize("mode, threads", [("train", 1), ("infer", 1), ("infer", 2)])
def test_worker_measures_and_applies_threads(mxnet_env, mode, threads):
    runner, env = mxnet_env
    summary = _summary("alexnet_r")
    outcome = run_worker(env.python, runner.worker,
                         _request(summary.resolved, "benchmark", mode, 4, threads), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["requested"] == threads
    assert res["threads"]["intra_op"] == threads  # OpenMP threads per operator, read back from libgomp
    assert res["threads"]["inter_op"] == 1  # one engine worker for the CPU
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)


def test_cuda_request_on_a_cpu_host_is_skipped(mxnet_env):
    runner, env = mxnet_env
    req = _request(_summary("fcn5").resolved, "inspect")
    req["device"] = "cuda"
    outcome = run_worker(env.python, runner.worker, req, timeout_s=300)
    assert outcome.status == "skipped"
    assert "CUDA" in outcome.reason


@pytest.fixture(scope="module")
def check_runners(registry, mxnet_env):
    torch = registry.get("torch")
    return [(torch, VenvBackend(paths.cache_dir()).ensure(torch, "cpu")), mxnet_env]


@pytest.mark.parametrize("name", NETWORKS)
def test_check_against_torch(check_runners, name):
    summary = _summary(name)
    reference, mx = check_network(summary, check_runners)
    assert reference.status == "reference", reference.reason
    assert mx.framework == "mxnet" and mx.framework_version == "1.9.1"
    assert mx.params == summary.params
    assert mx.errors["roundtrip"] == 0.0
    assert mx.errors["logits"] <= mx.tolerance, mx.reason
    assert mx.errors["loss"] <= mx.tolerance, mx.reason
    assert mx.status == "equivalent", mx.reason
    assert all(r.ok for r in (reference, mx))
