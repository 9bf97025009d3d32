"""Which attention MXNet actually ran, for the mxnet runner's settings["attention"]: each attention
of the network (a standalone one, a transformer block's) run on one sample in the step's mode, with
the operators MXNet's profiler recorded: the fused interleaved_matmul_selfatt operators, or their
batch_dot equivalent (transformer.py's SelfAttention).
"""

from __future__ import annotations

from runners.mxnet.framework import ATTENTION_TYPES, FUSED_ATTENTION_OPS, load_mxnet
from runners.mxnet.transformer import transformer_classes


def attention_blocks(blocks: list, network: dict):
    """(canonical prefix, SelfAttention block) of every attention, standalone or a block's."""
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        if layer["type"] == "attention":
            yield f"{i:03d}", block
        elif layer["type"] in ("transformer_block", "llama_block"):
            yield f"{i:03d}.attn", block.attn
        elif layer["type"] == "grouped_attention":
            yield f"{i:03d}", block


def grouped_class():
    return transformer_classes()["GroupedAttention"]


def _operators_run(fn) -> list[str]:
    """The operators MXNet's profiler saw executed while `fn` ran imperatively (forward and, when
    `fn` runs one, backward), by name. The profiler's trace file goes to a directory removed after."""
    import json
    import os
    import tempfile

    mx = load_mxnet()
    with tempfile.TemporaryDirectory(prefix="dlbench-mxprof-") as folder:
        mx.profiler.set_config(profile_imperative=True, aggregate_stats=True,
                               filename=os.path.join(folder, "profile.json"))
        mx.profiler.set_state("run")
        try:
            fn()
            mx.nd.waitall()
        finally:
            mx.profiler.set_state("stop")
        stats = json.loads(mx.profiler.dumps(reset=True, format="json"))  # also writes the trace file
        mx.profiler.set_config(profile_imperative=False, aggregate_stats=False,
                               filename=os.path.join(folder, "profile.json"))
    # less the engine's bookkeeping and the probe's own seed of the backward pass (ones_like)
    return sorted(set(stats.get("Time", {}).get("operator", {})) - {"DeleteVariable", "ones_like"})


def _one_or_each(by_layer: dict):
    """One value where every attention got the same, else the value per layer."""
    values = {repr(v) for v in by_layer.values()}
    return next(iter(by_layer.values())) if len(values) == 1 else by_layer


def attention_record(blocks: list, network: dict, ctx, dtype: str, train: bool,
                     fused_unavailable: str | None) -> dict | None:
    """What MXNet ran for each attention (an attention layer, a transformer block's): one sample of
    the layer's input shape through its block, imperatively (before hybridisation: the hybridised
    graph calls the same operators, no subgraph backend partitioning it), in the step's mode
    (training: autograd, its dropout and the backward pass), with the operators MXNet's profiler
    recorded. None when the network has no attention."""
    import os

    mx = load_mxnet()
    attentions = list(attention_blocks(blocks, network))
    if not attentions:
        return None
    kernels, operators = {}, {}
    for prefix, attn in attentions:
        index = prefix.split(".")[0]
        x = mx.nd.zeros((1, *network["layers"][int(index)]["in_shape"]), ctx=ctx, dtype=dtype)

        def run():
            if train:
                with mx.autograd.record(train_mode=True):
                    out = attn(x)
                out.backward(mx.nd.ones_like(out))
            else:
                with mx.autograd.predict_mode():
                    attn(x)

        ops = _operators_run(run)
        if isinstance(attn, grouped_class()):
            kernels[index] = "batch_dot (grouped attention, composed: repeat, batch_dot, softmax, batch_dot)"
        elif all(op in ops for op in FUSED_ATTENTION_OPS):
            kernels[index] = "fused interleaved_matmul_selfatt"
        elif "batch_dot" in ops:
            kernels[index] = "batch_dot (the fused operators' documented equivalent)"
        else:
            kernels[index] = "unknown"
        operators[index] = ops
    features = mx.runtime.Features()
    cpu = ctx.device_type == "cpu"
    grouped = all(isinstance(attn, grouped_class()) for _, attn in attentions)
    record = {
        "function": ("grouped attention composed from MXNet's operators (transformer.py's GroupedAttention: Dense q, "
                     "k, v, rotary, the key/value heads repeated, batch_dot, softmax, batch_dot)" if grouped else
                     "mxnet.ndarray.contrib.interleaved_matmul_selfatt_qk and interleaved_matmul_selfatt_valatt "
                     "(GluonNLP's BERT path): one Dense to q, k and v interleaved per head, sequence-first (T, B, 3HS)"
                     if not fused_unavailable else
                     "batch_dot on the interleaved q/k/v projection (reshape, transpose, div_sqrt_dim, batch_dot: the "
                     "equivalent code the fused operators document)"),
        "kernel": _one_or_each(kernels),
        "operators": _one_or_each(operators),
        "implementation": ("MXNet's CPU kernels (src/operator/contrib/transformer.cc, float32 only): each product one "
                           "strided batch of sgemm over samples x heads, cblas_sgemm_batch with MKL, otherwise one "
                           "cblas_sgemm per sample and head of the BLAS libmxnet links"
                           if cpu else "MXNet's CUDA kernels (src/operator/contrib/transformer.cu): cuBLAS strided "
                                       "batched GEMM, tensor-op GEMM in float16")
        if not fused_unavailable and not grouped else "MXNet's batch_dot",
        "blas": next((n for n in ("BLAS_MKL", "BLAS_OPEN", "BLAS_ATLAS", "BLAS_APPLE") if n in features
                      and features.is_enabled(n)), None),
        # with MXNET_SUBGRAPH_BACKEND=MKLDNN a hybridised graph's fused operators and their projections
        # would become oneDNN's _sg_mkldnn_selfatt_*; unset, the graph runs the operators above
        "subgraph_backend": os.environ.get("MXNET_SUBGRAPH_BACKEND"),
        "probe": ("one sample of each attention's input shape through its imperative block before hybridize, in "
                  f"{'training (autograd on, its dropout, the backward pass)' if train else 'inference'} mode; the "
                  "operators MXNet's profiler recorded (profile_imperative, aggregate statistics)"),
    }
    if any(l.get("causal") for l in network["layers"] if l["type"] in ATTENTION_TYPES) or any(
            l["type"] == "llama_block" or (l["type"] == "grouped_attention" and l["causal"])
            for l in network["layers"]):
        record["causal_mask"] = ("a (1, T, T) constant, 0 on and below the diagonal and -inf above, broadcast-added "
                                 "to the scores before the softmax")
    if fused_unavailable:
        record["fused_unavailable"] = fused_unavailable
    return record
