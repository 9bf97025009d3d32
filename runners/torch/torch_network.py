"""The torch runner's building blocks: the network from a resolved dlbench description (one builder
per layer type, in LAYERS), canonical weights in and out, the data, the loss, the optimiser and
the training step. torch_runner.py, torch_kernels.py and torch_distributed.py all build from here.

The transformer layers are torch.nn modules of transformer_modules(): attention through
F.scaled_dot_product_attention, a tied head on the token embedding's own Parameter, and BERT's
segment_embedding (F.embedding of a fixed segment-id buffer) and pretraining_heads (pooler,
next-sentence classifier, and the masked-LM head on the masked rows gathered by index_select), on
a masked_tokens input whose batch is x (B, T) ids and y (B, M + 1): the masked tokens, then the
next-sentence label. Pretraining heads make the model's output the pair (masked-LM logits,
next-sentence logits): its logits (`logits_of`) are the first, the loss
(masked_lm_and_next_sentence) takes both.

torch itself is imported on first use (`load_torch()`), never at module level: the runner sets the
OpenMP variables that torch reads at import first.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import types

from runners.common.contract import CHECK_PRECISION, PRECISIONS, Layer, LayerTable
from runners.common.protocol import Skip


def load_torch():
    """The torch module (imported on first use)."""
    import torch

    return torch


# ------------------------------------------------------------------ layers: type -> builder


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


# ------------------------------------------------------------------ transformer layers (schema.py's semantics)


@functools.cache
def transformer_modules():
    """The transformer layers' module classes, defined once torch is loaded (torch is imported on
    first use, so they cannot be module-level classes; cached, so every network shares them)."""
    torch = load_torch()
    nn, F = torch.nn, torch.nn.functional

    class PositionEmbedding(nn.Module):
        """x + P[0:T]: a learned (max_length, dim) table, its first T rows added (GPT-2's wpe and
        ViT's pos_embed, added rather than looked up: position t is row t)."""

        def __init__(self, max_length: int, dim: int):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(max_length, dim))
            nn.init.normal_(self.weight, std=0.02)  # GPT-2's and ViT's initialisation of the table

        def forward(self, x):
            return x + self.weight[: x.shape[1]]

    class PatchEmbedding(nn.Module):
        """A strided convolution (kernel = stride = patch) to (dim, H/p, W/p), its positions as tokens
        in row-major order, the class token prepended (timm's PatchEmbed and cls_token)."""

        def __init__(self, channels: int, patch: int, dim: int, class_token: bool):
            super().__init__()
            self.proj = nn.Conv2d(channels, dim, patch, patch, bias=True)
            self.class_token = nn.Parameter(torch.empty(dim)) if class_token else None
            if class_token:
                nn.init.normal_(self.class_token, std=0.02)

        def forward(self, x):
            tokens = self.proj(x).flatten(2).transpose(1, 2)  # (B, dim, h, w) -> (B, h*w, dim)
            if self.class_token is None:
                return tokens
            # in the convolution's dtype: under autocast the token sequence stays in the AMP dtype
            cls = self.class_token.to(tokens.dtype).expand(tokens.shape[0], 1, -1)
            return torch.cat([cls, tokens], dim=1)

    class SelfAttention(nn.Module):
        """Multi-head self-attention: q, k, v and out as nn.Linear, the heads' products in
        F.scaled_dot_product_attention (torch picks its flash, memory-efficient, cuDNN or math
        kernel); head h is columns h*S .. (h+1)*S - 1 of q, k and v, the canonical head-major order."""

        def __init__(self, dim: int, heads: int, head_size: int, causal: bool, bias: bool, dropout: float):
            super().__init__()
            inner = heads * head_size
            self.heads, self.head_size, self.causal, self.dropout = heads, head_size, causal, dropout
            self.q = nn.Linear(dim, inner, bias=bias)
            self.k = nn.Linear(dim, inner, bias=bias)
            self.v = nn.Linear(dim, inner, bias=bias)
            self.out = nn.Linear(inner, dim, bias=bias)

        def forward(self, x):
            b, t, _ = x.shape

            def split(proj):  # (B, T, H*S) -> (B, H, T, S)
                return proj(x).view(b, t, self.heads, self.head_size).transpose(1, 2)

            # dropout on the probabilities in training only (the functional form does not look at
            # self.training); its default scale is 1/sqrt(S), the canonical one
            a = F.scaled_dot_product_attention(split(self.q), split(self.k), split(self.v),
                                               dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=self.causal)
            return self.out(a.transpose(1, 2).reshape(b, t, self.heads * self.head_size))

    class TransformerBlock(nn.Module):
        """Layer norms, self-attention and a GELU MLP with two residual joins, pre- or post-norm."""

        def __init__(self, spec: dict):
            super().__init__()
            dim = spec["in_shape"][-1]
            hidden = spec["mlp_ratio"] * dim
            self.pre = spec["norm"] == "pre"
            self.ln1 = nn.LayerNorm(dim, eps=spec["eps"])
            self.attn = SelfAttention(dim, spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                      spec["dropout"])
            self.ln2 = nn.LayerNorm(dim, eps=spec["eps"])
            self.mlp = nn.Sequential(collections.OrderedDict(
                fc1=nn.Linear(dim, hidden, bias=spec["bias"]), gelu=nn.GELU(approximate=GELU_FORMS[spec["gelu"]]),
                fc2=nn.Linear(hidden, dim, bias=spec["bias"])))
            self.drop1 = nn.Dropout(spec["dropout"])  # on each branch before its join
            self.drop2 = nn.Dropout(spec["dropout"])

        def forward(self, x):
            if self.pre:
                x = x + self.drop1(self.attn(self.ln1(x)))
                return x + self.drop2(self.mlp(self.ln2(x)))
            x = self.ln1(x + self.drop1(self.attn(x)))
            return self.ln2(x + self.drop2(self.mlp(x)))

    class TokenPool(nn.Module):
        def __init__(self, mode: str):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return x[:, 0] if self.mode == "class" else x.mean(dim=1)

    class TiedLMHead(nn.Module):
        """Logits x E^T (+ b) with E the token embedding's own Parameter (HuggingFace's tie_weights
        idiom): one tensor, so its gradient is the sum of both uses and it is updated once."""

        def __init__(self, embedding, vocabulary: int, bias: bool):
            super().__init__()
            self.weight = embedding.weight
            self.bias = nn.Parameter(torch.zeros(vocabulary)) if bias else None

        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    class SegmentEmbedding(nn.Module):
        """x + S[s]: each position's row of a learned (segments, dim) table, looked up with
        F.embedding from a fixed (T,) segment-id buffer (0 before `boundary`, 1 from it), broadcast
        over the batch: HuggingFace BERT's token_type_embeddings of its token_type_ids."""

        def __init__(self, segments: int, dim: int, steps: int, boundary: int):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(segments, dim))
            nn.init.normal_(self.weight, std=0.02)  # BERT's initialisation of its embedding tables
            self.register_buffer("ids", (torch.arange(steps) >= boundary).long(), persistent=False)

        def forward(self, x):
            return x + F.embedding(self.ids[: x.shape[1]], self.weight)

    class PretrainingHeads(nn.Module):
        """BERT's pooler, next-sentence and masked-LM heads (HuggingFace's BertPooler and
        BertPreTrainingHeads) on h (B, T, D): returns (masked-LM logits (B, M, V), next-sentence
        logits (B, 2)). The M masked rows are gathered with index_select from a fixed positions
        buffer; the decoder is a TiedLMHead on the token embedding's Parameter when tied."""

        def __init__(self, dim: int, vocabulary: int, positions: list[int], gelu: str, eps: float, embedding=None):
            super().__init__()
            self.pooler = nn.Linear(dim, dim)
            self.next_sentence = nn.Linear(dim, 2)
            self.transform = nn.Linear(dim, dim)
            self.gelu = nn.GELU(approximate=GELU_FORMS[gelu])
            self.transform_ln = nn.LayerNorm(dim, eps=eps)
            self.decoder = (TiedLMHead(embedding, vocabulary, True) if embedding is not None
                            else nn.Linear(dim, vocabulary, bias=True))
            self.register_buffer("positions", torch.tensor(positions, dtype=torch.long), persistent=False)

        def forward(self, h):
            next_sentence = self.next_sentence(torch.tanh(self.pooler(h[:, 0])))
            masked = h.index_select(1, self.positions)  # (B, M, D)
            return self.decoder(self.transform_ln(self.gelu(self.transform(masked)))), next_sentence

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, TransformerBlock=TransformerBlock, TokenPool=TokenPool,
                                 TiedLMHead=TiedLMHead, SegmentEmbedding=SegmentEmbedding,
                                 PretrainingHeads=PretrainingHeads)


