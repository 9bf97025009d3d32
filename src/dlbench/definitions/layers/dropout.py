"""dropout: inverted dropout in training, the identity in inference; no FLOPs counted."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel


def infer(layer: schema.Dropout, site: Site) -> Inferred:
    return Inferred(site.shape)


def work(b, layer, entry: dict, input_grad: bool) -> None:
    if b.train:
        n = b.batch * numel(entry["in_shape"])
        layer.forward.append(b.passes("dropout", n, 3))
        if input_grad:
            layer.backward.append(b.passes("dropout", n, 3))


LAYER = LayerType(schema.Dropout, infer, work, rounding_depth=0, decisions=0)
