"""The JAX (flax + optax) runner in its real, dlbench-built venv, checked against the torch runner.

Every worker is its own process, so all of them (inspections, benchmarks, the `dlbench check` of the
eight networks, probes of small networks that use every layer type) run from one pool, two at a
time, heaviest first; the tests then read their results. Most of the time is XLA compilation.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dlbench import paths
from dlbench.definitions.loader import load_network
from dlbench.definitions.weights import random_weights
from dlbench.execution.environments import VenvBackend
from dlbench.execution.equivalence import check_batch_size, check_network, make_inputs, relative_error, tolerance_for
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry

pytestmark = pytest.mark.integration

NETWORKS = ["fcn5", "fcn8", "alexnet_r", "resnet56", "alexnet", "resnet50", "lstm32", "lstm64"]
HEAVIEST_FIRST = ["resnet50", "resnet56", "alexnet", "fcn8", "lstm32", "lstm64", "fcn5", "alexnet_r"]
SMOKE_POLICY = {"warmup": {"min_iters": 1, "max_iters": 3, "max_time_s": 5, "window": 1, "tolerance": 0.5},
                "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}
PARALLEL = 2
# The small networks are probed at lr 1000: one step's update -lr*g then dwarfs ulp(w), so the
# update of every tensor can be compared element-wise (max norm) without float32 rounding in the way.
WELL_POSED_LR = 1000.0

# Small networks that between them use every layer type and option of the description language
# (all shortcut kinds, both blocks, rectangular kernels/strides/padding, padded max-pool, 1-D and
# 2-D batch norm with non-default momentum/eps, flatten into batch norm and dense, a flatten that is
# the output, a sequence dense, a 3-layer LSTM). No bias feeds a batch norm: that gradient is 0
# in exact arithmetic, so its float32 value is noise in every framework.
ZOO = {
    "zoo_image": """
input: {kind: tensor, shape: [3, 12, 12], classes: 5}
layers:
  - {type: conv2d, filters: 8, kernel: 3, padding: 1, bias: false}
  - {type: batch_norm, momentum: 0.2, eps: 0.001}
  - {type: tanh}
  - {type: max_pool, size: 3, stride: 2, padding: 1}
  - {type: residual, block: basic, filters: 8, stride: 1, repeat: 2, shortcut: option_a}
  - {type: residual, block: basic, filters: 16, stride: 2, shortcut: option_a}
  - {type: residual, block: bottleneck, filters: 8, stride: 1, shortcut: projection}
  - {type: avg_pool, size: 2, stride: 1}
  - {type: flatten}
  - {type: batch_norm}
  - {type: sigmoid}
  - {type: dropout, rate: 0.3}
  - {type: dense, units: 5}
""",
    "zoo_pool": """
input: {kind: tensor, shape: [3, 9, 9], classes: 4}
layers:
  - {type: conv2d, filters: 6, kernel: [3, 2], stride: [2, 1], padding: [0, 1]}
  - {type: relu}
  - {type: max_pool, size: [2, 3], stride: [1, 2]}
  - {type: residual, block: bottleneck, filters: 3, stride: 2, shortcut: projection}
  - {type: global_avg_pool}
  - {type: batch_norm}
  - {type: dense, units: 4, bias: false}
""",
    "zoo_flat_output": """
input: {kind: tensor, shape: [2, 1, 5], classes: 10}
layers:
  - {type: conv2d, filters: 2, kernel: 1}
  - {type: flatten}
  - {type: tanh}
""",
    "zoo_sequence": """
input: {kind: tokens, vocabulary: 50, sequence_length: 6}
layers:
  - {type: embedding, vocabulary: 50, dim: 8}
  - {type: lstm, hidden: 7, layers: 3}
  - {type: dense, units: 12}
  - {type: tanh}
  - {type: dense, units: 50}
""",
}



@functools.lru_cache(maxsize=None)
def _summary(name: str):
    if name in ZOO:
        with tempfile.TemporaryDirectory(prefix="dlbench-jax-zoo-") as tmp:
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(f"name: {name}\n" + ZOO[name])
            return load_network(path)
    return load_network(paths.suites_dir() / "networks" / f"{name}.yaml")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2) -> dict:
    return {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
            "batch_size": batch, "precision": "float32", "device": "cpu", "threads": 1,
            "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}


def _probe(env_pair, summary, work: Path, lr: float) -> dict:
    runner, env = env_pair
    out = work / f"{runner.name}.npz"
    req = {"protocol": PROTOCOL_VERSION, "action": "check", "network": summary.resolved, "mode": "train",
           "batch_size": check_batch_size(summary), "precision": "float32", "device": "cpu", "threads": None,
           "learning_rate": lr, "momentum": 0.9, "seed": 0, "deterministic": True,
           "inputs": str(work / "inputs.npz"), "weights_in": str(work / "weights.npz"), "outputs": str(out)}
    outcome = run_worker(env.python, runner.worker, req, timeout_s=600)
    assert outcome.status == "ok", f"{runner.name}: {outcome.reason or outcome.output_tail}"
    assert outcome.result["params"] == summary.params
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _compare_at(summary, torch_env, jax_env, lr: float) -> dict[str, float]:
    """`dlbench check`'s probe (same weights, inputs, batch) at learning rate `lr`: jax against torch."""
    with tempfile.TemporaryDirectory(prefix="dlbench-jax-probe-") as tmp:
        work = Path(tmp)
        weights = random_weights(summary.resolved, 0)
        np.savez(work / "weights.npz", **weights)
        np.savez(work / "inputs.npz", **make_inputs(summary, check_batch_size(summary), 0))
        ref, got = (_probe(pair, summary, work, lr) for pair in (torch_env, jax_env))
    trained = [k[len("after/"):] for k in ref
               if k.startswith("after/") and not k.endswith(("running_mean", "running_var"))]
    return {
        "roundtrip": max((relative_error(got[f"loaded/{n}"], w) for n, w in weights.items()), default=0.0),
        "logits": relative_error(got["logits"], ref["logits"]),
        "loss": relative_error(got["loss"], ref["loss"]),
        "update": max((relative_error(got[f"after/{n}"].astype(np.float64) - got[f"loaded/{n}"],
                                      ref[f"after/{n}"].astype(np.float64) - ref[f"loaded/{n}"])
                       for n in trained), default=0.0),
    }


