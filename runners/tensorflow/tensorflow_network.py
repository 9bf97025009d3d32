"""The TensorFlow runner's building blocks: the Keras network from a resolved dlbench description
(one builder per layer type, in LAYERS), its canonical weights in and out, the padding and flatten
plans, and what the single-process step and the multi-worker step share. tensorflow_runner.py,
tensorflow_kernels.py and tensorflow_distributed.py all build from here.

TensorFlow and Keras are imported on first use (`load_tf()`, `load_keras()`), after
TF_CPP_MIN_LOG_LEVEL is set below.

Choices (all recorded in the result's `settings`):
- layout: channels-last (NHWC) for images on every device; TensorFlow's CPU Conv2D kernels support
  only NHWC and cuDNN is at least as fast in it. Canonical channels-first inputs are transposed once
  in `prepare`, never inside the timed step. Weights are converted at load/export: conv OIHW <-> HWIO,
  dense (out, in) <-> (in, out), LSTM (4h, in) <-> (in, 4h).
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
- precision (runners/common/contract.py): fp32 and tf32 build the network in float32 as Keras
  does by default and differ only in TensorFlow's TF32 switch (`float32_math`: set, then read back;
  pinned off for every precision but tf32). amp_bf16 and amp_fp16 are Keras' own mixed precision:
  the model and optimiser are built under the global dtype policy "mixed_bfloat16" or
  "mixed_float16" (`precision_scope`): float32 variables, bfloat16/float16 computation, and, as
  Keras recommends, the network's output cast to float32 by a last float32 layer
  (keras.layers.Activation("linear", dtype="float32"), no weights), so logits and loss are float32;
  the batch norm's fused kernel takes the half-precision activations with float32 statistics (its
  U). amp_fp16 adds keras.optimizers.LossScaleOptimizer (dynamic loss scaling; the runner).
- precision float64 (single-process `prepare` only, for `dlbench check`): the model and the
  optimiser are built under Keras' own dtype mechanism (`precision_scope`: the global dtype policy
  and floatx set to float64, restored afterwards), so every variable (parameters, running
  statistics, SGD momentum slots, the learning rate), activation, gradient and the loss are float64.
  The one exception is the fused batch-norm kernel: FusedBatchNormV3 has no float64 kernel (T is
  half, bfloat16 or float), so a float64 batch norm computes the same arithmetic with unfused TF ops
  (tf.nn.moments + tf.nn.batch_normalization, running statistics as the kernel updates them).
- LSTM: keras.layers.LSTM in its cuDNN-compatible configuration (tanh/sigmoid, no recurrent
  dropout, not unrolled, one bias vector: the canonical form); Keras runs the cuDNN kernel on GPU
  and its while-loop kernel on CPU.
- transformers (`transformer_classes`): keras.layers.LayerNormalization(epsilon), GELU as
  keras.activations.gelu(approximate=) in the network's form (Dense(activation=) in the MLP),
  attention as keras.layers.MultiHeadAttention (separate q/k/v/out EinsumDense kernels, mapped to
  the canonical matrices by a transpose and a reshape; use_causal_mask), which hands its products to
  keras.ops.dot_product_attention unless the layer has dropout. Keras' TensorFlow backend offers no
  flash attention (flash_attention=True raises there), so the default None is kept; what ran is
  read from a trace into settings["attention"] (`attention_setting`). The position table and class
  token are weights of small layers; patches are a strided Conv2D on the NHWC image, its grid
  reshaped to tokens (row-major, the canonical order); a tied lm_head is the token embedding's
  reverse projection, keras.layers.ReversibleEmbedding(tie_weights=True): one variable.
- BERT (a masked_tokens input): segment_embedding is a keras.layers.Embedding (token types) looked up
  at the fixed segment vector (sentence A, then B) and added, broadcast over the batch;
  pretraining_heads (`PretrainingHeads`) is Keras' Dense(tanh) pooler on position 0 with a Dense(2)
  next-sentence classifier, tf.gather of the input's fixed masked positions on the sequence axis,
  Dense(GELU) + LayerNormalization, and the decoder: the tied lm_head's reverse projection of the
  token embedding plus its bias (one table variable) or a Dense(vocabulary) untied. Its output is
  the pair (masked-LM logits (B, M, vocabulary), next-sentence logits (B, 2)), both cast to float32
  by the mixed-precision tail; `loss_function` sums the two mean cross-entropies (labels: the M
  masked tokens, then the next-sentence label), and the logits the check and output_shape report
  are the masked-LM ones (`logits_of`).
- With `deterministic`, every dropout rate is 0. In float64 two Keras/TensorFlow constants are made
  exact (tf.nn.gelu's and MultiHeadAttention's scale go through float32 tensors otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import os
import types

from runners.common.contract import CHECK_PRECISION, Layer, LayerTable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

ELEMENTWISE = ("relu", "sigmoid", "tanh", "dropout")

# The Keras global dtype policy each precision builds under (None: Keras' default, float32)
KERAS_POLICY = {"fp32": None, "tf32": None, "amp_bf16": "mixed_bfloat16", "amp_fp16": "mixed_float16",
                CHECK_PRECISION: "float64"}
MIXED = ("amp_bf16", "amp_fp16")
TF32_CAPABILITY = (8, 0)  # NVIDIA Ampere: the first GPUs with TF32 tensor cores


def load_tf():
    """The tensorflow module (imported on first use)."""
    import tensorflow as tf

    return tf


def load_keras():
    """The keras module (imported on first use)."""
    import keras

    return keras


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


# --------------------------------------------------------------------------------------------------
# transformer layers (schema.py's canonical semantics), Keras 3 layers where Keras has them


@functools.lru_cache(maxsize=None)
def transformer_classes():
    """The transformer layers that Keras 3 has no layer for as such (a position table added, patches
    with a class token, a block, the class token's pooling, a tied head), defined once TensorFlow is
    imported. Inside, everything Keras does have: LayerNormalization, Dense with GELU,
    MultiHeadAttention, Dropout, Conv2D, ReversibleEmbedding's reverse projection."""
    import numpy

    tf, keras = load_tf(), load_keras()

    class PositionEmbedding(keras.layers.Layer):
        """x + P[0:T]: a learned (max_length, dim) table whose first T rows are added (keras_hub's
        PositionEmbedding; GPT-2's wpe, ViT's pos_embed)."""

        def __init__(self, max_length: int, **kwargs):
            super().__init__(**kwargs)
            self.max_length = max_length

        def build(self, input_shape):
            self.table = self.add_weight(name="table", shape=(self.max_length, input_shape[-1]),
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

        def call(self, x):
            # the variable is float32 under a mixed policy: cast to the activations' dtype, as
            # Keras' autocast would, explicitly (a slice of a variable is not always autocast)
            return x + tf.cast(tf.convert_to_tensor(self.table)[: x.shape[1]], x.dtype)

        def compute_output_shape(self, s):
            return s

    class PatchEmbedding(keras.layers.Layer):
        """keras.layers.Conv2D with kernel = stride = patch on the NHWC image, its (h, w) grid
        reshaped to tokens (row-major: the canonical order, NHWC needs no transpose for it), the
        class token prepended as token 0."""

        def __init__(self, patch: int, dim: int, class_token: bool, **kwargs):
            super().__init__(**kwargs)
            self.dim, self.has_class_token = dim, class_token
            self.proj = keras.layers.Conv2D(dim, patch, strides=patch, padding="valid", use_bias=True, name="proj")

        def build(self, input_shape):
            self.proj.build(tuple(input_shape))
            self.class_token = (self.add_weight(name="class_token", shape=(self.dim,),
                                                initializer=keras.initializers.RandomNormal(stddev=0.02))
                                if self.has_class_token else None)

        def call(self, x):
            grid = self.proj(x)  # (B, h, w, dim)
            tokens = tf.reshape(grid, [-1, grid.shape[1] * grid.shape[2], self.dim])
            if self.class_token is None:
                return tokens
            cls = tf.cast(tf.convert_to_tensor(self.class_token), tokens.dtype)
            cls = tf.broadcast_to(cls[None, None, :], [tf.shape(tokens)[0], 1, self.dim])
            return tf.concat([cls, tokens], axis=1)

        def compute_output_shape(self, s):
            n = (s[1] // self.proj.kernel_size[0]) * (s[2] // self.proj.kernel_size[1])
            return (s[0], n + (1 if self.has_class_token else 0), self.dim)

    def multi_head_attention(spec: dict):
        """keras.layers.MultiHeadAttention with q, k, v and out as separate EinsumDense kernels
        (D, heads, head_size) and (heads, head_size, D); key_dim = value_dim = the head size, its
        scale 1/sqrt(head_size), the canonical one."""
        mha = keras.layers.MultiHeadAttention(spec["heads"], spec["head_size"], dropout=spec["dropout"],
                                              use_bias=spec["bias"], name="attn")
        if mha.compute_dtype == "float64":
            # Keras' TensorFlow backend applies the scale (a Python float) as tf.cast(scale, dtype),
            # which makes a float32 tensor of it first: 1/sqrt(3) or 1/sqrt(8) rounded to float32,
            # a 3e-8 error in every score in float64. A numpy float64 (still a float) converts exactly.
            mha._inverse_sqrt_key_dim = numpy.float64(mha._inverse_sqrt_key_dim)
        return mha

    class SelfAttention(keras.layers.Layer):
        """The attention type on its own: MultiHeadAttention called with query = value = x."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            self.causal = spec["causal"]
            self.mha = multi_head_attention(spec)

        def build(self, input_shape):
            self.mha.build(tuple(input_shape), tuple(input_shape))

        def call(self, x, training=None):
            return self.mha(x, x, use_causal_mask=self.causal, training=training)

        def compute_output_shape(self, s):
            return s

    class TransformerBlock(keras.layers.Layer):
        """Layer norms, MultiHeadAttention and a GELU MLP (Dense, Dense) with two residual joins,
        pre- or post-norm (keras_hub's TransformerEncoder/Decoder arrangement), dropout on each
        branch before its join."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            dim = spec["in_shape"][-1]
            self.hidden = spec["mlp_ratio"] * dim
            self.pre, self.causal = spec["norm"] == "pre", spec["causal"]
            self.ln1 = keras.layers.LayerNormalization(epsilon=spec["eps"], name="ln1")
            self.attn = multi_head_attention(spec)
            self.ln2 = keras.layers.LayerNormalization(epsilon=spec["eps"], name="ln2")
            self.fc1 = keras.layers.Dense(self.hidden, activation=gelu(spec["gelu"]), use_bias=spec["bias"],
                                          name="fc1")
            self.fc2 = keras.layers.Dense(dim, use_bias=spec["bias"], name="fc2")
            self.drop1 = keras.layers.Dropout(spec["dropout"], name="drop1")
            self.drop2 = keras.layers.Dropout(spec["dropout"], name="drop2")

        def build(self, input_shape):
            s = tuple(input_shape)
            self.ln1.build(s)
            self.attn.build(s, s)
            self.ln2.build(s)
            self.fc1.build(s)
            self.fc2.build((*s[:-1], self.hidden))

        def call(self, x, training=None):
            def attn(h):
                return self.drop1(self.attn(h, h, use_causal_mask=self.causal, training=training), training=training)

            def mlp(h):
                return self.drop2(self.fc2(self.fc1(h)), training=training)

            if self.pre:
                x = x + attn(self.ln1(x))
                return x + mlp(self.ln2(x))
            x = self.ln1(x + attn(x))
            return self.ln2(x + mlp(x))

        def compute_output_shape(self, s):
            return s

    class ClassTokenPool(keras.layers.Layer):
        """Row 0 of the tokens, the class token (the mean is keras.layers.GlobalAveragePooling1D)."""

        def call(self, x):
            return x[:, 0]

        def compute_output_shape(self, s):
            return (s[0], s[2])

    class TiedLMHead(keras.layers.Layer):
        """Logits x E^T (+ b) through the token embedding's own reverse projection
        (keras.layers.ReversibleEmbedding(tie_weights=True), keras_hub's GPT-2 head): E is the one
        embeddings variable of layer 0, so its gradient is the sum of both uses, it is updated once
        and counted once (Keras deduplicates a sublayer's variables in trainable_variables)."""

        def __init__(self, embedding, use_bias: bool, **kwargs):
            super().__init__(**kwargs)
            self.embedding, self.use_bias = embedding, use_bias

        def build(self, input_shape):
            self.bias = (self.add_weight(name="bias", shape=(self.embedding.input_dim,), initializer="zeros")
                         if self.use_bias else None)

        def call(self, x):
            logits = self.embedding(x, reverse=True)
            return logits if self.bias is None else logits + tf.cast(tf.convert_to_tensor(self.bias), logits.dtype)

        def compute_output_shape(self, s):
            return (*s[:-1], self.embedding.input_dim)

    def gelu(form: str):
        """keras.activations.gelu in the network's form (Keras' default is erf, approximate=False;
        tanh is approximate=True: tf.nn.gelu's formula is GPT-2's), except in float64 (below)."""
        approximate = GELU_APPROXIMATE[form]

        def activation(x):
            if x.dtype == tf.float64:
                return gelu_float64(x, approximate)
            return keras.activations.gelu(x, approximate=approximate)

        activation.__name__ = f"gelu_{form}"
        return activation

    def gelu_float64(x, approximate: bool):
        """tf.nn.gelu's own formulas with float64 constants. tf.nn.gelu (TensorFlow 2.21) makes its
        constants 1/sqrt(2) and 0.044715 with math_ops.cast(<Python float>, dtype), which goes
        through a float32 tensor: in float64 the erf form is then off by ~5e-9 and the tanh form by
        ~3e-10 (relative), which float64's check (1e-9) sees."""
        if approximate:
            cubic = tf.constant(0.044715, x.dtype) * tf.math.pow(x, 3)
            inner = tf.constant(0.7978845608028654, x.dtype) * (x + cubic)
            return 0.5 * x * (1.0 + tf.math.tanh(inner))
        return 0.5 * x * tf.math.erfc(-x * tf.constant(0.7071067811865476, x.dtype))

    class SegmentEmbedding(keras.layers.Layer):
        """x + S[s]: BERT's token-type embedding, a keras.layers.Embedding (segments, dim) looked up
        at each position's fixed segment (positions before the input's segment_boundary in 0, the
        rest in 1: the same for every sample), the (T, dim) rows broadcast over the batch."""

        def __init__(self, segments: int, dim: int, segment_ids, **kwargs):
            super().__init__(**kwargs)
            self.segment_ids = numpy.asarray(segment_ids, dtype=numpy.int32)
            self.table = keras.layers.Embedding(segments, dim, name="token_type",
                                                embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02))

        def build(self, input_shape):
            self.table.build(self.segment_ids.shape)

        def call(self, x):
            # the lookup (tf.gather) gives the rows in the embedding's compute dtype
            return x + tf.cast(self.table(tf.constant(self.segment_ids)), x.dtype)

        def compute_output_shape(self, s):
            return s

    class PretrainingHeads(keras.layers.Layer):
        """BERT's heads (HuggingFace's BertPooler + BertPreTrainingHeads) on the encoder's (B, T, D):
        the pooler keras.layers.Dense(D, tanh) on position 0 and the next-sentence Dense(2) on it;
        the masked positions gathered (tf.gather on the sequence axis, a fixed index vector), the
        transform Dense(D, GELU in the network's form), LayerNormalization(eps), and the decoder: the
        token embedding's reverse projection plus a bias (TiedLMHead, tied) or a Dense(vocabulary) of
        its own. Returns (masked-LM logits (B, M, vocabulary), next-sentence logits (B, 2))."""

        def __init__(self, spec: dict, masked_positions, embedding=None, **kwargs):
            super().__init__(**kwargs)
            dim, (masked, vocabulary) = spec["in_shape"][-1], spec["out_shape"]
            self.positions = numpy.asarray(masked_positions, dtype=numpy.int32)
            if self.positions.shape != (masked,):
                raise ValueError(f"pretraining_heads: {self.positions.size} masked positions, the layer gives {masked}")
            self.vocabulary = vocabulary
            self.pooler = keras.layers.Dense(dim, activation="tanh", name="pooler")
            self.next_sentence = keras.layers.Dense(NEXT_SENTENCE_CLASSES, name="next_sentence")
            self.transform = keras.layers.Dense(dim, activation=gelu(spec["gelu"]), name="transform")
            self.transform_ln = keras.layers.LayerNormalization(epsilon=spec["eps"], name="transform_ln")
            self.decoder = (TiedLMHead(embedding, True, name="decoder") if embedding is not None else
                            keras.layers.Dense(vocabulary, name="decoder"))

        def build(self, input_shape):
            batch, _, dim = tuple(input_shape)
            gathered = (batch, int(self.positions.size), dim)
            self.pooler.build((batch, dim))
            self.next_sentence.build((batch, dim))
            self.transform.build(gathered)
            self.transform_ln.build(gathered)
            self.decoder.build(gathered)

        def call(self, h):
            next_sentence = self.next_sentence(self.pooler(h[:, 0]))
            masked = tf.gather(h, tf.constant(self.positions), axis=1)  # (B, M, D)
            return self.decoder(self.transform_ln(self.transform(masked))), next_sentence

        def compute_output_shape(self, s):
            return (s[0], int(self.positions.size), self.vocabulary), (s[0], NEXT_SENTENCE_CLASSES)

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, TransformerBlock=TransformerBlock,
                                 ClassTokenPool=ClassTokenPool, TiedLMHead=TiedLMHead,
                                 SegmentEmbedding=SegmentEmbedding, PretrainingHeads=PretrainingHeads, gelu=gelu)


GELU_APPROXIMATE = {"erf": False, "tanh": True}  # the schema's form -> keras.activations.gelu's `approximate`
NEXT_SENTENCE_CLASSES = 2  # pretraining_heads' next-sentence classifier (definitions/layers/pretraining_heads.py)
TIED_HEADS = ("lm_head", "pretraining_heads")  # the layer types that may reuse the token embedding's table
TOKEN_INPUTS = ("tokens", "masked_tokens")  # the input kinds of int64 token ids


# --------------------------------------------------------------------------------------------------
# building


def _flatten_plan(layers: list[dict]) -> tuple[dict[int, str], dict[int, tuple[int, int, int]]]:
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


def _position_embedding(spec, plan):
    return [transformer_classes().PositionEmbedding(spec["max_length"])]


def _patch_embedding(spec, plan):
    return [transformer_classes().PatchEmbedding(spec["patch"], spec["dim"], spec["class_token"])]


def _layer_norm(spec, plan):
    return [load_keras().layers.LayerNormalization(epsilon=spec["eps"])]  # Keras' default eps is 1e-3


def _gelu(spec, plan):
    return [load_keras().layers.Activation(transformer_classes().gelu(spec["form"]))]


def _attention(spec, plan):
    return [transformer_classes().SelfAttention(spec)]


def _transformer_block(spec, plan):
    return [transformer_classes().TransformerBlock(spec)]


def _token_pool(spec, plan):
    if spec["mode"] == "mean":
        return [load_keras().layers.GlobalAveragePooling1D()]  # (B, T, D) -> (B, D), the mean over T
    return [transformer_classes().ClassTokenPool()]


def _lm_head(spec, plan):
    if not spec["tied"]:
        return [load_keras().layers.Dense(spec["out_shape"][-1], use_bias=spec["bias"])]
    return [transformer_classes().TiedLMHead(_tied_embedding(plan, "lm_head"), spec["bias"])]


def _tied_embedding(plan, what: str):
    """The token embedding (layer 0, a ReversibleEmbedding) whose table a tied head projects onto."""
    (embedding,) = plan.built[0]  # the schema ties the head to the network's first layer, the token embedding
    if not isinstance(embedding, load_keras().layers.ReversibleEmbedding):
        raise TypeError(f"a tied {what} needs the token embedding as layer 0, found {type(embedding).__name__}")
    return embedding


def _segment_embedding(spec, plan):
    steps, dim = spec["in_shape"]
    boundary = plan.inp["segment_boundary"]  # sentence A (segment 0), then sentence B (segment 1)
    return [transformer_classes().SegmentEmbedding(spec["segments"], dim, [int(t >= boundary) for t in range(steps)])]


def _pretraining_heads(spec, plan):
    embedding = _tied_embedding(plan, "pretraining_heads") if spec["tied"] else None
    return [transformer_classes().PretrainingHeads(spec, plan.inp["masked_positions"], embedding)]


LAYERS = LayerTable("tensorflow", {
    "dense": Layer(_dense), "conv2d": Layer(_conv2d), "max_pool": Layer(_max_pool), "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool), "batch_norm": Layer(_batch_norm), "relu": Layer(_relu), "sigmoid": Layer(_activation),
    "tanh": Layer(_activation), "flatten": Layer(_flatten), "dropout": Layer(_dropout), "embedding": Layer(_embedding), "lstm": Layer(_lstm),
    "residual": Layer(_residual), "position_embedding": Layer(_position_embedding), "patch_embedding": Layer(_patch_embedding),
    "layer_norm": Layer(_layer_norm), "gelu": Layer(_gelu), "attention": Layer(_attention), "transformer_block": Layer(_transformer_block),
    "token_pool": Layer(_token_pool), "lm_head": Layer(_lm_head), "segment_embedding": Layer(_segment_embedding),
    "pretraining_heads": Layer(_pretraining_heads),
})


def build_layer(spec: dict, plan: LayerPlan) -> list:
    """One resolved layer (see dlbench.definitions.analysis) as its Keras layers (none, one or more)."""
    return LAYERS.builder(spec["type"])(spec, plan)


def storage_dtype(precision: str) -> str:
    """The dtype of the variables (and of inputs, exported weights) under `precision`: float64 for
    the check's float64, float32 for every other (the AMP modes keep float32 variables)."""
    return "float64" if precision == CHECK_PRECISION else "float32"


@contextlib.contextmanager
def precision_scope(precision: str):
    """Keras' own dtype mechanism for what is built inside: fp32 and tf32 leave Keras as it is
    (float32); amp_bf16 / amp_fp16 set the global dtype policy to "mixed_bfloat16" /
    "mixed_float16" (float32 variables, reduced-precision computation); float64 sets the policy and
    floatx (keras.Input's default, the optimiser's learning-rate variable; its slots follow their
    variables) to float64. Both are restored on exit (a layer keeps the policy it was built with)."""
    name = KERAS_POLICY[precision]
    if name is None:
        yield
        return
    keras = load_keras()
    policy, floatx = keras.config.dtype_policy(), keras.config.floatx()
    keras.config.set_dtype_policy(name)
    if precision == CHECK_PRECISION:
        keras.config.set_floatx(precision)
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def build_network(network: dict, deterministic: bool = False, precision: str = "fp32"):
    """A keras.Sequential for the resolved network and, per resolved layer, its Keras layers, in
    `precision` (see `precision_scope`). `deterministic`: dropout layers are left out, and the
    dropout of attention and transformer blocks (on the probabilities and the branches) is built at
    rate 0."""
    with precision_scope(precision):
        return _build_network(network, deterministic, precision)


def _build_network(network: dict, deterministic: bool, precision: str):
    keras = load_keras()
    layers = network["layers"]
    flatten_modes, permuted = _flatten_plan(layers)
    tied = any(spec["type"] in TIED_HEADS and spec["tied"] for spec in layers)
    per_layer: list[list] = []
    for i, spec in enumerate(layers):
        in_shape = spec["in_shape"]
        hw = tuple(in_shape[1:]) if len(in_shape) == 3 else None
        if deterministic and spec.get("dropout"):  # attention, transformer_block: their own dropout rate
            spec = {**spec, "dropout": 0.0}
        per_layer.append(build_layer(spec, LayerPlan(hw, flatten_modes.get(i), deterministic, per_layer,
                                                     tied_embedding=tied and i == 0, inp=network["input"])))

    inp = network["input"]
    dtype = storage_dtype(precision)
    if inp["kind"] in TOKEN_INPUTS:
        first = keras.Input(shape=(inp["sequence_length"],), dtype="int64")
    elif len(inp["shape"]) == 3:
        c, h, w = inp["shape"]
        first = keras.Input(shape=(h, w, c), dtype=dtype)
    else:
        first = keras.Input(shape=tuple(inp["shape"]), dtype=dtype)
    # mixed precision: the output in float32, as Keras recommends (a weightless float32 last layer;
    # pretraining_heads' two outputs, the masked-LM and next-sentence logits, each cast by it)
    tail = [keras.layers.Activation("linear", dtype="float32", name="logits_float32")] if precision in MIXED else []
    model = keras.Sequential([first] + [layer for made in per_layer for layer in made] + tail, name=network["name"])
    return model, per_layer, flatten_modes, permuted


# --------------------------------------------------------------------------------------------------
# canonical weights (src/dlbench/definitions/weights.py) <-> Keras variables


def _hwc_order(chw):
    """index array: position j of an H, W, C-ordered feature vector holds canonical feature idx[j]."""
    import numpy as np

    c, h, w = chw
    idx = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
    return idx, np.argsort(idx)


def canonical_variables(network: dict, per_layer: list, permuted: dict) -> dict:
    """name -> (keras variable, canonical -> keras array, keras -> canonical array)."""
    same = (lambda a: a, lambda a: a)
    conv = (lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1))
    transposed = (lambda a: a.T, lambda a: a.T)

    def bn_entries(prefix, bn, perm=None):
        fw = same if perm is None else (lambda a: a[perm[0]], lambda a: a[perm[1]])
        return {f"{prefix}.gamma": (bn.gamma, *fw), f"{prefix}.beta": (bn.beta, *fw),
                f"{prefix}.running_mean": (bn.moving_mean, *fw),
                f"{prefix}.running_var": (bn.moving_variance, *fw)}

    out = {}
    for i, (spec, made) in enumerate(zip(network["layers"], per_layer)):
        p, t = f"{i:03d}", spec["type"]
        perm = _hwc_order(permuted[i]) if i in permuted else None
        if t == "dense":
            (layer,) = made
            if perm is None:
                out[f"{p}.weight"] = (layer.kernel, *transposed)
            else:
                idx, inv = perm
                out[f"{p}.weight"] = (layer.kernel, lambda a, idx=idx: a.T[idx], lambda a, inv=inv: a[inv].T)
            if layer.bias is not None:
                out[f"{p}.bias"] = (layer.bias, *same)
        elif t == "conv2d":
            (layer,) = made
            out[f"{p}.weight"] = (layer.kernel, *conv)
            if layer.bias is not None:
                out[f"{p}.bias"] = (layer.bias, *same)
        elif t == "batch_norm":
            out.update(bn_entries(p, made[0], perm))
        elif t == "embedding":
            out[f"{p}.weight"] = (made[0].embeddings, *same)
        elif t == "lstm":
            for k, layer in enumerate(made):
                cell = layer.cell
                out[f"{p}.l{k}.w_ih"] = (cell.kernel, *transposed)
                out[f"{p}.l{k}.w_hh"] = (cell.recurrent_kernel, *transposed)
                out[f"{p}.l{k}.bias"] = (cell.bias, *same)
        elif t == "residual":
            block = made[0]
            for j, (c, b) in enumerate(zip(block.convs, block.bns), start=1):
                out[f"{p}.conv{j}.weight"] = (c.kernel, *conv)
                out.update(bn_entries(f"{p}.bn{j}", b))
            if spec["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = (block.proj.kernel, *conv)
                out.update(bn_entries(f"{p}.proj_bn", block.proj_bn))
        elif t == "position_embedding":
            out[f"{p}.weight"] = (made[0].table, *same)
        elif t == "patch_embedding":
            layer = made[0]
            out.update(dense_entries(p, layer.proj, conv))
            if layer.class_token is not None:
                out[f"{p}.class_token"] = (layer.class_token, *same)
        elif t == "layer_norm":
            out.update(ln_entries(p, made[0]))
        elif t == "attention":
            out.update(attention_entries(p, made[0].mha))
        elif t == "transformer_block":
            block = made[0]
            out.update(ln_entries(f"{p}.ln1", block.ln1))
            out.update(attention_entries(f"{p}.attn", block.attn))
            out.update(ln_entries(f"{p}.ln2", block.ln2))
            out.update(dense_entries(f"{p}.mlp.fc1", block.fc1, transposed))
            out.update(dense_entries(f"{p}.mlp.fc2", block.fc2, transposed))
        elif t == "lm_head":
            if spec["tied"]:  # the weight is 000.weight, the embedding's own variable: only a bias of its own
                if made[0].bias is not None:
                    out[f"{p}.bias"] = (made[0].bias, *same)
            else:
                out.update(dense_entries(p, made[0], transposed))
        elif t == "segment_embedding":
            out[f"{p}.weight"] = (made[0].table.embeddings, *same)
        elif t == "pretraining_heads":
            heads = made[0]
            out.update(dense_entries(f"{p}.pooler", heads.pooler, transposed))
            out.update(dense_entries(f"{p}.next_sentence", heads.next_sentence, transposed))
            out.update(dense_entries(f"{p}.transform", heads.transform, transposed))
            out.update(ln_entries(f"{p}.transform_ln", heads.transform_ln))
            if spec["tied"]:  # the decoder's weight is 000.weight, the embedding's own variable
                out[f"{p}.decoder.bias"] = (heads.decoder.bias, *same)
            else:
                out.update(dense_entries(f"{p}.decoder", heads.decoder, transposed))
    return out


def dense_entries(prefix: str, layer, layout) -> dict:
    """weight (in the layout pair given: canonical -> keras, keras -> canonical) and bias, where the
    layer has one, of a Dense or Conv2D."""
    out = {f"{prefix}.weight": (layer.kernel, *layout)}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, lambda a: a, lambda a: a)
    return out


def ln_entries(prefix: str, ln) -> dict:
    same = (lambda a: a, lambda a: a)
    return {f"{prefix}.gamma": (ln.gamma, *same), f"{prefix}.beta": (ln.beta, *same)}


def attention_entries(prefix: str, mha) -> dict:
    """MultiHeadAttention's four EinsumDense kernels <-> the canonical q/k/v/out. Keras keeps q, k
    and v as (D, heads, head_size) with biases (heads, head_size), and out as (heads, head_size, D):
    row-major, the (heads, head_size) axes are the canonical head-major H*S axis, so each is a
    transpose and a reshape of the canonical (H*S, D) and (D, H*S) matrices."""
    heads, size = mha.num_heads, mha.key_dim
    out = {}
    for part, layer in (("q", mha.query_dense), ("k", mha.key_dense), ("v", mha.value_dense)):
        dim = layer.kernel.shape[0]
        out[f"{prefix}.{part}.weight"] = (layer.kernel, lambda a, d=dim: a.T.reshape(d, heads, size),
                                          lambda a, d=dim: a.reshape(d, heads * size).T)
        if layer.bias is not None:
            out[f"{prefix}.{part}.bias"] = (layer.bias, lambda a: a.reshape(heads, size), lambda a: a.reshape(-1))
    layer = mha.output_dense
    dim = layer.kernel.shape[-1]
    out[f"{prefix}.out.weight"] = (layer.kernel, lambda a: a.T.reshape(heads, size, dim),
                                   lambda a: a.reshape(heads * size, dim).T)
    if layer.bias is not None:
        out[f"{prefix}.out.bias"] = (layer.bias, lambda a: a, lambda a: a)
    return out


def export_weights(variables: dict, precision: str = "fp32") -> dict:
    """Every canonical tensor in the variables' dtype (float32, or float64 for a float64 network)."""
    import numpy as np

    dtype = np.dtype(storage_dtype(precision))
    return {name: np.ascontiguousarray(to_canonical(np.array(var.numpy(), dtype=dtype)))
            for name, (var, _, to_canonical) in variables.items()}


def load_weights(variables: dict, arrays: dict, precision: str = "fp32") -> None:
    """The canonical arrays into the variables, in their dtype (float32 -> float64 is exact)."""
    import numpy as np

    dtype = np.dtype(storage_dtype(precision))
    if set(arrays) != set(variables):
        raise ValueError(f"weight set mismatch: missing {sorted(set(variables) - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(variables))[:5]}")
    for name, (var, to_framework, _) in variables.items():
        value = np.ascontiguousarray(to_framework(np.asarray(arrays[name], dtype=dtype)))
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} gives {tuple(value.shape)}, "
                             f"keras expects {tuple(var.shape)}")
        var.assign(value)


