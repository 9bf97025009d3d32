"""The kernels suite's float32 is IEEE float32 in every framework, as an fp32 run's is: each runner
pins TF32 off before it prepares a kernel and says so in the kernel's settings (on the CPU the
flags are what the same code sets on a GPU, where JAX, TensorFlow and cuDNN default to TF32).
And every runner times the transformer kernels (batched products, attention's core with and
without dropout on the probabilities, layer norm, both GELU forms, forward and backward) and the
pooling kernels (max with padding, average, global average, forward and backward) and a training
step's batch norm and a dense layer (forward, backward) with the op its network builder calls, and
a Llama-style decoder's and an MoE layer's kernels (RMSNorm, rotary, SwiGLU, grouped attention, the
router, the experts) with the framework's own, at the smallest shapes. One worker per framework
serves them all."""

from __future__ import annotations

import functools

import pytest

from dlbench import paths
from dlbench.execution.environments import VenvBackend
from dlbench.execution.kernels import kernel_request
from dlbench.execution.launcher import run_worker
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance.kernel_suite import KernelPolicy
from dlbench.performance.kernels import KernelSpec

pytestmark = pytest.mark.integration

# what each framework reports once float32 math is pinned (the keys are the runners' own)
IEEE_FLOAT32 = {
    "torch": {"torch.backends.cudnn.allow_tf32": False, "torch.backends.cuda.matmul.allow_tf32": False,
              "torch.get_float32_matmul_precision()": "highest"},
    "tensorflow": {"tensor_float_32_execution_enabled": False},
    "jax": {"jax_default_matmul_precision": "highest"},
    "mxnet": {"NVIDIA_TF32_OVERRIDE": "0", "MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION": "0"},
}
MATMULS = [KernelSpec.of("matmul", "float32", m=64, n=64, k=64), KernelSpec.of("matmul", "bfloat16", m=64, n=64, k=64)]
# 2 samples, 2 heads of 8 over 4 steps: causal with dropout 0.1 (a training step of a decoder),
# causal without (its inference), and an encoder's
CORE = dict(batch=2, heads=2, steps=4, head_size=8)
TRANSFORMER = [
    KernelSpec.of("batched_matmul", batch=4, m=4, n=4, k=8),
    KernelSpec.of("attention_fwd", causal=1, dropout=100, **CORE),
    KernelSpec.of("attention_bwd", causal=1, dropout=100, **CORE),
    KernelSpec.of("attention_fwd", causal=1, dropout=0, **CORE),
    KernelSpec.of("attention_bwd", causal=0, dropout=0, **CORE),
    KernelSpec.of("layer_norm_fwd", rows=8, dim=16),
    KernelSpec.of("layer_norm_bwd", rows=8, dim=16, input_grad=1),
    KernelSpec.of("layer_norm_bwd", rows=8, dim=16, input_grad=0),
    KernelSpec.of("gelu_fwd", elements=128, approximate=1),
    KernelSpec.of("gelu_bwd", elements=128, approximate=0),
]
# 2 samples of 3 x 7 x 7: a 3x3 max-pool, stride 2, pad 1 (resnet50's), a 2x2 average (no padding), the
# global average (the window of the whole map)
WINDOW = dict(batch=2, channels=3, height=7, width=7)
POOLING = [KernelSpec.of(kind, **WINDOW, **pool) for kind in ("pool2d_fwd", "pool2d_bwd") for pool in (
    dict(kh=3, kw=3, sh=2, sw=2, ph=1, pw=1, op=0), dict(kh=2, kw=2, sh=2, sw=2, ph=0, pw=0, op=1),
    dict(kh=7, kw=7, sh=1, sw=1, ph=0, pw=0, op=2))]
# the op each network builder runs for max, average and global average pooling (runners/torch/layers.py,
# runners/tensorflow/layers.py, runners/jax/layers.py, runners/mxnet/layers.py), as the kernel's settings name it
POOLING_OP = {
    "torch": ("F.max_pool2d", "F.avg_pool2d", "F.adaptive_avg_pool2d"),
    "tensorflow": ("MaxPooling2D", "AveragePooling2D", "GlobalAveragePooling2D"),
    "jax": ("flax.linen.max_pool", "flax.linen.avg_pool", "jnp.mean"),
    "mxnet": ("Pooling(pool_type='max', global_pool=False)", "Pooling(pool_type='avg', global_pool=False)",
              "Pooling(pool_type='avg', global_pool=True)"),
}
# a training step's batch norm over 2 samples of 3 x 4 x 4, with and without the input's gradient,
# and over a flat (N, C) input
BATCH_NORM = [KernelSpec.of("batch_norm_fwd", batch=2, channels=3, height=4, width=4),
              KernelSpec.of("batch_norm_bwd", batch=2, channels=3, height=4, width=4, input_grad=1),
              KernelSpec.of("batch_norm_bwd", batch=2, channels=3, height=4, width=4, input_grad=0),
              KernelSpec.of("batch_norm_fwd", batch=4, channels=3, height=1, width=1)]
