"""TensorFlow kernels of the `kernels` suite (kinds and counts: src/dlbench/performance/kernels.py).

Every kernel is a `tf.function` (a graph, as the runner's step is) on device tensors, followed by
the runner's synchronisation (`sync_devices`). Convolutions are NHWC (the runner's layout) with the
runner's padding (SAME, VALID, or a zero pad then VALID); their backward is TensorFlow's own pair
of kernels, `Conv2DBackpropFilter` and (when the input gradient is wanted) `Conv2DBackpropInput`. The copy is `DeepCopy` (an identity
would alias its input). The LSTM step is Keras' LSTMCell (the runner's layer is made of it on CPU);
its backward runs in one GradientTape with its forward, so the harness times the forward too and
takes the difference; so does the loss's (`sparse_softmax_cross_entropy_with_logits`, mean, the
runner's loss), whose kernel computes the gradient with the loss. The update is Keras' SGD with
momentum applying a gradient to one variable, in a tf.function as the runner's step does.
Every such pair returns the forward's output with the gradients: a gradient that needs none of
it (an average pool's, a product's) would let Grappler prune the forward that the harness takes
off (measured here: an average pool's backward came out 0.4 ms of its 2.5). Transformer kernels, built under the runner's Keras dtype policy for the kernel's precision
(`precision_scope`): `tf.linalg.matmul` on (batch, m, k) by (batch, k, n) for a batched product;
attention's core as the runner's keras.layers.MultiHeadAttention computes it from its projected
(B, T, heads, head_size) q, k, v (its `_compute_attention`, called as its `call` does: the causal
mask left to it, keras.ops.dot_product_attention without dropout, its own einsum path with it);
keras.layers.LayerNormalization and the runner's GELU (keras.activations.gelu in the layer's
form). Their backward runs in a GradientTape with the forward (the output's gradient given), so
the harness also times the forward and takes the difference. Pooling is the runner's own Keras
layer (NHWC): MaxPooling2D with its padding plan (SAME, VALID, or a -inf pad then VALID:
PaddedMaxPool2D), AveragePooling2D (VALID), GlobalAveragePooling2D; its input gradient likewise in
a tape with the forward. Batch norm is the runner's layer in training (FusedBatchNormV3, the running
statistics assigned), its gradients likewise in a tape with the forward. A dense layer is the
runner's keras.layers.Dense on a (batch, positions, inputs) sequence or a flat input, its gradients
likewise in a tape with the forward.

A Llama-style decoder's and a Mixture-of-Experts layer's kernels, under the Keras dtype policy of the
kernel's precision, each backward in a tape with its forward (the harness takes the forward off):
keras.layers.RMSNormalization (Keras 3.15); the rotary embedding on q (B, T, H, S) and k (B, T, KV,
S), `x * cos + rotate_half(x) * sin` (keras_hub's RotaryEmbedding's form: Keras has no layer of
it); a SwiGLU MLP of three keras.layers.Dense without bias and keras.activations.silu (keras_hub's
LlamaMLP design); grouped-query attention as keras.layers.GroupQueryAttention's call runs it on
its projections, the key and value heads repeated H / KV times (`ops.repeat`) then its
`_compute_attention` (keras.ops.dot_product_attention, causal); the router's float32 product,
softmax, `tf.math.top_k` (ties to the lower index) and the chosen weights renormalised; the experts
as a loop over them in the graph, each gathering its tokens (`tf.gather`), its SwiGLU on its slices
of the stacked weights, and its weighted output added back (`tf.tensor_scatter_nd_add`).
"""

from __future__ import annotations

from runners.common.contract import KERNEL_PRECISION, Kernel, pool_op
from runners.tensorflow.framework import device_of, load_keras, load_tf
from runners.tensorflow.precision import precision_scope
from runners.tensorflow.transformer import transformer_classes
from runners.tensorflow.layers import layer_classes, lstm_layer, padding_plan, set_batch_norm_floor


# the kinds of a Llama-style decoder and a Mixture-of-Experts layer (_decoder_kernel)
DECODER_KINDS = ("rms_norm", "rotary", "swiglu", "grouped_attention", "moe_router", "moe_experts")


