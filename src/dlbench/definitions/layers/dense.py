"""dense: y = x W^T + b, on a flat input (F) or at every step of a sequence (T, F).

Its counts, tensors and operations are also functions of plain numbers (`counts`, `tensors`,
`products`), which the layers made of dense products (attention's projections, a transformer
block's MLP, an untied lm_head) reuse rather than repeat."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, resolved_entry


def counts(positions: int, fin: int, units: int, bias: bool) -> tuple[int, int]:
    """(params, forward FLOPs per sample) of `units` outputs from `fin` inputs at `positions` steps."""
    params = fin * units + (units if bias else 0)
    flops = positions * (2 * fin * units + (units if bias else 0))
    return params, flops


def tensors(prefix: str, fin: int, units: int, bias: bool) -> dict[str, tuple[int, ...]]:
    out = {f"{prefix}.weight": (units, fin)}
    if bias:
        out[f"{prefix}.bias"] = (units,)
    return out


def infer(layer: schema.Dense, site: Site) -> Inferred:
    shape = site.shape
    if len(shape) not in (1, 2):
        raise site.error(f"dense needs a flat or sequence input, got {list(shape)}; add a flatten")
    positions = shape[0] if len(shape) == 2 else 1
    params, flops = counts(positions, shape[-1], layer.units, layer.bias)
    out = shape[:-1] + (layer.units,)
    entry = resolved_entry(layer, shape, out)
    if entry["init"] is None:  # the framework's default: left out, so the definition hash stays as before
        del entry["init"]
    return Inferred(out, params, flops, resolved=[entry])


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1], entry["units"], entry["bias"])


def products(b, layer, name: str, positions: int, k: int, n: int, bias: bool, input_grad: bool) -> None:
    """The work of y (m, n) = x (m, k) W^T + b at `positions` steps of each of the batch's samples,
    m = batch x positions rows: forward the GEMM and the bias (an epilogue); in training one
    `dense_bwd` kernel, the layer's backward as the framework's autodiff runs it, made of (where it
    was not measured) the input gradient GEMM (when `input_grad`), the weight gradient GEMM and the
    bias gradient. `name` prefixes the labels (a dense layer's own are unprefixed)."""
    def label(what: str) -> str:
        return f"{name} {what}" if name else what

    m = b.batch * positions
    layer.forward.append(b.kernel(label("matmul"), "matmul", m=m, n=n, k=k))
    if bias:
        layer.forward.append(b.passes(label("bias"), m * n, 1, epilogue=True))
    if b.train:
        parts = [b.kernel(label("input gradient"), "matmul", m=m, n=k, k=n)] if input_grad else []
        parts.append(b.kernel(label("weight gradient"), "matmul", m=k, n=n, k=m))
        if bias:
            parts.append(b.passes(label("bias gradient"), m * n, 1))
        layer.backward.append(b.kernel(label("backward"), "dense_bwd", parts=tuple(parts), batch=b.batch,
                                       positions=positions, inputs=k, units=n, bias=int(bias),
                                       input_grad=int(input_grad)))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    in_shape = entry["in_shape"]
    positions = in_shape[0] if len(in_shape) == 2 else 1
    products(b, layer, "", positions, in_shape[-1], entry["units"], entry["bias"], input_grad)


LAYER = LayerType(schema.Dense, infer, work, weights, rounding_depth=1, decisions=0)
