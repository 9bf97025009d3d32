"""Mode `generate` for the mxnet runner: greedy decoding with a key/value cache built from MXNet's
operators, of the GPT-style decoders (embedding, position table, transformer blocks) and of the
Llama-style ones (embedding, llama blocks, RMSNorm; their ffn a SwiGLU or a Mixture-of-Experts).

The Gluon blocks are the ones step.build_model builds for train and infer (the same Parameters,
the same canonical weights in and out); a step (a HybridBlock: the prompt for prefill, one token
for decode) calls them in the order a cached decoder needs, attends over the cache rows and the
step's own rows (concatenated, with an additive mask of what each query may see), and returns the
greedy token, the last position's logits and each block's new rows, which are then written into
the cache in place (NDArray slice assignment).

GPT-style: each transformer block's cache is one NDArray (prompt + new tokens, batch, heads x 2 x
head size) in the layout of MXNet's fused encoder-decoder attention operators (per head its key,
then its value), which is the layout the block's own interleaved q/k/v projection already produces
for k and v; the scores and values by contrib.interleaved_matmul_encdec_qk and
contrib.interleaved_matmul_encdec_valatt (their documented batch_dot equivalent in float64 on the
CPU, where their kernels take float32 only).

Llama-style: each llama block's cache is two NDArrays, its keys and its values (batch, key/value
heads, prompt + new tokens, head size): grouped-query attention keeps the key/value heads' rows,
which the query heads share (repeated per group only to attend, as transformers' StaticCache of a
Llama). The attention is the block's own GroupedAttention's pieces (split_heads, rotate, attend: one
definition for training and decoding) applied to the step's rows, q and k rotated by the angles of
their absolute positions (runners/common/rotary.py's tables for every position a request reaches,
the step's rows passed in); the RMSNorms and the SwiGLU or MixtureOfExperts are the block's own,
called as they are (the same routing rule and tie-break), except that the decoding graphs add no
load-balancing loss (MixtureOfExperts.auxiliary_loss off: they are never differentiated, and
torch and jax add it in training only).

Under `compile: compiled` (the runner's default) both steps are hybridised (static_alloc,
static_shape: one graph each, the shapes never change); `eager` calls them imperatively.
"""

from __future__ import annotations

from runners.common import rotary
from runners.common.contract import DecoderLayout, Generator
from runners.mxnet.framework import load_mxnet
from runners.mxnet.step import HYBRIDIZE, build_model, count_params, trainable_params
from runners.mxnet.transformer import fused_attention_unavailable
from runners.mxnet.weights import load_weights


