"""The MXNet runner's building blocks: the Gluon network from a resolved dlbench description (one
builder per layer type, in LAYERS, BERT's segment_embedding and pretraining_heads among them), its
canonical weights in and out, and what the single-process and the multi-worker steps share
(initialisation, the loss block with masked_lm_and_next_sentence, data, output shape).
mxnet_runner.py, mxnet_kernels.py and mxnet_distributed.py all build from here.

mxnet is imported on first use (`load_mxnet()`), after the runner has set the OpenMP variables
that its engine reads when the library loads. The semantics (batch-norm momentum, the LSTM's two
biases, the Trainer's rescaling) are described in mxnet_runner.py.
"""

from __future__ import annotations

import functools
import math
import types

from runners.common.contract import Layer, LayerTable

_mx = None

# ------------------------------------------------------------------ float32 math on CUDA (precision fp32)
# MXNet 1.9 has no TF32 switch of its own. Its two tensor-core variables govern float16 tensor-core
# math (MXNET_CUDA_ALLOW_TENSOR_CORE, default 1) and the conversion of float32 convolutions and GEMMs
# to float16 tensor-core math (MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION, default 0). TF32 is left to
# the NVIDIA libraries, which allow it by default on compute capability 8.0+ (cuDNN 8's default math
# mode; mxnet/test_utils.py effective_dtype: "TF32 ... the default on arch 80 GPUs" unless
# NVIDIA_TF32_OVERRIDE=0): their own NVIDIA_TF32_OVERRIDE=0 turns it off everywhere. On the CPU all
# three are no-ops; they are set on every device because the same code runs on the GPU.
#
# Set before mxnet is imported (configure_threads), as cuBLAS and cuDNN load with libmxnet:
PRE_IMPORT_FLOAT32_PINS = {"NVIDIA_TF32_OVERRIDE": "0", "MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION": "0"}
# Set per precision in prepare, before the first operator: MXNet reads it once, when its first cuDNN
# or cuBLAS operator is set up (not at import), and the kernels suite keeps MXNet's default (1).
TENSOR_CORE_VAR = "MXNET_CUDA_ALLOW_TENSOR_CORE"
FLOAT32_MATH_VARS = (TENSOR_CORE_VAR, *PRE_IMPORT_FLOAT32_PINS)
_pinned_before_import: bool | None = None  # whether pin_float32_math ran before mxnet was imported


def pin_float32_math() -> bool:
    """Pin TF32 and the float32 -> float16 tensor-core conversion off (idempotent): True when mxnet
    had not been imported yet, the first time (the libraries then load with the variables set)."""
    import os

    global _pinned_before_import
    os.environ.update(PRE_IMPORT_FLOAT32_PINS)
    if _pinned_before_import is None:
        _pinned_before_import = _mx is None
    return _pinned_before_import


def float32_math_env() -> dict:
    """The variables as the process has them now (what libmxnet, cuBLAS and cuDNN read)."""
    import os

    return {name: os.environ.get(name) for name in FLOAT32_MATH_VARS}


def load_mxnet():
    """The mxnet module (imported on first use, its import-time warnings silenced)."""
    global _mx
    if _mx is None:
        import warnings

        with warnings.catch_warnings():
            # mxnet 1.9.1 warns on import (numpy aliases, distutils); nothing the user can act on.
            warnings.simplefilter("ignore")
            import mxnet

        _mx = mxnet
    return _mx


def mxnet_loaded() -> bool:
    """Whether load_mxnet() has imported mxnet already."""
    return _mx is not None


