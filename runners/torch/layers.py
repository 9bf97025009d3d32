"""The torch runner's layer types: LAYERS, one `Layer(build, weights)` per type of a resolved dlbench
layer (src/dlbench/definitions/schema.py), holding the function that builds it as a torch.nn module
and the function that names its canonical weights (src/dlbench/definitions/weights.py) and hands
the torch tensor that holds each one; the transformer layers' are transformer.py's. step.py builds
the network from this table, weights.py exports and imports the weights through it.

A weight function takes (prefix "NNN", the resolved layer, its module) and returns name -> tensor
(parameter or buffer), or a SplitBias where torch keeps one canonical tensor as two. torch's own
layouts are the canonical ones (OIHW, out x in, gates i f g o), so only the LSTM's two biases need
care.

Nothing here imports torch at module level (framework.load_torch): the table is read before the
runner's thread configuration.
"""

from __future__ import annotations

from runners.common.contract import Layer, LayerTable
from runners.torch import transformer
from runners.torch.framework import load_torch

# ------------------------------------------------------------------ builders: resolved layer -> module


def _dense(spec: dict):
    layer = load_torch().nn.Linear(spec["in_shape"][-1], spec["units"], bias=spec["bias"])
    if spec.get("init"):  # the described initialisation, else nn.Linear's own U(-1/sqrt(F), 1/sqrt(F))
        variance_scaled_(layer, spec["init"])
    return layer


def variance_scaled_(layer, init: dict) -> None:
    """A dense layer's described `init` (definitions/schema.py): weights of variance scale / fan from
    a normal or a uniform distribution, biases zero."""
    import math

    torch = load_torch()
    units, features = layer.weight.shape
    fan = {"fan_in": features, "fan_out": units, "fan_avg": (features + units) / 2}[init["mode"]]
    std = math.sqrt(init["scale"] / fan)
    with torch.no_grad():
        if init["distribution"] == "normal":
            layer.weight.normal_(0.0, std)
        else:
            layer.weight.uniform_(-math.sqrt(3) * std, math.sqrt(3) * std)
        if layer.bias is not None:
            layer.bias.zero_()


def _conv2d(spec: dict):
    return load_torch().nn.Conv2d(spec["in_shape"][0], spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]),
                             tuple(spec["padding"]), bias=spec["bias"])


def _max_pool(spec: dict):
    return load_torch().nn.MaxPool2d(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]))


def _avg_pool(spec: dict):
    return load_torch().nn.AvgPool2d(tuple(spec["size"]), tuple(spec["stride"]))


def _global_avg_pool(spec: dict):
    nn = load_torch().nn
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _batch_norm(spec: dict):
    nn = load_torch().nn
    cls = nn.BatchNorm2d if len(spec["in_shape"]) == 3 else nn.BatchNorm1d
    return cls(spec["in_shape"][0], eps=spec["eps"], momentum=spec["momentum"])


def _relu(spec: dict):
    return load_torch().nn.ReLU(inplace=True)


def _sigmoid(spec: dict):
    return load_torch().nn.Sigmoid()


def _tanh(spec: dict):
    return load_torch().nn.Tanh()


def _flatten(spec: dict):
    return load_torch().nn.Flatten()


def _dropout(spec: dict):
    return load_torch().nn.Dropout(spec["rate"])


def _embedding(spec: dict):
    torch = load_torch()
    embedding = torch.nn.Embedding(spec["vocabulary"], spec["dim"])
    if spec.get("init_std"):  # the described scale, else nn.Embedding's own N(0, 1)
        torch.nn.init.normal_(embedding.weight, std=spec["init_std"])
    return embedding


def _lstm(spec: dict):
    return lstm_layer(spec["in_shape"][-1], spec["hidden"], spec["layers"])


def _residual(spec: dict):
    torch = load_torch()
    nn = torch.nn
    cin = spec["in_shape"][0]
    cout = spec["out_shape"][0]
    f, s = spec["filters"], spec["stride"]

    def conv_bn(ci, co, k, stride, relu):
        layers = [nn.Conv2d(ci, co, k, stride, k // 2, bias=False), nn.BatchNorm2d(co)]
        return layers + ([nn.ReLU(inplace=True)] if relu else [])

    if spec["block"] == "basic":
        body = conv_bn(cin, f, 3, s, True) + conv_bn(f, f, 3, 1, False)
    else:
        body = conv_bn(cin, f, 1, 1, True) + conv_bn(f, f, 3, s, True) + conv_bn(f, cout, 1, 1, False)

    class OptionA(nn.Module):
        def forward(self, x):
            if s > 1:
                x = x[:, :, ::s, ::s]
            return torch.nn.functional.pad(x, (0, 0, 0, 0, 0, cout - cin))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*body)
            if spec["shortcut"] == "projection":
                self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1, s, False))
            elif spec["shortcut"] == "option_a":
                self.shortcut = OptionA()
            else:
                self.shortcut = nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    return Block()


