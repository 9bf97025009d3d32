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


# a pool2d kernel's `op` (performance/kernels.py POOL_OPS)
POOL_OP = {"max_pool": 0, "avg_pool": 1, "global_avg_pool": 2}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    """The `pool2d_fwd` kernel at the layer's window (performance/kernels.py counts it: kh·kw FLOPs
    per output element, the input read and the output written) and, where a trainable layer precedes
    it, `pool2d_bwd` (one FLOP per input element; dy read, dx cleared then written). A global average
    is the window of the whole map, stride 1, no padding (its own `op`: frameworks reduce instead)."""
    t = entry["type"]
    c, h, w = entry["in_shape"]
    if t == "global_avg_pool":
        window = dict(kh=h, kw=w, sh=1, sw=1, ph=0, pw=0)
    else:
        (ph, pw) = entry.get("padding", (0, 0))  # avg_pool has none
        window = dict(kh=entry["size"][0], kw=entry["size"][1], sh=entry["stride"][0], sw=entry["stride"][1],
                      ph=ph, pw=pw)
    shape = dict(batch=b.batch, channels=c, height=h, width=w, op=POOL_OP[t], **window)
    layer.forward.append(b.kernel(t, "pool2d_fwd", **shape))
    if b.train and input_grad:
        layer.backward.append(b.kernel(t, "pool2d_bwd", **shape))


# A max-pool window whose two largest values lie within rounding of each other goes either way;
# averages are smooth.
MAX_POOL = LayerType(schema.MaxPool, infer_window, work, rounding_depth=0, decisions=1)
AVG_POOL = LayerType(schema.AvgPool, infer_window, work, rounding_depth=0, decisions=0)
GLOBAL_AVG_POOL = LayerType(schema.GlobalAvgPool, infer_global, work, rounding_depth=0, decisions=0)
