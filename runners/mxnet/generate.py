"""Mode `generate` for the mxnet runner: greedy decoding with a key/value cache built from MXNet's
operators.

The Gluon blocks are the ones step.build_model builds for train and infer (the same
Parameters, the same canonical weights in and out, the same interleaved q/k/v projection). Each
transformer block's cache is one NDArray (prompt + new tokens, batch, heads x 2 x head size) in
the layout of MXNet's fused encoder-decoder attention operators (per head its key, then its
value), which is the layout the block's own interleaved projection already produces for k and v.
A step (a HybridBlock: the prompt for prefill, one token for decode) projects q, k and v with the
block's own Dense, attends over the cache rows and the step's own rows (concatenated, with an
additive mask of what each query may see) through contrib.interleaved_matmul_encdec_qk and
contrib.interleaved_matmul_encdec_valatt (their documented batch_dot equivalent in float64 on the
CPU, where their kernels take float32 only), and returns the last position's logits, the greedy
token and each block's new rows, which are then written into the cache in place (NDArray slice
assignment). Under `compile: compiled` (the runner's default) both steps are hybridised
(static_alloc, static_shape: one graph each, the shapes never change); `eager` calls them
imperatively.
"""

from __future__ import annotations

from runners.common.contract import DecoderLayout, Generator
from runners.mxnet.framework import load_mxnet
from runners.mxnet.step import HYBRIDIZE, build_model, count_params, trainable_params
from runners.mxnet.transformer import fused_attention_unavailable
from runners.mxnet.weights import load_weights


def step_class():
    """The decoding step's HybridBlock class (defined once mxnet is loaded)."""
    mx = load_mxnet()

    class CachedStep(mx.gluon.HybridBlock):
        """(tokens (B, T), position rows (T, D), additive mask (T, L + T), cache per block (L, B, 2HS))
        -> (greedy token (B,), last position's logits (B, V), new rows per block (T, B, 2HS))."""

        def __init__(self, embedding, blocks, final_norm, head, heads: list, fused: bool, **kwargs):
            super().__init__(**kwargs)
            self.heads, self.fused = heads, fused
            # registered as children: the same blocks (and Parameters) the network is made of
            self.embedding, self.final_norm, self.head = embedding, final_norm, head
            self.blocks = blocks
            for i, block in enumerate(blocks):
                self.register_child(block, f"block{i}")

        def _attention(self, F, attn, h, cache, mask, heads):
            qkv = attn.qkv(F.transpose(h, axes=(1, 0, 2)))  # (T, B, H*3*S), per head q, k, v
            parts = F.reshape(qkv, shape=(0, 0, heads, 3, -1))  # (T, B, H, 3, S)
            q = F.reshape(F.slice_axis(parts, axis=3, begin=0, end=1), shape=(0, 0, -1))  # (T, B, H*S)
            rows = F.reshape(F.slice_axis(parts, axis=3, begin=1, end=3), shape=(0, 0, -1))  # (T, B, H*2*S)
            keys_values = F.concat(cache, rows, dim=0)  # (L + T, B, H*2*S): the cache, then this step's rows
            if self.fused:
                scores = F.contrib.interleaved_matmul_encdec_qk(q, keys_values, heads=heads)  # (B*H, T, L+T)
            else:  # the operators' documented equivalent (their CPU kernels take float32 only)
                qh = F.reshape(F.transpose(F.reshape(q, shape=(0, 0, heads, -1)), axes=(1, 2, 0, 3)),
                               shape=(-1, 0, 0), reverse=True)  # (B*H, T, S)
                kv = F.reshape(keys_values, shape=(0, 0, heads, 2, -1))
                kh = F.reshape(F.transpose(F.reshape(F.slice_axis(kv, axis=3, begin=0, end=1), shape=(0, 0, 0, -1)),
                                           axes=(1, 2, 0, 3)), shape=(-1, 0, 0), reverse=True)
                scores = F.batch_dot(F.contrib.div_sqrt_dim(qh), kh, transpose_b=True)
            probs = F.softmax(F.broadcast_add(scores, F.expand_dims(mask, axis=0)), axis=-1)
            if self.fused:
                a = F.contrib.interleaved_matmul_encdec_valatt(keys_values, probs, heads=heads)  # (T, B, H*S)
            else:
                kv = F.reshape(keys_values, shape=(0, 0, heads, 2, -1))
                vh = F.reshape(F.transpose(F.reshape(F.slice_axis(kv, axis=3, begin=1, end=2), shape=(0, 0, 0, -1)),
                                           axes=(1, 2, 0, 3)), shape=(-1, 0, 0), reverse=True)  # (B*H, L+T, S)
                a = F.reshape(F.batch_dot(probs, vh), shape=(-1, heads, 0, 0), reverse=True)  # (B, H, T, S)
                a = F.reshape(F.transpose(a, axes=(2, 0, 1, 3)), shape=(0, 0, -1))  # (T, B, H*S)
            return F.transpose(attn.out(a), axes=(1, 0, 2)), rows

        def hybrid_forward(self, F, tokens, position_rows, mask, *caches):
            x = F.broadcast_add(self.embedding(tokens), F.expand_dims(position_rows, axis=0))
            new_rows = []
            for block, cache, heads in zip(self.blocks, caches, self.heads):
                mlp = lambda h, b=block: b.fc2(b.gelu(b.fc1(h)))  # noqa: E731
                if block.pre:
                    a, rows = self._attention(F, block.attn, block.ln1(x), cache, mask, heads)
                    x = x + a
                    x = x + mlp(block.ln2(x))
                else:
                    a, rows = self._attention(F, block.attn, x, cache, mask, heads)
                    x = block.ln1(x + a)
                    x = block.ln2(x + mlp(x))
                new_rows.append(rows)
            h = F.squeeze(F.slice_axis(x, axis=1, begin=-1, end=None), axis=1)  # (B, D), the last position
            if self.final_norm is not None:
                h = self.final_norm(h)
            logits = self.head(h)
            return (F.argmax(logits, axis=-1), logits, *new_rows)

    return CachedStep


