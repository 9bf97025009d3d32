"""JAX kernels of the `kernels` suite (kinds and counts: src/dlbench/performance/kernels.py).

Every kernel is one `jax.jit` executable on device arrays, as the jax runner's step is, and a call
is waited for with `block_until_ready`. Convolutions are channels-last (NHWC activations, HWIO
weights: the runner's layout). A backward kernel is the pullback of `jax.vjp` (a pytree, so it is
passed to the jitted function as an argument): it holds the forward's residuals already, so a call
computes the gradients only, as the backward of a training step does. The LSTM step is the
runner's cell (gates i, f, g, o from x W_x + h W_h + b; one bias). The loss is optax's
softmax_cross_entropy_with_integer_labels (mean) and the update optax's sgd with momentum, jitted
with the parameter and its state donated, as the runner's step does. Transformer kernels:
`jnp.matmul` on (batch, m, k) by (batch, k, n) for a batched product; attention's core as the
runner's SelfAttention calls it on (B, T, heads, head_size) q, k and v: jax.nn.dot_product_attention
(is_causal, the `implementation` the runner asks: cuDNN's on a GPU in half precision, else None),
or flax.linen.dot_product_attention where training applies dropout to the probabilities (a causal
mask, per-element dropout, as the runner's); flax's nn.LayerNorm and jax.nn.gelu in the layer's
form; each backward the pullback of jax.vjp. Pooling as the runner's network calls it on NHWC
arrays: flax.linen.max_pool (padded with -inf by reduce_window), flax.linen.avg_pool (VALID), and
the global average as jnp.mean over height and width; its backward the pullback of jax.vjp. Batch
norm is the runner's flax nn.BatchNorm in training (the batch's statistics, the running ones
returned updated) on NHWC or flat (N, C) arrays, its backward the pullback of jax.vjp. A dense
layer is the runner's flax nn.Dense on a (batch, positions, inputs) sequence or a flat (batch,
inputs) input, its backward the pullback of jax.vjp (XLA lays out and runs its two gradients as the
step's autodiff does, which on a sequence is not what two matmuls timed alone are).

A Llama-style decoder's and a Mixture-of-Experts layer's kernels, each backward the pullback of
jax.vjp: flax's nn.RMSNorm; the rotary embedding on q (B, T, H, S) and k (B, T, KV, S),
`x * cos + rotate_half(x) * sin` in jnp (flax has none); a SwiGLU MLP of three flax nn.Dense without
bias, `down(jax.nn.silu(gate(x)) * up(x))`; grouped-query attention as jax.nn.dot_product_attention
with fewer key/value heads (its own grouping, is_causal); the router's float32 product, softmax,
`lax.top_k` (ties to the lower index) and the chosen weights renormalised; the experts as JAX's
grouped product: the routed rows sorted by expert and `lax.ragged_dot` over the experts' groups for
gate, up and down (stacked (E, D, hidden) and (E, hidden, D) weights), weighted and added back to
their tokens (`.at[].add`).
"""

from __future__ import annotations

from runners.common.contract import Kernel, pool_op
from runners.jax.framework import load_jax
from runners.jax.layers import batch_norm_module, lstm_layer_class
from runners.jax.transformer import ATTENTION_FUNCTION, attention_asked, attention_function


# the kinds of a Llama-style decoder and a Mixture-of-Experts layer (_decoder)
DECODER_KINDS = ("rms_norm", "rotary", "swiglu", "grouped_attention", "moe_router", "moe_experts")


class JitKernel(Kernel):
    """A jitted function on its arguments; synchronize() waits for the last call's result."""

    def __init__(self, fn, args, settings=None):
        self._fn, self._args = fn, args
        self._out = None
        super().__init__(self._call, self._wait, settings)

    def _call(self):
        self._out = self._fn(*self._args)

    def _wait(self):
        if self._out is not None:
            import jax

            jax.block_until_ready(self._out)


def _lstm_cell(x, h, c, w_x, w_h, b):
    import jax
    import jax.numpy as jnp

    gates = x @ w_x + h @ w_h + b
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c1 = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c1), c1


