"""swiglu: y = W_down (silu(W_gate x) * (W_up x)), no biases (schema.py), on a sequence (T, D) or a
flat (D,) input. Its counts, tensors and operations are functions of plain numbers, which moe and
llama_block reuse."""

from __future__ import annotations

from .. import schema
from . import dense
from .base import Inferred, LayerType, Site

# per hidden element: silu's sigmoid (exponential, addition, division) and product, then the gate
# times up
FLOPS_PER_HIDDEN = 5


def counts(positions: int, dim: int, hidden: int) -> tuple[int, int]:
    """(params, forward FLOPs per sample) at `positions` steps: three products, no bias."""
    params = 3 * dim * hidden
    return params, positions * (3 * 2 * dim * hidden + FLOPS_PER_HIDDEN * hidden)


def tensors(prefix: str, dim: int, hidden: int) -> dict[str, tuple[int, ...]]:
    """gate and up (hidden, D), down (D, hidden): dense layouts, out x in."""
    return {f"{prefix}.gate.weight": (hidden, dim), f"{prefix}.up.weight": (hidden, dim),
            f"{prefix}.down.weight": (dim, hidden)}


def infer(layer: schema.SwiGLU, site: Site) -> Inferred:
    if len(site.shape) not in (1, 2):
        raise site.error(f"swiglu needs a sequence (T, D) or flat (D,) input, got {list(site.shape)}")
    positions = site.shape[0] if len(site.shape) == 2 else 1
    params, flops = counts(positions, site.shape[-1], layer.hidden)
    return Inferred(site.shape, params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1], entry["hidden"])


def products(b, layer, name: str, positions: int, dim: int, hidden: int, input_grad: bool) -> None:
    """The three products as dense layers (no bias), the gate's silu and the product of the two
    (element-wise: gate and up read, the product written, 3 passes; backward 5)."""
    label = f"{name} ".lstrip() if name else ""
    rows = b.batch * positions
    dense.products(b, layer, f"{label}gate".strip(), positions, dim, hidden, False, input_grad)
    dense.products(b, layer, f"{label}up".strip(), positions, dim, hidden, False, input_grad)
    layer.forward.append(b.passes(f"{label}silu gate".strip(), rows * hidden, 3, FLOPS_PER_HIDDEN,
                                  epilogue=True))
    dense.products(b, layer, f"{label}down".strip(), positions, hidden, dim, False, input_grad=True)
    if b.train:
        layer.backward.append(b.passes(f"{label}silu gate gradient".strip(), rows * hidden, 5, 2 * FLOPS_PER_HIDDEN))
        if input_grad:  # the gate's and up's input gradients meet at x
            layer.backward.append(b.passes(f"{label}gate up gradient sum".strip(), rows * dim, 3))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    shape = entry["in_shape"]
    products(b, layer, "", shape[0] if len(shape) == 2 else 1, shape[-1], entry["hidden"], input_grad)


# two products in sequence (gate or up, then down); silu is smooth, so no decision
LAYER = LayerType(schema.SwiGLU, infer, work, weights, rounding_depth=2, decisions=0)
