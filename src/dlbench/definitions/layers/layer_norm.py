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
    """The `layer_norm_fwd` kernel over the rows of `shape` (performance/kernels.py counts it: x read
    twice, for the statistics then to normalise, y written: 3 passes, in inference too, since the
    statistics are always the sample's own), and in training `layer_norm_bwd`: x and dy read twice
    (the two row reductions, then dx) and dx written, 5 passes, the gamma and beta gradients reduced
    on the way; without an input gradient only gamma's and beta's (x and dy read, the row statistics
    recomputed: 3)."""
    rows, dim = b.batch * numel(shape[:-1]), shape[-1]
    label = f"{name} layer norm".strip()
    layer.forward.append(b.kernel(label, "layer_norm_fwd", rows=rows, dim=dim))
    if b.train:
        layer.backward.append(b.kernel(label if input_grad else f"{label} parameter gradient", "layer_norm_bwd",
                                       rows=rows, dim=dim, input_grad=int(input_grad)))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    passes(b, layer, "", entry["in_shape"], input_grad)


LAYER = LayerType(schema.LayerNorm, infer, work, weights, rounding_depth=0, decisions=0)
