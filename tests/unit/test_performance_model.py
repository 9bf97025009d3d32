"""The performance model on cases computed by hand: kernel counts, a network's work, the roofline,
the data path, ring all-reduce and the WFBP / MG-WFBP schedules."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from dlbench.definitions.layers import network_model
from dlbench.definitions.loader import load_network
from dlbench.definitions.network import analyse
from dlbench.performance.communication import AllReduceCost, AllToAllCost, mgwfbp, schedule, wfbp, without_overlap
from dlbench.performance.kernels import OP_CLASS, KernelSpec
from dlbench.performance.model import (DataPath, FrameworkFacts, LayerTimes, PredictionError, collective_cost,
                                      gradient_layers,
                                      predict, roofline_time)
from dlbench.performance.workload import decompose, kernel_specs
from dlbench.store.profiles import BandwidthPoint, CommFit, KernelTime, MachineProfile, MatmulCeiling

NETWORKS = Path(__file__).resolve().parents[2] / "suites" / "networks"
GRAPH = FrameworkFacts(step="graph", schedule="none")  # a compiled step (what jax's runner.toml states)


def profile(**kw) -> MachineProfile:
    base = dict(machine_id="m" * 64, revision=1, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                dlbench={"version": "test"}, machine={"hostname": "box"}, device="cpu", threads=2,
                matmul_peak={"float32": MatmulCeiling(flops_per_s=1e9, framework="torch", kernel="k")},
                copy_bandwidth=[BandwidthPoint(bytes=1000, bytes_per_s=1e9, framework="torch")])
    base.update(kw)
    return MachineProfile(**base)


# ------------------------------------------------------------------ kernels

def test_kernel_counts_by_hand():
    mm = KernelSpec.of("matmul", m=2, n=3, k=4)
    assert mm.key == "matmul m=2 n=3 k=4 float32"
    assert (mm.flops, mm.bytes) == (48, 4 * (8 + 12 + 6))
    assert KernelSpec.of("matmul", "bfloat16", m=2, n=3, k=4).bytes == 2 * 26
    t = KernelSpec.of("transpose", rows=10, cols=20)
    assert (t.flops, t.bytes, t.memory_bound) == (0, 2 * 4 * 200, True)
    assert t.achieved(1.0) == 1600  # bytes/s for a memory-bound kind
    # 3x3 convolution, 2 -> 5 channels on 1 x 2 x 6 x 6, stride 1, pad 1: output 5 x 6 x 6
    conv = KernelSpec.of("conv2d_fwd", batch=1, channels=2, height=6, width=6, filters=5,
                         kh=3, kw=3, sh=1, sw=1, ph=1, pw=1)
    assert conv.flops == 2 * 9 * 2 * 5 * 36
    assert conv.bytes == 4 * (72 + 90 + 180)
    bwd = KernelSpec.of("conv2d_bwd", batch=1, channels=2, height=6, width=6, filters=5,
                        kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, input_grad=1)
    assert bwd.flops == 2 * conv.flops
    assert KernelSpec.from_dict(bwd.to_dict()) == bwd
    step = KernelSpec.of("lstm_step_fwd", batch=2, input=3, hidden=4)
    assert step.flops == 2 * (2 * 16 * 7 + 13 * 4)


def test_transformer_kernel_counts_by_hand():
    bmm = KernelSpec.of("batched_matmul", batch=3, m=2, n=5, k=4)
    assert bmm.key == "batched_matmul batch=3 m=2 n=5 k=4 float32" and not bmm.memory_bound
    assert (bmm.flops, bmm.bytes) == (3 * 2 * 2 * 5 * 4, 4 * 3 * (8 + 20 + 10))
    # 2 samples, 3 heads, 4 steps, head size 5: 24 score rows of 4; per head 2*T*T*S twice, 5 per score
    fwd = KernelSpec.of("attention_fwd", batch=2, heads=3, steps=4, head_size=5, causal=1, dropout=100)
    assert fwd.key == "attention_fwd batch=2 heads=3 steps=4 head_size=5 causal=1 dropout=100 float32"
    assert fwd.flops == 2 * 3 * (2 * (2 * 4 * 4 * 5) + 5 * 4 * 4)
    assert fwd.bytes == 4 * 4 * (2 * 3 * 4 * 5)  # q, k, v read, o written
    bwd = KernelSpec.of("attention_bwd", batch=2, heads=3, steps=4, head_size=5, causal=1, dropout=100)
    assert bwd.flops == 2 * 3 * (4 * (2 * 4 * 4 * 5) + 5 * 4 * 4) and bwd.bytes == 2 * fwd.bytes
    ln = KernelSpec.of("layer_norm_fwd", rows=6, dim=10)
    assert (ln.flops, ln.bytes, ln.memory_bound) == (300, 4 * (3 * 60 + 20), True)
    ln_bwd = KernelSpec.of("layer_norm_bwd", rows=6, dim=10, input_grad=1)
    assert (ln_bwd.flops, ln_bwd.bytes) == (480, 4 * (5 * 60 + 30))
    assert KernelSpec.of("layer_norm_bwd", rows=6, dim=10, input_grad=0).bytes == 4 * (3 * 60 + 30)
    gelu = KernelSpec.of("gelu_fwd", "bfloat16", elements=100, approximate=1)
    assert (gelu.flops, gelu.bytes) == (800, 2 * 2 * 100)
    assert KernelSpec.of("gelu_bwd", elements=100, approximate=0).flops == 1600
    # the harness times a backward that needs its forward both ways: the forward is the same shape
    assert KernelSpec.from_dict(dict(bwd.to_dict(), kind="attention_fwd")) == fwd


def test_decoder_and_moe_kernel_counts_by_hand():
    # RMS norm over 6 rows of 10: 4 FLOPs per element forward, 9 with the input's gradient, 3 without
    rms = KernelSpec.of("rms_norm_fwd", rows=6, dim=10)
    assert rms.key == "rms_norm_fwd rows=6 dim=10 float32" and rms.memory_bound
    assert (rms.flops, rms.bytes) == (240, 4 * (3 * 60 + 10))  # x twice, y; gamma
    assert (KernelSpec.of("rms_norm_bwd", rows=6, dim=10, input_grad=1).flops,
            KernelSpec.of("rms_norm_bwd", rows=6, dim=10, input_grad=1).bytes) == (540, 4 * (5 * 60 + 20))
    assert KernelSpec.of("rms_norm_bwd", "bfloat16", rows=6, dim=10, input_grad=0).bytes == 2 * (3 * 60 + 20)
    assert KernelSpec.of("rms_norm_bwd", rows=6, dim=10, input_grad=0).flops == 180
    # rotary on 2 samples x 4 steps of 3 query and 1 key head of 8: 2 * 4 * 4 * 8 = 256 rotated elements
    rot = KernelSpec.of("rotary_fwd", batch=2, steps=4, heads=3, kv_heads=1, head_size=8)
    assert (rot.flops, rot.bytes, rot.memory_bound) == (3 * 256, 4 * (2 * 256 + 4 * 8), True)
    assert KernelSpec.of("rotary_bwd", batch=2, steps=4, heads=3, kv_heads=1, head_size=8).flops == rot.flops
    # SwiGLU 3 -> 5 -> 3 over 2 rows: three products of 2 * 2 * 3 * 5 = 60, the gate 5 per hidden element
    mlp = KernelSpec.of("swiglu_fwd", rows=2, dim=3, hidden=5)
    assert (mlp.flops, mlp.bytes, mlp.memory_bound) == (3 * 60 + 5 * 10, 4 * (2 * 6 + 3 * 15), False)
    # backward: three weight gradients and the down product's input gradient (+ gate's and up's to x)
    assert KernelSpec.of("swiglu_bwd", rows=2, dim=3, hidden=5, input_grad=0).flops == 4 * 60 + 10 * 10
    full = KernelSpec.of("swiglu_bwd", rows=2, dim=3, hidden=5, input_grad=1)
    assert (full.flops, full.bytes) == (6 * 60 + 10 * 10, 4 * (3 * 6 + 6 * 15))
    # grouped attention: attention's counts over the 4 query heads; k and v moved for 2 heads only
    core = dict(batch=1, steps=3, head_size=2, causal=1)
    gqa = KernelSpec.of("grouped_attention_fwd", heads=4, kv_heads=2, **core)
    mha = KernelSpec.of("attention_fwd", heads=4, dropout=0, **core)
    assert gqa.flops == mha.flops == 4 * (2 * (2 * 3 * 3 * 2) + 5 * 3 * 3)
    assert gqa.bytes == 4 * (2 * 4 * 6 + 2 * 2 * 6) < mha.bytes
    gqa_bwd = KernelSpec.of("grouped_attention_bwd", heads=4, kv_heads=2, **core)
    assert gqa_bwd.flops == KernelSpec.of("attention_bwd", heads=4, dropout=0, **core).flops
    assert gqa_bwd.bytes == 2 * gqa.bytes and OP_CLASS["grouped_attention_bwd"] == "attention"
    # the router: 3 tokens of 4 over 8 experts, top 2
    router = KernelSpec.of("moe_router_fwd", rows=3, dim=4, experts=8, top_k=2)
    assert router.flops == 2 * 3 * 4 * 8 + 5 * 24 + 3 * 2  # logits, softmax, renormalised choices
    assert router.bytes == 4 * (12 + 32 + 2 * 6)
    router_bwd = KernelSpec.of("moe_router_bwd", rows=3, dim=4, experts=8, top_k=2)
    assert (router_bwd.flops, router_bwd.bytes) == (2 * 192 + 5 * 24, 4 * (2 * 12 + 6 + 2 * 32))
    # the experts: 4 tokens, top 2 of 2 experts: 8 routed rows through a SwiGLU 3 -> 5 -> 3
    experts = KernelSpec.of("moe_experts_fwd", tokens=4, dim=3, hidden=5, experts=2, top_k=2)
    routed = KernelSpec.of("swiglu_fwd", rows=8, dim=3, hidden=5)
    assert experts.flops == routed.flops + 2 * 8 * 3  # and the weighted sum of each token's 2 outputs
    assert experts.bytes == 4 * (2 * 12 + 3 * 2 * 15 + 2 * 8)
    experts_bwd = KernelSpec.of("moe_experts_bwd", tokens=4, dim=3, hidden=5, experts=2, top_k=2)
    assert experts_bwd.flops == KernelSpec.of("swiglu_bwd", rows=8, dim=3, hidden=5, input_grad=1).flops + 48
    assert {OP_CLASS[k] for k in ("swiglu_fwd", "moe_router_fwd", "moe_experts_bwd")} == {"matmul"}
    with pytest.raises(ValueError, match="takes rows, dim, experts, top_k"):
        KernelSpec.of("moe_router_fwd", rows=3, dim=4, experts=8)


def test_pooling_kernel_counts_by_hand():
    # a 3x3 max-pool, stride 2, pad 1 over 2 x 3 x 7 x 7: output 3 x 4 x 4 (floor((7 + 2 - 3) / 2) + 1)
    window = dict(batch=2, channels=3, height=7, width=7, kh=3, kw=3, sh=2, sw=2, ph=1, pw=1)
    fwd = KernelSpec.of("pool2d_fwd", op=0, **window)
    assert fwd.key == "pool2d_fwd batch=2 channels=3 height=7 width=7 kh=3 kw=3 sh=2 sw=2 ph=1 pw=1 op=0 float32"
    assert (fwd.pool_op, fwd.memory_bound, fwd.unit) == ("max", True, "B/s")
    assert (fwd.flops, fwd.bytes) == (9 * 2 * 3 * 16, 4 * (2 * 3 * 49 + 2 * 3 * 16))  # x read, y written
    bwd = KernelSpec.of("pool2d_bwd", "bfloat16", op=1, **window)
    assert bwd.pool_op == "avg"
    assert (bwd.flops, bwd.bytes) == (2 * 3 * 49, 2 * (2 * 3 * 16 + 2 * 2 * 3 * 49))  # dy read, dx cleared, written
    # the global mean: the window of the whole map, one FLOP per input element
    mean = KernelSpec.of("pool2d_fwd", batch=2, channels=3, height=7, width=7, kh=7, kw=7, sh=1, sw=1, ph=0, pw=0, op=2)
    assert (mean.pool_op, mean.flops, mean.bytes) == ("global", 2 * 3 * 49, 4 * (2 * 3 * 49 + 2 * 3))
    assert KernelSpec.from_dict(mean.to_dict()) == mean


def test_batch_norm_kernel_counts_by_hand():
    # 2 samples of 3 channels over 4 x 5: 120 elements, 5 FLOPs each forward, 8 backward (a layer norm's)
    fwd = KernelSpec.of("batch_norm_fwd", batch=2, channels=3, height=4, width=5)
    assert fwd.key == "batch_norm_fwd batch=2 channels=3 height=4 width=5 float32"
    assert (fwd.flops, fwd.memory_bound) == (600, True)
    assert fwd.bytes == 4 * (3 * 120 + 6 * 3)  # x twice, y; gamma, beta, the running statistics in and out
    bwd = KernelSpec.of("batch_norm_bwd", "bfloat16", batch=2, channels=3, height=4, width=5, input_grad=1)
    assert (bwd.flops, bwd.bytes) == (960, 2 * (5 * 120 + 3 * 3))  # x, dy twice, dx; gamma, dgamma, dbeta
    params_only = KernelSpec.of("batch_norm_bwd", batch=2, channels=3, height=4, width=5, input_grad=0)
    assert (params_only.flops, params_only.bytes) == (480, 4 * (3 * 120 + 3 * 3))
    assert KernelSpec.from_dict(bwd.to_dict()) == bwd


def test_kernel_spec_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="unknown kernel kind"):
        KernelSpec.of("fft", n=4)
    with pytest.raises(ValueError, match="matmul takes m, n, k"):
        KernelSpec.of("matmul", m=1, n=2)
    with pytest.raises(ValueError, match="unknown dtype"):
        KernelSpec.of("copy", "int8", elements=4)


# ------------------------------------------------------------------ workload

def tiny(layers, shape=(4,), classes=3):
    return analyse(network_model().model_validate({"name": "tiny", "input": {"kind": "tensor", "shape": list(shape),
                                                                             "classes": classes}, "layers": layers}))


@pytest.mark.parametrize("name", ["fcn5", "alexnet", "alexnet_r", "resnet56", "resnet50", "lstm32"])
def test_work_adds_up_to_the_descriptions_counts(name):
    summary = load_network(NETWORKS / f"{name}.yaml")
    work = decompose(summary.resolved, 4, "train")
    assert work.params == summary.params
    layer_flops = sum(op.flops * op.repeat for l in work.layers if l.index < len(summary.resolved["layers"])
                      for op in l.forward)
    # the forward counts of analysis.py, up to the bias of a dense layer counted once per output
    assert layer_flops == pytest.approx(4 * summary.flops_per_sample, rel=0.01)


def products_per_sample(t: int, d: int, blocks: int, ratio: int = 4) -> int:
    """A transformer's matmul FLOPs per sample by hand: per block the four D x D projections, the
    scores and the weighted sum (2*T*T*D each over all heads) and the MLP's two D x rD products."""
    return blocks * (4 * 2 * t * d * d + 2 * 2 * t * t * d + 2 * 2 * t * d * ratio * d)


