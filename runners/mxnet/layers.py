"""The mxnet runner's layer table: `LAYERS`, one `Layer(build, weights)` per layer type of a resolved
dlbench description (src/dlbench/definitions/schema.py), its builder making the Gluon block and its
weight function naming the block's canonical tensors (None for a type without weights). The
non-transformer builders and their blocks (the LSTM, ResNet's residual block) are here; the
transformer's are in transformer.py. Nothing here imports mxnet at module level: the table is read
without the framework, which is loaded (framework.py) when a builder first runs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from runners.common.contract import Layer, LayerTable
from runners.mxnet import transformer
from runners.mxnet.framework import gluon_nn, load_mxnet


@functools.lru_cache(maxsize=None)
def layer_classes() -> dict:
    """The Gluon block classes of the non-transformer layers, which need the framework (defined once,
    lazily)."""
    mx = load_mxnet()
    nn = mx.gluon.nn

    class SequenceLSTM(mx.gluon.HybridBlock):
        """gluon.rnn.LSTM (the fused RNN operator), batch-major, returning the output sequence."""

        def __init__(self, features: int, hidden: int, layers: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.lstm = mx.gluon.rnn.LSTM(hidden, num_layers=layers, layout="NTC", input_size=features,
                                              h2h_bias_initializer="zeros", i2h_bias_initializer="zeros")
            for k in range(layers):
                getattr(self.lstm, f"l{k}_h2h_bias").grad_req = "null"  # canonical: one bias per layer

        def hybrid_forward(self, F, x):
            return self.lstm(x)  # no states given: zero initial state, output sequence only

    class OptionA(mx.gluon.HybridBlock):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra

        def hybrid_forward(self, F, x):
            s = self.stride
            if s > 1:
                x = F.slice(x, begin=(None, None, None, None), end=(None, None, None, None), step=(1, 1, s, s))
            if self.extra:
                zero = F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1))
                x = F.concat(x, F.broadcast_axis(zero, axis=1, size=self.extra), dim=1)
            return x

    class Residual(mx.gluon.HybridBlock):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1 (bottleneck), + shortcut, then relu."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            cin, cout = spec["in_shape"][0], spec["out_shape"][0]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                convs = [(cin, f, 3, s, True), (f, f, 3, 1, False)]
            else:
                convs = [(cin, f, 1, 1, True), (f, f, 3, s, True), (f, cout, 1, 1, False)]
            self.kind = spec["shortcut"]
            with self.name_scope():
                self.body = nn.HybridSequential(prefix="body_")
                self.conv_bn = []  # (conv, bn) positions in body, for the canonical weight names
                with self.body.name_scope():
                    for ci, co, k, stride, relu in convs:
                        self.conv_bn.append((len(self.body), len(self.body) + 1))
                        self.body.add(nn.Conv2D(co, k, stride, k // 2, in_channels=ci, use_bias=False),
                                      nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=co))
                        if relu:
                            self.body.add(nn.Activation("relu"))
                if self.kind == "projection":
                    self.proj = nn.Conv2D(cout, 1, s, 0, in_channels=cin, use_bias=False)
                    self.proj_bn = nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout)
                elif self.kind == "option_a":
                    self.option_a = OptionA(s, cout - cin)

        def hybrid_forward(self, F, x):
            if self.kind == "projection":
                short = self.proj_bn(self.proj(x))
            elif self.kind == "option_a":
                short = self.option_a(x)
            else:
                short = x
            # Activation, not F.relu: on CPU only Activation is a oneDNN primitive; the plain relu
            # operator forces oneDNN-layout tensors back to NCHW around it, forward and backward
            # (measured on ResNet-50 training, b4: 10-25% of the step).
            return F.Activation(self.body(x) + short, act_type="relu")

    return {"SequenceLSTM": SequenceLSTM, "OptionA": OptionA, "Residual": Residual}


def block_classes() -> dict:
    """Every layer's Gluon block class (and the layer norm and GELU factories), by name."""
    return {**layer_classes(), **transformer.transformer_classes()}


# ------------------------------------------------------------------ layers: type -> builder(spec, build)
# `build` (build_network's namespace) carries what a builder may need besides its entry: the block
# classes, the blocks built before it (a tied head takes the embedding's parameters), how the
# network computes (fused attention or not, float64 or not) and the resolved input (a masked_tokens
# input's segment_boundary and masked_positions).


def _dense(spec, build):
    # flatten=False keeps a (batch, steps, features) input and applies the weights at every step
    in_shape = spec["in_shape"]
    init = spec.get("init")
    # the described initialisation (a parameter's own initialiser outranks the network's Xavier; Gluon's
    # biases start at zero): Xavier draws U(-sqrt(m / fan), ..) or N(0, m / fan), so m is 3 scale or scale
    described = {"weight_initializer": load_mxnet().init.Xavier(
        rnd_type="gaussian" if init["distribution"] == "normal" else "uniform",
        factor_type={"fan_in": "in", "fan_out": "out", "fan_avg": "avg"}[init["mode"]],
        magnitude=init["scale"] * (1 if init["distribution"] == "normal" else 3))} if init else {}
    return gluon_nn().Dense(spec["units"], use_bias=spec["bias"], flatten=len(in_shape) != 2,
                            in_units=in_shape[-1], **described)


def _conv2d(spec, build):
    return gluon_nn().Conv2D(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]), tuple(spec["padding"]),
                             in_channels=spec["in_shape"][0], use_bias=spec["bias"], layout="NCHW")


def _max_pool(spec, build):
    # pooling_convention "valid" (ceil_mode False) is the canonical floor; padded cells never win
    return gluon_nn().MaxPool2D(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]), ceil_mode=False)


