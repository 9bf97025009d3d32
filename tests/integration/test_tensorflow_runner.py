"""The TensorFlow runner in its real, dlbench-built venv: builds, measures, skips, and equals torch.

The worker runs (nine `inspect`s, eight two-framework `check`s) are started once per module, two at
a time, and the tests read their outcomes; the whole file takes a few minutes on two cores. Every
precision x compile mode runs on a tiny network through the harness's own `run_request`, grouped in
two processes (one per compile mode: TensorFlow's import costs more than a tiny step, and the XLA
compiles stay in one process). transformer_tiny (issue 17) is inspected with the others, its smoke
runs share one process (with a tiny BERT-style masked_tokens network's fp32 and amp_bf16 runs), and
its float64 check step is compared with the numpy reference.
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
from dlbench.execution.equivalence import _probe, check_network, make_inputs
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance import yardstick

from .transformer_step import assert_tiny_step

pytestmark = pytest.mark.integration

NETWORKS = ["fcn5", "fcn8", "alexnet_r", "resnet56", "alexnet", "resnet50", "lstm32", "lstm64"]
# inspected too: the transformer (its check against torch is `dlbench check`'s and the float64 step
# against numpy below, which pins the canonical semantics rather than torch's reading of them)
INSPECTED = NETWORKS + ["transformer_tiny"]
SMOKE_POLICY = {"warmup": {"min_iters": 1, "max_iters": 3, "max_time_s": 5, "window": 1, "tolerance": 0.5},
                "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}

STEP_CRITERIA = ("update differ", "weights differ")  # what one optimiser step is judged by


# The smallest network with what the precisions touch: a convolution, a (fused) batch norm, a
# max-pool, the flatten into the dense logits.
ZOO = {
    "zoo_precision": """
input: {kind: tensor, shape: [3, 8, 8], classes: 5}
layers:
  - {type: conv2d, filters: 4, kernel: 3, padding: 1, bias: false}
  - {type: batch_norm}
  - {type: relu}
  - {type: max_pool, size: 2, stride: 2}
  - {type: flatten}
  - {type: dense, units: 5}
""",
    # BERT's input and heads (issue 17) at sequence 10: two segments (0-4, 5-9), 2 masked positions,
    # a post-norm block with dropout, the tied masked-LM decoder
    "zoo_bert": """
input: {kind: masked_tokens, vocabulary: 11, sequence_length: 10, mask_seed: 4}
layers:
  - {type: embedding, vocabulary: 11, dim: 8}
  - {type: position_embedding, max_length: 12}
  - {type: segment_embedding}
  - {type: layer_norm, eps: 1.0e-3}
  - {type: dropout, rate: 0.1}
  - {type: transformer_block, heads: 2, norm: post, gelu: erf, eps: 1.0e-3, dropout: 0.1}
  - {type: pretraining_heads, gelu: erf, eps: 1.0e-3, tied: true}
loss: masked_lm_and_next_sentence
""",
}
PRECISIONS = ["fp32", "tf32", "amp_bf16", "amp_fp16"]
COMPILE_MODES = ["eager", "compiled"]
TF32_ON_CPU = ("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
               "this run is on the CPU")
COMPUTE_DTYPE = {"fp32": "float32", "amp_bf16": "bfloat16", "amp_fp16": "float16"}
KERAS_POLICY = {"fp32": "float32", "amp_bf16": "mixed_bfloat16", "amp_fp16": "mixed_float16"}

# Several requests through harness.run_request (what worker.py runs) in one process of the venv.
RUN_REQUESTS = """
import json, sys
sys.path[:0] = [sys.argv[1]]  # the folder holding the runners package
from runners.common import harness
from runners.tensorflow.runner import TensorFlowRunner
runner = TensorFlowRunner()
with open(sys.argv[2]) as f:
    requests = json.load(f)
results = [harness.run_request(runner, r) for r in requests]
with open(sys.argv[3], "w") as f:
    json.dump(results, f)
