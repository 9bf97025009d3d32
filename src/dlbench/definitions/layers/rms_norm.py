"""rms_norm: y = gamma * x / sqrt(mean(x^2) + eps) over the last axis, on a sequence (T, D) or a flat
(D,) input; 4 FLOPs per element (network.py)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel

FLOPS_PER_ELEMENT = 4  # one each: the square, the mean's sum, the normalising product, the scale


def counts(shape) -> tuple[int, int]:
    """(params, forward FLOPs per sample) over `shape`, normalised over its last axis."""
    return shape[-1], FLOPS_PER_ELEMENT * numel(shape)


def tensors(prefix: str, dim: int) -> dict[str, tuple[int, ...]]:
    """gamma, (dim,): no shift, no running statistics."""
    return {f"{prefix}.gamma": (dim,)}


def infer(layer: schema.RMSNorm, site: Site) -> Inferred:
    if len(site.shape) not in (1, 2):
        raise site.error(f"rms_norm needs a sequence (T, D) or flat (D,) input, got {list(site.shape)}")
    params, flops = counts(site.shape)
    return Inferred(site.shape, params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1])


def passes(b, layer, name: str, shape, input_grad: bool) -> None:
    """The `rms_norm_fwd` kernel over the rows of `shape` (performance/kernels.py counts it), made of,
    where it was not measured, x read twice (the row's mean square, then the scaling) and y written,
    3 passes; in training `rms_norm_bwd`, made of x and dy read twice (the row reduction, then dx)
    and dx written, 5 passes, gamma's gradient reduced on the way (without an input gradient: x and
    dy read once, 2)."""
    rows, dim = b.batch * numel(shape[:-1]), shape[-1]
    label = f"{name} rms norm".strip()
    forward = b.passes(label, rows * dim, 3, FLOPS_PER_ELEMENT / 3)
    layer.forward.append(b.kernel(label, "rms_norm_fwd", parts=(forward,), rows=rows, dim=dim))
    if b.train:
        what = f"{label} gradient" if input_grad else f"{label} parameter gradient"
        backward = b.passes(what, rows * dim, 5 if input_grad else 2, 2.0)
        layer.backward.append(b.kernel(what, "rms_norm_bwd", parts=(backward,), rows=rows, dim=dim,
                                       input_grad=int(input_grad)))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    passes(b, layer, "", entry["in_shape"], input_grad)


LAYER = LayerType(schema.RMSNorm, infer, work, weights, rounding_depth=0, decisions=0)
