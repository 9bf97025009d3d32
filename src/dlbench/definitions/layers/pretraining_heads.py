"""pretraining_heads: BERT's pooler, next-sentence head and masked-LM head on the encoder's (T, D)
output (the semantics in schema.PretrainingHeads), -> the (M, vocabulary) masked-LM logits at the
input's M masked positions; the (2,) next-sentence logits go to the loss beside them.

Parameters: the pooler D*D + D and the next-sentence classifier 2D + 2, the masked-LM transform
D*D + D with its layer norm 2D, the decoder's bias (vocabulary) and, untied, its (vocabulary, D)
weight. The pooler belongs to the encoder (the published BERT-base count, 109,482,240, includes
it); the rest are the pre-training heads, reported as `head_params` so that a listing can show the
published count beside them. FLOPs: the pooler's and classifier's dense products and tanh (one per
element), and at the M masked positions the transform (dense, GELU, layer norm) and the decoder's
dense product; the gathers are 0, as the embedding's lookup."""

from __future__ import annotations

from .. import schema
from . import dense, gelu, layer_norm
from .base import Inferred, LayerType, Site

NEXT_SENTENCE_CLASSES = 2


def parts(dim: int, vocabulary: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """The canonical tensors, unprefixed: pooler, next_sentence, transform (+ transform_ln), decoder."""
    out = {}
    out.update(dense.tensors("pooler", dim, dim, True))
    out.update(dense.tensors("next_sentence", dim, NEXT_SENTENCE_CLASSES, True))
    out.update(dense.tensors("transform", dim, dim, True))
    out.update(layer_norm.tensors("transform_ln", dim))
    if not tied:
        out["decoder.weight"] = (vocabulary, dim)
    out["decoder.bias"] = (vocabulary,)
    return out


def infer(layer: schema.PretrainingHeads, site: Site) -> Inferred:
    if getattr(site.input, "kind", None) != "masked_tokens":
        raise site.error("pretraining_heads needs a masked_tokens input (its masked positions)")
    if len(site.shape) != 2:
        raise site.error(f"pretraining_heads needs a sequence (T, D) input, got {list(site.shape)}")
    first = site.first
    steps, dim = site.shape
    vocabulary = site.input.vocabulary
    if layer.tied:
        if getattr(first, "type", None) != "embedding":
            raise site.error("tied pretraining_heads need the network's token embedding (its first layer), "
                             f"and this network starts with {getattr(first, 'type', 'none')}")
        if first.dim != dim:
            raise site.error(f"tied pretraining_heads take the embedding's width {first.dim}, got {dim}")
    masked = len(site.input.masked_positions())
    pooler_params, pooler_flops = dense.counts(1, dim, dim, True)
    nsp_params, nsp_flops = dense.counts(1, dim, NEXT_SENTENCE_CLASSES, True)
    transform_params, transform_flops = dense.counts(masked, dim, dim, True)
    ln_params, ln_flops = layer_norm.counts((masked, dim))
    decoder_params, decoder_flops = dense.counts(masked, dim, vocabulary, True)
    if layer.tied:
        decoder_params -= vocabulary * dim  # the embedding's table, counted there
    params = pooler_params + nsp_params + transform_params + ln_params + decoder_params
    flops = (pooler_flops + dim + nsp_flops + transform_flops + gelu.FLOPS_PER_ELEMENT * masked * dim + ln_flops
             + decoder_flops)
    return Inferred((masked, vocabulary), params, flops, head_params=params - pooler_params)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    dim, vocabulary = entry["in_shape"][-1], entry["out_shape"][-1]
    return {f"{prefix}.{name}": shape for name, shape in parts(dim, vocabulary, entry["tied"]).items()}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    masked, vocabulary = entry["out_shape"]
    e = b.element_bytes
    rows = b.batch * masked
    layer.forward.append(b.passes("gather masked positions", rows * dim, 2, 0))
    dense.products(b, layer, "pooler", 1, dim, dim, True, input_grad)
    layer.forward.append(b.passes("pooler tanh", b.batch * dim, 2))
    if b.train:
        layer.backward.append(b.passes("pooler tanh", b.batch * dim, 3, 2))
    dense.products(b, layer, "next sentence", 1, dim, NEXT_SENTENCE_CLASSES, True, input_grad=True)
    dense.products(b, layer, "transform", masked, dim, dim, True, input_grad)
    gelu.passes(b, layer, "transform", rows * dim, input_grad=True)
    layer_norm.passes(b, layer, "transform", (masked, dim), input_grad=True)
    dense.products(b, layer, "decoder", masked, dim, vocabulary, True, input_grad=True)
    if b.train:
        if entry["tied"]:  # added into the table's gradient, whose update is the embedding's
            layer.backward.append(b.passes("tied gradient sum", vocabulary * dim, 3))
        if input_grad:  # dx: zeros but position 0 and the masked rows, which get the heads' gradients
            layer.backward.append(b.op("heads' input gradient", rows * dim, e * (b.batch * steps * dim + rows * dim)))


# The masked-LM path to the logits: the transform and the decoder (GELU and layer norm are smooth).
LAYER = LayerType(schema.PretrainingHeads, infer, work, weights, rounding_depth=2, decisions=0)
