"""The network description language: plain data, validated once when a file is loaded.

A network is an input spec, an ordered list of layers and a loss. Shapes never include the batch
dimension and images are described channels-first (C, H, W); that is the *canonical* layout of the
description, not a layout any runner must use internally.

Canonical forms where frameworks disagree (every runner must build exactly these):
- conv2d / pooling output size: floor((in + 2*padding - kernel) / stride) + 1 (no "same", no ceil mode).
- max_pool padding pads with -inf; avg_pool takes no padding (frameworks disagree on whether padded
  cells count in the average, so the language does not allow the question to arise).
- flatten: C, H, W order (row-major over the canonical channels-first shape).
- batch_norm: y = gamma * (x - mean) / sqrt(var + eps) + beta; running statistics updated as
  running = (1 - momentum) * running + momentum * batch (PyTorch's convention; Keras' momentum is
  1 - this value).
- lstm: gates in the order input, forget, cell (g), output; one bias vector of 4*hidden per layer
  (frameworks with two bias vectors keep the second at zero and frozen); tanh cell activation;
  returns the full output sequence of the last layer; zero initial state.
- residual option_a shortcut: take every stride-th pixel starting at (0, 0), then append zero
  channels after the existing ones (parameter free).
- dense on a sequence (T, F) applies the same weights at every step.

- embedding: `init_std` draws the (vocabulary, D) table from N(0, init_std^2) in every runner; absent,
  each framework's default initialiser draws it, and those differ (torch N(0, 1), Keras U(-0.05,
  0.05), flax about N(0, 1/D), MXNet the runner's Xavier). The scale is part of the workload, not
  only of its numerics: a head tied to a 768-wide N(0, 1) table gives logits of std ~28, the softmax
  underflows and the head's backward products run on subnormal numbers, measured 8x slower in
  torch on x86 (a GPT-2 step 11.7 s instead of 1.5 s); a token network names its scale.
- dense: `init` draws the (units, F) weights with variance scale / fan, fan being F
  (`fan_in`), units (`fan_out`) or their mean (`fan_avg`): from N(0, scale / fan) (`normal`, not
  truncated) or U(-sqrt(3 scale / fan), sqrt(3 scale / fan)) (`uniform`), and the biases zero, in
  every runner. Absent, each framework's default draws them, and those differ: torch
  U(-1/sqrt(F), 1/sqrt(F)) for weights and biases (variance 1/(3F)), Keras Glorot-uniform (1/fan_avg),
  flax LeCun-normal (1/F), MXNet the runner's Xavier (2/F). For a deep sigmoid stack the scale
  decides whether it learns at all: a sigmoid's slope is at most 1/4 and its output centred on 1/2,
  so each layer passes on about sqrt(scale / 3 or 1) / 4 of its input's variation (see
  suites/networks/digits_fcn5.yaml).

Transformers (sequences are (T, D): T tokens of width D, no batch axis):
- position_embedding: y = x + P[0:T], rows 0..T-1 of a learned (max_length, D) table P; T <= max_length.
- patch_embedding: an image (C, H, W), H and W divisible by `patch`, through a convolution with
  kernel = stride = patch, no padding, with bias, to (dim, H/patch, W/patch); its positions become
  tokens in row-major (h, w) order, (N, dim) with N = (H/patch)(W/patch); with `class_token` a learned
  (dim,) vector is prepended as token 0: (1 + N, dim).
- layer_norm: over the last axis, y = gamma * (x - mean) / sqrt(var + eps) + beta, var the biased
  variance (divided by D, not D - 1); on (T, D) or (D,).
- gelu: `erf` is the exact x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))); `tanh` is the approximation
  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2's). Frameworks default to different ones,
  so a network names its form.
- attention (multi-head self-attention over (T, D), H heads of size S, A = H*S): q = x Wq^T + bq,
  k = x Wk^T + bk, v = x Wv^T + bv, each (T, A); head h is columns h*S .. (h+1)*S - 1 of each
  (head-major); per head p = softmax(q k^T / sqrt(S)) over the keys, where `causal` lets position i
  attend only to j <= i (the masked scores are -inf before the softmax); dropout on p in training;
  a = p v; the heads' a concatenated in head order (T, A), out = a Wo^T + bo, (T, D). S defaults to
  D / H (which must divide); no biases when `bias` is false.
- transformer_block: pre-norm: x = x + drop(attn(ln1(x))); x = x + drop(mlp(ln2(x)));
  post-norm: x = ln1(x + drop(attn(x))); x = ln2(x + drop(mlp(x))); mlp(x) = fc2(gelu(fc1(x))) with
  fc1 D -> mlp_ratio*D and fc2 back (both with bias when `bias`); attention as above with the
  block's heads, head size, causal, bias, and `dropout` also on its probabilities; both layer norms
  with the block's eps. `repeat` blocks in sequence, each with its own weights.
- token_pool: (T, D) -> (D,): `class` takes row 0 (the class token), `mean` the mean over the T rows.
- lm_head: (T, D) -> (T, vocabulary) logits, y = x E^T (+ b): `tied` uses the token embedding's
  (vocabulary, D) table E (the network's first layer; no weight of its own), untied a (vocabulary, D)
  weight of its own.
- segment_embedding: y = x + S[s_t], the segment row of each position (BERT's token types).
- pretraining_heads: BERT's pooler, next-sentence and masked-LM heads (PretrainingHeads below), on
  a masked_tokens input (MaskedTokenInput below), trained with `masked_lm_and_next_sentence`.

Llama-architecture and Mixture-of-Experts decoders (issue 45; the conventions HuggingFace's
LlamaForCausalLM and MixtralForCausalLM compute):
- rms_norm: over the last axis, y = gamma * x / sqrt(mean(x^2) + eps), no shift, no mean subtracted.
- rotary position embedding (a part of grouped_attention and llama_block, on queries and keys, not
  on values): per head of size S (even), frequencies f_i = theta^(-2i/S), i = 0 .. S/2 - 1 (with
  `rope_scaling`, Llama 3's rescaling of them: wavelengths 2 pi / f_i above original_context /
  low_freq_factor divided by `factor`, below original_context / high_freq_factor kept, between
  interpolated smoothly); at position t, angle a_{t,i} = t f_i, and
  q'[i] = q[i] cos a_{t,i} - q[i + S/2] sin a_{t,i}, q'[i + S/2] = q[i + S/2] cos a_{t,i} + q[i] sin a_{t,i}
  (the halves rotated, HuggingFace's rotate_half; not interleaved pairs). Positions count from 0 at
  the first token (in generation, from the prompt's first).
- grouped_attention: H query heads and KV key/value heads (KV divides H) of size S: q = x Wq^T (H*S),
  k = x Wk^T and v = x Wv^T (KV*S each), no biases; rotary on q and k; query head h attends with
  key/value head h // (H / KV) (each key/value head serves H / KV consecutive query heads); per
  head p = softmax(q k^T / sqrt(S)), causal as `attention`'s; out = concat(p v) Wo^T (D). KV = H is
  multi-head attention, KV = 1 multi-query.
- swiglu: y = W_down (silu(W_gate x) * (W_up x)), silu(z) = z sigmoid(z), no biases; gate and up
  (hidden, D), down (D, hidden).
- moe: E experts, each a swiglu of `hidden`, and a linear router W_r (E, D), no bias. Per token, the
  router probabilities p = softmax(x W_r^T) over the experts, computed in float32 whatever the
  precision (mixed precision rounds x, never the router's product or softmax); the k experts of
  the largest p, ties broken towards the lower expert index (so every framework routes a token
  to the same experts; `top_k`); their weights w = p_e / sum of the chosen p (renormalised); y =
  sum over the chosen e of w_e expert_e(x). `capacity_factor` null is dropless (every choice is
  computed); a factor c gives each expert C = ceil(c * N * k / E) slots per batch of N tokens, filled
  in priority order, every token's first choice (in token order, the batch flattened sample-major)
  before any second choice and so on; a choice past its expert's C slots is dropped (contributes 0,
  the other weights are not renormalised again). The load-balancing loss (Switch Transformer's, as
  Mixtral's): aux = E * sum_e f_e P_e over the N tokens of the batch, f_e the fraction of tokens
  whose k choices include e (so sum_e f_e = k) and P_e the mean of p_e; training minimises
  cross-entropy + `aux_loss_coefficient` * aux, the aux of a llama_block's repeated blocks averaged
  over them (HuggingFace's mean over the layers). The loss a run reports is the cross-entropy: the
  auxiliary term enters the step through its gradient only (DeepSeek's AddAuxiliaryLoss), in
  every runner.
- llama_block: x = x + attn(rms_norm1(x)); x = x + ffn(rms_norm2(x)), attn a causal
  grouped_attention with rotary, ffn a swiglu of `hidden` or, with `moe`, an moe of E experts of
  `hidden` each; both norms with the block's eps. `repeat` blocks in sequence, each with its own
  weights.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

# Every number of a definition is bounded by what storage and the machine can hold: integers are
# strict (a boolean, a float or a string is not one) and within int64, floats finite, and counts have
# sane maxima, so that nothing a definition says can overflow a record or the row index, or make the
# analysis itself grow without end (a residual `repeat: 100000000`). A network's totals are bounded
# too (network.py checks them layer by layer, before a runner builds it or `dlbench list` prints it).
INT64_MAX = 2**63 - 1
MAX_WIDTH = 1 << 24  # units, filters, channels, features, hidden size, widths, heads, vocabulary, classes
MAX_EXTENT = 1 << 16  # an image side, a kernel, stride, padding or patch
MAX_SEQUENCE = 1 << 20  # tokens of a sequence
MAX_REPEAT = 1024  # blocks of a residual stage or a transformer_block, layers of an lstm
MAX_LAYERS = 4096  # layers of a network, and entries of its resolved form (repeats expanded)
MAX_PARAMS = 1 << 40  # parameters of a network (4 TiB in float32: more than any machine holds)
MAX_ACTIVATIONS = 1 << 32  # elements of one layer's output, per sample
MAX_FLOPS = 1 << 53  # forward FLOPs per sample


def Int(minimum: int = 1, maximum: int = INT64_MAX):  # noqa: N802 - a type, used as one
    """A strict integer in [minimum, maximum]: `true` or `64.0` is not one."""
    low = {"gt": 0} if minimum == 1 else {"ge": minimum}  # "greater than 0" says "positive" best
    return Annotated[int, Field(strict=True, le=maximum, **low)]


def Real(**bounds):  # noqa: N802 - a type, used as one
    """A finite number (an integer is one; a boolean, a string, .inf or .nan is not), within `bounds`
    (pydantic's gt/ge/lt/le)."""
    return Annotated[float, Field(strict=True, allow_inf_nan=False, **bounds)]


PositiveInt = Int(1)
NonNegativeInt = Int(0)
Bool = Annotated[bool, Field(strict=True)]  # `1` or "yes" is not a boolean either
Width = Int(1, MAX_WIDTH)
Repeat = Int(1, MAX_REPEAT)


class Strict(BaseModel):
    """The base of every model of the language: unknown fields refused, instances immutable. A layer
    model is a Strict with a `type: Literal[...]` field (definitions/layers/ holds its functions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_Strict = Strict  # the name the suite files' models import


def _pair(value: int | list[int] | tuple[int, ...], name: str, minimum: int,
          maximum: int = MAX_EXTENT) -> tuple[int, int]:
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(value):
        pair = (value, value)
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(is_int(v) for v in value):
        pair = (value[0], value[1])
    else:
        # also catches null, floats, strings and booleans: a TypeError here would escape pydantic
        raise ValueError(f"{name} must be an integer or a pair [height, width] of integers")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {list(pair)}")
    if max(pair) > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {list(pair)}")
    return pair


# A height-and-width field as written: one integer for both, or [height, width]; `_pair` makes it a
# pair and checks its bounds. Said so for the exported JSON Schema (cli/schema.py), which would
# otherwise know only the pair the field holds once validated.
Pair = Annotated[tuple[int, int], WithJsonSchema({"anyOf": [
    {"type": "integer"}, {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}]})]


class VarianceScaling(_Strict):
    """A dense layer's described initialisation (this module's docstring, `dense`): the weights drawn
    with variance `scale` / fan, the biases zero."""

    distribution: Literal["normal", "uniform"]
    scale: Real(gt=0, le=100)
    mode: Literal["fan_in", "fan_avg", "fan_out"] = "fan_in"


class Dense(_Strict):
    type: Literal["dense"]
    units: Width
    bias: Bool = True
    # the described initialisation (variance scaling, biases zero); absent: the framework's own default
    init: VarianceScaling | None = None


class Conv2d(_Strict):
    type: Literal["conv2d"]
    filters: Width
    kernel: Pair
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    bias: Bool = True

    @field_validator("kernel", "stride", mode="before")
    @classmethod
    def _positive_pair(cls, v, info):
        return _pair(v, info.field_name, 1)

    @field_validator("padding", mode="before")
    @classmethod
    def _padding_pair(cls, v, info):
        return _pair(v, info.field_name, 0)


class MaxPool(_Strict):
    type: Literal["max_pool"]
    size: Pair
    stride: Pair | None = None  # defaults to size
    padding: Pair = (0, 0)

    @field_validator("size", "stride", mode="before")
    @classmethod
    def _positive_pair(cls, v, info):
        return None if v is None else _pair(v, info.field_name, 1)

    @field_validator("padding", mode="before")
    @classmethod
    def _padding_pair(cls, v, info):
        return _pair(v, info.field_name, 0)


class AvgPool(_Strict):
    type: Literal["avg_pool"]
    size: Pair
    stride: Pair | None = None  # defaults to size

    @field_validator("size", "stride", mode="before")
    @classmethod
    def _positive_pair(cls, v, info):
        return None if v is None else _pair(v, info.field_name, 1)


class GlobalAvgPool(_Strict):
    type: Literal["global_avg_pool"]


class BatchNorm(_Strict):
    type: Literal["batch_norm"]
    eps: Real(gt=0, le=1) = 1e-5
    momentum: Real(gt=0, lt=1) = 0.1


class Activation(_Strict):
    type: Literal["relu", "sigmoid", "tanh"]


class Flatten(_Strict):
    type: Literal["flatten"]


class Dropout(_Strict):
    type: Literal["dropout"]
    rate: Real(ge=0, lt=1)


class Embedding(_Strict):
    type: Literal["embedding"]
    vocabulary: Width
    dim: Width
    # N(0, init_std^2) for the table (GPT-2's and BERT's 0.02); absent: the framework's own default
    init_std: Real(gt=0, le=1) | None = None


class LSTM(_Strict):
    type: Literal["lstm"]
    hidden: Width
    layers: Repeat = 1


class Residual(_Strict):
    """`repeat` blocks of one kind; the first carries the stride, the rest have stride 1.

    A shortcut that must change shape (stride > 1 or a new channel count) is `shortcut`; every other
    shortcut is the identity. Bottleneck blocks output 4 * filters channels.
    """

    type: Literal["residual"]
    block: Literal["basic", "bottleneck"]
    filters: Width
    stride: Int(1, MAX_EXTENT) = 1
    repeat: Repeat = 1
    shortcut: Literal["option_a", "projection"] = "projection"


Rate = Real(ge=0, lt=1)
Eps = Real(gt=0, le=1)


class PositionEmbedding(_Strict):
    type: Literal["position_embedding"]
    max_length: Int(1, MAX_SEQUENCE)


class PatchEmbedding(_Strict):
    type: Literal["patch_embedding"]
    patch: Int(1, MAX_EXTENT)
    dim: Width
    class_token: Bool = True


class LayerNorm(_Strict):
    type: Literal["layer_norm"]
    eps: Eps = 1e-5


class Gelu(_Strict):
    """Not an Activation: it has a field (its form), which a network must name."""

    type: Literal["gelu"]
    form: Literal["erf", "tanh"]


class Attention(_Strict):
    type: Literal["attention"]
    heads: Width
    head_size: Width | None = None  # D / heads; resolved to the number
    causal: Bool = False
    bias: Bool = True
    dropout: Rate = 0.0


class TransformerBlock(_Strict):
    """`repeat` blocks of one kind; the resolved network has one entry per block (as residual
    stages), each with every field but `repeat` and its head size filled in."""

    type: Literal["transformer_block"]
    heads: Width
    head_size: Width | None = None
    mlp_ratio: Int(1, 1024) = 4
    norm: Literal["pre", "post"]
    gelu: Literal["erf", "tanh"]
    causal: Bool = False
    bias: Bool = True
    dropout: Rate = 0.0
    eps: Eps = 1e-5
    repeat: Repeat = 1


class TokenPool(_Strict):
    type: Literal["token_pool"]
    mode: Literal["class", "mean"]


class LMHead(_Strict):
    type: Literal["lm_head"]
    tied: Bool
    bias: Bool = False


class SegmentEmbedding(_Strict):
    """y = x + S[s_t]: at each position t the row of a learned (segments, D) table for the segment
    s_t that the input's layout gives it (MaskedTokenInput: sentence A, then sentence B)."""

    type: Literal["segment_embedding"]
    segments: Int(2, MAX_WIDTH) = 2


