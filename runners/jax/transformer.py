"""The JAX runner's transformer layers (schema.py's semantics): their flax modules (position and
patch embeddings, self-attention, the MLP, the block, a tied head's bias, BERT's pretraining
heads), the builders layers.py's table calls for them, their canonical weights, and which
attention function and kernel they call (the report of what actually ran is attention.py's).

flax is imported lazily (framework.py): the modules are defined on first use, after the runner's
thread configuration.

Canonical weights (src/dlbench/definitions/weights.py) <-> flax variables: a patch embedding's
conv kernel OIHW <-> HWIO; dense weights (out, in) <-> kernel (in, out): attention's q, k, v and
out, a block's mlp.fc1/fc2 and an untied lm_head (nn.Dense; the q, k, v kernels' columns are the
canonical head-major rows); layer norm gamma/beta <-> scale/bias; a position table and a class
token as they are; a tied lm_head has only its bias (its weight is 000.weight, the Embed table its
attend decodes with); a segment embedding's (segments, D) table is its nn.Embed's; pretraining
heads' pooler, next_sentence, transform and an untied decoder weight are nn.Dense kernels
(transposed), transform_ln the nn.LayerNorm, decoder.bias the decoder's bias (tied: a bias only,
decoding with the token embedding's Embed.attend, as a tied lm_head).
"""

from __future__ import annotations

import functools

from runners.common import rotary
from runners.common import routing as routing_rule
from runners.jax.framework import load_jax, load_jnp, load_linen


# ------------------------------------------------------------------ transformer layers (schema.py's semantics)
# Sequences are (B, T, D); images reach a patch embedding NHWC. Attention's q, k and v are nn.Dense
# to heads*head_size reshaped to (B, T, heads, head_size): head h is columns h*S .. (h+1)*S - 1 (the
# canonical head-major order), and (B, T, N, H) is the layout jax.nn.dot_product_attention takes.

ATTENTION_FUNCTION = "jax.nn.dot_product_attention"
FLAX_ATTENTION_FUNCTION = "flax.linen.dot_product_attention"
# Why an attention does not run through jax.nn.dot_product_attention (attention_function):
DROPOUT_ATTENTION = ("dropout on the probabilities in training: jax.nn.dot_product_attention has no dropout, "
                     "flax.linen.dot_product_attention applies it to the softmax it computes")
FLOAT64_ATTENTION = ("float64: jax.nn.dot_product_attention's XLA implementation casts the scores to float32 for "
                     "its softmax (jax/_src/nn/functions.py), flax.linen.dot_product_attention keeps float64")
CPU_FLOAT16_ATTENTION = ("float16 on the CPU: jax.nn.dot_product_attention's XLA implementation asks dot_general "
                         "for float32 results of float16 operands (F16_F16_F32), which XLA:CPU does not offer; "
                         "flax.linen.dot_product_attention multiplies in float16")
# cuDNN's fused attention (implementation="cudnn") takes fp16/bf16 (and fp8) q, k, v only
CUDNN_DTYPES = ("bfloat16", "float16")


def attention_function(dtype: str, dropout_on: bool, device: str) -> tuple[str, str | None]:
    """(the function an attention calls, why it is not jax.nn.dot_product_attention or None)."""
    if dropout_on:
        return FLAX_ATTENTION_FUNCTION, DROPOUT_ATTENTION
    if dtype == "float64":
        return FLAX_ATTENTION_FUNCTION, FLOAT64_ATTENTION
    if dtype == "float16" and device == "cpu":
        return FLAX_ATTENTION_FUNCTION, CPU_FLOAT16_ATTENTION
    return ATTENTION_FUNCTION, None


def attention_asked(dtype: str, device: str) -> str | None:
    """jax.nn.dot_product_attention's `implementation` argument: cuDNN's flash attention on a GPU in
    half precision (its fast path), else None (jax chooses)."""
    return "cudnn" if device == "cuda" and dtype in CUDNN_DTYPES else None


TRANSFORMER_TYPES = ("position_embedding", "patch_embedding", "layer_norm", "gelu", "attention", "transformer_block",
                     "rms_norm", "grouped_attention", "swiglu", "moe", "llama_block",
                     "token_pool", "lm_head", "segment_embedding", "pretraining_heads")


