"""token_pool: (T, D) -> (D,): `class` takes row 0 (the class token; no FLOPs), `mean` averages
the T rows (one FLOP per element)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site


def infer(layer: schema.TokenPool, site: Site) -> Inferred:
    if len(site.shape) != 2:
        raise site.error(f"token_pool needs a sequence (T, D) input, got {list(site.shape)}")
    steps, dim = site.shape
    return Inferred((dim,), 0, steps * dim if layer.mode == "mean" else 0)


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    n_in, n_out = b.batch * steps * dim, b.batch * dim
    e = b.element_bytes
    if entry["mode"] == "class":
        layer.forward.append(b.passes("class token", n_out, 2, 0))
        if b.train and input_grad:  # dx: zeros but row 0, which is dy
            layer.backward.append(b.op("class token gradient", 0, e * (n_in + n_out)))
    else:
        layer.forward.append(b.op("mean over tokens", n_in, e * (n_in + n_out)))
        if b.train and input_grad:  # dx = dy / T at every row
            layer.backward.append(b.op("mean over tokens gradient", n_in, e * (n_out + n_in)))


LAYER = LayerType(schema.TokenPool, infer, work, rounding_depth=0, decisions=0)