GELU_FORMS = {"erf": "none", "tanh": "tanh"}  # the schema's form -> nn.GELU's `approximate`


def _position_embedding(spec: dict):
    return transformer_modules().PositionEmbedding(spec["max_length"], spec["in_shape"][-1])


def _patch_embedding(spec: dict):
    return transformer_modules().PatchEmbedding(spec["in_shape"][0], spec["patch"], spec["dim"], spec["class_token"])


def _layer_norm(spec: dict):
    return load_torch().nn.LayerNorm(spec["in_shape"][-1], eps=spec["eps"])


def _gelu(spec: dict):
    return load_torch().nn.GELU(approximate=GELU_FORMS[spec["form"]])


def _attention(spec: dict):
    return transformer_modules().SelfAttention(spec["in_shape"][-1], spec["heads"], spec["head_size"], spec["causal"],
                                               spec["bias"], spec["dropout"])


def _transformer_block(spec: dict):
    return transformer_modules().TransformerBlock(spec)


def _token_pool(spec: dict):
    return transformer_modules().TokenPool(spec["mode"])


def _token_embedding(built: list, layer: str):
    """The network's first module, the token embedding a tied head shares its Parameter with."""
    embedding = built[0]  # the schema ties a head to the network's first layer, the token embedding
    if not isinstance(embedding, load_torch().nn.Embedding):
        raise TypeError(f"a tied {layer} needs the token embedding as layer 0, found {type(embedding).__name__}")
    return embedding


