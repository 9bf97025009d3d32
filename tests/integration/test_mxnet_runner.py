"""The Apache MXNet runner in its real, dlbench-built venv (about three and a half minutes on two cores)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

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


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, threads: int | None = 1,
             precision: str = "fp32", compile: str | None = None) -> dict:
    req = {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
           "batch_size": batch, "precision": precision, "device": "cpu", "threads": threads,
           "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}
    if compile is not None:
        req["compile"] = compile
    return req


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
    assert res["settings"]["compile"]["mode"] == "compiled"  # the runner's default when none is named
    # the worker's output carries no import-time warnings of mxnet
    assert "Warning" not in outcome.output_tail


@pytest.mark.parametrize("mode, threads", [("train", 1), ("infer", 1), ("infer", 2)])
def test_worker_measures_and_applies_threads(mxnet_env, mode, threads):
    runner, env = mxnet_env
    summary = _summary("alexnet_r")
    request = _request(summary.resolved, "benchmark", mode, 4, threads)
    if mode == "train":
        request["yardstick"] = yardstick.request()
    outcome = run_worker(env.python, runner.worker, request, timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["requested"] == threads
    assert res["threads"]["intra_op"] == threads  # OpenMP threads per operator, read back from libgomp
    assert res["threads"]["inter_op"] == 1  # one engine worker for the CPU
    # the yardstick, asked for in training only, timed in this framework before the network was built
    if mode == "train":
        assert [e["status"] for e in res["yardstick"]] == ["ok", "ok"], res["yardstick"]
        assert set(yardstick.times(res["yardstick"])) == {spec.key for spec in yardstick.YARDSTICK}
    else:
        assert "yardstick" not in res
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


# ------------------------------------------------------------------ precision x compile (issue 16)

PRECISIONS = ["fp32", "tf32", "amp_bf16", "amp_fp16"]
COMPILES = ["eager", "compiled"]
TF32_CPU = ("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
            "this run is on the CPU")


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return set(next((l for l in f if l.startswith("flags")), "").split(":", 1)[-1].split())


# oneDNN (MXNet 1.9.1's CPU bfloat16 backend) implements bfloat16 from AVX-512 (avx512_core) up
BF16_CPU = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags()
# What MXNet 1.9.1 does in bfloat16 on an AVX-512/AMX CPU (measured 2026-12-02 on a Xeon with
# avx512_bf16 and amx_bf16): the CNNs' forward passes run, their backward pass is refused by oneDNN
# ("could not create a primitive descriptor iterator"), and a transformer block corrupts the heap
# (glibc aborts), which the runner's probe process turns into a Skip. Either way the reason says so.
BF16_REFUSED = ("cannot run the backward pass in bfloat16", "crashed running this network in bfloat16")


def ran_in_bfloat16_or_said_why(outcome) -> bool:
    """True when the run is ok (its settings are then checked); a skip must give one of the reasons
    MXNet's bfloat16 has on an AVX-512 CPU; anything else fails."""
    if outcome.status == "skipped":
        assert any(r in outcome.reason for r in BF16_REFUSED), outcome.reason
        assert "avx512_bf16" in outcome.reason or "avx512f" in outcome.reason, outcome.reason
        return False
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    return True


@pytest.fixture(scope="module")
def precision_runs(mxnet_env):
    """alexnet_r, batch 2, every precision x compile mode in training, amp_bf16 inference and the
    retired name float32: one worker each, two at a time (CI has two cores)."""
    runner, env = mxnet_env
    network = _summary("alexnet_r").resolved
    cases = [(p, c, "train") for p in PRECISIONS for c in COMPILES] + [("amp_bf16", "compiled", "infer"),
                                                                        ("float32", None, "train")]  # the old name

    def run(case):
        precision, compile, mode = case
        req = _request(network, "benchmark", mode, 2, precision=precision, compile=compile)
        return case, run_worker(env.python, runner.worker, req, timeout_s=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, cases))


