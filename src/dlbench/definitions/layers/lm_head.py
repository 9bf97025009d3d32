"""lm_head: (T, D) -> (T, vocabulary) logits, vocabulary from the token input. Tied: the weight is
the token embedding's (vocabulary, D) table (the network's first layer), so it is neither a tensor
of this layer nor counted again; untied: a (vocabulary, D) weight of its own. FLOPs: a dense layer's."""

from __future__ import annotations

from .. import schema
from . import dense
from .base import Inferred, LayerType, Site


def infer(layer: schema.LMHead, site: Site) -> Inferred:
    first = site.first
    if layer.tied and getattr(first, "type", None) != "embedding":
        found = getattr(first, "type", "none")
        raise site.error(f"a tied lm_head needs the network's token embedding (its first layer), "
                         f"and this network starts with {found}")
    if not site.tokens:
        raise site.error("lm_head needs a token input (its vocabulary)")
    if len(site.shape) != 2:
        raise site.error(f"lm_head needs a sequence (T, D) input, got {list(site.shape)}")
    steps, dim = site.shape
    vocabulary = site.input.vocabulary
    if layer.tied and first.dim != dim:
        raise site.error(f"a tied lm_head takes the embedding's width {first.dim}, got {dim}")
    params, flops = dense.counts(steps, dim, vocabulary, layer.bias)
    if layer.tied:
        params -= vocabulary * dim  # the embedding's table, counted there
    return Inferred((steps, vocabulary), params, flops)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    dim, vocabulary = entry["in_shape"][-1], entry["out_shape"][-1]
    if entry["tied"]:
        return {f"{prefix}.bias": (vocabulary,)} if entry["bias"] else {}
    return dense.tensors(prefix, dim, vocabulary, entry["bias"])


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    vocabulary = entry["out_shape"][-1]
    # the weight gradient is computed tied or not; tied, it is added into the table's gradient,
    # whose update is the embedding's (the workload counts the update from `weights`)
    dense.products(b, layer, "", steps, dim, vocabulary, entry["bias"], input_grad)
    if b.train and entry["tied"]:
        layer.backward.append(b.passes("tied gradient sum", vocabulary * dim, 3))


LAYER = LayerType(schema.LMHead, infer, work, weights, rounding_depth=1, decisions=0)
