"""The JAX (flax + optax) runner in its real, dlbench-built venv, checked against the torch runner.

Every worker is its own process, so all of them (inspections, benchmarks, the `dlbench check` of the
eight networks, probes of small networks that use every layer type) run from one pool, two at a
time, heaviest first; the tests then read their results. Most of the time is XLA compilation.
"""

from __future__ import annotations

import functools
import json
import subprocess
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
from dlbench.execution.equivalence import (
    check_batch_size,
    check_network,
    make_inputs,
    relative_error,
    tolerance_for,
)
from dlbench.execution.equivalence import _probe as check_probe
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance import yardstick

from .transformer_step import assert_tiny_step

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


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, precision: str = "fp32",
             compile: str | None = None) -> dict:
    req = {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
           "batch_size": batch, "precision": precision, "device": "cpu", "threads": 1,
           "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}
    if compile is not None:
        req["compile"] = compile
    return req


PRECISIONS = ["fp32", "tf32", "amp_bf16", "amp_fp16"]
COMPILE_MODES = ["compiled", "eager"]
TF32_ON_CPU = ("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
               "this run is on the CPU")
COMPUTE_DTYPE = {"fp32": "float32", "amp_bf16": "bfloat16", "amp_fp16": "float16"}

# amp_fp16's dynamic loss scale, driven directly (TrainingModel.update and train_step, jitted):
# a non-finite gradient leaves the weights and halves the scale, LOSS_SCALE_GROWTH_INTERVAL finite
# steps double it, and the gradients come back unscaled.
LOSS_SCALE_PROBE = """
import json, sys
sys.path[:0] = [sys.argv[1]]  # the folder holding the runners package
import jax
jax.config.update("jax_platforms", "cpu")
import numpy as np, jax.numpy as jnp
from runners.jax.precision import LOSS_SCALE_GROWTH_INTERVAL
from runners.jax.step import TrainingModel
net = {"input": {"kind": "tensor", "shape": [3], "classes": 2},
       "layers": [{"type": "dense", "units": 2, "bias": True, "in_shape": [3], "out_shape": [2]}]}
tm = TrainingModel({"network": net, "precision": "amp_fp16", "device": "cpu", "mode": "train",
                    "learning_rate": 0.1, "momentum": 0.9})
rng = np.random.default_rng(0)
x, y = tm.host_batch(2, rng)
p = tm.host_variables(x.shape[1:], x.dtype, rng)["params"]
opt = tm.host_opt_state(p)
update = jax.jit(tm.update)
leaves = jax.tree.leaves
inf = jax.tree.map(lambda a: np.full(a.shape, np.inf, np.float32), p)
p_inf, o_inf = update(p, inf, opt)
ones = jax.tree.map(lambda a: np.ones(a.shape, np.float32), p)
due = {**opt, "loss_scale": {"scale": np.float32(8.0), "finite_steps": np.int32(LOSS_SCALE_GROWTH_INTERVAL - 1)}}
p_ok, o_ok = update(p, ones, due)
r = jax.jit(tm.train_step)(p, {}, opt, jnp.asarray(tm.host_key(1)), x, y)
grads = jax.jit(tm.gradients)
g1, g2 = (grads(p, {}, None, x, y, jnp.float32(s))[2] for s in (1.0, 1024.0))
print(json.dumps({
    "initial": float(opt["loss_scale"]["scale"]), "interval": LOSS_SCALE_GROWTH_INTERVAL,
    "inf_kept_weights": all(np.array_equal(a, b) for a, b in zip(leaves(p), leaves(p_inf))),
    "inf_kept_momentum": all(np.array_equal(a, b) for a, b in zip(leaves(opt["sgd"]), leaves(o_inf["sgd"]))),
    "scale_after_inf": float(o_inf["loss_scale"]["scale"]), "steps_after_inf": int(o_inf["loss_scale"]["finite_steps"]),
    "finite_updated": not all(np.array_equal(a, b) for a, b in zip(leaves(p), leaves(p_ok))),
    "scale_after_interval": float(o_ok["loss_scale"]["scale"]), "steps_after_interval": int(o_ok["loss_scale"]["finite_steps"]),
    "step_scale": float(r[2]["loss_scale"]["scale"]), "step_finite_steps": int(r[2]["loss_scale"]["finite_steps"]),
    "step_loss": float(r[4]),
    "unscaled_difference": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(leaves(g1), leaves(g2))),
}))
"""


def _loss_scale_probe(python: Path) -> dict:
    runners = paths.runners_dir()
    out = subprocess.run([str(python), "-c", LOSS_SCALE_PROBE, str(runners.parent)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _probe(env_pair, summary, work: Path, lr: float) -> dict:
    runner, env = env_pair
    out = work / f"{runner.name}.npz"
    req = {"protocol": PROTOCOL_VERSION, "action": "check", "network": summary.resolved, "mode": "train",
           "batch_size": check_batch_size(summary), "precision": "fp32", "device": "cpu", "threads": None,
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
    jobs.update({("benchmark", m): (lambda m=m: worker(_request(_summary("alexnet_r").resolved, "benchmark", m, 4)
                                                        | ({"yardstick": yardstick.request()} if m == "train" else {})))
                 for m in ("train", "infer")})
    # dropout in training (not deterministic): a key split inside the compiled step
    jobs[("benchmark", "dropout")] = lambda: worker(_request(_summary("zoo_image").resolved, "benchmark", "train", 4))
    jobs.update({("inspect", n): (lambda n=n: worker(_request(_summary(n).resolved, "inspect")))
                 for n in HEAVIEST_FIRST})
    jobs[("cuda",)] = lambda: worker(cuda_request())
    # issue 16: every precision x compile mode on the smallest image network (batch 2), an amp_bf16
    # forward, amp_fp16 through the LSTM, an old precision name, and the loss scale driven directly
    alexnet_r = _summary("alexnet_r").resolved
    jobs.update({("precision", p, c): (lambda p=p, c=c: worker(_request(alexnet_r, "benchmark", "train", 2, p, c)))
                 for p in PRECISIONS for c in COMPILE_MODES})
    jobs[("precision", "amp_bf16", "infer")] = lambda: worker(_request(alexnet_r, "benchmark", "infer", 2, "amp_bf16"))
    jobs[("precision", "amp_fp16", "lstm")] = lambda: worker(
        _request(_summary("zoo_sequence").resolved, "benchmark", "train", 2, "amp_fp16", "compiled"))
    jobs[("precision", "float32")] = lambda: worker(_request(alexnet_r, "benchmark", "train", 2, "float32"))
    jobs[("compile", "unknown")] = lambda: worker(_request(alexnet_r, "benchmark", "train", 2, "fp32", "jit"))
    jobs[("loss_scale",)] = lambda: _loss_scale_probe(jax_env[1].python)

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
    # the yardstick, asked for in training only, timed in this framework before the network was built
    if mode == "train":
        assert [e["status"] for e in res["yardstick"]] == ["ok", "ok"], res["yardstick"]
        assert set(yardstick.times(res["yardstick"])) == {spec.key for spec in yardstick.YARDSTICK}
    else:
        assert "yardstick" not in res
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


# ------------------------------------------------------------------ issue 16: precision and compile mode


def _ok(results, *key):
    outcome = _get(results, *key)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    return outcome.result


@pytest.mark.parametrize("compile_mode", COMPILE_MODES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_and_compile_mode_runs_or_says_why(results, precision, compile_mode):
    outcome = _get(results, "precision", precision, compile_mode)
    if compile_mode == "eager":
        assert outcome.status == "skipped", outcome.reason or outcome.output_tail
        assert outcome.reason.startswith("jax: training steps run under jax.jit") and "eager" in outcome.reason
        return
    if precision == "tf32":
        assert outcome.status == "skipped", outcome.reason or outcome.output_tail
        assert outcome.reason == TF32_ON_CPU
        return
    res = _ok(results, "precision", precision, compile_mode)
    settings, eff = res["settings"], res["settings"]["precision_effective"]
    assert settings["precision"] == precision and settings["compile"] == "compiled"
    assert settings["compile_api"].startswith("jax.jit(train_step")
    # read back from jax: no TF32 (XLA's float32 dots and convolutions at full precision)
    assert eff["jax_default_matmul_precision"] == "highest" and eff["jax_enable_x64"] is False
    assert eff["tf32_override"]["when"].startswith("cpu")
    assert eff["param_dtype"] == "float32" and eff["compute_dtype"] == COMPUTE_DTYPE[precision]
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == COMPUTE_DTYPE[precision]
    if precision == "amp_fp16":
        assert eff["loss_scale"] == 2.0 ** 15 and eff["loss_scaling"].startswith("dynamic")
        assert "loss_scale" in settings["donated"]
    else:
        assert eff["loss_scale"] is None
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    # after the measured window: XLA:CPU reports no allocator statistics; jax's own compile counters
    assert "memory_stats() returns None" in res["memory"]["unavailable"]
    assert res["compile"]["step_compiles"] == 1 and res["compile"]["step_traces"] == 1
    assert res["compile"]["step_cache_entries"] == 1


def test_the_default_compile_mode_is_jit_and_recorded(results):
    res = _ok(results, "benchmark", "train")  # a request without `compile`
    assert res["settings"]["compile"] == "compiled"
    assert res["settings"]["precision"] == "fp32"
    assert res["settings"]["precision_effective"]["jax_default_matmul_precision"] == "highest"
    assert res["compile"]["step_compiles"] == 1


def test_amp_bf16_forward_computes_in_bfloat16(results):
    res = _ok(results, "precision", "amp_bf16", "infer")
    eff = res["settings"]["precision_effective"]
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == "bfloat16"
    assert eff["param_dtype"] == "float32" and "dtype=bfloat16" in res["settings"]["mixed_precision"]
    assert res["settings"]["compile_api"].startswith("jax.jit(infer_step")


def test_amp_fp16_trains_an_lstm(results):
    res = _ok(results, "precision", "amp_fp16", "lstm")
    eff = res["settings"]["precision_effective"]
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == "float16"  # embedding ... dense
    assert eff["loss_scale"] == 2.0 ** 15


def test_an_unknown_precision_or_compile_mode_is_refused_by_name(results):
    outcome = _get(results, "precision", "float32")
    assert outcome.status == "failed"
    assert "'float32'" in outcome.reason and "fp32, tf32, amp_bf16, amp_fp16, float64" in outcome.reason
    outcome = _get(results, "compile", "unknown")
    assert outcome.status == "failed"
    assert "'jit'" in outcome.reason and "eager, compiled" in outcome.reason


def test_dynamic_loss_scaling_skips_non_finite_steps_and_grows(results):
    probe = _get(results, "loss_scale")
    assert probe["initial"] == 2.0 ** 15
    assert probe["inf_kept_weights"] and probe["inf_kept_momentum"]
    assert probe["scale_after_inf"] == 2.0 ** 14 and probe["steps_after_inf"] == 0
    assert probe["finite_updated"] and probe["scale_after_interval"] == 16.0 and probe["steps_after_interval"] == 0
    assert probe["step_scale"] == 2.0 ** 15 and probe["step_finite_steps"] == 1 and np.isfinite(probe["step_loss"])
    assert probe["unscaled_difference"] == 0.0  # powers of two: scaling and unscaling are exact


# ------------------------------------------------------------------ transformers (issue 17): transformer_tiny
# A two-block causal decoder with dropout 0.1 and a tied head, in workers of its own (so that these
# tests need none of the runs above): its parameter count by inspect, smoke runs in fp32 and amp_bf16
# with the attention jax ran, the float64 check step against the numpy reference, and `dlbench check`
# against torch.
TRANSFORMER_RUNS = [("train", "fp32"), ("train", "amp_bf16"), ("infer", "amp_bf16")]


@functools.cache
def _transformer_tiny():
    return load_network(paths.suites_dir() / "networks" / "transformer_tiny.yaml")


def _transformer_check_step(env_pair, work: Path) -> dict:
    """The check action in float64 (dropout off) on seeded canonical weights and tokens."""
    net = _transformer_tiny()
    weights, inputs = random_weights(net.resolved, seed=5), make_inputs(net, 2, seed=5)
    np.savez(work / "weights.npz", **weights)
    np.savez(work / "inputs.npz", **inputs)
    arrays, reason, status = check_probe(*env_pair, net, work, "cpu", 300, work / "weights.npz",
                                         work / "inputs.npz", 2, precision="float64")
    assert arrays is not None, f"{status}: {reason}"
    return {"arrays": arrays, "weights": weights, "inputs": inputs}


@pytest.fixture(scope="module")
def transformer_runs(envs, tmp_path_factory):
    """Every transformer_tiny worker of this section, two at a time: key -> outcome (or the exception).
    Each worker compiles its own step once (a benchmark) or its step and forward (the check)."""
    runner, env = envs["jax"]
    net = _transformer_tiny().resolved
    # heaviest first: a check compiles its step and a forward
    jobs = {("equivalence",): lambda: check_network(_transformer_tiny(), [envs["torch"], envs["jax"]]),
            ("check",): lambda: _transformer_check_step(envs["jax"], tmp_path_factory.mktemp("transformer-check"))}
    jobs.update({(mode, precision): (lambda m=mode, p=precision: run_worker(
        env.python, runner.worker, _request(net, "benchmark", m, 2, p), timeout_s=300))
        for mode, precision in TRANSFORMER_RUNS})
    jobs[("inspect",)] = lambda: run_worker(env.python, runner.worker, _request(net, "inspect"), timeout_s=300)

    def run(key):
        try:
            return jobs[key]()
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


def test_transformer_tiny_parameter_count_built_by_jax_equals_description(transformer_runs):
    res = _ok(transformer_runs, "inspect")
    assert res["params"] == _transformer_tiny().params == 134_912
    assert res["output_shape"] == [32, 512]
    assert res["settings"]["dropout"] == "per-step key split inside the step"


@pytest.mark.parametrize(("mode", "precision"), TRANSFORMER_RUNS)
def test_transformer_tiny_measures_and_records_its_attention(transformer_runs, mode, precision):
    res = _ok(transformer_runs, mode, precision)
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["params"] == _transformer_tiny().params and res["output_shape"] == [32, 512]
    assert res["compile"]["step_compiles"] == 1
    settings = res["settings"]
    eff = settings["precision_effective"]
    # Embed ... Embed.attend: bfloat16 from the first layer to the tied head's product under amp
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == COMPUTE_DTYPE[precision]
    assert eff["param_dtype"] == "float32"
    attention = settings["attention"]  # one entry for both blocks: they are alike
    assert attention["kernel"] == "xla", attention  # the CPU has no cuDNN; read from the step's jaxpr
    if mode == "train":
        # dropout 0.1 on the probabilities: jax.nn.dot_product_attention has none
        assert attention["function"] == "flax.linen.dot_product_attention"
        assert attention["why"].startswith("dropout on the probabilities in training")
        assert "implementation_asked" not in attention
    else:
        assert attention["function"] == "jax.nn.dot_product_attention"
        assert attention["implementation_asked"] is None and "why" not in attention  # jax chooses: XLA
    assert "cudnn_refused" not in attention  # cuDNN is asked for on a GPU only


def test_transformer_tiny_check_step_matches_numpy_in_float64(transformer_runs):
    """The check action on transformer_tiny in float64: the canonical tensors exported (the tied
    head's weight only once, as 000.weight), logits and loss equal to the numpy reference's to 1e-9,
    and the tied table's step carries the head's gradient (rows of tokens absent from the input
    move, which only the head reaches)."""
    step = _get(transformer_runs, "check")
    arrays, weights, inputs = step["arrays"], step["weights"], step["inputs"]
    net = _transformer_tiny()
    assert all(np.array_equal(arrays[f"loaded/{n}"], w.astype(np.float64)) for n, w in weights.items())
    assert_tiny_step(arrays, net, weights, inputs)


def test_transformer_tiny_is_equivalent_to_torch(transformer_runs):
    """`dlbench check` in float64: logits, loss and every tensor's update (the tied table's included)."""
    torch_res, jax_res = _get(transformer_runs, "equivalence")
    assert torch_res.status == "reference", torch_res.reason
    assert jax_res.status == "equivalent", (jax_res.reason, jax_res.errors)
    assert jax_res.params == _transformer_tiny().params == jax_res.params_described
    assert jax_res.errors["roundtrip"] == 0.0


# ------------------------------------------------------------------ BERT's input and heads (issue 17)
# bert_base's layer types at sequence 10 (2 masked positions, segments 0-4 and 5-9), trained in fp32
# and amp_bf16 in workers of their own. No dropout: each dropout site's threefry costs XLA:CPU ~10 s
# of compilation, and transformer_tiny's runs above train through dropout already.
BERT_TINY = """
name: bert_tiny
input: {kind: masked_tokens, vocabulary: 11, sequence_length: 10, mask_seed: 4}
layers:
  - {type: embedding, vocabulary: 11, dim: 8}
  - {type: position_embedding, max_length: 12}
  - {type: segment_embedding}
  - {type: layer_norm, eps: 1.0e-12}
  - {type: transformer_block, heads: 2, norm: post, gelu: erf, causal: false, eps: 1.0e-12}
  - {type: pretraining_heads, gelu: erf, eps: 1.0e-12, tied: true}
loss: masked_lm_and_next_sentence
"""
BERT_PRECISIONS = ["fp32", "amp_bf16"]


@pytest.fixture(scope="module")
def bert_runs(envs, tmp_path_factory):
    runner, env = envs["jax"]
    path = tmp_path_factory.mktemp("bert") / "bert_tiny.yaml"
    path.write_text(BERT_TINY)
    net = load_network(path)

    def run(precision):
        return run_worker(env.python, runner.worker, _request(net.resolved, "benchmark", "train", 2, precision),
                          timeout_s=300)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return net, dict(zip(BERT_PRECISIONS, pool.map(run, BERT_PRECISIONS)))


@pytest.mark.parametrize("precision", BERT_PRECISIONS)
def test_bert_heads_train_in_every_precision(bert_runs, precision):
    net, runs = bert_runs
    outcome = runs[precision]
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    masked = net.resolved["input"]["masked_positions"]
    assert res["params"] == net.params == 1277
    assert res["output_shape"] == [len(masked), 11]  # the masked-LM logits (M, V)
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["compile"]["step_compiles"] == 1
    eff = res["settings"]["precision_effective"]
    # Embed ... the heads' Embed.attend: the compute dtype from the first layer to the masked-LM logits
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == COMPUTE_DTYPE[precision]
    assert eff["param_dtype"] == "float32"
    assert "jnp.take" in res["settings"]["pretraining_heads"]
    attention = res["settings"]["attention"]
    assert attention["kernel"] == "xla", attention
    assert attention["function"] == "jax.nn.dot_product_attention"
    assert attention["implementation_asked"] is None and "why" not in attention  # jax chooses: XLA on the CPU
    assert "cudnn_refused" not in attention
