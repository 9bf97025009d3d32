"""The suites and networks under one definitions root (the repository's `suites/`), found by name
and loaded by their kind. A suite file's `kind` picks its loader from SUITE_KINDS; a file without
one is a suite of single-process benchmarks (suite.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .convergence import ConvergenceTask, load_convergence
from .distributed import load_comm, load_distributed
from .generation import context_problem, decoder_problem
from .loader import DefinitionError, load_network, read_yaml, validate
from .suite import (Benchmark, Device, Generation, Mode, PerDevice, PerDeviceCount, PerDeviceLength, ProfilesFile,
                    Suite, SuiteFile)

# kind -> how `dlbench run` treats its suites: "single" (`--suite all`, one process per repeat),
# "distributed" (--workers: a job of ranks per repeat), "kernels" (performance/kernel_suite.py,
# loaded above this layer) or "convergence" (convergence.py: time to a quality target, one process
# per seeded run). A new kind is one entry here and its loader.
SUITE_KINDS: dict[str, str] = {"benchmark": "single", "distributed": "distributed", "comm": "distributed",
                               "kernels": "kernels", "convergence": "convergence"}


class SuiteCatalog:
    """The suites and networks under one definitions root (the repository's `suites/`)."""

    def __init__(self, root: Path):
        self.root = root
        self.networks_dir = root / "networks"
        self.machines_dir = root / "machines"  # datasheet machines (machines.py) and efficiency.yaml
        # Each file is parsed once per catalog, and a command builds one catalog: finding a suite by
        # name reads every suite file's kind, and `dlbench run` resolves its suite more than once
        # (with and without the profile's modes). A catalog is meant to live for one command, so an
        # edit of a file while it lives is not seen.
        self._parsed: dict[Path, Any] = {}
        self._networks: dict[tuple[Path, int | None], Any] = {}

    def read(self, path: Path) -> Any:
        """A definition file's YAML, parsed on the first call for it (DefinitionError where it cannot be)."""
        key = Path(path).resolve()
        if key not in self._parsed:
            self._parsed[key] = read_yaml(path)
        return self._parsed[key]

    def _network(self, path: Path, length: int | None, asked_by: tuple[Path, str]):
        key = (Path(path).resolve(), length)
        if key not in self._networks:
            self._networks[key] = load_network(path, length, asked_by)
        return self._networks[key]

    def suite_names(self) -> list[str]:
        """The single-process suites (what `--suite all` runs); see distributed_suite_names."""
        return [name for name, kind in self._kinds() if SUITE_KINDS[kind] == "single"]

    def distributed_suite_names(self) -> list[str]:
        """Suites of `kind: distributed` or `kind: comm`: run with --workers."""
        return [name for name, kind in self._kinds() if SUITE_KINDS[kind] == "distributed"]

    def kernel_suite_names(self) -> list[str]:
        """Suites of `kind: kernels` (performance/kernel_suite.py): kernels timed per framework."""
        return [name for name, kind in self._kinds() if SUITE_KINDS[kind] == "kernels"]

    def convergence_suite_names(self) -> list[str]:
        """Suites of `kind: convergence` (convergence.py): time to a quality target."""
        return [name for name, kind in self._kinds() if SUITE_KINDS[kind] == "convergence"]

    def load_convergence_suite(self, path: Path, profile: str, device: Device) -> list[ConvergenceTask]:
        """A `kind: convergence` suite's tasks for `profile` on `device`."""
        return load_convergence(path, self.read(path), profile, device, self._network_path)

    def _kinds(self) -> list[tuple[str, str]]:
        out = []
        for p in sorted(self.root.glob("*.yaml")):
            if p.stem == "profiles":
                continue
            try:
                out.append((p.stem, suite_kind(p, self.read(p))))
            except DefinitionError:
                out.append((p.stem, "benchmark"))  # a broken file is reported when it is loaded
        return out

    def suite_kind(self, path: Path) -> str:
        """`benchmark`, `distributed`, `comm`, `kernels` or `convergence` (DefinitionError for a file that
        cannot be read)."""
        return suite_kind(path, self.read(path))

    def load_distributed_suite(self, path: Path, profile: str, device: Device):
        """A `kind: distributed` or `kind: comm` suite (definitions/distributed.py)."""
        data = self.read(path)
        if self.suite_kind(path) == "comm":
            return load_comm(path, data, profile)
        return load_distributed(path, data, profile, device, self._network_path)

    def machine_names(self) -> list[str]:
        """The shipped datasheet machines (suites/machines/<name>.yaml), by name."""
        return sorted(p.stem for p in self.machines_dir.glob("*.yaml") if p.stem != "efficiency")

    def machine_path(self, name: str) -> Path | None:
        return self.machines_dir / f"{name}.yaml" if name in self.machine_names() else None

    def efficiency_path(self) -> Path:
        return self.machines_dir / "efficiency.yaml"

    def network_names(self) -> list[str]:
        return sorted(p.stem for p in self.networks_dir.glob("*.yaml"))

    def suite_path(self, name_or_path: str) -> Path | None:
        """A suite by name, or a user's suite file by path; None when neither exists."""
        if name_or_path in (self.suite_names() + self.distributed_suite_names() + self.kernel_suite_names()
                            + self.convergence_suite_names()):
            return self.root / f"{name_or_path}.yaml"
        p = Path(name_or_path)
        return p if p.suffix in (".yaml", ".yml") and p.is_file() else None

    def profiles(self) -> ProfilesFile:
        path = self.root / "profiles.yaml"
        return validate(ProfilesFile, self.read(path), path)

    def load_suite(self, path: Path, profile: str, device: Device, modes: tuple[Mode, ...] | None = None) -> Suite:
        """Resolve a suite file; `modes`, when given, runs exactly those of each network's modes
        (whatever the profile's modes_per_network says)."""
        spec = validate(SuiteFile, self.read(path), path)
        policy = getattr(self.profiles(), profile)
        benchmarks = []
        seen: set[str] = set()
        for i, entry in enumerate(spec.benchmarks):
            net_path = self._network_path(entry.network, path, f"benchmarks[{i}].network")
            length = None
            if entry.sequence_length is not None:
                length = getattr(entry.sequence_length, profile)
                if isinstance(length, PerDeviceLength):
                    length = getattr(length, device)
            network = self._network(net_path, length, (path, f"benchmarks[{i}].sequence_length"))
            sizes = getattr(entry.batch_sizes, profile)
            if isinstance(sizes, PerDevice):
                sizes = getattr(sizes, device)
            for mode in entry.modes:  # every mode is checked, whichever this profile runs
                name = f"{network.name}-{mode}"
                if name in seen:
                    raise DefinitionError(path, f"benchmarks[{i}]", f"benchmark {name} is defined twice")
                seen.add(name)
            if device not in entry.devices:
                continue  # validated with the others, planned on its devices only
            if modes is not None:
                chosen = [m for m in entry.modes if m in modes]
            elif policy.modes_per_network:
                chosen = entry.modes[: policy.modes_per_network]
            else:
                chosen = entry.modes
            precisions = entry.precision if isinstance(entry.precision, list) else [entry.precision]
            compiles = entry.compile if isinstance(entry.compile, list) else [entry.compile]
            generation, generation_sizes = self._generation(entry, network, profile, device, path, i)
            for mode in chosen:
                name = f"{network.name}-{mode}"
                for precision in dict.fromkeys(precisions):
                    for compile_mode in dict.fromkeys(compiles):
                        benchmarks.append(Benchmark(
                            suite=spec.name, name=name, network=network, network_file=str(net_path), mode=mode,
                            batch_sizes=tuple(generation_sizes or sizes if mode == "generate" else sizes),
                            precision=precision,
                            learning_rate=entry.learning_rate or spec.defaults.learning_rate,
                            momentum=entry.momentum if entry.momentum is not None else spec.defaults.momentum,
                            profile=profile, policy=policy, compile=compile_mode,
                            generation=generation if mode == "generate" else None,
                        ))
        return Suite(spec.name, spec.description, path, tuple(benchmarks))

    @staticmethod
    def _generation(entry, network, profile: str, device: Device, path: Path,
                    i: int) -> tuple[Generation | None, list[int] | None]:
        """(prompt and new tokens, batch sizes or None for the entry's own) of an entry that lists
        mode generate, checked against the network (definitions/generation.py); (None, None) otherwise."""
        if "generate" not in entry.modes:
            if entry.generation is not None:
                raise DefinitionError(path, f"benchmarks[{i}].generation",
                                      "sizes for mode generate, which the entry's modes do not list")
            return None, None
        why = decoder_problem(network.resolved)
        if why:
            raise DefinitionError(path, f"benchmarks[{i}].modes", f"generate: {why}")
        if entry.generation is None:
            raise DefinitionError(path, f"benchmarks[{i}].generation",
                                  "mode generate needs its sizes: prompt_length and new_tokens per profile")

        def per_profile(counts):
            value = getattr(counts, profile)
            return getattr(value, device) if isinstance(value, PerDeviceCount) else value

        prompt, new = per_profile(entry.generation.prompt_length), per_profile(entry.generation.new_tokens)
        why = context_problem(network.resolved, prompt, new)
        if why:
            raise DefinitionError(path, f"benchmarks[{i}].generation", f"{profile}: {why}")
        sizes = None
        if entry.generation.batch_sizes is not None:
            sizes = getattr(entry.generation.batch_sizes, profile)
            if isinstance(sizes, PerDevice):
                sizes = getattr(sizes, device)
        return Generation(prompt, new), sizes

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


def suite_kind(path: Path, data: Any) -> str:
    """`benchmark` (the single-process suites, which carry no kind), `distributed`, `comm` or
    `kernels` (performance/kernel_suite.py)."""
    if not isinstance(data, dict) or "kind" not in data:
        return "benchmark"
    kind = data["kind"]
    if not isinstance(kind, str) or kind == "benchmark" or kind not in SUITE_KINDS:
        named = ", ".join(k for k in SUITE_KINDS if k != "benchmark")
        raise DefinitionError(path, "kind", f"unknown kind {kind!r}; expected {named} "
                                            "(or none, for a suite of single-process benchmarks)")
    return kind
