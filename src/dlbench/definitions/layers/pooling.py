"""max_pool (padding pads with -inf), avg_pool (no padding) and global_avg_pool."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site, numel, resolved_entry, window_out


def infer_window(layer: schema.MaxPool | schema.AvgPool, site: Site) -> Inferred:
    site.require_image(layer.type)
    stride = layer.stride or layer.size
    padding = getattr(layer, "padding", (0, 0))
    if any(2 * p > k for p, k in zip(padding, layer.size)):
        raise site.error("padding must be at most half the window")
    c, h, w = site.shape
    ho = window_out(h, layer.size[0], stride[0], padding[0])
    wo = window_out(w, layer.size[1], stride[1], padding[1])
    if ho < 1 or wo < 1:
        raise site.error(f"window {list(layer.size)} does not fit input {list(site.shape)}")
    shape = (c, ho, wo)
    fill = {"stride": list(layer.size)} if layer.stride is None else {}
    return Inferred(shape, 0, layer.size[0] * layer.size[1] * numel(shape),
                    [resolved_entry(layer, site.shape, shape, **fill)])


def infer_global(layer: schema.GlobalAvgPool, site: Site) -> Inferred:
    site.require_image(layer.type)
    return Inferred((site.shape[0],), 0, numel(site.shape))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    t = entry["type"]
    n_in, n_out = b.batch * numel(entry["in_shape"]), b.batch * numel(entry["out_shape"])
    window = entry["size"][0] * entry["size"][1] if t != "global_avg_pool" else 1
    layer.forward.append(b.op(t, window * n_out if t != "global_avg_pool" else n_in,
                              b.element_bytes * (n_in + n_out)))
    if b.train and input_grad:
        layer.backward.append(b.op(t, n_in, b.element_bytes * (n_out + 2 * n_in)))


MAX_POOL = LayerType(schema.MaxPool, infer_window, work)
AVG_POOL = LayerType(schema.AvgPool, infer_window, work)
GLOBAL_AVG_POOL = LayerType(schema.GlobalAvgPool, infer_global, work)
