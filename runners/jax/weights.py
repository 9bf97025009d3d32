"""Canonical weights (src/dlbench/definitions/weights.py) in and out of the JAX runner's flax
variables: which tensors a network has, and where flax keeps each, is its layers' weight functions'
(LAYERS.weights(type), layers.py and transformer.py); here they are converted between the
canonical layouts and flax's (conv kernels OIHW <-> HWIO, dense (out, in) <-> (in, out), LSTM
kernels transposed, a flattened NHWC map's features permuted back to C, H, W order) and checked
against the variables' shapes.
"""

from __future__ import annotations

from runners.jax.framework import load_jax
from runners.jax.layers import LAYERS


def _entries(network: dict, plan: list[dict]):
    """(canonical name, collection, path in the collection, kind, perm) for every canonical tensor,
    layer by layer, as the layer type's weight function names them (types without weights: none)."""
    for i, layer in enumerate(network["layers"]):
        weights = LAYERS.weights(layer["type"])
        if weights is not None:
            yield from weights(layer, f"{i:03d}", (f"layer{i:03d}",), plan[i].get("perm"))


def _to_internal(a, kind: str, perm):
    import numpy as np

    if kind == "conv":  # OIHW -> HWIO
        return np.ascontiguousarray(a.transpose(2, 3, 1, 0))
    if kind == "dense":  # (out, in) -> (in, out), rows in the internal flat order
        if perm is not None:
            a = a[:, perm]
        return np.ascontiguousarray(a.T)
    if kind == "transpose":
        return np.ascontiguousarray(a.T)
    return np.ascontiguousarray(a[perm] if perm is not None else a)


def _to_canonical(a, kind: str, perm):
    import numpy as np

    if kind == "conv":  # HWIO -> OIHW
        return np.ascontiguousarray(a.transpose(3, 2, 0, 1))
    if kind == "dense":
        w = a.T
        if perm is not None:
            out = np.empty_like(w)
            out[:, perm] = w
            w = out
        return np.ascontiguousarray(w)
    if kind == "transpose":
        return np.ascontiguousarray(a.T)
    if perm is not None:
        out = np.empty_like(a)
        out[perm] = a
        return out
    return np.ascontiguousarray(a)


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree: dict, path, value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def export_weights(variables: dict, network: dict, plan: list[dict]) -> dict:
    import numpy as np

    jax = load_jax()
    host = jax.device_get(variables)
    return {name: _to_canonical(_host_float(_get(host[coll], path)), kind, perm)
            for name, coll, path, kind, perm in _entries(network, plan)}


def _host_float(value):
    """A variable as numpy: float64 stays float64 (the check's precision), anything else float32."""
    import numpy as np

    value = np.asarray(value)
    return value.astype(np.float64 if value.dtype == np.float64 else np.float32)


def canonical_to_variables(arrays: dict, network: dict, plan: list[dict], like: dict) -> dict:
    """Numpy variables {collection: tree} from canonical arrays, checked against `like`'s shapes."""
    import numpy as np

    entries = list(_entries(network, plan))
    expected = {e[0] for e in entries}
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - expected)[:5]}")
    out: dict = {coll: {} for coll in like}
    for name, coll, path, kind, perm in entries:
        target = _get(like[coll], path)
        dtype = np.float64 if target.dtype == np.float64 else np.float32  # float32 converts to float64 exactly
        value = _to_internal(np.asarray(arrays[name], dtype=dtype), kind, perm)
        want = tuple(target.shape)
        if value.shape != want:
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} gives {value.shape} in flax, "
                             f"which expects {want}")
        _set(out[coll], path, value)
    return out