@pytest.mark.parametrize("name,products", [
    ("transformer_tiny", products_per_sample(32, 64, 2) + 2 * 32 * 64 * 512),  # + the tied head
    ("vit_b16", 2 * 16 * 16 * 3 * 768 * 196 + products_per_sample(197, 768, 12) + 2 * 768 * 1000),
    ("gpt2_small", products_per_sample(1024, 768, 12) + 2 * 1024 * 768 * 50257),
])
def test_transformer_work_adds_up_to_the_descriptions_counts(name, products):
    summary = load_network(NETWORKS / f"{name}.yaml")
    infer, train = (decompose(summary.resolved, 2, mode) for mode in ("infer", "train"))
    assert train.params == summary.params  # a tied head's weight counted once, in the embedding
    forward = sum(op.flops * op.repeat for l in infer.layers for op in l.forward)
    # the analysis' count; only the patch convolution's bias, fused into its kernel, is not counted
    assert forward == pytest.approx(2 * summary.flops_per_sample, rel=1e-4)
    # the products exactly (what torch's FlopCounterMode counts): matmul and convolution kernels and
    # attention's two batched products, the `batched_matmul` parts of its fused `attention_fwd` kernel
    matmuls = sum(op.flops for l in infer.layers for op in l.forward
                  if op.kernel is not None and op.kernel.kind in ("matmul", "conv2d_fwd"))
    attention = [op for l in infer.layers for op in l.forward if op.kernel is not None
                 and op.kernel.kind == "attention_fwd"]
    batched = [p for op in attention for p in op.parts if p.kernel is not None and p.kernel.kind == "batched_matmul"]
    assert len(batched) == 2 * len(attention) > 0
    assert matmuls + sum(p.flops for p in batched) == 2 * products
    # the fused kernel's FLOPs are its parts' (the products and the softmax)
    assert all(op.flops == sum(p.flops for p in op.parts) for op in attention)
    # a training step's backward is about twice its forward; the model predicts it without a crash
    train_forward = sum(op.flops for l in train.layers[:-1] for op in l.forward)
    train_backward = sum(op.flops for l in train.layers[:-1] for op in l.backward)
    assert 1.9 < train_backward / train_forward < 2.1
    prediction = predict(train, "torch", profile())
    assert prediction.iteration_s > 0 and prediction.forward_s < prediction.backward_s