def _lm_head(spec: dict, built: list):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    if not spec["tied"]:
        return load_torch().nn.Linear(dim, vocabulary, bias=spec["bias"])
    return transformer_modules().TiedLMHead(_token_embedding(built, "lm_head"), vocabulary, spec["bias"])


def _segment_embedding(spec: dict, inp: dict):
    steps, dim = spec["in_shape"]
    return transformer_modules().SegmentEmbedding(spec["segments"], dim, steps, inp["segment_boundary"])


def _pretraining_heads(spec: dict, built: list, inp: dict):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    embedding = _token_embedding(built, "pretraining_heads") if spec["tied"] else None
    return transformer_modules().PretrainingHeads(dim, vocabulary, inp["masked_positions"], spec["gelu"], spec["eps"],
                                                  embedding)


LAYERS = LayerTable("torch", {
    "dense": Layer(_dense), "conv2d": Layer(_conv2d), "max_pool": Layer(_max_pool), "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool), "batch_norm": Layer(_batch_norm), "relu": Layer(_relu), "sigmoid": Layer(_sigmoid),
    "tanh": Layer(_tanh), "flatten": Layer(_flatten), "dropout": Layer(_dropout), "embedding": Layer(_embedding), "lstm": Layer(_lstm),
    "residual": Layer(_residual), "position_embedding": Layer(_position_embedding), "patch_embedding": Layer(_patch_embedding),
    "layer_norm": Layer(_layer_norm), "gelu": Layer(_gelu), "attention": Layer(_attention), "transformer_block": Layer(_transformer_block),
    "token_pool": Layer(_token_pool), "lm_head": Layer(_lm_head), "segment_embedding": Layer(_segment_embedding),
    "pretraining_heads": Layer(_pretraining_heads),
})
# Builders that also take the modules built before them (in network order, as `built`): a tied head
# shares the token embedding's Parameter, so it needs that module, not a description of it.
TAKES_EARLIER = frozenset({"lm_head", "pretraining_heads"})
# Builders that also take the resolved network's input (as `inp`): the masked_tokens layout
# (segment_boundary, masked_positions) that BERT's segments and heads are built on.
TAKES_INPUT = frozenset({"segment_embedding", "pretraining_heads"})


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


def build_module(spec: dict, built: list | tuple = (), inp: dict | None = None):
    """One resolved layer (see dlbench.definitions.network) as a torch module; `built`: the modules of
    the layers before it (what a TAKES_EARLIER builder is handed); `inp`: the network's resolved
    input (a TAKES_INPUT builder's)."""
    builder = LAYERS.builder(spec["type"])
    extra = {}
    if spec["type"] in TAKES_EARLIER:
        extra["built"] = list(built)
    if spec["type"] in TAKES_INPUT:
        extra["inp"] = inp
    return builder(spec, **extra)