def cudnn_refusal(layer: dict, dtype: str, train: bool) -> str | None:
    """Why jax refuses implementation="cudnn" for this layer's attention (its shape, dtype, this GPU
    or cuDNN), traced on one sample as the step traces it (with the backward in training); None
    when it takes it. jax checks these when it traces the call, so nothing is compiled."""
    import jax.numpy as jnp

    jax = load_jax()
    t = layer["in_shape"][0]
    qkv = jax.ShapeDtypeStruct((1, t, layer["heads"], layer["head_size"]), getattr(jnp, dtype))
    kv = jax.ShapeDtypeStruct((1, t, layer.get("kv_heads", layer["heads"]), layer["head_size"]), getattr(jnp, dtype))

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=layer.get("causal", True), implementation="cudnn")

    def run(q, k, v):
        if not train:
            return attend(q, k, v)
        return jax.grad(lambda *a: attend(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    try:
        jax.jit(run).lower(qkv, kv, kv)
    except Exception as e:  # noqa: BLE001 - jax's NotImplementedError / ValueError / RuntimeError: its reason
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def transformer_modules():
    """The transformer layers' flax modules (defined once, lazily: flax is imported after the
    thread configuration)."""
    import types

    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    table_init = nn.initializers.normal(stddev=0.02)  # GPT-2's and ViT's tables and class token

    class PositionEmbedding(nn.Module):
        """x + P[0:T], a learned (max_length, D) table (GPT-2's wpe, ViT's pos_embedding)."""

        max_length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            table = self.param("pos_embedding", table_init, (self.max_length, x.shape[-1]))
            return x + table[: x.shape[1]].astype(self.dtype)

    class PatchEmbedding(nn.Module):
        """A strided nn.Conv (kernel = stride = patch, VALID) on the NHWC image, its (h, w) grid as
        tokens in row-major order, the class token prepended (flax ViT's embedding and cls)."""

        patch: int
        dim: int
        class_token: bool
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            p = self.patch
            grid = nn.Conv(self.dim, (p, p), (p, p), padding="VALID", use_bias=True, dtype=self.dtype,
                           name="proj")(x)  # (B, H/p, W/p, dim)
            tokens = grid.reshape(grid.shape[0], -1, self.dim)  # NHWC: positions already row-major
            if not self.class_token:
                return tokens
            cls = self.param("class_token", table_init, (self.dim,)).astype(tokens.dtype)
            return jnp.concatenate([jnp.broadcast_to(cls, (tokens.shape[0], 1, self.dim)), tokens], axis=1)

    class SelfAttention(nn.Module):
        """Multi-head self-attention: q, k, v, out as nn.Dense; the heads' products in
        jax.nn.dot_product_attention (scale 1/sqrt(head_size), is_causal, `implementation`), or in
        flax.linen.dot_product_attention where attention_function says why."""

        heads: int
        head_size: int
        causal: bool
        bias: bool
        dropout: float
        deterministic: bool
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION  # the runner's choice for this layer (plan_attention)

        @nn.compact
        def __call__(self, x, train: bool):
            b, t, d = x.shape
            inner = self.heads * self.head_size

            def heads(name):  # (B, T, H*S) -> (B, T, H, S)
                y = nn.Dense(inner, use_bias=self.bias, dtype=self.dtype, name=name)(x)
                return y.reshape(b, t, self.heads, self.head_size)

            q, k, v = heads("q"), heads("k"), heads("v")
            dropout_on = train and not self.deterministic and self.dropout > 0
            if self.function == ATTENTION_FUNCTION and not dropout_on:
                a = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal, implementation=self.implementation)
            else:
                mask = nn.make_causal_mask(x[..., 0], dtype=jnp.bool_) if self.causal else None
                # per element, as the canonical dropout on p (flax's default shares one mask across
                # the batch and the heads); under amp its softmax is in the compute dtype, flax's default
                a = nn.dot_product_attention(q, k, v, mask=mask, dropout_rate=self.dropout if dropout_on else 0.0,
                                             dropout_rng=self.make_rng("dropout") if dropout_on else None,
                                             broadcast_dropout=False, deterministic=not dropout_on, dtype=self.dtype)
            return nn.Dense(d, use_bias=self.bias, dtype=self.dtype, name="out")(a.reshape(b, t, inner))

    class Mlp(nn.Module):
        """fc1 (D -> ratio*D), GELU in the network's form, fc2 (back to D)."""

        hidden: int
        bias: bool
        approximate: bool
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            y = nn.Dense(self.hidden, use_bias=self.bias, dtype=self.dtype, name="fc1")(x)
            y = jax.nn.gelu(y, approximate=self.approximate)
            return nn.Dense(x.shape[-1], use_bias=self.bias, dtype=self.dtype, name="fc2")(y)

    class TransformerBlock(nn.Module):
        """Layer norms, self-attention and the MLP with two residual joins, pre- or post-norm;
        the block's dropout on each branch before its join and on the attention's probabilities."""

        spec: dict
        deterministic: bool
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION

        @nn.compact
        def __call__(self, x, train: bool):
            s = self.spec
            ln1 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln1")
            ln2 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln2")
            attn = SelfAttention(s["heads"], s["head_size"], s["causal"], s["bias"], s["dropout"], self.deterministic,
                                 self.implementation, self.dtype, self.function, name="attn")
            mlp = Mlp(s["mlp_ratio"] * x.shape[-1], s["bias"], s["gelu"] == "tanh", self.dtype, name="mlp")
            dropout_on = train and not self.deterministic and s["dropout"] > 0

            def drop(y):
                return nn.Dropout(s["dropout"], deterministic=False)(y) if dropout_on else y

            if s["norm"] == "pre":
                x = x + drop(attn(ln1(x), train))
                return x + drop(mlp(ln2(x)))
            x = ln1(x + drop(attn(x, train)))
            return ln2(x + drop(mlp(x)))

    class Bias(nn.Module):
        """A tied head's own bias, added to Embed.attend's logits."""

        features: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            return x + self.param("bias", nn.initializers.zeros_init(), (self.features,)).astype(self.dtype)

    class PretrainingHeads(nn.Module):
        """BERT's pooler and pre-training heads (HuggingFace's FlaxBertForPreTraining): pooled =
        tanh(pooler(h[:, 0])), the next-sentence logits next_sentence(pooled); at the masked
        positions, gathered with jnp.take (one XLA gather, the positions static, sorted and unique),
        transform, GELU, transform_ln, then the decoder: an nn.Dense of its own, or with `embed` (the
        token embedding, tied) that module's Embed.attend plus the decoder's Bias. -> (masked-LM
        logits (B, M, V), next-sentence logits (B, 2))."""

        masked_positions: tuple
        vocabulary: int
        approximate: bool
        eps: float
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, embed=None):
            d = x.shape[-1]
            pooled = jnp.tanh(nn.Dense(d, dtype=self.dtype, name="pooler")(x[:, 0]))
            next_sentence = nn.Dense(2, dtype=self.dtype, name="next_sentence")(pooled)
            h = jnp.take(x, jnp.asarray(self.masked_positions, jnp.int32), axis=1, mode="clip",
                         indices_are_sorted=True, unique_indices=True)  # (B, M, D)
            h = jax.nn.gelu(nn.Dense(d, dtype=self.dtype, name="transform")(h), approximate=self.approximate)
            h = nn.LayerNorm(epsilon=self.eps, dtype=self.dtype, name="transform_ln")(h)
            if embed is None:
                return nn.Dense(self.vocabulary, dtype=self.dtype, name="decoder")(h), next_sentence
            return Bias(self.vocabulary, self.dtype, name="decoder")(embed.attend(h)), next_sentence

    class GroupedAttention(nn.Module):
        """Grouped-query attention with rotary position embedding (the flax Llama of HuggingFace's
        FlaxLlamaAttention and MaxText): q, k, v and out as nn.Dense without bias, q and k rotated
        (rotate_half) by constant cos and sin tables (runners/common/rotary.py's), and the heads in
        jax.nn.dot_product_attention with the KV key/value heads as they are (it takes grouped heads:
        query head h reads key/value head h // (H / KV)); where attention_function picks flax's
        dot_product_attention (float64), k and v repeated per query head first (repeat_kv)."""

        spec: dict
        positions: int
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION

        def setup(self):
            s = self.spec
            self.q = nn.Dense(s["heads"] * s["head_size"], use_bias=False, dtype=self.dtype)
            self.k = nn.Dense(s["kv_heads"] * s["head_size"], use_bias=False, dtype=self.dtype)
            self.v = nn.Dense(s["kv_heads"] * s["head_size"], use_bias=False, dtype=self.dtype)
            self.out = nn.Dense(s["in_shape"][-1], use_bias=False, dtype=self.dtype)

        def rotate(self, t, start):
            """t (B, T, heads, S) rotated by positions start .. start + T - 1 (start may be traced)."""
            cos, sin = rotary.layer_tables(self.spec, self.positions)
            steps, half = t.shape[1], t.shape[-1] // 2
            cos = jax.lax.dynamic_slice_in_dim(jnp.asarray(cos, t.dtype), start, steps)[None, :, None, :]
            sin = jax.lax.dynamic_slice_in_dim(jnp.asarray(sin, t.dtype), start, steps)[None, :, None, :]
            rotated = jnp.concatenate([-t[..., half:], t[..., :half]], axis=-1)
            return t * cos + rotated * sin

        def project(self, x, start=0):
            s = self.spec
            b, t, _ = x.shape
            q = self.q(x).reshape(b, t, s["heads"], s["head_size"])
            k = self.k(x).reshape(b, t, s["kv_heads"], s["head_size"])
            v = self.v(x).reshape(b, t, s["kv_heads"], s["head_size"])
            return self.rotate(q, start), self.rotate(k, start), v

        def attend(self, q, k, v, causal: bool, mask=None):
            s = self.spec
            b, t = q.shape[:2]
            if self.function == ATTENTION_FUNCTION and mask is None:
                a = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=self.implementation)
            else:
                groups = s["heads"] // s["kv_heads"]
                k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
                if mask is None and causal:
                    mask = nn.make_causal_mask(q[..., 0, 0], dtype=jnp.bool_)
                a = nn.dot_product_attention(q, k, v, mask=mask, dtype=self.dtype)
            return self.out(a.reshape(b, t, s["heads"] * s["head_size"]))

        def __call__(self, x):
            return self.attend(*self.project(x), self.spec["causal"])

    class SwiGLU(nn.Module):
        """down(silu(gate(x)) * up(x)), nn.Dense without bias (FlaxLlamaMLP's design)."""

        hidden: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            gate = nn.Dense(self.hidden, use_bias=False, dtype=self.dtype, name="gate")(x)
            up = nn.Dense(self.hidden, use_bias=False, dtype=self.dtype, name="up")(x)
            return nn.Dense(x.shape[-1], use_bias=False, dtype=self.dtype, name="down")(jax.nn.silu(gate) * up)

    @jax.custom_vjp
    def add_auxiliary_loss(x, aux):
        """x unchanged; backward, a gradient of 1 for `aux` (DeepSeek's AddAuxiliaryLoss): the loss
        is minimised with the step's without being added to the value the step reports."""
        return x

    def _add_forward(x, aux):
        return x, aux

    def _add_backward(aux, g):
        return g, jnp.ones_like(aux)

    add_auxiliary_loss.defvjp(_add_forward, _add_backward)

    class MixtureOfExperts(nn.Module):
        """E SwiGLU experts, their weights stacked ((E, hidden, D), (E, D, hidden): the canonical
        layout) and a linear router, computed dropless the way MaxText's sparse matmul does: the
        router's product and softmax in float32, jax.lax.top_k (ties to the lower index, as jax
        documents it), the token choices sorted by expert, each expert's rows multiplied by
        jax.lax.ragged_dot (one grouped product per weight), their weighted outputs added back to
        their tokens. A capacity factor zeroes the weight of the choices past each expert's slots
        (every token's first choice before any second), which are still computed. In training the
        load-balancing loss enters the gradient through add_auxiliary_loss, times its weight."""

        spec: dict
        dim: int
        hidden: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, train: bool):
            routing = self.spec
            experts, top_k = routing["experts"], routing["top_k"]
            # expert parallelism (dispatch_and_combine below; distributed.py): this rank's shard of the experts
            sharded = routing.get("expert_parallel")
            held = experts // sharded["workers"] if sharded else experts
            lecun = nn.initializers.lecun_normal(in_axis=-1, out_axis=-2, batch_axis=(0,))
            router = self.param("router", lecun, (experts, self.dim))
            gate = self.param("expert_gate", lecun, (held, self.hidden, self.dim))
            up = self.param("expert_up", lecun, (held, self.hidden, self.dim))
            down = self.param("expert_down", lecun, (held, self.dim, self.hidden))
            b, t, d = x.shape
            tokens = x.reshape(-1, d)
            wide = jnp.float64 if tokens.dtype == jnp.float64 else jnp.float32
            p = jax.nn.softmax(tokens.astype(wide) @ router.astype(wide).T, axis=-1)
            picked, chosen = jax.lax.top_k(p, top_k)
            weights = picked / picked.sum(axis=-1, keepdims=True)
            slots = routing_rule.capacity(routing["capacity_factor"], tokens.shape[0], top_k, experts)
            if slots is not None:
                onehot = jax.nn.one_hot(chosen.T.reshape(-1), experts, dtype=jnp.int32)  # rank-major priority
                position = (jnp.cumsum(onehot, axis=0) * onehot).sum(-1) - 1
                weights = weights * (position < slots).reshape(top_k, -1).T.astype(weights.dtype)
            cast = self.dtype if self.dtype is not None else tokens.dtype
            if sharded:
                out = dispatch_and_combine(tokens, chosen, weights, (gate, up, down), experts, sharded, cast)
                out = out.reshape(b, t, d)
            else:
                flat = chosen.reshape(-1)
                order = jnp.argsort(flat, stable=True)
                token_of = order // top_k
                rows = jnp.take(tokens, token_of, axis=0)
                sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
                rows = rows.astype(cast)
                h = (jax.nn.silu(jax.lax.ragged_dot(rows, jnp.swapaxes(gate, 1, 2).astype(cast), sizes))
                     * jax.lax.ragged_dot(rows, jnp.swapaxes(up, 1, 2).astype(cast), sizes))
                y = jax.lax.ragged_dot(h, jnp.swapaxes(down, 1, 2).astype(cast), sizes)
                y = y * jnp.take(weights.reshape(-1), order).astype(y.dtype)[:, None]
                out = jnp.zeros_like(tokens, dtype=y.dtype).at[token_of].add(y).reshape(b, t, d)
            if train and routing["aux_loss_weight"]:
                fraction = jax.nn.one_hot(chosen, experts, dtype=p.dtype).sum(1).mean(0)
                aux = experts * jnp.sum(fraction * p.mean(0))
                out = add_auxiliary_loss(out, aux * routing["aux_loss_weight"])
            return out

    class LlamaBlock(nn.Module):
        """FlaxLlamaDecoderLayer's design: x + attn(norm1(x)), then + mlp(norm2(x)) (or moe), flax's
        nn.RMSNorm."""

        spec: dict
        positions: int
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION

        def setup(self):
            s = self.spec
            dim = s["in_shape"][-1]
            self.norm1 = nn.RMSNorm(epsilon=s["eps"], dtype=self.dtype)
            self.attn = GroupedAttention({**s, "causal": True}, self.positions, self.implementation, self.dtype,
                                         self.function)
            self.norm2 = nn.RMSNorm(epsilon=s["eps"], dtype=self.dtype)
            if s["moe"] is None:
                self.mlp = SwiGLU(s["hidden"], self.dtype)
            else:
                self.moe = MixtureOfExperts(s["moe"], dim, s["hidden"], self.dtype)

        def ffn(self, x, train: bool):
            return self.mlp(x) if self.spec["moe"] is None else self.moe(x, train)

        def __call__(self, x, train: bool):
            x = x + self.attn(self.norm1(x))
            return x + self.ffn(self.norm2(x), train)

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, Mlp=Mlp, TransformerBlock=TransformerBlock, Bias=Bias,
                                 PretrainingHeads=PretrainingHeads, GroupedAttention=GroupedAttention, SwiGLU=SwiGLU,
                                 MixtureOfExperts=MixtureOfExperts, LlamaBlock=LlamaBlock)


