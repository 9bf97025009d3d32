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


def passes(b, layer, name: str, elements: int, input_grad: bool, form: str = "erf") -> None:
    """The `gelu_fwd` kernel in the form given, erf or tanh (reads x and writes y: 2 passes); backward
    `gelu_bwd` (reads x and dy and writes dx: 3), the derivative recomputed from x (about twice the
    forward's FLOPs)."""
    label = f"{name} gelu".strip()
    approximate = int(form == "tanh")
    layer.forward.append(b.kernel(label, "gelu_fwd", elements=elements, approximate=approximate, epilogue=True))
    if b.train and input_grad:
        layer.backward.append(b.kernel(label, "gelu_bwd", elements=elements, approximate=approximate))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    passes(b, layer, "", b.batch * numel(entry["in_shape"]), input_grad, form=entry["form"])


LAYER = LayerType(schema.Gelu, infer, work, rounding_depth=0, decisions=0)
