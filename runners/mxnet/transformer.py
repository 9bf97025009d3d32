"""The mxnet runner's transformer layers: the Gluon blocks of the position, patch and segment
embeddings, layer norm, GELU, self-attention, the transformer block, the token pool, the language
model head and BERT's pre-training heads; their builders and their canonical weights, referenced
from the layer table (layers.py); and which attention kernel they call: MXNet's fused
interleaved_matmul_selfatt operators where they run in the network's dtype (fused_attention_unavailable),
else their documented batch_dot equivalent. Why each block is written as it is: runner.py's docstring.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from runners.common import rotary
from runners.common.contract import Skip
from runners.mxnet.framework import framework_message, gluon_nn, load_mxnet


@functools.lru_cache(maxsize=None)
def transformer_classes() -> dict:
    """The transformer's Gluon block classes, which need the framework (defined once, lazily)."""
    import numpy as np

    mx = load_mxnet()
    nn = mx.gluon.nn

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

    class RMSNorm(mx.gluon.HybridBlock):
        """gamma * x / sqrt(mean(x^2) + eps) over the last axis, composed from MXNet's operators (it
        has no RMSNorm operator): square, mean, rsqrt, two broadcast products."""

        def __init__(self, dim: int, eps: float, **kwargs):
            super().__init__(**kwargs)
            self.eps = eps
            with self.name_scope():
                self.gamma = self.params.get("gamma", shape=(dim,), init=mx.init.One())

        def hybrid_forward(self, F, x, gamma):
            scale = F.rsqrt(F.mean(F.square(x), axis=-1, keepdims=True) + self.eps)
            return F.broadcast_mul(F.broadcast_mul(x, scale), gamma)

    class GroupedAttention(mx.gluon.HybridBlock):
        """Grouped-query attention with rotary position embedding, composed from MXNet's operators (its
        fused self-attention operators take one interleaved q/k/v projection of equal heads, which
        grouped heads are not): q, k and v as Dense without bias, q and k rotated (rotate_half) by cos
        and sin tables (runners/common/rotary.py's, constants of the graph), the key/value heads
        repeated per query group (F.repeat, HuggingFace's repeat_kv), the scores by batch_dot
        (contrib.div_sqrt_dim on q), the causal mask added, softmax, batch_dot with v, the out Dense."""

        def __init__(self, spec: dict, steps: int, float64: bool, **kwargs):
            super().__init__(**kwargs)
            dim = spec["in_shape"][-1]
            self.heads, self.kv_heads, self.size = spec["heads"], spec["kv_heads"], spec["head_size"]
            self.causal = spec["causal"]
            with self.name_scope():
                self.q = nn.Dense(self.heads * self.size, flatten=False, use_bias=False, in_units=dim)
                self.k = nn.Dense(self.kv_heads * self.size, flatten=False, use_bias=False, in_units=dim)
                self.v = nn.Dense(self.kv_heads * self.size, flatten=False, use_bias=False, in_units=dim)
                self.out = nn.Dense(dim, flatten=False, use_bias=False, in_units=self.heads * self.size)
                cos, sin = rotary.layer_tables(spec, steps)
                # (1, 1, T, S) in the network's dtype (float64 exact in a float64 check; a float32
                # network's operators take no float64 operand)
                tables = "float64" if float64 else "float32"
                self.cos = self.params.get_constant("cos", mx.nd.array(cos[None, None], dtype=tables))
                self.sin = self.params.get_constant("sin", mx.nd.array(sin[None, None], dtype=tables))
                mask = np.triu(np.full((steps, steps), -np.inf, dtype=np.float32), k=1)[None]
                self.causal_mask = self.params.get_constant("causal_mask", mx.nd.array(mask))

        # split_heads, rotate and attend are the pieces generate.py's cached step calls too (on the
        # step's rows and the cache): one definition of the grouped attention for both
        def split_heads(self, F, proj, heads):
            """(B, T, heads*S) -> (B, heads, T, S)."""
            return F.transpose(F.reshape(proj, shape=(0, 0, heads, -1)), axes=(0, 2, 1, 3))

        def rotate(self, F, t, cos, sin):
            """t (B, heads, T, S) rotated (rotate_half) by the angles of its positions, cos and sin
            (1, 1, T, S)."""
            half = self.size // 2
            rotated = F.concat(-F.slice_axis(t, axis=-1, begin=half, end=None),
                               F.slice_axis(t, axis=-1, begin=0, end=half), dim=-1)
            return F.broadcast_add(F.broadcast_mul(t, cos), F.broadcast_mul(rotated, sin))

        def attend(self, F, q, k, v, mask=None):
            """The queries (B, H, T, S) over the keys and values (B, KV, L, S), an additive mask
            broadcast to (B*H, T, L) (None: none), through the out Dense: (B, T, D)."""
            groups = self.heads // self.kv_heads
            if groups > 1:
                k, v = F.repeat(k, repeats=groups, axis=1), F.repeat(v, repeats=groups, axis=1)
            fold = lambda t: F.reshape(t, shape=(-3, 0, 0))  # noqa: E731 - (B, H, T, S) -> (B*H, T, S)
            scores = F.batch_dot(F.contrib.div_sqrt_dim(fold(q)), fold(k), transpose_b=True)
            if mask is not None:
                scores = F.broadcast_add(scores, mask)
            a = F.batch_dot(F.softmax(scores, axis=-1), fold(v))  # (B*H, T, S)
            a = F.reshape(a, shape=(-4, -1, self.heads, 0, 0))  # (B, H, T, S)
            return self.out(F.reshape(F.transpose(a, axes=(0, 2, 1, 3)), shape=(0, 0, -1)))

        def hybrid_forward(self, F, x, cos, sin, causal_mask):
            q = self.rotate(F, self.split_heads(F, self.q(x), self.heads), cos, sin)
            k = self.rotate(F, self.split_heads(F, self.k(x), self.kv_heads), cos, sin)
            v = self.split_heads(F, self.v(x), self.kv_heads)
            return self.attend(F, q, k, v, causal_mask if self.causal else None)

    class SwiGLU(mx.gluon.HybridBlock):
        """down(silu(gate(x)) * up(x)), Dense without bias; silu as x * sigmoid(x) (MXNet 1.9 has no
        silu activation)."""

        def __init__(self, dim: int, hidden: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.gate = nn.Dense(hidden, flatten=False, use_bias=False, in_units=dim)
                self.up = nn.Dense(hidden, flatten=False, use_bias=False, in_units=dim)
                self.down = nn.Dense(dim, flatten=False, use_bias=False, in_units=hidden)

        def hybrid_forward(self, F, x):
            g = self.gate(x)
            return self.down(g * F.sigmoid(g) * self.up(x))

    class MixtureOfExperts(mx.gluon.HybridBlock):
        """E SwiGLU experts (their weights stacked, (E, hidden, D) and (E, D, hidden)) and a linear
        router, composed from MXNet's operators with static shapes (a hybridised graph has no
        data-dependent shapes, and MXNet no grouped product): the router's product and softmax in
        float32 (float64 in a float64 check), the top-k by each expert's rank among the token's
        (rank_e = #{p_j > p_e} + #{j < e: p_j = p_e}: the tie-break rule itself, by comparisons), the
        chosen weights renormalised and every other expert's weight 0, then EVERY expert computed on
        every token (E/k times the work of the chosen ones: dense dispatch) and the outputs summed
        with those weights. In training the load-balancing loss enters the gradient through the
        custom operator dlbench_add_auxiliary_loss, times its weight. Capacity factors: not built."""

        def __init__(self, dim: int, hidden: int, routing: dict, float64: bool, **kwargs):
            super().__init__(**kwargs)
            experts = routing["experts"]
            self.experts, self.top_k, self.hidden = experts, routing["top_k"], hidden
            self.aux_weight = routing["aux_loss_weight"]
            # whether the graph adds the load-balancing loss: a graph that is never differentiated
            # (generate.py's decoding steps) sets it False before it is traced, as torch and jax add
            # the loss in training only
            self.auxiliary_loss = bool(self.aux_weight)
            self.router_dtype = "float64" if float64 else "float32"
            with self.name_scope():
                init = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=1)
                self.router = self.params.get("router", shape=(experts, dim), init=init)
                self.gate = self.params.get("expert_gate", shape=(experts, hidden, dim), init=init)
                self.up = self.params.get("expert_up", shape=(experts, hidden, dim), init=init)
                self.down = self.params.get("expert_down", shape=(experts, dim, hidden), init=init)
                lower = np.tril(np.ones((experts, experts), dtype=np.float32), k=-1)  # [e, j]: j < e
                self.lower = self.params.get_constant("lower_index", mx.nd.array(lower[None]))

        def hybrid_forward(self, F, x, router, gate, up, down, lower):
            tokens = F.reshape(x, shape=(-3, 0))  # (B, T, D) -> (N, D)
            wide = self.router_dtype
            p = F.softmax(F.dot(F.cast(tokens, wide), F.cast(router, wide), transpose_b=True), axis=-1)  # (N, E)
            row, col = F.expand_dims(p, axis=2), F.expand_dims(p, axis=1)  # p_e on axis 1, p_j on axis 2
            above = F.broadcast_greater(col, row)  # [n, e, j]: p_j > p_e
            tied = F.broadcast_mul(F.broadcast_equal(col, row), F.cast(lower, wide))
            rank = F.sum(above + tied, axis=2)  # (N, E)
            chosen = rank < self.top_k
            picked = p * chosen
            weights = F.broadcast_div(picked, F.sum(picked, axis=1, keepdims=True))  # (N, E)
            flat_gate = F.reshape(gate, shape=(-3, 0))  # (E*H, D)
            flat_up = F.reshape(up, shape=(-3, 0))
            g = F.dot(tokens, flat_gate, transpose_b=True)
            h = g * F.sigmoid(g) * F.dot(tokens, flat_up, transpose_b=True)  # (N, E*H)
            h = F.transpose(F.reshape(h, shape=(0, self.experts, self.hidden)), axes=(1, 0, 2))  # (E, N, H)
            y = F.batch_dot(h, down, transpose_b=True)  # (E, N, D)
            out = F.sum(F.broadcast_mul(y, F.expand_dims(F.transpose(weights), axis=2)), axis=0)  # (N, D)
            out = F.reshape_like(out, x)
            # in the train and infer graphs whatever the mode (a hybridised graph is traced once): forward
            # the identity, its gradient is training's only
            if self.auxiliary_loss:
                fraction = F.mean(chosen, axis=0)  # f_e: each token counted once per chosen expert
                aux = self.experts * F.sum(fraction * F.mean(p, axis=0)) * self.aux_weight
                out = F.Custom(out, aux, op_type=ADD_AUXILIARY_LOSS)
            return out

    class LlamaBlock(mx.gluon.HybridBlock):
        """x + attn(norm1(x)), then + ffn(norm2(x)), the ffn a SwiGLU or the MixtureOfExperts."""

        def __init__(self, spec: dict, float64: bool, **kwargs):
            super().__init__(**kwargs)
            steps, dim = spec["in_shape"]
            with self.name_scope():
                self.norm1 = RMSNorm(dim, spec["eps"])
                self.attn = GroupedAttention({**spec, "causal": True}, steps, float64)
                self.norm2 = RMSNorm(dim, spec["eps"])
                self.ffn = (SwiGLU(dim, spec["hidden"]) if spec["moe"] is None
                            else MixtureOfExperts(dim, spec["hidden"], spec["moe"], float64))

        def hybrid_forward(self, F, x):
            x = x + self.attn(self.norm1(x))
            return x + self.ffn(self.norm2(x))

    return {"PositionEmbedding": PositionEmbedding, "PatchEmbedding": PatchEmbedding, "SelfAttention": SelfAttention,
            "TransformerBlock": TransformerBlock, "TokenPool": TokenPool, "gelu_block": gelu_block,
            "layer_norm_block": layer_norm_block, "SegmentEmbedding": SegmentEmbedding,
            "PretrainingHeads": PretrainingHeads, "RMSNorm": RMSNorm, "GroupedAttention": GroupedAttention,
            "SwiGLU": SwiGLU, "MixtureOfExperts": MixtureOfExperts, "LlamaBlock": LlamaBlock}


