"""The canonical weight format: names, shapes and layouts every runner exports and loads.

A weight set is a flat mapping name -> float32 array, stored as .npz. Names are
`<layer>.<part>` where <layer> is the three-digit index of the layer in the *resolved* network
(residual stages expanded, one entry per block) and <part> is:

    dense        weight (out, in), bias (out)
    conv2d       weight (out_channels, in_channels, kh, kw)  [OIHW], bias (out_channels)
    batch_norm   gamma, beta (C) trainable; running_mean, running_var (C) state
    embedding    weight (vocabulary, dim)
    lstm         l<k>.w_ih (4h, in), l<k>.w_hh (4h, h), l<k>.bias (4h) for layer k, gate blocks
                 in the order input, forget, cell (g), output; one bias (torch's b_ih + b_hh)
    residual     conv1/bn1, conv2/bn2 (basic) or conv1..3/bn1..3 (bottleneck) as above, no conv
                 bias; proj and proj_bn for a projection shortcut
    position_embedding  weight (max_length, dim): row t is added at position t
    patch_embedding     weight (dim, channels, patch, patch) [OIHW, as conv2d], bias (dim),
                 class_token (dim) when it has one
    layer_norm   gamma, beta (dim), both trainable (no running statistics)
    attention    q.weight, k.weight, v.weight (heads*head_size, dim), rows head-major (head h is rows
                 h*head_size .. (h+1)*head_size - 1), q.bias, k.bias, v.bias (heads*head_size);
                 out.weight (dim, heads*head_size), its columns in the same head order, out.bias (dim);
                 no biases when `bias` is false
    transformer_block   ln1.gamma/beta, attn.* (as attention), ln2.gamma/beta, mlp.fc1.weight
                 (mlp_ratio*dim, dim), mlp.fc1.bias, mlp.fc2.weight (dim, mlp_ratio*dim),
                 mlp.fc2.bias (no biases when `bias` is false); ln1 is the one before (pre-norm) or
                 after (post-norm) the attention's join
    lm_head      untied: weight (vocabulary, dim), bias (vocabulary) when `bias`; tied: bias only, the
                 weight being 000.weight, the token embedding's table (no tensor of its own)

Each layer type names its own tensors, in the `weights` function of its module in
definitions/layers/ (a type without one has none); this module collects them.

Dense layers that follow a flatten take their input in C, H, W order (the canonical flatten), so a
runner that computes in channels-last must permute those rows itself.

`random_weights` makes a weight set from the description alone (numpy, no framework): the same
set is loaded into every framework by `dlbench check`.
"""

from __future__ import annotations

import numpy as np

from . import layers

STATE_PARTS = ("running_mean", "running_var")  # carried in the format, not trained, not counted


def layer_shapes(index: int, layer: dict) -> dict[str, tuple[int, ...]]:
    """The canonical tensors of one resolved layer, by the `weights` of its type (definitions/layers/)."""
    return layers.lookup(layer["type"]).weights(f"{index:03d}", layer)


def weight_shapes(network: dict) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of a resolved network, in layer order."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i, layer in enumerate(network["layers"]):
        shapes.update(layer_shapes(i, layer))
    return shapes


def is_state(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in STATE_PARTS


def trainable_count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(int(np.prod(s)) for n, s in shapes.items() if not is_state(n))


# Learned vectors added to activations, not multiplied into them: GPT-2 and ViT draw them from
# N(0, 0.02^2), and 1/fan_in would make a position table (fan-in its width) several times larger
# than that. A position table's part is `weight`, as a matrix's is, so it is known by its layer's type.
TABLE_STD = 0.02
_TABLE_LAYERS = ("position_embedding",)


def random_weights(network: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A well-scaled weight set for the check: N(0, 1/fan_in) weights, small biases, norms near
    identity, class tokens and position tables N(0, TABLE_STD^2)."""
    rng = np.random.default_rng(seed)
    tables = {f"{i:03d}.weight" for i, layer in enumerate(network["layers"]) if layer["type"] in _TABLE_LAYERS}
    out = {}
    for name, shape in weight_shapes(network).items():
        part = name.rsplit(".", 1)[-1]
        if part == "class_token" or name in tables:
            a = TABLE_STD * rng.standard_normal(shape)
        elif part == "gamma":
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif part in ("beta", "bias"):
            a = 0.05 * rng.standard_normal(shape)
        elif part == "running_mean":
            a = 0.1 * rng.standard_normal(shape)
        elif part == "running_var":
            a = 1.0 + 0.1 * rng.random(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            if name.endswith(("w_ih", "w_hh")):
                fan_in = shape[1]
            a = rng.standard_normal(shape) / np.sqrt(fan_in)
        out[name] = a.astype(np.float32)
    return out
