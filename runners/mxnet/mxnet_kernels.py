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
runner's Trainer (which aggregates it over tensors).
"""

from __future__ import annotations

import contract
from mxnet_network import block_classes, load_mxnet


def prepare_kernel(spec: dict, device_name: str) -> contract.Kernel:
    mx = load_mxnet()

    def kernel(step, includes_forward=False, settings=None) -> contract.Kernel:  # waited for with waitall
        return contract.Kernel(step, mx.nd.waitall, settings, includes_forward)

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
        if shape["input_grad"]:
            x.attach_grad()
        w.attach_grad()
        dy = mx.nd.ones_like(mx.nd.Convolution(data=x, weight=w, **options))

        def forward_backward():
            with mx.autograd.record():
                y = mx.nd.Convolution(data=x, weight=w, **options)
            y.backward(dy)

        return kernel(forward_backward, includes_forward=True, settings={"layout": "NCHW"})
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
        x.attach_grad()
        dy = mx.nd.ones((b, t, h), ctx=ctx, dtype=x.dtype)

        def forward_backward():
            with mx.autograd.record():
                out = layer(x)
            out.backward(dy)

        return kernel(forward_backward, includes_forward=True, settings=settings)
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
    raise ValueError(f"mxnet runner: unknown kernel kind {kind!r}")
