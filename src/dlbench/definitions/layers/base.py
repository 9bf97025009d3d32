"""What a layer type is made of: one `LayerType` entry holding its schema model and the three
functions the controller needs of it, and the few helpers those functions share.

- `model`: the pydantic model (a `schema.Strict` with `type: Literal[...]`) that validates the layer
  as written; each name of its `type` Literal is one layer type (relu, sigmoid and tanh share one).
- `infer(layer, site) -> Inferred`: the output shape, trainable parameters and forward FLOPs per
  sample (the convention of definitions/network.py), and optionally the resolved entries (default:
  every field of the layer with its defaults filled in, plus `in_shape` and `out_shape`; a layer
  that expands into several entries, as residual stages do, returns them). A shape it cannot take
  is `raise site.error(reason)`: the loader names the file and the layer.
- `weights(prefix, entry) -> {name: shape}`: the canonical tensors of one resolved entry
  (definitions/weights.py), named `<prefix>.<part>`; none by default. Running statistics are the
  parts named in `weights.STATE_PARTS`; every other tensor is trainable.
- `work(b, layer, entry, input_grad)`: the operations of one resolved entry in one iteration
  (performance/workload.py), appended to `layer.forward` / `layer.backward` through `b`, the
  workload's builder (the `Work` protocol below: definitions imports nothing of performance).
  `input_grad` says whether a trainable layer precedes it (else no input gradient is computed).
  The update and the parameter count are not its job: the workload derives both from `weights`.
- `rounding_depth` and `decisions`: what one resolved entry adds to the mixed-precision tolerance
  (execution/equivalence.py, "Mixed precision"): the products (matrix products, convolutions, one
  LSTM step) in sequence on its longest path, each of which rounds its operands to the compute
  format; and the decisions on that path that rounding can flip (a ReLU, a max-pool window), each
  of which moves the gradient below it by a whole unit's signal. Each is a count or a function of
  the resolved entry. Both must be declared, 0 included: a matmul-like type left at a silent 0
  would get a tolerance too tight for it, so a LayerType without them is a ValueError.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel


class ShapeError(ValueError):
    """A layer cannot accept the shape that reaches it (the loader names file and layer)."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class Site:
    """Where a layer sits: its position, the shape that reaches it (no batch axis), the network's
    input model (schema.TensorInput or schema.TokenInput) and the network's first layer as validated."""

    index: int
    shape: tuple[int, ...]
    input: Any
    # A tied lm_head uses the token embedding's table (the first layer of a token network), so it
    # must know that layer is there and its width; nothing before a layer but the shape reaching it
    # told a layer about the others until then. The first layer only, not the list: a layer's rule
    # should not depend on the layers between. None where a Site is made without a network (tests).
    first: Any = None

    @property
    def tokens(self) -> bool:
        """A token input (ids through an embedding first), a language model's or BERT's masked one."""
        return getattr(self.input, "kind", None) in ("tokens", "masked_tokens")

    def error(self, reason: str) -> ShapeError:
        return ShapeError(self.index, reason)

    def require_image(self, layer_type: str) -> None:
        require_image(self.index, layer_type, self.shape)


@dataclass
class Inferred:
    """What `infer` found: the output shape, trainable parameters, forward FLOPs per sample, and the
    resolved entries when they are not the layer's own fields (see `resolved_entry`). `head_params`:
    those of the parameters that are a pre-training task's heads, which a model's published size
    leaves out (BERT's masked-LM and next-sentence heads); counted in `params` too."""

    shape: tuple[int, ...]
    params: int = 0
    flops: int = 0
    resolved: list[dict] | None = None
    head_params: int = 0


