"""Mode `generate` for the jax runner: greedy decoding with flax cache variables in jitted steps.

The parameters are the ones step.py's TrainingModel makes for train and infer (the same flax
parameter tree, the same canonical weights in and out). The decoder here is a flax module whose
submodules carry the same names as step.py's Network (layer000 the nn.Embed, layer001 the
position table, each block's ln1 / attn.{q,k,v,out} / mlp.{fc1,fc2} / ln2, the final layer norm,
the head), so it applies to that very tree; its attention keeps its keys and values in the
`cache` collection (`cached_key`, `cached_value`: (batch, prompt + new tokens, heads, head size)),
written with lax.dynamic_update_slice at the request's position and read with a mask of the rows
written: flax's own idiom for autoregressive decoding (MultiHeadDotProductAttention(decode=True)).
Prefill (the whole prompt) and the decode step (one token) are two jax.jit functions taking the
cache as a donated argument, so each step updates it in place on the device; the position is a
traced scalar, so each compiles once.
"""

from __future__ import annotations

import functools

from runners.common import rotary
from runners.common.contract import DecoderLayout, Generator
from runners.common.protocol import Skip
from runners.jax.framework import load_jax
from runners.jax.precision import compute_dtype, precision_flags, request_precision
from runners.jax.step import TrainingModel
from runners.jax.transformer import transformer_modules
from runners.jax.weights import canonical_to_variables


