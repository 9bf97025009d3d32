"""patch_embedding: an image (C, H, W) cut into patch x patch squares, each projected to `dim` (a
convolution with kernel = stride = patch, with bias), the squares as tokens in row-major order, and
with `class_token` a learned token prepended: (N, dim) or (1 + N, dim). FLOPs: the convolution's."""

from __future__ import annotations

from .. import schema
from . import conv2d
from .base import Inferred, LayerType, Site


def infer(layer: schema.PatchEmbedding, site: Site) -> Inferred:
    site.require_image(layer.type)
    _, h, w = site.shape
    p = layer.patch
    if h % p or w % p:
        raise site.error(f"patch {p} does not divide the image's height and width {[h, w]}")
    grid = (layer.dim, h // p, w // p)
    params, flops = conv2d.counts(site.shape, grid, (p, p), bias=True)
    tokens = grid[1] * grid[2] + (1 if layer.class_token else 0)
    return Inferred((tokens, layer.dim), params + (layer.dim if layer.class_token else 0), flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    c, p, dim = entry["in_shape"][0], entry["patch"], entry["dim"]
    out = {f"{prefix}.weight": (dim, c, p, p), f"{prefix}.bias": (dim,)}  # OIHW, as conv2d
    if entry["class_token"]:
        out[f"{prefix}.class_token"] = (dim,)
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    p, dim = entry["patch"], entry["dim"]
    grid = b.conv(layer, "patch", tuple(entry["in_shape"]), dim, (p, p), (p, p), (0, 0), input_grad, bias=True)
    patches = b.batch * grid[1] * grid[2] * dim
    tokens = b.batch * entry["out_shape"][0] * dim
    # (dim, h, w) to (N, dim) tokens, the class token written in front: one copy (read, write)
    layer.forward.append(b.passes("tokens", tokens, 2, 0))
    if b.train:
        # the tokens' gradient back to the convolution's layout, and the class token's summed over
        # the batch
        layer.backward.append(b.passes("tokens gradient", patches, 2, 0))
        if entry["class_token"]:
            layer.backward.append(b.passes("class token gradient", b.batch * dim, 1))


# One product: the patches' projection (a convolution).
LAYER = LayerType(schema.PatchEmbedding, infer, work, weights, rounding_depth=1, decisions=0)
