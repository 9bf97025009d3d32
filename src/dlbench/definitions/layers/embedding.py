"""embedding: token ids (T,) -> (T, dim) rows of a (vocabulary, dim) table; the first layer of a
token-input network."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel, resolved_entry


def infer(layer: schema.Embedding, site: Site) -> Inferred:
    if not site.tokens or site.index != 0:
        raise site.error("embedding must be the first layer of a token-input network")
    if layer.vocabulary != site.input.vocabulary:
        raise site.error(f"embedding vocabulary {layer.vocabulary} != input vocabulary {site.input.vocabulary}")
    shape = (site.shape[0], layer.dim)
    entry = resolved_entry(layer, site.shape, shape)
    if entry["init_std"] is None:  # the framework's default: left out, so the definition hash stays as before
        del entry["init_std"]
    return Inferred(shape, layer.vocabulary * layer.dim, 0, resolved=[entry])


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (entry["vocabulary"], entry["dim"])}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    rows = b.batch * numel(entry["out_shape"][:-1])
    layer.forward.append(b.passes("gather", rows * entry["dim"], 2, 0))
    if b.train:
        table = entry["vocabulary"] * entry["dim"]
        layer.backward.append(b.op("scatter-add", rows * entry["dim"],
                                   b.element_bytes * (table + 2 * rows * entry["dim"])))


LAYER = LayerType(schema.Embedding, infer, work, weights, rounding_depth=0, decisions=0)