class GraphKernel(Kernel):
    """A tf.function on its arguments, called on the kernel's device; synchronize() is sync_devices."""

    def __init__(self, fn, args, device, includes_forward=False, settings=None):
        self._fn, self._args, self._device = fn, args, device
        self._out = None
        super().__init__(self._call, load_tf().test.experimental.sync_devices, settings, includes_forward)

    def _call(self):
        import tensorflow as tf

        with tf.device(self._device):
            self._out = self._fn(*self._args)


def prepare_kernel(spec: dict, device_name: str) -> Kernel:
    tf = load_tf()

    kind, shape = spec["kind"], spec["shape"]
    dtype = getattr(tf, spec["dtype"])
    device = device_of(device_name == "cuda")
    tf.random.set_seed(0)

    def rand(*dims):
        with tf.device(device):
            return tf.identity(tf.cast(tf.random.normal(dims), dtype))

    def make(fn, args, **kw) -> GraphKernel:
        kernel = GraphKernel(tf.function(fn), args, device, **kw)
        kernel.step()  # trace and build the graph outside the timed calls
        kernel.synchronize()
        return kernel

    if kind == "matmul":
        return make(tf.linalg.matmul, (rand(shape["m"], shape["k"]), rand(shape["k"], shape["n"])))
    if kind == "transpose":
        return make(tf.transpose, (rand(shape["rows"], shape["cols"]),))
    if kind == "copy":
        return make(lambda x: tf.raw_ops.DeepCopy(x=x), (rand(shape["elements"]),))
    if kind == "relu":
        return make(tf.nn.relu, (rand(shape["elements"]),))
    if kind.startswith("conv2d"):
        # the runner's own choice of SAME, VALID or pad + VALID (padding_plan)
        n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
        kernel_hw, stride_hw = (shape["kh"], shape["kw"]), (shape["sh"], shape["sw"])
        mode, pads = padding_plan((h, w), kernel_hw, stride_hw, (shape["ph"], shape["pw"]))
        if pads is not None:  # the runner zero-pads first (PaddedConv2D): its convolution sees the padded input
            h, w = h + sum(pads[0]), w + sum(pads[1])
        padding = mode.upper()
        x = rand(n, h, w, c)
        k = rand(shape["kh"], shape["kw"], c, shape["filters"])
        strides = [1, shape["sh"], shape["sw"], 1]
        # the padding TensorFlow's kernels get in the runner's graph: EXPLICIT padding would take
        # slower kernels (measured here: several times slower backward at small channel counts)
        settings = {"layout": "NHWC", "padding": padding + (" after tf.pad" if pads is not None else "")}
        if kind == "conv2d_fwd":
            return make(lambda x, k: tf.nn.conv2d(x, k, strides, padding), (x, k), settings=settings)
        y = tf.nn.conv2d(x, k, strides, padding)
        dy = rand(*y.shape)

        def backward(x, k, dy):
            dk = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=tf.shape(k), out_backprop=dy, strides=strides,
                                                 padding=padding)
            if not shape["input_grad"]:
                return dk
            dx = tf.raw_ops.Conv2DBackpropInput(input_sizes=tf.shape(x), filter=k, out_backprop=dy, strides=strides,
                                                padding=padding)
            return dx, dk

        return make(backward, (x, k, dy), settings={**settings, "ops": "Conv2DBackpropFilter/Input"})
    if kind.startswith("lstm_step"):
        keras = load_keras()

        b, i, h = shape["batch"], shape["input"], shape["hidden"]
        with tf.device(device):
            cell = keras.layers.LSTMCell(h, dtype=spec["dtype"])
            cell.build((b, i))
        x, hx, cx = rand(b, i), rand(b, h), rand(b, h)
        if kind == "lstm_step_fwd":
            return make(lambda x, hx, cx: cell(x, [hx, cx]), (x, hx, cx), settings={"cell": "keras.layers.LSTMCell"})

        def forward_backward(x, hx, cx):
            with tf.GradientTape() as tape:
                tape.watch([x, hx, cx])
                out, (h1, c1) = cell(x, [hx, cx])
                total = tf.reduce_sum(h1) + tf.reduce_sum(c1)
            return total, tape.gradient(total, [x, hx, cx, *cell.trainable_variables])

        return make(forward_backward, (x, hx, cx), includes_forward=True, settings={"cell": "keras.layers.LSTMCell"})
    if kind.startswith("lstm_layer"):
        b, t, i, h = shape["batch"], shape["steps"], shape["input"], shape["hidden"]
        with tf.device(device):
            layer = lstm_layer(h, dtype=spec["dtype"])  # the runner's configuration (Keras' cuDNN-compatible LSTM)
            layer.build((b, t, i))
        x = rand(b, t, i)
        settings = {"layer": "keras.layers.LSTM, as the runner configures it"}
        if kind == "lstm_layer_fwd":
            return make(lambda x: layer(x), (x,), settings=settings)

        def forward_backward(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                total = tf.reduce_sum(layer(x))
            return total, tape.gradient(total, [x, *layer.trainable_variables])

        return make(forward_backward, (x,), includes_forward=True, settings=settings)
    if kind.startswith("softmax_xent"):
        logits = rand(shape["rows"], shape["classes"])
        with tf.device(device):
            labels = tf.random.uniform((shape["rows"],), 0, shape["classes"], dtype=tf.int64)

        def loss(logits):
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

        if kind == "softmax_xent_fwd":
            return make(loss, (logits,))

        def forward_backward(logits):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                value = loss(logits)
            return value, tape.gradient(value, logits)

        return make(forward_backward, (logits,), includes_forward=True)
    if kind == "sgd_momentum":
        keras = load_keras()

        with tf.device(device):
            variable = tf.Variable(rand(shape["elements"]))
            grad = rand(shape["elements"])
            optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
            optimizer.build([variable])
        return make(lambda g: optimizer.apply_gradients([(g, variable)]), (grad,),
                    settings={"op": "keras.optimizers.SGD(momentum=0.9).apply_gradients"})
    if kind.startswith("dense"):
        return _dense_kernel(tf, kind, shape, spec["dtype"], device, rand, make)
    if kind == "batched_matmul":
        a, b = rand(shape["batch"], shape["m"], shape["k"]), rand(shape["batch"], shape["k"], shape["n"])
        return make(tf.linalg.matmul, (a, b), settings={"op": "tf.linalg.matmul"})
    if kind.startswith(("attention", "layer_norm", "gelu")):
        return _transformer_kernel(tf, kind, shape, spec["dtype"], rand, make)
    if kind.startswith("pool2d"):
        return _pooling_kernel(tf, kind, shape, spec["dtype"], rand, make)
    if kind.startswith("batch_norm"):
        return _batch_norm_kernel(tf, kind, shape, spec["dtype"], rand, make, device_name == "cuda")
    if kind.startswith(DECODER_KINDS):
        return _decoder_kernel(tf, kind, shape, spec["dtype"], device, rand, make)
    raise ValueError(f"tensorflow runner: unknown kernel kind {kind!r}")


def _dense_kernel(tf, kind: str, shape: dict, dtype: str, device: str, rand, make) -> GraphKernel:
    """The runner's keras.layers.Dense on a (batch, positions, inputs) sequence or a flat input, under
    the kernel's precision policy; its backward (the weight, bias and, when asked, input gradients)
    in one tape with the forward (the harness takes the forward off)."""
    keras = load_keras()
    rows = (shape["batch"], shape["positions"]) if shape["positions"] > 1 else (shape["batch"],)
    with precision_scope(KERNEL_PRECISION[dtype]), tf.device(device):
        layer = keras.layers.Dense(shape["units"], use_bias=bool(shape["bias"]))
        layer.build((*rows, shape["inputs"]))
    x = tf.cast(rand(*rows, shape["inputs"]), layer.compute_dtype)
    settings = {"op": "keras.layers.Dense"}
    if kind == "dense_fwd":
        return make(layer, (x,), settings=settings)
    dy = tf.ones_like(layer(x))
    weights = list(layer.trainable_variables)

    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        # y returned too: no gradient of a product needs its output, and Grappler would prune the
        # forward the harness takes off
        return y, tape.gradient(y, ([x] if shape["input_grad"] else []) + weights, output_gradients=dy)

    return make(forward_backward, (x,), includes_forward=True, settings=settings)


def _pooling_kernel(tf, kind: str, shape: dict, dtype: str, rand, make) -> GraphKernel:
    """Max, average or global average pooling as the runner's layers compute it (layers.py),
    under the kernel's precision's Keras policy; the backward as forward + backward in one tape."""
    keras = load_keras()
    n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
    size, stride = (shape["kh"], shape["kw"]), (shape["sh"], shape["sw"])
    op = pool_op(shape)
    with precision_scope(KERNEL_PRECISION[dtype]):
        if op == "max":
            layer = layer_classes().max_pool(size, stride, (shape["ph"], shape["pw"]), (h, w))
        elif op == "avg":
            layer = keras.layers.AveragePooling2D(size, stride, padding="valid")
        else:
            layer = keras.layers.GlobalAveragePooling2D()
        layer.build((n, h, w, c))
    x = tf.cast(rand(n, h, w, c), layer.compute_dtype)
    settings = {"op": f"keras.layers.{type(layer).__name__}", "layout": "NHWC",
                **({"padding": layer.padding + (" after a -inf tf.pad" if hasattr(layer, "pads") else "")}
                   if op != "global" else {})}
    if kind == "pool2d_fwd":
        return make(layer, (x,), settings=settings)
    dy = tf.ones_like(layer(x))

    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x)
        # the output returned too: an average's gradient needs none of the forward, which the graph
        # would otherwise prune, and the forward timed alone would then be taken off a backward only
        return out, tape.gradient(out, x, output_gradients=dy)

    return make(forward_backward, (x,), includes_forward=True, settings=settings)


