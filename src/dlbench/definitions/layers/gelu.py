"""gelu: element-wise, the exact erf form or the tanh approximation (schema.py); 8 FLOPs per element
(network.py), whichever the form: the two cost alike next to the products around them."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel

# tanh form: x^3 (2), 0.044715 x^3 + x (2), * sqrt(2/pi) (1), tanh (1), 1 + (1), 0.5 x * (1, the 0.5
# folded); the erf form (x / sqrt 2, erf, 1 +, 0.5 x *) is counted the same so the form does not
# change a network's count
FLOPS_PER_ELEMENT = 8


def infer(layer: schema.Gelu, site: Site) -> Inferred:
    return Inferred(site.shape, 0, FLOPS_PER_ELEMENT * numel(site.shape))


def passes(b, layer, name: str, elements: int, input_grad: bool) -> None:
    """Forward reads x and writes y (2 passes); backward reads x and dy and writes dx (3), the
    derivative recomputed from x (about twice the forward's FLOPs)."""
    label = f"{name} gelu".strip()
    layer.forward.append(b.passes(label, elements, 2, FLOPS_PER_ELEMENT))
    if b.train and input_grad:
        layer.backward.append(b.passes(label, elements, 3, 2 * FLOPS_PER_ELEMENT))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    passes(b, layer, "", b.batch * numel(entry["in_shape"]), input_grad)


LAYER = LayerType(schema.Gelu, infer, work)