BATCH_NORM_OP = {"torch": "F.batch_norm(training=True)", "tensorflow": "FusedBatchNormV3",
                 "jax": "flax.linen.BatchNorm(use_running_average=False)", "mxnet": "nn.BatchNorm, training"}
# a dense layer 6 -> 5 over 2 samples of 3 steps (forward, backward with the input's gradient) and on
# a flat input without bias or input gradient (a network's first layer)
DENSE = [KernelSpec.of("dense_fwd", batch=2, positions=3, inputs=6, units=5, bias=1),
         KernelSpec.of("dense_bwd", batch=2, positions=3, inputs=6, units=5, bias=1, input_grad=1),
         KernelSpec.of("dense_bwd", batch=4, positions=1, inputs=6, units=5, bias=0, input_grad=0)]
DENSE_OP = {"torch": "nn.Linear", "tensorflow": "keras.layers.Dense", "jax": "flax.linen.Dense",
            "mxnet": "gluon.nn.Dense(flatten=False)"}
# a Llama-style decoder's and an MoE layer's kernels at the smallest shapes: 2 samples of 4 steps, 4
# query heads sharing 2 key/value heads of 8, a SwiGLU 16 -> 24, 8 tokens routed to 2 of 4 experts
LLM_CORE = dict(batch=2, heads=4, kv_heads=2, head_size=8)
DECODER = [KernelSpec.of("rms_norm_fwd", rows=8, dim=16),
           KernelSpec.of("rms_norm_bwd", rows=8, dim=16, input_grad=1),
           KernelSpec.of("rms_norm_bwd", rows=8, dim=16, input_grad=0),
           KernelSpec.of("rotary_fwd", steps=4, **LLM_CORE),
           KernelSpec.of("rotary_bwd", steps=4, **LLM_CORE),
           KernelSpec.of("swiglu_fwd", rows=8, dim=16, hidden=24),
           KernelSpec.of("swiglu_bwd", rows=8, dim=16, hidden=24, input_grad=1),
           KernelSpec.of("grouped_attention_fwd", steps=4, causal=1, **LLM_CORE),
           KernelSpec.of("grouped_attention_bwd", steps=4, causal=1, **LLM_CORE),
           KernelSpec.of("moe_router_fwd", rows=8, dim=16, experts=4, top_k=2),
           KernelSpec.of("moe_router_bwd", rows=8, dim=16, experts=4, top_k=2),
           KernelSpec.of("moe_experts_fwd", tokens=8, dim=16, hidden=24, experts=4, top_k=2),
           KernelSpec.of("moe_experts_bwd", tokens=8, dim=16, hidden=24, experts=4, top_k=2)]
# what each framework's kernels name as their op (the users' way: fused where the framework has it)
DECODER_OP = {
    "torch": ("F.rms_norm", "rotate_half", "nn.Linear without bias", "enable_gqa", "stable sort top-k",
              "index_add"),
    "tensorflow": ("keras.layers.RMSNormalization", "rotate_half", "keras.layers.Dense without bias",
                   "keras.layers.GroupQueryAttention", "tf.math.top_k", "tf.tensor_scatter_nd_add"),
    "jax": ("flax.linen.RMSNorm", "rotate_half", "flax.linen.Dense without bias", "jax.nn.dot_product_attention",
            "lax.top_k", "lax.ragged_dot"),
    "mxnet": ("rsqrt", "rotate_half", "gluon.nn.Dense without bias", "repeat of the key/value heads",
              "each expert's rank", "dense dispatch"),
}
DECODER_FAMILIES = ("rms_norm", "rotary", "swiglu", "grouped_attention", "moe_router", "moe_experts")
# the op each network builder runs for attention's core, as the kernel's settings name it
ATTENTION_OP = {"torch": "scaled_dot_product_attention", "tensorflow": "MultiHeadAttention._compute_attention",
                "jax": "dot_product_attention", "mxnet": "interleaved_matmul_selfatt_qk/valatt"}


