"""PyTorch kernels of the `kernels` suite (kinds and counts: src/dlbench/performance/kernels.py).

Each kernel is what the torch runner's training step calls for that work: `torch.matmul` (the
GEMM behind nn.Linear), a materialised transpose (`.t().contiguous()`), `Tensor.copy_`, the
convolution (`F.conv2d`, channels-last with cuDNN's autotuner on CUDA as the runner does) and
its backward as autograd runs it (`aten.convolution_backward`, with the input gradient only when
asked), and one step of the LSTM cell (`torch._VF.lstm_cell`, ATen's fused cell behind
nn.LSTMCell) and its backward (autograd.grad of that step, the graph kept between calls); the loss
(`F.cross_entropy`, mean) and its gradient (autograd.grad); one `torch.optim.SGD` step with
momentum over a parameter with a gradient, as the runner's optimiser makes it. Transformer kernels:
`torch.bmm` for a batched product; attention's core as the runner's SelfAttention calls it,
`F.scaled_dot_product_attention` on q, k, v viewed (B, H, T, S) from (B, T, H, S) projections,
is_causal, dropout_p where training applies it (torch then runs its math backend on the CPU, its
flash kernel without), torch choosing the kernel, and its backward by autograd.grad of that call;
`F.layer_norm` with gamma and beta (nn.LayerNorm's call) and `F.gelu` in the layer's form
(nn.GELU's), their backward by autograd.grad. Pooling as the network's modules call it:
`F.max_pool2d` (nn.MaxPool2d), `F.avg_pool2d` (nn.AvgPool2d), `F.adaptive_avg_pool2d` to 1 x 1
(nn.AdaptiveAvgPool2d, the global mean), channels-last on CUDA as the runner's image networks are,
the backward the input gradient by autograd.grad. Batch norm as nn.BatchNorm2d (nn.BatchNorm1d on a
flat input) calls it in training, `F.batch_norm(training=True)`, its backward by autograd.grad. A
dense layer is the runner's nn.Linear on a (batch, positions, inputs) sequence or a flat input, its
backward autograd.grad of it (the weight, bias and, when asked, input gradients).

A Llama-style decoder's and a Mixture-of-Experts layer's kernels, as HuggingFace's LlamaDecoderLayer
and MixtralSparseMoeBlock compute them (the torch runner's layers' design), each backward by
autograd.grad of its forward: `F.rms_norm` (nn.RMSNorm's call); the rotary embedding applied to q
(B, H, T, S) and k (B, KV, T, S), `t * cos + rotate_half(t) * sin`; a SwiGLU MLP of nn.Linear
without bias, `down(F.silu(gate(x)) * up(x))`; grouped-query attention as
`F.scaled_dot_product_attention(..., is_causal, enable_gqa=True)`; the router's float32 product,
softmax, a stable descending sort for the top-k (ties to the lower expert) and the chosen weights
renormalised; the experts as a loop over them, each gathering its tokens (`index_select`), its
SwiGLU by `F.linear` on its slices of the stacked (E, hidden, D) weights, and its weighted output
added back (`index_add_`).
"""

from __future__ import annotations

from runners.common.contract import Kernel, pool_op
from runners.torch.framework import load_torch
from runners.torch.layers import lstm_layer

DTYPES = ("float32", "float16", "bfloat16")
# the kinds of a Llama-style decoder and a Mixture-of-Experts layer (_decoder)
DECODER_KINDS = ("rms_norm", "rotary", "swiglu", "grouped_attention", "moe_router", "moe_experts")