def prepare_kernel(spec: dict, device_name: str) -> Kernel:
    jax = load_jax()
    import jax.numpy as jnp

    kind, shape = spec["kind"], spec["shape"]
    dtype = getattr(jnp, spec["dtype"])
    device = jax.devices("gpu")[0] if device_name == "cuda" else jax.devices("cpu")[0]
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))

    def rand(*dims):
        return jax.device_put(jax.random.normal(next(keys), dims, dtype=dtype), device)

    def ready(kernel: JitKernel) -> JitKernel:
        kernel.step()  # compile now, outside the timed calls (the harness times the first call too)
        kernel.synchronize()
        return kernel

    if kind == "matmul":
        return ready(JitKernel(jax.jit(jnp.matmul), (rand(shape["m"], shape["k"]), rand(shape["k"], shape["n"]))))
    if kind == "transpose":
        return ready(JitKernel(jax.jit(jnp.transpose), (rand(shape["rows"], shape["cols"]),)))
    if kind == "copy":
        return ready(JitKernel(jax.jit(jnp.copy), (rand(shape["elements"]),)))
    if kind == "relu":
        return ready(JitKernel(jax.jit(jax.nn.relu), (rand(shape["elements"]),)))
    if kind.startswith("conv2d"):
        x = rand(shape["batch"], shape["height"], shape["width"], shape["channels"])
        w = rand(shape["kh"], shape["kw"], shape["channels"], shape["filters"])
        stride = (shape["sh"], shape["sw"])
        padding = ((shape["ph"], shape["ph"]), (shape["pw"], shape["pw"]))

        def conv(x, w):
            return jax.lax.conv_general_dilated(x, w, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))

        settings = {"layout": "NHWC/HWIO"}
        if kind == "conv2d_fwd":
            return ready(JitKernel(jax.jit(conv), (x, w), settings))
        if shape["input_grad"]:
            y, pullback = jax.vjp(conv, x, w)
        else:
            y, pullback = jax.vjp(lambda w: conv(x, w), w)
        dy = jax.device_put(jnp.ones_like(y), device)
        return ready(JitKernel(jax.jit(lambda pb, dy: pb(dy)), (pullback, dy),
                               {**settings, "backward": "jax.vjp pullback"}))
    if kind.startswith("lstm_step"):
        b, i, h = shape["batch"], shape["input"], shape["hidden"]
        args = (rand(b, i), rand(b, h), rand(b, h), rand(i, 4 * h), rand(h, 4 * h), rand(4 * h))
        if kind == "lstm_step_fwd":
            return ready(JitKernel(jax.jit(_lstm_cell), args))
        (h1, c1), pullback = jax.vjp(_lstm_cell, *args)
        grads = (jnp.ones_like(h1), jnp.ones_like(c1))
        return ready(JitKernel(jax.jit(lambda pb, g: pb(g)), (pullback, grads), {"backward": "jax.vjp pullback"}))
    if kind.startswith("lstm_layer"):
        b, t, i, h = shape["batch"], shape["steps"], shape["input"], shape["hidden"]
        layer = lstm_layer_class()(hidden=h, dtype=dtype)  # the runner's own layer: hoisted input projection, lax.scan
        x = rand(t, b, i)  # time-major, as the runner's LSTM hands it to each layer
        args = (jax.device_put(layer.init(next(keys), x), device), x)
        if kind == "lstm_layer_fwd":
            return ready(JitKernel(jax.jit(layer.apply), args, {"op": "the runner's LSTMLayer"}))
        out, pullback = jax.vjp(layer.apply, *args)
        return ready(JitKernel(jax.jit(lambda pb, g: pb(g)), (pullback, jnp.ones_like(out)),
                            {"backward": "jax.vjp pullback"}))
    if kind.startswith("softmax_xent"):
        import optax

        logits = rand(shape["rows"], shape["classes"])
        labels = jax.device_put(jax.random.randint(next(keys), (shape["rows"],), 0, shape["classes"]), device)

        def loss(logits):
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        if kind == "softmax_xent_fwd":
            return ready(JitKernel(jax.jit(loss), (logits,)))
        _, pullback = jax.vjp(loss, logits)
        return ready(JitKernel(jax.jit(lambda pb, g: pb(g)), (pullback, jnp.ones((), dtype)),
                            {"backward": "jax.vjp pullback"}))
    if kind == "sgd_momentum":
        import optax

        opt = optax.sgd(0.01, momentum=0.9)
        grad = rand(shape["elements"])

        def update(param, state, grad):
            updates, state = opt.update(grad, state, param)
            return optax.apply_updates(param, updates), state

        step = jax.jit(update, donate_argnums=(0, 1))
        param = rand(shape["elements"])
        holder = {"param": param, "state": opt.init(param)}

        class Update(JitKernel):
            def _call(self):
                holder["param"], holder["state"] = step(holder["param"], holder["state"], grad)
                self._out = holder["param"]

        return ready(Update(None, (), {"op": "optax.sgd(momentum=0.9), jitted, donated"}))
    def backward(fn, args, settings):  # the pullback of fn at args, cotangents of ones
        out, pullback = jax.vjp(fn, *args)
        return ready(JitKernel(jax.jit(lambda pb, g: pb(g)), (pullback, jax.tree.map(jnp.ones_like, out)),
                               {**settings, "backward": "jax.vjp pullback"}))

    if kind.startswith("dense"):
        import flax.linen as nn

        # the runner's layer on what it is given: a sequence (batch, positions, inputs), or a flat input
        rows = (shape["batch"], shape["positions"]) if shape["positions"] > 1 else (shape["batch"],)
        layer = nn.Dense(shape["units"], use_bias=bool(shape["bias"]), dtype=dtype)
        x = rand(*rows, shape["inputs"])
        params = jax.device_put(layer.init(next(keys), x), device)
        settings = {"op": "flax.linen.Dense", "input": "(batch, positions, inputs)" if len(rows) > 1
                    else "(batch, inputs)"}
        if kind == "dense_fwd":
            return ready(JitKernel(jax.jit(layer.apply), (params, x), settings))
        if shape["input_grad"]:
            return backward(layer.apply, (params, x), settings)
        return backward(lambda params: layer.apply(params, x), (params,), settings)
    if kind == "batched_matmul":
        a, b = rand(shape["batch"], shape["m"], shape["k"]), rand(shape["batch"], shape["k"], shape["n"])
        return ready(JitKernel(jax.jit(jnp.matmul), (a, b), {"op": "jnp.matmul"}))
    if kind.startswith("attention"):
        import flax.linen as nn

        b, h, t, s = shape["batch"], shape["heads"], shape["steps"], shape["head_size"]
        rate, causal = shape["dropout"] / 1000, bool(shape["causal"])
        function, why = attention_function(spec["dtype"], rate > 0, device_name)
        implementation = attention_asked(spec["dtype"], device_name)
        rng = jax.random.PRNGKey(1)
        if function == ATTENTION_FUNCTION:
            def attend(q, k, v):
                return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation)
        else:
            mask = nn.make_causal_mask(jnp.ones((b, t)), dtype=jnp.bool_) if causal else None

            def attend(q, k, v):
                return nn.dot_product_attention(q, k, v, mask=mask, dropout_rate=rate, dropout_rng=rng,
                                                broadcast_dropout=False, deterministic=False, dtype=dtype)

        args = tuple(rand(b, t, h, s) for _ in range(3))
        settings = {"function": function, **({"implementation": implementation} if why is None else {"why": why})}
        if kind == "attention_fwd":
            return ready(JitKernel(jax.jit(attend), args, settings))
        return backward(attend, args, settings)
    if kind.startswith("layer_norm"):
        import flax.linen as nn

        layer = nn.LayerNorm(epsilon=1e-5, dtype=dtype)
        x = rand(shape["rows"], shape["dim"])
        variables = jax.device_put(layer.init(next(keys), x), device)
        settings = {"op": "flax.linen.LayerNorm"}
        if kind == "layer_norm_fwd":
            return ready(JitKernel(jax.jit(layer.apply), (variables, x), settings))
        if shape["input_grad"]:
            return backward(layer.apply, (variables, x), settings)
        return backward(lambda v: layer.apply(v, x), (variables,), settings)
    if kind.startswith("gelu"):
        approximate = bool(shape["approximate"])

        def gelu(x):
            return jax.nn.gelu(x, approximate=approximate)

        settings = {"op": f"jax.nn.gelu(approximate={approximate})"}
        x = rand(shape["elements"])
        if kind == "gelu_fwd":
            return ready(JitKernel(jax.jit(gelu), (x,), settings))
        return backward(gelu, (x,), settings)
    if kind.startswith("pool2d"):
        import flax.linen as nn

        window, stride = (shape["kh"], shape["kw"]), (shape["sh"], shape["sw"])
        padding = ((shape["ph"], shape["ph"]), (shape["pw"], shape["pw"]))
        op = pool_op(shape)
        pool = {"max": lambda x: nn.max_pool(x, window, stride, padding),
                "avg": lambda x: nn.avg_pool(x, window, stride, "VALID"),
                "global": lambda x: jnp.mean(x, axis=(1, 2))}[op]
        settings = {"op": {"max": "flax.linen.max_pool", "avg": "flax.linen.avg_pool",
                           "global": "jnp.mean over height and width"}[op], "layout": "NHWC"}
        x = rand(shape["batch"], shape["height"], shape["width"], shape["channels"])
        if kind == "pool2d_fwd":
            return ready(JitKernel(jax.jit(pool), (x,), settings))
        return backward(pool, (x,), settings)
    if kind.startswith(DECODER_KINDS):
        fn, args, settings = _decoder(jax, kind, shape, rand, next(keys))
        args = jax.device_put(args, device)
        if kind.endswith("_fwd"):
            return ready(JitKernel(jax.jit(fn), args, settings))
        return backward(fn, args, settings)
    if kind.startswith("batch_norm"):
        n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
        layer = batch_norm_module(True, 0.1, 1e-5, dtype)  # training: the batch's statistics
        x = rand(n, h, w, c) if h * w > 1 else rand(n, c)
        variables = jax.device_put(layer.init(next(keys), x), device)
        params, stats = variables["params"], variables["batch_stats"]

        def forward(params, x):  # y and the running statistics updated, as the training step computes them
            return layer.apply({"params": params, "batch_stats": stats}, x, mutable=["batch_stats"])

        def normalise(params, x):
            return forward(params, x)[0]

        settings = {"op": "flax.linen.BatchNorm(use_running_average=False)", "layout": "NHWC"}
        if kind == "batch_norm_fwd":
            return ready(JitKernel(jax.jit(forward), (params, x), settings))
        if shape["input_grad"]:
            return backward(normalise, (params, x), settings)
        return backward(lambda params: normalise(params, x), (params,), settings)
    raise ValueError(f"jax runner: unknown kernel kind {kind!r}")


