"""MXNet kernels of the `kernels` suite (kinds and counts: src/dlbench/performance/kernels.py).

NDArray operators on the runner's layout (NCHW; oneDNN kernels on CPU, cuDNN on GPU), waited for
with `mx.nd.waitall()`: the matmul is `FullyConnected` (the operator behind the runner's Dense
layers: oneDNN's inner product on CPU, where `dot` would go to OpenBLAS), computing A B as
A (B^T)^T with B^T stored as the weight; `transpose` (materialised), `copyto` into an existing
array, `Convolution`, and one step of Gluon's LSTMCell (hybridised). MXNet offers no convolution or cell
backward on its own: a backward kernel is one autograd forward and backward, and the harness also
times the forward and takes the difference. Reduced precisions are cast with `amp_cast` (how MXNet's
AMP makes bfloat16 tensors for oneDNN). The loss is Gluon's SoftmaxCrossEntropyLoss (mean), its
backward timed with its forward; the update is `sgd_mom_update` in place, the operator behind the
runner's Trainer (which aggregates it over tensors). Transformer kernels: `batch_dot` for a batched
product; attention's core as the runner's SelfAttention runs it (hybridised): on the interleaved,
sequence-first (T, B, 3HS) projection, contrib.interleaved_matmul_selfatt_qk, the causal mask
added, softmax, Dropout where training applies it, contrib.interleaved_matmul_selfatt_valatt (in
float32 where their kernels refuse the dtype, as the runner's AMP keeps them); the runner's layer
norm (nn.LayerNorm) and GELU blocks (nn.GELU, or the tanh form from operators), hybridised.
Their backward is one autograd forward and backward, less the forward. Pooling is the `Pooling`
operator as the runner's Gluon blocks call it (NCHW, pooling_convention "valid"): MaxPool2D's max
with its padding, AvgPool2D's avg without, GlobalAvgPool2D's global_pool; its input gradient one
autograd forward and backward, less the forward. Batch norm is the runner's nn.BatchNorm
(hybridised) in training mode, its gradients one autograd forward and backward, less the forward.
A dense layer is the runner's gluon nn.Dense (flatten=False, hybridised) on a (batch, positions,
inputs) sequence or a flat input, its gradients one autograd forward and backward, less the forward.

A Llama-style decoder's and a Mixture-of-Experts layer's kernels, composed from MXNet's operators
(it has no fused RMSNorm, rotary, grouped attention or MoE; Gluon blocks hybridised, as the runner's
would be), each backward one autograd forward and backward, less the forward: RMSNorm as
x * rsqrt(mean(x^2) + eps) * gamma; the rotary embedding on q (B, H, T, S) and k (B, KV, T, S),
x * cos + rotate_half(x) * sin; a SwiGLU MLP of three nn.Dense (flatten=False, no bias) and
x * sigmoid(x); grouped-query attention with the key and value heads repeated H / KV times
(`repeat`), `batch_dot` scores scaled, the causal mask added, softmax, `batch_dot` with v; the
router's float32 product and softmax, the top-k by each expert's rank among the token's
(comparisons, ties to the lower expert: a hybridised graph has no data-dependent shapes) and the
chosen weights renormalised; the experts by dense dispatch, every expert's SwiGLU on every token
(a dot over the stacked weights, `batch_dot`) weighted by the routing weights (0 where not chosen)
and summed: E/k times the work the kernel counts, which is what an MXNet MoE without a grouped
product pays.
"""

from __future__ import annotations

from runners.common import contract
from runners.mxnet.framework import load_mxnet
from runners.mxnet.layers import block_classes
from runners.mxnet.transformer import fused_attention_unavailable


# the kinds of a Llama-style decoder and a Mixture-of-Experts layer (_decoder)
DECODER_KINDS = ("rms_norm", "rotary", "swiglu", "grouped_attention", "moe_router", "moe_experts")


