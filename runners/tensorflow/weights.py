"""Canonical weights (src/dlbench/definitions/weights.py) <-> the TensorFlow runner's Keras
variables: each layer's variables named by its type's weight function in LAYERS (layers.py), each
in a layout converted here, at load/export, never in the step: conv OIHW <-> HWIO, dense and LSTM
(out, in) <-> (in, out), the rows of a dense layer (and the vector of a 1-d batch norm) whose input
features arrive in H, W, C order after a flatten permuted from the canonical C, H, W order, and
MultiHeadAttention's per-head EinsumDense kernels reshaped from the canonical matrices."""

from __future__ import annotations

from runners.tensorflow.layers import LAYERS
from runners.tensorflow.precision import storage_dtype


def hwc_order(chw):
    """index array: position j of an H, W, C-ordered feature vector holds canonical feature idx[j]."""
    import numpy as np

    c, h, w = chw
    idx = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
    return idx, np.argsort(idx)


def conversions(layout) -> tuple:
    """(canonical -> keras array, keras -> canonical array) of a weight function's layout: "same",
    "conv" (OIHW <-> HWIO), "transposed" ((out, in) <-> (in, out)), ("hwc_transposed", (C, H, W))
    (a dense layer's rows in H, W, C order), ("hwc_rows", (C, H, W)) (a 1-d batch norm's vector in
    that order), ("heads_in", D, heads, head_size) (q, k, v: canonical (H*S, D) <-> (D, heads,
    head_size)), ("heads_bias", heads, head_size) (their biases) and ("heads_out", D, heads,
    head_size) (out: canonical (D, H*S) <-> (heads, head_size, D))."""
    kind, *args = (layout,) if isinstance(layout, str) else layout
    if kind == "same":
        return (lambda a: a, lambda a: a)
    if kind == "conv":
        return (lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1))
    if kind == "transposed":
        return (lambda a: a.T, lambda a: a.T)
    if kind == "hwc_transposed":
        idx, inv = hwc_order(*args)
        return (lambda a: a.T[idx], lambda a: a[inv].T)
    if kind == "hwc_rows":
        idx, inv = hwc_order(*args)
        return (lambda a: a[idx], lambda a: a[inv])
    if kind == "heads_in":
        dim, heads, size = args
        return (lambda a: a.T.reshape(dim, heads, size), lambda a: a.reshape(dim, heads * size).T)
    if kind == "heads_bias":
        heads, size = args
        return (lambda a: a.reshape(heads, size), lambda a: a.reshape(-1))
    if kind == "heads_out":
        dim, heads, size = args
        return (lambda a: a.T.reshape(heads, size, dim), lambda a: a.reshape(heads * size, dim).T)
    raise ValueError(f"unknown weight layout {layout!r}")


def canonical_variables(network: dict, per_layer: list, permuted: dict) -> dict:
    """name -> (keras variable, canonical -> keras array, keras -> canonical array), each layer's
    from its type's weight function (LAYERS.weights), none for a type without weights."""
    out = {}
    for i, (spec, made) in enumerate(zip(network["layers"], per_layer)):
        weights = LAYERS.weights(spec["type"])
        if weights is None:
            continue
        for name, (variable, layout) in weights(f"{i:03d}", spec, made, permuted.get(i)).items():
            out[name] = (variable, *conversions(layout))
    return out


def export_weights(variables: dict, precision: str = "fp32") -> dict:
    """Every canonical tensor in the variables' dtype (float32, or float64 for a float64 network)."""
    import numpy as np

    dtype = np.dtype(storage_dtype(precision))
    return {name: np.ascontiguousarray(to_canonical(np.array(var.numpy(), dtype=dtype)))
            for name, (var, _, to_canonical) in variables.items()}


def load_weights(variables: dict, arrays: dict, precision: str = "fp32") -> None:
    """The canonical arrays into the variables, in their dtype (float32 -> float64 is exact)."""
    import numpy as np

    dtype = np.dtype(storage_dtype(precision))
    if set(arrays) != set(variables):
        raise ValueError(f"weight set mismatch: missing {sorted(set(variables) - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(variables))[:5]}")
    for name, (var, to_framework, _) in variables.items():
        value = np.ascontiguousarray(to_framework(np.asarray(arrays[name], dtype=dtype)))
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} gives {tuple(value.shape)}, "
                             f"keras expects {tuple(var.shape)}")
        var.assign(value)

