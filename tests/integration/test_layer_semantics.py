"""Every layer kind, in every framework, against an independent numpy implementation.

Each tiny network isolates one kind of layer (and its weight mapping: layouts, LSTM gate order and
single bias, flatten order, option-A padding side). Every runner loads the same canonical weights
and input through the `check` action; its logits and loss must match numpy's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from dlbench import paths
from dlbench.definitions.loader import load_network
from dlbench.definitions.weights import random_weights
from dlbench.execution.environments import VenvBackend
from dlbench.execution.equivalence import _probe, make_inputs, relative_error, tolerance_for
from dlbench.execution.registry import RunnerRegistry

from . import numpy_reference

pytestmark = pytest.mark.integration

IMAGE = {"kind": "tensor", "shape": [3, 9, 9], "classes": 5}
MASKED = {"kind": "masked_tokens", "vocabulary": 11, "sequence_length": 10, "mask_seed": 4}
TINY = {
    "dense_sigmoid_tanh_relu": ({"kind": "tensor", "shape": [12], "classes": 5}, [
        {"type": "dense", "units": 16}, {"type": "sigmoid"}, {"type": "dense", "units": 16}, {"type": "tanh"},
        {"type": "dense", "units": 8, "bias": False}, {"type": "relu"}, {"type": "dropout", "rate": 0.5},
        {"type": "dense", "units": 5}]),
    "conv_pools_flatten": (IMAGE, [
        {"type": "conv2d", "filters": 4, "kernel": [3, 2], "stride": [2, 1], "padding": [1, 0]},
        {"type": "max_pool", "size": 3, "stride": 1, "padding": 1},
        {"type": "conv2d", "filters": 6, "kernel": 2, "bias": False},
        {"type": "avg_pool", "size": 2, "stride": 1},
        {"type": "flatten"}, {"type": "dense", "units": 5}]),
    "batch_norm_image_and_flat": (IMAGE, [
        {"type": "conv2d", "filters": 4, "kernel": 3}, {"type": "batch_norm", "eps": 1e-3},
        {"type": "relu"}, {"type": "flatten"}, {"type": "dense", "units": 7}, {"type": "batch_norm"},
        {"type": "dense", "units": 5}]),
    # 16 -> 32 channels: MXNet 1.9.1's CPU kernels die of SIGFPE on this block with 4 or 8 channels.
    "residual_basic_option_a": (IMAGE, [
        {"type": "conv2d", "filters": 16, "kernel": 3, "padding": 1, "bias": False},
        {"type": "residual", "block": "basic", "filters": 32, "stride": 2, "repeat": 2, "shortcut": "option_a"},
        {"type": "global_avg_pool"}, {"type": "dense", "units": 5}]),
    "residual_bottleneck_projection": (IMAGE, [
        {"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1, "bias": False},
        {"type": "residual", "block": "bottleneck", "filters": 2, "stride": 2, "repeat": 2, "shortcut": "projection"},
        {"type": "global_avg_pool"}, {"type": "dense", "units": 5}]),
    "embedding_lstm_sequence_dense": ({"kind": "tokens", "vocabulary": 11, "sequence_length": 5}, [
        {"type": "embedding", "vocabulary": 11, "dim": 6}, {"type": "lstm", "hidden": 7, "layers": 2},
        {"type": "dense", "units": 11}]),
    # described dense initialisations whose scales none of the frameworks' defaults has (torch
    # 1/(3F), Keras 1/fan_avg, flax 1/F, MXNet 2/F: here 4/fan_avg and 0.5/fan_out)
    "dense_described_init": ({"kind": "tensor", "shape": [300], "classes": 5}, [
        {"type": "dense", "units": 200, "init": {"distribution": "normal", "scale": 4.0, "mode": "fan_avg"}},
        {"type": "sigmoid"},
        {"type": "dense", "units": 5, "init": {"distribution": "uniform", "scale": 0.5, "mode": "fan_out"}}]),
}

# The transformer types (issue 17), dim 8-16, 4-6 tokens, 1-2 heads and blocks; the head size is not
# always dim / heads, a tied head has a bias, both norms and both GELU forms, causal or not, biases
# or none. Every runner builds them, as every other type.
TOKENS = {"kind": "tokens", "vocabulary": 11, "sequence_length": 5}
TINY.update({
    "decoder_pre_norm_tied_head": (TOKENS, [
        {"type": "embedding", "vocabulary": 11, "dim": 8}, {"type": "position_embedding", "max_length": 6},
        {"type": "dropout", "rate": 0.1},
        {"type": "transformer_block", "heads": 2, "norm": "pre", "gelu": "tanh", "causal": True, "dropout": 0.1,
         "repeat": 2},
        {"type": "layer_norm"}, {"type": "lm_head", "tied": True, "bias": True}]),
    "encoder_post_norm_untied_head": (TOKENS, [
        {"type": "embedding", "vocabulary": 11, "dim": 12}, {"type": "position_embedding", "max_length": 5},
        {"type": "transformer_block", "heads": 2, "head_size": 4, "mlp_ratio": 2, "norm": "post", "gelu": "erf",
         "bias": False, "eps": 1e-3},
        {"type": "lm_head", "tied": False, "bias": True}]),
    # init_std far below every framework's default scale (the smallest, Keras', is about 0.03)
    "attention_gelu_layer_norm": (TOKENS, [
        {"type": "embedding", "vocabulary": 11, "dim": 8, "init_std": 0.005},
        {"type": "attention", "heads": 2, "head_size": 3, "causal": True, "dropout": 0.2},
        {"type": "gelu", "form": "erf"}, {"type": "layer_norm", "eps": 1e-3},
        {"type": "attention", "heads": 1, "bias": False}, {"type": "gelu", "form": "tanh"},
        {"type": "lm_head", "tied": False}]),
    "vit_class_token": ({"kind": "tensor", "shape": [3, 8, 8], "classes": 5}, [
        {"type": "patch_embedding", "patch": 4, "dim": 12}, {"type": "position_embedding", "max_length": 5},
        {"type": "transformer_block", "heads": 2, "norm": "pre", "gelu": "erf", "eps": 1e-6, "mlp_ratio": 2},
        {"type": "layer_norm", "eps": 1e-6}, {"type": "token_pool", "mode": "class"}, {"type": "dense", "units": 5}]),
    "patches_mean_pool": ({"kind": "tensor", "shape": [2, 6, 4], "classes": 5}, [
        {"type": "patch_embedding", "patch": 2, "dim": 8, "class_token": False},
        {"type": "token_pool", "mode": "mean"}, {"type": "layer_norm"}, {"type": "dense", "units": 5}]),
    # BERT's input and heads: 10 positions, segments 0-4 and 5-9, 2 masked positions gathered
    "bert_segments_pretraining_heads": (MASKED, [
        {"type": "embedding", "vocabulary": 11, "dim": 8}, {"type": "position_embedding", "max_length": 12},
        {"type": "segment_embedding"}, {"type": "layer_norm", "eps": 1e-3},
        {"type": "transformer_block", "heads": 2, "norm": "post", "gelu": "erf", "eps": 1e-3},
        {"type": "pretraining_heads", "gelu": "erf", "eps": 1e-3, "tied": True}]),
    "pretraining_heads_untied_tanh": (MASKED, [
        {"type": "embedding", "vocabulary": 11, "dim": 6}, {"type": "segment_embedding", "segments": 3},
        {"type": "pretraining_heads", "gelu": "tanh", "tied": False}]),
})
# The Llama and MoE types (issue 45): grouped heads (2 of 4, and multi-query), rotary at two thetas
# and Llama 3's rescaling, SwiGLU, dropless top-2 and top-1 routing, RMSNorm at two eps.
TINY.update({
    "llama_gqa_rotary_swiglu": (TOKENS, [
        {"type": "embedding", "vocabulary": 11, "dim": 8},
        {"type": "llama_block", "heads": 4, "kv_heads": 2, "hidden": 12, "eps": 1e-5, "rope_theta": 100,
         "repeat": 2},
        {"type": "rms_norm", "eps": 1e-5}, {"type": "lm_head", "tied": True}]),
    "moe_multi_query_rescaled_rotary": (TOKENS, [
        {"type": "embedding", "vocabulary": 11, "dim": 8},
        {"type": "grouped_attention", "heads": 2, "kv_heads": 1, "rope_theta": 500000,
         "rope_scaling": {"factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_context": 4}},
        {"type": "rms_norm", "eps": 1e-3}, {"type": "swiglu", "hidden": 6},
        {"type": "llama_block", "heads": 2, "kv_heads": 2, "hidden": 6,
         "moe": {"experts": 4, "top_k": 2, "aux_loss_coefficient": 0.02}},
        {"type": "moe", "experts": 3, "top_k": 1, "hidden": 5},
        {"type": "lm_head", "tied": False}]),
})
TRANSFORMER_TYPES = {"rms_norm", "grouped_attention", "swiglu", "moe", "llama_block", "position_embedding", "patch_embedding", "layer_norm", "gelu", "attention", "transformer_block",
                     "token_pool", "lm_head", "segment_embedding", "pretraining_heads"}
TRANSFORMER_CASES = {kind for kind, (_, layers) in TINY.items() if any(x["type"] in TRANSFORMER_TYPES for x in layers)}


@pytest.fixture(scope="module")
def runners():
    registry = RunnerRegistry(paths.runners_dir())
    backend = VenvBackend(paths.cache_dir())
    return [(registry.get(n), backend.ensure(registry.get(n), "cpu")) for n in registry.names()]


@pytest.mark.parametrize("kind", sorted(TINY))
def test_every_framework_matches_numpy(runners, kind, tmp_path):
    inp, layers = TINY[kind]
    path = tmp_path / f"{kind}.yaml"
    loss = {"loss": "masked_lm_and_next_sentence"} if inp["kind"] == "masked_tokens" else {}
    path.write_text(yaml.safe_dump({"name": kind, "input": inp, "layers": layers, **loss}))
    net = load_network(path)
    weights = random_weights(net.resolved, seed=3)
    inputs = make_inputs(net, 4, seed=3)
    np.savez(tmp_path / "weights.npz", **weights)
    np.savez(tmp_path / "inputs.npz", **inputs)
    expected = numpy_reference.forward(net.resolved, weights, inputs["x"])
    expected_loss = numpy_reference.network_loss(net.resolved, weights, inputs["x"], inputs["y"])
    # The probe runs in float64 (_probe's default). The transformer cases are held to float64's
    # tolerance: at float32's (1e-4) the two GELU forms, 1-2e-4 apart in these logits, would pass for each other.
    tol = tolerance_for(net, "float64" if kind in TRANSFORMER_CASES else "fp32")
    failures = []
    for runner, env in runners:
        with tempfile.TemporaryDirectory(dir=tmp_path) as work:
            arrays, reason, status = _probe(runner, env, net, Path(work), "cpu", 600,
                                            tmp_path / "weights.npz", tmp_path / "inputs.npz", 4)
        if arrays is None:
            failures.append(f"{runner.name}: {status}: {reason}")
            continue
        init_std = layers[0].get("init_std")
        if init_std is not None:  # the table as the runner initialised it, before the shared weights
            drawn = float(np.std(arrays["init/000.weight"]))
            if not 0.6 * init_std < drawn < 1.5 * init_std:
                failures.append(f"{runner.name}: embedding initialised with std {drawn:.3g}, described {init_std}")
        failures += [f"{runner.name}: {f}" for f in dense_init_failures(net.resolved["layers"], arrays)]
        logits_err = relative_error(arrays["logits"], expected)
        loss_err = relative_error(arrays["loss"], np.asarray(expected_loss))
        if arrays["__params__"] != net.params or logits_err > tol or loss_err > tol:
            failures.append(f"{runner.name}: params {arrays['__params__']} (want {net.params}), "
                            f"logits error {logits_err:.2e}, loss error {loss_err:.2e} (tolerance {tol:g})")
    assert not failures, "\n".join(failures)


def dense_init_failures(layers: list[dict], arrays: dict) -> list[str]:
    """Each dense layer with a described `init`, as the runner initialised it (before the shared
    weights): the weights' standard deviation within 10% of sqrt(scale / fan), their distribution
    (a uniform one's kurtosis is 1.8 and its largest |w| sqrt(3) std; a normal one's kurtosis 3),
    and zero biases."""
    out = []
    for i, layer in enumerate(layers):
        init = layer.get("init") if layer["type"] == "dense" else None
        if init is None:
            continue
        w = arrays[f"init/{i:03d}.weight"].astype(np.float64)
        units, features = layer["units"], layer["in_shape"][-1]
        fan = {"fan_in": features, "fan_out": units, "fan_avg": (features + units) / 2}[init["mode"]]
        want = np.sqrt(init["scale"] / fan)
        std = float(w.std())
        kurtosis = float(np.mean((w - w.mean()) ** 4) / w.var() ** 2)
        if not 0.9 * want < std < 1.1 * want:
            out.append(f"dense {i:03d} initialised with std {std:.4g}, described {want:.4g} ({init})")
        if init["distribution"] == "uniform" and (abs(kurtosis - 1.8) > 0.3 or np.abs(w).max() > np.sqrt(3) * want * 1.0001):
            out.append(f"dense {i:03d}: kurtosis {kurtosis:.2f}, largest |w| {np.abs(w).max():.4g}: not U(-sqrt(3) std, sqrt(3) std)")
        if init["distribution"] == "normal" and abs(kurtosis - 3.0) > 0.3:
            out.append(f"dense {i:03d}: kurtosis {kurtosis:.2f}, not a normal distribution's 3")
        bias = arrays.get(f"init/{i:03d}.bias")
        if bias is not None and np.any(bias != 0):
            out.append(f"dense {i:03d}: biases not zero (largest |b| {np.abs(bias).max():.3g})")
    return out


def test_every_framework_routes_tied_tokens_to_the_lower_experts(runners, tmp_path):
    """The tie-break rule (schema.py, moe): with the router's weights zero every expert's probability
    is exactly 1/E for every token, and every framework must take experts 0 .. k-1 (a top-k that
    broke ties otherwise, or by position in memory, gives other experts' outputs: far from the
    numpy reference, which takes the lower ones)."""
    layers = [{"type": "embedding", "vocabulary": 11, "dim": 8},
              {"type": "moe", "experts": 4, "top_k": 2, "hidden": 6},
              {"type": "lm_head", "tied": False}]
    path = tmp_path / "moe_ties.yaml"
    path.write_text(yaml.safe_dump({"name": "moe_ties", "input": TOKENS, "layers": layers}))
    net = load_network(path)
    weights = random_weights(net.resolved, seed=5)
    weights["001.router.weight"] = np.zeros_like(weights["001.router.weight"])
    inputs = make_inputs(net, 4, seed=5)
    np.savez(tmp_path / "weights.npz", **weights)
    np.savez(tmp_path / "inputs.npz", **inputs)
    expected = numpy_reference.forward(net.resolved, weights, inputs["x"])
    others = dict(weights)  # the same weights routed to experts 2 and 3: what a wrong tie-break gives
    for part in ("gate", "up", "down"):
        others[f"001.experts.{part}"] = weights[f"001.experts.{part}"][[2, 3, 0, 1]]
    assert relative_error(numpy_reference.forward(net.resolved, others, inputs["x"]), expected) > 1e-3
    failures = []
    for runner, env in runners:
        with tempfile.TemporaryDirectory(dir=tmp_path) as work:
            arrays, reason, status = _probe(runner, env, net, Path(work), "cpu", 600,
                                            tmp_path / "weights.npz", tmp_path / "inputs.npz", 4)
        if arrays is None:
            failures.append(f"{runner.name}: {status}: {reason}")
        elif relative_error(arrays["logits"], expected) > 1e-9:
            failures.append(f"{runner.name}: logits error {relative_error(arrays['logits'], expected):.2e}")
    assert not failures, "\n".join(failures)