def build_position_embedding(x, spec, at):
    return transformer_modules().PositionEmbedding(spec["max_length"], at.dtype, name=at.name)(x)


def build_patch_embedding(x, spec, at):
    return transformer_modules().PatchEmbedding(spec["patch"], spec["dim"], spec["class_token"], at.dtype,
                                                name=at.name)(x)


def build_layer_norm(x, spec, at):
    return load_linen().LayerNorm(epsilon=spec["eps"], dtype=at.dtype, name=at.name)(x)


def build_gelu(x, spec, at):
    return load_jax().nn.gelu(x, approximate=spec["form"] == "tanh")


def build_attention(x, spec, at):
    return transformer_modules().SelfAttention(spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                               spec["dropout"], at.net.deterministic,
                                               at.how.get("attention_implementation"), at.dtype,
                                               at.how["attention_function"], name=at.name)(x, at.train)


def build_transformer_block(x, spec, at):
    return transformer_modules().TransformerBlock(spec, at.net.deterministic, at.how.get("attention_implementation"),
                                                  at.dtype, at.how["attention_function"], name=at.name)(x, at.train)


def build_rms_norm(x, spec, at):
    return load_linen().RMSNorm(epsilon=spec["eps"], dtype=at.dtype, name=at.name)(x)


def build_grouped_attention(x, spec, at):
    return transformer_modules().GroupedAttention(spec, spec["in_shape"][0], at.how.get("attention_implementation"),
                                                  at.dtype, at.how["attention_function"], name=at.name)(x)


