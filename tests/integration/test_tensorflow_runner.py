"""The TensorFlow runner in its real, dlbench-built venv: builds, measures, skips, and equals torch.

The worker runs (eight `inspect`s, eight two-framework `check`s) are started once per module, two at
a time, and the tests read their outcomes; the whole file takes a few minutes on two cores.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
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

STEP_CRITERIA = ("update differ", "weights differ")  # what one optimiser step is judged by


def _summary(name: str):
    return load_network(paths.suites_dir() / "networks" / f"{name}.yaml")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, device: str = "cpu") -> dict:
    return {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
            "batch_size": batch, "precision": "float32", "device": device, "threads": 1,
            "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}


@pytest.fixture(scope="module")
def tensorflow_env():
    runner = RunnerRegistry(paths.runners_dir()).get("tensorflow")
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


@pytest.fixture(scope="module")
def torch_env():
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


@pytest.fixture(scope="module")
def inspected(tensorflow_env):
    runner, env = tensorflow_env

    def inspect(name):
        return run_worker(env.python, runner.worker, _request(_summary(name).resolved, "inspect"), timeout_s=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NETWORKS, pool.map(inspect, NETWORKS)))


@pytest.fixture(scope="module")
def checked(tensorflow_env, torch_env):
    def check(name):
        return check_network(_summary(name), [torch_env, tensorflow_env])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NETWORKS, pool.map(check, NETWORKS)))


def test_environment_is_isolated_and_pinned(tensorflow_env):
    runner, env = tensorflow_env
    assert env.python != Path(sys.executable)
    assert any(p.lower().startswith("tensorflow-cpu==2.21.0") or p.lower().startswith("tensorflow_cpu==2.21.0")
               for p in env.packages), env.packages
    assert any(p.lower().startswith("keras==3.") for p in env.packages)
    assert not any(p.lower().startswith("typer==") for p in env.packages)


@pytest.mark.parametrize("name", NETWORKS)
def test_parameter_count_built_by_tensorflow_equals_description(inspected, name):
    outcome = inspected[name]
    summary = _summary(name)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    assert outcome.result["params"] == summary.params
    assert tuple(outcome.result["output_shape"]) == summary.output_shape
    assert outcome.result["framework"]["version"].startswith("2.21.0")
    assert outcome.result["settings"]["step"] == "tf.function"


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_worker_measures_and_applies_threads(tensorflow_env, mode):
    runner, env = tensorflow_env
    summary = _summary("alexnet_r")
    outcome = run_worker(env.python, runner.worker, _request(summary.resolved, "benchmark", mode, 4), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["intra_op"] == 1 and res["threads"]["inter_op"] == 1
    assert res["settings"]["intra_op_threads"] == 1 and res["settings"]["data_format"] == "channels_last"
    assert res["settings"]["jit_compile"] is False
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)


def test_cuda_request_on_a_cpu_host_is_skipped(tensorflow_env):
    runner, env = tensorflow_env
    outcome = run_worker(env.python, runner.worker, _request(_summary("fcn5").resolved, "inspect", device="cuda"),
                         timeout_s=300)
    assert outcome.status == "skipped"
    assert "CUDA" in outcome.reason


@pytest.mark.parametrize("name", NETWORKS)
def test_check_builds_the_same_network_as_torch(checked, name):
    """Parameters, the weight format both ways, logits and loss: within tolerance for every network."""
    torch_res, tf_res = checked[name]
    assert torch_res.ok and torch_res.status == "reference", torch_res.reason
    assert tf_res.status in ("equivalent", "mismatch"), tf_res.reason
    assert tf_res.params == tf_res.params_described
    assert tf_res.errors["roundtrip"] == 0.0
    assert tf_res.errors["logits"] <= tf_res.tolerance and tf_res.errors["loss"] <= tf_res.tolerance, tf_res.errors
    if tf_res.status == "mismatch":  # the only complaint allowed here is about the step (see above)
        assert all(part.startswith(STEP_CRITERIA) for part in tf_res.reason.split("; ")), tf_res.reason


@pytest.mark.parametrize("name", NETWORKS)
def test_check_is_equivalent_to_torch(checked, name):
    results = checked[name]
    assert all(r.ok for r in results), [(r.framework, r.status, r.reason) for r in results]
    assert results[1].framework == "tensorflow" and results[1].status == "equivalent", results[1].reason
