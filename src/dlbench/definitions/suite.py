"""Suites, profiles and the benchmarks they resolve to.

A suite file lists networks with the workloads to run them under; a profile chooses batch sizes and
the measurement policy. `resolve_benchmarks` turns (suite, profile, device) into concrete,
framework-neutral Benchmark objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field

from .analysis import NetworkSummary
from .loader import DefinitionError, load_network, read_yaml, validate
from .schema import PositiveInt, _Strict

Mode = Literal["train", "infer"]
Precision = Literal["float32", "amp_fp16", "amp_bf16"]
Device = Literal["cpu", "cuda"]
PROFILES = ("smoke", "default", "paper")


class WarmupPolicy(_Strict):
    min_iters: Annotated[int, Field(ge=0)] = 2
    max_iters: PositiveInt = 50
    max_time_s: Annotated[float, Field(gt=0)] = 30.0
    window: PositiveInt = 3
    tolerance: Annotated[float, Field(gt=0)] = 0.1


class MeasurePolicy(_Strict):
    min_iters: Annotated[int, Field(ge=5)] = 5
    min_time_s: Annotated[float, Field(ge=0)] = 1.0
    max_iters: PositiveInt = 10000


class Profile(_Strict):
    description: str = ""
    warmup: WarmupPolicy
    measure: MeasurePolicy
    repeats: Annotated[int, Field(ge=1)] = 3
    # How many of each network's modes this profile runs, in the order the suite lists them; None
    # runs them all. `smoke` takes one (train in the shipped suites): one run per network and
    # framework keeps a look over every suite and framework within minutes.
    modes_per_network: PositiveInt | None = None


class ProfilesFile(_Strict):
    smoke: Profile
    default: Profile
    paper: Profile


BatchList = Annotated[list[PositiveInt], Field(min_length=1)]


class PerDevice(_Strict):
    cpu: BatchList
    cuda: BatchList


class BatchSizes(_Strict):
    smoke: BatchList
    default: Union[BatchList, PerDevice]
    paper: BatchList


class Hyperparameters(_Strict):
    learning_rate: Annotated[float, Field(gt=0)] = 0.01
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9


class BenchmarkEntry(_Strict):
    network: str  # a name in suites/networks, or a path to a .yaml relative to the suite file
    modes: Annotated[list[Mode], Field(min_length=1)] = ["train", "infer"]
    batch_sizes: BatchSizes
    precision: Precision = "float32"
    learning_rate: Annotated[float, Field(gt=0)] | None = None
    momentum: Annotated[float, Field(ge=0, lt=1)] | None = None


class SuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    description: str = ""
    defaults: Hyperparameters = Hyperparameters()
    benchmarks: Annotated[list[BenchmarkEntry], Field(min_length=1)]


@dataclass(frozen=True)
class Benchmark:
    """One network under one workload; the unit `dlbench run` measures at each batch size."""

    suite: str
    name: str  # "<network>-<mode>"
    network: NetworkSummary
    network_file: str
    mode: Mode
    batch_sizes: tuple[int, ...]
    precision: str
    learning_rate: float
    momentum: float
    profile: str
    policy: Profile


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    benchmarks: tuple[Benchmark, ...]


class SuiteCatalog:
    """The suites and networks under one definitions root (the repository's `suites/`)."""

    def __init__(self, root: Path):
        self.root = root
        self.networks_dir = root / "networks"

    def suite_names(self) -> list[str]:
        """The single-process suites (what `--suite all` runs); see multi_worker_suite_names."""
        return [name for name, kind in self._kinds() if kind == "benchmark"]

    def multi_worker_suite_names(self) -> list[str]:
        """Suites of `kind: distributed` or `kind: comm`: run with --workers."""
        return [name for name, kind in self._kinds() if kind in ("distributed", "comm")]

    def kernel_suite_names(self) -> list[str]:
        """Suites of `kind: kernels` (performance/kernel_suite.py): kernels timed per framework."""
        return [name for name, kind in self._kinds() if kind == "kernels"]

    def _kinds(self) -> list[tuple[str, str]]:
        from .multiworker import suite_kind

        out = []
        for p in sorted(self.root.glob("*.yaml")):
            if p.stem == "profiles":
                continue
            try:
                out.append((p.stem, suite_kind(p, read_yaml(p))))
            except DefinitionError:
                out.append((p.stem, "benchmark"))  # a broken file is reported when it is loaded
        return out

    def suite_kind(self, path: Path) -> str:
        """`benchmark`, `distributed`, `comm` or `kernels` (DefinitionError for a file that cannot be read)."""
        from .multiworker import suite_kind

        return suite_kind(path, read_yaml(path))

    def load_multi_worker(self, path: Path, profile: str, device: Device):
        """A `kind: distributed` or `kind: comm` suite (definitions/multiworker.py)."""
        from .multiworker import load_comm, load_distributed

        data = read_yaml(path)
        if self.suite_kind(path) == "comm":
            return load_comm(path, data, profile)
        return load_distributed(path, data, profile, device, self._network_path)

    def network_names(self) -> list[str]:
        return sorted(p.stem for p in self.networks_dir.glob("*.yaml"))

    def suite_path(self, name_or_path: str) -> Path | None:
        """A suite by name, or a user's suite file by path; None when neither exists."""
        if name_or_path in self.suite_names() + self.multi_worker_suite_names() + self.kernel_suite_names():
            return self.root / f"{name_or_path}.yaml"
        p = Path(name_or_path)
        return p if p.suffix in (".yaml", ".yml") and p.is_file() else None

    def profiles(self) -> ProfilesFile:
        path = self.root / "profiles.yaml"
        return validate(ProfilesFile, read_yaml(path), path)

    def load_suite(self, path: Path, profile: str, device: Device, modes: tuple[Mode, ...] | None = None) -> Suite:
        """Resolve a suite file; `modes`, when given, runs exactly those of each network's modes
        (whatever the profile's modes_per_network says)."""
        spec = validate(SuiteFile, read_yaml(path), path)
        policy = getattr(self.profiles(), profile)
        benchmarks = []
        seen: set[str] = set()
        for i, entry in enumerate(spec.benchmarks):
            net_path = self._network_path(entry.network, path, f"benchmarks[{i}].network")
            network = load_network(net_path)
            sizes = getattr(entry.batch_sizes, profile)
            if isinstance(sizes, PerDevice):
                sizes = getattr(sizes, device)
            for mode in entry.modes:  # every mode is checked, whichever this profile runs
                name = f"{network.name}-{mode}"
                if name in seen:
                    raise DefinitionError(path, f"benchmarks[{i}]", f"benchmark {name} is defined twice")
                seen.add(name)
            if modes is not None:
                chosen = [m for m in entry.modes if m in modes]
            elif policy.modes_per_network:
                chosen = entry.modes[: policy.modes_per_network]
            else:
                chosen = entry.modes
            for mode in chosen:
                name = f"{network.name}-{mode}"
                benchmarks.append(Benchmark(
                    suite=spec.name, name=name, network=network, network_file=str(net_path), mode=mode,
                    batch_sizes=tuple(sizes), precision=entry.precision,
                    learning_rate=entry.learning_rate or spec.defaults.learning_rate,
                    momentum=entry.momentum if entry.momentum is not None else spec.defaults.momentum,
                    profile=profile, policy=policy,
                ))
        return Suite(spec.name, spec.description, path, tuple(benchmarks))

    def _network_path(self, ref: str, suite_path: Path, field: str) -> Path:
        by_name = self.networks_dir / f"{ref}.yaml"
        if by_name.is_file():
            return by_name
        relative = suite_path.parent / ref
        if relative.suffix in (".yaml", ".yml") and relative.is_file():
            return relative
        raise DefinitionError(
            suite_path, field,
            f"unknown network {ref!r}; expected one of {', '.join(self.network_names())} or a path to a .yaml file",
        )