@functools.lru_cache(maxsize=None)
def block_classes() -> dict:
    """Gluon block classes that need the framework (defined once, lazily)."""
    import numpy as np

    mx = load_mxnet()
    nn = mx.gluon.nn

    class SequenceLSTM(mx.gluon.HybridBlock):
        """gluon.rnn.LSTM (the fused RNN operator), batch-major, returning the output sequence."""

        def __init__(self, features: int, hidden: int, layers: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.lstm = mx.gluon.rnn.LSTM(hidden, num_layers=layers, layout="NTC", input_size=features,
                                              h2h_bias_initializer="zeros", i2h_bias_initializer="zeros")
            for k in range(layers):
                getattr(self.lstm, f"l{k}_h2h_bias").grad_req = "null"  # canonical: one bias per layer

        def hybrid_forward(self, F, x):
            return self.lstm(x)  # no states given: zero initial state, output sequence only

    class OptionA(mx.gluon.HybridBlock):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra

        def hybrid_forward(self, F, x):
            s = self.stride
            if s > 1:
                x = F.slice(x, begin=(None, None, None, None), end=(None, None, None, None), step=(1, 1, s, s))
            if self.extra:
                zero = F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1))
                x = F.concat(x, F.broadcast_axis(zero, axis=1, size=self.extra), dim=1)
            return x

    class Residual(mx.gluon.HybridBlock):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1 (bottleneck), + shortcut, then relu."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            cin, cout = spec["in_shape"][0], spec["out_shape"][0]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                convs = [(cin, f, 3, s, True), (f, f, 3, 1, False)]
            else:
                convs = [(cin, f, 1, 1, True), (f, f, 3, s, True), (f, cout, 1, 1, False)]
            self.kind = spec["shortcut"]
            with self.name_scope():
                self.body = nn.HybridSequential(prefix="body_")
                self.conv_bn = []  # (conv, bn) positions in body, for the canonical weight names
                with self.body.name_scope():
                    for ci, co, k, stride, relu in convs:
                        self.conv_bn.append((len(self.body), len(self.body) + 1))
                        self.body.add(nn.Conv2D(co, k, stride, k // 2, in_channels=ci, use_bias=False),
                                      nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=co))
                        if relu:
                            self.body.add(nn.Activation("relu"))
                if self.kind == "projection":
                    self.proj = nn.Conv2D(cout, 1, s, 0, in_channels=cin, use_bias=False)
                    self.proj_bn = nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout)
                elif self.kind == "option_a":
                    self.option_a = OptionA(s, cout - cin)

        def hybrid_forward(self, F, x):
            if self.kind == "projection":
                short = self.proj_bn(self.proj(x))
            elif self.kind == "option_a":
                short = self.option_a(x)
            else:
                short = x
            # Activation, not F.relu: on CPU only Activation is a oneDNN primitive; the plain relu
            # operator forces oneDNN-layout tensors back to NCHW around it, forward and backward
            # (measured on ResNet-50 training, b4: 10-25% of the step).
            return F.Activation(self.body(x) + short, act_type="relu")

    class PositionEmbedding(mx.gluon.HybridBlock):
        """x + P[0:T]: a learned (max_length, dim) table whose first T rows are added (GPT-2's wpe and
        ViT's position embedding, added rather than looked up: position t is row t)."""

        def __init__(self, max_length: int, steps: int, dim: int, **kwargs):
            super().__init__(**kwargs)
            self.steps = steps
            with self.name_scope():
                # GPT-2's and ViT's initialisation of the table (the canonical weights replace it in a check)
                self.weight = self.params.get("weight", shape=(max_length, dim), init=mx.init.Normal(0.02))

        def hybrid_forward(self, F, x, weight):
            rows = F.slice_axis(weight, axis=0, begin=0, end=self.steps)  # T is static: the resolved in_shape
            return F.broadcast_add(x, F.expand_dims(rows, axis=0))

    class PatchEmbedding(mx.gluon.HybridBlock):
        """A Conv2D with kernel = stride = patch to (dim, H/p, W/p), its positions as tokens in row-major
        (h, w) order, the class token (a learned (dim,) vector) prepended."""

        def __init__(self, channels: int, patch: int, dim: int, class_token: bool, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.proj = nn.Conv2D(dim, patch, patch, 0, in_channels=channels, use_bias=True, layout="NCHW")
                self.class_token = (self.params.get("class_token", shape=(dim,), init=mx.init.Normal(0.02))
                                    if class_token else None)

        def hybrid_forward(self, F, x, class_token=None):
            grid = self.proj(x)  # (B, dim, h, w)
            tokens = F.transpose(F.reshape(grid, shape=(0, 0, -1)), axes=(0, 2, 1))  # (B, h*w, dim)
            if class_token is None:
                return tokens
            first = F.slice_axis(tokens, axis=1, begin=0, end=1)  # (B, 1, dim): the batch size to broadcast to
            cls = F.broadcast_like(F.reshape(class_token, shape=(1, 1, -1)), first)
            return F.concat(cls, tokens, dim=1)

    class GeluErf(mx.gluon.HybridBlock):
        """0.5 x (1 + erf(x / sqrt(2))) from MXNet's erf operator, for float64 only: MXNet's own gelu
        (nn.GELU, LeakyReLU act_type='gelu') computes in float32 whatever the dtype (mshadow_op.h's
        gelu casts to float; measured 3e-7 from the exact form in a float64 network)."""

        def hybrid_forward(self, F, x):
            return 0.5 * x * (1.0 + F.erf(x * (1.0 / math.sqrt(2.0))))

    class LayerNormFloat64(nn.LayerNorm):
        """nn.LayerNorm (its gamma and beta, its names) computed from operators, for float64 only:
        MXNet's LayerNorm operator declares eps a float32 parameter (1e-3 enters as 1.00000005e-3,
        measured 3e-9 in a float64 network's logits); here eps is a double scalar."""

        def _alias(self):
            return "layernorm"

        def hybrid_forward(self, F, data, gamma, beta):
            centered = F.broadcast_sub(data, F.mean(data, axis=-1, keepdims=True))
            var = F.mean(F.square(centered), axis=-1, keepdims=True)  # biased, as the operator's
            normalised = F.broadcast_div(centered, F.sqrt(var + self._epsilon))
            return F.broadcast_add(F.broadcast_mul(normalised, gamma), beta)

    def layer_norm_block(dim: int, eps: float, float64: bool):
        return (LayerNormFloat64 if float64 else nn.LayerNorm)(axis=-1, epsilon=eps, in_channels=dim)

    class GeluTanh(mx.gluon.HybridBlock):
        """GPT-2's approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): MXNet 1.9 has no
        operator for it (LeakyReLU's gelu is the erf form), so it is written from operators."""

        def hybrid_forward(self, F, x):
            return 0.5 * x * (1.0 + F.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))

    class SelfAttention(mx.gluon.HybridBlock):
        """Multi-head self-attention the GluonNLP BERT way: one Dense to q, k and v interleaved per head
        (feature h*3S + j*S + s is part j of head h, the layout of MXNet's fused operators), sequence-first
        (T, B, 3HS); the scores by contrib.interleaved_matmul_selfatt_qk (q k^T / sqrt(S), all heads
        batched), the causal mask added, softmax, dropout on the probabilities, the weighted values by
        contrib.interleaved_matmul_selfatt_valatt (the heads concatenated in order), then the out Dense.
        `fused` False: the same products from the operators' documented equivalent code (reshape,
        transpose, batch_dot), where the fused ones cannot run (MXNet's CPU kernels are float32 only)."""

        def __init__(self, dim: int, steps: int, heads: int, head_size: int, causal: bool, bias: bool,
                     dropout: float, fused: bool, **kwargs):
            super().__init__(**kwargs)
            inner = heads * head_size
            self.heads, self.dropout, self.fused = heads, dropout, fused
            with self.name_scope():
                self.qkv = nn.Dense(3 * inner, flatten=False, use_bias=bias, in_units=dim)
                self.out = nn.Dense(dim, flatten=False, use_bias=bias, in_units=inner)
                # additive: 0 where j <= i, -inf above the diagonal (exp gives exactly 0 there); a
                # constant of the graph (grad_req null), built once, cast with the network
                mask = np.triu(np.full((steps, steps), -np.inf, dtype=np.float32), k=1)[None]
                self.causal_mask = self.params.get_constant("causal_mask", mx.nd.array(mask)) if causal else None

        def _heads(self, F, qkv):
            """(q, k, v), each (B*H, T, S), from the interleaved (T, B, H*3*S) projection."""
            parts = F.split(F.reshape(qkv, shape=(0, 0, self.heads, 3, -1)), num_outputs=3, axis=3,
                            squeeze_axis=True)  # each (T, B, H, S)
            return [F.reshape(F.transpose(p, axes=(1, 2, 0, 3)), shape=(-1, 0, 0), reverse=True) for p in parts]

        def hybrid_forward(self, F, x, causal_mask=None):
            qkv = self.qkv(F.transpose(x, axes=(1, 0, 2)))  # (T, B, 3HS): the operators are sequence-first
            if self.fused:
                scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=self.heads)  # (B*H, T, T), scaled
            else:
                q, k, v = self._heads(F, qkv)
                scores = F.batch_dot(F.contrib.div_sqrt_dim(q), k, transpose_b=True)
            if causal_mask is not None:
                scores = F.broadcast_add(scores, causal_mask)
            probs = F.softmax(scores, axis=-1)
            if self.dropout:
                probs = F.Dropout(probs, p=self.dropout)  # active in training mode only
            if self.fused:
                a = F.contrib.interleaved_matmul_selfatt_valatt(qkv, probs, heads=self.heads)  # (T, B, HS)
            else:
                a = F.reshape(F.batch_dot(probs, v), shape=(-1, self.heads, 0, 0), reverse=True)  # (B, H, T, S)
                a = F.reshape(F.transpose(a, axes=(2, 0, 1, 3)), shape=(0, 0, -1))  # (T, B, HS), heads in order
            return F.transpose(self.out(a), axes=(1, 0, 2))  # back to (B, T, D)

    def gelu_block(form: str, float64: bool):
        if form == "tanh":
            return GeluTanh()
        return GeluErf() if float64 else nn.GELU()  # nn.GELU: LeakyReLU act_type='gelu', the erf form

    class TransformerBlock(mx.gluon.HybridBlock):
        """Layer norms, self-attention and a GELU MLP with two residual joins, pre- or post-norm."""

        def __init__(self, spec: dict, fused: bool, float64: bool, **kwargs):
            super().__init__(**kwargs)
            steps, dim = spec["in_shape"]
            hidden, eps, rate = spec["mlp_ratio"] * dim, spec["eps"], spec["dropout"]
            self.pre = spec["norm"] == "pre"
            with self.name_scope():
                self.ln1 = layer_norm_block(dim, eps, float64)
                self.attn = SelfAttention(dim, steps, spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                          rate, fused)
                self.ln2 = layer_norm_block(dim, eps, float64)
                self.fc1 = nn.Dense(hidden, flatten=False, use_bias=spec["bias"], in_units=dim)
                self.gelu = gelu_block(spec["gelu"], float64)
                self.fc2 = nn.Dense(dim, flatten=False, use_bias=spec["bias"], in_units=hidden)
                # on each branch before its join; none at rate 0 (nn.Dropout(0) still copies, F.identity)
                self.drop1 = nn.Dropout(rate) if rate else None
                self.drop2 = nn.Dropout(rate) if rate else None

        def _branch(self, h, drop):
            return drop(h) if drop is not None else h

        def hybrid_forward(self, F, x):
            mlp = lambda h: self.fc2(self.gelu(self.fc1(h)))  # noqa: E731
            if self.pre:
                x = x + self._branch(self.attn(self.ln1(x)), self.drop1)
                return x + self._branch(mlp(self.ln2(x)), self.drop2)
            x = self.ln1(x + self._branch(self.attn(x), self.drop1))
            return self.ln2(x + self._branch(mlp(x), self.drop2))

    class TokenPool(mx.gluon.HybridBlock):
        def __init__(self, mode: str, **kwargs):
            super().__init__(**kwargs)
            self.mode = mode

        def hybrid_forward(self, F, x):
            if self.mode == "class":
                return F.reshape(F.slice_axis(x, axis=1, begin=0, end=1), shape=(0, -1))  # row 0: (B, D)
            return F.mean(x, axis=1)

    class SegmentEmbedding(mx.gluon.HybridBlock):
        """x + S[s]: BERT's token-type embedding, a learned (segments, dim) table looked up (take on
        axis 0, the Embedding operator's gather) at the fixed (T,) segment ids of the input's layout
        (0 before segment_boundary, 1 from it), a constant of the graph, and broadcast over the batch."""

        def __init__(self, segments: int, steps: int, dim: int, boundary: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                # BERT's initialisation of the table (the canonical weights replace it in a check)
                self.weight = self.params.get("weight", shape=(segments, dim), init=mx.init.Normal(0.02))
                ids = (np.arange(steps) >= boundary).astype(np.float32)  # indices, as the token ids: float32
                self.segment_ids = self.params.get_constant("segment_ids", mx.nd.array(ids))

        def hybrid_forward(self, F, x, weight, segment_ids):
            rows = F.take(weight, segment_ids, axis=0)  # (T, D)
            return F.broadcast_add(x, F.expand_dims(rows, axis=0))

    class PretrainingHeads(mx.gluon.HybridBlock):
        """BERT's pooler and pre-training heads the GluonNLP way: the pooler a tanh Dense on the [CLS]
        token (row 0) and the next-sentence Dense (2 classes); at the input's masked positions (a
        constant of the graph, the same for every sample) the rows gathered by take on the sequence
        axis, the transform Dense, GELU and layer norm, then the decoder Dense over the vocabulary,
        tied (built with the token embedding's ParameterDict: its weight is the embedding's Parameter,
        the bias its own) or untied. Returns (masked-LM logits (B, M, V), next-sentence logits (B, 2))."""

        def __init__(self, spec: dict, positions: list, embedding, float64: bool, **kwargs):
            super().__init__(**kwargs)
            dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
            with self.name_scope():
                self.pooler = nn.Dense(dim, activation="tanh", in_units=dim)
                self.next_sentence = nn.Dense(2, in_units=dim)
                self.transform = nn.Dense(dim, flatten=False, in_units=dim)
                self.gelu = gelu_block(spec["gelu"], float64)
                self.transform_ln = layer_norm_block(dim, spec["eps"], float64)
                shared = {"params": embedding.params} if embedding is not None else {}
                self.decoder = nn.Dense(vocabulary, flatten=False, use_bias=True, in_units=dim, **shared)
                self.positions = self.params.get_constant(
                    "masked_positions", mx.nd.array(np.asarray(positions, dtype=np.float32)))

        def hybrid_forward(self, F, h, positions):
            first = F.reshape(F.slice_axis(h, axis=1, begin=0, end=1), shape=(0, -1))  # the [CLS] row: (B, D)
            next_sentence = self.next_sentence(self.pooler(first))
            masked = F.take(h, positions, axis=1)  # (B, M, D)
            return self.decoder(self.transform_ln(self.gelu(self.transform(masked)))), next_sentence

    class WithLoss(mx.gluon.HybridBlock):
        """The network and its loss: the mean softmax cross-entropy (over the batch, and the steps of an
        LM), or with `masked` (the M masked positions of a masked_tokens input) BERT's
        masked_lm_and_next_sentence: the network gives (masked-LM logits, next-sentence logits), y is
        (B, M + 1), and the loss is the mean cross-entropy over the B*M masked positions plus the mean
        next-sentence cross-entropy over the B samples. Returns (logits, loss): the masked-LM logits."""

        def __init__(self, net, masked: int | None = None, **kwargs):
            super().__init__(**kwargs)
            self.masked = masked
            with self.name_scope():
                self.net = net
                self.loss = mx.gluon.loss.SoftmaxCrossEntropyLoss(axis=-1, sparse_label=True)

        def hybrid_forward(self, F, x, y):
            out = self.net(x)
            if self.masked is None:
                # per sample the loss is already the mean over the steps (of an LM); then the batch mean
                return out, F.mean(self.loss(out, y))
            masked_lm, next_sentence = out
            m = self.masked
            lm = F.mean(self.loss(masked_lm, F.slice_axis(y, axis=1, begin=0, end=m)))  # M per sample: B*M mean
            ns = F.mean(self.loss(next_sentence, F.reshape(F.slice_axis(y, axis=1, begin=m, end=m + 1), shape=(-1,))))
            return masked_lm, lm + ns

    return {"SequenceLSTM": SequenceLSTM, "OptionA": OptionA, "Residual": Residual, "WithLoss": WithLoss,
            "PositionEmbedding": PositionEmbedding, "PatchEmbedding": PatchEmbedding, "SelfAttention": SelfAttention,
            "TransformerBlock": TransformerBlock, "TokenPool": TokenPool, "gelu_block": gelu_block,
            "layer_norm_block": layer_norm_block, "SegmentEmbedding": SegmentEmbedding,
            "PretrainingHeads": PretrainingHeads}


# ------------------------------------------------------------------ layers: type -> builder(spec, build)
# `build` (build_network's namespace) carries what a builder may need besides its entry: the block
# classes, the blocks built before it (a tied head takes the embedding's parameters), how the
# network computes (fused attention or not, float64 or not) and the resolved input (a masked_tokens
# input's segment_boundary and masked_positions).


def _nn():
    return load_mxnet().gluon.nn


def _dense(spec, build):
    # flatten=False keeps a (batch, steps, features) input and applies the weights at every step
    in_shape = spec["in_shape"]
    init = spec.get("init")
    # the described initialisation (a parameter's own initialiser outranks the network's Xavier; Gluon's
    # biases start at zero): Xavier draws U(-sqrt(m / fan), ..) or N(0, m / fan), so m is 3 scale or scale
    described = {"weight_initializer": load_mxnet().init.Xavier(
        rnd_type="gaussian" if init["distribution"] == "normal" else "uniform",
        factor_type={"fan_in": "in", "fan_out": "out", "fan_avg": "avg"}[init["mode"]],
        magnitude=init["scale"] * (1 if init["distribution"] == "normal" else 3))} if init else {}
    return _nn().Dense(spec["units"], use_bias=spec["bias"], flatten=len(in_shape) != 2, in_units=in_shape[-1],
                       **described)


def _conv2d(spec, build):
    return _nn().Conv2D(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]), tuple(spec["padding"]),
                        in_channels=spec["in_shape"][0], use_bias=spec["bias"], layout="NCHW")