def prepare_kernel(spec: dict, device_name: str) -> Kernel:
    torch = load_torch()
    kind, shape = spec["kind"], spec["shape"]
    dtype = getattr(torch, spec["dtype"])
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)

    def rand(*dims, requires_grad=False):
        return torch.randn(*dims, device=device, dtype=dtype, requires_grad=requires_grad)

    if kind == "matmul":
        a, b = rand(shape["m"], shape["k"]), rand(shape["k"], shape["n"])
        return Kernel(lambda: torch.matmul(a, b), sync)
    if kind == "transpose":
        a = rand(shape["rows"], shape["cols"])
        return Kernel(lambda: a.t().contiguous(), sync)
    if kind == "copy":
        src, dst = rand(shape["elements"]), rand(shape["elements"])
        return Kernel(lambda: dst.copy_(src), sync)
    if kind == "relu":
        x = rand(shape["elements"])
        return Kernel(lambda: torch.relu(x), sync)
    if kind.startswith("conv2d"):
        if cuda:
            torch.backends.cudnn.benchmark = True
        memory_format = torch.channels_last if cuda else torch.contiguous_format
        x = rand(shape["batch"], shape["channels"], shape["height"], shape["width"]).contiguous(
            memory_format=memory_format)
        w = rand(shape["filters"], shape["channels"], shape["kh"], shape["kw"]).contiguous(memory_format=memory_format)
        stride, padding = (shape["sh"], shape["sw"]), (shape["ph"], shape["pw"])
        settings = {"memory_format": "channels_last" if cuda else "contiguous"}
        if kind == "conv2d_fwd":
            return Kernel(lambda: torch.nn.functional.conv2d(x, w, None, stride, padding), sync, settings)
        with torch.no_grad():
            y = torch.nn.functional.conv2d(x, w, None, stride, padding)
        dy = torch.randn_like(y)
        mask = [bool(shape["input_grad"]), True, False]

        def backward():
            torch.ops.aten.convolution_backward(dy, x, w, None, stride, padding, (1, 1), False, (0, 0), 1, mask)

        return Kernel(backward, sync, {**settings, "op": "aten.convolution_backward"})
    if kind.startswith("lstm_step"):
        b, i, h = shape["batch"], shape["input"], shape["hidden"]
        grad = kind == "lstm_step_bwd"
        x, hx, cx = rand(b, i, requires_grad=grad), rand(b, h, requires_grad=grad), rand(b, h, requires_grad=grad)
        w_ih, w_hh = rand(4 * h, i, requires_grad=grad), rand(4 * h, h, requires_grad=grad)
        bias = rand(4 * h, requires_grad=grad)
        zero = torch.zeros(4 * h, device=device, dtype=dtype)  # the canonical cell has one bias
        if not grad:
            def forward():
                with torch.no_grad():
                    torch._VF.lstm_cell(x, (hx, cx), w_ih, w_hh, bias, zero)

            return Kernel(forward, sync, {"op": "torch._VF.lstm_cell"})
        h1, c1 = torch._VF.lstm_cell(x, (hx, cx), w_ih, w_hh, bias, zero)
        dh, dc = torch.randn_like(h1), torch.randn_like(c1)
        inputs = (x, hx, cx, w_ih, w_hh, bias)

        def backward():
            torch.autograd.grad((h1, c1), inputs, (dh, dc), retain_graph=True)

        return Kernel(backward, sync, {"op": "autograd.grad of torch._VF.lstm_cell"})
    if kind.startswith("lstm_layer"):
        b, t, i, h = shape["batch"], shape["steps"], shape["input"], shape["hidden"]
        layer = lstm_layer(i, h, 1).to(device=device, dtype=dtype)  # the runner's own: nn.LSTM, one frozen zero bias
        x = rand(b, t, i, requires_grad=kind == "lstm_layer_bwd")
        if kind == "lstm_layer_fwd":
            def forward():
                with torch.no_grad():
                    layer(x)

            return Kernel(forward, sync, {"op": "nn.LSTM (the runner's SequenceLSTM)"})
        out = layer(x)
        dy = torch.randn_like(out)
        inputs = (x, *[p for p in layer.parameters() if p.requires_grad])
        return Kernel(lambda: torch.autograd.grad(out, inputs, dy, retain_graph=True), sync,
                      {"op": "autograd.grad of nn.LSTM"})
    if kind.startswith("softmax_xent"):
        rows, classes = shape["rows"], shape["classes"]
        logits = rand(rows, classes, requires_grad=kind == "softmax_xent_bwd")
        labels = torch.randint(0, classes, (rows,), device=device)
        if kind == "softmax_xent_fwd":
            def forward():
                with torch.no_grad():
                    torch.nn.functional.cross_entropy(logits, labels)

            return Kernel(forward, sync, {"op": "F.cross_entropy"})
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return Kernel(lambda: torch.autograd.grad(loss, logits, retain_graph=True), sync,
                      {"op": "autograd.grad of F.cross_entropy"})
    if kind == "sgd_momentum":
        param = torch.nn.Parameter(rand(shape["elements"]))
        param.grad = rand(shape["elements"])
        opt = torch.optim.SGD([param], lr=0.01, momentum=0.9)
        opt.step()  # the momentum buffer exists from the first step on
        return Kernel(opt.step, sync, {"op": "torch.optim.SGD(momentum=0.9).step"})
    if kind.startswith("dense"):
        # the runner's nn.Linear on a sequence (batch, positions, inputs) or a flat (batch, inputs) input
        rows = (shape["batch"], shape["positions"]) if shape["positions"] > 1 else (shape["batch"],)
        layer = torch.nn.Linear(shape["inputs"], shape["units"], bias=bool(shape["bias"])).to(device=device,
                                                                                               dtype=dtype)
        grad = kind == "dense_bwd"
        x = rand(*rows, shape["inputs"], requires_grad=grad and bool(shape["input_grad"]))
        if not grad:
            def forward():
                with torch.no_grad():
                    layer(x)

            return Kernel(forward, sync, {"op": "nn.Linear"})
        y = layer(x)
        dy = torch.randn_like(y)
        inputs = ((x,) if shape["input_grad"] else ()) + tuple(layer.parameters())
        return Kernel(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True), sync,
                      {"op": "autograd.grad of nn.Linear"})
    if kind == "batched_matmul":
        a, b = rand(shape["batch"], shape["m"], shape["k"]), rand(shape["batch"], shape["k"], shape["n"])
        return Kernel(lambda: torch.bmm(a, b), sync, {"op": "torch.bmm"})
    if kind.startswith("attention"):
        return _attention(torch, kind, shape, rand, sync)
    if kind.startswith("layer_norm"):
        rows, dim = shape["rows"], shape["dim"]
        grad = kind == "layer_norm_bwd"
        x = rand(rows, dim, requires_grad=grad and bool(shape["input_grad"]))
        gamma, beta = rand(dim, requires_grad=grad), rand(dim, requires_grad=grad)
        layer_norm = torch.nn.functional.layer_norm
        if not grad:
            def forward():
                with torch.no_grad():
                    layer_norm(x, (dim,), gamma, beta, 1e-5)

            return Kernel(forward, sync, {"op": "F.layer_norm (nn.LayerNorm's)"})
        y = layer_norm(x, (dim,), gamma, beta, 1e-5)
        dy = torch.randn_like(y)
        inputs = ((x,) if shape["input_grad"] else ()) + (gamma, beta)
        return Kernel(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True), sync,
                      {"op": "autograd.grad of F.layer_norm"})
    if kind.startswith("gelu"):
        approximate = "tanh" if shape["approximate"] else "none"
        x = rand(shape["elements"], requires_grad=kind == "gelu_bwd")
        if kind == "gelu_fwd":
            def forward():
                with torch.no_grad():
                    torch.nn.functional.gelu(x, approximate=approximate)

            return Kernel(forward, sync, {"op": f"F.gelu(approximate={approximate!r}) (nn.GELU's)"})
        y = torch.nn.functional.gelu(x, approximate=approximate)
        dy = torch.randn_like(y)
        return Kernel(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), sync,
                      {"op": f"autograd.grad of F.gelu(approximate={approximate!r})"})
    if kind.startswith("pool2d"):
        return _pooling(torch, kind, shape, rand, sync, cuda)
    if kind.startswith("batch_norm"):
        return _batch_norm(torch, kind, shape, rand, sync, cuda)
    if kind.startswith(DECODER_KINDS):
        return _decoder(torch, kind, shape, rand, sync, device, dtype)
    raise ValueError(f"torch runner: unknown kernel kind {kind!r}")


