"""dense: y = x W^T + b, on a flat input (F) or at every step of a sequence (T, F)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site


def infer(layer: schema.Dense, site: Site) -> Inferred:
    shape = site.shape
    if len(shape) not in (1, 2):
        raise site.error(f"dense needs a flat or sequence input, got {list(shape)}; add a flatten")
    fin = shape[-1]
    positions = shape[0] if len(shape) == 2 else 1
    params = fin * layer.units + (layer.units if layer.bias else 0)
    flops = positions * (2 * fin * layer.units + (layer.units if layer.bias else 0))
    return Inferred(shape[:-1] + (layer.units,), params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    out = {f"{prefix}.weight": (entry["units"], entry["in_shape"][-1])}
    if entry["bias"]:
        out[f"{prefix}.bias"] = (entry["units"],)
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    in_shape = entry["in_shape"]
    positions = in_shape[0] if len(in_shape) == 2 else 1
    m, k, n = b.batch * positions, in_shape[-1], entry["units"]
    layer.forward.append(b.kernel("matmul", "matmul", m=m, n=n, k=k))
    if entry["bias"]:
        layer.forward.append(b.passes("bias", m * n, 1))
    if b.train:
        if input_grad:
            layer.backward.append(b.kernel("input gradient", "matmul", m=m, n=k, k=n))
        layer.backward.append(b.kernel("weight gradient", "matmul", m=k, n=n, k=m))
        if entry["bias"]:
            layer.backward.append(b.passes("bias gradient", m * n, 1))


LAYER = LayerType(schema.Dense, infer, work, weights)