def _max_pool(spec, build):
    # pooling_convention "valid" (ceil_mode False) is the canonical floor; padded cells never win
    return _nn().MaxPool2D(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]), ceil_mode=False)


def _avg_pool(spec, build):
    return _nn().AvgPool2D(tuple(spec["size"]), tuple(spec["stride"]), 0, ceil_mode=False)


def _global_avg_pool(spec, build):
    nn = _nn()
    seq = nn.HybridSequential()
    seq.add(nn.GlobalAvgPool2D(), nn.Flatten())
    return seq


def _batch_norm(spec, build):
    return _nn().BatchNorm(axis=1, momentum=1.0 - spec["momentum"], epsilon=spec["eps"],
                           in_channels=spec["in_shape"][0])


def _activation(spec, build):  # relu, sigmoid, tanh: MXNet's own names
    return _nn().Activation(spec["type"])


def _flatten(spec, build):
    return _nn().Flatten()  # (C, H, W) row-major: the canonical order for NCHW


def _dropout(spec, build):
    return _nn().Dropout(spec["rate"])


def _embedding(spec, build):
    # the described scale (a parameter's own initialiser outranks the network's Xavier), else that Xavier
    init = {"weight_initializer": load_mxnet().init.Normal(spec["init_std"])} if spec.get("init_std") else {}
    return _nn().Embedding(spec["vocabulary"], spec["dim"], **init)