def _pooling(torch, kind: str, shape: dict, rand, sync, cuda: bool) -> Kernel:
    """Max, average or global average pooling as the runner's modules call it (layers.py)."""
    functional = torch.nn.functional
    memory_format = torch.channels_last if cuda else torch.contiguous_format  # the runner's image layout
    x = rand(shape["batch"], shape["channels"], shape["height"], shape["width"]).contiguous(
        memory_format=memory_format).requires_grad_(kind == "pool2d_bwd")
    window, stride, padding = (shape["kh"], shape["kw"]), (shape["sh"], shape["sw"]), (shape["ph"], shape["pw"])
    op = pool_op(shape)
    pool = {"max": lambda x: functional.max_pool2d(x, window, stride, padding),
            "avg": lambda x: functional.avg_pool2d(x, window, stride),
            "global": lambda x: functional.adaptive_avg_pool2d(x, 1)}[op]
    name = {"max": "F.max_pool2d (nn.MaxPool2d's)", "avg": "F.avg_pool2d (nn.AvgPool2d's)",
            "global": "F.adaptive_avg_pool2d(1) (nn.AdaptiveAvgPool2d's)"}[op]
    settings = {"memory_format": "channels_last" if cuda else "contiguous"}
    if kind == "pool2d_fwd":
        def forward():
            with torch.no_grad():
                pool(x)

        return Kernel(forward, sync, {**settings, "op": name})
    y = pool(x)
    dy = torch.randn_like(y)
    return Kernel(lambda: torch.autograd.grad(y, x, dy, retain_graph=True), sync,
                  {**settings, "op": f"autograd.grad of {name}"})