# --------------------------------------------------------------------------------------------------
# which attention Keras ran. keras.layers.MultiHeadAttention computes the heads' products itself (two
# einsums around keras.layers.Softmax, then its Dropout on the probabilities) when the layer has
# dropout, and otherwise hands them to keras.ops.dot_product_attention, whose TensorFlow backend has
# no flash or fused kernel (flash_attention=True raises there, None runs as False): einsum, a float32
# softmax, einsum. Which one a layer takes is read from one trace of it, not assumed.

ATTENTION_BOOKKEEPING = {"Placeholder", "ReadVariableOp", "Identity", "Const", "NoOp"}


def attention_setting(network: dict, per_layer: list, train: bool, jit: bool, cuda: bool) -> dict | None:
    """What Keras ran for each attention (an attention layer, a transformer block's): its
    MultiHeadAttention traced once (a tf.function, never run: no state changes) on one sample of the
    layer's shape in its compute dtype and the step's mode, with keras.ops.dot_product_attention
    watched for the call and its flash_attention argument, and the TensorFlow op types of the trace.
    None when the network has no attention."""
    import unittest.mock

    import keras.src.ops as keras_ops  # the module MultiHeadAttention calls ops.dot_product_attention on

    tf, keras = load_tf(), load_keras()
    attentions = []
    for i, (spec, made) in enumerate(zip(network["layers"], per_layer)):
        if spec["type"] == "attention":
            attentions.append((f"{i:03d}", spec, made[0].mha))
        elif spec["type"] == "transformer_block":
            attentions.append((f"{i:03d}", spec, made[0].attn))
    if not attentions:
        return None
    paths, ops_seen, flash_args = {}, {}, {}
    for name, spec, mha in attentions:
        calls: list = []

        def watched(*args, calls=calls, real=keras_ops.dot_product_attention, **kwargs):
            calls.append(kwargs.get("flash_attention"))
            return real(*args, **kwargs)

        def trace(x, mha=mha, causal=spec["causal"]):
            return mha(x, x, use_causal_mask=causal, training=train)

        with unittest.mock.patch.object(keras_ops, "dot_product_attention", watched):
            graph = tf.function(trace).get_concrete_function(
                tf.TensorSpec((1, *spec["in_shape"]), mha.compute_dtype)).graph
        if calls:
            paths[name] = ("keras.ops.dot_product_attention (Keras' TensorFlow backend: einsum, softmax in at least "
                           "float32, einsum; it has no flash kernel)")
            flash_args[name] = calls[0]
        else:
            dropout = (f"Dropout {spec['dropout']:g} on the probabilities" if train else
                       f"its Dropout {spec['dropout']:g} inactive in inference")
            paths[name] = (f"MultiHeadAttention's own einsum path (einsum, keras.layers.Softmax, {dropout}, einsum), "
                           "which Keras takes whenever the layer has dropout")
            flash_args[name] = None
        ops_seen[name] = sorted({op.type for op in graph.get_operations()} - ATTENTION_BOOKKEEPING)

    def one_or_each(by_layer: dict):  # one value where every attention got the same, else per layer
        values = {repr(v) for v in by_layer.values()}
        return next(iter(by_layer.values())) if len(values) == 1 else by_layer

    return {
        "function": "keras.layers.MultiHeadAttention",
        "kernel": one_or_each(paths),
        "flash_attention": {
            "argument": one_or_each(flash_args),
            "keras.config.is_flash_attention_enabled()": keras.config.is_flash_attention_enabled(),
            "tensorflow_backend": "keras/src/backend/tensorflow/nn.py dot_product_attention: flash_attention None "
                                  "runs as False, True raises 'not supported in tensorflow backend'",
        },
        "tf_ops": one_or_each(ops_seen),
        "executed_by": ("XLA, compiled with the whole step (jit_compile=True)" if jit else
                        "TensorFlow's executor, op by op (" + ("GPU kernels" if cuda else "CPU kernels") + ")"),
        "probe": ("each MultiHeadAttention traced once by tf.function on one sample of its input shape in its "
                  f"compute dtype, {'training' if train else 'inference'} mode; keras.ops.dot_product_attention "
                  "watched for the call"),
    }