class Work(Protocol):
    """The workload's builder as a layer's `work` function sees it (performance/workload.py)."""

    batch: int
    dtype: str  # of the kernels
    train: bool
    element_bytes: int

    def op(self, label: str, flops: float, bytes: float) -> Any:
        """Element-wise work estimated from its FLOPs and bytes."""

    def passes(self, label: str, elements: int, passes: int, flops_per_element: float = 1.0,
               epilogue: bool = False) -> Any:
        """Element-wise work over `elements` values read or written `passes` times; `epilogue`: work
        a graph optimiser may fold into the matrix product or convolution it follows (a bias, an
        activation, a residual addition, an inference batch norm: performance/workload.py Op)."""

    def kernel(self, label: str, kind: str, alternatives: tuple = (), parts: tuple = (), epilogue: bool = False,
               **shape) -> Any:
        """A kernel of performance/kernels.py at the workload's dtype; `alternatives`: ((kind, count,
        shape), ...) kernels that do the same work, the first measured one standing in for it;
        `parts`: operations made by this builder that the same work is made of unfused, their sum
        standing in for it where neither it nor an alternative was measured; `epilogue`: as for
        `passes` (a GELU's forward)."""

    def conv(self, layer: Any, name: str, in_shape, filters, kernel, stride, padding, input_grad, bias):
        """A convolution's forward and backward kernels (and bias gradient); returns its output shape."""

    def batch_norm(self, layer: Any, name: str, shape, input_grad: bool = True) -> None:
        """A batch norm over `shape` (C, H, W) or (C,): in training its forward and backward kernels
        (the input's gradient when `input_grad`), at inference its scale and shift."""

    def activation(self, layer: Any, name: str, shape) -> None:
        """An element-wise activation's forward and backward passes over `shape`."""


def _no_weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return {}


# A count per resolved entry, or a function of the resolved entry giving it.
EntryCount = int | Callable[[dict], int]
_COUNTS = ("rounding_depth", "decisions")


@dataclass(frozen=True)
class LayerType:
    """One entry of the layer table (definitions/layers/__init__.py)."""

    model: type[BaseModel]
    infer: Callable[[Any, Site], Inferred]
    work: Callable[[Work, Any, dict, bool], None]
    weights: Callable[[str, dict], dict[str, tuple[int, ...]]] = _no_weights
    # Keyword-only and with no usable default: see the module docstring. None is "not declared".
    rounding_depth: EntryCount | None = field(default=None, kw_only=True)
    decisions: EntryCount | None = field(default=None, kw_only=True)
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "names", type_names(self.model))
        label = ", ".join(map(repr, self.names))
        missing = [name for name in _COUNTS if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"layer type {label}: declare {' and '.join(missing)} (keyword arguments of LayerType): "
                "the products in sequence through one resolved entry and the ReLU-like decisions on "
                "its path, which the mixed-precision tolerance is built from; 0 where it has none")
        for name in _COUNTS:
            value = getattr(self, name)
            if not callable(value) and not _is_count(value):
                raise ValueError(f"layer type {label}: {name} must be a count (an int >= 0) or a function "
                                 f"of the resolved entry, got {value!r}")

    def rounding_depth_of(self, entry: dict) -> int:
        """Products in sequence on the longest path through one resolved entry of this type."""
        return self._count("rounding_depth", entry)

    def decisions_of(self, entry: dict) -> int:
        """Decisions rounding can flip (ReLUs, max-pools) on that path."""
        return self._count("decisions", entry)

    def _count(self, name: str, entry: dict) -> int:
        value = getattr(self, name)
        count = value(entry) if callable(value) else value
        if not _is_count(count):
            raise ValueError(f"layer type {entry.get('type')!r}: its {name} gave {count!r} for {entry}, "
                             "not a count (an int >= 0)")
        return count


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def type_names(model: type[BaseModel]) -> tuple[str, ...]:
    """The layer types a model validates: the values of its `type: Literal[...]` field."""
    info = getattr(model, "model_fields", {}).get("type")
    if info is None or typing.get_origin(info.annotation) is not typing.Literal:
        raise ValueError(f"{getattr(model, '__name__', model)}: a layer model needs a field `type: Literal[...]`")
    names = typing.get_args(info.annotation)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{model.__name__}: its `type` Literal must name the layer types as strings")
    return names


def resolved_entry(layer: BaseModel, in_shape, out_shape, **fill) -> dict:
    """The default resolved form of a layer: its fields, defaults filled (`fill` replaces some),
    then its input and output shape."""
    entry = layer.model_dump(mode="json")
    entry.update(fill)
    entry.update(in_shape=list(in_shape), out_shape=list(out_shape))
    return entry


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def window_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def require_image(index: int, layer_type: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ShapeError(index, f"{layer_type} needs a (channels, height, width) input, got {list(shape)}")