def _lstm(spec, build):
    return build.classes["SequenceLSTM"](spec["in_shape"][-1], spec["hidden"], spec["layers"])


def _residual(spec, build):
    return build.classes["Residual"](spec)


def _position_embedding(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["PositionEmbedding"](spec["max_length"], steps, dim)


def _patch_embedding(spec, build):
    return build.classes["PatchEmbedding"](spec["in_shape"][0], spec["patch"], spec["dim"], spec["class_token"])


def _layer_norm(spec, build):
    return build.classes["layer_norm_block"](spec["in_shape"][-1], spec["eps"], build.float64)


def _gelu(spec, build):
    return build.classes["gelu_block"](spec["form"], build.float64)


def _attention(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["SelfAttention"](dim, steps, spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                          spec["dropout"], build.fused_attention)


def _transformer_block(spec, build):
    return build.classes["TransformerBlock"](spec, build.fused_attention, build.float64)


def _token_pool(spec, build):
    return build.classes["TokenPool"](spec["mode"])


def _lm_head(spec, build):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    if not spec["tied"]:
        return _nn().Dense(vocabulary, flatten=False, use_bias=spec["bias"], in_units=dim)
    embedding = build.built[0]  # the schema ties the head to the network's first layer, the token embedding
    if not isinstance(embedding, _nn().Embedding):
        raise TypeError(f"a tied lm_head needs the token embedding as layer 0, found {type(embedding).__name__}")
    # Gluon's parameter sharing (GluonNLP's tied BERT decoder): built with the embedding's ParameterDict,
    # the Dense's `weight` is the embedding's very Parameter (one tensor, its gradient the sum of both
    # uses, updated once). Its bias, when it has one, is its own, named under that dict's prefix.
    return _nn().Dense(vocabulary, flatten=False, use_bias=spec["bias"], in_units=dim, params=embedding.params)


def _segment_embedding(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["SegmentEmbedding"](spec["segments"], steps, dim, build.input["segment_boundary"])


def _pretraining_heads(spec, build):
    embedding = None
    if spec["tied"]:  # the decoder shares the token embedding's table, as a tied lm_head (above)
        embedding = build.built[0]
        if not isinstance(embedding, _nn().Embedding):
            raise TypeError("tied pretraining_heads need the token embedding as layer 0, found "
                            f"{type(embedding).__name__}")
    return build.classes["PretrainingHeads"](spec, build.input["masked_positions"], embedding, build.float64)


LAYERS = LayerTable("mxnet", {
    "dense": Layer(_dense), "conv2d": Layer(_conv2d), "max_pool": Layer(_max_pool), "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool), "batch_norm": Layer(_batch_norm), "relu": Layer(_activation), "sigmoid": Layer(_activation),
    "tanh": Layer(_activation), "flatten": Layer(_flatten), "dropout": Layer(_dropout), "embedding": Layer(_embedding), "lstm": Layer(_lstm),
    "residual": Layer(_residual), "position_embedding": Layer(_position_embedding), "patch_embedding": Layer(_patch_embedding),
    "layer_norm": Layer(_layer_norm), "gelu": Layer(_gelu), "attention": Layer(_attention), "transformer_block": Layer(_transformer_block),
    "token_pool": Layer(_token_pool), "lm_head": Layer(_lm_head), "segment_embedding": Layer(_segment_embedding),
    "pretraining_heads": Layer(_pretraining_heads),
})

ATTENTION_TYPES = ("attention", "transformer_block")


def has_attention(network: dict) -> bool:
    return any(layer["type"] in ATTENTION_TYPES for layer in network["layers"])


def build_block(spec: dict, build):
    """One resolved layer (see dlbench.definitions.network) as a Gluon HybridBlock."""
    return LAYERS.builder(spec["type"])(spec, build)


def build_network(network: dict, deterministic: bool = False, fused_attention: bool = True, float64: bool = False):
    """(HybridSequential, [block per resolved layer, None where the layer is dropped], classes).
    `deterministic`: dropout layers are left out, and attention and transformer blocks are built with
    dropout rate 0 (on the probabilities and the branches). `fused_attention`: MXNet's fused
    interleaved_matmul_selfatt operators (False: their documented equivalent, batch_dot; see
    fused_attention_unavailable). `float64`: the network will be cast to float64 (GELU's erf form and
    layer norm are then built from operators that compute in float64; see GeluErf, LayerNormFloat64)."""
    mx = load_mxnet()
    build = types.SimpleNamespace(classes=block_classes(), built=[], fused_attention=fused_attention, float64=float64,
                                  input=network["input"])
    net = mx.gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        for layer in network["layers"]:
            if deterministic and layer["type"] == "dropout":
                build.built.append(None)  # dropout as the identity: simply not in the graph
                continue
            if deterministic and layer.get("dropout"):  # attention, transformer_block: their own rate
                layer = {**layer, "dropout": 0.0}
            block = build_block(layer, build)
            net.add(block)
            build.built.append(block)
    return net, build.built, build.classes


FUSED_ATTENTION_OPS = ("_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt")


def fused_attention_unavailable(ctx, dtype: str) -> str | None:
    """Why MXNet's fused self-attention operators cannot run in `dtype` on `ctx`, in MXNet's words
    (None: they can): both are tried on a one-token, one-head input. Their CPU kernels
    (src/operator/contrib/transformer.cc) take float32 only; the CUDA ones every real type."""
    mx = load_mxnet()
    qkv = mx.nd.zeros((1, 1, 3), ctx=ctx, dtype=dtype)
    try:
        scores = mx.nd.contrib.interleaved_matmul_selfatt_qk(qkv, heads=1)
        mx.nd.contrib.interleaved_matmul_selfatt_valatt(qkv, scores, heads=1).wait_to_read()
    except mx.base.MXNetError as e:
        return _framework_message(e)
    return None


# ---------------------------------------------------------------------------------------------
# Canonical weights (see src/dlbench/definitions/weights.py) <-> Gluon parameters. Gluon's layouts
# are the canonical ones (OIHW, out x in, LSTM gates i f g o, LayerNorm's gamma and beta), so only
# the LSTM's biases and attention's interleaved q/k/v projection need care. A tied lm_head's weight,
# and a tied pretraining_heads' decoder weight, is the embedding's Parameter: it is exported once, as
# the embedding's (000.weight).


def _bn_params(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.gamma, f"{prefix}.beta": bn.beta,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def _weight_bias(prefix: str, block) -> dict:
    out = {f"{prefix}.weight": block.weight}
    if block.bias is not None:
        out[f"{prefix}.bias"] = block.bias
    return out


def _ln_params(prefix: str, ln) -> dict:
    return {f"{prefix}.gamma": ln.gamma, f"{prefix}.beta": ln.beta}


def _attentions(blocks: list, network: dict):
    """(canonical prefix, SelfAttention block) of every attention, standalone or a block's."""
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        if layer["type"] == "attention":
            yield f"{i:03d}", block
        elif layer["type"] == "transformer_block":
            yield f"{i:03d}.attn", block.attn


def canonical_params(blocks: list, network: dict) -> dict:
    """name -> gluon Parameter for every canonical weight except LSTM biases and q/k/v (see
    _qkv_parts)."""
    out = {}
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        p, t = f"{i:03d}", layer["type"]
        if block is None:
            continue
        if t in ("dense", "conv2d"):
            out.update(_weight_bias(p, block))
        elif t == "batch_norm":
            out.update(_bn_params(p, block))
        elif t in ("embedding", "position_embedding"):
            out[f"{p}.weight"] = block.weight
        elif t == "lstm":
            for k in range(layer["layers"]):
                out[f"{p}.l{k}.w_ih"] = getattr(block.lstm, f"l{k}_i2h_weight")
                out[f"{p}.l{k}.w_hh"] = getattr(block.lstm, f"l{k}_h2h_weight")
        elif t == "residual":
            for j, (c, b) in enumerate(block.conv_bn, start=1):
                out[f"{p}.conv{j}.weight"] = block.body[c].weight
                out.update(_bn_params(f"{p}.bn{j}", block.body[b]))
            if layer["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = block.proj.weight
                out.update(_bn_params(f"{p}.proj_bn", block.proj_bn))
        elif t == "patch_embedding":
            out.update(_weight_bias(p, block.proj))
            if block.class_token is not None:
                out[f"{p}.class_token"] = block.class_token
        elif t == "layer_norm":
            out.update(_ln_params(p, block))
        elif t == "attention":
            out.update(_weight_bias(f"{p}.out", block.out))
        elif t == "transformer_block":
            out.update(_ln_params(f"{p}.ln1", block.ln1))
            out.update(_weight_bias(f"{p}.attn.out", block.attn.out))
            out.update(_ln_params(f"{p}.ln2", block.ln2))
            out.update(_weight_bias(f"{p}.mlp.fc1", block.fc1))
            out.update(_weight_bias(f"{p}.mlp.fc2", block.fc2))
        elif t == "lm_head":
            if layer["tied"]:  # the weight is 000.weight, the embedding's: only a bias of its own
                if block.bias is not None:
                    out[f"{p}.bias"] = block.bias
            else:
                out.update(_weight_bias(p, block))
        elif t == "segment_embedding":
            out[f"{p}.weight"] = block.weight
        elif t == "pretraining_heads":
            for part in ("pooler", "next_sentence", "transform"):
                out.update(_weight_bias(f"{p}.{part}", getattr(block, part)))
            out.update(_ln_params(f"{p}.transform_ln", block.transform_ln))
            if not layer["tied"]:  # tied: the decoder's weight is 000.weight, the embedding's
                out[f"{p}.decoder.weight"] = block.decoder.weight
            out[f"{p}.decoder.bias"] = block.decoder.bias
    return out


def _lstm_biases(blocks: list, network: dict):
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        if layer["type"] == "lstm":
            for k in range(layer["layers"]):
                yield (f"{i:03d}.l{k}.bias", getattr(block.lstm, f"l{k}_i2h_bias"),
                       getattr(block.lstm, f"l{k}_h2h_bias"))


def _qkv_parts(blocks: list, network: dict):
    """(Parameter, heads, {canonical name: part}) of each attention's interleaved projection: its
    output feature h*3S + j*S + s is row h*S + s of q (j = 0), k (1) or v (2), canonical head-major."""
    for prefix, attn in _attentions(blocks, network):
        for kind, param in (("weight", attn.qkv.weight), ("bias", attn.qkv.bias)):
            if param is not None:
                yield param, attn.heads, {f"{prefix}.{part}.{kind}": j for j, part in enumerate("qkv")}


def _deinterleave(array, heads: int, part: int):
    """One of q, k, v (rows head-major) from an interleaved (H*3*S, ...) projection array."""
    grouped = array.reshape(heads, 3, array.shape[0] // (3 * heads), *array.shape[1:])
    return grouped[:, part].reshape(array.shape[0] // 3, *array.shape[1:])


def _interleave(parts: list, heads: int):
    """The interleaved (H*3*S, ...) array of [q, k, v], each (H*S, ...) with rows head-major."""
    import numpy as np

    size = parts[0].shape[0] // heads
    grouped = np.stack([a.reshape(heads, size, *a.shape[1:]) for a in parts], axis=1)  # (H, 3, S, ...)
    return grouped.reshape(3 * heads * size, *parts[0].shape[1:])


def export_weights(blocks: list, network: dict, dtype: str = "float32") -> dict:
    """name -> numpy array in `dtype`, the precision the network computes in (float32 or float64):
    a float64 network's weights are exported whole, not rounded to float32."""
    out = {n: p.data().asnumpy().astype(dtype, copy=True) for n, p in canonical_params(blocks, network).items()}
    for name, b_i2h, b_h2h in _lstm_biases(blocks, network):
        out[name] = (b_i2h.data() + b_h2h.data()).asnumpy().astype(dtype, copy=True)  # h2h is zero: exact
    for param, heads, names in _qkv_parts(blocks, network):
        array = param.data().asnumpy()
        for name, part in names.items():
            out[name] = _deinterleave(array, heads, part).astype(dtype, copy=True)
    return out


def load_weights(blocks: list, network: dict, arrays: dict) -> None:
    mx = load_mxnet()
    params = canonical_params(blocks, network)
    biases = {name: (b_i2h, b_h2h) for name, b_i2h, b_h2h in _lstm_biases(blocks, network)}
    qkv = list(_qkv_parts(blocks, network))
    expected = set(params) | set(biases) | {name for _, _, names in qkv for name in names}
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(expected))[:5]}")
    for name, p in params.items():
        src = arrays[name]
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)}, mxnet expects {tuple(p.shape)}")
        # in the parameter's own dtype: float32 canonical weights into a float64 network are exact
        p.set_data(mx.nd.array(src, dtype=p.dtype))
    for name, (b_i2h, b_h2h) in biases.items():
        b_i2h.set_data(mx.nd.array(arrays[name], dtype=b_i2h.dtype))
        b_h2h.set_data(mx.nd.zeros(b_h2h.shape, dtype=b_h2h.dtype))
    for param, heads, names in qkv:
        array = _interleave([arrays[name] for name in names], heads)  # names in q, k, v order
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(f"{', '.join(names)}: interleaved shape {tuple(array.shape)}, "
                             f"mxnet expects {tuple(param.shape)}")
        param.set_data(mx.nd.array(array, dtype=param.dtype))
    mx.nd.waitall()


# ---------------------------------------------------------------------------------------------
# what the single-process and the multi-worker steps share


HYBRIDIZE = {"static_alloc": True, "static_shape": True}


def build_model(network: dict, ctx, deterministic: bool = False, dtype: str = "float32", hybridize: bool = True,
                fused_attention: bool | None = None):
    """(net, blocks, model): the network initialised on `ctx` (He-normal weights, fan-in; biases,
    batch norms and LSTM biases keep their own initialisers) and, around it, the block of the network
    and its loss, hybridised unless `hybridize` is False (then `hybridize_model(model)` does it later):
    one cached graph per mode, memory planned once.

    `dtype` "float64": Gluon's own mechanism, Block.cast, before initialisation, so that every
    parameter and batch-norm statistic is created in float64 (Gluon's BatchNorm keeps float32
    statistics only under float16); the LSTM layer's cast also makes its zero initial states
    float64. Activations, gradients and the loss then follow the parameters' and the input's dtype.

    `fused_attention` None: MXNet's fused self-attention operators wherever they run in `dtype` on
    `ctx` (fused_attention_unavailable).
    """
    mx = load_mxnet()
    if fused_attention is None:
        fused_attention = not has_attention(network) or fused_attention_unavailable(ctx, dtype) is None
    net, blocks, classes = build_network(network, deterministic, fused_attention, float64=dtype == "float64")
    if dtype != "float32":
        net.cast(dtype)  # the Embedding operator takes its dtype from the (now float64) weight
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctx)
    model = classes["WithLoss"](net, masked_count(network))
    if hybridize:
        hybridize_model(model)
    return net, blocks, model


def masked_count(network: dict) -> int | None:
    """M, the masked positions of a network trained with masked_lm_and_next_sentence (else None)."""
    if network.get("loss") != "masked_lm_and_next_sentence":
        return None
    return len(network["input"]["masked_positions"])


def hybridize_model(model) -> None:
    """Gluon's graph mode: the CachedOp of the network and its loss (static_alloc, static_shape),
    built on the next call; it also hybridises the network (what the inference step calls)."""
    model.hybridize(**HYBRIDIZE)


# ---------------------------------------------------------------------------------------------
# mixed precision (mxnet.contrib.amp) and what a forward pass shows of it


def dtype_name(dtype) -> str:
    """An NDArray dtype as a name: MXNet's bfloat16 is a numpy structured dtype ([('bfloat16', '<u2')])."""
    import numpy as np

    names = getattr(dtype, "names", None)
    return names[0] if names else np.dtype(dtype).name


def amp_dtype(target: str):
    """What mxnet.contrib.amp calls the target: its numpy bfloat16 dtype, or numpy float16."""
    import numpy as np
    from mxnet.contrib.amp import amp

    return amp.bfloat16 if target == "bfloat16" else np.dtype(np.float16)


class ReducedPrecisionUnsupported(Exception):
    """The framework cannot run a layer of the network in the requested reduced precision here."""


def _framework_message(e: Exception) -> str:
    """The framework's own sentence of an MXNetError (its last "MXNetError: ..." line, the source file)."""
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    message = next((l for l in reversed(lines) if l.startswith("MXNetError:")), lines[-1] if lines else repr(e))
    where = next((l.split('"')[1] for l in lines if l.startswith('File "') and '"' in l[6:]), None)
    message = message.replace("MXNetError: ", "", 1)
    return f"{message} ({where.lstrip('./')})" if where else message


def cpu_bf16_isa() -> str:
    """What this CPU offers oneDNN for bfloat16, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l for l in f if l.startswith("flags")), "").split(":", 1)[-1].split())
    except OSError:
        return "its instruction set is unknown"
    wanted = ("avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
    have = [w for w in wanted if w in flags]
    if have:
        return f"this CPU has {', '.join(have)}"
    return (f"this CPU has {'avx2' if 'avx2' in flags else 'no avx2'} and none of {', '.join(wanted)}; oneDNN's "
            "bfloat16 kernels need AVX-512 (avx512_core) or newer")


def probe_dtypes(net, blocks: list, network: dict, x, precision: str, train: bool) -> dict:
    """A real forward pass of one sample through the network, layer by layer, imperatively (before
    hybridisation, so that the timed step still pays its graph construction in its first iteration;
    one sample, so that no oneDNN primitive of the timed batch is created here): the dtype of the first
    layer's output and of the logits. With AMP (after mxnet.contrib.amp.init) the same operator
    wrappers cast as in the hybridised graph. A layer the framework cannot run in a reduced
    precision here raises ReducedPrecisionUnsupported naming it; in training the backward pass of
    that sample is run too (in predict mode: running statistics unchanged)."""
    mx = load_mxnet()
    amp = precision.startswith("amp_")
    layers = [l for l, b in zip(network["layers"], blocks) if b is not None]  # net's children, in order
    sample = x[0:1]
    dtypes: dict = {}

    def unsupported(where: str, e: Exception) -> ReducedPrecisionUnsupported:
        target = "bfloat16" if precision == "amp_bf16" else "float16"
        why = _framework_message(e)
        if sample.context.device_type == "cpu" and "primitive descriptor" in why:
            why = f"oneDNN: {why} (no {target} implementation: {cpu_bf16_isa()})"
        return ReducedPrecisionUnsupported(
            f"{precision}: MXNet {mx.__version__} cannot run {where} in {target} on "
            f"{'the CPU' if sample.context.device_type == 'cpu' else str(sample.context)}: {why}")

    with mx.autograd.record(train_mode=False) if (amp and train) else mx.autograd.predict_mode():
        h = sample
        for i in range(len(net)):
            try:
                h = net[i](h)
                # pretraining_heads give (masked-LM logits, next-sentence logits): the logits are the first
                outputs = list(h) if isinstance(h, (list, tuple)) else [h]
                for o in outputs:
                    o.wait_to_read()
            except mx.base.MXNetError as e:
                if not amp:
                    raise
                kind = layers[i]["type"] if i < len(layers) else type(net[i]).__name__
                raise unsupported(f"layer {i} ({kind}, {type(net[i]).__name__})", e) from e
            if i == 0:
                dtypes["first_layer_output_dtype"] = dtype_name(outputs[0].dtype)
        dtypes["logits_dtype"] = dtype_name(outputs[0].dtype)
    if amp and train:
        try:
            mx.autograd.backward(outputs, [mx.nd.ones_like(o) for o in outputs])
            mx.nd.waitall()
        except mx.base.MXNetError as e:
            raise unsupported("the backward pass", e) from e
    return dtypes


# ------------------------------------------------------------------ which attention MXNet ran


def _operators_run(fn) -> list[str]:
    """The operators MXNet's profiler saw executed while `fn` ran imperatively (forward and, when
    `fn` runs one, backward), by name. The profiler's trace file goes to a directory removed after."""
    import json
    import os
    import tempfile

    mx = load_mxnet()
    with tempfile.TemporaryDirectory(prefix="dlbench-mxprof-") as folder:
        mx.profiler.set_config(profile_imperative=True, aggregate_stats=True,
                               filename=os.path.join(folder, "profile.json"))
        mx.profiler.set_state("run")
        try:
            fn()
            mx.nd.waitall()
        finally:
            mx.profiler.set_state("stop")
        stats = json.loads(mx.profiler.dumps(reset=True, format="json"))  # also writes the trace file
        mx.profiler.set_config(profile_imperative=False, aggregate_stats=False,
                               filename=os.path.join(folder, "profile.json"))
    # less the engine's bookkeeping and the probe's own seed of the backward pass (ones_like)
    return sorted(set(stats.get("Time", {}).get("operator", {})) - {"DeleteVariable", "ones_like"})


def _one_or_each(by_layer: dict):
    """One value where every attention got the same, else the value per layer."""
    values = {repr(v) for v in by_layer.values()}
    return next(iter(by_layer.values())) if len(values) == 1 else by_layer


def attention_record(blocks: list, network: dict, ctx, dtype: str, train: bool,
                     fused_unavailable: str | None) -> dict | None:
    """What MXNet ran for each attention (an attention layer, a transformer block's): one sample of
    the layer's input shape through its block, imperatively (before hybridisation: the hybridised
    graph calls the same operators, no subgraph backend partitioning it), in the step's mode
    (training: autograd, its dropout and the backward pass), with the operators MXNet's profiler
    recorded. None when the network has no attention."""
    import os

    mx = load_mxnet()
    attentions = list(_attentions(blocks, network))
    if not attentions:
        return None
    kernels, operators = {}, {}
    for prefix, attn in attentions:
        index = prefix.split(".")[0]
        x = mx.nd.zeros((1, *network["layers"][int(index)]["in_shape"]), ctx=ctx, dtype=dtype)

        def run():
            if train:
                with mx.autograd.record(train_mode=True):
                    out = attn(x)
                out.backward(mx.nd.ones_like(out))
            else:
                with mx.autograd.predict_mode():
                    attn(x)

        ops = _operators_run(run)
        if all(op in ops for op in FUSED_ATTENTION_OPS):
            kernels[index] = "fused interleaved_matmul_selfatt"
        elif "batch_dot" in ops:
            kernels[index] = "batch_dot (the fused operators' documented equivalent)"
        else:
            kernels[index] = "unknown"
        operators[index] = ops
    features = mx.runtime.Features()
    cpu = ctx.device_type == "cpu"
    record = {
        "function": ("mxnet.ndarray.contrib.interleaved_matmul_selfatt_qk and interleaved_matmul_selfatt_valatt "
                     "(GluonNLP's BERT path): one Dense to q, k and v interleaved per head, sequence-first (T, B, 3HS)"
                     if not fused_unavailable else
                     "batch_dot on the interleaved q/k/v projection (reshape, transpose, div_sqrt_dim, batch_dot: the "
                     "equivalent code the fused operators document)"),
        "kernel": _one_or_each(kernels),
        "operators": _one_or_each(operators),
        "implementation": ("MXNet's CPU kernels (src/operator/contrib/transformer.cc, float32 only): each product one "
                           "strided batch of sgemm over samples x heads, cblas_sgemm_batch with MKL, otherwise one "
                           "cblas_sgemm per sample and head of the BLAS libmxnet links"
                           if cpu else "MXNet's CUDA kernels (src/operator/contrib/transformer.cu): cuBLAS strided "
                                       "batched GEMM, tensor-op GEMM in float16")
        if not fused_unavailable else "MXNet's batch_dot",
        "blas": next((n for n in ("BLAS_MKL", "BLAS_OPEN", "BLAS_ATLAS", "BLAS_APPLE") if n in features
                      and features.is_enabled(n)), None),
        # with MXNET_SUBGRAPH_BACKEND=MKLDNN a hybridised graph's fused operators and their projections
        # would become oneDNN's _sg_mkldnn_selfatt_*; unset, the graph runs the operators above
        "subgraph_backend": os.environ.get("MXNET_SUBGRAPH_BACKEND"),
        "probe": ("one sample of each attention's input shape through its imperative block before hybridize, in "
                  f"{'training (autograd on, its dropout, the backward pass)' if train else 'inference'} mode; the "
                  "operators MXNet's profiler recorded (profile_imperative, aggregate statistics)"),
    }
    if any(l.get("causal") for l in network["layers"] if l["type"] in ATTENTION_TYPES):
        record["causal_mask"] = ("a (1, T, T) constant, 0 on and below the diagonal and -inf above, broadcast-added "
                                 "to the scores before the softmax")
    if fused_unavailable:
        record["fused_unavailable"] = fused_unavailable
    return record


def synthetic_batch(network: dict, batch: int, rng):
    """(x, y) as numpy arrays drawn from `rng` (numpy.random.Generator), channels-first images; a
    masked_tokens input's y is (batch, M + 1), as equivalence.make_inputs draws it."""
    import numpy as np

    inp = network["input"]
    if inp["kind"] == "tokens":
        shape = (batch, inp["sequence_length"])
        return rng.integers(0, inp["vocabulary"], shape), rng.integers(0, inp["vocabulary"], shape)
    if inp["kind"] == "masked_tokens":  # y: the M masked positions' tokens, then the next-sentence label
        masked = len(inp["masked_positions"])
        x_np = rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]))
        y_np = rng.integers(0, inp["vocabulary"], (batch, masked + 1))
        y_np[:, masked] = rng.integers(0, 2, batch)
        return x_np, y_np
    x_np = rng.standard_normal((batch, *inp["shape"]), dtype=np.float32)
    return x_np, rng.integers(0, inp["classes"], (batch,))


