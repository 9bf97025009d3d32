"""The JAX runner's layers: the table LAYERS (one Layer(build, weights) per layer type of the
schema: the builder that makes the type's flax modules inside the network, and the function that
names its canonical tensors and where flax keeps them), the non-transformer builders and flax
modules (the LSTM, the residual block, batch norm), and the build plan (how flatten is done on
NHWC maps). The transformer layers' builders and weights are transformer.py's; the network that
calls the builders in order is step.py's; weights.py converts the tensors the weight functions name.

Nothing that starts threads (jax, flax, numpy) is imported at module level: the runner restricts
the CPU affinity first, and XLA:CPU sizes its thread pools from it when jax is first imported.

Canonical weights (src/dlbench/definitions/weights.py) <-> flax variables: conv kernels OIHW <->
HWIO; dense weight (out, in) <-> kernel (in, out); batch norm gamma/beta <-> scale/bias, running
mean/var <-> batch_stats mean/var; LSTM w_ih (4h, in) / w_hh (4h, h) <-> fused (in, 4h) / (h, 4h)
kernels, gates i, f, g, o, one bias; a dense layer fed by a flatten of an NHWC map takes its rows in
H, W, C order, so its canonical C, H, W rows are permuted on load and export (likewise a batch norm
between the two), which keeps the flatten free at run time.

A layer type's weight function: weights(layer, prefix, path, perm) yields (canonical name,
collection, path in the collection, kind, perm) per canonical tensor, for the resolved `layer` at
canonical prefix `prefix` ("003") and flax module path `path` (("layer003",)), `perm` the build
plan's flat-feature permutation of the layer's inputs (or None); `kind` says how weights.py
converts the tensor (conv, dense, transpose, vector).
"""

from __future__ import annotations

import functools

from runners.common.contract import Layer, LayerTable
from runners.jax.framework import load_jnp, load_linen
from runners.jax.transformer import (attention_weights, build_attention, build_gelu, build_grouped_attention,
                                     build_layer_norm, build_llama_block, build_lm_head, build_moe,
                                     build_patch_embedding, build_position_embedding, build_pretraining_heads,
                                     build_rms_norm, build_segment_embedding, build_swiglu, build_token_pool,
                                     build_transformer_block, grouped_attention_weights, layer_norm_weights,
                                     llama_block_weights, lm_head_weights, moe_weights, patch_embedding_weights,
                                     position_embedding_weights, pretraining_heads_weights, rms_norm_weights,
                                     segment_embedding_weights, swiglu_weights, transformer_block_weights,
                                     weight_bias_entries)

_FLAT_ELEMENTWISE = ("relu", "sigmoid", "tanh", "dropout", "batch_norm")
# settings["flatten"]: how each plan's flatten is done (step.py's TrainingModel.settings)
FLATTEN_SETTING = {"nhwc": "NHWC reshape, next dense's rows permuted at load/export",
                   "nchw": "transpose to NCHW, then reshape", "plain": "reshape"}


# ----------------------------------------------------------------------------------------------
# Build plan: the decisions that depend on the description only (no framework needed).

def build_plan(network: dict) -> list[dict]:
    """Per layer: how the flatten is done and which flat-feature permutation a layer's weights see
    (and, from a masked_tokens input, a segment embedding's boundary and the heads' masked positions).

    A flatten of an image is done on the NHWC map as it is (rows in H, W, C order) when the flat
    vector reaches a dense layer through element-wise layers only: that dense layer's weight rows
    (and a batch norm's vectors on the way) are permuted instead. Otherwise (the flat vector is the
    output, or anything else comes first) the map is transposed to NCHW before flattening.
    """
    layers = network["layers"]
    plan: list[dict] = [{} for _ in layers]
    perm = None
    for i, layer in enumerate(layers):
        t = layer["type"]
        if t == "flatten":
            perm = None
            shape = layer["in_shape"]
            if len(shape) == 3 and shape[0] > 1 and shape[1] * shape[2] > 1:
                consumer = next((j for j in range(i + 1, len(layers))
                                 if layers[j]["type"] not in _FLAT_ELEMENTWISE), None)
                if consumer is not None and layers[consumer]["type"] == "dense":
                    plan[i]["flatten"] = "nhwc"
                    c, h, w = shape
                    import numpy as np

                    perm = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
                else:
                    plan[i]["flatten"] = "nchw"
            else:
                plan[i]["flatten"] = "plain"
        elif t in ("dense", "batch_norm") and perm is not None:
            plan[i]["perm"] = perm  # internal feature j is canonical feature perm[j]
            if t == "dense":
                perm = None
        elif t not in _FLAT_ELEMENTWISE:
            perm = None
        if t == "segment_embedding":  # the masked_tokens input's layout: segment 0, then 1
            plan[i]["segment_boundary"] = network["input"]["segment_boundary"]
        elif t == "pretraining_heads":  # the positions the masked-LM head gathers (sorted, unique)
            plan[i]["masked_positions"] = tuple(network["input"]["masked_positions"])
    return plan


