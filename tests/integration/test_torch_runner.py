"""The PyTorch runner in its real, dlbench-built venv (the `smoke` profile; minutes, not hours)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import load_network
from dlbench.execution.environments import VenvBackend
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry

pytestmark = pytest.mark.integration

NETWORKS = ["fcn5", "fcn8", "alexnet_r", "resnet56", "alexnet", "resnet50", "lstm32", "lstm64"]
SMOKE_POLICY = {"warmup": {"min_iters": 1, "max_iters": 3, "max_time_s": 5, "window": 1, "tolerance": 0.5},
                "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}


@pytest.fixture(scope="module")
def torch_env():
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2) -> dict:
    return {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
            "batch_size": batch, "precision": "float32", "device": "cpu", "threads": 1,
            "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}


def test_environment_is_isolated_and_pinned(torch_env):
    runner, env = torch_env
    assert env.python != Path(sys.executable)
    assert any(p.lower().startswith("torch==2.13.0") for p in env.packages)
    # The controller's packages are not in the framework environment.
    assert not any(p.lower().startswith("typer==") for p in env.packages)


@pytest.mark.parametrize("name", NETWORKS)
def test_parameter_count_built_by_torch_equals_description(torch_env, name):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / f"{name}.yaml")
    outcome = run_worker(env.python, runner.worker, _request(summary.resolved, "inspect"), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    assert outcome.result["params"] == summary.params
    assert tuple(outcome.result["output_shape"]) == summary.output_shape
    assert outcome.result["framework"]["version"].startswith("2.13.0")


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_worker_measures_and_applies_threads(torch_env, mode):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / "alexnet_r.yaml")
    outcome = run_worker(env.python, runner.worker, _request(summary.resolved, "benchmark", mode, 4), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["intra_op"] == 1
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)


def test_cuda_request_on_a_cpu_host_is_skipped(torch_env):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / "fcn5.yaml")
    req = _request(summary.resolved, "inspect")
    req["device"] = "cuda"
    outcome = run_worker(env.python, runner.worker, req, timeout_s=300)
    assert outcome.status == "skipped"
    assert "CUDA" in outcome.reason


@pytest.mark.parametrize("suite", ["cnn", "fcn", "rnn"])
def test_cli_runs_suite_records_and_reports(torch_env, tmp_path, suite):
    store, site = tmp_path / "store", tmp_path / "site"
    dlbench = [sys.executable, "-m", "dlbench.cli"]
    run = subprocess.run(dlbench + ["run", "--suite", suite, "--framework", "torch", "--profile", "smoke",
                                    "--device", "cpu", "--store", str(store)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(subprocess.run(dlbench + ["results", "--store", str(store), "--format", "json"],
                                     capture_output=True, text=True, check=True).stdout)
    benchmarks = SuiteCatalog(paths.suites_dir()).load_suite(paths.suites_dir() / f"{suite}.yaml", "smoke", "cpu").benchmarks
    assert sorted(r["benchmark"] for r in rows) == sorted(b.name for b in benchmarks)
    for r in rows:
        assert r["status"] == "ok" and r["framework"] == "torch"
        assert r["params"] == r["params_described"]
        repeats = SuiteCatalog(paths.suites_dir()).profiles().smoke.repeats
        assert r["repeats"] == repeats and r["iterations"] >= 5 * repeats
        assert r["samples_per_s"] > 0
    rep = subprocess.run(dlbench + ["report", "--store", str(store), "--out", str(site)],
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    html = (site / "index.html").read_text()
    for b in benchmarks:
        assert b.name in html