# ------------------------------------------------------------------ expert parallelism


def dispatch_and_combine(tokens, chosen, weights, experts_held, experts: int, sharded: dict, cast):
    """Expert parallelism's block (distributed.py prepare_expert_parallel says how the step uses it):
    the output (N, D) for this rank's tokens (N, D), their experts `chosen` (N, k) and weights
    (N, k), the experts held here (gate, up, down: (E/W, ...)); sharded: {"axis", "workers",
    "exchange"} (exchange False: the identity in place of each all-to-all, for step_without_sync).

    The (token, choice) pairs sorted by expert, each pair's row written into the slot of a send
    buffer of W blocks, block j for rank j, each block C = N x min(k, E/W) rows (the most one
    rank's N tokens can send another: every token choosing up to k distinct experts among its
    E/W), so the dispatch is dropless with static shapes, padded to that worst case;
    `lax.all_to_all` (tiled) sends block j to rank j, with the local expert id of every row (E/W
    marking padding) beside it; the rows are grouped by local expert and multiplied by
    `lax.ragged_dot` (the padding a group of its own, against zero weights); the outputs go back
    by the reverse all-to-all and are added to their tokens, weighted. Autodiff transposes each
    all-to-all: the backward sends the gradients back the same way."""
    jax = load_jax()
    jnp = jax.numpy
    lax = jax.lax
    gate, up, down = experts_held
    n, d = tokens.shape
    top_k = chosen.shape[1]
    workers, axis = sharded["workers"], sharded["axis"]
    held = experts // workers
    slots = n * min(top_k, held)  # rows one rank may send another, at most

    def all_to_all(buffer):
        if not sharded["exchange"]:
            return buffer
        return lax.all_to_all(buffer, axis, split_axis=0, concat_axis=0, tiled=True)

    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # the pairs grouped by expert, so by rank too
    expert = flat[order]
    token_of = order // top_k
    rank = expert // held
    per_rank = jnp.bincount(rank, length=workers)
    first = jnp.cumsum(per_rank) - per_rank
    slot = rank * slots + (jnp.arange(flat.shape[0]) - first[rank])
    send = jnp.zeros((workers * slots, d), cast).at[slot].set(jnp.take(tokens, token_of, axis=0).astype(cast))
    send_expert = jnp.full((workers * slots,), held, jnp.int32).at[slot].set((expert % held).astype(jnp.int32))
    rows, row_expert = all_to_all(send), all_to_all(send_expert)
    grouped = jnp.argsort(row_expert, stable=True)
    sizes = jnp.bincount(row_expert, length=held + 1).astype(jnp.int32)  # the last group: padding

    def padded(w):  # (E/W, a, b) -> (E/W + 1, b, a): ragged_dot's layout, a zero expert for the padding
        w = jnp.swapaxes(w, 1, 2).astype(cast)
        return jnp.concatenate([w, jnp.zeros((1, *w.shape[1:]), w.dtype)])

    x = rows[grouped]
    h = jax.nn.silu(lax.ragged_dot(x, padded(gate), sizes)) * lax.ragged_dot(x, padded(up), sizes)
    y = jnp.zeros_like(x).at[grouped].set(lax.ragged_dot(h, padded(down), sizes))
    back = all_to_all(y)[slot]
    back = back * jnp.take(weights.reshape(-1), order).astype(back.dtype)[:, None]
    return jnp.zeros((n, d), back.dtype).at[token_of].add(back)


