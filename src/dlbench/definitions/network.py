"""Shapes, parameter counts and FLOPs computed from a description alone, and the resolved form
sent to runners.

FLOP convention (forward pass, per sample, batch axis excluded): a multiply-add is 2 FLOPs.
- dense: 2*in*out per position, + out for the bias; conv2d: 2*kh*kw*Cin*Cout*Ho*Wo, + Cout*Ho*Wo
  for the bias.
- max/avg pool: kh*kw per output element; global average pool: one per input element.
- batch norm: 2 per element (the folded scale and shift); relu/sigmoid/tanh: 1 per element;
  residual addition: 1 per element; dropout, flatten, embedding lookups and option-A shortcuts: 0.
- lstm, per step and layer: 2*4h*(in+h) for the gate products, 4h for the bias, 5h for the gate
  and cell activations, 4h for the cell and hidden updates.
- the loss is not counted.
These are the usual analytical counts (as in most papers' "GFLOPs per image"), not what a given
kernel executes.

The *resolved* network is plain JSON: every layer with its defaults filled in, its input and output
shape, residual `repeat` expanded into one entry per block (with the shortcut each block actually
uses), and the totals. Runners build from it and need no validation or shape logic of their own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from . import schema as s


class ShapeError(ValueError):
    """A layer cannot accept the shape that reaches it (the loader names file and layer)."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index
        self.reason = reason


@dataclass
class LayerSummary:
    index: int
    type: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: int
    flops: int
    resolved: list[dict] = field(default_factory=list)


@dataclass
class NetworkSummary:
    name: str
    params: int
    flops_per_sample: int
    output_shape: tuple[int, ...]
    layers: list[LayerSummary]
    resolved: dict

    @property
    def definition_hash(self) -> str:
        return definition_hash(self.resolved)


