"""A resolved network at a batch size, broken into the work of one iteration: per layer, its forward
and backward operations, and the update.

Each `Op` is either a kernel (`KernelSpec`: a GEMM, a convolution, an LSTM step) whose time a
machine profile may hold as measured, or memory-bound element-wise work (activations, batch norm,
pooling, the loss, the optimiser) that the model estimates from its bytes and FLOPs. Counts follow
definitions/analysis.py (a multiply-add is 2 FLOPs); bytes are what each operation must read and
write at the least, `E` bytes per element (float32: 4):

- dense on M = batch x positions rows, K inputs, N units: forward GEMM (M, N, K) plus the bias added
  over the output (one pass); backward the input gradient GEMM (M, K, N), the weight gradient GEMM
  (K, N, M) and the bias gradient (a reduction over the output gradient).
- conv2d: the forward and backward convolution kernels at its shape (a bias is fused into the
  convolution, as oneDNN and cuDNN do; its gradient is one reduction over the output gradient).
- relu, sigmoid, tanh: forward reads x and writes y (2 passes); backward reads y and dy, writes dx (3).
- batch_norm: training forward reads x twice (statistics, then normalise) and writes y (3 passes),
  inference 2; backward reads x and dy twice and writes dx (5).
- max_pool, avg_pool, global_avg_pool: forward reads the input and writes the output; backward
  reads dy and writes dx, which it first clears (dx counted twice).
- dropout: training forward reads x, writes y and the mask (3), backward reads dy and the mask and
  writes dx (3); inference: nothing. flatten: nothing (a view).
- embedding: forward gathers batch x steps rows (read and write); backward clears the table's
  gradient and adds the rows into it.
- lstm: per stacked layer, the whole layer's forward (backward) as an `lstm_layer` kernel, else
  `steps` forward (backward) steps of its cell as `lstm_step` kernels.
- residual blocks: their convolutions, batch norms and relus as above; the join adds two tensors
  (3 passes) before the last relu; option-A shortcuts copy a strided slice into a zero-padded
  output; the backward of the join sends dy to both branches, and the two gradients meet again at
  the block's input (3 passes).
- softmax cross-entropy over the logits (after the last layer, training only): the
  `softmax_xent_fwd` and `softmax_xent_bwd` kernels (forward 3 passes: max, sum of exponentials,
  log-probabilities; backward 2).
- update, SGD with momentum: an `sgd_momentum` kernel over each layer's parameters (per parameter
  read w, g, m and write w, m at the least: 5 passes, 4 FLOPs; how many passes a framework's
  optimiser really makes is what measuring it tells).

A layer computes the gradient of its input only when a trainable layer precedes it: the first
convolution or dense layer of a network computes its weight gradient only, as every framework does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .kernels import KernelSpec

ELEMENT_BYTES = 4  # activations, gradients and weights are float32 (mixed precision: see `dtype`)


@dataclass(frozen=True)
class Op:
    """One operation of one layer in one phase: a kernel the profile may have measured, or
    element-wise work estimated from `flops` and `bytes` (each per execution)."""

    label: str
    flops: float
    bytes: float
    kernel: KernelSpec | None = None
    repeat: int = 1  # executions per iteration
    # when `kernel` was not measured: other kernels doing the same work, each with its count (a
    # fused LSTM layer is also its steps); the first one measured stands in for it
    alternatives: tuple[tuple[KernelSpec, int], ...] = ()


@dataclass
class LayerWork:
    index: int  # position in the resolved network's layers; the loss comes after the last one
    label: str
    params: int  # trainable parameters (their gradient is what data-parallel training exchanges)
    forward: list[Op] = field(default_factory=list)
    backward: list[Op] = field(default_factory=list)
    update: list[Op] = field(default_factory=list)


@dataclass
class Workload:
    network: str
    batch: int
    mode: str  # train | infer
    dtype: str  # of the kernels (float32, or the compute type of mixed precision)
    layers: list[LayerWork]
    input_bytes_per_sample: int  # one sample's input and label, as a data path carries them

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _passes(label: str, elements: int, passes: int, flops_per_element: float = 1.0) -> Op:
    return Op(label, flops_per_element * elements, passes * ELEMENT_BYTES * elements)


class _Builder:
    """Collects one layer's operations."""

    def __init__(self, batch: int, dtype: str, train: bool):
        self.batch, self.dtype, self.train = batch, dtype, train

    def conv(self, work: LayerWork, name: str, in_shape, filters, kernel, stride, padding, input_grad, bias):
        c, h, w = in_shape
        spec = dict(batch=self.batch, channels=c, height=h, width=w, filters=filters, kh=kernel[0], kw=kernel[1],
                    sh=stride[0], sw=stride[1], ph=padding[0], pw=padding[1])
        fwd = KernelSpec.of("conv2d_fwd", self.dtype, **spec)
        work.forward.append(Op(f"{name} conv", fwd.flops, fwd.bytes, fwd))
        ho = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
        wo = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
        out = (filters, ho, wo)
        if self.train:
            bwd = KernelSpec.of("conv2d_bwd", self.dtype, input_grad=int(input_grad), **spec)
            work.backward.append(Op(f"{name} conv", bwd.flops, bwd.bytes, bwd))
            if bias:
                work.backward.append(_passes(f"{name} bias grad", self.batch * _numel(out), 1))
        return out

    def batch_norm(self, work: LayerWork, name: str, shape):
        n = self.batch * _numel(shape)
        work.forward.append(_passes(f"{name} batch norm", n, 3 if self.train else 2, 2))
        if self.train:
            work.backward.append(_passes(f"{name} batch norm", n, 5, 4))

    def activation(self, work: LayerWork, name: str, shape):
        n = self.batch * _numel(shape)
        work.forward.append(_passes(name, n, 2))
        if self.train:
            work.backward.append(_passes(name, n, 3))