def test_a_transformer_blocks_operations():
    work = decompose(load_network(NETWORKS / "transformer_tiny.yaml").resolved, 2, "train")
    block = work.layers[3]
    assert block.label == "003 transformer_block" and block.params == 49_984
    kernels = [op.kernel.key for op in block.forward if op.kernel is not None]
    # batch 2 x 32 tokens, width 64, 4 causal heads of 16, dropout 0.1 on the probabilities in training
    core = "batch=2 heads=4 steps=32 head_size=16 causal=1 dropout=100 float32"
    assert kernels == ["layer_norm_fwd rows=64 dim=64 float32"] + ["matmul m=64 n=64 k=64 float32"] * 3 + [
        f"attention_fwd {core}", "matmul m=64 n=64 k=64 float32", "layer_norm_fwd rows=64 dim=64 float32",
        "matmul m=64 n=256 k=64 float32", "gelu_fwd elements=16384 approximate=1 float32",
        "matmul m=64 n=64 k=256 float32"]
    labels = [op.label for op in block.forward]
    assert labels.index("ln1 layer norm") < labels.index("attn q matmul") < labels.index("attn attention") \
        < labels.index("attn out matmul") < labels.index("attn join") < labels.index("ln2 layer norm") \
        < labels.index("mlp gelu") < labels.index("mlp join")
    assert "mlp branch dropout" in labels  # rate 0.1, training
    attention = block.forward[labels.index("attn attention")]
    # unfused: 8 (batch x heads) products of 32 x 16 by 16 x 32, the softmax, its dropout, 32 x 32 by 32 x 16
    assert [(p.label, p.kernel.key if p.kernel else None) for p in attention.parts] == [
        ("attn scores q k^T", "batched_matmul batch=8 m=32 n=32 k=16 float32"), ("attn softmax", None),
        ("attn attention dropout", None), ("attn weighted sum p v", "batched_matmul batch=8 m=32 n=16 k=32 float32")]
    back = [op.label for op in block.backward]
    assert {"attn q backward", "mlp fc2 backward", "attn attention", "attn join gradient"} <= set(back)
    # a projection's backward is the framework's dense layer backward over the (batch, steps) sequence,
    # made of its GEMMs where that was not measured
    q = block.backward[back.index("attn q backward")]
    assert q.kernel.key == "dense_bwd batch=2 positions=32 inputs=64 units=64 bias=1 input_grad=1 float32"
    assert [p.label for p in q.parts] == ["attn q input gradient", "attn q weight gradient", "attn q bias gradient"]
    assert q.flops == sum(p.flops for p in q.parts)
    gradients = block.backward[back.index("attn attention")]
    assert gradients.kernel.key == f"attention_bwd {core}"
    assert [p.kernel.key for p in gradients.parts if p.kernel] == [
        "batched_matmul batch=8 m=32 n=32 k=16 float32"] + ["batched_matmul batch=8 m=32 n=16 k=32 float32"] * 3
    assert gradients.flops == 2 * attention.flops - 5 * 2 * 4 * 32 * 32  # twice the products, one softmax
    assert {op.kernel.key for op in block.backward if op.kernel and op.kernel.kind != "dense_bwd"} == {
        f"attention_bwd {core}", "layer_norm_bwd rows=64 dim=64 input_grad=1 float32",
        "gelu_bwd elements=16384 approximate=1 float32"}
    head = work.layers[6]  # tied: no parameters of its own, but its weight gradient is computed
    assert head.label == "006 lm_head" and head.params == 0 and not head.update
    assert [op.label for op in head.backward] == ["backward", "tied gradient sum"]
    assert [op.label for op in head.backward[0].parts] == ["input gradient", "weight gradient"]
    assert work.layers[0].update[0].kernel["elements"] == 512 * 64  # the table's update, once
    infer = decompose(load_network(NETWORKS / "transformer_tiny.yaml").resolved, 2, "infer")
    assert not any("dropout" in op.label for l in infer.layers for op in l.forward)
    inferred = next(op for op in infer.layers[3].forward if op.label == "attn attention")
    assert inferred.kernel["dropout"] == 0 and not any("dropout" in p.label for p in inferred.parts)