# --------------------------------------------------------------------------------------------------


def describe_flatten(layers, modes, permuted):
    out = {}
    for i, mode in modes.items():
        if mode == "channels_first":
            out[str(i)] = "transpose to C,H,W then reshape (no dense layer to absorb the order)"
        elif any(j > i and permuted[j] == tuple(layers[i]["in_shape"]) for j in permuted):
            out[str(i)] = "reshape in H,W,C order; consumer rows permuted at load/export"
        else:
            out[str(i)] = "reshape"
    return out or None


# --------------------------------------------------------------------------------------------------
# what the single-process and the multi-worker steps share


def check_precision(request: dict, supported: tuple[str, ...] = ("fp32",)) -> str:
    """The request's precision (absent: fp32), or one clear error naming it and the accepted ones
    (the single-process `prepare` accepts every precision of the contract and float64, the
    multi-worker step fp32 only)."""
    precision = request.get("precision", "fp32")
    if precision not in supported:
        raise ValueError(f"tensorflow runner: precision {precision!r} is not one it accepts here "
                         f"({', '.join(supported)})")
    return precision


def tf32_unavailable(cuda: bool) -> str | None:
    """None, or why TF32 cannot run here (the CPU, a GPU below compute capability 8.0, or TF32
    switched off under TensorFlow by NVIDIA_TF32_OVERRIDE=0)."""
    why = "tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
    if not cuda:
        return why + "this run is on the CPU"
    tf = load_tf()
    gpu = tf.config.list_physical_devices("GPU")[0]
    details = tf.config.experimental.get_device_details(gpu)
    cc = details.get("compute_capability")
    if cc is None or tuple(cc) < TF32_CAPABILITY:
        have = "an unknown compute capability" if cc is None else f"compute capability {cc[0]}.{cc[1]}"
        return why + f"GPU:0 ({details.get('device_name')}) has {have}"
    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return "tf32: NVIDIA_TF32_OVERRIDE=0 in the environment switches TF32 off in cuBLAS and cuDNN below TensorFlow"
    return None