# ----------------------------------------------------------------------------------------------
# flax modules (defined lazily: flax is imported only after the thread configuration)

@functools.lru_cache(maxsize=None)
def lstm_layer_class():
    """The LSTM layer module (also what the kernels suite times as `lstm_layer`, kernels.py)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    def lstm_init(hidden):
        bound = 1.0 / hidden ** 0.5  # torch's and Keras' U(-1/sqrt(h), 1/sqrt(h))
        return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)

    class LSTMLayer(nn.Module):
        """One LSTM layer, time-major in and out, gates i, f, g, o, one bias of 4*hidden."""

        hidden: int
        unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):  # x: (T, B, F)
            h = self.hidden
            init = lstm_init(h)
            w_ih = self.param("w_ih", init, (x.shape[-1], 4 * h))
            w_hh = self.param("w_hh", init, (h, 4 * h))
            bias = self.param("bias", nn.initializers.zeros_init(), (4 * h,))
            w_ih, w_hh, bias, x = (a.astype(self.dtype) for a in (w_ih, w_hh, bias, x))
            # every step's input projection at once: one (T*B, F) x (F, 4h) matmul
            xw = jnp.einsum("tbf,fg->tbg", x, w_ih) + bias

            def cell(carry, xw_t):
                h_prev, c_prev = carry
                z = xw_t + h_prev @ w_hh
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
                h_new = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h_new, c), h_new

            zeros = jnp.zeros((x.shape[1], h), self.dtype)
            _, hs = jax.lax.scan(cell, (zeros, zeros), xw, unroll=self.unroll)
            return hs

    return LSTMLayer


@functools.lru_cache(maxsize=None)
def _blocks():
    """flax modules that need the framework (defined once, lazily): LSTM, Residual, batch_norm."""
    import types

    import flax.linen as nn
    import jax.numpy as jnp

    LSTMLayer = lstm_layer_class()

    class LSTM(nn.Module):
        hidden: int
        layers: int
        unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):  # (B, T, F) -> (B, T, hidden)
            x = jnp.swapaxes(x, 0, 1)
            for k in range(self.layers):
                x = LSTMLayer(self.hidden, self.unroll, self.dtype, name=f"l{k}")(x)
            return jnp.swapaxes(x, 0, 1)

    def batch_norm(train, momentum, eps, dtype, name):
        # flax's momentum is the weight of the old running value: 1 - the canonical momentum
        return nn.BatchNorm(use_running_average=not train, momentum=1.0 - momentum, epsilon=eps,
                            dtype=dtype, name=name)

    class Residual(nn.Module):
        """conv-bn-relu-conv-bn (+ shortcut), relu; bottleneck 1x1 - 3x3(stride) - 1x1(4x). NHWC."""

        block: str
        filters: int
        stride: int
        shortcut: str
        cin: int
        cout: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, train: bool):
            f, s = self.filters, self.stride

            def conv(y, co, k, stride, name):
                return nn.Conv(co, (k, k), (stride, stride), padding=[(k // 2, k // 2)] * 2, use_bias=False,
                               dtype=self.dtype, name=name)(y)

            def bn(y, name):
                return batch_norm(train, 0.1, 1e-5, self.dtype, name)(y)

            if self.block == "basic":
                convs = [(f, 3, s), (f, 3, 1)]
            else:
                convs = [(f, 1, 1), (f, 3, s), (self.cout, 1, 1)]
            y = x
            for j, (co, k, stride) in enumerate(convs, start=1):
                y = bn(conv(y, co, k, stride, f"conv{j}"), f"bn{j}")
                if j < len(convs):
                    y = nn.relu(y)
            if self.shortcut == "projection":
                short = bn(conv(x, self.cout, 1, s, "proj"), "proj_bn")
            elif self.shortcut == "option_a":
                short = x[:, ::s, ::s, :] if s > 1 else x
                short = jnp.pad(short, ((0, 0), (0, 0), (0, 0), (0, self.cout - self.cin)))
            else:
                short = x
            return nn.relu(y + short)

    return types.SimpleNamespace(LSTM=LSTM, Residual=Residual, batch_norm=batch_norm)


class LayerCall:
    """Where a layer's builder is called: inside Network's compact __call__ (the flax modules it
    makes belong to that network), with the layer's name, the mode, its build plan and the modules
    of earlier layers that a later one uses (`modules`, by name: a tied head's token embedding)."""

    def __init__(self, net, name: str, train: bool, how: dict, modules: dict):
        self.net, self.name, self.train, self.how, self.modules = net, name, train, how, modules
        self.dtype = net.dtype


# ------------------------------------------------------------------ layers: type -> builder(x, spec, at) -> x


def _dense(x, spec, at):
    return load_linen().Dense(spec["units"], use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)


def _conv2d(x, spec, at):
    (ph, pw) = spec["padding"]
    return load_linen().Conv(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]),
                             padding=[(ph, ph), (pw, pw)], use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)


