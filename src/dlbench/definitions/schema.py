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
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class Strict(BaseModel):
    """The base of every model of the language: unknown fields refused, instances immutable. A layer
    model is a Strict with a `type: Literal[...]` field (definitions/layers/ holds its functions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_Strict = Strict  # the name the suite files' models import


def _pair(value: int | list[int] | tuple[int, ...], name: str, minimum: int) -> tuple[int, int]:
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
    return pair


class Dense(_Strict):
    type: Literal["dense"]
    units: PositiveInt
    bias: bool = True


class Conv2d(_Strict):
    type: Literal["conv2d"]
    filters: PositiveInt
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    bias: bool = True

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
    size: tuple[int, int]
    stride: tuple[int, int] | None = None  # defaults to size
    padding: tuple[int, int] = (0, 0)

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
    size: tuple[int, int]
    stride: tuple[int, int] | None = None  # defaults to size

    @field_validator("size", "stride", mode="before")
    @classmethod
    def _positive_pair(cls, v, info):
        return None if v is None else _pair(v, info.field_name, 1)


class GlobalAvgPool(_Strict):
    type: Literal["global_avg_pool"]


class BatchNorm(_Strict):
    type: Literal["batch_norm"]
    eps: Annotated[float, Field(gt=0)] = 1e-5
    momentum: Annotated[float, Field(gt=0, lt=1)] = 0.1


class Activation(_Strict):
    type: Literal["relu", "sigmoid", "tanh"]


class Flatten(_Strict):
    type: Literal["flatten"]


class Dropout(_Strict):
    type: Literal["dropout"]
    rate: Annotated[float, Field(ge=0, lt=1)]


class Embedding(_Strict):
    type: Literal["embedding"]
    vocabulary: PositiveInt
    dim: PositiveInt


class LSTM(_Strict):
    type: Literal["lstm"]
    hidden: PositiveInt
    layers: PositiveInt = 1


class Residual(_Strict):
    """`repeat` blocks of one kind; the first carries the stride, the rest have stride 1.

    A shortcut that must change shape (stride > 1 or a new channel count) is `shortcut`; every other
    shortcut is the identity. Bottleneck blocks output 4 * filters channels.
    """

    type: Literal["residual"]
    block: Literal["basic", "bottleneck"]
    filters: PositiveInt
    stride: PositiveInt = 1
    repeat: PositiveInt = 1
    shortcut: Literal["option_a", "projection"] = "projection"


class TensorInput(_Strict):
    """A dense float input of `shape` (no batch axis) labelled with one class per sample."""

    kind: Literal["tensor"]
    shape: tuple[PositiveInt, ...]
    dtype: Literal["float32"] = "float32"
    classes: PositiveInt

    @field_validator("shape")
    @classmethod
    def _rank(cls, v):
        if len(v) not in (1, 3):
            raise ValueError("shape must be [features] or [channels, height, width]")
        return v


class TokenInput(_Strict):
    """A sequence of token ids labelled with the next token at every step (language modelling)."""

    kind: Literal["tokens"]
    vocabulary: PositiveInt
    sequence_length: PositiveInt
    dtype: Literal["int64"] = "int64"


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
        input: Annotated[Union[TensorInput, TokenInput], Field(discriminator="kind")]
        layers: Annotated[list[Layer], Field(min_length=1)]
        loss: Literal["softmax_cross_entropy"] = "softmax_cross_entropy"

    return Network