class PretrainingHeads(_Strict):
    """BERT's pooler and pre-training heads on the encoder's (T, D) output h:
    - pooled = tanh(W_p h_0 + b_p) at position 0 (the [CLS] token), and the next-sentence logits
      W_n pooled + b_n (2 classes);
    - at the input's M masked positions m, t = layer_norm(gelu(W_t h_m + b_t)) (eps, the GELU form
      as given) and the masked-LM logits t E^T + b over the vocabulary, E being the token
      embedding's table when `tied` (BERT's) or a (vocabulary, D) weight of the head's own.
    Its output is the (M, vocabulary) masked-LM logits; the next-sentence logits go to the loss
    beside them (`masked_lm_and_next_sentence`)."""

    type: Literal["pretraining_heads"]
    gelu: Literal["erf", "tanh"]
    eps: Eps = 1e-12
    tied: Bool = True


class RMSNorm(_Strict):
    type: Literal["rms_norm"]
    eps: Eps = 1e-6


Theta = Real(gt=1, le=1e12)


class RopeScaling(_Strict):
    """Llama 3's rescaling of the rotary frequencies (HuggingFace's rope_type "llama3")."""

    factor: Real(ge=1, le=1024)
    low_freq_factor: Real(gt=0, le=1024)
    high_freq_factor: Real(gt=0, le=1024)
    original_context: Int(1, MAX_SEQUENCE)

    @field_validator("high_freq_factor")
    @classmethod
    def _above_low(cls, v, info):
        low = info.data.get("low_freq_factor")
        if low is not None and v <= low:
            raise ValueError(f"high_freq_factor must be above low_freq_factor ({low}), got {v}")
        return v


