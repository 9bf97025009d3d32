"""lstm: `layers` stacked LSTM layers over a (steps, features) sequence, the full output sequence of
the last one (gate order and bias convention in schema.py)."""

from __future__ import annotations

from .. import schema
from .base import Inferred, LayerType, Site


def infer(layer: schema.LSTM, site: Site) -> Inferred:
    if len(site.shape) != 2:
        raise site.error(f"lstm needs a (steps, features) input, got {list(site.shape)}")
    steps, fin = site.shape
    h = layer.hidden
    params = flops = 0
    for _ in range(layer.layers):
        params += 4 * h * (fin + h) + 4 * h
        flops += steps * (2 * 4 * h * (fin + h) + 4 * h + 5 * h + 4 * h)
        fin = h
    return Inferred((steps, h), params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    out, fin, h = {}, entry["in_shape"][-1], entry["hidden"]
    for k in range(entry["layers"]):
        out.update({f"{prefix}.l{k}.w_ih": (4 * h, fin), f"{prefix}.l{k}.w_hh": (4 * h, h),
                    f"{prefix}.l{k}.bias": (4 * h,)})
        fin = h
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, fin = entry["in_shape"]
    h = entry["hidden"]
    for k in range(entry["layers"]):
        layer_in = fin if k == 0 else h
        for phase, ops in (("fwd", layer.forward), ("bwd", layer.backward if b.train else None)):
            if ops is None:
                continue
            step = (f"lstm_step_{phase}", steps, {"batch": b.batch, "input": layer_in, "hidden": h})
            ops.append(b.kernel(f"layer {k}", f"lstm_layer_{phase}", alternatives=(step,), batch=b.batch,
                                steps=steps, input=layer_in, hidden=h))


def rounding_depth(entry: dict) -> int:
    """To the last step of the top layer: T steps of the first layer, one more per layer above."""
    return entry["in_shape"][0] + entry["layers"] - 1


# Sigmoid and tanh gates are smooth: no decision.
LAYER = LayerType(schema.LSTM, infer, work, weights, rounding_depth=rounding_depth, decisions=0)