def _batch_norm(torch, kind: str, shape: dict, rand, sync, cuda: bool) -> Kernel:
    """A training step's batch norm as nn.BatchNorm2d calls it (F.batch_norm, training: the batch's
    statistics, the running ones updated in place), a flat input as nn.BatchNorm1d's (N, C); the
    backward autograd.grad of that call (dx when asked, dgamma, dbeta)."""
    n, c, h, w = shape["batch"], shape["channels"], shape["height"], shape["width"]
    grad = kind == "batch_norm_bwd"
    image = h * w > 1
    memory_format = torch.channels_last if cuda and image else torch.contiguous_format  # the runner's image layout
    x = (rand(n, c, h, w).contiguous(memory_format=memory_format) if image else rand(n, c)).requires_grad_(
        grad and bool(shape["input_grad"]))
    # the parameters and running statistics float32 in every precision, as autocast leaves a batch norm's
    gamma, beta = (torch.randn(c, device=x.device, requires_grad=grad) for _ in range(2))
    running_mean, running_var = torch.zeros(c, device=x.device), torch.ones(c, device=x.device)

    def batch_norm():
        return torch.nn.functional.batch_norm(x, running_mean, running_var, gamma, beta, training=True,
                                              momentum=0.1, eps=1e-5)

    settings = {"op": f"F.batch_norm(training=True) (nn.BatchNorm{'2d' if image else '1d'}'s)",
                "memory_format": "channels_last" if memory_format is torch.channels_last else "contiguous"}
    if not grad:
        def forward():
            with torch.no_grad():
                batch_norm()

        return Kernel(forward, sync, settings)
    y = batch_norm()
    dy = torch.randn_like(y)
    inputs = ((x,) if shape["input_grad"] else ()) + (gamma, beta)
    return Kernel(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True), sync,
                  {**settings, "op": f"autograd.grad of {settings['op']}"})


def _attention(torch, kind: str, shape: dict, rand, sync) -> Kernel:
    """Attention's core as the runner's SelfAttention calls it: F.scaled_dot_product_attention on
    (B, H, T, S) views of (B, T, H, S) projections; the kernel torch chose on this call is recorded."""
    b, h, t, s = shape["batch"], shape["heads"], shape["steps"], shape["head_size"]
    grad = kind == "attention_bwd"
    rate, causal = shape["dropout"] / 1000, bool(shape["causal"])
    q, k, v = (rand(b, t, h, s).transpose(1, 2).requires_grad_(grad) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    settings = {"op": "F.scaled_dot_product_attention", "dropout_p": rate, "is_causal": causal,
                "operator": _sdpa_operator(torch, lambda: sdpa(q, k, v, dropout_p=rate, is_causal=causal))}
    if not grad:
        def forward():
            with torch.no_grad():
                sdpa(q, k, v, dropout_p=rate, is_causal=causal)

        return Kernel(forward, sync, settings)
    out = sdpa(q, k, v, dropout_p=rate, is_causal=causal)
    do = torch.randn_like(out)
    return Kernel(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), sync,
                  {**settings, "op": "autograd.grad of F.scaled_dot_product_attention"})