def step_classes():
    """The decoding steps' HybridBlock classes, GPT-style and Llama-style (defined once mxnet is loaded)."""
    mx = load_mxnet()

    class CachedStep(mx.gluon.HybridBlock):
        """What both decoders' steps share: the network's own blocks registered as children (the same
        Parameters), and the tail from the last position to its logits and greedy token."""

        def __init__(self, embedding, blocks, final_norm, head, specs: list, **kwargs):
            super().__init__(**kwargs)
            self.specs = specs
            # registered as children: the same blocks (and Parameters) the network is made of
            self.embedding, self.final_norm, self.head = embedding, final_norm, head
            self.blocks = blocks
            for i, block in enumerate(blocks):
                self.register_child(block, f"block{i}")

        def _logits(self, F, x):
            """x (B, T, D) -> (greedy token (B,), the last position's logits (B, V))."""
            h = F.squeeze(F.slice_axis(x, axis=1, begin=-1, end=None), axis=1)  # (B, D), the last position
            if self.final_norm is not None:
                h = self.final_norm(h)
            logits = self.head(h)
            return F.argmax(logits, axis=-1), logits

    class GPTStep(CachedStep):
        """(tokens (B, T), additive mask (T, L + T), position rows (T, D), cache per block (L, B, 2HS))
        -> (greedy token (B,), last position's logits (B, V), new rows per block (T, B, 2HS))."""

        def __init__(self, *parts, fused: bool, **kwargs):
            super().__init__(*parts, **kwargs)
            self.fused = fused

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

        def hybrid_forward(self, F, tokens, mask, position_rows, *caches):
            x = F.broadcast_add(self.embedding(tokens), F.expand_dims(position_rows, axis=0))
            new_rows = []
            for block, cache, spec in zip(self.blocks, caches, self.specs):
                mlp = lambda h, b=block: b.fc2(b.gelu(b.fc1(h)))  # noqa: E731
                if block.pre:
                    a, rows = self._attention(F, block.attn, block.ln1(x), cache, mask, spec["heads"])
                    x = x + a
                    x = x + mlp(block.ln2(x))
                else:
                    a, rows = self._attention(F, block.attn, x, cache, mask, spec["heads"])
                    x = block.ln1(x + a)
                    x = block.ln2(x + mlp(x))
                new_rows.append(rows)
            return (*self._logits(F, x), *new_rows)

    class LlamaStep(CachedStep):
        """(tokens (B, T), additive mask (T, L + T), then per block: the rotary cos and sin rows of the
        step's positions (T, S), the cached keys and values (B, KV, L, S)) -> (greedy token (B,), last
        position's logits (B, V), then per block the step's new keys and values (B, KV, T, S)).

        Each llama block as transformer.py's LlamaBlock runs it (its RMSNorms, its SwiGLU or
        MixtureOfExperts called as they are), its GroupedAttention's own split_heads, rotate and attend
        applied to the step's rows: q and k rotated by the angles of their absolute positions, the
        keys and values of the key/value heads concatenated after the cache's."""

        def _attention(self, F, attn, h, cos, sin, keys, values, mask):
            cos = F.reshape(cos, shape=(1, 1, -1, attn.size))  # (1, 1, T, S): broadcast over batch and heads
            sin = F.reshape(sin, shape=(1, 1, -1, attn.size))
            q = attn.rotate(F, attn.split_heads(F, attn.q(h), attn.heads), cos, sin)  # (B, H, T, S)
            k = attn.rotate(F, attn.split_heads(F, attn.k(h), attn.kv_heads), cos, sin)  # (B, KV, T, S)
            v = attn.split_heads(F, attn.v(h), attn.kv_heads)
            a = attn.attend(F, q, F.concat(keys, k, dim=2), F.concat(values, v, dim=2),  # over L + T rows
                            F.expand_dims(mask, axis=0))
            return a, k, v

        def hybrid_forward(self, F, tokens, mask, *per_block):
            x = self.embedding(tokens)  # no position table: the blocks rotate q and k
            new_rows = []
            for i, block in enumerate(self.blocks):
                cos, sin, keys, values = per_block[4 * i:4 * i + 4]
                a, k, v = self._attention(F, block.attn, block.norm1(x), cos, sin, keys, values, mask)
                x = x + a
                x = x + block.ffn(block.norm2(x))
                new_rows += [k, v]
            return (*self._logits(F, x), *new_rows)

    return GPTStep, LlamaStep


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
    # the GPT-style blocks' fused encoder-decoder operators; the llama blocks' attention is composed
    fused = not layout.llama and fused_attention_unavailable(ctx, storage) is None
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
    for block, spec in zip(transformer, specs):
        if layout.llama and spec["moe"] is not None:
            block.ffn.auxiliary_loss = False  # decoding is never differentiated: no load-balancing loss
    gpt_step, llama_step = step_classes()
    parts = (blocks[layout.embedding], transformer, blocks[layout.norm] if layout.norm is not None else None,
             blocks[layout.head], specs)
    if layout.llama:
        prefill_step, decode_step = llama_step(*parts, prefix="prefill_"), llama_step(*parts, prefix="decode_")
    else:
        prefill_step, decode_step = (gpt_step(*parts, fused=fused, prefix="prefill_"),
                                     gpt_step(*parts, fused=fused, prefix="decode_"))
    if compiled:
        prefill_step.hybridize(**HYBRIDIZE)
        decode_step.hybridize(**HYBRIDIZE)

    def mask(rows_written: int, steps: int):
        """(steps, length + steps), additive: cache rows below `rows_written`, and this step's rows up to
        the query's own (causal), are 0; the rest -inf (exp gives exactly 0 there)."""
        m = np.full((steps, length + steps), -np.inf, dtype=storage)
        m[:, :rows_written] = 0.0
        m[:, length:] = np.triu(np.full((steps, steps), -np.inf, dtype=storage), k=1)
        return mx.nd.array(m, ctx=ctx, dtype=storage)

    prefill_mask = mask(0, prompt_length)
    decode_masks = [mask(t, 1) for t in range(length)]  # made once: a decode step at position t
    if layout.llama:
        # per block its keys and its values, (batch, key/value heads, prompt + new tokens, head size): the
        # key/value heads' rows, not the query heads' (grouped attention repeats them only to attend)
        caches = [mx.nd.zeros((batch, s["kv_heads"], length, s["head_size"]), ctx=ctx, dtype=storage)
                  for s in specs for _ in ("keys", "values")]
        sequence_axis = 2
        # the rotary tables (runners/common/rotary.py's, float64, cast to the network's dtype) for every
        # position a request reaches: a step at positions t .. t + T - 1 takes their rows
        tables = [[mx.nd.array(table, ctx=ctx, dtype=storage) for table in rotary.layer_tables(s, length)]
                  for s in specs]

        def step_inputs(start: int, steps: int) -> list:
            rows = []
            for (cos, sin), i in zip(tables, range(0, len(caches), 2)):
                rows += [cos[start:start + steps], sin[start:start + steps], caches[i], caches[i + 1]]
            return rows
    else:
        caches = [mx.nd.zeros((length, batch, 2 * s["heads"] * s["head_size"]), ctx=ctx, dtype=storage)
                  for s in specs]
        sequence_axis = 0
        table = blocks[layout.position].weight

        def step_inputs(start: int, steps: int) -> list:
            return [table.data(ctx)[start:start + steps], *caches]

    state: dict = {"generated": []}

    def write(rows_by_cache, start: int) -> None:
        for cache, rows in zip(caches, rows_by_cache):
            at = (slice(None),) * sequence_axis + (slice(start, start + rows.shape[sequence_axis]),)
            cache[at] = rows  # in place, on the engine

    def prefill():
        token, logits, *new = prefill_step(prompt, prefill_mask, *step_inputs(0, prompt_length))
        write(new, 0)
        state.update(token=token, logits=logits, generated=[token], index=prompt_length)

    def decode():
        t = state["index"]
        token, _, *new = decode_step(state["token"].reshape((-1, 1)), decode_masks[t], *step_inputs(t, 1))
        write(new, t)
        # a hybridised step with static_alloc returns its output buffers, which its next call overwrites:
        # the token is kept (and fed back) as a copy of its own
        token = token.copy()
        state["token"] = token
        state["generated"].append(token)
        state["index"] = t + 1

    if layout.llama:
        cache = ("per block two NDArrays, keys and values (batch, key/value heads, prompt + new tokens, head "
                 "size), k rotated by its position; the step's new rows written in place (NDArray slice "
                 "assignment)")
        attention = ("transformer.py's GroupedAttention composed (split_heads, rotate, attend: the key/value heads "
                     "repeated per group, batch_dot, softmax, batch_dot) over the cache and the step's rows "
                     "with an additive mask of the rows written; q and k rotated by the rows of the step's "
                     "positions in cos and sin tables of every position a request reaches (inputs of the step)")
    else:
        cache = ("per block one NDArray (prompt + new tokens, batch, heads x 2 x head size) in the fused "
                 "encoder-decoder operators' layout, the step's new rows written in place")
        attention = ("contrib.interleaved_matmul_encdec_qk / _valatt over the cache and the step's rows" if fused
                     else "batch_dot (the encdec operators' documented equivalent: their CPU kernels take float32 "
                          "only)")
    settings.update(
        precision=request.get("precision") or "fp32", compile=compile_settings,
        generation={"prompt_length": prompt_length, "new_tokens": new_tokens, "batch_size": batch,
                    "decoding": "greedy (argmax)", "cache": cache, "attention": attention,
                    "steps": "two HybridBlocks (prefill, decode), " + (
                        f"hybridised {HYBRIDIZE}" if compiled else "called imperatively")})
    params = count_params(trainable_params(net))
    return Generator(prefill, decode, mx.nd.waitall, params, settings,
                     load_weights=lambda arrays: load_weights(blocks, network, arrays),
                     tokens=lambda: np.stack([t.asnumpy() for t in state["generated"]], axis=1).astype(np.int64),
                     first_logits=lambda: state["logits"].asnumpy())