def float32_math(precision: str) -> dict:
    """Sets TensorFlow's float32 math for `precision` and reads it back: TF32 execution enabled for
    tf32 only (tf.config.experimental.enable_tensor_float_32_execution; TensorFlow's default is on,
    so fp32, float64 and the AMP modes, whose float32 parts stay IEEE, pin it off; on the CPU the
    switch does nothing, but the same code runs on the GPU), and float16 matrix products and
    convolutions accumulating in float32 (TensorFlow's own default, pinned through the environment
    variables its float16 GEMM and convolution paths read at their first use; it has no other
    reduced-precision-reduction switch)."""
    tf = load_tf()
    tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
    for name in FP16_ACCUMULATION:  # before any float16 op has run in this process
        os.environ[name] = "1"
    return {
        "tensor_float_32_execution_enabled": tf.config.experimental.tensor_float_32_execution_enabled(),
        "tf32_set_by": f"tf.config.experimental.enable_tensor_float_32_execution({precision == 'tf32'})",
        "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        **{name: os.environ[name] for name in FP16_ACCUMULATION},
        "ONEDNN_DEFAULT_FPMATH_MODE": os.environ.get("ONEDNN_DEFAULT_FPMATH_MODE"),
    }


FP16_ACCUMULATION = ("TF_FP16_MATMUL_USE_FP32_COMPUTE", "TF_FP16_CONV_USE_FP32_COMPUTE")