def _decoder(jax, kind: str, shape: dict, rand, key):
    """(function, its arguments, settings) of a decoder or MoE kernel (the module docstring); a
    backward kernel differentiates the function with respect to every argument."""
    import flax.linen as nn
    import jax.numpy as jnp

    lax = jax.lax
    dtype = rand(1).dtype
    bwd = kind.endswith("_bwd")
    if kind.startswith("rms_norm"):
        layer = nn.RMSNorm(epsilon=1e-5, dtype=dtype)
        x = rand(shape["rows"], shape["dim"])
        variables = layer.init(key, x)
        settings = {"op": "flax.linen.RMSNorm"}
        if bwd and not shape["input_grad"]:
            return (lambda v: layer.apply(v, x)), (variables,), settings
        return layer.apply, (variables, x), settings
    if kind.startswith("rotary"):
        b, t, h, kv, s = shape["batch"], shape["steps"], shape["heads"], shape["kv_heads"], shape["head_size"]
        angle = jnp.outer(jnp.arange(t, dtype=jnp.float32), 10000.0 ** (-jnp.arange(0, s, 2, dtype=jnp.float32) / s))
        cos, sin = (f(jnp.concatenate([angle, angle], axis=-1)).astype(dtype)[:, None, :] for f in (jnp.cos, jnp.sin))

        def rotate(u):
            return u * cos + jnp.concatenate([-u[..., s // 2:], u[..., :s // 2]], axis=-1) * sin

        return ((lambda q, k: (rotate(q), rotate(k))), (rand(b, t, h, s), rand(b, t, kv, s)),
                {"op": "x * cos + rotate_half(x) * sin on q and k (jnp)"})
    if kind.startswith("swiglu"):
        dim, hidden = shape["dim"], shape["hidden"]

        class SwiGLU(nn.Module):
            @nn.compact
            def __call__(self, x):
                gate = nn.Dense(hidden, use_bias=False, dtype=dtype, name="gate")(x)
                up = nn.Dense(hidden, use_bias=False, dtype=dtype, name="up")(x)
                return nn.Dense(dim, use_bias=False, dtype=dtype, name="down")(jax.nn.silu(gate) * up)

        layer = SwiGLU()
        x = rand(shape["rows"], dim)
        variables = layer.init(key, x)
        settings = {"op": "down(jax.nn.silu(gate(x)) * up(x)), flax.linen.Dense without bias"}
        if bwd and not shape["input_grad"]:
            return (lambda v: layer.apply(v, x)), (variables,), settings
        return layer.apply, (variables, x), settings
    if kind.startswith("grouped_attention"):
        b, h, kv, t, s = shape["batch"], shape["heads"], shape["kv_heads"], shape["steps"], shape["head_size"]
        causal = bool(shape["causal"])

        def attend(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

        return (attend, (rand(b, t, h, s), rand(b, t, kv, s), rand(b, t, kv, s)),
                {"op": "jax.nn.dot_product_attention (grouped key/value heads)"})
    if kind.startswith("moe_router"):
        rows, dim, experts, top = shape["rows"], shape["dim"], shape["experts"], shape["top_k"]

        def route(x, weight):
            p = jax.nn.softmax(x.astype(jnp.float32) @ weight.astype(jnp.float32).T, axis=-1)
            picked, _ = lax.top_k(p, top)
            return picked / picked.sum(axis=-1, keepdims=True)

        return (route, (rand(rows, dim), rand(experts, dim)),
                {"op": "float32 product, jax.nn.softmax, lax.top_k, renormalised"})
    tokens, dim, hidden, experts, top = (shape["tokens"], shape["dim"], shape["hidden"], shape["experts"],
                                         shape["top_k"])
    chosen = (jnp.arange(tokens)[:, None] * top + jnp.arange(top)[None, :]) % experts
    order = jnp.argsort(chosen.reshape(-1), stable=True)  # routed rows grouped by expert
    token_of = order // top
    group_sizes = jnp.bincount(chosen.reshape(-1), length=experts).astype(jnp.int32)

    def experts_forward(x, gate, up, down, weights):
        rows = x[token_of]
        hidden_rows = jax.nn.silu(lax.ragged_dot(rows, gate, group_sizes)) * lax.ragged_dot(rows, up, group_sizes)
        y = lax.ragged_dot(hidden_rows, down, group_sizes) * weights.reshape(-1)[order][:, None]
        return jnp.zeros_like(x).at[token_of].add(y)

    weights = jnp.full((tokens, top), 1.0 / top, dtype=dtype)
    return (experts_forward, (rand(tokens, dim), rand(experts, dim, hidden), rand(experts, dim, hidden),
                              rand(experts, hidden, dim), weights),
            {"op": "rows sorted by expert, lax.ragged_dot over the groups (gate, up, down), .at[].add back",
             "routing": "token t to experts (t*k + j) mod E, weights 1/k"})