@pytest.fixture(scope="module")
def envs():
    registry, backend = RunnerRegistry(paths.runners_dir()), VenvBackend(paths.cache_dir())
    return {name: (registry.get(name), backend.ensure(registry.get(name), "cpu")) for name in ("jax", "torch")}


@pytest.fixture(scope="module")
def results(envs):
    """Every worker run of this file, two at a time, heaviest first: key -> result or exception."""
    jax_env, torch_env = envs["jax"], envs["torch"]

    def worker(request: dict):
        return run_worker(jax_env[1].python, jax_env[0].worker, request, timeout_s=600)

    def cuda_request():
        req = _request(_summary("fcn5").resolved, "inspect")
        req["device"] = "cuda"
        return req

    jobs = {("check", n): (lambda n=n: check_network(_summary(n), [torch_env, jax_env])) for n in HEAVIEST_FIRST}
    jobs.update({("zoo", n): (lambda n=n: _compare_at(_summary(n), torch_env, jax_env, WELL_POSED_LR))
                 for n in ZOO})
    jobs.update({("benchmark", m): (lambda m=m: worker(_request(_summary("alexnet_r").resolved, "benchmark", m, 4)))
                 for m in ("train", "infer")})
    # dropout in training (not deterministic): a key split inside the compiled step
    jobs[("benchmark", "dropout")] = lambda: worker(_request(_summary("zoo_image").resolved, "benchmark", "train", 4))
    jobs.update({("inspect", n): (lambda n=n: worker(_request(_summary(n).resolved, "inspect")))
                 for n in HEAVIEST_FIRST})
    jobs[("cuda",)] = lambda: worker(cuda_request())

    def run(key):
        try:
            return jobs[key]()
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


def _get(results, *key):
    value = results[key]
    if isinstance(value, Exception):
        raise value
    return value


def test_environment_is_isolated_and_pinned(envs):
    runner, env = envs["jax"]
    assert env.python != Path(sys.executable)
    pins = {p.lower() for p in env.packages}
    for pin in ("jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8"):
        assert pin in pins, pin
    assert not any(p.startswith(("typer==", "torch==")) for p in pins)


@pytest.mark.parametrize("name", NETWORKS)
def test_parameter_count_built_by_jax_equals_description(results, name):
    outcome = _get(results, "inspect", name)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    summary = _summary(name)
    res = outcome.result
    assert res["params"] == summary.params
    assert tuple(res["output_shape"]) == summary.output_shape
    assert res["framework"]["version"] == "0.10.2"
    assert res["threads"]["affinity"] == 1


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_worker_measures_and_applies_threads(results, mode):
    outcome = _get(results, "benchmark", mode)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    # --threads 1 is applied as CPU affinity (XLA:CPU sizes its thread pools from it)
    assert res["threads"]["requested"] == 1
    assert res["threads"]["affinity"] == 1 and res["threads"]["intra_op"] == 1
    assert len(res["threads"]["cpus"]) == 1
    assert res["settings"]["layout"] == "NHWC"
    if mode == "train":
        assert "params" in res["settings"]["donated"]
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)


def test_training_with_dropout_runs(results):
    outcome = _get(results, "benchmark", "dropout")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert res["settings"]["dropout"] == "per-step key split inside the step"
    assert "dropout_key" in res["settings"]["donated"]
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])


def test_cuda_request_on_a_cpu_host_is_skipped(results):
    outcome = _get(results, "cuda")
    assert outcome.status == "skipped"
    assert "CUDA" in outcome.reason


@pytest.mark.parametrize("name", NETWORKS)
def test_jax_is_equivalent_to_torch(results, name):
    summary = _summary(name)
    torch_res, jax_res = _get(results, "check", name)
    assert torch_res.status == "reference", torch_res.reason
    assert jax_res.status == "equivalent", (jax_res.reason, jax_res.errors)
    assert jax_res.params == summary.params == jax_res.params_described
    assert jax_res.errors["roundtrip"] == 0.0


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_layer_type_matches_torch(results, name):
    """Logits, loss and every tensor's one-step update (max norm, lr 1000) against torch."""
    errors = _get(results, "zoo", name)
    assert errors["roundtrip"] == 0.0
    assert max(errors.values()) <= tolerance_for(_summary(name)), errors