def _batch_norm_kernel(tf, kind: str, shape: dict, dtype: str, rand, make, cuda: bool) -> GraphKernel:
    """A training step's batch norm as the runner's layer computes it (FusedBatchNorm: the fused kernel,
    the running statistics assigned), on NHWC or flat (N, C) input under the kernel's precision's
    Keras policy; the backward as forward + backward in one tape (dx when asked, dgamma, dbeta)."""
    n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
    dims = (n, h, w, c) if h * w > 1 else (n, c)
    set_batch_norm_floor(cuda)  # cuDNN's epsilon floor on a GPU, as the runner's networks are built
    with precision_scope(KERNEL_PRECISION[dtype]):
        layer = layer_classes().batch_norm(1e-5, 0.1)
        layer.build(dims)
    x = tf.cast(rand(*dims), layer.compute_dtype)
    settings = {"op": "FusedBatchNormV3 (the runner's keras BatchNormalization), training",
                "layout": "NHWC" if h * w > 1 else "(N, C) as (N, 1, 1, C)"}

    def forward(x):
        return layer(x, training=True)

    if kind == "batch_norm_fwd":
        return make(forward, (x,), settings=settings)
    dy = tf.ones_like(forward(x))
    input_grad = bool(shape["input_grad"])

    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = forward(x)
        return out, tape.gradient(out, ([x] if input_grad else []) + [layer.gamma, layer.beta], output_gradients=dy)

    return make(forward_backward, (x,), includes_forward=True, settings=settings)


