"""position_embedding: y = x + P[0:T], the first T rows of a learned (max_length, D) table added to a
(T, D) sequence; 1 FLOP per element (the addition)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site


def infer(layer: schema.PositionEmbedding, site: Site) -> Inferred:
    if len(site.shape) != 2:
        raise site.error(f"position_embedding needs a sequence (T, D) input, got {list(site.shape)}")
    steps, dim = site.shape
    if steps > layer.max_length:
        raise site.error(f"a sequence of {steps} positions does not fit the table's max_length {layer.max_length}")
    return Inferred(site.shape, layer.max_length * dim, steps * dim)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (entry["max_length"], entry["in_shape"][-1])}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    n = b.batch * steps * dim
    e = b.element_bytes
    # x and the table's rows read, y written; the rows are one set for the whole batch
    layer.forward.append(b.op("position add", n, e * (2 * n + steps * dim)))
    if b.train:
        # the table's gradient: dy summed over the batch into rows 0..T-1, the whole table cleared
        # first; the input's gradient is dy itself (no work)
        layer.backward.append(b.op("position table gradient", n, e * (n + entry["max_length"] * dim)))


LAYER = LayerType(schema.PositionEmbedding, infer, work, weights, rounding_depth=0, decisions=0)