@functools.cache
def decoder_class():
    """The cached decoder's flax module (defined once, lazily: flax is imported after the threads)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    tm = transformer_modules()

    def attend_cached(module, q, k, v, index, length, dtype):
        """Writes k and v (B, T, KV, S) at rows index .. index + T - 1 of the module's cache (B, length,
        KV, S) and attends the queries (B, T, H, S) over the rows written so far; (B, T, H*S) back.
        H a multiple of KV: the query heads read their key/value heads (grouped attention)."""
        b, t, heads, size = q.shape
        keys = module.variable("cache", "cached_key", jnp.zeros, (b, length, *k.shape[2:]), k.dtype)
        values = module.variable("cache", "cached_value", jnp.zeros, (b, length, *v.shape[2:]), v.dtype)
        # every index int32 (with x64 on, for the float64 check, a Python 0 would be int64)
        index = jnp.asarray(index, jnp.int32)
        zero = jnp.zeros((), jnp.int32)
        keys.value = jax.lax.dynamic_update_slice(keys.value, k, (zero, index, zero, zero))
        values.value = jax.lax.dynamic_update_slice(values.value, v, (zero, index, zero, zero))
        # query at position index + i sees the rows written so far: 0 .. index + i
        mask = (jnp.arange(length, dtype=jnp.int32)[None, :]
                <= (index + jnp.arange(t, dtype=jnp.int32))[:, None])[None, None]
        if jnp.dtype(dtype) == jnp.float64:
            # as transformer.py's attention in float64: jax.nn's XLA implementation takes its softmax
            # in float32, flax.linen's computes in the inputs' dtype (and has no grouped heads)
            every = heads // k.shape[2]
            cached_k, cached_v = keys.value, values.value
            if every > 1:
                cached_k, cached_v = jnp.repeat(cached_k, every, axis=2), jnp.repeat(cached_v, every, axis=2)
            a = nn.dot_product_attention(q, cached_k, cached_v, mask=mask, dtype=dtype)
        else:
            a = jax.nn.dot_product_attention(q, keys.value, values.value, mask=mask)
        return a.reshape(b, t, heads * size)

    class CachedAttention(nn.Module):
        heads: int
        head_size: int
        bias: bool
        length: int  # cache rows: prompt + new tokens
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, index):
            b, t, d = x.shape
            inner = self.heads * self.head_size

            def heads(name):  # (B, T, H*S) -> (B, T, H, S), as transformer.py's SelfAttention
                return nn.Dense(inner, use_bias=self.bias, dtype=self.dtype, name=name)(x).reshape(
                    b, t, self.heads, self.head_size)

            a = attend_cached(self, heads("q"), heads("k"), heads("v"), index, self.length, self.dtype)
            return nn.Dense(d, use_bias=self.bias, dtype=self.dtype, name="out")(a)

    class CachedBlock(nn.Module):
        spec: dict
        length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, index):
            s = self.spec
            ln1 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln1")
            ln2 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln2")
            attn = CachedAttention(s["heads"], s["head_size"], s["bias"], self.length, self.dtype, name="attn")
            mlp = tm.Mlp(s["mlp_ratio"] * x.shape[-1], s["bias"], s["gelu"] == "tanh", self.dtype, name="mlp")
            if s["norm"] == "pre":
                x = x + attn(ln1(x), index)
                return x + mlp(ln2(x))
            x = ln1(x + attn(x, index))
            return ln2(x + mlp(x))

    class CachedGroupedAttention(nn.Module):
        """A llama block's grouped attention with a key/value-head cache (batch, prompt + new tokens,
        KV, head size): q and k rotated by positions index .. index + T - 1 (the tables of
        runners/common/rotary.py for every row), k and v written at those rows, the query heads
        reading their key/value heads through jax.nn.dot_product_attention's grouped heads (float64:
        flax's, the key/value heads repeated)."""

        spec: dict
        length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, index):
            s = self.spec
            b, t, d = x.shape
            heads, kv, size = s["heads"], s["kv_heads"], s["head_size"]
            q = nn.Dense(heads * size, use_bias=False, dtype=self.dtype, name="q")(x).reshape(b, t, heads, size)
            k = nn.Dense(kv * size, use_bias=False, dtype=self.dtype, name="k")(x).reshape(b, t, kv, size)
            v = nn.Dense(kv * size, use_bias=False, dtype=self.dtype, name="v")(x).reshape(b, t, kv, size)
            index = jnp.asarray(index, jnp.int32)
            cos, sin = rotary.layer_tables(s, self.length)

            def rotate(u):
                c = jax.lax.dynamic_slice_in_dim(jnp.asarray(cos, u.dtype), index, t)[None, :, None, :]
                n = jax.lax.dynamic_slice_in_dim(jnp.asarray(sin, u.dtype), index, t)[None, :, None, :]
                return u * c + jnp.concatenate([-u[..., size // 2:], u[..., :size // 2]], axis=-1) * n

            a = attend_cached(self, rotate(q), rotate(k), v, index, self.length, self.dtype)
            return nn.Dense(d, use_bias=False, dtype=self.dtype, name="out")(a)

    class CachedLlamaBlock(nn.Module):
        """transformer.py's LlamaBlock with a cached attention, under the same parameter names."""

        spec: dict
        length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, index):
            s = self.spec
            x = x + CachedGroupedAttention(s, self.length, self.dtype, name="attn")(
                nn.RMSNorm(epsilon=s["eps"], dtype=self.dtype, name="norm1")(x), index)
            h = nn.RMSNorm(epsilon=s["eps"], dtype=self.dtype, name="norm2")(x)
            if s["moe"] is None:
                return x + tm.SwiGLU(s["hidden"], self.dtype, name="mlp")(h)
            return x + tm.MixtureOfExperts(s["moe"], x.shape[-1], s["hidden"], self.dtype, name="moe")(h, False)

    class PositionRows(nn.Module):
        """Rows index .. index + T - 1 of the network's position table (its `pos_embedding`), added."""

        max_length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, index):
            table = self.param("pos_embedding", nn.initializers.zeros_init(), (self.max_length, x.shape[-1]))
            rows = jax.lax.dynamic_slice(table, (jnp.asarray(index, jnp.int32), jnp.zeros((), jnp.int32)),
                                         (x.shape[1], x.shape[-1]))
            return x + rows.astype(self.dtype)

    class CachedDecoder(nn.Module):
        """tokens (B, T) at positions index .. index + T - 1 -> the last position's logits (B, V)."""

        layers: tuple
        embedding: int
        blocks: tuple
        norm: int | None
        head: int
        length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, tokens, index):
            first = self.layers[self.embedding]
            embed = nn.Embed(first["vocabulary"], first["dim"], dtype=self.dtype, name=f"layer{self.embedding:03d}")
            llama = self.layers[self.blocks[0]]["type"] == "llama_block"
            x = embed(tokens)
            if not llama:  # rotary positions are the llama blocks' own
                x = PositionRows(self.layers[1]["max_length"], self.dtype, name="layer001")(x, index)
            block = CachedLlamaBlock if llama else CachedBlock
            for i in self.blocks:
                x = block(self.layers[i], self.length, self.dtype, name=f"layer{i:03d}")(x, index)
            h = x[:, -1]
            if self.norm is not None:
                norm = nn.RMSNorm if llama else nn.LayerNorm
                h = norm(epsilon=self.layers[self.norm]["eps"], dtype=self.dtype, name=f"layer{self.norm:03d}")(h)
            spec = self.layers[self.head]
            vocabulary = spec["out_shape"][-1]
            name = f"layer{self.head:03d}"
            if not spec["tied"]:
                return nn.Dense(vocabulary, use_bias=spec["bias"], dtype=self.dtype, name=name)(h)
            logits = embed.attend(h)  # the tied head: the token table, as transformer.py's lm_head
            return tm.Bias(vocabulary, self.dtype, name=name)(logits) if spec["bias"] else logits

    return CachedDecoder