def _max_pool(x, spec, at):
    (ph, pw) = spec["padding"]  # reduce_window pads with the init value, -inf
    return load_linen().max_pool(x, tuple(spec["size"]), tuple(spec["stride"]), ((ph, ph), (pw, pw)))


def _avg_pool(x, spec, at):
    return load_linen().avg_pool(x, tuple(spec["size"]), tuple(spec["stride"]), "VALID")


def _global_avg_pool(x, spec, at):
    return load_jnp().mean(x, axis=(1, 2))


def batch_norm_module(train: bool, momentum: float, eps: float, dtype, name: str | None = None):
    """The flax BatchNorm the network builder makes (canonical momentum: the weight of the new value)."""
    return _blocks().batch_norm(train, momentum, eps, dtype, name)


def _batch_norm(x, spec, at):
    return batch_norm_module(at.train, spec["momentum"], spec["eps"], at.dtype, at.name)(x)


def _relu(x, spec, at):
    return load_linen().relu(x)


def _sigmoid(x, spec, at):
    return load_linen().sigmoid(x)


def _tanh(x, spec, at):
    return load_jnp().tanh(x)


def _flatten(x, spec, at):
    if at.how.get("flatten") == "nchw":
        x = load_jnp().transpose(x, (0, 3, 1, 2))
    return x.reshape(x.shape[0], -1)


def _dropout(x, spec, at):
    if not at.net.deterministic and spec["rate"] > 0:
        x = load_linen().Dropout(spec["rate"], deterministic=not at.train)(x)
    return x


def _embedding(x, spec, at):
    nn = load_linen()
    # the described scale, else flax's own variance-scaling initialiser
    init = {"embedding_init": nn.initializers.normal(stddev=spec["init_std"])} if spec.get("init_std") else {}
    embed = nn.Embed(spec["vocabulary"], spec["dim"], dtype=at.dtype, name=at.name, **init)
    at.modules[at.name] = embed  # a tied lm_head decodes with this module's table (Embed.attend)
    return embed(x)


def _lstm(x, spec, at):
    return _blocks().LSTM(spec["hidden"], spec["layers"], at.net.lstm_unroll, at.dtype, name=at.name)(x)


def _residual(x, spec, at):
    return _blocks().Residual(spec["block"], spec["filters"], spec["stride"], spec["shortcut"], spec["in_shape"][0],
                              spec["out_shape"][0], at.dtype, name=at.name)(x, at.train)


