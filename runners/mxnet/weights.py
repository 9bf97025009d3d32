"""Canonical weights (see src/dlbench/definitions/weights.py) <-> Gluon parameters, for the mxnet
runner. Which tensors a layer has, by canonical name, is its type's weight function in the layer
table (`LAYERS.weights(type)`, layers.py and transformer.py); here they are exported and loaded, with
the two layout conversions Gluon needs: an LSTM layer's canonical bias is Gluon's i2h + h2h (h2h
zero and frozen), and attention's q, k and v are interleaved per head in one projection. A tied
lm_head's weight, and a tied pretraining_heads' decoder weight, is the embedding's Parameter: it is
exported once, as the embedding's (000.weight).
"""

from __future__ import annotations

from runners.mxnet.framework import load_mxnet
from runners.mxnet.layers import LAYERS, SummedBiases
from runners.mxnet.transformer import InterleavedPart


def canonical_params(blocks: list, network: dict) -> dict:
    """name -> where Gluon keeps it (a Parameter, SummedBiases, InterleavedPart) for every canonical
    weight of the network, from each layer type's weight function; a layer left out (None: dropout
    in a deterministic network) or without weights has none."""
    out = {}
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        weights = LAYERS.weights(layer["type"])
        if block is not None and weights is not None:
            out.update(weights(f"{i:03d}", layer, block))
    return out


def _interleaved(params: dict) -> list:
    """(Parameter, heads, {canonical name: part}) of each interleaved q/k/v projection in `params`."""
    grouped: dict = {}
    for name, where in params.items():
        if isinstance(where, InterleavedPart):
            _, _, names = grouped.setdefault(id(where.param), (where.param, where.heads, {}))
            names[name] = where.part
    return list(grouped.values())


def _deinterleave(array, heads: int, part: int):
    """One of q, k, v (rows head-major) from an interleaved (H*3*S, ...) projection array."""
    grouped = array.reshape(heads, 3, array.shape[0] // (3 * heads), *array.shape[1:])
    return grouped[:, part].reshape(array.shape[0] // 3, *array.shape[1:])


def _interleave(parts: list, heads: int):
    """The interleaved (H*3*S, ...) array of [q, k, v], each (H*S, ...) with rows head-major."""
    import numpy as np

    size = parts[0].shape[0] // heads
    grouped = np.stack([a.reshape(heads, size, *a.shape[1:]) for a in parts], axis=1)  # (H, 3, S, ...)
    return grouped.reshape(3 * heads * size, *parts[0].shape[1:])


def export_weights(blocks: list, network: dict, dtype: str = "float32") -> dict:
    """name -> numpy array in `dtype`, the precision the network computes in (float32 or float64):
    a float64 network's weights are exported whole, not rounded to float32."""
    out = {}
    for name, where in canonical_params(blocks, network).items():
        if isinstance(where, SummedBiases):
            out[name] = (where.i2h.data() + where.h2h.data()).asnumpy().astype(dtype, copy=True)  # h2h is zero: exact
        elif isinstance(where, InterleavedPart):
            out[name] = _deinterleave(where.param.data().asnumpy(), where.heads, where.part).astype(dtype, copy=True)
        else:
            out[name] = where.data().asnumpy().astype(dtype, copy=True)
    return out


def load_weights(blocks: list, network: dict, arrays: dict) -> None:
    mx = load_mxnet()
    canonical = canonical_params(blocks, network)
    if set(arrays) != set(canonical):
        raise ValueError(f"weight set mismatch: missing {sorted(set(canonical) - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(canonical))[:5]}")
    for name, where in canonical.items():
        if isinstance(where, SummedBiases):
            where.i2h.set_data(mx.nd.array(arrays[name], dtype=where.i2h.dtype))
            where.h2h.set_data(mx.nd.zeros(where.h2h.shape, dtype=where.h2h.dtype))
        elif not isinstance(where, InterleavedPart):
            src = arrays[name]
            if tuple(src.shape) != tuple(where.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)}, mxnet expects {tuple(where.shape)}")
            # in the parameter's own dtype: float32 canonical weights into a float64 network are exact
            where.set_data(mx.nd.array(src, dtype=where.dtype))
    for param, heads, names in _interleaved(canonical):
        ordered = sorted(names, key=names.get)  # q, k, v
        array = _interleave([arrays[name] for name in ordered], heads)
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(f"{', '.join(ordered)}: interleaved shape {tuple(array.shape)}, "
                             f"mxnet expects {tuple(param.shape)}")
        param.set_data(mx.nd.array(array, dtype=param.dtype))
    mx.nd.waitall()
