"""The rotary position embedding (RoFormer; schema.py's docstring): the rotation of queries and keys
by position that grouped_attention and llama_block apply. Not a layer of its own (it acts on q and
k inside attention): its checks, counts and operations, which those two reuse, and its
frequencies, which `runners/common/rotary.py` computes in numpy for every runner."""

from __future__ import annotations

from .base import ShapeError

FLOPS_PER_ELEMENT = 3  # x cos, the rotated half times sin, their sum


def require_even(index: int, head_size: int) -> None:
    if head_size % 2:
        raise ShapeError(index, f"rotary position embedding needs an even head size, got {head_size}")


def flops(steps: int, heads: int, kv_heads: int, size: int) -> int:
    """Forward FLOPs per sample: the rotation of T positions of H query and KV key heads."""
    return FLOPS_PER_ELEMENT * steps * (heads + kv_heads) * size


def passes(b, layer, name: str, steps: int, heads: int, kv_heads: int, size: int) -> None:
    """The `rotary_fwd` kernel (performance/kernels.py), made of, where it was not measured, q and k
    read and q' and k' written (2 passes; the cos and sin rows are one set for the batch); backward
    `rotary_bwd`, the same rotation by the negated angle on dq' and dk'."""
    n = b.batch * steps * (heads + kv_heads) * size
    label = f"{name} rotary".strip()
    shape = dict(batch=b.batch, steps=steps, heads=heads, kv_heads=kv_heads, head_size=size)
    layer.forward.append(b.kernel(label, "rotary_fwd", parts=(b.passes(label, n, 2, FLOPS_PER_ELEMENT),), **shape))
    if b.train:
        gradient = b.passes(f"{label} gradient", n, 2, FLOPS_PER_ELEMENT)
        layer.backward.append(b.kernel(f"{label} gradient", "rotary_bwd", parts=(gradient,), **shape))