def prepare_kernel(spec: dict, device_name: str) -> contract.Kernel:
    mx = load_mxnet()

    def kernel(step, includes_forward=False, settings=None) -> contract.Kernel:  # waited for with waitall
        return contract.Kernel(step, mx.nd.waitall, settings, includes_forward)

    def recorded_backward(forward, grads, settings=None) -> contract.Kernel:
        """forward() and its backward in one autograd record, the output's gradient ones in its dtype,
        into the parameters' gradients and those of `grads` (the harness takes the forward off)."""
        for a in grads:
            a.attach_grad()
        dy = mx.nd.ones_like(forward())

        def forward_backward():
            with mx.autograd.record():
                out = forward()
            out.backward(dy)

        return kernel(forward_backward, includes_forward=True, settings=settings)

    kind, shape, dtype = spec["kind"], spec["shape"], spec["dtype"]
    ctx = mx.gpu(0) if device_name == "cuda" else mx.cpu()
    mx.random.seed(0)

    def rand(*dims):
        x = mx.nd.random.normal(shape=dims, ctx=ctx)
        return x if dtype == "float32" else mx.nd.amp_cast(x, dtype=dtype)

    if kind == "matmul":
        a, weight = rand(shape["m"], shape["k"]), rand(shape["n"], shape["k"])  # weight = B^T, as Dense keeps it
        return kernel(lambda: mx.nd.FullyConnected(data=a, weight=weight, no_bias=True, num_hidden=shape["n"]),
                      settings={"op": "FullyConnected"})
    if kind == "transpose":
        a = rand(shape["rows"], shape["cols"])
        return kernel(lambda: mx.nd.transpose(a))
    if kind == "copy":
        src, dst = rand(shape["elements"]), rand(shape["elements"])
        return kernel(lambda: src.copyto(dst))
    if kind == "relu":
        x = rand(shape["elements"])
        return kernel(lambda: mx.nd.Activation(x, act_type="relu"), settings={"op": "Activation(relu)"})
    if kind.startswith("conv2d"):
        x = rand(shape["batch"], shape["channels"], shape["height"], shape["width"])
        w = rand(shape["filters"], shape["channels"], shape["kh"], shape["kw"])
        options = dict(no_bias=True, kernel=(shape["kh"], shape["kw"]), stride=(shape["sh"], shape["sw"]),
                       pad=(shape["ph"], shape["pw"]), num_filter=shape["filters"], layout="NCHW")
        if kind == "conv2d_fwd":
            return kernel(lambda: mx.nd.Convolution(data=x, weight=w, **options), settings={"layout": "NCHW"})
        return recorded_backward(lambda: mx.nd.Convolution(data=x, weight=w, **options),
                                 [x, w] if shape["input_grad"] else [w], {"layout": "NCHW"})
    if kind.startswith("lstm_step"):
        b, i, h = shape["batch"], shape["input"], shape["hidden"]
        cell = mx.gluon.rnn.LSTMCell(h, input_size=i)
        cell.initialize(ctx=ctx)
        if dtype != "float32":
            cell.cast(dtype)
        cell.hybridize(static_alloc=True, static_shape=True)
        x, hx, cx = rand(b, i), rand(b, h), rand(b, h)
        settings = {"cell": "gluon.rnn.LSTMCell, hybridised"}
        if kind == "lstm_step_fwd":
            return kernel(lambda: cell(x, [hx, cx]), settings=settings)
        for a in (x, hx, cx):
            a.attach_grad()
        dh, dc = mx.nd.ones_like(hx), mx.nd.ones_like(cx)

        def forward_backward():
            with mx.autograd.record():
                out, (h1, c1) = cell(x, [hx, cx])
            mx.autograd.backward([out, c1], [dh, dc])

        return kernel(forward_backward, includes_forward=True, settings=settings)
    if kind.startswith("lstm_layer"):
        b, t, i, h = shape["batch"], shape["steps"], shape["input"], shape["hidden"]
        layer = block_classes()["SequenceLSTM"](i, h, 1)  # the runner's own layer: gluon.rnn.LSTM, fused RNN op
        layer.initialize(ctx=ctx)
        if dtype != "float32":
            layer.cast(dtype)
        layer.hybridize(static_alloc=True, static_shape=True)
        x = rand(b, t, i)
        settings = {"layer": "gluon.rnn.LSTM (fused RNN operator), hybridised"}
        if kind == "lstm_layer_fwd":
            return kernel(lambda: layer(x), settings=settings)
        return recorded_backward(lambda: layer(x), [x], settings)
    if kind.startswith("softmax_xent"):
        logits = rand(shape["rows"], shape["classes"])
        labels = mx.nd.random.randint(0, shape["classes"], shape=(shape["rows"],), ctx=ctx).astype("float32")
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        if kind == "softmax_xent_fwd":
            return kernel(lambda: loss(logits, labels).mean())
        logits.attach_grad()

        def forward_backward():
            with mx.autograd.record():
                value = loss(logits, labels).mean()
            value.backward()

        return kernel(forward_backward, includes_forward=True)
    if kind == "sgd_momentum":
        weight, grad, mom = rand(shape["elements"]), rand(shape["elements"]), rand(shape["elements"])
        return kernel(lambda: mx.nd.sgd_mom_update(weight, grad, mom, lr=0.01, momentum=0.9, out=weight),
                      settings={"op": "sgd_mom_update, in place"})
    if kind.startswith("dense"):
        # the runner's gluon nn.Dense (flatten=False keeps a sequence's steps), hybridised
        rows = (shape["batch"], shape["positions"]) if shape["positions"] > 1 else (shape["batch"],)
        layer = mx.gluon.nn.Dense(shape["units"], use_bias=bool(shape["bias"]), flatten=False,
                                  in_units=shape["inputs"])
        layer.initialize(ctx=ctx)
        if dtype != "float32":
            layer.cast(dtype)
        layer.hybridize(static_alloc=True, static_shape=True)
        x = rand(*rows, shape["inputs"])
        settings = {"op": "gluon.nn.Dense(flatten=False), hybridised"}
        if kind == "dense_fwd":
            return kernel(lambda: layer(x), settings=settings)
        return recorded_backward(lambda: layer(x), [x] if shape["input_grad"] else [], settings)
    if kind == "batched_matmul":
        a, b = rand(shape["batch"], shape["m"], shape["k"]), rand(shape["batch"], shape["k"], shape["n"])
        return kernel(lambda: mx.nd.batch_dot(a, b), settings={"op": "batch_dot"})
    if kind.startswith(("attention", "layer_norm", "gelu")):
        if kind.startswith("attention"):
            b, h, t, s = shape["batch"], shape["heads"], shape["steps"], shape["head_size"]
            refused = fused_attention_unavailable(ctx, dtype)
            block = _attention_core(mx, h, shape["dropout"] / 1000, refused is not None)
            inputs = [rand(t, b, 3 * h * s)]  # q, k, v interleaved per head, sequence-first
            if shape["causal"]:
                import numpy as np

                mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), k=1)[None]
                inputs.append(mx.nd.array(mask, ctx=ctx, dtype="float32" if refused else dtype))
            settings = {"op": "contrib.interleaved_matmul_selfatt_qk/valatt, softmax"
                              + (", Dropout" if shape["dropout"] else "") + " (the runner's SelfAttention core)",
                        **({"float32": f"the fused operators refuse {dtype}: {refused}"} if refused else {})}
            grads = inputs[:1]
            train = bool(shape["dropout"])  # Dropout is active in training mode only
        elif kind.startswith("layer_norm"):
            rows, dim = shape["rows"], shape["dim"]
            block = block_classes()["layer_norm_block"](dim, 1e-5, False)
            inputs = [rand(rows, dim)]
            settings = {"op": "nn.LayerNorm"}
            grads = inputs if kind == "layer_norm_fwd" or shape["input_grad"] else []
            train = False
        else:
            block = block_classes()["gelu_block"]("tanh" if shape["approximate"] else "erf", False)
            inputs = [rand(shape["elements"])]
            settings = {"op": "the tanh form from operators" if shape["approximate"] else "nn.GELU"}
            grads, train = inputs, False
        block.initialize(ctx=ctx)
        if dtype != "float32" and not kind.startswith("attention"):
            block.cast(dtype)
        block.hybridize(static_alloc=True, static_shape=True)
        settings["block"] = "hybridised"
        if kind.endswith("_fwd"):
            def forward():
                with mx.autograd.train_mode() if train else mx.autograd.predict_mode():
                    block(*inputs)

            return kernel(forward, settings=settings)
        # the output's gradient in its dtype (float32 from fused operators that refused the kernel's)
        return recorded_backward(lambda: block(*inputs), grads, settings)
    if kind.startswith("batch_norm"):
        n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
        block = mx.gluon.nn.BatchNorm(axis=1, momentum=0.9, epsilon=1e-5, in_channels=c)  # as the runner's
        block.initialize(ctx=ctx)  # its parameters float32 in every precision, as AMP keeps a batch norm's
        block.hybridize(static_alloc=True, static_shape=True)
        x = rand(n, c, h, w) if h * w > 1 else rand(n, c)
        settings = {"op": "nn.BatchNorm, training", "layout": "NCHW" if h * w > 1 else "(N, C)",
                    "block": "hybridised"}
        if kind == "batch_norm_fwd":
            def forward():
                with mx.autograd.train_mode():  # the batch's statistics, the running ones updated
                    block(x)

            return kernel(forward, settings=settings)
        return recorded_backward(lambda: block(x), [x] if shape["input_grad"] else [], settings)
    if kind.startswith(DECODER_KINDS):
        forward, grads, settings = _decoder(mx, kind, shape, dtype, ctx, rand)
        if kind.endswith("_fwd"):
            return kernel(forward, settings=settings)
        return recorded_backward(forward, grads, settings)
    if kind.startswith("pool2d"):
        x = rand(shape["batch"], shape["channels"], shape["height"], shape["width"])
        op = contract.pool_op(shape)
        # the Pooling arguments of gluon's MaxPool2D, AvgPool2D (no padding) and GlobalAvgPool2D
        options = dict(kernel=(shape["kh"], shape["kw"]), stride=(shape["sh"], shape["sw"]),
                       pad=(shape["ph"], shape["pw"]), pool_type="avg" if op != "max" else "max",
                       pooling_convention="valid", global_pool=op == "global", layout="NCHW")
        if op == "global":
            options.update(kernel=(1, 1), stride=(1, 1), pad=(0, 0))
        settings = {"op": f"Pooling(pool_type={options['pool_type']!r}, global_pool={op == 'global'})",
                    "layout": "NCHW"}
        if kind == "pool2d_fwd":
            return kernel(lambda: mx.nd.Pooling(x, **options), settings=settings)
        return recorded_backward(lambda: mx.nd.Pooling(x, **options), [x], settings)
    raise ValueError(f"mxnet runner: unknown kernel kind {kind!r}")