def prepare_generation(request: dict, ctx, compiled: bool, compile_settings: dict, settings: dict) -> Generator:
    import numpy as np

    mx = load_mxnet()
    network = request["network"]
    layout = DecoderLayout(network)
    prompt_length, new_tokens = layout.request_lengths(request)
    float64 = request.get("precision") == "float64"
    storage = "float64" if float64 else "float32"
    seed = request.get("seed", 0)
    mx.random.seed(seed)
    np.random.seed(seed)
    fused = fused_attention_unavailable(ctx, storage) is None
    net, blocks, _ = build_model(network, ctx, True, dtype=storage, hybridize=False, fused_attention=fused)
    if request.get("inputs"):
        with np.load(request["inputs"]) as data:
            prompt_np = np.ascontiguousarray(data["x"][:, :prompt_length])
    else:
        prompt_np = np.random.default_rng(seed).integers(0, network["input"]["vocabulary"],
                                                         (request["batch_size"], prompt_length))
    if network["input"]["vocabulary"] > 2 ** 24:
        raise ValueError("the mxnet runner passes token ids as float32: vocabulary must be <= 2**24")
    batch = prompt_np.shape[0]
    prompt = mx.nd.array(prompt_np, ctx=ctx, dtype="float32")  # Gluon's Embedding takes float ids
    length = prompt_length + new_tokens
    transformer = [blocks[i] for i in layout.blocks]
    specs = [network["layers"][i] for i in layout.blocks]
    step_cls = step_class()
    parts = (blocks[layout.embedding], transformer, blocks[layout.norm] if layout.norm is not None else None,
             blocks[layout.head], [s["heads"] for s in specs], fused)
    prefill_step, decode_step = step_cls(*parts, prefix="prefill_"), step_cls(*parts, prefix="decode_")
    if compiled:
        prefill_step.hybridize(**HYBRIDIZE)
        decode_step.hybridize(**HYBRIDIZE)
    caches = [mx.nd.zeros((length, batch, 2 * s["heads"] * s["head_size"]), ctx=ctx, dtype=storage) for s in specs]
    table = blocks[layout.position].weight

    def mask(rows_written: int, steps: int):
        """(steps, length + steps), additive: cache rows below `rows_written`, and this step's rows up to
        the query's own (causal), are 0; the rest -inf (exp gives exactly 0 there)."""
        m = np.full((steps, length + steps), -np.inf, dtype=storage)
        m[:, :rows_written] = 0.0
        m[:, length:] = np.triu(np.full((steps, steps), -np.inf, dtype=storage), k=1)
        return mx.nd.array(m, ctx=ctx, dtype=storage)

    prefill_mask = mask(0, prompt_length)
    decode_masks = [mask(t, 1) for t in range(length)]  # made once: a decode step at position t
    state: dict = {"generated": []}

    def write(rows_by_block, start: int) -> None:
        for cache, rows in zip(caches, rows_by_block):
            cache[start:start + rows.shape[0]] = rows  # in place, on the engine

    def prefill():
        rows = table.data(ctx)[0:prompt_length]
        token, logits, *new = prefill_step(prompt, rows, prefill_mask, *caches)
        write(new, 0)
        state.update(token=token, logits=logits, generated=[token], index=prompt_length)

    def decode():
        t = state["index"]
        rows = table.data(ctx)[t:t + 1]
        token, _, *new = decode_step(state["token"].reshape((-1, 1)), rows, decode_masks[t], *caches)
        write(new, t)
        # a hybridised step with static_alloc returns its output buffers, which its next call overwrites:
        # the token is kept (and fed back) as a copy of its own
        token = token.copy()
        state["token"] = token
        state["generated"].append(token)
        state["index"] = t + 1

    settings.update(
        precision=request.get("precision") or "fp32", compile=compile_settings,
        generation={"prompt_length": prompt_length, "new_tokens": new_tokens, "batch_size": batch,
                    "decoding": "greedy (argmax)",
                    "cache": "per block one NDArray (prompt + new tokens, batch, heads x 2 x head size) in the fused "
                             "encoder-decoder operators' layout, the step's new rows written in place",
                    "attention": ("contrib.interleaved_matmul_encdec_qk / _valatt over the cache and the step's rows"
                                  if fused else "batch_dot (the encdec operators' documented equivalent: their CPU "
                                                "kernels take float32 only)"),
                    "steps": "two HybridBlocks (prefill, decode), " + (
                        f"hybridised {HYBRIDIZE}" if compiled else "called imperatively")})
    params = count_params(trainable_params(net))
    return Generator(prefill, decode, mx.nd.waitall, params, settings,
                     load_weights=lambda arrays: load_weights(blocks, network, arrays),
                     tokens=lambda: np.stack([t.asnumpy() for t in state["generated"]], axis=1).astype(np.int64),
                     first_logits=lambda: state["logits"].asnumpy())