def build_swiglu(x, spec, at):
    return transformer_modules().SwiGLU(spec["hidden"], at.dtype, name=at.name)(x)


def build_moe(x, spec, at):
    return transformer_modules().MixtureOfExperts(spec, spec["in_shape"][-1], spec["hidden"], at.dtype,
                                                  name=at.name)(x, at.train)


def build_llama_block(x, spec, at):
    return transformer_modules().LlamaBlock(spec, spec["in_shape"][0], at.how.get("attention_implementation"),
                                            at.dtype, at.how["attention_function"], name=at.name)(x, at.train)


def build_token_pool(x, spec, at):
    return x[:, 0] if spec["mode"] == "class" else load_jnp().mean(x, axis=1)


def build_lm_head(x, spec, at):
    nn = load_linen()
    vocabulary = spec["out_shape"][-1]
    if not spec["tied"]:
        return nn.Dense(vocabulary, use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)
    # the schema ties the head to layer 0, the token embedding: flax's tied decoder is that very
    # module's attend (x E^T with its table), so the table gets both uses' gradients and one update
    embed = at.modules.get("layer000")
    if not isinstance(embed, nn.Embed):
        raise TypeError(f"a tied lm_head needs the token embedding as layer 0, found {type(embed).__name__}")
    logits = embed.attend(x)
    return transformer_modules().Bias(vocabulary, at.dtype, name=at.name)(logits) if spec["bias"] else logits


