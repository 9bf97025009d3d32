"""batch_norm: y = gamma * (x - mean) / sqrt(var + eps) + beta over the channels (or features)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel


def infer(layer: schema.BatchNorm, site: Site) -> Inferred:
    shape = site.shape
    if len(shape) not in (1, 3):
        raise site.error(f"batch_norm needs a flat or image input, got {list(shape)}")
    return Inferred(shape, 2 * shape[0], 2 * numel(shape))


def tensors(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    """gamma and beta (trainable), running_mean and running_var (state), each (channels,)."""
    return {f"{prefix}.gamma": (channels,), f"{prefix}.beta": (channels,),
            f"{prefix}.running_mean": (channels,), f"{prefix}.running_var": (channels,)}


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][0])


def work(b, layer, entry: dict, input_grad: bool) -> None:
    b.batch_norm(layer, "", tuple(entry["in_shape"]), input_grad)


LAYER = LayerType(schema.BatchNorm, infer, work, weights, rounding_depth=0, decisions=0)