def _transformer_kernel(tf, kind: str, shape: dict, dtype: str, rand, make) -> GraphKernel:
    """Attention's core, a layer norm or a GELU: the forward as the runner's layers compute it, and the
    backward as forward + backward in one tape (the harness takes the forward off)."""
    keras = load_keras()
    with precision_scope(KERNEL_PRECISION[dtype]):
        if kind.startswith("attention"):
            b, h, t, s = shape["batch"], shape["heads"], shape["steps"], shape["head_size"]
            rate, causal = shape["dropout"] / 1000, bool(shape["causal"])
            layer = transformer_classes().SelfAttention({"heads": h, "head_size": s, "dropout": rate, "bias": True,
                                                         "causal": causal})
            layer.build((b, t, h * s))
            mha = layer.mha
            # as MultiHeadAttention.call hands it over when causal masking is the only mask
            extra = {"use_causal_mask": True} if causal else {}

            def forward(q, k, v):
                return mha._compute_attention(q, k, v, None, rate > 0, **extra)[0]

            args = tuple(tf.cast(rand(b, t, h, s), mha.compute_dtype) for _ in range(3))
            settings = {"op": "keras.layers.MultiHeadAttention._compute_attention",
                        "path": "its own einsum path (dropout)" if rate > 0 else "keras.ops.dot_product_attention",
                        "dropout": rate, "causal": causal}
        elif kind.startswith("layer_norm"):
            rows, dim = shape["rows"], shape["dim"]
            layer = keras.layers.LayerNormalization(epsilon=1e-5)
            layer.build((rows, dim))
            args = (tf.cast(rand(rows, dim), layer.compute_dtype),)
            forward = layer
            settings = {"op": "keras.layers.LayerNormalization"}
        else:
            form = "tanh" if shape["approximate"] else "erf"
            forward = transformer_classes().gelu(form)
            args = (rand(shape["elements"]),)
            settings = {"op": f"keras.activations.gelu (approximate={bool(shape['approximate'])})"}
    if kind.endswith("_fwd"):
        return make(forward, args, settings=settings)
    weights = [] if kind.startswith("gelu") else list(layer.trainable_variables)  # a layer norm's gamma, beta
    input_grad = not (kind == "layer_norm_bwd" and not shape["input_grad"])
    dy = tf.ones_like(forward(*args))

    def forward_backward(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = forward(*inputs)
        return out, tape.gradient(out, (list(inputs) if input_grad else []) + weights, output_gradients=dy)

    return make(forward_backward, args, includes_forward=True, settings=settings)


def _decoder_kernel(tf, kind: str, shape: dict, dtype: str, device: str, rand, make) -> GraphKernel:
    """RMSNorm, rotary, SwiGLU, grouped attention, the MoE router and its experts (module docstring):
    the forward, or forward and backward in one tape (the gradients of `inputs` and `weights`)."""
    keras = load_keras()
    ops = keras.ops
    weights: list = []
    with precision_scope(KERNEL_PRECISION[dtype]), tf.device(device):
        compute = keras.config.dtype_policy().compute_dtype  # the policy's (float32 for the float32 kernels)
        if kind.startswith("rms_norm"):
            rows, dim = shape["rows"], shape["dim"]
            layer = keras.layers.RMSNormalization(epsilon=1e-5)
            layer.build((rows, dim))
            forward, args = layer, (tf.cast(rand(rows, dim), layer.compute_dtype),)
            weights = list(layer.trainable_variables)
            input_grad = kind == "rms_norm_fwd" or bool(shape["input_grad"])
            settings = {"op": "keras.layers.RMSNormalization"}
        elif kind.startswith("rotary"):
            b, t, h, kv, s = shape["batch"], shape["steps"], shape["heads"], shape["kv_heads"], shape["head_size"]
            angle = tf.tensordot(tf.range(t, dtype=tf.float32), 10000.0 ** (-tf.range(0, s, 2, dtype=tf.float32) / s),
                                 axes=0)
            cos, sin = (tf.cast(f(tf.concat([angle, angle], -1)), compute)[:, None, :] for f in (tf.cos, tf.sin))

            def rotate(u):
                return u * cos + tf.concat([-u[..., s // 2:], u[..., :s // 2]], -1) * sin

            def forward(q, k):
                return rotate(q), rotate(k)

            args, input_grad = (tf.cast(rand(b, t, h, s), compute), tf.cast(rand(b, t, kv, s), compute)), True
            settings = {"op": "x * cos + rotate_half(x) * sin on q and k (keras_hub's RotaryEmbedding's form)"}
        elif kind.startswith("swiglu"):
            rows, dim, hidden = shape["rows"], shape["dim"], shape["hidden"]
            gate, up = keras.layers.Dense(hidden, use_bias=False), keras.layers.Dense(hidden, use_bias=False)
            down = keras.layers.Dense(dim, use_bias=False)
            for layer, width in ((gate, dim), (up, dim), (down, hidden)):
                layer.build((rows, width))
                weights += list(layer.trainable_variables)

            def forward(x):
                return down(keras.activations.silu(gate(x)) * up(x))

            args = (tf.cast(rand(rows, dim), gate.compute_dtype),)
            input_grad = kind == "swiglu_fwd" or bool(shape["input_grad"])
            settings = {"op": "down(keras.activations.silu(gate(x)) * up(x)), keras.layers.Dense without bias"}
        elif kind.startswith("grouped_attention"):
            b, h, kv, t, s = shape["batch"], shape["heads"], shape["kv_heads"], shape["steps"], shape["head_size"]
            gqa = keras.layers.GroupQueryAttention(head_dim=s, num_query_heads=h, num_key_value_heads=kv,
                                                   use_bias=False)
            gqa.build((b, t, h * s), (b, t, h * s))
            extra = {"use_causal_mask": True} if shape["causal"] else {}

            def forward(q, k, v):  # as GroupQueryAttention.call after its projections
                k, v = ops.repeat(k, h // kv, axis=2), ops.repeat(v, h // kv, axis=2)
                return gqa._compute_attention(q, k, v, attention_mask=None, training=False, **extra)[0]

            args = (tf.cast(rand(b, t, h, s), gqa.compute_dtype), tf.cast(rand(b, t, kv, s), gqa.compute_dtype),
                    tf.cast(rand(b, t, kv, s), gqa.compute_dtype))
            input_grad = True
            settings = {"op": "keras.layers.GroupQueryAttention: ops.repeat of the key/value heads, _compute_attention",
                        "causal": bool(shape["causal"])}
        elif kind.startswith("moe_router"):
            rows, dim, experts, top = shape["rows"], shape["dim"], shape["experts"], shape["top_k"]
            with tf.device(device):
                router = tf.Variable(tf.cast(rand(experts, dim), tf.float32))
            weights = [router]

            def forward(x):
                p = tf.nn.softmax(tf.matmul(tf.cast(x, tf.float32), router, transpose_b=True), axis=-1)
                picked = tf.math.top_k(p, top).values
                return picked / tf.reduce_sum(picked, axis=-1, keepdims=True)

            args, input_grad = (tf.cast(rand(rows, dim), compute),), True
            settings = {"op": "float32 tf.matmul, tf.nn.softmax, tf.math.top_k, renormalised"}
        else:
            tokens, dim, hidden, experts, top = (shape["tokens"], shape["dim"], shape["hidden"], shape["experts"],
                                                 shape["top_k"])
            with tf.device(device):
                gate, up = tf.Variable(rand(experts, hidden, dim)), tf.Variable(rand(experts, hidden, dim))
                down = tf.Variable(rand(experts, dim, hidden))
            weights = [gate, up, down]
            chosen = (tf.range(tokens)[:, None] * top + tf.range(top)[None, :]) % experts
            share = tf.fill((tokens, top), tf.constant(1.0 / top, dtype=compute))
            groups = [tf.where(tf.equal(chosen, e)) for e in range(experts)]  # (token, rank) pairs per expert

            def forward(x, share):
                out = tf.zeros_like(x)
                for e, pairs in enumerate(groups):
                    token = pairs[:, :1]
                    rows = tf.gather_nd(x, token)
                    g = tf.matmul(rows, tf.cast(gate[e], x.dtype), transpose_b=True)
                    u = tf.matmul(rows, tf.cast(up[e], x.dtype), transpose_b=True)
                    y = tf.matmul(keras.activations.silu(g) * u, tf.cast(down[e], x.dtype), transpose_b=True)
                    out = tf.tensor_scatter_nd_add(out, token, y * tf.gather_nd(share, pairs)[:, None])
                return out

            args, input_grad = (tf.cast(rand(tokens, dim), compute), share), True
            settings = {"op": "a loop over the experts: tf.gather_nd, their SwiGLU, tf.tensor_scatter_nd_add",
                        "routing": "token t to experts (t*k + j) mod E, weights 1/k"}
    if kind.endswith("_fwd"):
        return make(forward, args, settings=settings)
    dy = tf.nest.map_structure(tf.ones_like, forward(*args))

    def forward_backward(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = forward(*inputs)
        # the output returned too: Grappler would prune a forward no gradient needs
        return out, tape.gradient(out, (list(inputs) if input_grad else []) + weights, output_gradients=dy)

    return make(forward_backward, args, includes_forward=True, settings=settings)
