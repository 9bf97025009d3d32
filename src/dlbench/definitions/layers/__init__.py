"""The layer table: every layer type the description language knows, each one `LayerType` entry
(base.py) of its schema model and its functions, found here by its `type`.

Everything that handles a layer looks it up in this table: the schema's union of layer models
(`network_model`, which the loader validates with; an unknown `type` is one DefinitionError listing
these names), shape inference, parameters and FLOPs (network.py), the canonical weights
(weights.py) and the performance model's operations (performance/workload.py). The runners build
from the resolved network with a table of their own, `layer type -> builder`, one per framework
(runners/<fw>/layers.py).

Adding a layer type: its model in schema.py (with its canonical semantics in the docstring there),
its `infer`, `weights` and `work` functions in a module of this package, its entry in `BUILTIN`;
then one builder per runner. `register` adds an entry at run time (a plug-in, a test); `registered`
does so for the length of a `with` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel

from .. import schema
from . import (activation, attention, batch_norm, conv2d, dense, dropout, embedding, flatten, gelu,
               grouped_attention, layer_norm, llama_block, lm_head, lstm, moe, patch_embedding, pooling,
               position_embedding, pretraining_heads, residual, rms_norm, segment_embedding, swiglu, token_pool,
               transformer_block)
from .base import Inferred, LayerType, ShapeError, Site, Work, resolved_entry

__all__ = ["BUILTIN", "Inferred", "LayerType", "ShapeError", "Site", "Work", "lookup", "names", "network_model",
           "register", "registered", "resolved_entry", "unregister"]

# The built-in types, in the order the schema lists them (and an unknown type's message names them).
BUILTIN: tuple[LayerType, ...] = (
    dense.LAYER,
    conv2d.LAYER,
    pooling.MAX_POOL,
    pooling.AVG_POOL,
    pooling.GLOBAL_AVG_POOL,
    batch_norm.LAYER,
    activation.LAYER,  # relu, sigmoid, tanh
    flatten.LAYER,
    dropout.LAYER,
    embedding.LAYER,
    lstm.LAYER,
    residual.LAYER,
    position_embedding.LAYER,
    patch_embedding.LAYER,
    layer_norm.LAYER,
    gelu.LAYER,
    attention.LAYER,
    transformer_block.LAYER,
    token_pool.LAYER,
    lm_head.LAYER,
    segment_embedding.LAYER,
    pretraining_heads.LAYER,
    rms_norm.LAYER,
    grouped_attention.LAYER,
    swiglu.LAYER,
    moe.LAYER,
    llama_block.LAYER,
)

_TABLE: dict[str, LayerType] = {}


def register(entry: LayerType) -> LayerType:
    """Add a layer type (each name of its model's `type` Literal); a name already taken is refused."""
    if not isinstance(entry, LayerType):
        raise TypeError(f"register takes a LayerType, got {type(entry).__name__}")
    taken = [name for name in entry.names if name in _TABLE]
    if taken:
        raise ValueError(f"layer type {', '.join(map(repr, taken))} is already registered")
    for name in entry.names:
        _TABLE[name] = entry
    return entry


def unregister(entry: LayerType) -> None:
    """Remove a layer type `register` added (a built-in one too: the caller owns the consequences)."""
    for name in entry.names:
        if _TABLE.get(name) is entry:
            del _TABLE[name]


@contextmanager
def registered(entry: LayerType) -> Iterator[LayerType]:
    """`entry` is in the table inside the block, and out of it afterwards, whatever happens."""
    register(entry)
    try:
        yield entry
    finally:
        unregister(entry)


def names() -> tuple[str, ...]:
    """Every layer type, in table order."""
    return tuple(_TABLE)


def lookup(layer_type: str) -> LayerType:
    """The entry of `layer_type`; a ValueError naming it and the known ones otherwise."""
    try:
        return _TABLE[layer_type]
    except KeyError:
        raise ValueError(f"unknown layer type {layer_type!r}; expected one of {', '.join(_TABLE)}") from None


def network_model() -> type[BaseModel]:
    """The schema's Network model over the layer types in the table now."""
    models = tuple(dict.fromkeys(entry.model for entry in _TABLE.values()))
    return schema.network_model(models)


for _entry in BUILTIN:
    register(_entry)