SEGMENT_TABLE_STD = 0.02  # BERT's initialisation of its token-type table, as the other runners draw it


def build_segment_embedding(x, spec, at):
    import numpy as np

    # BERT's token types: the fixed (T,) segment of each position looked up in an nn.Embed table
    # (flax BERT's token_type_embeddings), the same rows for every sample of the batch
    segment = np.asarray(np.arange(x.shape[1]) >= at.how["segment_boundary"], np.int32)
    nn = load_linen()
    table = nn.Embed(spec["segments"], x.shape[-1], dtype=at.dtype, name=at.name,
                     embedding_init=nn.initializers.normal(stddev=SEGMENT_TABLE_STD))
    return x + table(load_jnp().asarray(segment))[None]


def build_pretraining_heads(x, spec, at):
    nn = load_linen()
    embed = None
    if spec["tied"]:  # the decoder is layer 0's table, as a tied lm_head's (Embed.attend)
        embed = at.modules.get("layer000")
        if not isinstance(embed, nn.Embed):
            raise TypeError(f"tied pretraining_heads need the token embedding as layer 0, found {type(embed).__name__}")
    return transformer_modules().PretrainingHeads(at.how["masked_positions"], spec["out_shape"][-1],
                                                  spec["gelu"] == "tanh", spec["eps"], at.dtype,
                                                  name=at.name)(x, embed)



