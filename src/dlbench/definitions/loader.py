"""Load YAML definitions, turning every problem into one DefinitionError naming file, field, reason."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from . import layers
from .network import NetworkSummary, ShapeError, analyse

M = TypeVar("M", bound=BaseModel)


class DefinitionError(Exception):
    """A malformed definition file. str() is the one message the user sees."""

    def __init__(self, path: Path | str, field: str, reason: str):
        self.path = str(path)
        self.field = field
        self.reason = reason
        super().__init__(f"{self.path}: {field}: {reason}" if field else f"{self.path}: {reason}")


def _field_path(loc: tuple[Any, ...], tags: frozenset[str] = frozenset()) -> str:
    """Render a pydantic location as `layers[3].kernel`, dropping union-member tags."""
    out = ""
    after_tag = False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            after_tag = False
        elif isinstance(part, str) and ("[" in part or (part in tags and not after_tag)):
            # pydantic inserts the chosen union member's name; it is not a field. What follows a tag
            # is a field of that member, even one named like a tag (a transformer block's `gelu`
            # and `dropout` are also layer types).
            after_tag = True
        else:
            out += f".{part}" if out else part
            after_tag = False
    return out or "(top level)"


@functools.cache
def union_tags(model: type[BaseModel]) -> frozenset[str]:
    """The tags of every discriminated union in `model`'s schema, however deep (the layer types and
    input kinds of a network, a comm suite's size forms, a kernels suite's benchmark kinds):
    pydantic puts the chosen member's tag into an error's location."""
    tags: set[str] = set()
    stack: list[Any] = [model.__pydantic_core_schema__]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "tagged-union":
                tags.update(k for k in node.get("choices", {}) if isinstance(k, str))
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return frozenset(tags)


# Values a definition may expand to once its aliases are followed. `*name` shares the anchored node,
# so a few lines of nested aliases ("a billion laughs") load in microseconds as a structure whose
# validation would walk 10^9 values; the largest shipped definition has a few hundred.
MAX_VALUES = 100_000


def _bounded(data: Any, path: Path) -> Any:
    """`data` if it holds at most MAX_VALUES values counted as validation would walk them (each
    alias's target again), else one DefinitionError; the count stops at the bound."""
    seen, stack = 0, [data]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise DefinitionError(path, "", f"expands to more than {MAX_VALUES:,} values (nested aliases?): "
                                            "no definition needs that many")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return data


def read_yaml(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DefinitionError(path, "", f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DefinitionError(path, "", f"not UTF-8 text: byte 0x{raw[e.start]:02x} on line {line} "
                                        f"(offset {e.start}); save the file as UTF-8") from None
    try:
        return _bounded(yaml.safe_load(text), path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise DefinitionError(path, "", f"invalid YAML: {where}{problem}") from None
    except RecursionError:
        raise DefinitionError(path, "", "invalid YAML: nested too deeply") from None


def validate(model: type[M], data: Any, path: Path) -> M:
    if not isinstance(data, dict):
        raise DefinitionError(path, "", f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        extra = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "union_tag_invalid":
            discriminator = err["ctx"]["discriminator"].strip("'")  # "type" for layers, "kind" for input
            msg = f"unknown {discriminator} {err['ctx']['tag']!r}; expected one of {err['ctx']['expected_tags']}"
        raise DefinitionError(path, _field_path(err["loc"], union_tags(model)), msg + extra) from None


def load_network(path: Path, sequence_length: int | None = None,
                 asked_by: tuple[Path, str] | None = None) -> NetworkSummary:
    """Load, validate and analyse one network description.

    `sequence_length` replaces a token input's own (a suite runs a language model at a length per
    profile and device); a network that cannot take it is reported against `asked_by`, the suite
    file and field that asked, with the network's layer that refused."""
    network = validate(layers.network_model(), read_yaml(path), path)
    if sequence_length is not None:
        where = asked_by or (path, "input.sequence_length")
        if not hasattr(network.input, "sequence_length"):
            raise DefinitionError(*where, f"network {network.name} takes {network.input.kind} input, "
                                          "which has no sequence length")
        network = network.model_copy(update={"input": network.input.model_copy(
            update={"sequence_length": sequence_length})})
    try:
        return analyse(network)
    except ShapeError as e:
        if sequence_length is not None and asked_by is not None:
            raise DefinitionError(*asked_by, f"{sequence_length} positions: {path}: layers[{e.index}]: "
                                             f"{e.reason}") from None
        raise DefinitionError(path, f"layers[{e.index}]", e.reason) from None