def to_device(x_np, y_np, ctx, dtype: str = "float32"):
    """x and y as NDArrays on `ctx`: images in `dtype` (the network's precision); token ids and
    labels as float32 in every precision, as Gluon's Embedding and the sparse-label loss take
    indices (exact below 2**24; they are only indices, with any weight dtype)."""
    mx = load_mxnet()
    x_dtype = "float32" if x_np.dtype.kind in "iub" else dtype
    return mx.nd.array(x_np, ctx=ctx, dtype=x_dtype), mx.nd.array(y_np, ctx=ctx, dtype="float32")


@functools.lru_cache(maxsize=None)
def _sgd_float64_class():
    mx = load_mxnet()

    class SGDMomentumFloat64(mx.optimizer.Optimizer):
        """MXNet's SGD-momentum rule (mom = momentum * mom - lr * (rescale_grad * grad + wd * weight);
        weight += mom) in NDArray arithmetic, whose scalar operands are doubles. MXNet's fused update
        operators (sgd_mom_update, multi_sgd_mom_update) take lr, momentum and wd as float32
        parameters: lr 0.01 is applied as 0.0099999997765 (measured), a 2e-8 error in every float64
        update. The momentum state has the weight's dtype; there is no float32 master copy."""

        def __init__(self, momentum: float = 0.0, **kwargs):
            super().__init__(**kwargs)
            self.momentum = float(momentum)

        def create_state(self, index, weight):
            return mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype) if self.momentum else None

        def update(self, index, weight, grad, state):
            if self.clip_gradient is not None:
                raise NotImplementedError("SGDMomentumFloat64: clip_gradient is not supported")
            self._update_count(index)
            lr, wd = self._get_lr(index), self._get_wd(index)
            step = grad if self.rescale_grad == 1.0 else grad * self.rescale_grad
            if wd:
                step = step + wd * weight
            if state is None:
                weight -= lr * step
            else:
                state[:] = self.momentum * state - lr * step
                weight += state

    return SGDMomentumFloat64


