"""grouped_attention: causal self-attention with H query heads sharing KV key/value heads, rotary
position embedding on queries and keys, no biases (schema.py). Its counts, tensors and operations
are functions of plain numbers, which llama_block reuses."""

from __future__ import annotations

from .. import schema
from . import attention, dense, rotary
from .base import Inferred, LayerType, ShapeError, Site, resolved_entry


def check_heads(index: int, heads: int, kv_heads: int, size: int) -> None:
    if heads % kv_heads:
        raise ShapeError(index, f"{kv_heads} key/value heads do not divide the {heads} query heads")
    rotary.require_even(index, size)


def counts(steps: int, dim: int, heads: int, kv_heads: int, size: int) -> tuple[int, int]:
    """(params, forward FLOPs per sample): the q (H*S), k and v (KV*S each) and out projections as
    dense layers without bias, the rotation of q and k, per query head 2*T*T*S for the scores and
    again for the weighted sum (the whole T x T, as attention's count), attention.SOFTMAX_FLOPS per
    score."""
    q_params, q_flops = dense.counts(steps, dim, heads * size, False)
    kv_params, kv_flops = dense.counts(steps, dim, kv_heads * size, False)
    out_params, out_flops = dense.counts(steps, heads * size, dim, False)
    products = 2 * (2 * steps * steps * size) * heads
    softmax = attention.SOFTMAX_FLOPS * heads * steps * steps
    flops = (q_flops + 2 * kv_flops + rotary.flops(steps, heads, kv_heads, size) + products + softmax
             + out_flops)
    return q_params + 2 * kv_params + out_params, flops


def tensors(prefix: str, dim: int, heads: int, kv_heads: int, size: int) -> dict[str, tuple[int, ...]]:
    """q (H*S, D), k and v (KV*S, D) with rows head-major, out (D, H*S): dense layouts."""
    out = dense.tensors(f"{prefix}.q", dim, heads * size, False)
    out.update(dense.tensors(f"{prefix}.k", dim, kv_heads * size, False))
    out.update(dense.tensors(f"{prefix}.v", dim, kv_heads * size, False))
    out.update(dense.tensors(f"{prefix}.out", heads * size, dim, False))
    return out


def infer(layer: schema.GroupedAttention, site: Site) -> Inferred:
    steps, dim = attention.require_sequence(site, "grouped_attention")
    size = attention.head_size(site.index, dim, layer.heads, layer.head_size)
    check_heads(site.index, layer.heads, layer.kv_heads, size)
    params, flops = counts(steps, dim, layer.heads, layer.kv_heads, size)
    return Inferred(site.shape, params, flops, [resolved_entry(layer, site.shape, site.shape, head_size=size)])


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1], entry["heads"], entry["kv_heads"], entry["head_size"])


def products(b, layer, name: str, steps: int, dim: int, heads: int, kv_heads: int, size: int,
             input_grad: bool, causal: bool) -> None:
    """One grouped attention's operations at the workload's batch: the projections as dense layers
    (k and v KV*S wide), the rotation of q and k, and the heads' core as one `grouped_attention_fwd` /
    `grouped_attention_bwd` kernel over the H query heads (the key/value heads each read by H / KV of them),
    its parts where it was not measured as attention.products gives them."""
    rows = b.batch * steps
    scores = b.batch * heads * steps * steps
    pairs = b.batch * heads
    core = dict(batch=b.batch, heads=heads, kv_heads=kv_heads, steps=steps, head_size=size, causal=int(causal))

    def label(what: str) -> str:
        return f"{name} {what}" if name else what

    dense.products(b, layer, label("q"), steps, dim, heads * size, False, input_grad)
    for part in ("k", "v"):
        dense.products(b, layer, label(part), steps, dim, kv_heads * size, False, input_grad)
    rotary.passes(b, layer, name, steps, heads, kv_heads, size)
    forward = (b.kernel(label("scores q k^T"), "batched_matmul", batch=pairs, m=steps, n=steps, k=size),
               b.passes(label("softmax"), scores, 2, attention.SOFTMAX_FLOPS),
               b.kernel(label("weighted sum p v"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps))
    layer.forward.append(b.kernel(label("attention"), "grouped_attention_fwd", parts=forward, **core))
    dense.products(b, layer, label("out"), steps, heads * size, dim, False, input_grad=True)
    if b.train:
        backward = (b.kernel(label("dp = da v^T"), "batched_matmul", batch=pairs, m=steps, n=steps, k=size),
                    b.kernel(label("dv = p^T da"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps),
                    b.passes(label("softmax gradient"), scores, 3, attention.SOFTMAX_FLOPS),
                    b.kernel(label("dq = ds k"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps),
                    b.kernel(label("dk = ds^T q"), "batched_matmul", batch=pairs, m=steps, n=size, k=steps))
        layer.backward.append(b.kernel(label("attention"), "grouped_attention_bwd", parts=backward, **core))
        if input_grad:  # the three projections' input gradients meet at x
            layer.backward.append(b.passes(label("q k v gradient sum"), rows * dim, 4, 2))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    products(b, layer, "", steps, dim, entry["heads"], entry["kv_heads"], entry["head_size"], input_grad,
             entry["causal"])


# Products in sequence: the q (or k, v) projection, the scores, the weighted sum, the out projection;
# rotary is a rotation and softmax smooth, so no decision.
LAYER = LayerType(schema.GroupedAttention, infer, work, weights, rounding_depth=4, decisions=0)