def lstm_layer(features: int, hidden: int, layers: int):
    """The runner's LSTM (also what the kernels suite times as `lstm_layer`): nn.LSTM, cuDNN's fused
    kernel on GPU, returning the output sequence."""
    torch = load_torch()

    class SequenceLSTM(torch.nn.Module):
        """nn.LSTM (cuDNN's fused kernel on GPU) returning the output sequence.

        The canonical LSTM has one bias vector per layer; torch has two, so the hidden-to-hidden
        bias is zeroed and frozen, which keeps the trainable parameter count canonical.
        """

        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(features, hidden, layers, batch_first=True)
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_hh"):
                    torch.nn.init.zeros_(p)
                    p.requires_grad_(False)

        def forward(self, x):
            return self.lstm(x)[0]

    return SequenceLSTM()


# ------------------------------------------------------------------ canonical weights: layer -> its tensors


class SplitBias:
    """One canonical tensor that torch keeps as two: the LSTM's bias, torch's bias_ih + bias_hh.
    Exported as their sum; imported into bias_ih, with bias_hh zeroed (it is frozen at zero:
    lstm_layer)."""

    __slots__ = ("input", "hidden")

    def __init__(self, input, hidden):
        self.input = input
        self.hidden = hidden


def _bn_tensors(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.weight, f"{prefix}.beta": bn.bias,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def _weight_and_bias(prefix: str, layer: dict, module) -> dict:
    """dense, conv2d: the weight, and the bias where the layer has one."""
    out = {f"{prefix}.weight": module.weight}
    if module.bias is not None:
        out[f"{prefix}.bias"] = module.bias
    return out


def _batch_norm_weights(prefix: str, layer: dict, module) -> dict:
    return _bn_tensors(prefix, module)


def _embedding_weights(prefix: str, layer: dict, module) -> dict:
    return {f"{prefix}.weight": module.weight}


def _lstm_weights(prefix: str, layer: dict, module) -> dict:
    out = {}
    for k in range(layer["layers"]):
        out[f"{prefix}.l{k}.w_ih"] = getattr(module.lstm, f"weight_ih_l{k}")
        out[f"{prefix}.l{k}.w_hh"] = getattr(module.lstm, f"weight_hh_l{k}")
    for k in range(layer["layers"]):
        out[f"{prefix}.l{k}.bias"] = SplitBias(getattr(module.lstm, f"bias_ih_l{k}"),
                                               getattr(module.lstm, f"bias_hh_l{k}"))
    return out


def _residual_weights(prefix: str, layer: dict, module) -> dict:
    nn = load_torch().nn
    out = {}
    convs = [m for m in module.body if isinstance(m, nn.Conv2d)]
    bns = [m for m in module.body if isinstance(m, nn.BatchNorm2d)]
    for j, (c, b) in enumerate(zip(convs, bns), start=1):
        out[f"{prefix}.conv{j}.weight"] = c.weight
        out.update(_bn_tensors(f"{prefix}.bn{j}", b))
    if layer["shortcut"] == "projection":
        out[f"{prefix}.proj.weight"] = module.shortcut[0].weight
        out.update(_bn_tensors(f"{prefix}.proj_bn", module.shortcut[1]))
    return out


# ------------------------------------------------------------------ the table

LAYERS = LayerTable("torch", {
    "dense": Layer(_dense, _weight_and_bias),
    "conv2d": Layer(_conv2d, _weight_and_bias),
    "max_pool": Layer(_max_pool),
    "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool),
    "batch_norm": Layer(_batch_norm, _batch_norm_weights),
    "relu": Layer(_relu),
    "sigmoid": Layer(_sigmoid),
    "tanh": Layer(_tanh),
    "flatten": Layer(_flatten),
    "dropout": Layer(_dropout),
    "embedding": Layer(_embedding, _embedding_weights),
    "lstm": Layer(_lstm, _lstm_weights),
    "residual": Layer(_residual, _residual_weights),
    "position_embedding": Layer(transformer.build_position_embedding, transformer.table_weights),
    "patch_embedding": Layer(transformer.build_patch_embedding, transformer.patch_embedding_weights),
    "layer_norm": Layer(transformer.build_layer_norm, transformer.layer_norm_weights),
    "gelu": Layer(transformer.build_gelu),
    "attention": Layer(transformer.build_attention, transformer.attention_weights),
    "transformer_block": Layer(transformer.build_transformer_block, transformer.transformer_block_weights),
    "token_pool": Layer(transformer.build_token_pool),
    "lm_head": Layer(transformer.build_lm_head, transformer.lm_head_weights),
    "segment_embedding": Layer(transformer.build_segment_embedding, transformer.table_weights),
    "pretraining_heads": Layer(transformer.build_pretraining_heads, transformer.pretraining_heads_weights),
    "rms_norm": Layer(transformer.build_rms_norm, transformer.rms_norm_weights),
    "grouped_attention": Layer(transformer.build_grouped_attention, transformer.grouped_attention_weights),
    "swiglu": Layer(transformer.build_swiglu, transformer.swiglu_weights),
    "moe": Layer(transformer.build_moe, transformer.moe_weights),
    "llama_block": Layer(transformer.build_llama_block, transformer.llama_block_weights),
})
# Builders that also take the modules built before them (in network order, as `built`): a tied head
# shares the token embedding's Parameter, so it needs that module, not a description of it.
TAKES_EARLIER = frozenset({"lm_head", "pretraining_heads"})
# Builders that also take the resolved network's input (as `inp`): the masked_tokens layout
# (segment_boundary, masked_positions) that BERT's segments and heads are built on.
TAKES_INPUT = frozenset({"segment_embedding", "pretraining_heads"})