ADD_AUXILIARY_LOSS = "dlbench_add_auxiliary_loss"


@functools.lru_cache(maxsize=None)
def register_auxiliary_loss() -> None:
    """The custom operator that adds an auxiliary loss through its gradient (DeepSeek's
    AddAuxiliaryLoss): forward x unchanged, backward x's gradient and 1 for the loss (inputs x, aux)."""
    mx = load_mxnet()

    class AddAuxiliaryLoss(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            self.assign(out_data[0], req[0], in_data[0])

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            self.assign(in_grad[0], req[0], out_grad[0])
            self.assign(in_grad[1], req[1], mx.nd.ones_like(in_data[1]))

    @mx.operator.register(ADD_AUXILIARY_LOSS)
    class AddAuxiliaryLossProp(mx.operator.CustomOpProp):
        def __init__(self):
            super().__init__(need_top_grad=True)

        def list_arguments(self):
            return ["data", "loss"]

        def infer_shape(self, in_shape):
            return in_shape, [in_shape[0]], []

        def infer_type(self, in_type):
            return in_type, [in_type[0]], []

        def create_operator(self, ctx, shapes, dtypes):
            return AddAuxiliaryLoss()


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
        return framework_message(e)
    return None


# ------------------------------------------------------------------ builders: builder(spec, build)
# `build` is build_network's namespace (step.py; what it carries: layers.py).


def build_position_embedding(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["PositionEmbedding"](spec["max_length"], steps, dim)


def build_patch_embedding(spec, build):
    return build.classes["PatchEmbedding"](spec["in_shape"][0], spec["patch"], spec["dim"], spec["class_token"])


def build_layer_norm(spec, build):
    return build.classes["layer_norm_block"](spec["in_shape"][-1], spec["eps"], build.float64)


def build_gelu(spec, build):
    return build.classes["gelu_block"](spec["form"], build.float64)


def build_attention(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["SelfAttention"](dim, steps, spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                          spec["dropout"], build.fused_attention)


def build_transformer_block(spec, build):
    return build.classes["TransformerBlock"](spec, build.fused_attention, build.float64)


def build_rms_norm(spec, build):
    return build.classes["RMSNorm"](spec["in_shape"][-1], spec["eps"])


def build_grouped_attention(spec, build):
    return build.classes["GroupedAttention"](spec, spec["in_shape"][0], build.float64)


def build_swiglu(spec, build):
    return build.classes["SwiGLU"](spec["in_shape"][-1], spec["hidden"])


def _refuse_capacity(routing: dict) -> None:
    if routing["capacity_factor"] is not None:
        raise Skip("mxnet runner: an moe with a capacity factor is not built (its dense dispatch computes every "
                   "expert on every token; dropping choices past a capacity needs a cumulative count it does not "
                   "compose): dropless only")


def build_moe(spec, build):
    _refuse_capacity(spec)
    register_auxiliary_loss()
    return build.classes["MixtureOfExperts"](spec["in_shape"][-1], spec["hidden"], spec, build.float64)


def build_llama_block(spec, build):
    if spec["moe"] is not None:
        _refuse_capacity(spec["moe"])
        register_auxiliary_loss()
    return build.classes["LlamaBlock"](spec, build.float64)


def build_token_pool(spec, build):
    return build.classes["TokenPool"](spec["mode"])


def build_lm_head(spec, build):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    if not spec["tied"]:
        return gluon_nn().Dense(vocabulary, flatten=False, use_bias=spec["bias"], in_units=dim)
    embedding = build.built[0]  # the schema ties the head to the network's first layer, the token embedding
    if not isinstance(embedding, gluon_nn().Embedding):
        raise TypeError(f"a tied lm_head needs the token embedding as layer 0, found {type(embedding).__name__}")
    # Gluon's parameter sharing (GluonNLP's tied BERT decoder): built with the embedding's ParameterDict,
    # the Dense's `weight` is the embedding's very Parameter (one tensor, its gradient the sum of both
    # uses, updated once). Its bias, when it has one, is its own, named under that dict's prefix.
    return gluon_nn().Dense(vocabulary, flatten=False, use_bias=spec["bias"], in_units=dim, params=embedding.params)


def build_segment_embedding(spec, build):
    steps, dim = spec["in_shape"]
    return build.classes["SegmentEmbedding"](spec["segments"], steps, dim, build.input["segment_boundary"])


def build_pretraining_heads(spec, build):
    embedding = None
    if spec["tied"]:  # the decoder shares the token embedding's table, as a tied lm_head (above)
        embedding = build.built[0]
        if not isinstance(embedding, gluon_nn().Embedding):
            raise TypeError("tied pretraining_heads need the token embedding as layer 0, found "
                            f"{type(embedding).__name__}")
    return build.classes["PretrainingHeads"](spec, build.input["masked_positions"], embedding, build.float64)



# ------------------------------------------------------------------ canonical weights: weights(prefix, layer, block)
# name -> where the framework keeps it (weights.py exports and loads them): a Gluon Parameter, or
# one part of attention's interleaved q/k/v projection. A tied lm_head's weight, and a tied
# pretraining_heads' decoder weight, is the embedding's Parameter: it is exported once, as the
# embedding's (000.weight).


class InterleavedPart(NamedTuple):
    """One of q (part 0), k (1), v (2), rows head-major, in attention's interleaved projection
    `param`: its output feature h*3S + j*S + s is row h*S + s of part j (weights.py converts)."""

    param: object
    heads: int
    part: int


def weight_and_bias(prefix: str, block) -> dict:
    out = {f"{prefix}.weight": block.weight}
    if block.bias is not None:
        out[f"{prefix}.bias"] = block.bias
    return out


def layer_norm_params(prefix: str, ln) -> dict:
    return {f"{prefix}.gamma": ln.gamma, f"{prefix}.beta": ln.beta}


def table_weight(prefix: str, layer: dict, block) -> dict:
    """A table's one weight (an embedding's, a position or segment embedding's)."""
    return {f"{prefix}.weight": block.weight}


def patch_embedding_weights(prefix: str, layer: dict, block) -> dict:
    out = weight_and_bias(prefix, block.proj)
    if block.class_token is not None:
        out[f"{prefix}.class_token"] = block.class_token
    return out


def layer_norm_weights(prefix: str, layer: dict, block) -> dict:
    return layer_norm_params(prefix, block)


def self_attention_params(prefix: str, attn) -> dict:
    """A SelfAttention block's q, k and v (parts of its interleaved projection) and out projection."""
    out = {}
    for kind, param in (("weight", attn.qkv.weight), ("bias", attn.qkv.bias)):
        if param is not None:
            out.update({f"{prefix}.{part}.{kind}": InterleavedPart(param, attn.heads, j)
                        for j, part in enumerate("qkv")})
    out.update(weight_and_bias(f"{prefix}.out", attn.out))
    return out


def attention_weights(prefix: str, layer: dict, block) -> dict:
    return self_attention_params(prefix, block)


def transformer_block_weights(prefix: str, layer: dict, block) -> dict:
    return {**layer_norm_params(f"{prefix}.ln1", block.ln1), **self_attention_params(f"{prefix}.attn", block.attn),
            **layer_norm_params(f"{prefix}.ln2", block.ln2), **weight_and_bias(f"{prefix}.mlp.fc1", block.fc1),
            **weight_and_bias(f"{prefix}.mlp.fc2", block.fc2)}


def lm_head_weights(prefix: str, layer: dict, block) -> dict:
    if not layer["tied"]:
        return weight_and_bias(prefix, block)
    # the weight is 000.weight, the embedding's: only a bias of its own
    return {f"{prefix}.bias": block.bias} if block.bias is not None else {}


def pretraining_heads_weights(prefix: str, layer: dict, block) -> dict:
    out = {}
    for part in ("pooler", "next_sentence", "transform"):
        out.update(weight_and_bias(f"{prefix}.{part}", getattr(block, part)))
    out.update(layer_norm_params(f"{prefix}.transform_ln", block.transform_ln))
    if not layer["tied"]:  # tied: the decoder's weight is 000.weight, the embedding's
        out[f"{prefix}.decoder.weight"] = block.decoder.weight
    out[f"{prefix}.decoder.bias"] = block.decoder.bias
    return out


def rms_norm_weights(prefix: str, layer: dict, block) -> dict:
    return {f"{prefix}.gamma": block.gamma}


def _grouped_attention_params(prefix: str, attn) -> dict:
    return {f"{prefix}.{part}.weight": getattr(attn, part).weight for part in ("q", "k", "v", "out")}


def grouped_attention_weights(prefix: str, layer: dict, block) -> dict:
    return _grouped_attention_params(prefix, block)


def _swiglu_params(prefix: str, mlp) -> dict:
    return {f"{prefix}.{part}.weight": getattr(mlp, part).weight for part in ("gate", "up", "down")}


def swiglu_weights(prefix: str, layer: dict, block) -> dict:
    return _swiglu_params(prefix, block)


def _moe_params(prefix: str, moe) -> dict:
    return {f"{prefix}.router.weight": moe.router, f"{prefix}.experts.gate": moe.gate,
            f"{prefix}.experts.up": moe.up, f"{prefix}.experts.down": moe.down}


def moe_weights(prefix: str, layer: dict, block) -> dict:
    return _moe_params(prefix, block)


def llama_block_weights(prefix: str, layer: dict, block) -> dict:
    out = {f"{prefix}.norm1.gamma": block.norm1.gamma, **_grouped_attention_params(f"{prefix}.attn", block.attn),
           f"{prefix}.norm2.gamma": block.norm2.gamma}
    if layer["moe"] is None:
        out.update(_swiglu_params(f"{prefix}.mlp", block.ffn))
    else:
        out.update(_moe_params(f"{prefix}.moe", block.ffn))
    return out
