"""relu, sigmoid, tanh: element-wise, one FLOP per element."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel


def infer(layer: schema.Activation, site: Site) -> Inferred:
    return Inferred(site.shape, 0, numel(site.shape))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    n = b.batch * numel(entry["in_shape"])
    layer.forward.append(b.passes(entry["type"], n, 2, epilogue=True))
    if b.train and input_grad:
        layer.backward.append(b.passes(entry["type"], n, 3))


def decisions(entry: dict) -> int:
    """A ReLU whose input lies within rounding of zero goes either way; sigmoid and tanh are smooth."""
    return 1 if entry["type"] == "relu" else 0


LAYER = LayerType(schema.Activation, infer, work, rounding_depth=0, decisions=decisions)
