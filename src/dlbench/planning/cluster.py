"""The cluster file: what hardware a plan has, what it costs and how its nodes are linked.

    # yaml-language-server: $schema=../schemas/cluster.schema.json
    name: mixed-2026
    preemption_s: 30            # what one restart costs a job (checkpoint, restore, warm-up)
    network: {alpha_us: 10, gb_per_s: 25}   # between nodes: α per message, bandwidth each way
    types:
      h100: {machine: h100, nodes: 4, gpus_per_node: 8, price_per_hour: 3.0}
      cpu:  {machine: "profile:this", nodes: 2, gpus_per_node: 1, price_per_hour: 0.1}

Each type names the machine its throughput comes from: a datasheet machine of `suites/machines/`
(`h100`), a calibrated profile in the store (`profile:<machine id, hostname, file or "this">`), or,
when the plan reads a throughput table (Gavel's), nothing: the table's column of the same name.
`link` is the link inside one node (α, bandwidth each way); left out, a datasheet machine's own
node link (performance/datasheet.py) is used, and a type with one device per node needs none.
`price_per_hour` is per device. A type may have `nodes: 0`: it costs nothing and runs nothing, but a
what-if (`add 8 h200`) can add to it. Validated once, here: a bad file is one DefinitionError naming
the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from pydantic import Field

from ..definitions.loader import DefinitionError, read_yaml, validate
from ..definitions.schema import Int, Real, _Strict

TypeName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
MAX_NODES = 1_000_000
MAX_DEVICES_PER_NODE = 1024


class LinkSpec(_Strict):
    """A link under the communication model (performance/communication.py): one message costs
    alpha + bytes / bandwidth."""

    alpha_us: Real(ge=0, le=1e6)
    gb_per_s: Real(gt=0, le=1e6)  # one direction, 10^9 bytes per second

    @property
    def alpha_s(self) -> float:
        return self.alpha_us * 1e-6

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / (self.gb_per_s * 1e9)


class TypeSpec(_Strict):
    machine: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    nodes: Int(0, MAX_NODES)
    gpus_per_node: Int(1, MAX_DEVICES_PER_NODE) = 1
    price_per_hour: Real(ge=0, le=1e6)  # per device
    link: LinkSpec | None = None


class ClusterFile(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    description: Annotated[str, Field(max_length=2000)] | None = None
    preemption_s: Real(ge=0, le=86400) = 30.0
    round_s: Real(gt=0, le=86400) = 360.0
    network: LinkSpec | None = None
    types: Annotated[dict[TypeName, TypeSpec], Field(min_length=1, max_length=64)]


@dataclass(frozen=True)
class DeviceType:
    """One type of device as the simulator sees it: `count` devices in nodes of `per_node`."""

    name: str
    machine: str | None
    nodes: int
    per_node: int
    price_per_hour: float
    link: LinkSpec | None  # inside a node

    @property
    def count(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True)
class Cluster:
    name: str
    types: tuple[DeviceType, ...]
    network: LinkSpec | None  # between nodes
    preemption_s: float
    round_s: float
    source: str = ""  # the file it came from, for messages

    def type(self, name: str) -> DeviceType:
        for t in self.types:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.types]

    @property
    def devices(self) -> int:
        return sum(t.count for t in self.types)

    def with_type(self, changed: DeviceType) -> Cluster:
        return replace(self, types=tuple(changed if t.name == changed.name else t for t in self.types))


def cluster_from(spec: ClusterFile, path: Path | str) -> Cluster:
    types = tuple(DeviceType(name, t.machine, t.nodes, t.gpus_per_node, t.price_per_hour, t.link)
                  for name, t in spec.types.items())
    cluster = Cluster(spec.name, types, spec.network, spec.preemption_s, spec.round_s, str(path))
    if cluster.devices == 0:
        raise DefinitionError(path, "types", "the cluster has no devices: every type has nodes: 0")
    return cluster


def load_cluster(path: Path) -> Cluster:
    """The cluster of a YAML file; one DefinitionError naming the file and the field when it is bad."""
    return cluster_from(validate(ClusterFile, read_yaml(path), path), path)