def _avg_pool(spec, build):
    return gluon_nn().AvgPool2D(tuple(spec["size"]), tuple(spec["stride"]), 0, ceil_mode=False)


def _global_avg_pool(spec, build):
    nn = gluon_nn()
    seq = nn.HybridSequential()
    seq.add(nn.GlobalAvgPool2D(), nn.Flatten())
    return seq


def _batch_norm(spec, build):
    return gluon_nn().BatchNorm(axis=1, momentum=1.0 - spec["momentum"], epsilon=spec["eps"],
                                in_channels=spec["in_shape"][0])


def _activation(spec, build):  # relu, sigmoid, tanh: MXNet's own names
    return gluon_nn().Activation(spec["type"])


def _flatten(spec, build):
    return gluon_nn().Flatten()  # (C, H, W) row-major: the canonical order for NCHW


def _dropout(spec, build):
    return gluon_nn().Dropout(spec["rate"])


def _embedding(spec, build):
    # the described scale (a parameter's own initialiser outranks the network's Xavier), else that Xavier
    init = {"weight_initializer": load_mxnet().init.Normal(spec["init_std"])} if spec.get("init_std") else {}
    return gluon_nn().Embedding(spec["vocabulary"], spec["dim"], **init)


def _lstm(spec, build):
    return build.classes["SequenceLSTM"](spec["in_shape"][-1], spec["hidden"], spec["layers"])


def _residual(spec, build):
    return build.classes["Residual"](spec)


# ------------------------------------------------------------------ canonical weights: weights(prefix, layer, block)
# name -> where the framework keeps it (weights.py exports and loads them): a Gluon Parameter, or
# an LSTM layer's two biases. Gluon's layouts are the canonical ones (OIHW, out x in, LSTM gates
# i f g o), so only the LSTM's biases and attention's interleaved q/k/v projection (transformer.py)
# need care.


class SummedBiases(NamedTuple):
    """One canonical LSTM bias kept as Gluon's two (i2h, h2h): h2h is zero and frozen (SequenceLSTM),
    so the canonical bias is their sum on export and goes into i2h on import."""

    i2h: object
    h2h: object


def _batch_norm_params(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.gamma, f"{prefix}.beta": bn.beta,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def _dense_weights(prefix: str, layer: dict, block) -> dict:  # dense and conv2d
    return transformer.weight_and_bias(prefix, block)


def _batch_norm_weights(prefix: str, layer: dict, block) -> dict:
    return _batch_norm_params(prefix, block)


def _lstm_weights(prefix: str, layer: dict, block) -> dict:
    out = {}
    for k in range(layer["layers"]):
        out[f"{prefix}.l{k}.w_ih"] = getattr(block.lstm, f"l{k}_i2h_weight")
        out[f"{prefix}.l{k}.w_hh"] = getattr(block.lstm, f"l{k}_h2h_weight")
        out[f"{prefix}.l{k}.bias"] = SummedBiases(getattr(block.lstm, f"l{k}_i2h_bias"),
                                                  getattr(block.lstm, f"l{k}_h2h_bias"))
    return out


def _residual_weights(prefix: str, layer: dict, block) -> dict:
    out = {}
    for j, (c, b) in enumerate(block.conv_bn, start=1):
        out[f"{prefix}.conv{j}.weight"] = block.body[c].weight
        out.update(_batch_norm_params(f"{prefix}.bn{j}", block.body[b]))
    if layer["shortcut"] == "projection":
        out[f"{prefix}.proj.weight"] = block.proj.weight
        out.update(_batch_norm_params(f"{prefix}.proj_bn", block.proj_bn))
    return out


# ------------------------------------------------------------------ the table

LAYERS = LayerTable("mxnet", {
    "dense": Layer(_dense, _dense_weights),
    "conv2d": Layer(_conv2d, _dense_weights),
    "max_pool": Layer(_max_pool),
    "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool),
    "batch_norm": Layer(_batch_norm, _batch_norm_weights),
    "relu": Layer(_activation),
    "sigmoid": Layer(_activation),
    "tanh": Layer(_activation),
    "flatten": Layer(_flatten),
    "dropout": Layer(_dropout),
    "embedding": Layer(_embedding, transformer.table_weight),
    "lstm": Layer(_lstm, _lstm_weights),
    "residual": Layer(_residual, _residual_weights),
    "position_embedding": Layer(transformer.build_position_embedding, transformer.table_weight),
    "patch_embedding": Layer(transformer.build_patch_embedding, transformer.patch_embedding_weights),
    "layer_norm": Layer(transformer.build_layer_norm, transformer.layer_norm_weights),
    "gelu": Layer(transformer.build_gelu),
    "attention": Layer(transformer.build_attention, transformer.attention_weights),
    "transformer_block": Layer(transformer.build_transformer_block, transformer.transformer_block_weights),
    "token_pool": Layer(transformer.build_token_pool),
    "lm_head": Layer(transformer.build_lm_head, transformer.lm_head_weights),
    "segment_embedding": Layer(transformer.build_segment_embedding, transformer.table_weight),
    "pretraining_heads": Layer(transformer.build_pretraining_heads, transformer.pretraining_heads_weights),
    "rms_norm": Layer(transformer.build_rms_norm, transformer.rms_norm_weights),
    "grouped_attention": Layer(transformer.build_grouped_attention, transformer.grouped_attention_weights),
    "swiglu": Layer(transformer.build_swiglu, transformer.swiglu_weights),
    "moe": Layer(transformer.build_moe, transformer.moe_weights),
    "llama_block": Layer(transformer.build_llama_block, transformer.llama_block_weights),
})
