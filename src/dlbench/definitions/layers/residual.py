"""residual: `repeat` blocks (basic: two 3x3 convolutions; bottleneck: 1x1, 3x3, 1x1 to 4 * filters),
each convolution without bias and followed by batch norm, the shortcut added before the last relu.
The resolved network has one entry per block, with the shortcut that block uses (identity where the
shape does not change)."""

from __future__ import annotations

from .. import schema
from . import batch_norm, conv2d
from .base import Inferred, LayerType, ShapeError, Site, numel, window_out


class _Block:
    """Accumulates the sub-layers of one residual block: counts and shapes."""

    def __init__(self, index: int, in_shape):
        self.index = index
        self.shape = in_shape
        self.params = 0
        self.flops = 0

    def conv(self, filters, k, stride, padding):
        out = conv2d.out_shape(self.index, self.shape, filters, (k, k), (stride, stride), (padding, padding))
        p, f = conv2d.counts(self.shape, out, (k, k), bias=False)
        self.params += p
        self.flops += f
        self.shape = out

    def bn(self, relu: bool):
        n = numel(self.shape)
        self.params += 2 * self.shape[0]
        self.flops += 2 * n + (n if relu else 0)


def block(index, in_shape, kind, filters, stride, shortcut_kind):
    """One block: (output shape, params, FLOPs, the shortcut it uses)."""
    b = _Block(index, in_shape)
    if kind == "basic":
        b.conv(filters, 3, stride, 1); b.bn(relu=True)
        b.conv(filters, 3, 1, 1); b.bn(relu=False)
    else:
        b.conv(filters, 1, 1, 0); b.bn(relu=True)
        b.conv(filters, 3, stride, 1); b.bn(relu=True)
        b.conv(4 * filters, 1, 1, 0); b.bn(relu=False)
    out = b.shape
    needs_change = stride != 1 or in_shape[0] != out[0]
    shortcut = shortcut_kind if needs_change else "identity"
    if shortcut == "option_a":
        if out[0] < in_shape[0]:
            raise ShapeError(index, "option_a shortcut cannot reduce channels; use projection")
        expected = (in_shape[0], window_out(in_shape[1], 1, stride, 0), window_out(in_shape[2], 1, stride, 0))
        if expected[1:] != out[1:]:
            raise ShapeError(index, f"option_a shortcut gives {list(expected[1:])}, block gives {list(out[1:])}")
    elif shortcut == "projection":
        proj = _Block(index, in_shape)
        proj.conv(out[0], 1, stride, 0); proj.bn(relu=False)
        if proj.shape != out:
            raise ShapeError(index, f"projection gives {list(proj.shape)}, block gives {list(out)}")
        b.params += proj.params
        b.flops += proj.flops
    n = numel(out)
    b.flops += 2 * n  # the addition and the final relu
    return out, b.params, b.flops, shortcut


def infer(layer: schema.Residual, site: Site) -> Inferred:
    site.require_image(layer.type)
    shape = site.shape
    params = flops = 0
    resolved = []
    for r in range(layer.repeat):
        stride = layer.stride if r == 0 else 1
        block_in = shape
        shape, p, f, shortcut = block(site.index, shape, layer.block, layer.filters, stride, layer.shortcut)
        params += p
        flops += f
        resolved.append({
            "type": "residual", "block": layer.block, "filters": layer.filters, "stride": stride,
            "shortcut": shortcut, "in_shape": list(block_in), "out_shape": list(shape),
        })
    return Inferred(shape, params, flops, resolved)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    cin, cout, f = entry["in_shape"][0], entry["out_shape"][0], entry["filters"]
    if entry["block"] == "basic":
        convs = [(cin, f, 3), (f, f, 3)]
    else:
        convs = [(cin, f, 1), (f, f, 3), (f, cout, 1)]
    out = {}
    for i, (ci, co, k) in enumerate(convs, start=1):
        out[f"{prefix}.conv{i}.weight"] = (co, ci, k, k)
        out.update(batch_norm.tensors(f"{prefix}.bn{i}", co))
    if entry["shortcut"] == "projection":
        out[f"{prefix}.proj.weight"] = (cout, cin, 1, 1)
        out.update(batch_norm.tensors(f"{prefix}.proj_bn", cout))
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    layer.label = f"{layer.index:03d} residual {entry['block']} {entry['filters']}/{entry['stride']}"
    cin, h, w = entry["in_shape"]
    cout = entry["out_shape"][0]
    f, s = entry["filters"], entry["stride"]
    shape = (cin, h, w)
    n_in = b.batch * cin * h * w
    if entry["shortcut"] == "option_a":
        # from the block's input, beside the convolutions (first here: it is no step between the
        # last convolution and the join, which a graph optimiser fuses into it)
        n_short = b.batch * numel(entry["out_shape"])
        layer.forward.append(b.passes("option-A shortcut", n_short, 2, 0))
        if b.train and input_grad:
            layer.backward.append(b.op("option-A shortcut", 0, b.element_bytes * (n_in + n_short)))
    if entry["block"] == "basic":
        plan = [(f, 3, s, 1, True), (f, 3, 1, 1, False)]
    else:
        plan = [(f, 1, 1, 0, True), (f, 3, s, 1, True), (cout, 1, 1, 0, False)]
    for j, (filters, k, stride, pad, relu) in enumerate(plan, start=1):
        # every convolution of a block needs its input gradient, except the first one's when the
        # block's input needs none (never in the shipped networks: a block follows a convolution)
        shape = b.conv(layer, f"conv{j}", shape, filters, (k, k), (stride, stride), (pad, pad),
                       input_grad or j > 1, bias=False)
        b.batch_norm(layer, f"bn{j}", shape)
        if relu:
            b.activation(layer, f"relu{j}", shape)
    n_out = b.batch * numel(shape)
    if entry["shortcut"] == "projection":
        proj = b.conv(layer, "projection", (cin, h, w), cout, (1, 1), (s, s), (0, 0), input_grad, bias=False)
        b.batch_norm(layer, "projection", proj)
    layer.forward.append(b.passes("join", n_out, 3, epilogue=True))
    b.activation(layer, "relu", shape)
    if b.train and input_grad:
        layer.backward.append(b.passes("join gradient", n_in, 3))


def convolutions_in_sequence(entry: dict) -> int:
    """One block per resolved entry: its convolutions (the shortcut is the shorter path), and as many
    decisions: a ReLU after each convolution but the last, and one after the sum."""
    return 3 if entry["block"] == "bottleneck" else 2


LAYER = LayerType(schema.Residual, infer, work, weights, rounding_depth=convolutions_in_sequence,
                  decisions=convolutions_in_sequence)
