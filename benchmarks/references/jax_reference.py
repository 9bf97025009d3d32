"""JAX reference: ResNet-50 and the LSTM-32 model written the way flax's own examples write them
(linen modules, a TrainState carrying batch statistics, one jitted train step donating the state).

There is no flax model zoo to import: flax's ImageNet example defines its ResNet in the example
itself, so this file does the same, in the example's structure (NHWC, bias-free convolutions, batch
norm with momentum 0.9, the stride on the 3x3 convolution, projection shortcuts where shapes change).
Threads: JAX ignores XLA's thread flags, so CPU affinity is set before jax is imported.
"""

from __future__ import annotations

import os
from functools import partial

from reference_loop import (CLASSES, EMBEDDING, HIDDEN, IMAGE, SEQUENCE, VOCABULARY, canonical_inputs, parse_args,
                            time_steps)


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

    class TrainState(train_state.TrainState):
        batch_stats: dict

    key = jax.random.PRNGKey(0)
    if args.network == "resnet50":
        model, source = ResNet50(), "flax linen ResNet-50 in the style of flax's ImageNet example"
        x = jax.random.normal(key, (args.batch, *IMAGE))
        y = jax.random.randint(key, (args.batch,), 0, CLASSES)
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

    def train_step(state, x, y):
        def loss_fn(params):
            logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats}, x,
                                             train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
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