"""


@functools.cache
def _summary(name: str):
    if name in ZOO:
        with tempfile.TemporaryDirectory(prefix="dlbench-tf-zoo-") as tmp:
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(f"name: {name}\n" + ZOO[name])
            return load_network(path)
    return load_network(paths.suites_dir() / "networks" / f"{name}.yaml")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, device: str = "cpu",
             precision: str = "fp32", compile: str | None = None) -> dict:
    req = {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
           "batch_size": batch, "precision": precision, "device": device, "threads": 1,
           "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}
    if compile is not None:
        req["compile"] = compile
    return req


def _run_requests(python: Path, requests: list[dict]) -> list[dict]:
    runners = paths.runners_dir()
    with tempfile.TemporaryDirectory(prefix="dlbench-tf-requests-") as tmp:
        req_path, res_path = Path(tmp, "requests.json"), Path(tmp, "results.json")
        req_path.write_text(json.dumps(requests))
        out = subprocess.run([str(python), "-c", RUN_REQUESTS, str(runners.parent),
                              str(req_path), str(res_path)], capture_output=True, text=True, timeout=600, check=False,
                             cwd=runners / "tensorflow")
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(res_path.read_text())


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
        return dict(zip(INSPECTED, pool.map(inspect, INSPECTED)))


@pytest.fixture(scope="module")
def checked(tensorflow_env, torch_env):
    def check(name):
        return check_network(_summary(name), [torch_env, tensorflow_env])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NETWORKS, pool.map(check, NETWORKS)))


@pytest.fixture(scope="module")
def precision_runs(tensorflow_env):
    """(precision, compile, mode) -> result of run_request: every precision x compile mode training
    the tiny network, amp_bf16's forward (infer), and two refused requests; one process per compile
    mode (the compiled one holds every XLA compile of the module), both at once."""
    _, env = tensorflow_env
    net = _summary("zoo_precision").resolved
    groups = {c: [(p, c, "train") for p in PRECISIONS] for c in COMPILE_MODES}
    groups["eager"] += [("amp_bf16", "eager", "infer"), ("float32", "eager", "train"), ("fp32", "jit", "train")]

    def run(keys):
        return dict(zip(keys, _run_requests(env.python, [_request(net, "benchmark", m, 4, precision=p, compile=c)
                                                         for p, c, m in keys])))

    with ThreadPoolExecutor(max_workers=2) as pool:
        out = {}
        for part in pool.map(run, groups.values()):
            out.update(part)
        return out


def test_environment_is_isolated_and_pinned(tensorflow_env):
    runner, env = tensorflow_env
    assert env.python != Path(sys.executable)
    assert any(p.lower().startswith("tensorflow-cpu==2.21.0") or p.lower().startswith("tensorflow_cpu==2.21.0")
               for p in env.packages), env.packages
    assert any(p.lower().startswith("keras==3.") for p in env.packages)
    assert not any(p.lower().startswith("typer==") for p in env.packages)


@pytest.mark.parametrize("name", INSPECTED)
def test_parameter_count_built_by_tensorflow_equals_description(inspected, name):
    outcome = inspected[name]
    summary = _summary(name)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    assert outcome.result["params"] == summary.params
    assert tuple(outcome.result["output_shape"]) == summary.output_shape
    assert outcome.result["framework"]["version"].startswith("2.21.0")
    assert outcome.result["settings"]["step"] == "tf.function"


def assert_cpu_memory(memory: dict) -> None:
    """TensorFlow's CPU allocator keeps statistics where oneDNN's custom operations are on (its default
    on AVX-512 CPUs): a peak, with its source; elsewhere get_memory_info raises, or reads 0 where the
    step's tensors went past it, and the record says so."""
    if "unavailable" in memory:
        assert "get_memory_info('CPU:0') r" in memory["unavailable"]  # raises / reports
    else:
        assert memory["peak_allocated_bytes"] > 0 and "get_memory_info('CPU:0')" in memory["source"]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_worker_measures_and_applies_threads(tensorflow_env, mode):
    runner, env = tensorflow_env
    summary = _summary("alexnet_r")
    request = _request(summary.resolved, "benchmark", mode, 4)
    if mode == "train":
        request["yardstick"] = yardstick.request()
    outcome = run_worker(env.python, runner.worker, request, timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["intra_op"] == 1 and res["threads"]["inter_op"] == 1
    # the yardstick, asked for in training only, timed in this framework before the network was built
    if mode == "train":
        assert [e["status"] for e in res["yardstick"]] == ["ok", "ok"], res["yardstick"]
        assert set(yardstick.times(res["yardstick"])) == {spec.key for spec in yardstick.YARDSTICK}
    else:
        assert "yardstick" not in res
    assert res["settings"]["intra_op_threads"] == 1 and res["settings"]["data_format"] == "channels_last"
    assert res["settings"]["jit_compile"] is False
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)
    # no `compile` in the request: the runner's default (runner.toml), eager, recorded as such
    assert res["settings"]["compile"]["mode"] == "eager" and res["settings"]["compile"]["requested"] is None
    assert res["settings"]["precision"] == "fp32"
    assert res["settings"]["precision_effective"]["tensor_float_32_execution_enabled"] is False
    # after the measured window: no allocator statistics on the CPU (said why), the step traced once
    assert_cpu_memory(res["memory"])
    assert res["compile"]["tracings"] == 1 and res["compile"]["retracings"] == 0