@functools.lru_cache(maxsize=None)
def kernels_of(framework: str) -> tuple[dict, ...]:
    """One worker of `framework` timing the matmuls, the transformer and the pooling kernels (cached per
    module run)."""
    runner = RunnerRegistry(paths.runners_dir()).get(framework)
    env = VenvBackend(paths.cache_dir()).ensure(runner, "cpu")
    policy = KernelPolicy(warmup_iters=1, min_iters=2, min_time_s=0.0, max_iters=3, repeats=1, cache="warm")
    outcome = run_worker(env.python, runner.worker, kernel_request(MATMULS + TRANSFORMER + POOLING + BATCH_NORM + DENSE
                                                                   + DECODER, policy, "cpu", 1),
                         timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    return tuple(outcome.result["kernels"])


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_kernels_run_under_the_precisions_math_and_record_it(framework):
    fp32, bf16 = kernels_of(framework)[:2]
    assert fp32["status"] == "ok", fp32
    flags = fp32["settings"]["precision_effective"]
    assert {k: flags.get(k) for k in IEEE_FLOAT32[framework]} == IEEE_FLOAT32[framework]
    # bfloat16 runs, or is skipped with the framework's reason (MXNet's oneDNN needs AVX-512 for it)
    assert bf16["status"] == "ok" or (bf16["status"] == "skipped" and bf16["reason"]), bf16


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_transformer_kernels_are_timed_with_the_networks_own_ops(framework):
    results = kernels_of(framework)[len(MATMULS):len(MATMULS) + len(TRANSFORMER)]
    assert [r["spec"] for r in results] == [s.to_dict() for s in TRANSFORMER]
    for r in results:
        assert r["status"] == "ok", (r["spec"], r.get("reason"), r.get("traceback"))
        assert r["median_s"] >= 0 and len(r["times_s"]) >= 2, r
        if r.get("with_forward_median_s") is not None:  # forward + backward less the forward
            assert r["settings"]["backward_time"] == "forward+backward minus forward (median of paired calls)"
    attention = [r for r in results if r["spec"]["kind"].startswith("attention")]
    assert all(ATTENTION_OP[framework] in str(r["settings"]) for r in attention), attention
    by_kind = {(r["spec"]["kind"], r["spec"]["shape"].get("dropout")): r["settings"] for r in results}
    if framework == "torch":  # the CPU flash kernel, but the math backend where there is dropout
        assert by_kind[("attention_fwd", 0)]["operator"] == "_scaled_dot_product_flash_attention_for_cpu"
        assert "bmm" in by_kind[("attention_fwd", 100)]["operator"]
    if framework == "tensorflow":  # Keras' own einsum path wherever the layer has dropout
        assert by_kind[("attention_fwd", 100)]["path"] == "its own einsum path (dropout)"
        assert by_kind[("attention_fwd", 0)]["path"] == "keras.ops.dot_product_attention"
    if framework == "jax":  # jax.nn's has no dropout: flax.linen's then
        assert by_kind[("attention_fwd", 100)]["function"] == "flax.linen.dot_product_attention"
        assert by_kind[("attention_fwd", 0)]["function"] == "jax.nn.dot_product_attention"


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_pooling_kernels_are_timed_with_the_networks_own_ops(framework):
    start = len(MATMULS) + len(TRANSFORMER)
    results = kernels_of(framework)[start:start + len(POOLING)]
    assert [r["spec"] for r in results] == [s.to_dict() for s in POOLING]
    for r in results:
        assert r["status"] == "ok", (r["spec"], r.get("reason"), r.get("traceback"))
        assert r["median_s"] >= 0 and len(r["times_s"]) >= 2, r
        assert POOLING_OP[framework][r["spec"]["shape"]["op"]] in r["settings"]["op"], r["settings"]
    if framework == "tensorflow":  # resnet50's 3x3 / 2 pad 1 max-pool: TensorFlow's SAME pads it so
        assert results[0]["settings"]["padding"] == "same"


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_batch_norm_kernels_are_timed_with_the_networks_own_op_in_training(framework):
    start = len(MATMULS) + len(TRANSFORMER) + len(POOLING)
    results = kernels_of(framework)[start:start + len(BATCH_NORM)]
    assert [r["spec"] for r in results] == [s.to_dict() for s in BATCH_NORM]
    for r in results:
        assert r["status"] == "ok", (r["spec"], r.get("reason"), r.get("traceback"))
        assert r["median_s"] >= 0 and len(r["times_s"]) >= 2, r
        assert BATCH_NORM_OP[framework] in r["settings"]["op"], r["settings"]


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_decoder_and_moe_kernels_run_with_the_frameworks_own_ops(framework):
    results = kernels_of(framework)[-len(DECODER):]
    assert [r["spec"] for r in results] == [s.to_dict() for s in DECODER]
    for r in results:
        assert r["status"] == "ok", (r["spec"], r.get("reason"), r.get("traceback"))
        assert r["median_s"] >= 0 and len(r["times_s"]) >= 2, r
        family = DECODER_FAMILIES.index(r["spec"]["kind"].rsplit("_", 1)[0])
        assert DECODER_OP[framework][family] in r["settings"]["op"], r["settings"]
    if framework == "torch":  # grouped attention in SDPA's CPU flash kernel, no repeated heads
        attention = [r for r in results if r["spec"]["kind"] == "grouped_attention_fwd"]
        assert attention[0]["settings"]["operator"] == "_scaled_dot_product_flash_attention_for_cpu"


@pytest.mark.parametrize("framework", sorted(IEEE_FLOAT32))
def test_dense_kernels_are_the_networks_own_layer(framework):
    results = kernels_of(framework)[-len(DECODER) - len(DENSE):-len(DECODER)]
    assert [r["spec"] for r in results] == [s.to_dict() for s in DENSE]
    for r in results:
        assert r["status"] == "ok", (r["spec"], r.get("reason"), r.get("traceback"))
        assert r["median_s"] >= 0 and len(r["times_s"]) >= 2, r
        assert DENSE_OP[framework] in r["settings"]["op"], r["settings"]
    # TensorFlow and MXNet compute a backward only with its forward: timed paired, the forward taken off
    paired = results[1].get("with_forward_median_s") is not None
    assert paired == (framework in ("tensorflow", "mxnet")), results[1]