def _residual(b: _Builder, work: LayerWork, spec: dict, input_grad: bool) -> None:
    cin, h, w = spec["in_shape"]
    cout = spec["out_shape"][0]
    f, s = spec["filters"], spec["stride"]
    shape = (cin, h, w)
    if spec["block"] == "basic":
        plan = [(f, 3, s, 1, True), (f, 3, 1, 1, False)]
    else:
        plan = [(f, 1, 1, 0, True), (f, 3, s, 1, True), (cout, 1, 1, 0, False)]
    for j, (filters, k, stride, pad, relu) in enumerate(plan, start=1):
        # every convolution of a block needs its input gradient, except the first one's when the
        # block's input needs none (never in the shipped networks: a block follows a convolution)
        shape = b.conv(work, f"conv{j}", shape, filters, (k, k), (stride, stride), (pad, pad),
                       input_grad or j > 1, bias=False)
        b.batch_norm(work, f"bn{j}", shape)
        if relu:
            b.activation(work, f"relu{j}", shape)
    n_out = b.batch * _numel(shape)
    n_in = b.batch * cin * h * w
    if spec["shortcut"] == "projection":
        proj = b.conv(work, "projection", (cin, h, w), cout, (1, 1), (s, s), (0, 0), input_grad, bias=False)
        b.batch_norm(work, "projection", proj)
    elif spec["shortcut"] == "option_a":
        work.forward.append(_passes("option-A shortcut", n_out, 2, 0))
        if b.train and input_grad:
            work.backward.append(Op("option-A shortcut", 0, ELEMENT_BYTES * (n_in + n_out)))
    work.forward.append(_passes("join", n_out, 3))
    b.activation(work, "relu", shape)
    if b.train and input_grad:
        work.backward.append(_passes("join gradient", n_in, 3))


