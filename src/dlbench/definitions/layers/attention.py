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


def products(b, layer, name: str, steps: int, dim: int, heads: int, size: int, bias: bool,
             dropout: float, input_grad: bool) -> None:
    """One attention's operations at the workload's batch. The projections are `matmul` kernels
    (forward, input and weight gradients, as dense layers); the two batched products per head, the
    scores q k^T and the weighted sum p v, and their gradients are `b.op` work from their FLOPs and
    bytes: the kernel suite has no batched-matmul kind yet, so no profile can hold their time.
    The softmax reads the scores and writes the probabilities (2 passes; scale and mask fused into
    it, as the frameworks' attention paths do); its backward reads p and dp and writes ds (3)."""
    e = b.element_bytes
    inner = heads * size
    rows = b.batch * steps
    scores = b.batch * heads * steps * steps  # elements of the score (and probability) tensors
    product_flops = 2 * scores * size  # one (T x S) by (S x T) product per head, or (T x T) by (T x S)

    def label(what: str) -> str:
        return f"{name} {what}" if name else what

    for part in ("q", "k", "v"):
        dense.products(b, layer, label(part), rows, dim, inner, bias, input_grad)
    layer.forward.append(b.op(label("scores q k^T"), product_flops, e * (2 * rows * inner + scores)))
    layer.forward.append(b.passes(label("softmax"), scores, 2, SOFTMAX_FLOPS))
    if b.train and dropout > 0:  # torch, Keras and flax return the input itself at rate 0
        layer.forward.append(b.passes(label("attention dropout"), scores, 3))
    layer.forward.append(b.op(label("weighted sum p v"), product_flops, e * (scores + 2 * rows * inner)))
    dense.products(b, layer, label("out"), rows, inner, dim, bias, input_grad=True)
    if b.train:
        # dp = da v^T and dv = p^T da, then ds from dp, then dq = ds k and dk = ds^T q
        layer.backward.append(b.op(label("weighted sum gradients"), 2 * product_flops,
                                   e * (2 * scores + 4 * rows * inner)))
        if dropout > 0:
            layer.backward.append(b.passes(label("attention dropout"), scores, 3))
        layer.backward.append(b.passes(label("softmax gradient"), scores, 3, SOFTMAX_FLOPS))
        layer.backward.append(b.op(label("scores gradients"), 2 * product_flops,
                                   e * (2 * scores + 4 * rows * inner)))
        if input_grad:  # the three projections' input gradients meet at x
            layer.backward.append(b.passes(label("q k v gradient sum"), rows * dim, 4, 2))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    products(b, layer, "", steps, dim, entry["heads"], entry["head_size"], entry["bias"], entry["dropout"],
             input_grad)


LAYER = LayerType(schema.Attention, infer, work, weights)