@pytest.mark.parametrize("compile_mode", COMPILE_MODES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_and_compile_mode_runs_as_recorded(precision_runs, precision, compile_mode):
    res = precision_runs[(precision, compile_mode, "train")]
    if precision == "tf32":  # no TF32 on the CPU: skipped with why, before anything is built
        assert res["status"] == "skipped" and res["reason"] == TF32_ON_CPU
        return
    assert res["status"] == "ok", res.get("reason") or res
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    settings = res["settings"]
    assert settings["precision"] == precision
    assert settings["compile"]["mode"] == compile_mode and settings["compile"]["requested"] == compile_mode
    assert settings["jit_compile"] is (compile_mode == "compiled")
    assert settings["compile"]["framework"].startswith(f"tf.function(jit_compile={compile_mode == 'compiled'})")
    effective = settings["precision_effective"]
    # TF32 pinned off (read back) for every precision but tf32, float16 GEMMs accumulating in float32
    assert effective["tensor_float_32_execution_enabled"] is False
    assert effective["TF_FP16_MATMUL_USE_FP32_COMPUTE"] == "1"
    # Keras' mixed policies: float32 variables, reduced-precision computation, float32 logits
    assert effective["keras_dtype_policy"] == KERAS_POLICY[precision]
    assert effective["variable_dtype"] == "float32"
    assert effective["first_layer_output_dtype"] == COMPUTE_DTYPE[precision]
    assert effective["logits_layer_compute_dtype"] == COMPUTE_DTYPE[precision]
    assert effective["logits_dtype"] == "float32"
    if precision == "amp_fp16":  # Keras' dynamic loss scaling, at its initial scale
        assert effective["loss_scale"] == 2.0 ** 15
        assert "LossScaleOptimizer" in settings["optimizer"]
    else:
        assert effective["loss_scale"] is None and "LossScaleOptimizer" not in settings["optimizer"]
    assert_cpu_memory(res["memory"])
    assert res["compile"] == {"source": "tf.function experimental_get_tracing_count() of the step", "tracings": 1,
                              "retracings": 0, "jit_compile": compile_mode == "compiled"}


def test_amp_bf16_forward_computes_in_bfloat16_with_float32_logits(precision_runs):
    res = precision_runs[("amp_bf16", "eager", "infer")]
    assert res["status"] == "ok", res.get("reason") or res
    effective = res["settings"]["precision_effective"]
    assert effective["first_layer_output_dtype"] == "bfloat16"
    assert effective["logits_layer_compute_dtype"] == "bfloat16"  # the dense logits computed in bfloat16,
    assert effective["logits_dtype"] == "float32"  # then cast to float32 as Keras recommends
    assert "mixed_bfloat16" in res["settings"]["dtype_policy"]
    batch_norm = res["settings"]["batch_norm"]
    assert "FusedBatchNormV3" in batch_norm and "bfloat16 activations with float32 statistics" in batch_norm


@pytest.mark.parametrize(("precision", "compile_mode", "named"), [
    ("float32", "eager", ("'float32'", "fp32, tf32, amp_bf16, amp_fp16, float64")),
    ("fp32", "jit", ("'jit'", "eager, compiled")),
])
def test_an_unknown_precision_or_compile_mode_is_one_clear_error(precision_runs, precision, compile_mode, named):
    res = precision_runs[(precision, compile_mode, "train")]
    assert res["status"] == "failed"
    assert "ValueError" in res["reason"] and all(n in res["reason"] for n in named), res["reason"]


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


# ------------------------------------------------------------------ transformers (issue 17): transformer_tiny
# A two-block causal decoder with dropout 0.1 and a tied head: smoke runs in fp32 and amp_bf16 (one
# process: TensorFlow's import is dearer than the runs), with the dropout off once (deterministic),
# which takes Keras' other attention path; the float64 check step against the numpy reference, in
# a second process at the same time.
TRANSFORMER_RUNS = [("train", "fp32", False), ("train", "amp_bf16", False), ("infer", "amp_bf16", False),
                    ("train", "fp32", True)]
BERT_RUNS = [("zoo_bert", "train", precision, False) for precision in ("fp32", "amp_bf16")]  # in the same process
DOT_PRODUCT = ("keras.ops.dot_product_attention (Keras' TensorFlow backend: einsum, softmax in at least float32, "
               "einsum; it has no flash kernel)")


@pytest.fixture(scope="module")
def transformer_outcomes(tensorflow_env, tmp_path_factory):
    """(the smoke runs: key -> run_request result, the float64 check probe: (arrays, reason, status),
    its weights and inputs), both at once."""
    runner, env = tensorflow_env
    net = _summary("transformer_tiny")
    tmp = tmp_path_factory.mktemp("transformer_tiny")
    weights, inputs = random_weights(net.resolved, seed=5), make_inputs(net, 2, seed=5)
    np.savez(tmp / "weights.npz", **weights)
    np.savez(tmp / "inputs.npz", **inputs)

    def smoke():
        runs = [(net.resolved, key) for key in TRANSFORMER_RUNS]
        runs += [(_summary(key[0]).resolved, key[1:]) for key in BERT_RUNS]
        return dict(zip(TRANSFORMER_RUNS + BERT_RUNS, _run_requests(env.python, [
            {**_request(network, "benchmark", mode, 2, precision=precision), "deterministic": deterministic}
            for network, (mode, precision, deterministic) in runs])))

    def probe():
        return _probe(runner, env, net, tmp, "cpu", 300, tmp / "weights.npz", tmp / "inputs.npz", 2,
                      precision="float64")

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs, probed = pool.submit(smoke), pool.submit(probe)
        return runs.result(), probed.result(), weights, inputs


@pytest.mark.parametrize(("mode", "precision", "deterministic"), TRANSFORMER_RUNS)
def test_transformer_tiny_measures_and_records_its_attention(transformer_outcomes, mode, precision, deterministic):
    res = transformer_outcomes[0][(mode, precision, deterministic)]
    assert res["status"] == "ok", res.get("reason") or res
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["params"] == _summary("transformer_tiny").params and res["output_shape"] == [32, 512]
    settings = res["settings"]
    effective = settings["precision_effective"]
    assert effective["keras_dtype_policy"] == KERAS_POLICY[precision]
    assert effective["first_layer_output_dtype"] == COMPUTE_DTYPE[precision]  # the embedding's rows
    assert effective["logits_layer_compute_dtype"] == COMPUTE_DTYPE[precision]  # the tied head's product,
    assert effective["logits_dtype"] == "float32"  # cast to float32 as Keras recommends
    assert res["compile"]["tracings"] == 1 and res["compile"]["retracings"] == 0
    attention = settings["attention"]
    assert attention["function"] == "keras.layers.MultiHeadAttention"
    assert attention["executed_by"] == "TensorFlow's executor, op by op (CPU kernels)"
    # Keras' TensorFlow backend has no flash kernel: nothing asks for one (None, which it runs as False)
    assert attention["flash_attention"]["argument"] is None
    assert attention["flash_attention"]["keras.config.is_flash_attention_enabled()"] is None
    assert not any("Attention" in op or "Flash" in op for op in attention["tf_ops"]), attention["tf_ops"]
    assert "Softmax" in attention["tf_ops"]
    # MultiHeadAttention takes its own einsum path whenever the layer has dropout (0.1 here, in
    # inference too), and keras.ops.dot_product_attention once the dropout is off (deterministic)
    if deterministic:
        assert attention["kernel"] == DOT_PRODUCT
    else:
        assert attention["kernel"].startswith("MultiHeadAttention's own einsum path"), attention["kernel"]
        assert ("Dropout 0.1 on the probabilities" in attention["kernel"]) is (mode == "train")
        assert ("StatelessRandomUniformV2" in attention["tf_ops"]) is (mode == "train")


def test_transformer_tiny_check_step_matches_numpy_in_float64(transformer_outcomes):
    """The check action on transformer_tiny in float64 (dropout off): the canonical tensors exported
    (the tied head's weight only once, as 000.weight), logits and loss equal to the numpy reference's
    to 1e-9, and the tied table's step carries the head's gradient (rows of tokens absent from the
    input move, which only the head reaches)."""
    _, (arrays, reason, status), weights, inputs = transformer_outcomes
    net = _summary("transformer_tiny")
    assert arrays is not None, f"{status}: {reason}"
    assert_tiny_step(arrays, net, weights, inputs)


@pytest.mark.parametrize("key", BERT_RUNS, ids=[key[2] for key in BERT_RUNS])
def test_masked_tokens_network_trains_with_the_pretraining_heads(transformer_outcomes, key):
    """BERT's segment embedding and pre-training heads on a masked_tokens input train in fp32 and
    amp_bf16: the described parameters (the tied decoder no second table), the masked-LM logits
    (M, vocabulary) as the output, float32 logits under the mixed policy, the two-task loss, and
    the block's attention recorded (its dropout: MultiHeadAttention's own einsum path)."""
    res = transformer_outcomes[0][key]
    assert res["status"] == "ok", res.get("reason") or res
    net = _summary("zoo_bert")
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["params"] == net.params
    assert res["output_shape"] == [len(net.resolved["input"]["masked_positions"]), 11] == [2, 11]
    settings = res["settings"]
    effective = settings["precision_effective"]
    precision = key[2]
    assert effective["keras_dtype_policy"] == KERAS_POLICY[precision]
    assert effective["logits_layer_compute_dtype"] == COMPUTE_DTYPE[precision]  # the heads' products
    assert effective["logits_dtype"] == "float32"
    assert settings["loss"].startswith("masked_lm_and_next_sentence")
    attention = settings["attention"]
    assert attention["function"] == "keras.layers.MultiHeadAttention"
    assert attention["kernel"].startswith("MultiHeadAttention's own einsum path"), attention["kernel"]
    assert "Dropout 0.1 on the probabilities" in attention["kernel"]
    assert attention["flash_attention"]["argument"] is None and "Softmax" in attention["tf_ops"]