def _sdpa_operator(torch, call) -> str:
    """The aten operator scaled_dot_product_attention dispatched to on one call (no grad)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Watch():
        call()
    fused = [name for name in seen if "scaled_dot_product" in name]
    return fused[0] if fused else "+".join(dict.fromkeys(seen))


def _decoder(torch, kind: str, shape: dict, rand, sync, device, dtype) -> Kernel:
    """RMSNorm, rotary, SwiGLU, grouped attention, the MoE router and its experts (module docstring)."""
    F = torch.nn.functional
    bwd = kind.endswith("_bwd")
    if kind.startswith("rms_norm"):
        rows, dim = shape["rows"], shape["dim"]
        x = rand(rows, dim, requires_grad=bwd and bool(shape["input_grad"]))
        gamma = rand(dim, requires_grad=bwd)
        return _forward_or_grad(torch, lambda: F.rms_norm(x, (dim,), gamma, 1e-5),
                                ((x,) if bwd and shape["input_grad"] else ()) + (gamma,), bwd, sync,
                                "F.rms_norm (nn.RMSNorm's)")
    if kind.startswith("rotary"):
        b, t, h, kv, s = shape["batch"], shape["steps"], shape["heads"], shape["kv_heads"], shape["head_size"]
        q, k = rand(b, h, t, s, requires_grad=bwd), rand(b, kv, t, s, requires_grad=bwd)
        angle = torch.outer(torch.arange(t, dtype=torch.float32),
                            10000.0 ** (-torch.arange(0, s, 2, dtype=torch.float32) / s)).to(device)
        cos, sin = (f(torch.cat([angle, angle], dim=-1)).to(q.dtype) for f in (torch.cos, torch.sin))

        def rotate(u):
            return u * cos + torch.cat([-u[..., s // 2:], u[..., :s // 2]], dim=-1) * sin

        return _forward_or_grad(torch, lambda: (rotate(q), rotate(k)), (q, k), bwd, sync,
                                "t * cos + rotate_half(t) * sin on q and k (LlamaAttention's)")
    if kind.startswith("swiglu"):
        rows, dim, hidden = shape["rows"], shape["dim"], shape["hidden"]
        nn = torch.nn
        gate, up, down = (nn.Linear(i, o, bias=False).to(device=device, dtype=dtype)
                          for i, o in ((dim, hidden), (dim, hidden), (hidden, dim)))
        x = rand(rows, dim, requires_grad=bwd and bool(shape["input_grad"]))
        inputs = ((x,) if bwd and shape["input_grad"] else ()) + (gate.weight, up.weight, down.weight)
        return _forward_or_grad(torch, lambda: down(F.silu(gate(x)) * up(x)), inputs, bwd, sync,
                                "down(F.silu(gate(x)) * up(x)), nn.Linear without bias (LlamaMLP's)")
    if kind.startswith("grouped_attention"):
        b, h, kv, t, s = shape["batch"], shape["heads"], shape["kv_heads"], shape["steps"], shape["head_size"]
        causal = bool(shape["causal"])
        q = rand(b, h, t, s, requires_grad=bwd)
        k, v = rand(b, kv, t, s, requires_grad=bwd), rand(b, kv, t, s, requires_grad=bwd)
        sdpa = F.scaled_dot_product_attention

        def attend():
            return sdpa(q, k, v, is_causal=causal, enable_gqa=kv != h)

        kernel = _forward_or_grad(torch, attend, (q, k, v), bwd, sync,
                                  "F.scaled_dot_product_attention(enable_gqa=True)")
        kernel.settings["operator"] = _sdpa_operator(torch, attend)
        return kernel
    if kind.startswith("moe_router"):
        rows, dim, experts, top = shape["rows"], shape["dim"], shape["experts"], shape["top_k"]
        x = rand(rows, dim, requires_grad=bwd)
        weight = rand(experts, dim, requires_grad=bwd)

        def route():
            p = torch.softmax(F.linear(x.float(), weight.float()), dim=-1)
            chosen = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :top]
            picked = p.gather(1, chosen)
            return picked / picked.sum(dim=-1, keepdim=True)

        return _forward_or_grad(torch, route, (x, weight), bwd, sync,
                                "float32 F.linear, softmax, stable sort top-k, renormalised (MixtralSparseMoeBlock's)")
    tokens, dim, hidden, experts, top = (shape["tokens"], shape["dim"], shape["hidden"], shape["experts"],
                                         shape["top_k"])
    x = rand(tokens, dim, requires_grad=bwd)
    gate, up = rand(experts, hidden, dim, requires_grad=bwd), rand(experts, hidden, dim, requires_grad=bwd)
    down = rand(experts, dim, hidden, requires_grad=bwd)
    chosen = ((torch.arange(tokens)[:, None] * top + torch.arange(top)[None, :]) % experts).to(device)
    weights = torch.full((tokens, top), 1.0 / top, dtype=dtype, device=device, requires_grad=bwd)

    def experts_forward():
        out = torch.zeros_like(x)
        for e in range(experts):
            token, rank = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            h = x.index_select(0, token)
            y = F.linear(F.silu(F.linear(h, gate[e])) * F.linear(h, up[e]), down[e])
            out = out.index_add(0, token, y * weights[token, rank, None])
        return out

    kernel = _forward_or_grad(torch, experts_forward, (x, gate, up, down, weights), bwd, sync,
                              "a loop over the experts: index_select, F.linear SwiGLU, weighted index_add "
                              "(MixtralSparseMoeBlock's)")
    kernel.settings["routing"] = "token t to experts (t*k + j) mod E, weights 1/k"
    return kernel


def _forward_or_grad(torch, forward, inputs: tuple, backward: bool, sync, op: str) -> Kernel:
    """The forward under no_grad, or autograd.grad of its output(s) for `inputs`, the graph kept."""
    if not backward:
        def run():
            with torch.no_grad():
                forward()

        return Kernel(run, sync, {"op": op})
    out = forward()
    outs = out if isinstance(out, tuple) else (out,)
    grads = tuple(torch.randn_like(o) for o in outs)
    return Kernel(lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True), sync,
                  {"op": f"autograd.grad of {op}"})
