"""The attention report of the TensorFlow runner: which of keras.layers.MultiHeadAttention's paths
each attention of the network actually ran, read back from a trace (settings["attention"])."""

from __future__ import annotations

from runners.tensorflow.framework import load_keras, load_tf


# which attention Keras ran. keras.layers.MultiHeadAttention computes the heads' products itself (two
# einsums around keras.layers.Softmax, then its Dropout on the probabilities) when the layer has
# dropout, and otherwise hands them to keras.ops.dot_product_attention, whose TensorFlow backend has
# no flash or fused kernel (flash_attention=True raises there, None runs as False): einsum, a float32
# softmax, einsum. Which one a layer takes is read from one trace of it, not assumed.

ATTENTION_BOOKKEEPING = {"Placeholder", "ReadVariableOp", "Identity", "Const", "NoOp"}


def attention_setting(network: dict, per_layer: list, train: bool, jit: bool, cuda: bool) -> dict | None:
    """What Keras ran for each attention (an attention layer, a transformer block's): its
    MultiHeadAttention traced once (a tf.function, never run: no state changes) on one sample of the
    layer's shape in its compute dtype and the step's mode, with keras.ops.dot_product_attention
    watched for the call and its flash_attention argument, and the TensorFlow op types of the trace.
    None when the network has no attention."""
    import unittest.mock

    import keras.src.ops as keras_ops  # the module MultiHeadAttention calls ops.dot_product_attention on

    tf, keras = load_tf(), load_keras()
    attentions = []
    for i, (spec, made) in enumerate(zip(network["layers"], per_layer)):
        if spec["type"] == "attention":
            attentions.append((f"{i:03d}", spec, made[0].mha))
        elif spec["type"] in ("transformer_block", "grouped_attention", "llama_block"):
            attentions.append((f"{i:03d}", spec, made[0].attn if spec["type"] != "grouped_attention" else made[0]))
    if not attentions:
        return None
    paths, ops_seen, flash_args = {}, {}, {}
    for name, spec, mha in attentions:
        calls: list = []

        def watched(*args, calls=calls, real=keras_ops.dot_product_attention, **kwargs):
            calls.append(kwargs.get("flash_attention"))
            return real(*args, **kwargs)

        def trace(x, mha=mha, causal=spec.get("causal", True)):
            if isinstance(mha, keras.layers.MultiHeadAttention):
                return mha(x, x, use_causal_mask=causal, training=train)
            return mha(x)  # a grouped attention (transformer.py): keras.ops.dot_product_attention, no dropout

        # MultiHeadAttention calls it on keras.src.ops, a grouped attention on keras.ops: both watched
        with unittest.mock.patch.object(keras_ops, "dot_product_attention", watched), \
                unittest.mock.patch.object(keras.ops, "dot_product_attention", watched):
            graph = tf.function(trace).get_concrete_function(
                tf.TensorSpec((1, *spec["in_shape"]), mha.compute_dtype)).graph
        if calls:
            paths[name] = ("keras.ops.dot_product_attention (Keras' TensorFlow backend: einsum, softmax in at least "
                           "float32, einsum; it has no flash kernel)")
            flash_args[name] = calls[0]
        else:
            dropout = (f"Dropout {spec['dropout']:g} on the probabilities" if train else
                       f"its Dropout {spec['dropout']:g} inactive in inference")
            paths[name] = (f"MultiHeadAttention's own einsum path (einsum, keras.layers.Softmax, {dropout}, einsum), "
                           "which Keras takes whenever the layer has dropout")
            flash_args[name] = None
        ops_seen[name] = sorted({op.type for op in graph.get_operations()} - ATTENTION_BOOKKEEPING)

    def one_or_each(by_layer: dict):  # one value where every attention got the same, else per layer
        values = {repr(v) for v in by_layer.values()}
        return next(iter(by_layer.values())) if len(values) == 1 else by_layer

    return {
        "function": one_or_each({name: ("keras.layers.MultiHeadAttention" if isinstance(mha, keras.layers.MultiHeadAttention)
                                        else "keras_hub-style grouped attention (EinsumDense, rotary)")
                                 for name, _, mha in attentions}),
        "kernel": one_or_each(paths),
        "flash_attention": {
            "argument": one_or_each(flash_args),
            "keras.config.is_flash_attention_enabled()": keras.config.is_flash_attention_enabled(),
            "tensorflow_backend": "keras/src/backend/tensorflow/nn.py dot_product_attention: flash_attention None "
                                  "runs as False, True raises 'not supported in tensorflow backend'",
        },
        "tf_ops": one_or_each(ops_seen),
        "executed_by": ("XLA, compiled with the whole step (jit_compile=True)" if jit else
                        "TensorFlow's executor, op by op (" + ("GPU kernels" if cuda else "CPU kernels") + ")"),
        "probe": ("each MultiHeadAttention traced once by tf.function on one sample of its input shape in its "
                  f"compute dtype, {'training' if train else 'inference'} mode; keras.ops.dot_product_attention "
                  "watched for the call"),
    }