@pytest.mark.parametrize("compile", COMPILES)
def test_fp32_pins_tensor_cores_and_tf32_off_and_records_the_mode(precision_runs, compile):
    outcome = precision_runs[("fp32", compile, "train")]
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    s = res["settings"]
    assert s["precision"] == "fp32"
    eff = s["precision_effective"]
    assert eff["MXNET_CUDA_ALLOW_TENSOR_CORE"] == "0"
    assert eff["MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION"] == "0"
    assert eff["NVIDIA_TF32_OVERRIDE"] == "0"
    # the variables cuBLAS/cuDNN read when they load were in place before mxnet was imported
    assert eff["set_before_mxnet_import"]["NVIDIA_TF32_OVERRIDE"] is True
    assert eff["set_before_mxnet_import"]["MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION"] is True
    assert eff["first_layer_output_dtype"] == "float32" and eff["logits_dtype"] == "float32"
    assert eff["loss_scale"] is None
    assert s["compile"]["mode"] == compile and s["compile"]["requested"] == compile
    assert s["compile"]["framework"].startswith("HybridBlock.hybridize(") == (compile == "compiled")
    assert s["hybridize"] == ({"static_alloc": True, "static_shape": True} if compile == "compiled" else None)
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert "unavailable" in res["memory"] and "CPU" in res["memory"]["unavailable"]
    assert "compile" not in res  # MXNet keeps no compiler counters


@pytest.mark.parametrize("compile", COMPILES)
def test_tf32_is_skipped_on_the_cpu(precision_runs, compile):
    outcome = precision_runs[("tf32", compile, "train")]
    assert outcome.status == "skipped", outcome.reason or outcome.output_tail
    assert outcome.reason == TF32_CPU


@pytest.mark.parametrize("compile", COMPILES)
def test_amp_fp16_is_skipped_on_the_cpu_with_mxnets_reason(precision_runs, compile):
    # MXNet 1.9.1 has no float16 convolution on the CPU (its im2col + gemm path): the first conv layer
    outcome = precision_runs[("amp_fp16", compile, "train")]
    assert outcome.status == "skipped", outcome.reason or outcome.output_tail
    assert outcome.reason.startswith("amp_fp16: MXNet 1.9.1 cannot run layer 0 (conv2d, Conv2D) in float16 on the CPU")
    assert "FP16 gemm on cpu not implemented" in outcome.reason


@pytest.mark.parametrize("mode, compile", [("train", "eager"), ("train", "compiled"), ("infer", "compiled")])
def test_amp_bf16_runs_in_bfloat16_or_is_skipped_where_onednn_has_no_bfloat16(precision_runs, mode, compile):
    outcome = precision_runs[("amp_bf16", compile, mode)]
    if not BF16_CPU:  # an AVX2 CPU: oneDNN has no bfloat16 kernel, the first conv layer is refused
        assert outcome.status == "skipped", outcome.reason or outcome.output_tail
        assert outcome.reason.startswith("amp_bf16: MXNet 1.9.1 cannot run layer 0 (conv2d, Conv2D) in bfloat16 "
                                         "on the CPU: oneDNN: could not create a primitive descriptor iterator")
        assert "AVX-512" in outcome.reason
        return
    if mode == "infer":  # the forward pass runs in bfloat16 wherever oneDNN has the kernels
        assert outcome.status == "ok", outcome.reason or outcome.output_tail
    elif not ran_in_bfloat16_or_said_why(outcome):
        return
    s = outcome.result["settings"]
    eff = s["precision_effective"]
    # Convolution and FullyConnected in bfloat16 (AMP's target list): the first conv and the logits
    assert eff["first_layer_output_dtype"] == "bfloat16" and eff["logits_dtype"] == "bfloat16"
    assert eff["loss_scale"] is None  # bfloat16 has float32's range: no loss scaling
    assert eff["amp"]["mechanism"] == "mxnet.contrib.amp.init(target_dtype='bfloat16')"
    assert "Convolution" in eff["amp"]["target_dtype_ops"]
    assert s["compile"]["mode"] == compile


def test_an_unknown_precision_fails_naming_the_accepted_ones(precision_runs):
    outcome = precision_runs[("float32", None, "train")]
    assert outcome.status == "failed"
    assert "'float32'" in outcome.reason and "fp32, tf32, amp_bf16, amp_fp16" in outcome.reason


# ------------------------------------------------------------------ transformers (issue 17): transformer_tiny
# A two-block causal decoder with dropout 0.1 and a tied head: its parameter count by inspect, smoke
# runs in fp32 and amp_bf16 with the attention operators MXNet ran, the float64 build's attention and
# its check step against the numpy reference. Every worker of the section starts at once, two at a time.
TRANSFORMER_RUNS = [("inspect", "train", "float64"), ("benchmark", "train", "fp32"), ("benchmark", "infer", "fp32"),
                    ("benchmark", "train", "amp_bf16"), ("benchmark", "infer", "amp_bf16")]