# ------------------------------------------------------------------ canonical weights of the transformer layers
# Each yields (canonical name, collection, path in the collection, kind, perm) for layers.py's
# table; `kind` is how weights.py converts the tensor (conv, dense, vector), `perm` a flat-feature
# permutation (None: a transformer layer never follows an NHWC flatten).


def weight_bias_entries(prefix: str, path: tuple, bias: bool, kind: str = "dense"):
    yield f"{prefix}.weight", "params", path + ("kernel",), kind, None
    if bias:
        yield f"{prefix}.bias", "params", path + ("bias",), "vector", None


def ln_entries(prefix: str, path: tuple):
    yield f"{prefix}.gamma", "params", path + ("scale",), "vector", None
    yield f"{prefix}.beta", "params", path + ("bias",), "vector", None


def _attention_entries(prefix: str, path: tuple, bias: bool):
    # nn.Dense's (dim, heads*head_size) kernels: their columns are the canonical head-major rows
    for part in ("q", "k", "v", "out"):
        yield from weight_bias_entries(f"{prefix}.{part}", path + (part,), bias)


def position_embedding_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.weight", "params", path + ("pos_embedding",), "vector", None


def patch_embedding_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from weight_bias_entries(prefix, path + ("proj",), True, "conv")
    if layer["class_token"]:
        yield f"{prefix}.class_token", "params", path + ("class_token",), "vector", None


