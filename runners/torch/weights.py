"""Canonical weights (src/dlbench/definitions/weights.py) <-> torch tensors, for `dlbench check` and
generation: every layer's tensors from its type's weight function in layers.LAYERS (no type is
special here). torch's own layouts are the canonical ones, so no tensor is transposed; the one
conversion is the LSTM's bias, which torch keeps as two (layers.SplitBias): exported as their sum,
imported into the first with the second zeroed.
"""

from __future__ import annotations

from runners.torch.framework import host_array, load_torch
from runners.torch.layers import LAYERS, SplitBias


def canonical_tensors(model, network: dict) -> dict:
    """name -> torch tensor (parameter or buffer), or a SplitBias, for every canonical weight of the
    built network, in network order."""
    out = {}
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        weights = LAYERS.weights(layer["type"])
        if weights is not None:
            out.update(weights(f"{i:03d}", layer, module))
    return out


def export_weights(model, network: dict) -> dict:
    out = {}
    for name, t in canonical_tensors(model, network).items():
        out[name] = host_array(t.input + t.hidden) if isinstance(t, SplitBias) else host_array(t)
    return out


def load_weights(model, network: dict, arrays: dict) -> None:
    torch = load_torch()
    tensors = canonical_tensors(model, network)
    expected = set(tensors)
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - expected)[:5]}")
    with torch.no_grad():
        for name, t in tensors.items():
            src = torch.from_numpy(arrays[name])
            if isinstance(t, SplitBias):
                t.input.copy_(src)
                t.hidden.zero_()
                continue
            if tuple(src.shape) != tuple(t.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)}, torch expects {tuple(t.shape)}")
            t.copy_(src)
