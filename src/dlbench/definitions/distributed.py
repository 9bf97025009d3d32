"""Suites that run on several workers at once: `kind: distributed` and `kind: comm`.

- distributed: synchronous data-parallel training of the suite's networks; every worker holds the
  whole network and a share of the batch, and the gradients are all-reduced every iteration.
- comm: the collectives beneath it (all-reduce, all-gather, broadcast, reduce-scatter) and the one
  beneath expert parallelism (all-to-all) over a range of message sizes.

Both measure a fixed number of iterations per profile (`policy`), unlike the single-process suites'
adaptive warm-up: every rank of a job must run the same number of collective steps, and letting
each rank decide by its own clock would leave one rank waiting in a collective that another never
enters (agreeing on it would take an extra collective inside the measured loop).

Sizes follow the nccl-tests convention: the size of a collective is the bytes of its largest
buffer, i.e. the message for all-reduce and broadcast, the gathered output for all-gather, the
input that is reduced and scattered for reduce-scatter, each rank's send buffer (n blocks, one per
rank, and as large as its receive buffer) for all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from .loader import DefinitionError, load_network, validate
from .network import NetworkSummary
from .schema import Int, _Strict
from .suite import (MAX_ITERS, MAX_REPEATS, BatchList, Device, Hyperparameters, LearningRate, Momentum, PerDevice,
                    Precision)

Collective = Literal["all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"]
Scaling = Literal["strong", "weak"]
DTYPE_BYTES = {"float32": 4}
MessageBytes = Int(1, 1 << 40)  # a collective's message: up to 1 TiB


class FixedIterations(_Strict):
    warmup_iters: Int(0, MAX_ITERS)
    measure_iters: Int(5, MAX_ITERS)
    repeats: Int(1, MAX_REPEATS) = 1  # fresh jobs (every process started anew)


class FixedPolicies(_Strict):
    smoke: FixedIterations
    default: FixedIterations
    paper: FixedIterations


class DistributedBatchSizes(_Strict):
    # strong scaling: the global batch (split over the workers); weak: the batch of one worker.
    # A profile left out (null) does not run this network.
    smoke: BatchList | None = None
    default: Union[BatchList, PerDevice]
    paper: BatchList | None = None


class DistributedEntry(_Strict):
    network: str  # a name in suites/networks, or a path to a .yaml relative to the suite file
    batch_sizes: DistributedBatchSizes
    precision: Precision = "fp32"
    learning_rate: LearningRate | None = None
    momentum: Momentum | None = None


class DistributedSuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    kind: Literal["distributed"]
    description: str = ""
    scaling: Scaling = "strong"  # what --scaling defaults to
    defaults: Hyperparameters = Hyperparameters()
    policy: FixedPolicies
    benchmarks: Annotated[list[DistributedEntry], Field(min_length=1)]


class SizeRange(_Strict):
    """start, start*factor, ... up to stop (inclusive), in bytes."""

    start: MessageBytes
    stop: MessageBytes
    factor: Int(2, 1 << 20) = 2

    @model_validator(mode="after")
    def _ordered(self):
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) is below start ({self.start})")
        return self

    def sizes(self) -> list[int]:
        out, size = [], self.start
        while size <= self.stop:
            out.append(size)
            size *= self.factor
        return out


# A list of sizes, or a range; told apart by their YAML shape so that an error names the one meant.
SizeSpec = Annotated[Union[Annotated[Annotated[list[MessageBytes], Field(min_length=1, max_length=1024)], Tag("list")],
                           Annotated[SizeRange, Tag("range")]],
                     Discriminator(lambda v: "range" if isinstance(v, dict) else "list")]


class CommSizes(_Strict):
    smoke: SizeSpec
    default: SizeSpec
    paper: SizeSpec


class CommSuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    kind: Literal["comm"]
    description: str = ""
    collectives: Annotated[list[Collective], Field(min_length=1)]
    dtype: Literal["float32"] = "float32"
    sizes: CommSizes  # bytes per message (see the module docstring for what a size is)
    policy: FixedPolicies


@dataclass(frozen=True)
class DistributedBenchmark:
    """One network trained data-parallel; run at each batch size with the workers asked for."""

    suite: str
    name: str  # "<network>-train"
    network: NetworkSummary
    network_file: str
    batch_sizes: tuple[int, ...]  # global (strong scaling) or per worker (weak), as `scaling` says
    precision: str
    learning_rate: float
    momentum: float
    profile: str
    policy: FixedIterations
    mode: str = "train"
    compression: str = "none"  # how the gradients are exchanged (runners/common/contract.py Compression)
    parallelism: str = "data"  # how the network is split over the workers (runners/common/contract.py Parallelism)


def moe_experts(network: dict) -> list[int]:
    """The experts of each Mixture-of-Experts layer of a resolved network, in order (a `moe` layer
    or a decoder block with `moe`); [] where it has none."""
    out = []
    for layer in network["layers"]:
        if layer["type"] == "moe":
            out.append(layer["experts"])
        elif isinstance(layer.get("moe"), dict):
            out.append(layer["moe"]["experts"])
    return out


@dataclass(frozen=True)
class CommBenchmark:
    """Every collective of a comm suite over its sizes; one job runs them all, one record per collective."""

    suite: str
    collectives: tuple[str, ...]
    dtype: str
    sizes: tuple[int, ...]  # bytes
    profile: str
    policy: FixedIterations
    suite_file: str

    def definition(self, collective: str) -> dict[str, Any]:
        """What a comm record stores as its workload's definition (and hashes)."""
        return {"collective": collective, "dtype": self.dtype, "sizes_bytes": list(self.sizes)}