FUSED = ("_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt")


@pytest.fixture(scope="module")
def transformer_tiny():
    return _summary("transformer_tiny")


@pytest.fixture(scope="module")
def transformer_runs(mxnet_env, transformer_tiny):
    """Every run of TRANSFORMER_RUNS: key -> outcome (or the exception)."""
    runner, env = mxnet_env

    def run(key):
        action, mode, precision = key
        try:
            return run_worker(env.python, runner.worker,
                              _request(transformer_tiny.resolved, action, mode, 2, precision=precision), timeout_s=300)
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(TRANSFORMER_RUNS, pool.map(run, TRANSFORMER_RUNS)))


def _outcome(runs, *key):
    outcome = runs[key]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_transformer_tiny_measures_in_fp32_with_the_fused_attention_operators(transformer_runs, transformer_tiny,
                                                                              mode):
    outcome = _outcome(transformer_runs, "benchmark", mode, "fp32")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["params"] == transformer_tiny.params and res["output_shape"] == [32, 512]
    settings = res["settings"]
    assert settings["precision_effective"]["logits_dtype"] == "float32"
    attention = settings["attention"]
    # both blocks ran MXNet's fused operators (one value for both), read from its profiler
    assert attention["kernel"] == "fused interleaved_matmul_selfatt", attention
    ops = attention["operators"]
    assert set(FUSED) <= set(ops) and "batch_dot" not in ops and "broadcast_add" in ops  # the causal mask
    backward = {op for op in ops if op.startswith("_backward_")}
    if mode == "train":  # the step's mode: autograd, the dropout on the probabilities, the backward pass
        assert {"_backward_interleaved_matmul_selfatt_qk", "_backward_interleaved_matmul_selfatt_valatt",
                "_backward_Dropout"} <= backward
    else:
        assert backward == set()
    assert attention["blas"] == "BLAS_OPEN" and attention["subgraph_backend"] is None
    assert "causal_mask" in attention and "fused_unavailable" not in attention


def test_transformer_tiny_parameter_count_and_float64_attention_by_inspect(transformer_runs, transformer_tiny):
    """The float64 build: the fused operators' CPU kernels refuse float64 (MXNet's own message), so
    the attention is their documented batch_dot equivalent, and GELU and layer norm are composed."""
    outcome = _outcome(transformer_runs, "inspect", "train", "float64")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert res["params"] == transformer_tiny.params and tuple(res["output_shape"]) == transformer_tiny.output_shape
    attention = res["settings"]["attention"]
    assert attention["kernel"] == "batch_dot (the fused operators' documented equivalent)", attention
    assert "batch_dot" in attention["operators"] and not set(FUSED) & set(attention["operators"])
    assert "Only FP32 is supported on CPU at the moment" in attention["fused_unavailable"]
    composites = res["settings"]["float64_composites"]
    assert any(c.startswith("layer norm:") for c in composites) and any(c.startswith("attention:") for c in composites)


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_transformer_tiny_amp_bf16_runs_or_is_skipped_where_onednn_has_no_bfloat16(transformer_runs, mode):
    outcome = _outcome(transformer_runs, "benchmark", mode, "amp_bf16")
    if not BF16_CPU:  # an AVX2 CPU: the first bfloat16 product (a block's projection) is refused
        assert outcome.status == "skipped", outcome.reason or outcome.output_tail
        assert outcome.reason.startswith("amp_bf16: MXNet 1.9.1 cannot run layer 3 (transformer_block, "
                                         "TransformerBlock) in bfloat16 on the CPU: oneDNN: could not create a "
                                         "primitive descriptor iterator"), outcome.reason
        assert "AVX-512" in outcome.reason
        return
    if not ran_in_bfloat16_or_said_why(outcome):
        return
    s = outcome.result["settings"]
    eff = s["precision_effective"]
    assert eff["logits_dtype"] == "bfloat16"  # the head's product
    assert "fp32_ops=" in eff["amp"]["mechanism"]  # the fused operators and Dropout kept in float32
    assert s["attention"]["kernel"] == "fused interleaved_matmul_selfatt"


