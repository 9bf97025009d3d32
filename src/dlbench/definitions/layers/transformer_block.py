"""transformer_block: `repeat` blocks of layer norms, self-attention and a GELU MLP with two residual
joins, pre- or post-norm (schema.py). The resolved network has one entry per block, as residual
stages do; the attention and layer-norm parts are attention.py's and layer_norm.py's functions, the
MLP's two products dense.py's."""

from __future__ import annotations

from .. import schema
from . import attention, dense, gelu, layer_norm
from .base import Inferred, LayerType, Site


def counts(steps: int, dim: int, heads: int, size: int, mlp_ratio: int, bias: bool) -> tuple[int, int]:
    """(params, forward FLOPs per sample) of one block on (steps, dim)."""
    hidden = mlp_ratio * dim
    ln_params, ln_flops = layer_norm.counts((steps, dim))
    attn_params, attn_flops = attention.counts(steps, dim, heads, size, bias)
    fc1_params, fc1_flops = dense.counts(steps, dim, hidden, bias)
    fc2_params, fc2_flops = dense.counts(steps, hidden, dim, bias)
    params = 2 * ln_params + attn_params + fc1_params + fc2_params
    joins = 2 * steps * dim  # the two residual additions, one FLOP per element each
    flops = (2 * ln_flops + attn_flops + fc1_flops + gelu.FLOPS_PER_ELEMENT * steps * hidden + fc2_flops
             + joins)
    return params, flops


def infer(layer: schema.TransformerBlock, site: Site) -> Inferred:
    steps, dim = attention.require_sequence(site, "transformer_block")
    size = attention.head_size(site.index, dim, layer.heads, layer.head_size)
    params, flops = counts(steps, dim, layer.heads, size, layer.mlp_ratio, layer.bias)
    entry = layer.model_dump(mode="json", exclude={"repeat"})
    entry.update(head_size=size, in_shape=list(site.shape), out_shape=list(site.shape))
    resolved = [dict(entry) for _ in range(layer.repeat)]
    return Inferred(site.shape, layer.repeat * params, layer.repeat * flops, resolved)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    dim = entry["in_shape"][-1]
    hidden = entry["mlp_ratio"] * dim
    out = layer_norm.tensors(f"{prefix}.ln1", dim)
    out.update(attention.tensors(f"{prefix}.attn", dim, entry["heads"], entry["head_size"], entry["bias"]))
    out.update(layer_norm.tensors(f"{prefix}.ln2", dim))
    out.update(dense.tensors(f"{prefix}.mlp.fc1", dim, hidden, entry["bias"]))
    out.update(dense.tensors(f"{prefix}.mlp.fc2", hidden, dim, entry["bias"]))
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    hidden = entry["mlp_ratio"] * dim
    rows = b.batch * steps
    n = rows * dim
    rate = entry["dropout"]
    shape = (steps, dim)
    train = b.train

    def attn(grad_of_input: bool) -> None:
        attention.products(b, layer, "attn", steps, dim, entry["heads"], entry["head_size"], entry["bias"],
                           rate, grad_of_input, causal=entry["causal"])

    def mlp() -> None:
        dense.products(b, layer, "mlp fc1", steps, dim, hidden, entry["bias"], input_grad=True)
        gelu.passes(b, layer, "mlp", rows * hidden, input_grad=True, form=entry["gelu"])
        dense.products(b, layer, "mlp fc2", steps, hidden, dim, entry["bias"], input_grad=True)

    def join(name: str, into_input: bool) -> None:
        """Dropout on the branch (none at rate 0, where torch, Keras and flax return the input
        itself), then the residual addition (3 passes); backward, dy goes to both paths and the two
        gradients meet again where the branch left the stream (3 passes), unless that is the block's
        input and needs none."""
        if train and rate > 0:
            layer.forward.append(b.passes(f"{name} branch dropout", n, 3))
            layer.backward.append(b.passes(f"{name} branch dropout", n, 3))
        layer.forward.append(b.passes(f"{name} join", n, 3, epilogue=True))
        if train and (input_grad or not into_input):
            layer.backward.append(b.passes(f"{name} join gradient", n, 3))

    if entry["norm"] == "pre":
        layer_norm.passes(b, layer, "ln1", shape, input_grad)
        attn(grad_of_input=True)  # its input is ln1's output, whose gamma and beta train
        join("attn", into_input=True)
        layer_norm.passes(b, layer, "ln2", shape, input_grad=True)
        mlp()
        join("mlp", into_input=False)
    else:
        attn(grad_of_input=input_grad)
        join("attn", into_input=True)
        layer_norm.passes(b, layer, "ln1", shape, input_grad=True)
        mlp()
        join("mlp", into_input=False)
        layer_norm.passes(b, layer, "ln2", shape, input_grad=True)


# Per resolved entry (one block): attention's 4 products in sequence and the MLP's two (the residual
# joins are the shorter paths); GELU, softmax and layer norm are smooth, so no decision.
LAYER = LayerType(schema.TransformerBlock, infer, work, weights, rounding_depth=6, decisions=0)
