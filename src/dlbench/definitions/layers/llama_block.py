"""llama_block: `repeat` Llama-style blocks, RMSNorm, grouped-query attention with rotary position
embedding, RMSNorm and a SwiGLU MLP (or, with `moe`, a Mixture-of-Experts of SwiGLU experts), each
with its residual join (schema.py). The resolved network has one entry per block, as
transformer_block's; the parts are rms_norm.py's, grouped_attention.py's, swiglu.py's and moe.py's
functions."""

from __future__ import annotations

from .. import schema
from . import attention, grouped_attention, moe, rms_norm, swiglu
from .base import Inferred, LayerType, Site


def counts(steps: int, dim: int, entry: dict) -> tuple[int, int]:
    """(params, forward FLOPs per sample) of one block on (steps, dim)."""
    norm_params, norm_flops = rms_norm.counts((steps, dim))
    attn_params, attn_flops = grouped_attention.counts(steps, dim, entry["heads"], entry["kv_heads"],
                                                       entry["head_size"])
    routing = entry["moe"]
    if routing is None:
        ffn_params, ffn_flops = swiglu.counts(steps, dim, entry["hidden"])
    else:
        ffn_params, ffn_flops = moe.counts(steps, dim, entry["hidden"], routing["experts"], routing["top_k"])
    joins = 2 * steps * dim  # the two residual additions
    return 2 * norm_params + attn_params + ffn_params, 2 * norm_flops + attn_flops + ffn_flops + joins


def infer(layer: schema.LlamaBlock, site: Site) -> Inferred:
    steps, dim = attention.require_sequence(site, "llama_block")
    size = attention.head_size(site.index, dim, layer.heads, layer.head_size)
    grouped_attention.check_heads(site.index, layer.heads, layer.kv_heads, size)
    entry = layer.model_dump(mode="json", exclude={"repeat"})
    entry.update(head_size=size, in_shape=list(site.shape), out_shape=list(site.shape))
    if entry["moe"] is not None:
        # the blocks' auxiliary losses are averaged over the stack (HuggingFace's mean over layers)
        entry["moe"]["aux_loss_weight"] = layer.moe.aux_loss_coefficient / layer.repeat
    params, flops = counts(steps, dim, entry)
    resolved = [dict(entry) for _ in range(layer.repeat)]
    return Inferred(site.shape, layer.repeat * params, layer.repeat * flops, resolved)


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    dim = entry["in_shape"][-1]
    out = rms_norm.tensors(f"{prefix}.norm1", dim)
    out.update(grouped_attention.tensors(f"{prefix}.attn", dim, entry["heads"], entry["kv_heads"],
                                         entry["head_size"]))
    out.update(rms_norm.tensors(f"{prefix}.norm2", dim))
    if entry["moe"] is None:
        out.update(swiglu.tensors(f"{prefix}.mlp", dim, entry["hidden"]))
    else:
        out.update(moe.tensors(f"{prefix}.moe", dim, entry["hidden"], entry["moe"]["experts"]))
    return out


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    n = b.batch * steps * dim
    shape = (steps, dim)
    rms_norm.passes(b, layer, "norm1", shape, input_grad)
    grouped_attention.products(b, layer, "attn", steps, dim, entry["heads"], entry["kv_heads"],
                               entry["head_size"], input_grad=True, causal=True)
    layer.forward.append(b.passes("attn join", n, 3, epilogue=True))
    if b.train and input_grad:
        layer.backward.append(b.passes("attn join gradient", n, 3))
    rms_norm.passes(b, layer, "norm2", shape, input_grad=True)
    if entry["moe"] is None:
        swiglu.products(b, layer, "mlp", steps, dim, entry["hidden"], input_grad=True)
    else:
        moe.products(b, layer, "moe", steps, dim, entry["hidden"], entry["moe"]["experts"], entry["moe"]["top_k"],
                     input_grad=True)
    layer.forward.append(b.passes("mlp join", n, 3, epilogue=True))
    if b.train:
        layer.backward.append(b.passes("mlp join gradient", n, 3))


def decisions(entry: dict) -> int:
    """The MoE's top-k choice, one per block; a dense block has none."""
    return 0 if entry["moe"] is None else 1


# Per resolved entry: attention's 4 products in sequence and the MLP's (or an expert's) two.
LAYER = LayerType(schema.LlamaBlock, infer, work, weights, rounding_depth=6, decisions=decisions)