def prepare_generation(request: dict, device) -> Generator:
    """The Generator of mode generate (runner.py calls this after setting up jax for the device and
    checking the compile mode)."""
    import numpy as np

    jax = load_jax()
    jnp = jax.numpy
    network = request["network"]
    layout = DecoderLayout(network)
    precision = request_precision(request)
    if precision not in ("fp32", "tf32", "float64"):
        raise Skip(f"generate: the jax runner generates in fp32, tf32 and the check's float64, not {precision}")
    tm = TrainingModel(request)  # precision pinned, plan (the runner skipped eager)
    prompt_length, new_tokens = layout.request_lengths(request)
    seed = request.get("seed", 0)
    rng = np.random.default_rng(seed)
    sample = (network["input"]["sequence_length"],)
    params = jax.device_put(tm.host_variables(sample, np.int32, rng)["params"], device)
    if request.get("inputs"):
        with np.load(request["inputs"]) as data:
            prompt_np = np.ascontiguousarray(data["x"][:, :prompt_length], dtype=np.int32)
    else:
        prompt_np = rng.integers(0, network["input"]["vocabulary"], (request["batch_size"], prompt_length),
                                 dtype=np.int32)
    prompt = jax.device_put(prompt_np, device)
    batch = prompt_np.shape[0]
    decoder = decoder_class()(layers=tuple(network["layers"]), embedding=layout.embedding, blocks=tuple(layout.blocks),
                              norm=layout.norm, head=layout.head, length=prompt_length + new_tokens,
                              dtype=compute_dtype(tm.precision))
    shapes = jax.eval_shape(decoder.init, jax.random.PRNGKey(0), prompt, 0)["cache"]
    empty_cache = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

    def prefill_fn(p, cache, tokens):
        logits, updated = decoder.apply({"params": p, "cache": cache}, tokens, 0, mutable=["cache"])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits, updated["cache"]

    def decode_fn(p, cache, token, index):
        logits, updated = decoder.apply({"params": p, "cache": cache}, token[:, None], index, mutable=["cache"])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), updated["cache"]

    prefill_jit = jax.jit(prefill_fn, donate_argnums=(1,))
    decode_jit = jax.jit(decode_fn, donate_argnums=(1,))
    state = {"params": params, "cache": jax.device_put(empty_cache, device), "generated": [], "logits": None,
             "index": prompt_length}

    def prefill():
        token, logits, state["cache"] = prefill_jit(state["params"], state["cache"], prompt)
        state.update(token=token, logits=logits, generated=[token], index=prompt_length)

    def decode():
        token, state["cache"] = decode_jit(state["params"], state["cache"], state["token"],
                                           np.int32(state["index"]))
        state["token"] = token
        state["generated"].append(token)
        state["index"] += 1

    def synchronize():
        if state["generated"]:
            jax.block_until_ready(state["generated"][-1])

    def load_weights(arrays):
        like = {"params": state["params"]}
        state["params"] = jax.device_put(canonical_to_variables(arrays, network, tm.plan, like)["params"], device)

    settings = {
        "precision": tm.precision, "precision_effective": precision_flags(),
        "compile": {"mode": "compiled", "requested": request.get("compile"),
                    "framework": "jax.jit of the prefill and of the decode step (cache donated)"},
        "generation": {"prompt_length": prompt_length, "new_tokens": new_tokens, "batch_size": batch,
                       "decoding": "greedy (argmax)",
                       "cache": "flax `cache` collection per attention (cached_key, cached_value: batch, prompt + "
                                f"new tokens, {'key/value heads' if layout.llama else 'heads'}, head size), "
                                "lax.dynamic_update_slice at the position"
                                + (" after rotating k by it" if layout.llama else "") + ", read with "
                                "a mask of the rows written",
                       "attention": ("flax.linen.dot_product_attention (float64: jax.nn's softmax is float32)"
                                     if tm.precision == "float64" else "jax.nn.dot_product_attention")
                                    + " with that mask",
                       "decode": "one jitted step per token (position a traced scalar: compiled once)"},
    }
    return Generator(prefill, decode, synchronize, tm.count_params(params), settings, load_weights=load_weights,
                     tokens=lambda: np.stack([np.asarray(t) for t in state["generated"]], axis=1),
                     first_logits=lambda: np.asarray(state["logits"]))