def test_transformer_tiny_check_step_matches_numpy_in_float64(mxnet_env, transformer_tiny, tmp_path):
    """The check action on transformer_tiny in float64 (dropout off): the canonical tensors exported
    (q, k and v split out of the interleaved projection; the tied head's weight only once, as
    000.weight), logits and loss equal to the numpy reference's to 1e-9, and the tied table's step
    carries the head's gradient (rows of tokens absent from the input move, which only the head reaches)."""
    runner, env = mxnet_env
    net = transformer_tiny
    weights = random_weights(net.resolved, seed=5)
    inputs = make_inputs(net, 2, seed=5)
    np.savez(tmp_path / "weights.npz", **weights)
    np.savez(tmp_path / "inputs.npz", **inputs)
    arrays, reason, status = _probe(runner, env, net, tmp_path, "cpu", 300, tmp_path / "weights.npz",
                                    tmp_path / "inputs.npz", 2, precision="float64")
    assert arrays is not None, f"{status}: {reason}"
    for name in ("003.attn.q.weight", "004.attn.v.bias"):  # the interleaved layout undone exactly
        assert np.array_equal(arrays[f"loaded/{name}"], weights[name].astype(np.float64))
    assert_tiny_step(arrays, net, weights, inputs)


# ------------------------------------------------------------------ BERT's input and heads (issue 17): masked_tokens
# bert_base's layer types at sequence 10 (2 masked positions, segments 0-4 and 5-9, dropout 0.1 in the
# encoder), one training step's worth of smoke runs in fp32 and amp_bf16, two workers at once.
MASKED_TINY = {
    "name": "bert_masked_tiny", "loss": "masked_lm_and_next_sentence",
    "input": {"kind": "masked_tokens", "vocabulary": 11, "sequence_length": 10, "mask_seed": 4},
    "layers": [{"type": "embedding", "vocabulary": 11, "dim": 8}, {"type": "position_embedding", "max_length": 12},
               {"type": "segment_embedding"}, {"type": "layer_norm", "eps": 1e-3}, {"type": "dropout", "rate": 0.1},
               {"type": "transformer_block", "heads": 2, "norm": "post", "gelu": "erf", "eps": 1e-3, "dropout": 0.1},
               {"type": "pretraining_heads", "gelu": "erf", "eps": 1e-3, "tied": True}]}


@pytest.fixture(scope="module")
def masked_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("masked") / "bert_masked_tiny.yaml"
    path.write_text(yaml.safe_dump(MASKED_TINY))
    return load_network(path)


@pytest.fixture(scope="module")
def masked_runs(mxnet_env, masked_tiny):
    runner, env = mxnet_env

    def run(precision):
        try:
            return precision, run_worker(env.python, runner.worker,
                                         _request(masked_tiny.resolved, "benchmark", "train", 2, precision=precision),
                                         timeout_s=300)
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return precision, e

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, ["fp32", "amp_bf16"]))


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16"])
def test_masked_tokens_network_trains_with_segment_embedding_and_pretraining_heads(masked_runs, masked_tiny,
                                                                                   precision):
    outcome = masked_runs[precision]
    if isinstance(outcome, Exception):
        raise outcome
    if precision == "amp_bf16" and not BF16_CPU:  # an AVX2 CPU: the block's bfloat16 projection is refused
        assert outcome.status == "skipped", outcome.reason or outcome.output_tail
        assert outcome.reason.startswith("amp_bf16: MXNet 1.9.1 cannot run layer 5 (transformer_block, "
                                         "TransformerBlock) in bfloat16 on the CPU"), outcome.reason
        return
    if precision == "amp_bf16" and not ran_in_bfloat16_or_said_why(outcome):
        return
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    masked = len(masked_tiny.resolved["input"]["masked_positions"])
    assert masked == 2 and len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    # the tied decoder has no weight of its own: the description's count, and the (M, V) masked-LM logits
    assert res["params"] == masked_tiny.params and res["output_shape"] == [masked, 11]
    s = res["settings"]
    assert s["precision_effective"]["logits_dtype"] == ("bfloat16" if precision == "amp_bf16" else "float32")
    attention = s["attention"]
    assert attention["kernel"] == "fused interleaved_matmul_selfatt", attention
    assert "causal_mask" not in attention  # BERT's encoder attends both ways
    assert {"_backward_interleaved_matmul_selfatt_qk", "_backward_Dropout"} <= set(attention["operators"])
