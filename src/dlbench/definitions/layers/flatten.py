"""flatten: (C, H, W) -> (C*H*W,) in C, H, W order; free (a view)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel


def infer(layer: schema.Flatten, site: Site) -> Inferred:
    return Inferred((numel(site.shape),))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    pass


LAYER = LayerType(schema.Flatten, infer, work, rounding_depth=0, decisions=0)