def test_pooling_layers_are_pool_kernels_with_the_descriptions_counts():
    summary = load_network(NETWORKS / "alexnet_r.yaml")
    work = decompose(summary.resolved, 64, "train")
    pools = [(op.label, op.kernel.key) for l in work.layers for op in l.forward + l.backward
             if op.kernel is not None and op.kernel.kind.startswith("pool2d")]
    window = "kh=3 kw=3 sh=2 sw=2 ph=0 pw=0"
    assert pools == [
        ("max_pool", f"pool2d_fwd batch=64 channels=32 height=32 width=32 {window} op=0 float32"),
        ("max_pool", f"pool2d_bwd batch=64 channels=32 height=32 width=32 {window} op=0 float32"),
        ("max_pool", f"pool2d_fwd batch=64 channels=32 height=15 width=15 {window} op=0 float32"),
        ("max_pool", f"pool2d_bwd batch=64 channels=32 height=15 width=15 {window} op=0 float32"),
        ("avg_pool", f"pool2d_fwd batch=64 channels=64 height=7 width=7 {window} op=1 float32"),
        ("avg_pool", f"pool2d_bwd batch=64 channels=64 height=7 width=7 {window} op=1 float32")]
    # the description's forward FLOPs: kh x kw per output element (network.py); the kernels suite's
    # layer shapes (kernel_specs) hold them
    assert work.layers[1].forward[0].flops == 64 * 9 * 32 * 15 * 15
    assert {op.kernel.key for op in work.layers[1].forward + work.layers[1].backward} <= {
        k.key for k in kernel_specs(work)}
    resnet = decompose(load_network(NETWORKS / "resnet56.yaml").resolved, 8, "infer")
    mean = next(op.kernel for l in resnet.layers for op in l.forward if l.label.endswith("global_avg_pool"))
    assert mean.key == "pool2d_fwd batch=8 channels=64 height=8 width=8 kh=8 kw=8 sh=1 sw=1 ph=0 pw=0 op=2 float32"
    assert mean.flops == 8 * 64 * 64  # one per input element, as the description counts a global average


def test_first_layer_computes_no_input_gradient():
    work = decompose(tiny([{"type": "dense", "units": 5}, {"type": "relu"}, {"type": "dense", "units": 3}]).resolved,
                     2, "train")
    first, relu, last = work.layers[:3]
    assert [op.label for op in first.backward] == ["backward"]
    assert first.backward[0].kernel.key == "dense_bwd batch=2 positions=1 inputs=4 units=5 bias=1 input_grad=0 float32"
    assert [op.label for op in first.backward[0].parts] == ["weight gradient", "bias gradient"]
    assert [op.label for op in last.backward[0].parts] == ["input gradient", "weight gradient", "bias gradient"]
    assert last.backward[0].parts[0].kernel.key == "matmul m=2 n=5 k=3 float32"  # dX = dY (2x3) W (3x5)
    assert relu.backward and relu.params == 0
    assert work.layers[-1].label.startswith("loss")


def test_inference_is_forward_only():
    work = decompose(load_network(NETWORKS / "resnet56.yaml").resolved, 8, "infer")
    assert all(not l.backward and not l.update for l in work.layers)
    assert not any(l.label.startswith("loss") for l in work.layers)
    first_conv = work.layers[0].forward[0].kernel
    assert first_conv.kind == "conv2d_fwd" and first_conv["batch"] == 8


def test_a_training_batch_norm_is_its_kernel_or_else_its_passes():
    net = load_network(NETWORKS / "resnet56.yaml").resolved
    train = decompose(net, 8, "train")
    block = next(l for l in train.layers if "residual" in l.label)
    bn = next(op for op in block.forward if op.label == "bn1 batch norm")
    key = "batch_norm_fwd batch=8 channels=16 height=32 width=32 float32"
    assert bn.kernel.key == key and not bn.epilogue
    (passes,) = bn.parts  # x read twice, y written
    assert (passes.kernel, passes.bytes) == (None, 3 * 4 * 8 * 16 * 32 * 32)
    bwd = next(op for op in block.backward if op.label == "bn1 batch norm")
    assert bwd.kernel.key == "batch_norm_bwd batch=8 channels=16 height=32 width=32 input_grad=1 float32"
    assert bwd.parts[0].bytes == 5 * 4 * 8 * 16 * 32 * 32
    assert {key, bwd.kernel.key} <= {s.key for s in kernel_specs(train)}  # what the kernels suite times
    # at inference the statistics are constants: a scale and shift a graph optimiser fuses, no kernel
    infer = decompose(net, 8, "infer")
    folded = next(op for l in infer.layers if "residual" in l.label for op in l.forward if "batch norm" in op.label)
    assert (folded.kernel, folded.epilogue, folded.bytes) == (None, True, 2 * 4 * 8 * 16 * 32 * 32)
    # unmeasured: its passes at the ceilings (and their call: torch is eager); measured: its time
    ceilings = profile(dispatch_s={"torch": 1e-5})

    def first_block(kernels):
        p = predict(train, "torch", profile(dispatch_s={"torch": 1e-5}, kernels={"torch": {
            k: KernelTime(median_s=t, run_id="r") for k, t in kernels.items()}}))
        return p.layers[block.index], p.unmeasured

    unmeasured_time, unmeasured = first_block({})
    assert key in unmeasured
    measured_time, unmeasured = first_block({key: 5e-3})
    assert key not in unmeasured
    same_shape = [op for op in block.forward if op.kernel is not None and op.kernel.key == key]  # bn1 and bn2
    assert len(same_shape) == 2
    assert measured_time.forward_s - unmeasured_time.forward_s == pytest.approx(
        2 * (5e-3 - (roofline_time(passes, ceilings, "torch") + 1e-5)))


def test_dense_kernel_counts_by_hand():
    """A dense layer 4 -> 3 over 2 samples of 5 positions (10 rows): forward 2*10*4*3 + 30 bias FLOPs;
    backward the weight gradient (4, 3, 10) and the input gradient (10, 4, 3), each 240 FLOPs, and
    the bias gradient's 30; bytes x 40 + W 12 + b 3 + y 30 (forward), x 40 + dy 30 + W 12 + dW 12 +
    db 3 + dx 40 (backward)."""
    fwd = KernelSpec.of("dense_fwd", batch=2, positions=5, inputs=4, units=3, bias=1)
    assert (fwd.flops, fwd.bytes) == (240 + 30, 4 * (40 + 12 + 3 + 30))
    bwd = KernelSpec.of("dense_bwd", batch=2, positions=5, inputs=4, units=3, bias=1, input_grad=1)
    assert bwd.dense_products() == [(4, 3, 10), (10, 4, 3)]
    assert (bwd.flops, bwd.bytes) == (2 * 240 + 30, 4 * (40 + 30 + 12 + 12 + 3 + 40))
    first = KernelSpec.of("dense_bwd", batch=2, positions=5, inputs=4, units=3, bias=0, input_grad=0)
    assert (first.flops, first.bytes) == (240, 4 * (40 + 30 + 24))
    assert KernelSpec.from_dict(bwd.to_dict()) == bwd
    assert OP_CLASS["dense_bwd"] == "matmul"  # a datasheet divides its FLOPs by the matmul efficiency


def test_a_dense_backward_is_its_layer_kernel_or_else_its_gemms():
    """LSTM-32's classifier at batch 4: the backward over the (4, 32, 256) sequence is one dense_bwd
    kernel (positions 32), made of the input- and weight-gradient GEMMs of 128 rows and the bias
    gradient; unmeasured and with no class probed, it is predicted as those parts were (unchanged
    for older profiles), measured it takes its own time, in a compiled step less its call."""
    work = decompose(load_network(NETWORKS / "lstm32.yaml").resolved, 4, "train")
    dense = next(l for l in work.layers if l.label.endswith("dense"))
    (bwd,) = dense.backward
    key = "dense_bwd batch=4 positions=32 inputs=256 units=10000 bias=1 input_grad=1 float32"
    assert bwd.kernel.key == key
    assert [p.kernel.key if p.kernel else p.label for p in bwd.parts] == [
        "matmul m=128 n=256 k=10000 float32", "matmul m=256 n=10000 k=128 float32", "bias gradient"]
    assert key in {s.key for s in kernel_specs(work)}  # what the kernels suite times
    gemms = {"matmul m=128 n=256 k=10000 float32": 4e-3, "matmul m=256 n=10000 k=128 float32": 5e-3}

    def backward(kernels, framework="torch", facts=None):
        prof = profile(dispatch_s={framework: 1e-5}, kernels={framework: {
            k: KernelTime(median_s=t, run_id="r") for k, t in kernels.items()}})
        p = predict(work, framework, prof, facts=facts)
        return next(l for l in p.layers if l.index == dense.index), p.unmeasured

    by_parts, unmeasured = backward(gemms)
    bias = roofline_time(bwd.parts[2], profile(dispatch_s={"torch": 1e-5}), "torch") + 1e-5
    assert by_parts.backward_s == pytest.approx(4e-3 + 5e-3 + bias)
    # its parts measured, the layer's kernel is not listed as unmeasured (as any kernel made of parts)
    assert key not in unmeasured and by_parts.sources["shape"] == pytest.approx(9e-3)
    assert key in backward({})[1]
    measured, unmeasured = backward({**gemms, key: 2e-2})
    assert key not in unmeasured
    assert measured.backward_s == pytest.approx(2e-2) and measured.measured_s == pytest.approx(2e-2)
    compiled, _ = backward({key: 2.0}, "jax", GRAPH)  # over its roofline, 1.31 GFLOP at 1 GFLOP/s
    assert compiled.backward_s == pytest.approx(2.0 - 1e-5)