def definition_hash(resolved: dict) -> str:
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _window_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _require_image(index: int, layer_type: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ShapeError(index, f"{layer_type} needs a (channels, height, width) input, got {list(shape)}")


def _conv_out(index, shape, filters, kernel, stride, padding):
    _require_image(index, "conv2d", shape)
    c, h, w = shape
    ho = _window_out(h, kernel[0], stride[0], padding[0])
    wo = _window_out(w, kernel[1], stride[1], padding[1])
    if ho < 1 or wo < 1:
        raise ShapeError(index, f"kernel {list(kernel)} does not fit input {list(shape)}")
    return (filters, ho, wo)


def _conv_counts(in_shape, out_shape, kernel, bias):
    cin = in_shape[0]
    cout, ho, wo = out_shape
    params = kernel[0] * kernel[1] * cin * cout + (cout if bias else 0)
    flops = 2 * kernel[0] * kernel[1] * cin * cout * ho * wo + (cout * ho * wo if bias else 0)
    return params, flops


class _BlockBuilder:
    """Accumulates the sub-layers of one residual block: counts and shapes."""

    def __init__(self, index: int, in_shape):
        self.index = index
        self.shape = in_shape
        self.params = 0
        self.flops = 0

    def conv(self, filters, k, stride, padding):
        out = _conv_out(self.index, self.shape, filters, (k, k), (stride, stride), (padding, padding))
        p, f = _conv_counts(self.shape, out, (k, k), bias=False)
        self.params += p
        self.flops += f
        self.shape = out

    def bn(self, relu: bool):
        n = _numel(self.shape)
        self.params += 2 * self.shape[0]
        self.flops += 2 * n + (n if relu else 0)


def _residual_block(index, in_shape, block, filters, stride, shortcut_kind):
    b = _BlockBuilder(index, in_shape)
    if block == "basic":
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
        expected = (in_shape[0], _window_out(in_shape[1], 1, stride, 0), _window_out(in_shape[2], 1, stride, 0))
        if expected[1:] != out[1:]:
            raise ShapeError(index, f"option_a shortcut gives {list(expected[1:])}, block gives {list(out[1:])}")
    elif shortcut == "projection":
        proj = _BlockBuilder(index, in_shape)
        proj.conv(out[0], 1, stride, 0); proj.bn(relu=False)
        if proj.shape != out:
            raise ShapeError(index, f"projection gives {list(proj.shape)}, block gives {list(out)}")
        b.params += proj.params
        b.flops += proj.flops
    n = _numel(out)
    b.flops += 2 * n  # the addition and the final relu
    return out, b.params, b.flops, shortcut


def analyse(network: s.Network) -> NetworkSummary:
    """Infer every shape and count parameters and forward FLOPs; raise ShapeError on a mismatch."""
    inp = network.input
    shape: tuple[int, ...] = (inp.sequence_length,) if isinstance(inp, s.TokenInput) else tuple(inp.shape)
    tokens = isinstance(inp, s.TokenInput)
    summaries: list[LayerSummary] = []
    for i, layer in enumerate(network.layers):
        in_shape = shape
        params = flops = 0
        resolved_extra: list[dict] | None = None
        t = layer.type
        if tokens and t != "embedding" and len(shape) == 1 and i == 0:
            raise ShapeError(i, "a token input must go through an embedding first")
        if isinstance(layer, s.Dense):
            if len(shape) not in (1, 2):
                raise ShapeError(i, f"dense needs a flat or sequence input, got {list(shape)}; add a flatten")
            fin = shape[-1]
            positions = shape[0] if len(shape) == 2 else 1
            params = fin * layer.units + (layer.units if layer.bias else 0)
            flops = positions * (2 * fin * layer.units + (layer.units if layer.bias else 0))
            shape = shape[:-1] + (layer.units,)
        elif isinstance(layer, s.Conv2d):
            shape = _conv_out(i, shape, layer.filters, layer.kernel, layer.stride, layer.padding)
            params, flops = _conv_counts(in_shape, shape, layer.kernel, layer.bias)
        elif isinstance(layer, (s.MaxPool, s.AvgPool)):
            _require_image(i, t, shape)
            stride = layer.stride or layer.size
            padding = getattr(layer, "padding", (0, 0))
            if any(2 * p > k for p, k in zip(padding, layer.size)):
                raise ShapeError(i, "padding must be at most half the window")
            c, h, w = shape
            ho = _window_out(h, layer.size[0], stride[0], padding[0])
            wo = _window_out(w, layer.size[1], stride[1], padding[1])
            if ho < 1 or wo < 1:
                raise ShapeError(i, f"window {list(layer.size)} does not fit input {list(shape)}")
            shape = (c, ho, wo)
            flops = layer.size[0] * layer.size[1] * _numel(shape)
        elif isinstance(layer, s.GlobalAvgPool):
            _require_image(i, t, shape)
            flops = _numel(shape)
            shape = (shape[0],)
        elif isinstance(layer, s.BatchNorm):
            if len(shape) not in (1, 3):
                raise ShapeError(i, f"batch_norm needs a flat or image input, got {list(shape)}")
            params = 2 * shape[0]
            flops = 2 * _numel(shape)
        elif isinstance(layer, s.Activation):
            flops = _numel(shape)
        elif isinstance(layer, s.Flatten):
            shape = (_numel(shape),)
        elif isinstance(layer, s.Dropout):
            pass
        elif isinstance(layer, s.Embedding):
            if not tokens or i != 0:
                raise ShapeError(i, "embedding must be the first layer of a token-input network")
            if layer.vocabulary != inp.vocabulary:
                raise ShapeError(i, f"embedding vocabulary {layer.vocabulary} != input vocabulary {inp.vocabulary}")
            params = layer.vocabulary * layer.dim
            shape = (shape[0], layer.dim)
        elif isinstance(layer, s.LSTM):
            if len(shape) != 2:
                raise ShapeError(i, f"lstm needs a (steps, features) input, got {list(shape)}")
            steps, fin = shape
            h = layer.hidden
            for _ in range(layer.layers):
                params += 4 * h * (fin + h) + 4 * h
                flops += steps * (2 * 4 * h * (fin + h) + 4 * h + 5 * h + 4 * h)
                fin = h
            shape = (steps, h)
        elif isinstance(layer, s.Residual):
            _require_image(i, t, shape)
            resolved_extra = []
            for r in range(layer.repeat):
                stride = layer.stride if r == 0 else 1
                block_in = shape
                shape, p, f, shortcut = _residual_block(i, shape, layer.block, layer.filters, stride, layer.shortcut)
                params += p
                flops += f
                resolved_extra.append({
                    "type": "residual", "block": layer.block, "filters": layer.filters, "stride": stride,
                    "shortcut": shortcut, "in_shape": list(block_in), "out_shape": list(shape),
                })
        else:  # pragma: no cover - the schema admits nothing else
            raise ShapeError(i, f"unknown layer type {t}")
        if resolved_extra is None:
            entry = layer.model_dump(mode="json")
            if isinstance(layer, (s.MaxPool, s.AvgPool)) and entry.get("stride") is None:
                entry["stride"] = list(layer.size)
            entry.update(in_shape=list(in_shape), out_shape=list(shape))
            resolved_extra = [entry]
        summaries.append(LayerSummary(i, t, in_shape, shape, params, flops, resolved_extra))

    if tokens:
        expected = (inp.sequence_length, inp.vocabulary)
        if shape != expected:
            raise ShapeError(len(network.layers) - 1,
                             f"a language model must end in (steps, vocabulary) = {list(expected)}, got {list(shape)}")
    elif shape != (inp.classes,):
        raise ShapeError(len(network.layers) - 1, f"the network must end in ({inp.classes},) logits, got {list(shape)}")

    total_params = sum(x.params for x in summaries)
    total_flops = sum(x.flops for x in summaries)
    resolved = {
        "name": network.name,
        "input": network.input.model_dump(mode="json"),
        "loss": network.loss,
        "layers": [entry for x in summaries for entry in x.resolved],
        "params": total_params,
        "flops_per_sample": total_flops,
    }
    return NetworkSummary(network.name, total_params, total_flops, shape, summaries, resolved)