@dataclass(frozen=True)
class DistributedSuite:
    name: str
    kind: Literal["distributed", "comm"]
    description: str
    path: Path
    scaling: Scaling  # the suite's default (distributed); "strong" for comm, where it means nothing
    benchmarks: tuple[DistributedBenchmark, ...] = ()
    comm: CommBenchmark | None = None


def load_distributed(path: Path, data: dict, profile: str, device: Device, network_path) -> DistributedSuite:
    """`network_path(ref, suite_path, field)`: the catalog's resolution of a network reference."""
    spec = validate(DistributedSuiteFile, data, path)
    policy = getattr(spec.policy, profile)
    benchmarks = []
    seen: set[str] = set()
    for i, entry in enumerate(spec.benchmarks):
        net_path = network_path(entry.network, path, f"benchmarks[{i}].network")
        network: NetworkSummary = load_network(net_path)
        name = f"{network.name}-train"
        if name in seen:
            raise DefinitionError(path, f"benchmarks[{i}]", f"benchmark {name} is defined twice")
        seen.add(name)
        sizes = getattr(entry.batch_sizes, profile)
        if isinstance(sizes, PerDevice):
            sizes = getattr(sizes, device)
        if not sizes:
            continue  # not in this profile
        benchmarks.append(DistributedBenchmark(
            suite=spec.name, name=name, network=network, network_file=str(net_path), batch_sizes=tuple(sizes),
            precision=entry.precision, learning_rate=entry.learning_rate or spec.defaults.learning_rate,
            momentum=entry.momentum if entry.momentum is not None else spec.defaults.momentum,
            profile=profile, policy=policy))
    return DistributedSuite(spec.name, "distributed", spec.description, path, spec.scaling, tuple(benchmarks))


def load_comm(path: Path, data: dict, profile: str) -> DistributedSuite:
    spec = validate(CommSuiteFile, data, path)
    if len(set(spec.collectives)) != len(spec.collectives):
        raise DefinitionError(path, "collectives", "a collective is listed twice")
    element = DTYPE_BYTES[spec.dtype]
    for name in ("smoke", "default", "paper"):  # every profile is checked, whichever runs
        given = getattr(spec.sizes, name)
        if isinstance(given, SizeRange):
            if given.start % element:  # an integer factor keeps every later size a multiple too
                raise DefinitionError(path, f"sizes.{name}.start",
                                      f"{given.start} bytes is not a whole number of {spec.dtype} elements "
                                      f"({element} bytes)")
        else:
            for j, size in enumerate(given):
                if size % element:
                    raise DefinitionError(path, f"sizes.{name}[{j}]",
                                          f"{size} bytes is not a whole number of {spec.dtype} elements "
                                          f"({element} bytes)")
            if sorted(set(given)) != list(given):
                raise DefinitionError(path, f"sizes.{name}", "sizes must be increasing, each once")
    given = getattr(spec.sizes, profile)
    sizes = given.sizes() if isinstance(given, SizeRange) else list(given)
    comm = CommBenchmark(suite=spec.name, collectives=tuple(spec.collectives), dtype=spec.dtype, sizes=tuple(sizes),
                         profile=profile, policy=getattr(spec.policy, profile), suite_file=str(path))
    return DistributedSuite(spec.name, "comm", spec.description, path, "strong", (), comm)


def batches(batch: int, workers: int, scaling: str) -> tuple[int, int]:
    """(per-worker batch, global batch) for a suite batch size; ValueError when strong scaling
    cannot split it evenly."""
    if scaling == "weak":
        return batch, batch * workers
    if batch % workers:
        raise ValueError(f"strong scaling splits the global batch {batch} over {workers} workers: "
                         "it must be a multiple of --workers (or use --scaling weak)")
    return batch // workers, batch