def build_network(network: dict, deterministic: bool = False):
    """The resolved network as an nn.Sequential of one module per layer. `deterministic`: dropout
    layers become the identity, and the dropout of attention and transformer blocks (on the
    probabilities and the branches) is built at rate 0."""
    nn = load_torch().nn
    built: list = []
    for layer in network["layers"]:
        if deterministic and layer["type"] == "dropout":
            built.append(nn.Identity())
            continue
        if deterministic and layer.get("dropout"):  # attention, transformer_block: their own dropout rate
            layer = {**layer, "dropout": 0.0}
        built.append(build_module(layer, built, network["input"]))
    return nn.Sequential(*built)


def is_images(network: dict) -> bool:
    inp = network["input"]
    return inp["kind"] == "tensor" and len(inp["shape"]) == 3


def place(model, network: dict, device, settings: dict):
    """(model on the device in its memory format, that format): channels-last for images on CUDA,
    where cuDNN is fastest in it; with cuDNN's autotuner on. Says both in `settings`."""
    torch = load_torch()
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # pick the fastest algorithm per shape, once
        settings["cudnn_benchmark"] = True
    model = model.to(device)
    memory_format = torch.channels_last if (cuda and is_images(network)) else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    settings["memory_format"] = "channels_last" if memory_format is torch.channels_last else "contiguous"
    return model, memory_format


def trainable_params(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


# ------------------------------------------------------------------ data, loss, optimiser, step


def synthetic_batch(network: dict, batch: int, device, memory_format, generator=None):
    """(x, y) drawn by torch: on the device from torch's global generator, or, with `generator`, on
    the host from that generator and then moved to the device."""
    torch = load_torch()
    where = {"device": device} if generator is None else {"generator": generator}
    inp = network["input"]
    if inp["kind"] == "tokens":
        x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
        y = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
    elif inp["kind"] == "masked_tokens":  # y: the M masked positions' tokens, then the next-sentence label
        x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), **where)
        y = torch.cat([torch.randint(0, inp["vocabulary"], (batch, len(inp["masked_positions"])), **where),
                       torch.randint(0, 2, (batch, 1), **where)], dim=1)
    else:
        x = torch.randn(batch, *inp["shape"], **where)
        y = torch.randint(0, inp["classes"], (batch,), **where)
    x, y = x.to(device), y.to(device)
    if is_images(network):
        x = x.contiguous(memory_format=memory_format)
    return x, y


def loaded_batch(network: dict, path: str, device, memory_format):
    """(x, y) from an .npz in the canonical layout (`inputs` of the request), on the device."""
    import numpy as np

    torch = load_torch()
    with np.load(path) as data:
        x = torch.from_numpy(data["x"]).to(device)
        y = torch.from_numpy(data["y"]).to(device)
    if is_images(network):
        x = x.contiguous(memory_format=memory_format)
    return x, y


def logits_of(out):
    """The logits of a model's output: pretraining heads return (masked-LM logits, next-sentence
    logits), whose logits are the masked-LM ones; every other network its logits alone."""
    return out[0] if isinstance(out, tuple) else out


def loss(out, y):
    """Mean cross-entropy over the batch (and the steps of a language model); for pretraining heads'
    (masked-LM (B, M, V), next-sentence (B, 2)) output, masked_lm_and_next_sentence: the mean over
    the B*M masked positions against y[:, :M] plus the mean over the batch against y[:, M]."""
    F = load_torch().nn.functional
    if isinstance(out, tuple):
        masked_lm, next_sentence = out
        m = masked_lm.shape[1]
        return (F.cross_entropy(masked_lm.reshape(-1, masked_lm.shape[-1]), y[:, :m].reshape(-1))
                + F.cross_entropy(next_sentence, y[:, m]))
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# ------------------------------------------------------------------ precision (contract.PRECISIONS)
# fp32 (IEEE float32, TF32 and reduced-precision reductions pinned off), tf32 (float32 storage, TF32
# allowed), amp_bf16 / amp_fp16 (torch.autocast; float16 with torch.amp.GradScaler for training) and,
# for `dlbench check` only, float64 (parameters, buffers and a floating input cast: the canonical
# float32 weights and input convert exactly, and rounding decides no ReLU or max-pool).
RUN_PRECISIONS = PRECISIONS + (CHECK_PRECISION,)
AMP_DTYPES = {"amp_bf16": "bfloat16", "amp_fp16": "float16"}
TF32_CAPABILITY = (8, 0)
TF32_NEEDS = "TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer"