class GroupedAttention(_Strict):
    type: Literal["grouped_attention"]
    heads: Width
    kv_heads: Width
    head_size: Width | None = None  # D / heads; resolved to the number
    causal: Bool = True
    rope_theta: Theta = 10000.0
    rope_scaling: RopeScaling | None = None


class SwiGLU(_Strict):
    type: Literal["swiglu"]
    hidden: Width


class Routing(_Strict):
    """An moe's router: its experts, how many each token takes, their capacity and the load loss."""

    experts: Int(2, 4096)
    top_k: Int(1, 4096)
    capacity_factor: Real(gt=0, le=1024) | None = None  # None: dropless
    aux_loss_coefficient: Real(ge=0, le=1) = 0.01

    @field_validator("top_k")
    @classmethod
    def _within_experts(cls, v, info):
        experts = info.data.get("experts")
        if experts is not None and v > experts:
            raise ValueError(f"top_k {v} is more than the {experts} experts")
        return v


class MixtureOfExperts(Routing):
    type: Literal["moe"]
    hidden: Width


class LlamaBlock(_Strict):
    """`repeat` blocks of one kind; the resolved network has one entry per block, each with every
    field but `repeat` and its head size filled in."""

    type: Literal["llama_block"]
    heads: Width
    kv_heads: Width
    head_size: Width | None = None
    hidden: Width  # the SwiGLU's hidden width (each expert's, with moe)
    eps: Eps = 1e-5
    rope_theta: Theta = 10000.0
    rope_scaling: RopeScaling | None = None
    moe: Routing | None = None
    repeat: Repeat = 1