def test_an_lstm_layer_is_its_fused_layer_or_else_its_steps():
    work = decompose(load_network(NETWORKS / "lstm32.yaml").resolved, 4, "train")
    lstm = next(l for l in work.layers if "lstm" in l.label)
    assert [(op.kernel.key, [(k.key, n) for k, n in op.alternatives]) for op in lstm.forward] == [
        ("lstm_layer_fwd batch=4 steps=32 input=256 hidden=256 float32",
         [("lstm_step_fwd batch=4 input=256 hidden=256 float32", 32)])] * 2
    assert {op.kernel.kind for op in lstm.backward} == {"lstm_layer_bwd"}
    specs = kernel_specs(work)
    assert len({s.key for s in specs}) == len(specs)
    assert {"lstm_step_fwd", "lstm_step_bwd", "lstm_layer_fwd", "lstm_layer_bwd"} <= {s.kind for s in specs}
    layer = KernelSpec.of("lstm_layer_fwd", batch=4, steps=32, input=256, hidden=256)
    assert layer.flops == 32 * KernelSpec.of("lstm_step_fwd", batch=4, input=256, hidden=256).flops
    # the layer measured: its time; only the step measured: 32 steps of it (twice: two stacked layers)
    net = load_network(NETWORKS / "lstm32.yaml").resolved
    infer = decompose(net, 4, "infer")
    step_only = profile(kernels={"torch": {"lstm_step_fwd batch=4 input=256 hidden=256 float32":
                                           KernelTime(median_s=1e-4, run_id="r")}})
    fused = profile(kernels={"torch": {"lstm_layer_fwd batch=4 steps=32 input=256 hidden=256 float32":
                                       KernelTime(median_s=1e-3, run_id="r")}})
    by_step = next(l for l in predict(infer, "torch", step_only).layers if "lstm" in l.label)
    by_layer = next(l for l in predict(infer, "torch", fused).layers if "lstm" in l.label)
    assert by_step.forward_s == pytest.approx(2 * 32 * 1e-4) and by_layer.forward_s == pytest.approx(2 * 1e-3)


def test_attention_is_its_fused_kernel_or_else_its_parts():
    net = load_network(NETWORKS / "transformer_tiny.yaml").resolved
    work = decompose(net, 2, "infer")
    key = "attention_fwd batch=2 heads=4 steps=32 head_size=16 causal=1 dropout=0 float32"
    scores, weighted = ("batched_matmul batch=8 m=32 n=32 k=16 float32", "batched_matmul batch=8 m=32 n=16 k=32 float32")
    assert {key, scores, weighted} <= {s.key for s in kernel_specs(work)}  # what the kernels suite times

    def attention_time(kernels):
        p = predict(work, "torch", profile(dispatch_s={"torch": 1e-5},
                                          kernels={"torch": {k: KernelTime(median_s=t, run_id="r")
                                                             for k, t in kernels.items()}}))
        return p.layers[3], p.unmeasured

    nothing, unmeasured = attention_time({})
    assert key in unmeasured and scores in unmeasured
    fused, unmeasured = attention_time({key: 1e-3})
    assert key not in unmeasured and scores not in unmeasured
    # the fused kernel stands for its parts: 1 ms in the first block instead of the products and the softmax
    parts_alone = nothing.forward_s - sum(
        roofline_time(p, profile(dispatch_s={"torch": 1e-5}), "torch") + 1e-5 for op in work.layers[3].forward
        if op.label == "attn attention" for p in op.parts)
    assert fused.forward_s == pytest.approx(parts_alone + 1e-3)
    # only the products measured: they and the softmax's roofline (with its call: torch is eager)
    composed, unmeasured = attention_time({scores: 2e-4, weighted: 3e-4})
    assert key not in unmeasured and scores not in unmeasured
    softmax = next(p for op in work.layers[3].forward if op.label == "attn attention" for p in op.parts
                   if p.label == "attn softmax")
    assert composed.forward_s == pytest.approx(
        parts_alone + (2e-4 + 3e-4 + roofline_time(softmax, profile(dispatch_s={"torch": 1e-5}), "torch") + 1e-5))
    assert composed.measured_s == pytest.approx(fused.measured_s - 1e-3 + 5e-4)


# ------------------------------------------------------------------ roofline and phases

def test_single_worker_prediction_by_hand():
    """One dense layer 4 -> 3 at batch 2; peak 1 GFLOP/s, bandwidth 1 GB/s, forward matmul measured 1 ms.

    forward:  matmul (measured) 1e-3; bias over 2x3 outputs: 6 FLOPs, 24 B -> 24 ns;
              loss over 6 logits: 30 FLOPs, 72 B -> 72 ns
    backward: weight gradient matmul (4, 3, 2): 48 FLOPs, 4*(8+6+12) = 104 B -> 104 ns (memory bound);
              bias gradient 24 B -> 24 ns; loss 12 FLOPs, 48 B -> 48 ns
    update:   15 parameters x 5 passes x 4 B = 300 B -> 300 ns
    """
    net = tiny([{"type": "dense", "units": 3}])
    prof = profile(kernels={"torch": {"matmul m=2 n=3 k=4 float32": KernelTime(median_s=1e-3, run_id="r")}})
    p = predict(decompose(net.resolved, 2, "train"), "torch", prof)
    assert p.forward_s == pytest.approx(1e-3 + 24e-9 + 72e-9)
    assert p.backward_s == pytest.approx(104e-9 + 24e-9 + 48e-9)
    assert p.update_s == pytest.approx(300e-9)
    assert p.iteration_s == pytest.approx(p.forward_s + p.backward_s + p.update_s)
    # the layer's backward kernel was not measured, nor its weight-gradient part: both are unmeasured
    assert sorted(p.unmeasured) == ["dense_bwd batch=2 positions=1 inputs=4 units=3 bias=1 input_grad=0 float32",
                                    "matmul m=4 n=3 k=2 float32", "sgd_momentum elements=15 float32",
                                    "softmax_xent_bwd rows=2 classes=3 float32",
                                    "softmax_xent_fwd rows=2 classes=3 float32"]
    assert p.measured_share == pytest.approx(1e-3 / p.iteration_s)
    # another framework has no measured kernels: the forward matmul is a roofline too (104 B); an
    # eager framework pays its smallest-operation time (1 us) on each of the 3 forward operations
    q = predict(decompose(net.resolved, 2, "train"), "eager_fw", prof.model_copy(update={"dispatch_s": {"eager_fw": 1e-6}}))
    assert q.forward_s == pytest.approx(104e-9 + 24e-9 + 72e-9 + 3e-6) and q.step_call_s == 0
    assert any("no kernel times or class probes of eager_fw" in n for n in q.notes)