# torch's per-backend float32 precision knobs (torch >= 2.9; "none" inherits from the parent): set
# and read back where this torch has them. Each is "ieee" for fp32 and the AMP modes (what autocast
# leaves in float32 stays IEEE), "tf32" for tf32.
FP32_PRECISION_KNOBS = ("fp32_precision", "cuda.matmul.fp32_precision", "cudnn.fp32_precision",
                        "cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision", "mkldnn.fp32_precision",
                        "mkldnn.matmul.fp32_precision", "mkldnn.conv.fp32_precision", "mkldnn.rnn.fp32_precision")
REDUCED_PRECISION_REDUCTIONS = ("cuda.matmul.allow_fp16_reduced_precision_reduction",
                                "cuda.matmul.allow_bf16_reduced_precision_reduction")


def check_precision(precision, accepted=RUN_PRECISIONS) -> str:
    """The request's precision, or a ValueError naming it and the accepted ones."""
    if precision not in accepted:
        raise ValueError(f"precision {precision!r} is not one the torch runner accepts "
                         f"({', '.join(accepted)}; float64 is `dlbench check`'s only)"
                         if CHECK_PRECISION in accepted else
                         f"precision {precision!r} is not one the torch runner accepts here ({', '.join(accepted)})")
    return precision


def _backend_attr(path: str):
    """(object, attribute) of torch.backends.<path>, or None where this torch has no such knob."""
    obj = load_torch().backends
    *parents, name = path.split(".")
    for part in parents:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    try:
        getattr(obj, name)
    except (AttributeError, RuntimeError):
        return None
    return obj, name


def _unavailable(precision: str, device) -> str | None:
    """Why `precision` cannot run on `device` (the run is skipped), or None."""
    torch = load_torch()
    if precision == "tf32":
        if device.type != "cuda":
            return f"tf32: {TF32_NEEDS}; this run is on the {device.type.upper()}"
        cap = torch.cuda.get_device_capability(device)
        if cap < TF32_CAPABILITY:
            return (f"tf32: {TF32_NEEDS}; {torch.cuda.get_device_name(device)} has compute capability "
                    f"{cap[0]}.{cap[1]}")
    amp = AMP_DTYPES.get(precision)
    if amp and not torch.amp.autocast_mode.is_autocast_available(device.type):
        return f"{precision}: torch.autocast is not available for device type {device.type!r}"
    if precision == "amp_bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        cap = torch.cuda.get_device_capability(device)
        return (f"amp_bf16: {torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) has no "
                f"native bfloat16 (torch.cuda.is_bf16_supported(including_emulation=False) is False)")
    return None


def float32_math(precision: str, device) -> dict:
    """Pin torch's float32 math for `precision` on every backend, the same way on the CPU (where TF32
    is a no-op) as on the GPU, and return the flags as torch reports them afterwards. Raises Skip
    where the device cannot run the precision (tf32 off an Ampere-or-newer GPU)."""
    torch = load_torch()
    check_precision(precision)
    why = _unavailable(precision, device)
    if why:
        raise Skip(why)
    tf32 = precision == "tf32"
    # the legacy switches first (they also write the new knobs), then the per-backend knobs
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    for path in FP32_PRECISION_KNOBS:
        knob = _backend_attr(path)
        if knob is not None:
            setattr(*knob, "tf32" if tf32 else "ieee")
    if precision not in AMP_DTYPES:  # no float16/bfloat16 GEMM is asked for: pin their reductions off too
        for path in REDUCED_PRECISION_REDUCTIONS:
            knob = _backend_attr(path)
            if knob is not None:
                setattr(*knob, False)
    flags = {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
             "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision()}
    for path in FP32_PRECISION_KNOBS + REDUCED_PRECISION_REDUCTIONS:
        knob = _backend_attr(path)
        flags[f"torch.backends.{path}"] = getattr(*knob) if knob is not None else "absent in this torch"
    return flags


def in_precision(model, x, precision: str):
    """(model, x) in the request's storage precision: float64 casts parameters, buffers and a
    floating input; every other precision stores float32."""
    if check_precision(precision) != CHECK_PRECISION:
        return model, x
    return model.double(), (x.double() if x.is_floating_point() else x)


def mixed_precision(precision: str, device, train: bool):
    """(autocast() context factory, GradScaler or None, what they are in torch's terms) for the
    request's precision: torch.autocast in the AMP dtype, and for amp_fp16 training a
    torch.amp.GradScaler (dynamic loss scaling) on the device's type."""
    torch = load_torch()
    check_precision(precision)
    amp = AMP_DTYPES.get(precision)
    amp_dtype = getattr(torch, amp) if amp else None

    def autocast():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=amp_dtype)

    scaler = torch.amp.GradScaler(device.type) if (train and amp_dtype is torch.float16) else None
    described = {
        "autocast": f"torch.autocast(device_type={device.type!r}, dtype=torch.{amp})" if amp else None,
        "grad_scaler": f"torch.amp.GradScaler({device.type!r})" if scaler is not None else None,
        "loss_scale": float(scaler.get_scale()) if scaler is not None else None,  # its initial scale
    }
    return autocast, scaler, described