def float32_operator_parameters(network: dict, deterministic: bool) -> list[str]:
    """What a float64 network still passes through a float32 operator parameter (MXNet declares
    BatchNorm's momentum and Dropout's p as float32; eps, the scalar arithmetic and every tensor are
    float64), where float32 does not hold the value exactly."""
    import numpy as np

    notes = {}
    for layer in network["layers"]:
        if layer["type"] in ("batch_norm", "residual"):
            m = 1.0 - layer["momentum"] if layer["type"] == "batch_norm" else 0.9  # Residual: canonical 0.1
            if float(np.float32(m)) != m:
                notes[f"bn{m}"] = (f"BatchNorm momentum {m} enters as {float(np.float32(m))!r} (a float32 operator "
                                   "parameter): only the float64 running statistics' update, not the normalisation, "
                                   "the gradients or the step")
        elif layer["type"] == "dropout" and not deterministic and float(np.float32(layer["rate"])) != layer["rate"]:
            notes[f"do{layer['rate']}"] = (f"Dropout p {layer['rate']} enters as {float(np.float32(layer['rate']))!r} "
                                           "(a float32 operator parameter)")
        if layer["type"] in ("attention", "transformer_block") and layer["dropout"] and not deterministic \
                and float(np.float32(layer["dropout"])) != layer["dropout"]:
            rate = layer["dropout"]
            notes[f"do{rate}"] = f"Dropout p {rate} enters as {float(np.float32(rate))!r} (a float32 operator parameter)"
    return list(notes.values())