def input_kind(network: dict) -> tuple[bool, bool, bool]:
    """(tokens, images, has_lstm) of a resolved network; tokens: int64 token ids (a tokens or a
    masked_tokens input)."""
    inp = network["input"]
    tokens = inp["kind"] in TOKEN_INPUTS
    images = not tokens and len(inp["shape"]) == 3
    return tokens, images, any(layer["type"] == "lstm" for layer in network["layers"])


def masked_count(network: dict) -> int | None:
    """M, the masked positions of a masked_tokens input (its labels: M tokens, then the
    next-sentence label), else None."""
    inp = network["input"]
    return len(inp["masked_positions"]) if inp["kind"] == "masked_tokens" else None


def logits_of(outputs):
    """The logits of the model's output: pretraining_heads' masked-LM logits (B, M, vocabulary) of
    its (masked-LM, next-sentence) pair, else the output itself."""
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def output_shape(model) -> list[int]:
    """The per-sample shape of the logits (the masked-LM logits' (M, vocabulary) for BERT's heads)."""
    shape = model.output_shape
    if isinstance(shape, list) or (shape and isinstance(shape[0], (tuple, list))):
        shape = shape[0]  # (masked-LM logits, next-sentence logits)
    return [int(d) for d in shape[1:]]


def loss_function(network: dict):
    """(labels, model output) -> the network's mean loss (schema.LOSS_OF_INPUT), and its description.
    softmax_cross_entropy: tf.nn.sparse_softmax_cross_entropy_with_logits averaged over every label
    (the samples, or every token's next token); masked_lm_and_next_sentence: its mean over the B * M
    masked positions (labels[:, :M] against the masked-LM logits) plus its mean over the B samples'
    next-sentence labels (labels[:, M])."""
    tf = load_tf()

    def cross_entropy(labels, logits):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(labels, [-1]), logits=tf.reshape(logits, [-1, logits.shape[-1]])))

    masked = masked_count(network)
    if masked is None:
        return cross_entropy, "sparse_softmax_cross_entropy_with_logits, mean"

    def masked_lm_and_next_sentence(labels, outputs):
        mlm, next_sentence = outputs
        return cross_entropy(labels[:, :masked], mlm) + cross_entropy(labels[:, masked], next_sentence)

    return masked_lm_and_next_sentence, ("masked_lm_and_next_sentence: sparse_softmax_cross_entropy_with_logits, "
                                         "mean over the batch's masked positions + mean over its next-sentence labels")


def sample_shape(network: dict, batch: int) -> tuple:
    """The shape of a synthetic batch of tensors: channels-last for images."""
    shape = network["input"]["shape"]
    return (batch, *shape[1:], shape[0]) if len(shape) == 3 else (batch, *shape)


def set_batch_norm_floor(cuda: bool):
    """The epsilon floor of the batch norms built next: cuDNN's minimum on CUDA, none on CPU."""
    state = layer_classes().state
    state["bn_floor"] = 1.001e-5 if cuda else None  # cuDNN's minimum epsilon
    return state["bn_floor"]


def count_params(variables) -> int:
    import numpy as np

    return int(sum(int(np.prod(v.shape)) for v in variables))


def lstm_setting(has_lstm: bool, cuda: bool) -> str | None:
    return ("keras.layers.LSTM, " + ("cuDNN kernel" if cuda else "while-loop kernel")) if has_lstm else None


def thread_settings() -> dict:
    tf = load_tf()
    return {"inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}