class TensorInput(_Strict):
    """A dense float input of `shape` (no batch axis) labelled with one class per sample."""

    kind: Literal["tensor"]
    shape: tuple[Width, ...]
    dtype: Literal["float32"] = "float32"
    classes: Width

    @field_validator("shape")
    @classmethod
    def _rank(cls, v):
        if len(v) not in (1, 3):
            raise ValueError("shape must be [features] or [channels, height, width]")
        if int(np.prod(v, dtype=object)) > MAX_ACTIVATIONS:
            raise ValueError(f"shape {list(v)} holds more than {MAX_ACTIVATIONS} elements per sample")
        return v


class TokenInput(_Strict):
    """A sequence of token ids labelled with the next token at every step (language modelling)."""

    kind: Literal["tokens"]
    vocabulary: Width
    sequence_length: Int(1, MAX_SEQUENCE)
    dtype: Literal["int64"] = "int64"


class MaskedTokenInput(_Strict):
    """BERT pre-training's input (Devlin et al. 2019; MLPerf Training's BERT): T token ids, positions
    0 .. ceil(T/2) - 1 in segment 0 (sentence A) and the rest in segment 1 (sentence B), with two
    tasks' labels per sample. The masked positions are a fixed set the same in every framework:
    M = max(1, round(mask_fraction * T)) of positions 1 .. T-1 (position 0 is the [CLS] token the
    pooler reads) drawn without replacement by numpy's default_rng(mask_seed) and sorted; the
    analysis draws them and the resolved input lists them (`masked_positions`, with
    `segment_boundary`), so a runner gathers exactly those. Labels `y` are (M + 1,) per sample: the
    token ids at the M masked positions in that order, then the next-sentence label (0 or 1)."""

    kind: Literal["masked_tokens"]
    vocabulary: Width
    sequence_length: Int(2, MAX_SEQUENCE)
    mask_fraction: Real(gt=0, lt=1) = 0.15
    mask_seed: NonNegativeInt = 0
    dtype: Literal["int64"] = "int64"

    def masked_positions(self) -> list[int]:
        count = max(1, round(self.mask_fraction * self.sequence_length))
        count = min(count, self.sequence_length - 1)
        drawn = np.random.default_rng(self.mask_seed).choice(
            np.arange(1, self.sequence_length), size=count, replace=False)
        return sorted(int(t) for t in drawn)

    def segment_boundary(self) -> int:
        return -(-self.sequence_length // 2)


# Which loss each input kind trains with: mean softmax cross-entropy over the samples (or, for
# tokens, every position's next token); masked_lm_and_next_sentence: the mean cross-entropy over the
# B * M masked positions plus the mean next-sentence cross-entropy over the B samples (the sum
# HuggingFace's BertForPreTraining and MLPerf's BERT reference train on).
LOSS_OF_INPUT = {"tensor": "softmax_cross_entropy", "tokens": "softmax_cross_entropy",
                 "masked_tokens": "masked_lm_and_next_sentence"}


@functools.cache
def network_model(layer_models: tuple[type[Strict], ...]) -> type[Strict]:
    """The Network model whose layers are one of `layer_models`, told apart by their `type`.

    The layer table (definitions/layers/) calls it with every model it holds, in table order:
    `layers.network_model()` is the model a network file is validated with.
    """
    Layer = Annotated[Union[layer_models], Field(discriminator="type")]  # used by the annotation below

    class Network(Strict):
        name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
        description: str = ""
        input: Annotated[Union[TensorInput, TokenInput, MaskedTokenInput], Field(discriminator="kind")]
        layers: Annotated[list[Layer], Field(min_length=1, max_length=MAX_LAYERS)]
        # validated when left out too: the default is wrong for a masked_tokens input
        loss: Annotated[Literal["softmax_cross_entropy", "masked_lm_and_next_sentence"],
                        Field(validate_default=True)] = "softmax_cross_entropy"

        @field_validator("loss")
        @classmethod
        def _loss_fits_input(cls, loss, info):
            inp = info.data.get("input")  # absent when the input itself failed validation
            expected = LOSS_OF_INPUT[inp.kind] if inp is not None else loss
            if loss != expected:
                raise PydanticCustomError(
                    "loss_for_input", "an input of kind {kind} trains with loss {expected}, not {loss}",
                    {"kind": inp.kind, "expected": expected, "loss": loss})
            return loss

    return Network
