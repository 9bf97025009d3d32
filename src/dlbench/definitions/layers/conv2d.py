"""conv2d: a 2-D convolution, no groups, no dilation; output size floor((in + 2p - k) / s) + 1."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, ShapeError, Site, require_image, window_out


def out_shape(index: int, shape, filters: int, kernel, stride, padding) -> tuple[int, int, int]:
    require_image(index, "conv2d", shape)
    _, h, w = shape
    ho = window_out(h, kernel[0], stride[0], padding[0])
    wo = window_out(w, kernel[1], stride[1], padding[1])
    if ho < 1 or wo < 1:
        raise ShapeError(index, f"kernel {list(kernel)} does not fit input {list(shape)}")
    return (filters, ho, wo)


def counts(in_shape, out, kernel, bias: bool) -> tuple[int, int]:
    """(params, forward FLOPs per sample) of a convolution from `in_shape` to `out`."""
    cin = in_shape[0]
    cout, ho, wo = out
    params = kernel[0] * kernel[1] * cin * cout + (cout if bias else 0)
    flops = 2 * kernel[0] * kernel[1] * cin * cout * ho * wo + (cout * ho * wo if bias else 0)
    return params, flops


def infer(layer: schema.Conv2d, site: Site) -> Inferred:
    shape = out_shape(site.index, site.shape, layer.filters, layer.kernel, layer.stride, layer.padding)
    params, flops = counts(site.shape, shape, layer.kernel, layer.bias)
    return Inferred(shape, params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    out = {f"{prefix}.weight": (entry["filters"], entry["in_shape"][0], *entry["kernel"])}
    if entry["bias"]:
        out[f"{prefix}.bias"] = (entry["filters"],)
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    b.conv(layer, "", tuple(entry["in_shape"]), entry["filters"], entry["kernel"], entry["stride"],
           entry["padding"], input_grad, entry["bias"])


LAYER = LayerType(schema.Conv2d, infer, work, weights, rounding_depth=1, decisions=0)
