"""segment_embedding: y = x + S[s_t], each position's row of a learned (segments, D) table, the
segment s_t from the masked_tokens input's layout (positions before `segment_boundary` in segment
0, the rest in 1: BERT's token types); 1 FLOP per element (the addition)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site


def infer(layer: schema.SegmentEmbedding, site: Site) -> Inferred:
    if getattr(site.input, "kind", None) != "masked_tokens":
        raise site.error("segment_embedding needs a masked_tokens input (its segment layout)")
    if len(site.shape) != 2:
        raise site.error(f"segment_embedding needs a sequence (T, D) input, got {list(site.shape)}")
    steps, dim = site.shape
    return Inferred(site.shape, layer.segments * dim, steps * dim)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (entry["segments"], entry["in_shape"][-1])}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    n = b.batch * steps * dim
    e = b.element_bytes
    # x read, y written, the table's rows gathered per position (one set for the whole batch)
    layer.forward.append(b.op("segment add", n, e * (2 * n + steps * dim)))
    if b.train:  # the table's gradient: dy summed over the batch and the positions of each segment
        layer.backward.append(b.op("segment table gradient", n, e * (n + entry["segments"] * dim)))


LAYER = LayerType(schema.SegmentEmbedding, infer, work, weights, rounding_depth=0, decisions=0)