def layer_norm_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from ln_entries(prefix, path)


def attention_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from _attention_entries(prefix, path, layer["bias"])


def transformer_block_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from ln_entries(f"{prefix}.ln1", path + ("ln1",))
    yield from _attention_entries(f"{prefix}.attn", path + ("attn",), layer["bias"])
    yield from ln_entries(f"{prefix}.ln2", path + ("ln2",))
    for fc in ("fc1", "fc2"):
        yield from weight_bias_entries(f"{prefix}.mlp.{fc}", path + ("mlp", fc), layer["bias"])


def lm_head_weights(layer: dict, prefix: str, path: tuple, perm):
    if not layer["tied"]:
        yield from weight_bias_entries(prefix, path, layer["bias"])
    elif layer["bias"]:  # tied: the weight is 000.weight, the embedding's table; only a bias of its own
        yield f"{prefix}.bias", "params", path + ("bias",), "vector", None


def segment_embedding_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.weight", "params", path + ("embedding",), "vector", None


def pretraining_heads_weights(layer: dict, prefix: str, path: tuple, perm):
    for part in ("pooler", "next_sentence", "transform"):
        yield from weight_bias_entries(f"{prefix}.{part}", path + (part,), True)
    yield from ln_entries(f"{prefix}.transform_ln", path + ("transform_ln",))
    if not layer["tied"]:  # tied: the weight is 000.weight, the embedding's table
        yield f"{prefix}.decoder.weight", "params", path + ("decoder", "kernel"), "dense", None
    yield f"{prefix}.decoder.bias", "params", path + ("decoder", "bias"), "vector", None


def rms_norm_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.gamma", "params", path + ("scale",), "vector", None


def _grouped_attention_entries(prefix: str, path: tuple):
    for part in ("q", "k", "v", "out"):
        yield from weight_bias_entries(f"{prefix}.{part}", path + (part,), False)


def grouped_attention_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from _grouped_attention_entries(prefix, path)


def _swiglu_entries(prefix: str, path: tuple):
    for part in ("gate", "up", "down"):
        yield from weight_bias_entries(f"{prefix}.{part}", path + (part,), False)


def swiglu_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from _swiglu_entries(prefix, path)


def _moe_entries(prefix: str, path: tuple):
    # the router and the stacked experts are kept in the canonical (out, in) layouts
    yield f"{prefix}.router.weight", "params", path + ("router",), "vector", None
    for part in ("gate", "up", "down"):
        yield f"{prefix}.experts.{part}", "params", path + (f"expert_{part}",), "vector", None


def moe_weights(layer: dict, prefix: str, path: tuple, perm):
    yield from _moe_entries(prefix, path)


def llama_block_weights(layer: dict, prefix: str, path: tuple, perm):
    yield f"{prefix}.norm1.gamma", "params", path + ("norm1", "scale"), "vector", None
    yield from _grouped_attention_entries(f"{prefix}.attn", path + ("attn",))
    yield f"{prefix}.norm2.gamma", "params", path + ("norm2", "scale"), "vector", None
    if layer["moe"] is None:
        yield from _swiglu_entries(f"{prefix}.mlp", path + ("mlp",))
    else:
        yield from _moe_entries(f"{prefix}.moe", path + ("moe",))