class ReducedPrecisionUnsupported(Exception):
    """A layer that torch cannot run in the request's reduced precision on this device."""


def probe_dtypes(model, x, autocast, precision: str, network: dict, train: bool = False) -> dict:
    """One real forward pass of one sample (two in training), layer by layer, in the step's mode under its
    autocast: the first layer's output dtype and the logits' dtype. Under AMP a layer that torch
    cannot run in that dtype on the device, but can in float32, raises ReducedPrecisionUnsupported
    naming the layer and torch's reason. `train`: training mode with autograd, as the step runs it
    (oneDNN's training primitives are not its inference ones: on an AVX-512 CPU a float16 LSTM runs
    for inference and is refused for training); torch's random state and the buffers (batch norm's
    running statistics) are left as they were."""
    torch = load_torch()
    was_training = model.training
    model.train(train)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()} if train else {}
    devices = [x.device] if x.device.type == "cuda" else []
    seen = {}
    try:
        with torch.random.fork_rng(devices=devices), (torch.enable_grad() if train else torch.no_grad()):
            h = x[:2] if train else x[:1]  # training batch norm on a flat input needs two samples
            for i, layer in enumerate(model):
                try:
                    with autocast():
                        out = layer(h)
                except RuntimeError as e:
                    if precision not in AMP_DTYPES or isinstance(e, torch.OutOfMemoryError):
                        raise
                    layer(h.float() if h.is_floating_point() else h)  # float32 runs it: the dtype is why
                    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise ReducedPrecisionUnsupported(
                        f"{precision}: torch {torch.__version__} cannot run layer {i} ({network['layers'][i]['type']}, "
                        f"{type(layer).__name__}) under torch.autocast(dtype=torch.{AMP_DTYPES[precision]}) on the "
                        f"{x.device.type.upper()} (it runs in float32): {reason}") from e
                h = out
                if i == 0:
                    seen["first_layer_output_dtype"] = str(h.dtype).removeprefix("torch.")
            seen["logits_dtype"] = str(logits_of(h).dtype).removeprefix("torch.")
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    seen["dtype_probe"] = (f"{'two samples' if train else 'one sample'} through the eager module layer by layer, "
                           f"{'training mode with autograd' if train else 'eval mode, no autograd'}, "
                           "under the step's autocast (before any torch.compile)")
    return seen


# ------------------------------------------------------------------ which attention kernel torch chose
# F.scaled_dot_product_attention picks a kernel per call from its inputs (device, dtype, shapes,
# dropout, autograd) among the backends enabled (torch.backends.cuda.*_sdp_enabled(), which the CPU's
# choice also honours). Each fused kernel is an aten operator of its own, which a TorchDispatchMode
# sees; the math backend has none (a composite function, seen as its bmm and softmax).
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (torch's CPU kernel)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable (a backend's own)",
}
SDPA_ENABLED = ("flash", "mem_efficient", "math", "cudnn")  # torch.backends.cuda.<name>_sdp_enabled()