def test_a_step_that_fuses_epilogues_charges_them_nothing():
    """dense 4 -> 3 (matmul, bias), sigmoid, dense 3 -> 3 at batch 2, inference, all at the ceilings
    (1 GFLOP/s, 1 GB/s): fused, the bias and the sigmoid after the first matmul (across the layer
    boundary) and the bias after the second cost nothing; the loss, which is no epilogue, stays.
    Training's batch norm is no epilogue (it reduces over the batch first), inference's is; the
    option-A shortcut of a residual block comes before its convolutions, so that the join and the
    ReLU after the last one are fused at inference."""
    net = tiny([{"type": "dense", "units": 3}, {"type": "sigmoid"}, {"type": "dense", "units": 3}])
    work = decompose(net.resolved, 2, "infer")
    separate = predict(work, "tf", profile(), facts=GRAPH)
    fused = predict(work, "tf", profile(), facts=FrameworkFacts("graph", "none", "fused"))
    labels = [op.label for layer in work.layers for op in layer.forward]
    assert labels[:5] == ["matmul", "bias", "sigmoid", "matmul", "bias"]
    # bias 6 FLOPs 24 B -> 24 ns, sigmoid 2 passes of 6 values -> 48 ns, second bias 24 ns
    assert separate.forward_s - fused.forward_s == pytest.approx(24e-9 + 48e-9 + 24e-9)
    assert any("3 element-wise operations of the forward run fused" in n for n in fused.notes)
    assert not any("fused" in n for n in separate.notes)
    from dlbench.performance.model import fused_epilogues

    resnet = load_network(ROOT / "suites" / "networks" / "resnet56.yaml").resolved
    for mode, expected in (("infer", ["bn1 batch norm", "relu1", "bn2 batch norm", "join", "relu"]), ("train", [])):
        work = decompose(resnet, 2, mode)
        block = next(layer for layer in work.layers if layer.label.endswith("residual basic 32/2"))
        fused = fused_epilogues(work)
        assert block.forward[0].label == "option-A shortcut"
        assert [op.label for op in block.forward if id(op) in fused] == expected


def test_a_compiled_step_pays_the_call_once():
    """jax runs its step as one call: the smallest-operation time (1 us) once per iteration; a kernel
    timed on its own paid one call too, which is taken off (1 ms - 1 us), and roofline operations pay none."""
    net = tiny([{"type": "dense", "units": 3}])
    prof = profile(kernels={"jax": {"matmul m=2 n=3 k=4 float32": KernelTime(median_s=1e-3, run_id="r")}},
                   dispatch_s={"jax": 1e-6})
    p = predict(decompose(net.resolved, 2, "train"), "jax", prof, facts=GRAPH)
    assert p.step_call_s == 1e-6
    assert p.forward_s == pytest.approx(1e-3 - 1e-6 + 24e-9 + 72e-9)
    assert p.backward_s == pytest.approx(104e-9 + 24e-9 + 48e-9)
    assert p.iteration_s == pytest.approx(1e-6 + p.forward_s + p.backward_s + p.update_s)
    # never below the kernel's roofline: a call that took no longer than the call itself
    fast = prof.model_copy(update={"kernels": {"jax": {"matmul m=2 n=3 k=4 float32": KernelTime(median_s=1e-6,
                                                                                                  run_id="r")}}})
    assert predict(decompose(net.resolved, 2, "train"), "jax", fast, facts=GRAPH).forward_s == pytest.approx(
        104e-9 + 24e-9 + 72e-9)


def test_a_kernel_timed_cold_loses_the_cold_call_compiled_and_what_the_flush_added_eager():
    """Timed cold, a kernel's call also found the framework's code and data evicted: a compiled step
    takes off the smallest operation timed cold (0.5 ms), not warm (1 us); an eager step, which
    calls every operation with its framework hot, takes off what the flush added to the call
    (0.5 ms - 1 us) and keeps the warm call; a warm kernel loses the warm call compiled, nothing eager."""
    net = tiny([{"type": "dense", "units": 3}])
    key = "matmul m=2 n=3 k=4 float32"
    cold = {key: KernelTime(median_s=2e-3, run_id="r", cache="cold")}
    prof = profile(dispatch_s={"jax": 1e-6, "torch": 1e-6}, dispatch_cold_s={"jax": 5e-4, "torch": 5e-4},
                   kernels={"jax": cold, "torch": cold})
    elementwise = 24e-9 + 72e-9  # the bias and the loss's roofline (none of them measured)
    assert predict(decompose(net.resolved, 2, "train"), "jax", prof, facts=GRAPH).forward_s == pytest.approx(
        2e-3 - 5e-4 + elementwise)
    assert predict(decompose(net.resolved, 2, "train"), "torch", prof).forward_s == pytest.approx(
        2e-3 - (5e-4 - 1e-6) + elementwise + 2 * 1e-6)  # the roofline operations pay torch's warm call each
    warm = prof.model_copy(update={"kernels": {"jax": {key: KernelTime(median_s=2e-3, run_id="r", cache="warm")},
                                               "torch": {key: KernelTime(median_s=2e-3, run_id="r", cache="warm")}}})
    assert predict(decompose(net.resolved, 2, "train"), "jax", warm, facts=GRAPH).forward_s == pytest.approx(
        2e-3 - 1e-6 + elementwise)
    assert predict(decompose(net.resolved, 2, "train"), "torch", warm).forward_s == pytest.approx(
        2e-3 + elementwise + 2 * 1e-6)
    # never below the roofline plus the warm call: a cold kernel that was nearly all flush
    flushed = prof.model_copy(update={"kernels": {"torch": {key: KernelTime(median_s=5e-4, run_id="r",
                                                                             cache="cold")}}})
    matmul_roofline = 4 * (8 + 12 + 6) / 1e9  # its bytes at the test profile's 1 GB/s (above its FLOPs at 1 GFLOP/s)
    assert 5e-4 - (5e-4 - 1e-6) < matmul_roofline + 1e-6
    assert predict(decompose(net.resolved, 2, "train"), "torch", flushed).forward_s == pytest.approx(
        matmul_roofline + 1e-6 + elementwise + 2 * 1e-6)
    # a profile without a cold call (made before it was measured) takes off the warm one
    older = prof.model_copy(update={"dispatch_cold_s": {}})
    assert predict(decompose(net.resolved, 2, "train"), "jax", older, facts=GRAPH).forward_s == pytest.approx(
        2e-3 - 1e-6 + elementwise)
    assert predict(decompose(net.resolved, 2, "train"), "torch", older).forward_s == pytest.approx(
        2e-3 + elementwise + 2 * 1e-6)


def test_bandwidth_follows_the_working_set():
    prof = profile(copy_bandwidth=[BandwidthPoint(bytes=1000, bytes_per_s=4e9, framework="t"),
                                   BandwidthPoint(bytes=100000, bytes_per_s=2e9, framework="t")])
    assert prof.bandwidth(10) == 4e9
    assert prof.bandwidth(10000) == pytest.approx(3e9)  # halfway in log(bytes)
    assert prof.bandwidth(1e9) == 2e9


def test_a_frameworks_own_elementwise_bandwidth_comes_first():
    prof = profile(elementwise_bandwidth={"jax": [BandwidthPoint(bytes=1000, bytes_per_s=5e8, framework="jax")]})
    assert prof.bandwidth(24, "jax") == 5e8 and prof.bandwidth(24, "torch") == 1e9 and prof.bandwidth(24) == 1e9
    net = tiny([{"type": "dense", "units": 3}])
    p = predict(decompose(net.resolved, 2, "train"), "jax", prof, facts=GRAPH)
    assert p.update_s == pytest.approx(300 / 5e8)  # 15 parameters x 5 passes x 4 B, at jax's 0.5 GB/s


