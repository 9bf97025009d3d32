"""layer_norm: y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis (biased variance),
on a sequence (T, D) or a flat (D,) input; 5 FLOPs per element (network.py)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel

FLOPS_PER_ELEMENT = 5  # one each: the mean's sum, the variance's, normalising, the scale, the shift


def counts(shape) -> tuple[int, int]:
    """(params, forward FLOPs per sample) over `shape`, normalised over its last axis."""
    return 2 * shape[-1], FLOPS_PER_ELEMENT * numel(shape)


def tensors(prefix: str, dim: int) -> dict[str, tuple[int, ...]]:
    """gamma and beta, each (dim,): no running statistics (a layer norm keeps none)."""
    return {f"{prefix}.gamma": (dim,), f"{prefix}.beta": (dim,)}


def infer(layer: schema.LayerNorm, site: Site) -> Inferred:
    if len(site.shape) not in (1, 2):
        raise site.error(f"layer_norm needs a sequence (T, D) or flat (D,) input, got {list(site.shape)}")
    params, flops = counts(site.shape)
    return Inferred(site.shape, params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1])


def passes(b, layer, name: str, shape, input_grad: bool) -> None:
    """Forward: x read twice (statistics, then normalise), y written: 3 passes, in inference too (the
    statistics are always the sample's own). Backward: x and dy read twice (the two row reductions,
    then dx) and dx written, 5 passes, the gamma and beta gradients reduced on the way; without an
    input gradient only x and dy are read for gamma's and beta's (the row statistics recomputed)."""
    n = b.batch * numel(shape)
    label = f"{name} layer norm".strip()
    layer.forward.append(b.passes(label, n, 3, FLOPS_PER_ELEMENT))
    if b.train:
        if input_grad:
            layer.backward.append(b.passes(label, n, 5, 8))
        else:
            layer.backward.append(b.passes(f"{label} parameter gradient", n, 3, 4))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    passes(b, layer, "", entry["in_shape"], input_grad)


LAYER = LayerType(schema.LayerNorm, infer, work, weights)