def float64_composites(network: dict, fused_unavailable: str | None) -> list[str]:
    """What a float64 network builds from MXNet's operators instead of the operator float32 uses."""
    notes = []
    layers = network["layers"]
    if any(l["type"] == "gelu" and l["form"] == "erf" or l["type"] in ("transformer_block", "pretraining_heads")
           and l["gelu"] == "erf" for l in layers):
        notes.append("GELU (erf form): 0.5 x (1 + erf(x / sqrt(2))) from the erf operator, not nn.GELU: MXNet's "
                     "gelu computes in float32 for every dtype (src/operator/mshadow_op.h casts to float)")
    if any(l["type"] in ("layer_norm", "transformer_block", "pretraining_heads") for l in layers):
        notes.append("layer norm: nn.LayerNorm's gamma and beta, normalised by mean, square, sqrt and broadcast "
                     "operators with eps a double: the LayerNorm operator declares eps a float32 parameter")
    if has_attention(network) and fused_unavailable:
        notes.append("attention: the products by batch_dot on the interleaved projection, the fused "
                     f"interleaved_matmul_selfatt operators' documented equivalent; the fused ones: {fused_unavailable}")
    return notes


def sgd_momentum(learning_rate: float, momentum: float, dtype: str = "float32"):
    """(optimizer, optimizer_params) for gluon.Trainer: MXNet's aggregated multi-tensor SGD-momentum
    update on the float32 weights (every precision but float64: AMP keeps float32 weights); in
    float64 the same rule in float64 arithmetic (see SGDMomentumFloat64)."""
    if dtype != "float64":
        return "sgd", {"learning_rate": learning_rate, "momentum": momentum, "wd": 0.0}
    return _sgd_float64_class()(learning_rate=learning_rate, momentum=momentum, wd=0.0), None


def trainable_params(net) -> list:
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def count_params(params: list) -> int:
    import numpy as np

    return int(sum(int(np.prod(p.shape)) for p in params))


def output_shape(net, x) -> list[int]:
    """The per-sample output shape as the framework infers it (no computation, no rebinding)."""
    mx = load_mxnet()
    sym = net(mx.sym.var("data"))
    if isinstance(sym, (list, tuple)):  # pretraining_heads: (masked-LM logits, next-sentence logits)
        sym = sym[0]
    _, out_shapes, _ = sym.infer_shape(data=(1, *x.shape[1:]))
    return list(out_shapes[0][1:])
