"""The TensorFlow runner's layer types: one builder per type of a resolved dlbench layer, Keras 3
layers where Keras has them, and beside each the function that names its canonical weights, both in
`LAYERS` (the transformer types' are transformer.py's); the padding and flatten plans.

Choices (all recorded in the result's `settings`):
- layout: channels-last (NHWC) for images on every device; TensorFlow's CPU Conv2D kernels support
  only NHWC and cuDNN is at least as fast in it. Canonical channels-first inputs are transposed once
  in `prepare`, never inside the timed step. Weights are converted at load/export (weights.py):
  conv OIHW <-> HWIO, dense (out, in) <-> (in, out), LSTM (4h, in) <-> (in, 4h).
- flatten: Keras flattens NHWC in H, W, C order; instead of transposing the feature map back to
  channels-first inside every step, the rows of the dense layer that consumes the flattened
  features (and any 1-d batch norm between them) are permuted at load/export, so the step runs a
  plain reshape. Only a flatten whose output reaches no dense layer (the network's logits) falls
  back to transposing to C, H, W before the reshape.
- padding: canonical padding is symmetric and floor-mode. TensorFlow's SAME is used where it is
  provably identical (same output size, same leading pad), VALID where there is no padding, and an
  explicit pad (zeros for conv, -inf for max-pool) followed by VALID otherwise, e.g. the stride-2
  convolutions on even-sized inputs, where SAME would pad bottom/right only. Only the trailing pad
  that a window actually reaches is added.
- batch norm: keras.layers.BatchNormalization with its call routed through TensorFlow's fused
  kernel (FusedBatchNormV3: oneDNN on CPU, cuDNN on GPU), the running statistics updated by the
  kernel itself (exponential_avg_factor = canonical momentum, unbiased batch variance as in the
  canonical/PyTorch convention). Keras 3's own call is unfused (moments + batch_normalization).
  FusedBatchNormV3 has no float64 kernel (T is half, bfloat16 or float), so a float64 batch norm
  computes the same arithmetic with unfused TF ops (tf.nn.moments + tf.nn.batch_normalization,
  running statistics as the kernel updates them).
- LSTM: keras.layers.LSTM in its cuDNN-compatible configuration (tanh/sigmoid, no recurrent
  dropout, not unrolled, one bias vector: the canonical form); Keras runs the cuDNN kernel on GPU
  and its while-loop kernel on CPU.
- With `deterministic`, every dropout layer is left out.

A weight function is (prefix, spec, the layer's Keras layers, features_chw) -> {canonical name:
(keras variable, layout)}, features_chw the (C, H, W) of a dense or 1-d batch norm whose input
features arrive in H, W, C order (after a flatten), else None; weights.py converts each layout.
"""

from __future__ import annotations

import functools
import types

from runners.common.contract import Layer, LayerTable
from runners.tensorflow.framework import load_keras, load_tf
from runners.tensorflow.transformer import (
    attention_weights, build_attention, build_gelu, build_grouped_attention, build_layer_norm, build_llama_block,
    build_lm_head, build_moe, build_patch_embedding, build_position_embedding, build_pretraining_heads, build_rms_norm,
    build_segment_embedding, build_swiglu, build_token_pool, build_transformer_block, grouped_attention_weights,
    layer_norm_weights, llama_block_weights, lm_head_weights, moe_weights, patch_embedding_weights,
    position_embedding_weights, pretraining_heads_weights, rms_norm_weights, segment_embedding_weights, swiglu_weights,
    transformer_block_weights)

ELEMENTWISE = ("relu", "sigmoid", "tanh", "dropout")


# --------------------------------------------------------------------------------------------------
# padding: canonical (symmetric, floor mode) -> SAME, VALID or explicit pads + VALID


