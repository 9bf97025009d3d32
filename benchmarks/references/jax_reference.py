"""JAX reference: ResNet-50 and the LSTM-32 model written the way flax's own examples write them
(linen modules, a TrainState carrying batch statistics, one jitted train step donating the state).

There is no flax model zoo to import: flax's ImageNet example defines its ResNet in the example
itself, so this file does the same, in the example's structure (NHWC, bias-free convolutions, batch
norm with momentum 0.9, the stride on the 3x3 convolution, projection shortcuts where shapes change).
For GPT-2 small likewise: flax has no GPT-2 of its own (transformers' Flax models were removed in
its version 5), so the decoder is written the way flax's lm1b example writes its TransformerLM
(nn.Embed, a learned position table sliced to the sequence, nn.Dropout, pre-norm blocks of
nn.LayerNorm, nn.MultiHeadDotProductAttention with nn.make_causal_mask and broadcast_dropout=False,
an MLP of nn.Dense, the head tied through Embed.attend), sized and shaped as GPT-2 small (biases
everywhere, tanh GELU, no dropout inside the MLP, eps 1e-5), and trained by lm1b's step: the dropout
key folded with the step number, optax's integer-label cross-entropy averaged over every position.
The llm suite (llama_tiny, smollm2_135m; moe_tiny): flax has no Llama of its own either (transformers'
FlaxLlama went with its version 5), so the decoder is written here as flax's examples write theirs,
from the configuration fairness.py passes (--llm: the suite's description): linen modules, nn.Embed
(Embed.attend for a tied head), pre-norm blocks of nn.RMSNorm, q/k/v/out as bias-free nn.DenseGeneral
over (heads, head size), rotary position embedding on q and k (the rotate-half form), attention by
jax.nn.dot_product_attention(is_causal=True) with the key/value heads grouped (it broadcasts each to
its heads), a SwiGLU of bias-free nn.Dense. The MoE block routes as MaxText's sparse path does (the
router in float32, jax.lax.top_k, the weights renormalised, the token choices sorted by expert and
each weight multiplied by jax.lax.ragged_dot), and sows its load-balancing loss (Switch's E * sum(f*P),
times the coefficient over the blocks) into "intermediates", which the loss adds: flax's idiom for a
layer's extra loss.
Threads: JAX ignores XLA's thread flags, so CPU affinity is set before jax is imported.
"""

from __future__ import annotations

import os
from functools import partial

from reference_loop import (CLASSES, EMBEDDING, GPT2, HIDDEN, IMAGE, LLM_NETWORKS, SEQUENCE, VOCABULARY,
                            canonical_inputs, parse_args, sequence, time_steps)