def test_data_path_is_hidden_by_prefetching_only_up_to_the_computation():
    path = DataPath(bytes_per_sample=1000, read_bytes_per_s=1e6, h2d_bytes_per_s=4e6)
    assert path.times(10) == (pytest.approx(0.01), pytest.approx(0.0025))
    assert path.exposed(10, compute_s=0.02) == 0.0
    assert path.exposed(10, compute_s=0.005) == pytest.approx(0.0075)
    assert DataPath(1000, 1e6, prefetch=False).exposed(10, 1.0) == pytest.approx(0.01)
    assert DataPath(1000).times(10) == (0.0, 0.0)


# ------------------------------------------------------------------ communication

def test_ring_all_reduce_and_its_inverse():
    cost = AllReduceCost.ring(alpha_s=1e-4, beta_s_per_byte=1e-9, workers=4)
    assert cost.startup_s == pytest.approx(6e-4)  # 2(n-1) alpha
    assert cost.per_byte_s == pytest.approx(1.5e-9)  # 2(n-1)/n beta
    assert cost.time(1e6) == pytest.approx(6e-4 + 1.5e-3)
    assert cost.link() == (pytest.approx(1e-4), pytest.approx(1e-9))
    assert AllReduceCost.ring(1, 1, 1).time(1e9) == 0.0


def test_pairwise_all_to_all_and_its_inverse():
    """Each of n ranks sends n-1 messages of B/n: (n-1) alpha + (n-1)/n beta B."""
    cost = AllToAllCost.pairwise(alpha_s=1e-4, beta_s_per_byte=1e-9, workers=4)
    assert cost.startup_s == pytest.approx(3e-4)  # (n-1) alpha
    assert cost.per_byte_s == pytest.approx(0.75e-9)  # (n-1)/n beta: nccl-tests' bus factor
    assert cost.time(1e6) == pytest.approx(3e-4 + 0.75e-3)
    assert cost.link() == (pytest.approx(1e-4), pytest.approx(1e-9))
    assert AllToAllCost.pairwise(1, 1, 1).time(1e9) == 0.0
    # the same link: an all-to-all of B costs half an all-reduce's per-byte term, n-1 start-ups of its 2(n-1)
    ring = AllReduceCost.ring(1e-4, 1e-9, 4)
    assert cost.startup_s == pytest.approx(ring.startup_s / 2) and cost.per_byte_s == pytest.approx(ring.per_byte_s / 2)


def test_an_all_to_all_cost_comes_from_its_own_fit_and_is_extrapolated_saying_so():
    reduce_fit = CommFit(framework="torch", workers=2, startup_s=1e-3, per_byte_s=1e-6, alpha_s=5e-4,
                         beta_s_per_byte=1e-6, r2=1.0, points=5, min_bytes=4, max_bytes=1 << 20, run_ids=["c"])
    notes: list[str] = []
    with pytest.raises(PredictionError, match="no all-to-all fit"):
        collective_cost(profile(comm=[reduce_fit]), "torch", 2, notes, "all_to_all")
    a2a = CommFit(framework="torch", workers=2, collective="all_to_all", startup_s=2e-4, per_byte_s=3e-9,
                  alpha_s=2e-4, beta_s_per_byte=6e-9, r2=0.99, points=5, min_bytes=4, max_bytes=1 << 20,
                  run_ids=["d"])
    prof = profile(comm=[reduce_fit, a2a])
    own = collective_cost(prof, "torch", 2, notes, "all_to_all")
    assert isinstance(own, AllToAllCost) and (own.startup_s, own.per_byte_s) == (2e-4, 3e-9) and notes == []
    # the all-reduce a data-parallel prediction takes is still the all-reduce's line
    assert collective_cost(prof, "torch", 2, notes).startup_s == 1e-3
    four = collective_cost(prof, "torch", 4, notes, "all_to_all")
    assert four.startup_s == pytest.approx(3 * 2e-4) and four.per_byte_s == pytest.approx(0.75 * 6e-9)
    assert "all-to-all for 4 workers extrapolated by pairwise exchange from the 2-worker fit" in notes[-1]
    # another framework's fit stands in, and the note names it
    jax = collective_cost(prof, "jax", 2, notes, "all_to_all")
    assert jax.startup_s == 2e-4 and "no all-to-all fit of jax: torch's (2 workers) used" in notes[-1]


def test_three_layers_wfbp_and_mgwfbp_on_paper():
    """Layers 0, 1, 2; t_b = [1, 2, 5], p = [1, 1, 6]; t_c(p) = 1 + p (α = 1): t_c = [2, 2, 7].

    Backward starts: τ_b[2] = 0, τ_b[1] = 0 + 5 = 5, τ_b[0] = 5 + 2 = 7; it ends at 7 + 1 = 8.

    WFBP: τ_c[2] = 0 + 5 = 5; τ_c[1] = max(5 + 7, 5 + 2) = 12; τ_c[0] = max(12 + 2, 7 + 1) = 14;
          the last message ends at 14 + 2 = 16: t_c^no = 16 - 8 = 8 (link busy 2 + 2 + 7 = 11).
    MG-WFBP, l = 2: e = τ_b[1] + t_b[1] = 7 < τ_c[2] + t_c[2] = 12, but τ_c[2] = 5 is not > 7 and
          the wait e - τ_c[2] = 2 is not < α = 1: layer 2 keeps its own message.
    l = 1: e = τ_b[0] + t_b[0] = 8 < τ_c[1] + t_c[1] = 14, and τ_c[1] = 12 > 8 (the link is still
          busy with layer 2 when layer 0's gradient is ready): merge. p[0] = 2, t_c[1] = 0,
          t_c[0] = 1 + 2 = 3; τ_c[1] = max(5 + 7, 7) = 12, τ_c[0] = max(12 + 0, 8) = 12;
          the last message ends at 12 + 3 = 15: t_c^no = 15 - 8 = 7, one start-up (α) saved.
    No overlap: one message of 8 bytes after the backward: t_c = 1 + 8 = 9, all of it exposed.
    """
    cost = AllReduceCost(workers=2, startup_s=1.0, per_byte_s=1.0)
    t_b, p = [1.0, 2.0, 5.0], [1.0, 1.0, 6.0]
    w = wfbp(t_b, p, cost)
    assert w.tau_b == [7.0, 5.0, 0.0] and w.backward_end == 8.0
    assert w.tau_c == [14.0, 12.0, 5.0] and w.t_c == [2.0, 2.0, 7.0]
    assert w.exposed == 8.0 and w.communication == 11.0
    m = mgwfbp(t_b, p, cost)
    assert m.t_c == [3.0, 0.0, 7.0] and m.tau_c == [12.0, 12.0, 5.0]
    assert m.groups == [[2], [1, 0]]
    assert m.exposed == 7.0 and m.communication == 10.0
    n = without_overlap(t_b, p, cost)
    assert n.exposed == 9.0 and n.groups == [[2, 1, 0]]


