"""A resolved network at a batch size, broken into the work of one iteration: per layer, its forward
and backward operations, and the update.

Each `Op` is either a kernel (`KernelSpec`: a GEMM, a convolution, an LSTM layer, attention's core, a
layer norm, a batch norm in training, a GELU, a pooling, the loss, the optimiser) whose time a
machine profile may hold as measured, or memory-bound element-wise work (activations, joins, an
inference batch norm) that the model estimates from its bytes and FLOPs; a kernel may name other kernels that do its work (`alternatives`) or the
operations it is made of (`parts`), which stand in for it when it was not measured. Counts follow
definitions/network.py (a multiply-add is 2 FLOPs); bytes are what each operation must read and
write at the least, `E` bytes per element (float32: 4):

- dense on M = batch x positions rows, K inputs, N units: forward GEMM (M, N, K) plus the bias added
  over the output (one pass); backward the `dense_bwd` kernel (batch, positions, K, N), the layer's
  backward as the framework's autodiff runs it, made of (where not measured) the input gradient
  GEMM (M, K, N), the weight gradient GEMM (K, N, M) and the bias gradient (a reduction over the
  output gradient). The same products alone are not always the same time: XLA's CPU step lays the
  gradients of a dense layer over a sequence out for the step, and runs LSTM-32's classifier weight
  gradient at 2x the time of the matmul of its shape timed alone.
- conv2d: the forward and backward convolution kernels at its shape (a bias is fused into the
  convolution, as oneDNN and cuDNN do; its gradient is one reduction over the output gradient).
- relu, sigmoid, tanh: forward reads x and writes y (2 passes); backward reads y and dy, writes dx (3).
- batch_norm: in training the `batch_norm_fwd` kernel (batch, channels, height, width; a flat input
  is 1 x 1: x read twice, for the statistics then to normalise, y written, 3 passes) and
  `batch_norm_bwd` (x and dy read twice, dx written: 5; without an input gradient 3), each made of
  those passes where it was not measured; at inference a scale and shift (2 passes, an epilogue).
- max_pool, avg_pool, global_avg_pool: the `pool2d_fwd` kernel (the input read, the output written;
  a global average is the window of the whole map) and `pool2d_bwd` (dy read, dx cleared then
  written: dx counted twice).
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
- position_embedding: forward reads x and the table's rows, writes y; backward sums dy over the
  batch into the table's gradient (the input's gradient is dy itself). patch_embedding: its
  convolution (as conv2d, with bias), the patches copied into tokens behind the class token, and
  back in the backward pass. token_pool: a copy of row 0 (class) or a mean over the rows, and
  their gradients.
- layer_norm: the `layer_norm_fwd` kernel (rows, dim: x read twice, y written, 3 passes, in inference
  too) and `layer_norm_bwd` (x and dy read twice, dx written: 5; without an input gradient 3).
  gelu: the `gelu_fwd` kernel in the layer's form (2 passes, 8 FLOPs per element) and `gelu_bwd`
  (3 passes, 16).
- attention: the q, k, v and out projections as dense layers (`matmul` kernels, forward, input and
  weight gradients); the heads' core as the `attention_fwd` kernel (its dropout on the
  probabilities in training only) and `attention_bwd`, whose parts, where the fused kernel was not
  measured, are what an unfused framework runs: forward the scores q k^T and the weighted sum p v
  as `batched_matmul` kernels (batch x heads products) around the softmax (2 passes) and the
  dropout (3), backward the four products of the gradients (dp, dv, dq, dk), the dropout's and the
  softmax's gradients (3 passes each).
- transformer_block: its layer norms, attention and MLP (fc1, gelu, fc2 as above) and, per residual
  join, the branch's dropout (training, rate not 0), the addition (3 passes) and in the backward
  the two gradients meeting again (3). lm_head: a dense layer without its own weight when tied (the
  weight gradient is still computed, and added into the embedding's: 3 passes over the table).
- the decoders' layers (definitions/layers/rms_norm.py, rotary.py, swiglu.py, grouped_attention.py,
  moe.py, llama_block.py): `rms_norm_fwd`/`_bwd`, `rotary_fwd`/`_bwd` on queries and keys,
  `swiglu_fwd`/`_bwd` for the whole MLP, `grouped_attention_fwd`/`_bwd` for the heads' core (the q,
  k, v and out projections dense layers as above), and for an MoE layer `moe_router_fwd`/`_bwd` and
  `moe_experts_fwd`/`_bwd`; each made of, where not measured, the operations the layer is counted
  as unfused (element-wise passes; the dense products; attention's batched products; the tokens'
  dispatch, the experts' products over the routed rows and the weighted combine).
- softmax cross-entropy over the logits (after the last layer, training only): the
  `softmax_xent_fwd` and `softmax_xent_bwd` kernels (forward 3 passes: max, sum of exponentials,
  log-probabilities; backward 2).
- update, SGD with momentum: an `sgd_momentum` kernel over each layer's parameters (per parameter
  read w, g, m and write w, m at the least: 5 passes, 4 FLOPs; how many passes a framework's
  optimiser really makes is what measuring it tells).

A layer computes the gradient of its input only when a trainable layer precedes it: the first
convolution or dense layer of a network computes its weight gradient only, as every framework does.

Each layer type's operations are the `work` function of its module in definitions/layers/, given
this module's builder (`_Builder`, the `Work` protocol there); the list above is what they build.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..axes import Precision

from ..definitions import layers as layer_table
from ..definitions.weights import layer_shapes, trainable_count
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
    # when neither `kernel` nor an alternative was measured: the operations the same work is made of
    # where a framework does not fuse it (attention: two batched products around the softmax), each
    # timed as any operation is (measured, or its roofline); their sum stands in for it
    parts: tuple[Op, ...] = ()
    # element-wise work on a matrix product's or convolution's output that a graph optimiser can
    # compute in that kernel's epilogue, while the output is still in registers: a bias, an
    # activation, a residual addition, a batch norm at inference (its statistics are constants);
    # model.predict charges none where the framework fuses epilogues (FrameworkFacts.epilogues)
    epilogue: bool = False


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
    precision: str = "fp32"  # the run's (dlbench.axes.Precision): tf32 computes float32 products at the TF32 rate

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _passes(label: str, elements: int, passes: int, flops_per_element: float = 1.0, epilogue: bool = False) -> Op:
    return Op(label, flops_per_element * elements, passes * ELEMENT_BYTES * elements, epilogue=epilogue)


class _Builder:
    """What a layer type's `work` function (definitions/layers/) builds its operations with: the
    `Work` protocol of definitions/layers/base.py."""

    element_bytes = ELEMENT_BYTES

    def __init__(self, batch: int, dtype: str, train: bool):
        self.batch, self.dtype, self.train = batch, dtype, train

    def op(self, label: str, flops: float, bytes: float) -> Op:
        return Op(label, flops, bytes)

    def passes(self, label: str, elements: int, passes: int, flops_per_element: float = 1.0,
               epilogue: bool = False) -> Op:
        return _passes(label, elements, passes, flops_per_element, epilogue)

    def kernel(self, label: str, kind: str, alternatives: tuple = (), parts: tuple = (), epilogue: bool = False,
               **shape) -> Op:
        spec = KernelSpec.of(kind, self.dtype, **shape)
        others = tuple((KernelSpec.of(k, self.dtype, **s), count) for k, count, s in alternatives)
        return Op(label, spec.flops, spec.bytes, spec, alternatives=others, parts=tuple(parts), epilogue=epilogue)

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

    def batch_norm(self, work: LayerWork, name: str, shape, input_grad: bool = True):
        n = self.batch * _numel(shape)
        label = f"{name} batch norm".strip()
        if not self.train:  # the statistics are constants: a scale and shift, a convolution's epilogue
            work.forward.append(_passes(label, n, 2, 2, epilogue=True))
            return
        # training normalises by the batch's own statistics (a reduction first): no epilogue; the
        # kernels, and where none was measured the passes they make at the least
        c, h, w = (tuple(shape) + (1, 1))[:3]
        image = dict(batch=self.batch, channels=c, height=h, width=w)
        work.forward.append(self.kernel(label, "batch_norm_fwd", parts=(_passes(label, n, 3, 2),), **image))
        work.backward.append(self.kernel(label if input_grad else f"{label} parameter gradient", "batch_norm_bwd",
                                         parts=(_passes(label, n, 5 if input_grad else 3, 4),),
                                         input_grad=int(input_grad), **image))

    def activation(self, work: LayerWork, name: str, shape):
        n = self.batch * _numel(shape)
        work.forward.append(_passes(name, n, 2, epilogue=True))
        if self.train:
            work.backward.append(_passes(name, n, 3))


def decompose(network: dict, batch: int, mode: str, precision: str = "fp32") -> Workload:
    """The work of one iteration of `network` (resolved, see definitions/network.py) at `batch`: each
    layer's operations by the `work` of its type in the layer table (definitions/layers/), its
    trainable parameters (and so its update) from its canonical weights (definitions/weights.py)."""
    dtype = Precision(precision).compute_dtype
    train = mode == "train"
    b = _Builder(batch, dtype, train)
    layers: list[LayerWork] = []
    trainable_before = False
    for i, spec in enumerate(network["layers"]):
        t = spec["type"]
        try:
            entry = layer_table.lookup(t)
        except ValueError:
            raise ValueError(f"the performance model does not know layer type {t!r}") from None
        work = LayerWork(i, f"{i:03d} {t}", trainable_count(layer_shapes(i, spec)))
        entry.work(b, work, spec, trainable_before)
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
    elif inp["kind"] == "masked_tokens":  # int64 ids in; the masked positions' labels and the next-sentence one
        input_bytes = 8 * (inp["sequence_length"] + len(inp["masked_positions"]) + 1)
    else:  # float32 features, an int64 class
        input_bytes = ELEMENT_BYTES * _numel(inp["shape"]) + 8
    return Workload(network["name"], batch, mode, dtype, layers, input_bytes, precision)


def op_kernels(op: Op) -> list[KernelSpec]:
    """The kernels one operation may be timed by: its own, its alternatives', its parts' (in that order)."""
    out = ([op.kernel] if op.kernel is not None else []) + [k for k, _ in op.alternatives]
    for part in op.parts:
        out += op_kernels(part)
    return out


def op_kernel_uses(op: Op, times: int = 1) -> Counter[str]:
    """Executions per iteration of each kernel an operation may be timed by (op_kernels): its own and
    its alternatives' as often as each would run for it, its parts' as often as they run in it."""
    runs = times * op.repeat
    out: Counter[str] = Counter()
    for kernel, count in ([(op.kernel, 1)] if op.kernel is not None else []) + list(op.alternatives):
        out[kernel.key] += runs * count
    for part in op.parts:
        out.update(op_kernel_uses(part, runs))
    return out


def kernel_uses(workload: Workload) -> Counter[str]:
    """Executions per iteration of each kernel of `workload` (op_kernel_uses, summed over its operations)."""
    out: Counter[str] = Counter()
    for layer in workload.layers:
        for op in layer.forward + layer.backward + layer.update:
            out.update(op_kernel_uses(op))
    return out


def kernel_specs(workload: Workload) -> list[KernelSpec]:
    """Every distinct kernel of an iteration, in the order the iteration first meets it."""
    seen: dict[str, KernelSpec] = {}
    for layer in workload.layers:
        for op in layer.forward + layer.backward + layer.update:
            for kernel in op_kernels(op):
                seen.setdefault(kernel.key, kernel)
    return list(seen.values())
