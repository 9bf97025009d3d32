"""attention: multi-head self-attention over a (T, D) sequence (the semantics in schema.py).

Its counts, tensors and operations are functions of plain numbers (`head_size`, `counts`, `tensors`,
`products`), which transformer_block reuses for its own attention."""

from __future__ import annotations

from .. import schema
from . import dense
from .base import Inferred, LayerType, ShapeError, Site, resolved_entry

# per score element: the 1/sqrt(S) scale, the max subtracted, the exponential, the sum and the
# division; the causal mask is a select and is not counted (a causal layer computes and masks the
# whole T x T product, as frameworks do), nor is dropout (as the dropout layer's)
SOFTMAX_FLOPS = 5


def head_size(index: int, dim: int, heads: int, given: int | None) -> int:
    """The head size: as given, else dim / heads, which must divide."""
    if given is not None:
        return given
    if dim % heads:
        raise ShapeError(index, f"{heads} heads do not divide the width {dim}; give head_size")
    return dim // heads


def counts(steps: int, dim: int, heads: int, size: int, bias: bool) -> tuple[int, int]:
    """(params, forward FLOPs per sample): the q, k, v and out projections as dense layers, per head
    2*T*T*S for the scores q k^T and again for the weighted sum p v, SOFTMAX_FLOPS per score."""
    inner = heads * size
    qkv_params, qkv_flops = dense.counts(steps, dim, inner, bias)
    out_params, out_flops = dense.counts(steps, inner, dim, bias)
    products = 2 * (2 * steps * steps * size) * heads
    softmax = SOFTMAX_FLOPS * heads * steps * steps
    return 3 * qkv_params + out_params, 3 * qkv_flops + products + softmax + out_flops


def tensors(prefix: str, dim: int, heads: int, size: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """q, k, v: weight (H*S, D) [rows head-major], bias (H*S); out: weight (D, H*S), bias (D)."""
    inner = heads * size
    out = {}
    for part in ("q", "k", "v"):
        out.update(dense.tensors(f"{prefix}.{part}", dim, inner, bias))
    out.update(dense.tensors(f"{prefix}.out", inner, dim, bias))
    return out


def require_sequence(site: Site, layer_type: str) -> tuple[int, int]:
    if len(site.shape) != 2:
        raise site.error(f"{layer_type} needs a sequence (T, D) input, got {list(site.shape)}")
    return site.shape


def infer(layer: schema.Attention, site: Site) -> Inferred:
    steps, dim = require_sequence(site, "attention")
    size = head_size(site.index, dim, layer.heads, layer.head_size)
    params, flops = counts(steps, dim, layer.heads, size, layer.bias)
    return Inferred(site.shape, params, flops, [resolved_entry(layer, site.shape, site.shape, head_size=size)])


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1], entry["heads"], entry["head_size"], entry["bias"])


def dropout_thousandths(rate: float) -> int:
    """The attention kernels' `dropout` shape parameter (kernel shapes are integers): the rate in
    thousandths."""
    return int(round(1000 * rate))


def products(b, layer, name: str, steps: int, dim: int, heads: int, size: int, bias: bool,
             dropout: float, input_grad: bool, causal: bool = False) -> None:
    """One attention's operations at the workload's batch. The projections are `matmul` kernels
    (forward, input and weight gradients, as dense layers). The heads' core, scores, softmax and
    weighted sum, is one `attention_fwd` kernel (backward `attention_bwd`), as each framework's
    attention call computes it; its dropout on the probabilities is there in training only, when
    its rate is not 0 (torch, Keras and flax return the input itself at rate 0). Where that kernel
    was not measured, its parts stand in for it: the two batched products per head, the scores
    q k^T and the weighted sum p v (`batched_matmul` kernels over batch x heads), the softmax
    reading the scores and writing the probabilities (2 passes; scale and mask fused into it, as
    the frameworks' attention paths do), the dropout (3); backward dp = da v^T and dv = p^T da,
    the dropout's gradient (3), the softmax's (reads p and dp, writes ds: 3), dq = ds k, dk = ds^T q."""
    inner = heads * size
    rows = b.batch * steps
    scores = b.batch * heads * steps * steps  # elements of the score (and probability) tensors
    pairs = b.batch * heads
    rate = dropout_thousandths(dropout) if b.train else 0
    core = dict(batch=b.batch, heads=heads, steps=steps, head_size=size, causal=int(causal), dropout=rate)

    def label(what: str) -> str:
        return f"{name} {what}" if name else what

    for part in ("q", "k", "v"):
        dense.products(b, layer, label(part), steps, dim, inner, bias, input_grad)
    forward = [b.kernel(label("scores q k^T"), "batched_matmul", batch=pairs, m=steps, n=steps, k=size),
               b.passes(label("softmax"), scores, 2, SOFTMAX_FLOPS)]
    if rate:
        forward.append(b.passes(label("attention dropout"), scores, 3))
    forward.append(b.kernel(label("weighted sum p v"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps))
    layer.forward.append(b.kernel(label("attention"), "attention_fwd", parts=tuple(forward), **core))
    dense.products(b, layer, label("out"), steps, inner, dim, bias, input_grad=True)
    if b.train:
        backward = [b.kernel(label("dp = da v^T"), "batched_matmul", batch=pairs, m=steps, n=steps, k=size),
                    b.kernel(label("dv = p^T da"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps)]
        if rate:
            backward.append(b.passes(label("attention dropout"), scores, 3))
        backward += [b.passes(label("softmax gradient"), scores, 3, SOFTMAX_FLOPS),
                     b.kernel(label("dq = ds k"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps),
                     b.kernel(label("dk = ds^T q"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps)]
        layer.backward.append(b.kernel(label("attention"), "attention_bwd", parts=tuple(backward), **core))
        if input_grad:  # the three projections' input gradients meet at x
            layer.backward.append(b.passes(label("q k v gradient sum"), rows * dim, 4, 2))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    products(b, layer, "", steps, dim, entry["heads"], entry["head_size"], entry["bias"], entry["dropout"],
             input_grad, causal=entry["causal"])


# Products in sequence: the q (or k, v) projection, the scores, the weighted sum, the out projection;
# softmax is smooth, so no decision.
LAYER = LayerType(schema.Attention, infer, work, weights, rounding_depth=4, decisions=0)
