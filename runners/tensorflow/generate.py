"""Mode `generate` for the tensorflow runner: greedy decoding with a keras_hub-style cache.

The Keras layers are the ones step.build_network builds for train and infer (the same
variables, the same canonical weights in and out). Decoding follows keras_hub's GPT2CausalLM:
one cache tensor (batch, blocks, 2, prompt + new tokens, heads, head size) passed into and out of
the step; each block's attention projects q, k and v with keras.layers.MultiHeadAttention's own
dense layers, writes its key and value into the cache at the position with
keras.ops.slice_update (keras_hub's CachedMultiHeadAttention), and attends over the cache with
the layer's own _compute_attention (keras.ops.dot_product_attention) and a mask of the rows
written. Prefill (the prompt) and the decode step (one token) are tf.functions, with
jit_compile=True under `compile: compiled` (XLA), as the runner's train and infer steps are.
"""

from __future__ import annotations

from runners.common import rotary
from runners.common.contract import DecoderLayout, Generator
from runners.tensorflow.framework import load_keras, load_tf
from runners.tensorflow.precision import precision_scope
from runners.tensorflow.weights import canonical_variables, load_weights
from runners.tensorflow.step import build_network, count_params


def prepare_generation(request: dict, jit: bool, precision: str, device: str, settings: dict) -> Generator:
    import numpy as np

    tf, keras = load_tf(), load_keras()
    ops = keras.ops
    network = request["network"]
    layout = DecoderLayout(network)
    prompt_length, new_tokens = layout.request_lengths(request)
    length = prompt_length + new_tokens
    keras.utils.set_random_seed(request.get("seed", 0))
    with tf.device(device), precision_scope(precision):
        # deterministic: dropout left out, so every attention takes keras.ops.dot_product_attention
        _, per_layer, _, permuted = build_network(network, True, precision)
        variables = canonical_variables(network, per_layer, permuted)
        (embedding,) = per_layer[layout.embedding]
        position = per_layer[layout.position][0] if layout.position is not None else None  # None: rotary
        blocks = [per_layer[i][0] for i in layout.blocks]
        if layout.llama:  # the rotary tables for every position a request reaches
            for block in blocks:
                block.attn.cos, block.attn.sin = rotary.layer_tables(block.attn.spec, length)
        final_norm = per_layer[layout.norm][0] if layout.norm is not None else None
        (head,) = per_layer[layout.head]
        if request.get("inputs"):
            with np.load(request["inputs"]) as data:
                prompt = tf.constant(np.ascontiguousarray(data["x"][:, :prompt_length]), dtype=tf.int64)
        else:
            prompt = tf.random.uniform((request["batch_size"], prompt_length), 0, network["input"]["vocabulary"],
                                       dtype=tf.int64)
        batch = int(prompt.shape[0])
        compute = tf.as_dtype(blocks[0].compute_dtype)
        first = blocks[0].attn
        if layout.llama:  # a key/value-head cache (keras_hub's Llama)
            cache_shape = (batch, len(blocks), 2, length, first.spec["kv_heads"], first.spec["head_size"])
        else:
            cache_shape = (batch, len(blocks), 2, length, first._num_heads, first._key_dim)
        positions = [tf.constant(i, tf.int32) for i in range(length)]  # one device scalar per position
        rows = ops.arange(length, dtype="int32")  # int32 throughout: under float64 Keras' default ints are int64

    def attention(mha, h, cache, i, index):
        """keras_hub's CachedMultiHeadAttention: q, k, v through the layer's own projections, k and v
        into block i's cache rows from `index`, attention over the cache with the written rows."""
        q, k, v = mha._query_dense(h), mha._key_dense(h), mha._value_dense(h)
        update = ops.expand_dims(ops.stack([k, v], axis=1), axis=1)  # (B, 1, 2, T, H, S)
        cache = ops.slice_update(cache, [0, i, 0, index, 0, 0], ops.cast(update, cache.dtype))
        keys, values = cache[:, i, 0], cache[:, i, 1]
        t = ops.shape(h)[1]
        mask = ops.expand_dims(rows[None, :] <= (index + ops.arange(t, dtype="int32"))[:, None], axis=0)  # (1, T, L)
        out, _ = mha._compute_attention(q, keys, values, attention_mask=mask, training=False)
        return mha._output_dense(out), cache

    def grouped_attention(attn, h, cache, i, index):
        """keras_hub's Llama attention with its cache: q and k rotated from `index`, k and v into block
        i's cache rows, keras.ops.dot_product_attention over the cache with the written rows."""
        q, k, v = attn.project(h, index)
        update = ops.expand_dims(ops.stack([k, v], axis=1), axis=1)  # (B, 1, 2, T, KV, S)
        cache = ops.slice_update(cache, [0, i, 0, index, 0, 0], ops.cast(update, cache.dtype))
        keys, values = cache[:, i, 0], cache[:, i, 1]
        t = ops.shape(h)[1]
        mask = rows[None, :] <= (index + ops.arange(t, dtype="int32"))[:, None]  # (T, L)
        return attn.attend(q, keys, values, causal=False, mask=mask[None, None]), cache

    def llama_forward(tokens, cache, index):
        x = embedding(tokens)
        for i, block in enumerate(blocks):
            a, cache = grouped_attention(block.attn, block.norm1(x), cache, i, index)
            x = x + a
            x = x + block.ffn(block.norm2(x))
        logits = head(final_norm(x[:, -1]))
        return ops.argmax(logits, axis=-1), logits, cache

    def forward(tokens, cache, index):
        if layout.llama:
            return llama_forward(tokens, cache, index)
        x = embedding(tokens)
        t = ops.shape(tokens)[1]
        x = x + ops.cast(ops.slice(ops.convert_to_tensor(position.table), [index, 0], [t, ops.shape(x)[-1]]), x.dtype)
        for i, block in enumerate(blocks):
            if block.pre:
                a, cache = attention(block.attn, block.ln1(x), cache, i, index)
                x = x + a
                x = x + block.fc2(block.fc1(block.ln2(x)))
            else:
                a, cache = attention(block.attn, x, cache, i, index)
                x = block.ln1(x + a)
                x = block.ln2(x + block.fc2(block.fc1(x)))
        h = x[:, -1]
        if final_norm is not None:
            h = final_norm(h)
        logits = head(h)
        return ops.argmax(logits, axis=-1), logits, cache

    @tf.function(jit_compile=jit)
    def prefill_step(tokens, cache):
        return forward(tokens, cache, tf.constant(0, tf.int32))

    @tf.function(jit_compile=jit)
    def decode_step(token, cache, index):
        next_token, _, cache = forward(token[:, None], cache, index)
        return next_token, cache

    state: dict = {"generated": []}

    def prefill():
        with tf.device(device):
            token, logits, cache = prefill_step(prompt, tf.zeros(cache_shape, compute))
        state.update(token=token, logits=logits, cache=cache, generated=[token], index=prompt_length)

    def decode():
        with tf.device(device):
            token, state["cache"] = decode_step(state["token"], state["cache"], positions[state["index"]])
        state["token"] = token
        state["generated"].append(token)
        state["index"] += 1

    sync_devices = tf.test.experimental.sync_devices
    settings.update(
        precision=precision,
        generation={"prompt_length": prompt_length, "new_tokens": new_tokens, "batch_size": batch,
                    "decoding": "greedy (argmax)",
                    "cache": (f"one tensor (batch, blocks, 2, prompt + new tokens, "
                              f"{'key/value heads' if layout.llama else 'heads'}, head size) passed through "
                              "the step, written with keras.ops.slice_update (keras_hub's "
                              f"{'Llama' if layout.llama else 'GPT2CausalLM and CachedMultiHeadAttention'})"),
                    "attention": "MultiHeadAttention's projections and _compute_attention "
                                 "(keras.ops.dot_product_attention) with a mask of the rows written",
                    "steps": f"tf.function(jit_compile={jit}) prefill and decode step"})
    params = count_params(list({id(v): v for layers in per_layer for layer in layers
                                   for v in layer.trainable_variables}.values()))
    return Generator(prefill, decode, sync_devices, params, settings,
                     load_weights=lambda arrays: load_weights(variables, arrays, precision),
                     tokens=lambda: np.stack([t.numpy() for t in state["generated"]], axis=1),
                     first_logits=lambda: state["logits"].numpy())