def _attention_core(mx, heads: int, rate: float, in_float32: bool):
    """The heads' part of transformer.py's SelfAttention: scores, the mask added, softmax, dropout,
    the weighted values, on the interleaved projection (and the additive causal mask, if given)."""

    class AttentionCore(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, qkv, causal_mask=None):
            if in_float32:  # as the runner's AMP keeps the fused operators (no reduced-precision kernels)
                qkv = F.amp_cast(qkv, dtype="float32")
            scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=heads)  # (B*H, T, T), scaled
            if causal_mask is not None:
                scores = F.broadcast_add(scores, causal_mask)
            probs = F.softmax(scores, axis=-1)
            if rate:
                probs = F.Dropout(probs, p=rate)
            return F.contrib.interleaved_matmul_selfatt_valatt(qkv, probs, heads=heads)

    return AttentionCore()


def _decoder(mx, kind: str, shape: dict, dtype: str, ctx, rand):
    """(forward, arrays whose gradients a backward computes besides the parameters', settings) of a
    decoder or MoE kernel (the module docstring)."""
    import numpy as np

    nd, gluon = mx.nd, mx.gluon
    bwd = kind.endswith("_bwd")

    def hybridised(block):
        block.initialize(ctx=ctx)
        if dtype != "float32":
            block.cast(dtype)
        block.hybridize(static_alloc=True, static_shape=True)
        return block

    if kind.startswith("rms_norm"):
        rows, dim = shape["rows"], shape["dim"]

        class RMSNorm(gluon.HybridBlock):
            def __init__(self):
                super().__init__()
                self.gamma = self.params.get("gamma", shape=(dim,), init="ones")

            def hybrid_forward(self, F, x, gamma):
                scale = F.rsqrt(F.mean(F.square(x), axis=-1, keepdims=True) + 1e-5)
                return F.broadcast_mul(F.broadcast_mul(x, scale), gamma)

        block, x = hybridised(RMSNorm()), rand(rows, dim)
        return (lambda: block(x)), [x] if not bwd or shape["input_grad"] else [], {
            "op": "x * rsqrt(mean(x^2) + eps) * gamma from operators (MXNet has no RMSNorm)", "block": "hybridised"}
    if kind.startswith("rotary"):
        b, t, h, kv, s = shape["batch"], shape["steps"], shape["heads"], shape["kv_heads"], shape["head_size"]
        angle = np.outer(np.arange(t), 10000.0 ** (-np.arange(0, s, 2) / s))
        table = np.concatenate([angle, angle], axis=-1)
        cos, sin = (nd.array(f(table)[None, None], ctx=ctx, dtype=dtype) for f in (np.cos, np.sin))
        q, k = rand(b, h, t, s), rand(b, kv, t, s)

        def rotate(u):
            half = nd.concat(-nd.slice_axis(u, axis=-1, begin=s // 2, end=s),
                             nd.slice_axis(u, axis=-1, begin=0, end=s // 2), dim=-1)
            return nd.broadcast_mul(u, cos) + nd.broadcast_mul(half, sin)

        return (lambda: nd.concat(rotate(q).reshape(-1), rotate(k).reshape(-1), dim=0)), [q, k], {
            "op": "x * cos + rotate_half(x) * sin from operators, on q and k"}
    if kind.startswith("swiglu"):
        rows, dim, hidden = shape["rows"], shape["dim"], shape["hidden"]

        class SwiGLU(gluon.HybridBlock):
            def __init__(self):
                super().__init__()
                self.gate = gluon.nn.Dense(hidden, use_bias=False, flatten=False, in_units=dim)
                self.up = gluon.nn.Dense(hidden, use_bias=False, flatten=False, in_units=dim)
                self.down = gluon.nn.Dense(dim, use_bias=False, flatten=False, in_units=hidden)

            def hybrid_forward(self, F, x):
                g = self.gate(x)
                return self.down(g * F.sigmoid(g) * self.up(x))

        block, x = hybridised(SwiGLU()), rand(rows, dim)
        return (lambda: block(x)), [x] if not bwd or shape["input_grad"] else [], {
            "op": "down(silu(gate(x)) * up(x)), gluon.nn.Dense without bias, silu as x * sigmoid(x)",
            "block": "hybridised"}
    if kind.startswith("grouped_attention"):
        b, h, kv, t, s = shape["batch"], shape["heads"], shape["kv_heads"], shape["steps"], shape["head_size"]
        mask = nd.array(np.triu(np.full((t, t), -np.inf if shape["causal"] else 0.0, dtype=np.float32), k=1)[None],
                        ctx=ctx, dtype=dtype)

        class GroupedAttention(gluon.HybridBlock):
            def hybrid_forward(self, F, q, k, v, mask):
                k, v = (F.repeat(u, repeats=h // kv, axis=1).reshape((-3, 0, 0)) for u in (k, v))
                scores = F.batch_dot(q.reshape((-3, 0, 0)), k, transpose_b=True) / float(np.sqrt(s))
                p = F.softmax(F.broadcast_add(scores, mask), axis=-1)
                return F.batch_dot(p, v).reshape((-4, b, h, 0, 0))

        block = GroupedAttention()
        block.hybridize(static_alloc=True, static_shape=True)
        q, k, v = rand(b, h, t, s), rand(b, kv, t, s), rand(b, kv, t, s)
        return (lambda: block(q, k, v, mask)), [q, k, v], {
            "op": "repeat of the key/value heads, batch_dot, causal mask, softmax, batch_dot", "block": "hybridised"}
    if kind.startswith("moe_router"):
        rows, dim, experts, top = shape["rows"], shape["dim"], shape["experts"], shape["top_k"]
        x, weight = rand(rows, dim), nd.random.normal(shape=(experts, dim), ctx=ctx)
        weight.attach_grad()
        lower = nd.array(np.tril(np.ones((experts, experts), dtype=np.float32), k=-1)[None], ctx=ctx)

        def route():
            p = nd.softmax(nd.dot(nd.amp_cast(x, dtype="float32"), weight, transpose_b=True), axis=-1)
            return _chosen_weights(nd, p, lower, top)

        return route, [x, weight], {
            "op": "float32 dot, softmax, the top-k by each expert's rank among the token's (comparisons: a "
                  "hybridised graph has no data-dependent shapes), renormalised over the chosen"}
    tokens, dim, hidden, experts, top = (shape["tokens"], shape["dim"], shape["hidden"], shape["experts"],
                                         shape["top_k"])
    chosen = (np.arange(tokens)[:, None] * top + np.arange(top)[None, :]) % experts
    share = np.zeros((tokens, experts), dtype=np.float32)
    np.put_along_axis(share, chosen, 1.0 / top, axis=1)
    x = rand(tokens, dim)
    gate, up, down = rand(experts, hidden, dim), rand(experts, hidden, dim), rand(experts, dim, hidden)
    weights = nd.array(share, ctx=ctx, dtype=dtype)  # (N, E): 1/k for the chosen experts, 0 elsewhere

    def experts_forward():  # dense dispatch: every expert on every token, weighted by 0 where not chosen
        g = nd.dot(x, gate.reshape((-3, 0)), transpose_b=True)
        h = g * nd.sigmoid(g) * nd.dot(x, up.reshape((-3, 0)), transpose_b=True)  # (N, E*hidden)
        h = nd.transpose(h.reshape((0, experts, hidden)), axes=(1, 0, 2))  # (E, N, hidden)
        y = nd.batch_dot(h, down, transpose_b=True)  # (E, N, D)
        return nd.sum(nd.broadcast_mul(y, nd.expand_dims(nd.transpose(weights), axis=2)), axis=0)

    return experts_forward, [x, gate, up, down, weights], {
        "op": "dense dispatch: every expert's SwiGLU on every token (dot over the stacked weights, batch_dot), "
              "the outputs weighted (0 where not chosen) and summed: E/k times the chosen work, as MXNet has no "
              "grouped product and a hybridised graph no data-dependent shapes",
        "routing": "token t to experts (t*k + j) mod E, weights 1/k"}


def _chosen_weights(nd, p, lower, top: int):
    """(N, E) weights: p renormalised over each token's top-k experts (rank below k, ties to the lower
    expert), 0 elsewhere."""
    row, col = nd.expand_dims(p, axis=2), nd.expand_dims(p, axis=1)
    rank = nd.sum(nd.broadcast_greater(col, row) + nd.broadcast_mul(nd.broadcast_equal(col, row), lower), axis=2)
    picked = p * (rank < top)
    return nd.broadcast_div(picked, nd.sum(picked, axis=1, keepdims=True))