def main() -> None:
    args = parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.threads])
    import jax
    import jax.numpy as jnp
    import flax
    import flax.linen as nn
    import optax
    from flax.training import train_state

    if args.device == "cpu":
        jax.config.update("jax_platforms", "cpu")

    class Bottleneck(nn.Module):
        filters: int
        conv: object
        norm: object
        strides: tuple = (1, 1)

        @nn.compact
        def __call__(self, x):
            shortcut = x
            y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
            y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
            y = self.norm()(self.conv(self.filters * 4, (1, 1))(y))
            if shortcut.shape != y.shape:
                shortcut = self.norm(name="proj_norm")(
                    self.conv(self.filters * 4, (1, 1), self.strides, name="proj_conv")(shortcut))
            return nn.relu(shortcut + y)

    class ResNet50(nn.Module):
        classes: int = CLASSES

        @nn.compact
        def __call__(self, x, train: bool = True):
            conv = partial(nn.Conv, use_bias=False)
            norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
            x = nn.relu(norm(name="stem_norm")(conv(64, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
                                                    name="stem_conv")(x)))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
            for stage, repeat in enumerate([3, 4, 6, 3]):
                for i in range(repeat):
                    strides = (2, 2) if stage > 0 and i == 0 else (1, 1)
                    x = Bottleneck(64 * 2 ** stage, conv=conv, norm=norm, strides=strides)(x)
            return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))

    class LanguageModel(nn.Module):
        @nn.compact
        def __call__(self, tokens, train: bool = True):
            h = nn.Embed(VOCABULARY, EMBEDDING)(tokens)
            h = nn.RNN(nn.OptimizedLSTMCell(HIDDEN))(h)
            h = nn.RNN(nn.OptimizedLSTMCell(HIDDEN))(h)
            return nn.Dense(VOCABULARY)(h)

    init = nn.initializers.normal(stddev=0.02)  # GPT-2's initialisation

    class MlpBlock(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.gelu(nn.Dense(4 * GPT2["width"], kernel_init=init)(x), approximate=True)
            return nn.Dense(GPT2["width"], kernel_init=init)(x)

    class DecoderBlock(nn.Module):
        deterministic: bool

        @nn.compact
        def __call__(self, inputs, mask):
            x = nn.LayerNorm(epsilon=GPT2["eps"])(inputs)
            x = nn.MultiHeadDotProductAttention(num_heads=GPT2["heads"], qkv_features=GPT2["width"], kernel_init=init,
                                                broadcast_dropout=False, dropout_rate=GPT2["dropout"],
                                                deterministic=self.deterministic)(x, mask=mask)
            x = inputs + nn.Dropout(GPT2["dropout"], deterministic=self.deterministic)(x)
            z = MlpBlock()(nn.LayerNorm(epsilon=GPT2["eps"])(x))
            return x + nn.Dropout(GPT2["dropout"], deterministic=self.deterministic)(z)

    class GPT2Small(nn.Module):
        @nn.compact
        def __call__(self, tokens, train: bool = True):
            embed = nn.Embed(GPT2["vocabulary"], GPT2["width"], embedding_init=init)
            positions = self.param("pos_embedding", nn.initializers.normal(stddev=0.01),
                                   (1, GPT2["context"], GPT2["width"]))
            y = embed(tokens) + positions[:, : tokens.shape[1]]
            y = nn.Dropout(GPT2["dropout"], deterministic=not train)(y)
            mask = nn.make_causal_mask(tokens)
            for i in range(GPT2["layers"]):
                y = DecoderBlock(deterministic=not train, name=f"block_{i}")(y, mask)
            return embed.attend(nn.LayerNorm(epsilon=GPT2["eps"], name="final_norm")(y))  # the tied head

    cfg = args.llm or {}

    def rotate(t, theta):
        """t (B, T, heads, S) rotated by its positions 0 .. T - 1 (the rotate-half form)."""
        half = t.shape[-1] // 2
        frequencies = 1.0 / theta ** (jnp.arange(half, dtype=jnp.float32) / half)
        angles = jnp.arange(t.shape[1], dtype=jnp.float32)[:, None] * frequencies[None, :]  # (T, half)
        cos = jnp.concatenate([jnp.cos(angles)] * 2, -1)[None, :, None, :].astype(t.dtype)
        sin = jnp.concatenate([jnp.sin(angles)] * 2, -1)[None, :, None, :].astype(t.dtype)
        return t * cos + jnp.concatenate([-t[..., half:], t[..., :half]], -1) * sin

    class LlamaAttention(nn.Module):
        @nn.compact
        def __call__(self, x):
            size = cfg["width"] // cfg["heads"]
            dense = partial(nn.DenseGeneral, use_bias=False)
            q = rotate(dense((cfg["heads"], size), name="query")(x), cfg["rope_theta"])
            k = rotate(dense((cfg["kv_heads"], size), name="key")(x), cfg["rope_theta"])
            v = dense((cfg["kv_heads"], size), name="value")(x)
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, heads, S), kv heads grouped
            return dense(cfg["width"], axis=(-2, -1), name="out")(out)

    class SwiGLU(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = partial(nn.Dense, use_bias=False)
            return dense(cfg["width"], name="down")(nn.silu(dense(cfg["hidden"], name="gate")(x))
                                                    * dense(cfg["hidden"], name="up")(x))

    class MoE(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            experts, top_k, hidden, d = cfg["experts"], cfg["top_k"], cfg["hidden"], cfg["width"]
            init = nn.initializers.lecun_normal()
            gate = self.param("gate", init, (experts, d, hidden))
            up = self.param("up", init, (experts, d, hidden))
            down = self.param("down", init, (experts, hidden, d))
            tokens = x.reshape(-1, d)
            p = jax.nn.softmax(nn.Dense(experts, use_bias=False, name="router")(tokens).astype(jnp.float32))
            weights, chosen = jax.lax.top_k(p, top_k)
            weights = weights / weights.sum(-1, keepdims=True)
            flat = chosen.reshape(-1)
            order = jnp.argsort(flat)
            rows = tokens[order // top_k]
            sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
            h = nn.silu(jax.lax.ragged_dot(rows, gate, sizes)) * jax.lax.ragged_dot(rows, up, sizes)
            y = jax.lax.ragged_dot(h, down, sizes) * weights.reshape(-1)[order][:, None].astype(x.dtype)
            if train:
                fraction = jax.nn.one_hot(chosen, experts).sum(1).mean(0)
                aux = experts * jnp.sum(fraction * p.mean(0))
                self.sow("intermediates", "aux_loss", aux * cfg["aux_loss_coefficient"] / cfg["layers"])
            return jnp.zeros_like(tokens).at[order // top_k].add(y).reshape(x.shape)

    class LlamaBlock(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = x + LlamaAttention()(nn.RMSNorm(epsilon=cfg["eps"])(x))
            h = nn.RMSNorm(epsilon=cfg["eps"])(x)
            return x + (MoE()(h, train) if cfg["experts"] else SwiGLU()(h))

    class Llama(nn.Module):
        @nn.compact
        def __call__(self, tokens, train: bool = True):
            embed = nn.Embed(cfg["vocabulary"], cfg["width"], embedding_init=nn.initializers.normal(cfg["init_std"]))
            y = embed(tokens)
            for i in range(cfg["layers"]):
                y = LlamaBlock(name=f"block_{i}")(y, train)
            y = nn.RMSNorm(epsilon=cfg["eps"], name="final_norm")(y)
            return embed.attend(y) if cfg["tied"] else nn.Dense(cfg["vocabulary"], use_bias=False, name="head")(y)

    class TrainState(train_state.TrainState):
        batch_stats: dict

    key = jax.random.PRNGKey(0)
    if args.network == "resnet50":
        model, source = ResNet50(), "flax linen ResNet-50 in the style of flax's ImageNet example"
        x = jax.random.normal(key, (args.batch, *IMAGE))
        y = jax.random.randint(key, (args.batch,), 0, CLASSES)
    elif args.network == "gpt2_small":
        model = GPT2Small()
        source = ("flax linen GPT-2 small in the style of flax's lm1b example (MultiHeadDotProductAttention, "
                  "make_causal_mask, Embed.attend)")
        x = jax.random.randint(key, (args.batch, sequence(args)), 0, GPT2["vocabulary"])
        y = jax.random.randint(key, (args.batch, sequence(args)), 0, GPT2["vocabulary"])
    elif args.network in LLM_NETWORKS:
        model = Llama()
        source = (f"flax linen Llama in the style of flax's examples (the suite's {cfg['name']}: nn.RMSNorm, "
                  "jax.nn.dot_product_attention with grouped key/value heads"
                  + (", a ragged_dot MoE as MaxText's sparse path)" if cfg["experts"] else ")"))
        x = jax.random.randint(key, (args.batch, sequence(args)), 0, cfg["vocabulary"])
        y = jax.random.randint(key, (args.batch, sequence(args)), 0, cfg["vocabulary"])
    else:
        model, source = LanguageModel(), "flax linen Embed + RNN(OptimizedLSTMCell) x2 + Dense"
        x = jax.random.randint(key, (args.batch, SEQUENCE), 0, VOCABULARY)
        y = jax.random.randint(key, (args.batch, SEQUENCE), 0, VOCABULARY)
    given = canonical_inputs(args, channels_last=True)
    if given is not None:  # the runner's batch, NHWC as flax's convolutions take it
        x, y = jnp.asarray(given[0]), jnp.asarray(given[1].astype("int32"))
    variables = model.init(key, x, train=False)
    state = TrainState.create(apply_fn=model.apply, params=variables["params"],
                              batch_stats=variables.get("batch_stats", {}),
                              tx=optax.sgd(args.learning_rate, momentum=args.momentum))

    dropout_key = jax.random.PRNGKey(1)

    def train_step(state, x, y):
        rngs = {"dropout": jax.random.fold_in(dropout_key, state.step)}  # lm1b's per-step dropout key

        def loss_fn(params):
            logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats}, x,
                                             train=True, mutable=["batch_stats", "intermediates"], rngs=rngs)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            # what the layers sowed: the MoE blocks' load-balancing losses (nothing for the others)
            loss = loss + sum(jax.tree_util.tree_leaves(updates.pop("intermediates", {})))
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(grads=grads)
        return state.replace(batch_stats=updates.get("batch_stats", {})), loss

    jitted = jax.jit(train_step, donate_argnums=(0,))
    holder = {"state": state, "loss": None}

    def step():
        holder["state"], holder["loss"] = jitted(holder["state"], x, y)

    params = sum(int(p.size) for p in jax.tree_util.tree_leaves(variables["params"]))
    time_steps(step, lambda: holder["loss"].block_until_ready(), args, model=source, params=params,
               framework=f"jax {jax.__version__} flax {flax.__version__}", threads=len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