def decompose(network: dict, batch: int, mode: str, precision: str = "float32") -> Workload:
    """The work of one iteration of `network` (resolved, see definitions/analysis.py) at `batch`."""
    dtype = {"amp_fp16": "float16", "amp_bf16": "bfloat16"}.get(precision, "float32")
    train = mode == "train"
    b = _Builder(batch, dtype, train)
    layers: list[LayerWork] = []
    trainable_before = False
    for i, spec in enumerate(network["layers"]):
        t = spec["type"]
        in_shape = tuple(spec["in_shape"])
        out_shape = tuple(spec["out_shape"])
        work = LayerWork(i, f"{i:03d} {t}", 0)
        input_grad = trainable_before
        if t == "dense":
            positions = in_shape[0] if len(in_shape) == 2 else 1
            m, k, n = batch * positions, in_shape[-1], spec["units"]
            work.params = k * n + (n if spec["bias"] else 0)
            fwd = KernelSpec.of("matmul", dtype, m=m, n=n, k=k)
            work.forward.append(Op("matmul", fwd.flops, fwd.bytes, fwd))
            if spec["bias"]:
                work.forward.append(_passes("bias", m * n, 1))
            if train:
                if input_grad:
                    dx = KernelSpec.of("matmul", dtype, m=m, n=k, k=n)
                    work.backward.append(Op("input gradient", dx.flops, dx.bytes, dx))
                dw = KernelSpec.of("matmul", dtype, m=k, n=n, k=m)
                work.backward.append(Op("weight gradient", dw.flops, dw.bytes, dw))
                if spec["bias"]:
                    work.backward.append(_passes("bias gradient", m * n, 1))
        elif t == "conv2d":
            c = in_shape[0]
            kh, kw = spec["kernel"]
            work.params = kh * kw * c * spec["filters"] + (spec["filters"] if spec["bias"] else 0)
            b.conv(work, "", in_shape, spec["filters"], spec["kernel"], spec["stride"], spec["padding"],
                   input_grad, spec["bias"])
        elif t in ("max_pool", "avg_pool", "global_avg_pool"):
            n_in, n_out = batch * _numel(in_shape), batch * _numel(out_shape)
            window = spec["size"][0] * spec["size"][1] if t != "global_avg_pool" else 1
            work.forward.append(Op(t, window * n_out if t != "global_avg_pool" else n_in,
                                   ELEMENT_BYTES * (n_in + n_out)))
            if train and input_grad:
                work.backward.append(Op(t, n_in, ELEMENT_BYTES * (n_out + 2 * n_in)))
        elif t == "batch_norm":
            work.params = 2 * in_shape[0]
            b.batch_norm(work, "", in_shape)
        elif t in ("relu", "sigmoid", "tanh"):
            work.forward.append(_passes(t, batch * _numel(in_shape), 2))
            if train and input_grad:
                work.backward.append(_passes(t, batch * _numel(in_shape), 3))
        elif t == "dropout":
            if train:
                n = batch * _numel(in_shape)
                work.forward.append(_passes("dropout", n, 3))
                if input_grad:
                    work.backward.append(_passes("dropout", n, 3))
        elif t == "flatten":
            pass
        elif t == "embedding":
            work.params = spec["vocabulary"] * spec["dim"]
            rows = batch * _numel(out_shape[:-1])
            work.forward.append(_passes("gather", rows * spec["dim"], 2, 0))
            if train:
                table = spec["vocabulary"] * spec["dim"]
                work.backward.append(Op("scatter-add", rows * spec["dim"],
                                        ELEMENT_BYTES * (table + 2 * rows * spec["dim"])))
        elif t == "lstm":
            steps, fin = in_shape
            h = spec["hidden"]
            for k in range(spec["layers"]):
                layer_in = fin if k == 0 else h
                work.params += 4 * h * (layer_in + h) + 4 * h
                for phase, ops in (("fwd", work.forward), ("bwd", work.backward if train else None)):
                    if ops is None:
                        continue
                    whole = KernelSpec.of(f"lstm_layer_{phase}", dtype, batch=batch, steps=steps, input=layer_in,
                                          hidden=h)
                    step = KernelSpec.of(f"lstm_step_{phase}", dtype, batch=batch, input=layer_in, hidden=h)
                    ops.append(Op(f"layer {k}", whole.flops, whole.bytes, whole, alternatives=((step, steps),)))
        elif t == "residual":
            work.label = f"{i:03d} residual {spec['block']} {spec['filters']}/{spec['stride']}"
            cin, cout, f = spec["in_shape"][0], spec["out_shape"][0], spec["filters"]
            if spec["block"] == "basic":
                convs = 9 * cin * f + 9 * f * f
                bns = 2 * f + 2 * f
            else:
                convs = cin * f + 9 * f * f + f * cout
                bns = 2 * f + 2 * f + 2 * cout
            if spec["shortcut"] == "projection":
                convs += cin * cout
                bns += 2 * cout
            work.params = convs + bns
            _residual(b, work, spec, input_grad)
        else:
            raise ValueError(f"the performance model does not know layer type {t!r}")
        if train and work.params:
            update = KernelSpec.of("sgd_momentum", "float32", elements=work.params)
            work.update.append(Op("SGD momentum", update.flops, update.bytes, update))
        trainable_before = trainable_before or work.params > 0
        layers.append(work)
    if train:
        out_shape = network["layers"][-1]["out_shape"]
        rows, classes = batch * _numel(out_shape[:-1]), out_shape[-1]
        loss = LayerWork(len(network["layers"]), "loss softmax cross-entropy", 0)
        fwd = KernelSpec.of("softmax_xent_fwd", "float32", rows=rows, classes=classes)
        bwd = KernelSpec.of("softmax_xent_bwd", "float32", rows=rows, classes=classes)
        loss.forward.append(Op("softmax cross-entropy", fwd.flops, fwd.bytes, fwd))
        loss.backward.append(Op("softmax cross-entropy", bwd.flops, bwd.bytes, bwd))
        layers.append(loss)
    inp = network["input"]
    if inp["kind"] == "tokens":  # int64 ids in, int64 next-token labels
        input_bytes = 2 * 8 * inp["sequence_length"]
    else:  # float32 features, an int64 class
        input_bytes = ELEMENT_BYTES * _numel(inp["shape"]) + 8
    return Workload(network["name"], batch, mode, dtype, layers, input_bytes)


def kernel_specs(workload: Workload) -> list[KernelSpec]:
    """Every distinct kernel of an iteration, in the order the iteration first meets it."""
    seen: dict[str, KernelSpec] = {}
    for layer in workload.layers:
        for op in layer.forward + layer.backward + layer.update:
            for kernel in ([op.kernel] if op.kernel is not None else []) + [k for k, _ in op.alternatives]:
                seen.setdefault(kernel.key, kernel)
    return list(seen.values())
