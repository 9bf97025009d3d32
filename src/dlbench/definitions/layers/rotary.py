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
    """Element-wise: q and k read, the cos and sin rows read (once per batch), q' and k' written;
    backward the same rotation by the negated angle on dq' and dk'."""
    n = b.batch * steps * (heads + kv_heads) * size
    label = f"{name} rotary".strip()
    layer.forward.append(b.passes(label, n, 2, FLOPS_PER_ELEMENT))
    if b.train:
        layer.backward.append(b.passes(f"{label} gradient", n, 2, FLOPS_PER_ELEMENT))