def dropout_rate(layer: dict) -> float:
    """The dropout a resolved layer applies in training: a dropout layer's rate, an attention's or a
    transformer block's `dropout` (on the probabilities and, in a block, on both branches)."""
    if layer["type"] == "dropout":
        return layer["rate"]
    return layer.get("dropout", 0.0) if layer["type"] in ("attention", "transformer_block") else 0.0


# ------------------------------------------------------- canonical weights: weights(layer, prefix, path, perm)


def _bn_entries(prefix: str, path: tuple, perm):
    yield f"{prefix}.gamma", "params", path + ("scale",), "vector", perm
    yield f"{prefix}.beta", "params", path + ("bias",), "vector", perm
    yield f"{prefix}.running_mean", "batch_stats", path + ("mean",), "vector", perm
    yield f"{prefix}.running_var", "batch_stats", path + ("var",), "vector", perm


def _dense_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.weight", "params", path + ("kernel",), "dense", perm
    if layer["bias"]:
        yield f"{prefix}.bias", "params", path + ("bias",), "vector", None


def _conv2d_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from weight_bias_entries(prefix, path, layer["bias"], "conv")


def _batch_norm_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from _bn_entries(prefix, path, perm)


def _embedding_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.weight", "params", path + ("embedding",), "vector", None


def _lstm_weights(layer: dict, prefix: str, path: tuple, perm):
    for k in range(layer["layers"]):
        yield f"{prefix}.l{k}.w_ih", "params", path + (f"l{k}", "w_ih"), "transpose", None
        yield f"{prefix}.l{k}.w_hh", "params", path + (f"l{k}", "w_hh"), "transpose", None
        yield f"{prefix}.l{k}.bias", "params", path + (f"l{k}", "bias"), "vector", None


def _residual_weights(layer: dict, prefix: str, path: tuple, perm):
    for j in range(1, (3 if layer["block"] == "bottleneck" else 2) + 1):
        yield f"{prefix}.conv{j}.weight", "params", path + (f"conv{j}", "kernel"), "conv", None
        yield from _bn_entries(f"{prefix}.bn{j}", path + (f"bn{j}",), None)
    if layer["shortcut"] == "projection":
        yield f"{prefix}.proj.weight", "params", path + ("proj", "kernel"), "conv", None
        yield from _bn_entries(f"{prefix}.proj_bn", path + ("proj_bn",), None)


# ------------------------------------------------------------------ the table: one entry per layer type

LAYERS = LayerTable("jax", {
    "dense": Layer(_dense, _dense_weights),
    "conv2d": Layer(_conv2d, _conv2d_weights),
    "max_pool": Layer(_max_pool, None),
    "avg_pool": Layer(_avg_pool, None),
    "global_avg_pool": Layer(_global_avg_pool, None),
    "batch_norm": Layer(_batch_norm, _batch_norm_weights),
    "relu": Layer(_relu, None),
    "sigmoid": Layer(_sigmoid, None),
    "tanh": Layer(_tanh, None),
    "flatten": Layer(_flatten, None),
    "dropout": Layer(_dropout, None),
    "embedding": Layer(_embedding, _embedding_weights),
    "lstm": Layer(_lstm, _lstm_weights),
    "residual": Layer(_residual, _residual_weights),
    "position_embedding": Layer(build_position_embedding, position_embedding_weights),
    "patch_embedding": Layer(build_patch_embedding, patch_embedding_weights),
    "layer_norm": Layer(build_layer_norm, layer_norm_weights),
    "gelu": Layer(build_gelu, None),
    "attention": Layer(build_attention, attention_weights),
    "transformer_block": Layer(build_transformer_block, transformer_block_weights),
    "token_pool": Layer(build_token_pool, None),
    "lm_head": Layer(build_lm_head, lm_head_weights),
    "segment_embedding": Layer(build_segment_embedding, segment_embedding_weights),
    "pretraining_heads": Layer(build_pretraining_heads, pretraining_heads_weights),
    "rms_norm": Layer(build_rms_norm, rms_norm_weights),
    "grouped_attention": Layer(build_grouped_attention, grouped_attention_weights),
    "swiglu": Layer(build_swiglu, swiglu_weights),
    "moe": Layer(build_moe, moe_weights),
    "llama_block": Layer(build_llama_block, llama_block_weights),
})