def test_merge_when_waiting_costs_less_than_a_start_up():
    """t_b = [1, 4, 1], p = [1, 1, 1], t_c(p) = α + p.

    τ_b = [5, 1, 0], backward ends at 6. WFBP: τ_c[2] = 1, τ_c[1] = max(1 + t_c, 5), τ_c[0] = ...
    α = 2 (t_c = 3): τ_c = [8, 5, 1]. l = 2: e = 5 is not < τ_c[2] + t_c = 4: no merge.
      l = 1: e = 6 < 5 + 3 = 8; τ_c[1] = 5 is not > 6, but the wait 6 - 5 = 1 < α = 2: merge;
      t_c[0] = 2 + 2 = 4, τ_c[0] = max(5 + 0, 6) = 6, ends at 10: t_c^no = 4 (WFBP: 8 + 3 - 6 = 5).
    α = 0.5 (t_c = 1.5): τ_c = [6.5, 5, 1]; l = 1: e = 6 < 6.5, wait 1 is not < 0.5: no merge, so
      MG-WFBP is WFBP: ends at 8, t_c^no = 2.
    """
    t_b, p = [1.0, 4.0, 1.0], [1.0, 1.0, 1.0]
    big = AllReduceCost(2, 2.0, 1.0)
    assert wfbp(t_b, p, big).exposed == 5.0
    merged = mgwfbp(t_b, p, big)
    assert merged.groups == [[2], [1, 0]] and merged.exposed == 4.0
    small = AllReduceCost(2, 0.5, 1.0)
    assert mgwfbp(t_b, p, small).groups == [[2], [1], [0]]
    assert mgwfbp(t_b, p, small).exposed == wfbp(t_b, p, small).exposed == 2.0
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule("ring", t_b, p, big)


def test_parameter_free_layers_delay_the_next_gradient():
    layers = [LayerTimes(0, "conv", 10, backward_s=1.0), LayerTimes(1, "relu", 0, backward_s=0.5),
              LayerTimes(2, "dense", 5, backward_s=2.0), LayerTimes(3, "loss", 0, backward_s=0.25)]
    t_b, p = gradient_layers(layers)
    assert t_b == [1.5, 2.25] and p == [40.0, 20.0]


def test_data_parallel_prediction_adds_only_the_exposed_communication():
    net = tiny([{"type": "dense", "units": 5}, {"type": "relu"}, {"type": "dense", "units": 3}])
    fit = CommFit(framework="torch", workers=2, startup_s=1e-3, per_byte_s=1e-6, alpha_s=5e-4, beta_s_per_byte=1e-6,
                  r2=1.0, points=5, min_bytes=4, max_bytes=1 << 20, run_ids=["c"])
    prof = profile(comm=[fit])
    work = decompose(net.resolved, 2, "train")
    one = predict(work, "torch", prof)
    two = predict(work, "torch", prof, workers=2, schedule_kind="wfbp")
    t_b, p = gradient_layers(one.layers)
    expected = wfbp(t_b, p, AllReduceCost(2, 1e-3, 1e-6))
    assert two.communication_exposed_s == pytest.approx(expected.exposed)
    assert two.iteration_s == pytest.approx(one.iteration_s + expected.exposed)
    assert two.communication_s == pytest.approx((1e-3 + 1e-6 * 4 * 25) + (1e-3 + 1e-6 * 4 * 18))
    # 4 workers: the 2-worker fit extrapolated by the ring model, and said so
    four = predict(work, "torch", prof, workers=4, schedule_kind="none")
    assert four.communication_s == pytest.approx(AllReduceCost.ring(5e-4, 1e-6, 4).time(4 * 43))
    assert any("extrapolated" in n for n in four.notes)
    with pytest.raises(PredictionError, match="no all-reduce fit"):
        predict(work, "torch", profile(), workers=2)
    with pytest.raises(PredictionError, match="--mode train"):
        predict(decompose(net.resolved, 2, "infer"), "torch", prof, workers=2)


def test_the_default_schedule_is_the_frameworks_engines():
    net = tiny([{"type": "dense", "units": 5}, {"type": "relu"}, {"type": "dense", "units": 3}])
    fit = CommFit(framework="x", workers=2, startup_s=1e-3, per_byte_s=1e-6, alpha_s=5e-4, beta_s_per_byte=1e-6,
                  r2=1.0, points=5, min_bytes=4, max_bytes=1 << 20, run_ids=["c"])
    work = decompose(net.resolved, 2, "train")
    for kind in ("none", "wfbp", "mgwfbp"):
        p = predict(work, "x", profile(comm=[fit]), workers=2, facts=FrameworkFacts(schedule=kind))
        assert p.schedule.kind == kind
    # stated nothing: mgwfbp; --schedule overrides the framework's
    assert predict(work, "x", profile(comm=[fit]), workers=2).schedule.kind == "mgwfbp"
    assert predict(work, "x", profile(comm=[fit]), workers=2, schedule_kind="none",
                   facts=FrameworkFacts(schedule="wfbp")).schedule.kind == "none"


# ------------------------------------------------------------------ the framework facts, from runner.toml

ROOT = Path(__file__).resolve().parents[2]


def test_the_runners_state_what_the_model_assumed_of_them_before():
    # the tables model.py held (DEFAULT_SCHEDULE, STEP_EXECUTION) before each runner's runner.toml said it
    from dlbench.execution.registry import RunnerRegistry

    facts = RunnerRegistry(ROOT / "runners").model_facts()
    assert {name: facts[name] for name in ("torch", "tensorflow", "jax", "mxnet")} == {
        "torch": FrameworkFacts("eager", "mgwfbp"), "tensorflow": FrameworkFacts("graph", "none", "fused"),
        "jax": FrameworkFacts("graph", "none"), "mxnet": FrameworkFacts("graph", "wfbp")}
    assert FrameworkFacts() == FrameworkFacts("eager", "mgwfbp", "separate")  # a framework that states nothing


def runner_toml(tmp_path, model: str) -> Path:
    folder = tmp_path / "runners" / "r"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("requirements-cpu.txt", "requirements-cuda.txt", "worker.py"):
        (folder / name).write_text("")
    top, tables = (model, "") if not model.startswith("[") else ("", model)  # a plain key goes above the tables
    (folder / "runner.toml").write_text('name = "r"\nimport_name = "json"\nworker = "worker.py"\n' + top +
                                        '[requirements]\ncpu = "requirements-cpu.txt"\ncuda = "requirements-cuda.txt"\n'
                                        '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\n'
                                        + tables)
    return folder


@pytest.mark.parametrize("model, field, reason", [
    ('[model]\nstep = "lazy"\n', "model.step", "'lazy' is not one of eager, graph"),
    ('[model]\nstep = "graph"\nschedule = "ring"\n', "model.schedule", "'ring' is not one of none, wfbp, mgwfbp"),
    ('[model]\nsteps = "graph"\n', "model.steps", "unknown field"),
    ('[model]\nepilogues = "folded"\n', "model.epilogues", "'folded' is not one of separate, fused"),
    ('model = "graph"\n', "model", "must be a table"),
])
def test_a_bad_model_section_is_one_error_naming_the_file_and_field(tmp_path, model, field, reason):
    from dlbench.definitions.loader import DefinitionError
    from dlbench.execution.registry import RunnerRegistry

    folder = runner_toml(tmp_path, model)
    with pytest.raises(DefinitionError) as e:
        RunnerRegistry(folder.parent).get("r")
    assert str(e.value).startswith(f"{folder / 'runner.toml'}: {field}: ") and reason in str(e.value)


def test_a_model_section_may_leave_fields_out(tmp_path):
    from dlbench.execution.registry import RunnerRegistry

    assert RunnerRegistry(runner_toml(tmp_path, "").parent).get("r").model == FrameworkFacts()
    folder = runner_toml(tmp_path, '[model]\nstep = "graph"\n')
    assert RunnerRegistry(folder.parent).model_facts() == {"r": FrameworkFacts("graph", "mgwfbp")}
    with pytest.raises(ValueError, match="unknown step execution"):
        FrameworkFacts(step="lazy")