def _window_plan(size: int, k: int, s: int, p: int):
    out = (size + 2 * p - k) // s + 1
    same_out = -(-size // s)
    total = max((same_out - 1) * s + k - size, 0)
    same_ok = same_out == out and total // 2 == p
    # only the trailing pad that the last window reaches matters (floor mode may drop the rest)
    explicit = (p, max(0, (out - 1) * s + k - size - p))
    return same_ok, p == 0, explicit


def padding_plan(hw, kernel, stride, padding):
    """('valid' | 'same', None) or ('valid', ((top, bottom), (left, right))) for canonical padding."""
    dims = [_window_plan(hw[i], kernel[i], stride[i], padding[i]) for i in (0, 1)]
    if all(d[1] for d in dims):
        return "valid", None
    if all(d[0] for d in dims):
        return "same", None
    return "valid", (dims[0][2], dims[1][2])


# --------------------------------------------------------------------------------------------------
# Keras layers (defined once TensorFlow is imported)


@functools.lru_cache(maxsize=None)
def layer_classes():
    tf, keras = load_tf(), load_keras()

    def _padded(shape, pads):
        n, h, w, c = shape
        return (n, None if h is None else h + sum(pads[0]), None if w is None else w + sum(pads[1]), c)

    class PaddedConv2D(keras.layers.Conv2D):
        """Conv2D with canonical padding that SAME cannot express: zero-pad, then VALID."""

        def __init__(self, pads, **kwargs):
            super().__init__(padding="valid", **kwargs)
            self.pads = pads

        def call(self, inputs):
            return super().call(tf.pad(inputs, [[0, 0], list(self.pads[0]), list(self.pads[1]), [0, 0]]))

        def compute_output_shape(self, input_shape):
            return super().compute_output_shape(_padded(input_shape, self.pads))

    class PaddedMaxPool2D(keras.layers.MaxPooling2D):
        """Max-pool with canonical padding that SAME cannot express: -inf pad, then VALID."""

        def __init__(self, pads, **kwargs):
            super().__init__(padding="valid", **kwargs)
            self.pads = pads

        def call(self, inputs):
            return super().call(tf.pad(inputs, [[0, 0], list(self.pads[0]), list(self.pads[1]), [0, 0]],
                                       constant_values=float("-inf")))

        def compute_output_shape(self, input_shape):
            return super().compute_output_shape(_padded(input_shape, self.pads))

    class FusedBatchNorm(keras.layers.BatchNormalization):
        """keras.layers.BatchNormalization computed by TensorFlow's fused kernel.

        Training: batch statistics (biased variance) normalise; the kernel also updates the running
        statistics as (1 - f) * running + f * batch with f = 1 - keras momentum = the canonical
        momentum, using the unbiased batch variance (PyTorch's convention). A flat (N, C) input is
        viewed as (N, 1, 1, C).
        """

        def __init__(self, canonical_momentum, kernel_epsilon, **kwargs):
            super().__init__(axis=-1, momentum=1.0 - canonical_momentum, **kwargs)
            self.canonical_momentum = canonical_momentum  # exactly as described, not 1 - (1 - m)
            self.kernel_epsilon = kernel_epsilon

        def call(self, inputs, training=None, mask=None):
            flat = len(inputs.shape) == 2
            x = tf.reshape(inputs, [-1, 1, 1, inputs.shape[-1]]) if flat else inputs
            if self.compute_dtype == "float64":
                y = self._unfused(x, training)
                return tf.reshape(y, tf.shape(inputs)) if flat else y
            common = dict(x=x, scale=tf.convert_to_tensor(self.gamma), offset=tf.convert_to_tensor(self.beta),
                          mean=tf.convert_to_tensor(self.moving_mean),
                          variance=tf.convert_to_tensor(self.moving_variance),
                          epsilon=self.kernel_epsilon, data_format="NHWC")
            if training and self.trainable:
                y, running_mean, running_var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                    exponential_avg_factor=self.canonical_momentum, is_training=True, **common)
                self.moving_mean.assign(running_mean)
                self.moving_variance.assign(running_var)
            else:
                y = tf.raw_ops.FusedBatchNormV3(exponential_avg_factor=1.0, is_training=False, **common)[0]
            return tf.reshape(y, tf.shape(inputs)) if flat else y

        def _unfused(self, x, training):
            """float64 only: FusedBatchNormV3 has no float64 kernel (its T is half, bfloat16 or float),
            so the kernel's arithmetic in plain TF ops, every tensor float64: normalise by the batch
            mean and biased variance (training) or the running statistics, and update the running
            statistics as (1 - f) * running + f * batch with the unbiased batch variance."""
            gamma, beta = tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta)
            if training and self.trainable:
                mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
                y = tf.nn.batch_normalization(x, mean, variance, beta, gamma, self.kernel_epsilon)
                n = tf.cast(tf.size(x) // tf.shape(x)[-1], x.dtype)
                unbiased = variance * (n / tf.maximum(n - 1, 1))  # as the kernel: n / max(n - 1, 1)
                f = self.canonical_momentum
                self.moving_mean.assign((1.0 - f) * tf.convert_to_tensor(self.moving_mean) + f * mean)
                self.moving_variance.assign((1.0 - f) * tf.convert_to_tensor(self.moving_variance) + f * unbiased)
                return y
            return tf.nn.batch_normalization(x, tf.convert_to_tensor(self.moving_mean),
                                             tf.convert_to_tensor(self.moving_variance), beta, gamma,
                                             self.kernel_epsilon)

    class OptionAShortcut(keras.layers.Layer):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra_channels: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra_channels

        def call(self, x):
            if self.stride > 1:
                x = x[:, ::self.stride, ::self.stride, :]
            return tf.pad(x, [[0, 0], [0, 0], [0, 0], [0, self.extra]]) if self.extra else x

        def compute_output_shape(self, s):
            h = None if s[1] is None else -(-s[1] // self.stride)
            w = None if s[2] is None else -(-s[2] // self.stride)
            return (s[0], h, w, s[3] + self.extra)

    class ChannelsFirstFlatten(keras.layers.Layer):
        """Flatten in C, H, W order (only where no dense layer can absorb the permutation)."""

        def call(self, x):
            return tf.reshape(tf.transpose(x, [0, 3, 1, 2]), [-1, x.shape[1] * x.shape[2] * x.shape[3]])

        def compute_output_shape(self, s):
            return (s[0], s[1] * s[2] * s[3])

    class ResidualBlock(keras.layers.Layer):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1(4x) (bottleneck), + shortcut, relu."""

        def __init__(self, spec: dict, bn_epsilon: float, **kwargs):
            super().__init__(**kwargs)
            cin, h, w = spec["in_shape"]
            cout, ho, wo = spec["out_shape"]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                plan = [(f, 3, s, (h, w)), (f, 3, 1, (ho, wo))]
            else:
                plan = [(f, 1, 1, (h, w)), (f, 3, s, (h, w)), (cout, 1, 1, (ho, wo))]
            self.convs = [conv2d(co, (k, k), (st, st), (k // 2, k // 2), hw, bias=False) for co, k, st, hw in plan]
            self.bns = [batch_norm(bn_epsilon, 0.1) for _ in plan]
            self.kind = spec["shortcut"]
            if self.kind == "projection":
                self.proj = conv2d(cout, (1, 1), (s, s), (0, 0), (h, w), bias=False)
                self.proj_bn = batch_norm(bn_epsilon, 0.1)
            elif self.kind == "option_a":
                self.option_a = OptionAShortcut(s, cout - cin)
            self.out_channels = cout

        def build(self, input_shape):
            shape = tuple(input_shape)
            for c, b in zip(self.convs, self.bns):
                c.build(shape)
                shape = c.compute_output_shape(shape)
                b.build(shape)
            if self.kind == "projection":
                self.proj.build(tuple(input_shape))
                self.proj_bn.build(self.proj.compute_output_shape(tuple(input_shape)))

        def call(self, x, training=None):
            y = x
            last = len(self.convs) - 1
            for i, (c, b) in enumerate(zip(self.convs, self.bns)):
                y = b(c(y), training=training)
                if i < last:
                    y = tf.nn.relu(y)
            if self.kind == "projection":
                shortcut = self.proj_bn(self.proj(x), training=training)
            elif self.kind == "option_a":
                shortcut = self.option_a(x)
            else:
                shortcut = x
            return tf.nn.relu(y + shortcut)

        def compute_output_shape(self, s):
            shape = tuple(s)
            for c in self.convs:
                shape = c.compute_output_shape(shape)
            return shape

    state = {"bn_floor": None}

    def conv2d(filters, kernel, stride, padding, hw, bias):
        mode, pads = padding_plan(hw, kernel, stride, padding)
        if pads is None:
            return keras.layers.Conv2D(filters, tuple(kernel), tuple(stride), padding=mode, use_bias=bias)
        return PaddedConv2D(pads, filters=filters, kernel_size=tuple(kernel), strides=tuple(stride), use_bias=bias)

    def batch_norm(eps, momentum):
        floor = state["bn_floor"]
        return FusedBatchNorm(momentum, max(eps, floor) if floor else eps, epsilon=eps)

    def max_pool(size, stride, padding, hw):
        mode, pads = padding_plan(hw, size, stride, padding)
        if pads is None:
            return keras.layers.MaxPooling2D(tuple(size), tuple(stride), padding=mode)
        return PaddedMaxPool2D(pads, pool_size=tuple(size), strides=tuple(stride))

    return types.SimpleNamespace(
        PaddedConv2D=PaddedConv2D, PaddedMaxPool2D=PaddedMaxPool2D, FusedBatchNorm=FusedBatchNorm,
        OptionAShortcut=OptionAShortcut, ChannelsFirstFlatten=ChannelsFirstFlatten, ResidualBlock=ResidualBlock,
        conv2d=conv2d, batch_norm=batch_norm, max_pool=max_pool, state=state)


def set_batch_norm_floor(cuda: bool):
    """The epsilon floor of the batch norms built next: cuDNN's minimum on CUDA, none on CPU."""
    state = layer_classes().state
    state["bn_floor"] = 1.001e-5 if cuda else None  # cuDNN's minimum epsilon
    return state["bn_floor"]


# --------------------------------------------------------------------------------------------------
# building


def flatten_plan(layers: list[dict]) -> tuple[dict[int, str], dict[int, tuple[int, int, int]]]:
    """How each flatten is done, and which later layers take H, W, C-ordered features.

    Returns ({flatten index: "reshape" | "channels_first"}, {layer index: (C, H, W)}) where the
    second maps every dense or 1-d batch norm whose input features arrive in H, W, C order.
    """
    modes, permuted = {}, {}
    for i, spec in enumerate(layers):
        if spec["type"] != "flatten":
            continue
        shape = spec["in_shape"]
        if len(shape) != 3 or shape[1] * shape[2] == 1:
            modes[i] = "reshape"  # already flat, or no spatial extent: orders agree
            continue
        followers = []
        for j in range(i + 1, len(layers)):
            t = layers[j]["type"]
            if t in ELEMENTWISE or t == "flatten":
                continue
            if t == "batch_norm":
                followers.append(j)
                continue
            if t == "dense":
                followers.append(j)
                modes[i] = "reshape"
                permuted.update({k: tuple(shape) for k in followers})
            break
        modes.setdefault(i, "channels_first")
    return modes, permuted


class LayerPlan:
    """What a layer's builder may need beyond its resolved spec."""

    def __init__(self, hw, flatten: str | None, deterministic: bool, built: list | None = None,
                 tied_embedding: bool = False, inp: dict | None = None):
        self.hw = hw  # (H, W) of an image input, else None
        self.inp = inp  # the resolved network's input (masked_tokens: its masked positions, segment boundary)
        self.flatten = flatten  # a flatten's mode ("reshape" | "channels_first"), else None
        self.deterministic = deterministic
        self.built = built if built is not None else []  # the Keras layers of the layers before, per layer
        self.tied_embedding = tied_embedding  # a token embedding whose table a tied lm_head reuses


def _dense(spec, plan):
    keras = load_keras()
    init = spec.get("init")  # the described initialisation, else Keras' Glorot-uniform (and zero biases)
    described = ({"kernel_initializer": keras.initializers.VarianceScaling(
        init["scale"], init["mode"], "untruncated_normal" if init["distribution"] == "normal" else "uniform"),
        "bias_initializer": "zeros"} if init else {})
    return [keras.layers.Dense(spec["units"], use_bias=spec["bias"], **described)]


def _conv2d(spec, plan):
    return [layer_classes().conv2d(spec["filters"], spec["kernel"], spec["stride"], spec["padding"], plan.hw,
                                   spec["bias"])]


def _max_pool(spec, plan):
    return [layer_classes().max_pool(spec["size"], spec["stride"], spec["padding"], plan.hw)]


def _avg_pool(spec, plan):
    return [load_keras().layers.AveragePooling2D(tuple(spec["size"]), tuple(spec["stride"]), padding="valid")]


def _global_avg_pool(spec, plan):
    return [load_keras().layers.GlobalAveragePooling2D()]


def _batch_norm(spec, plan):
    return [layer_classes().batch_norm(spec["eps"], spec["momentum"])]


def _relu(spec, plan):
    return [load_keras().layers.ReLU()]


def _activation(spec, plan):  # sigmoid, tanh: Keras' own names
    return [load_keras().layers.Activation(spec["type"])]


def _flatten(spec, plan):
    if len(spec["in_shape"]) == 1:
        return []
    if plan.flatten == "channels_first":
        return [layer_classes().ChannelsFirstFlatten()]
    return [load_keras().layers.Flatten()]


def _dropout(spec, plan):
    return [] if plan.deterministic or spec["rate"] == 0 else [load_keras().layers.Dropout(spec["rate"])]


def _embedding(spec, plan):
    keras = load_keras()
    # the described scale, else Keras' own uniform(-0.05, 0.05)
    init = ({"embeddings_initializer": keras.initializers.RandomNormal(stddev=spec["init_std"])}
            if spec.get("init_std") else {})
    if plan.tied_embedding:  # Keras' embedding with the reverse projection a tied head calls
        return [keras.layers.ReversibleEmbedding(spec["vocabulary"], spec["dim"], tie_weights=True, **init)]
    return [keras.layers.Embedding(spec["vocabulary"], spec["dim"], **init)]


def lstm_layer(hidden: int, **kwargs):
    """keras.layers.LSTM in the cuDNN-compatible configuration (Keras picks cuDNN on GPU when it sees
    exactly this), returning the sequence: the runner's LSTM, and the kernels suite's `lstm_layer`."""
    return load_keras().layers.LSTM(hidden, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                                    dropout=0.0, recurrent_dropout=0.0, unroll=False, return_sequences=True,
                                    **kwargs)


def _lstm(spec, plan):
    return [lstm_layer(spec["hidden"]) for _ in range(spec["layers"])]


def _residual(spec, plan):
    return [layer_classes().ResidualBlock(spec, 1e-5)]


# --------------------------------------------------------------------------------------------------
# canonical weights (src/dlbench/definitions/weights.py) of the types above


def batch_norm_entries(prefix: str, bn, layout="same") -> dict:
    """gamma, beta and the running statistics of a batch norm, in `layout` ("same", or a 1-d batch
    norm's ("hwc_rows", (C, H, W)) after a flatten)."""
    return {f"{prefix}.gamma": (bn.gamma, layout), f"{prefix}.beta": (bn.beta, layout),
            f"{prefix}.running_mean": (bn.moving_mean, layout),
            f"{prefix}.running_var": (bn.moving_variance, layout)}


def _dense_weights(prefix, spec, made, features_chw) -> dict:
    (layer,) = made
    out = {f"{prefix}.weight": (layer.kernel, "transposed" if features_chw is None else
                                ("hwc_transposed", features_chw))}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, "same")
    return out


def _conv2d_weights(prefix, spec, made, features_chw) -> dict:
    (layer,) = made
    out = {f"{prefix}.weight": (layer.kernel, "conv")}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, "same")
    return out


def _batch_norm_weights(prefix, spec, made, features_chw) -> dict:
    return batch_norm_entries(prefix, made[0], "same" if features_chw is None else ("hwc_rows", features_chw))


def _embedding_weights(prefix, spec, made, features_chw) -> dict:
    return {f"{prefix}.weight": (made[0].embeddings, "same")}


def _lstm_weights(prefix, spec, made, features_chw) -> dict:
    out = {}
    for k, layer in enumerate(made):
        cell = layer.cell
        out[f"{prefix}.l{k}.w_ih"] = (cell.kernel, "transposed")
        out[f"{prefix}.l{k}.w_hh"] = (cell.recurrent_kernel, "transposed")
        out[f"{prefix}.l{k}.bias"] = (cell.bias, "same")
    return out


def _residual_weights(prefix, spec, made, features_chw) -> dict:
    block = made[0]
    out = {}
    for j, (c, b) in enumerate(zip(block.convs, block.bns), start=1):
        out[f"{prefix}.conv{j}.weight"] = (c.kernel, "conv")
        out.update(batch_norm_entries(f"{prefix}.bn{j}", b))
    if spec["shortcut"] == "projection":
        out[f"{prefix}.proj.weight"] = (block.proj.kernel, "conv")
        out.update(batch_norm_entries(f"{prefix}.proj_bn", block.proj_bn))
    return out


# --------------------------------------------------------------------------------------------------
# the table: one Layer(build, weights) per type (weights None: a type without weights)

LAYERS = LayerTable("tensorflow", {
    "dense": Layer(_dense, _dense_weights),
    "conv2d": Layer(_conv2d, _conv2d_weights),
    "max_pool": Layer(_max_pool),
    "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool),
    "batch_norm": Layer(_batch_norm, _batch_norm_weights),
    "relu": Layer(_relu),
    "sigmoid": Layer(_activation),
    "tanh": Layer(_activation),
    "flatten": Layer(_flatten),
    "dropout": Layer(_dropout),
    "embedding": Layer(_embedding, _embedding_weights),
    "lstm": Layer(_lstm, _lstm_weights),
    "residual": Layer(_residual, _residual_weights),
    "position_embedding": Layer(build_position_embedding, position_embedding_weights),
    "patch_embedding": Layer(build_patch_embedding, patch_embedding_weights),
    "layer_norm": Layer(build_layer_norm, layer_norm_weights),
    "gelu": Layer(build_gelu),
    "attention": Layer(build_attention, attention_weights),
    "transformer_block": Layer(build_transformer_block, transformer_block_weights),
    "token_pool": Layer(build_token_pool),
    "lm_head": Layer(build_lm_head, lm_head_weights),
    "segment_embedding": Layer(build_segment_embedding, segment_embedding_weights),
    "pretraining_heads": Layer(build_pretraining_heads, pretraining_heads_weights),
    "rms_norm": Layer(build_rms_norm, rms_norm_weights),
    "grouped_attention": Layer(build_grouped_attention, grouped_attention_weights),
    "swiglu": Layer(build_swiglu, swiglu_weights),
    "moe": Layer(build_moe, moe_weights),
    "llama_block": Layer(build_llama_block, llama_block_weights),
})


def build_layer(spec: dict, plan: LayerPlan) -> list:
    """One resolved layer (see dlbench.definitions.analysis) as its Keras layers (none, one or more)."""
    return LAYERS.builder(spec["type"])(spec, plan)