def attention_kernels(model, network: dict, autocast, train: bool) -> dict | None:
    """What torch ran for each attention (an attention layer, a transformer block's): the aten
    operator F.scaled_dot_product_attention dispatched to on one sample of the layer's shape, in the
    step's mode (training: autograd on and the layer's dropout, which decides the CPU's choice) under
    the step's autocast, on the eager module; and the backends torch has enabled. None when the
    network has no attention. torch's random state is left as it was."""
    torch = load_torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    attentions = []
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        if layer["type"] in ("attention", "transformer_block"):
            attentions.append((f"{i:03d}", layer["in_shape"], module if layer["type"] == "attention" else module.attn))
    if not attentions:
        return None

    class Dispatched(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, arg_types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    param = next(model.parameters())
    devices = [param.device] if param.device.type == "cuda" else []
    kernels, operators = {}, {}
    for name, shape, attn in attentions:
        was_training = attn.training
        attn.train(train)
        mode = Dispatched()
        try:
            with torch.random.fork_rng(devices=devices), (torch.enable_grad() if train else torch.no_grad()):
                x = torch.zeros(1, *shape, dtype=param.dtype, device=param.device)
                with autocast(), mode:
                    attn(x)
        finally:
            attn.train(was_training)
        fused = [op for op in mode.ops if op in SDPA_KERNELS]
        if fused:
            kernels[name], operators[name] = SDPA_KERNELS[fused[0]], f"aten.{fused[0]}"
        elif "bmm" in mode.ops:
            kernels[name], operators[name] = "math", "aten.bmm (the math backend's products)"
        else:
            kernels[name], operators[name] = "unknown", ", ".join(dict.fromkeys(mode.ops))

    def one_or_each(by_layer: dict):  # one value where every attention got the same, else per layer
        values = set(by_layer.values())
        return values.pop() if len(values) == 1 else by_layer

    return {
        "function": "torch.nn.functional.scaled_dot_product_attention",
        "kernel": one_or_each(kernels),
        "operator": one_or_each(operators),
        "enabled": {f"torch.backends.cuda.{n}_sdp_enabled()": getattr(torch.backends.cuda, f"{n}_sdp_enabled")()
                    for n in SDPA_ENABLED},
        "probe": ("one sample of each attention's input shape through its eager module (before any torch.compile) "
                  f"in {'training (autograd on, its dropout)' if train else 'inference'} mode under the step's "
                  "autocast; the aten operator torch dispatched to, seen by a TorchDispatchMode"),
    }


def sgd(params, request: dict):
    return load_torch().optim.SGD(params, lr=request["learning_rate"], momentum=request["momentum"])


def train_step(model, x, y, make_optimizer, autocast, scaler):
    """(step, reset_optimizer): one training iteration (zero_grad, forward, loss, backward, update,
    through the GradScaler where there is one) and a fresh optimiser (zero momentum) for it."""
    opt = make_optimizer()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            out = model(x)
            value = loss(out, y)
        if scaler is None:
            value.backward()
            opt.step()
        else:
            scaler.scale(value).backward()
            scaler.step(opt)
            scaler.update()

    def reset_optimizer():
        nonlocal opt
        opt = make_optimizer()

    return step, reset_optimizer


def output_shape(model, x, train: bool) -> list[int]:
    """Per-sample output shape, from one sample in eval mode (the model is left in the step's mode)."""
    torch = load_torch()
    with torch.inference_mode():
        model.eval()
        shape = list(logits_of(model(x[:1])).shape[1:])
        if train:
            model.train()
    return shape


def synchronizer(device):
    torch = load_torch()
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


# ------------------------------------------------------------------ canonical weights
# Canonical weights (see src/dlbench/definitions/weights.py) <-> torch tensors. torch's own layouts
# are the canonical ones (OIHW, out x in, gates i f g o, nn.Linear's (out, in) for q/k/v/out with the
# heads' rows in order), so only the LSTM's two biases need care. A tied lm_head's weight, and a
# tied pretraining_heads' decoder weight, is the embedding's Parameter: it is exported once, as the
# embedding's (000.weight).


def _bn_tensors(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.weight, f"{prefix}.beta": bn.bias,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def _weight_bias(prefix: str, module) -> dict:
    out = {f"{prefix}.weight": module.weight}
    if module.bias is not None:
        out[f"{prefix}.bias"] = module.bias
    return out


def _ln_tensors(prefix: str, ln) -> dict:
    return {f"{prefix}.gamma": ln.weight, f"{prefix}.beta": ln.bias}


def _attention_tensors(prefix: str, attn) -> dict:
    out = {}
    for part in ("q", "k", "v", "out"):
        out.update(_weight_bias(f"{prefix}.{part}", getattr(attn, part)))
    return out


def canonical_tensors(model, network: dict) -> dict:
    """name -> torch tensor (parameter or buffer) for every canonical weight except LSTM biases."""
    nn = load_torch().nn
    out = {}
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        p, t = f"{i:03d}", layer["type"]
        if t in ("dense", "conv2d"):
            out[f"{p}.weight"] = module.weight
            if module.bias is not None:
                out[f"{p}.bias"] = module.bias
        elif t == "batch_norm":
            out.update(_bn_tensors(p, module))
        elif t == "embedding":
            out[f"{p}.weight"] = module.weight
        elif t == "lstm":
            for k in range(layer["layers"]):
                out[f"{p}.l{k}.w_ih"] = getattr(module.lstm, f"weight_ih_l{k}")
                out[f"{p}.l{k}.w_hh"] = getattr(module.lstm, f"weight_hh_l{k}")
        elif t == "residual":
            convs = [m for m in module.body if isinstance(m, nn.Conv2d)]
            bns = [m for m in module.body if isinstance(m, nn.BatchNorm2d)]
            for j, (c, b) in enumerate(zip(convs, bns), start=1):
                out[f"{p}.conv{j}.weight"] = c.weight
                out.update(_bn_tensors(f"{p}.bn{j}", b))
            if layer["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = module.shortcut[0].weight
                out.update(_bn_tensors(f"{p}.proj_bn", module.shortcut[1]))
        elif t == "position_embedding":
            out[f"{p}.weight"] = module.weight
        elif t == "patch_embedding":
            out.update(_weight_bias(p, module.proj))
            if module.class_token is not None:
                out[f"{p}.class_token"] = module.class_token
        elif t == "layer_norm":
            out.update(_ln_tensors(p, module))
        elif t == "attention":
            out.update(_attention_tensors(p, module))
        elif t == "transformer_block":
            out.update(_ln_tensors(f"{p}.ln1", module.ln1))
            out.update(_attention_tensors(f"{p}.attn", module.attn))
            out.update(_ln_tensors(f"{p}.ln2", module.ln2))
            out.update(_weight_bias(f"{p}.mlp.fc1", module.mlp.fc1))
            out.update(_weight_bias(f"{p}.mlp.fc2", module.mlp.fc2))
        elif t == "lm_head":
            if layer["tied"]:  # the weight is 000.weight; only a bias of its own
                if module.bias is not None:
                    out[f"{p}.bias"] = module.bias
            else:
                out.update(_weight_bias(p, module))
        elif t == "segment_embedding":
            out[f"{p}.weight"] = module.weight
        elif t == "pretraining_heads":
            for part in ("pooler", "next_sentence", "transform"):
                out.update(_weight_bias(f"{p}.{part}", getattr(module, part)))
            out.update(_ln_tensors(f"{p}.transform_ln", module.transform_ln))
            if not layer["tied"]:  # tied: the decoder's weight is 000.weight
                out[f"{p}.decoder.weight"] = module.decoder.weight
            out[f"{p}.decoder.bias"] = module.decoder.bias
    return out


def _lstm_biases(model, network: dict):
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        if layer["type"] == "lstm":
            for k in range(layer["layers"]):
                yield f"{i:03d}.l{k}.bias", getattr(module.lstm, f"bias_ih_l{k}"), getattr(module.lstm, f"bias_hh_l{k}")


def host_array(t):
    """A tensor as numpy: float64 stays float64 (the check's precision), anything else float32."""
    torch = load_torch()
    return t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32).cpu().numpy().copy()


def export_weights(model, network: dict) -> dict:
    out = {n: host_array(t) for n, t in canonical_tensors(model, network).items()}
    for name, b_ih, b_hh in _lstm_biases(model, network):
        out[name] = host_array(b_ih + b_hh)
    return out


def load_weights(model, network: dict, arrays: dict) -> None:
    torch = load_torch()
    tensors = canonical_tensors(model, network)
    biases = {name: (b_ih, b_hh) for name, b_ih, b_hh in _lstm_biases(model, network)}
    expected = set(tensors) | set(biases)
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - expected)[:5]}")
    with torch.no_grad():
        for name, t in tensors.items():
            src = torch.from_numpy(arrays[name])
            if tuple(src.shape) != tuple(t.shape):
                raise ValueError(f"{name}: shape {tuple(src.shape)}, torch expects {tuple(t.shape)}")
            t.copy_(src)
        for name, (b_ih, b_hh) in biases.items():
            b_ih.copy_(torch.from_numpy(arrays[name]))
            b_hh.zero_()
