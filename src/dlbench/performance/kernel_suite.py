"""The `kernels` suite: matrix multiply, transpose, convolution, LSTM, attention, layer-norm and GELU
kernels timed in every framework, at square sizes and at the shapes of dlbench's own networks, and
the ceilings `dlbench calibrate` measures the same way.

A suite file of `kind: kernels` (suites/kernels.yaml) lists benchmarks, each a set of kernels:
- `kind: matmul` / `kind: transpose`: square n x n matrices, per profile `sizes`;
- `kind: layer_shapes`: every kernel of a training and an inference iteration of the networks of
  another suite (`suite: cnn`): GEMMs, convolutions (forward and backward), LSTM layers and steps,
  attention cores and their batched products, layer norms, GELUs, the loss and the update, at the
  batch sizes (and sequence lengths) that suite runs in the same profile on the same device
  (`performance/workload.py` names them), optionally only some of its networks per profile;
each in the `dtypes` listed. A profile's `policy` says how each kernel is timed inside a worker
(a first call apart, warm-up calls, then at least `min_iters` calls and `min_time_s`, each between
two synchronisations) and how many fresh worker processes (`repeats`) time the whole set.

One run per framework and benchmark, through the orchestrator's environments and worker launcher
(a child process per repeat, with the timeout; a crash or hang is recorded as failed and the suite
goes on). Whether the device has the arithmetic of a reduced precision is `dtype_support` (on a
CPU the avx512_bf16/amx_bf16 and avx512_fp16/amx_fp16 flags, on a GPU its compute capability):
on a GPU without it the kernels are recorded as skipped with the reason; on a CPU without it they
are measured as the frameworks emulate it and marked so (settings["arithmetic"]), since that is
what an AMP run on that CPU pays; a kernel a framework refuses in a reduced precision is skipped
with the framework's reason. The machine's ceilings never include an emulated precision. Results are kernel records (`KernelRecord`) in `STORE/kernels/<run_id>.json`,
written like run records (temporary file, link, checksum), beside `runs/` rather than in it: a
kernel record has no network, batch or iteration time, so it is no row of `dlbench results` and
no entry of a leaderboard. Per kernel: the median time (pooled over the repeats), the achieved
FLOP/s (bytes/s for transpose and copy) and its fraction of the machine's ceiling when a machine
profile exists (else the fraction is left empty and says why).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field

from ..definitions.loader import DefinitionError, read_yaml, validate
from ..definitions.schema import Int, PositiveInt, Real, _Strict
from ..definitions.suite import MAX_ITERS, MAX_REPEATS, MAX_SECONDS
from ..store.profiles import MachineProfile
from .kernels import KernelSpec
from .workload import decompose, kernel_specs, kernel_uses

Dtype = Literal["float32", "float16", "bfloat16"]
# The loss and the optimiser's update stay in float32 under mixed precision (float32 master weights,
# the loss computed in float32): a reduced-precision layer set leaves them out.
FLOAT32_ONLY = ("softmax_xent_fwd", "softmax_xent_bwd", "sgd_momentum")


# ---------------------------------------------------------------------------------------- the file

class KernelPolicy(_Strict):
    # bounded as every number of a definition is (definitions/schema.py)
    warmup_iters: Int(0, MAX_ITERS) = 2
    min_iters: Int(1, MAX_ITERS) = 5
    min_time_s: Real(ge=0, le=MAX_SECONDS) = 0.2
    max_iters: Int(1, MAX_ITERS) = 1000
    repeats: Int(1, MAX_REPEATS) = 1  # fresh worker processes, each timing every kernel
    # cold: the CPU's caches are flushed before every call (a layer's weights, gradients and momentum
    # come from memory in a training step, last touched an iteration ago); warm: calls back to back
    # (what the ceilings measure: a copy's bandwidth at each working-set size). GPU caches are not
    # flushed: on a GPU every kernel is timed warm.
    cache: Literal["cold", "warm"] = "cold"


class KernelPolicies(_Strict):
    smoke: KernelPolicy
    default: KernelPolicy
    paper: KernelPolicy


SizeList = Annotated[list[PositiveInt], Field(min_length=1)]
DtypeList = Annotated[list[Dtype], Field(min_length=1)]


class SquareSizes(_Strict):
    smoke: SizeList
    default: SizeList
    paper: SizeList


class SquareEntry(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$")]
    kind: Literal["matmul", "transpose"]
    sizes: SquareSizes
    dtypes: DtypeList


class NetworkSubset(_Strict):
    """Per profile, only these networks of the suite (a profile left out: all of them)."""

    smoke: list[str] | None = None
    default: list[str] | None = None
    paper: list[str] | None = None


class LayersEntry(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$")]
    kind: Literal["layer_shapes"]
    suite: str  # a suite name in suites/, or a path relative to this file
    networks: NetworkSubset = NetworkSubset()
    dtypes: DtypeList
    # a `distributed` suite only: the worker counts whose per-worker batches are timed (its own
    # scaling: strong divides each global batch by the count, weak keeps it); 1 is the baseline
    workers: Annotated[list[PositiveInt], Field(min_length=1)] | None = None


class Ceilings(_Strict):
    """What `dlbench calibrate` times in every framework: the largest matmul FLOP/s per dtype, copy
    bandwidth per working set (bytes read + written), and the smallest copy (`dispatch_bytes`),
    whose time is what the framework spends on any operation, however little it does."""

    matmul_sizes: SizeList
    dtypes: DtypeList
    copy_bytes: SizeList
    dispatch_bytes: PositiveInt = 1024
    policy: KernelPolicy


class KernelSuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    kind: Literal["kernels"]
    description: str = ""
    policy: KernelPolicies
    ceilings: Ceilings
    benchmarks: Annotated[list[Annotated[Union[SquareEntry, LayersEntry], Field(discriminator="kind")]],
                          Field(min_length=1)]


@dataclass(frozen=True)
class KernelBenchmark:
    suite: str
    name: str
    specs: tuple[KernelSpec, ...]
    profile: str
    policy: KernelPolicy
    source: str  # what the shapes come from, for people
    # a layer_shapes benchmark's: each kernel's executions per iteration summed over the networks,
    # batch sizes and modes it times (workload.kernel_uses), by key; what calibrate's probes weigh
    uses: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class KernelSuite:
    name: str
    description: str
    path: Path
    benchmarks: tuple[KernelBenchmark, ...]
    ceilings: Ceilings


def is_kernel_suite(path: Path) -> bool:
    """Whether a suite file says `kind: kernels` (a file that cannot be read is not, and is reported
    when it is loaded as whatever it is)."""
    try:
        data = read_yaml(path)
    except DefinitionError:
        return False
    return isinstance(data, dict) and data.get("kind") == "kernels"


def _unique(items, path: Path, field_name: str, what: str) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise DefinitionError(path, field_name, f"{what} {item!r} is listed twice")
        seen.add(item)


def load_kernel_suite(path: Path, catalog, profile: str, device: str) -> KernelSuite:
    """Validate a `kind: kernels` file and resolve its benchmarks' kernels for `profile` on `device`;
    every problem is one DefinitionError naming the file and field."""
    spec = validate(KernelSuiteFile, read_yaml(path), path)
    _unique([b.name for b in spec.benchmarks], path, "benchmarks", "benchmark name")
    _unique(spec.ceilings.dtypes, path, "ceilings.dtypes", "dtype")
    policy = getattr(spec.policy, profile)
    benchmarks = []
    for i, entry in enumerate(spec.benchmarks):
        _unique(entry.dtypes, path, f"benchmarks[{i}].dtypes", "dtype")
        if isinstance(entry, SquareEntry):
            sizes = getattr(entry.sizes, profile)
            specs = [_square(entry.kind, n, d) for d in entry.dtypes for n in sizes]
            source, uses = f"square {', '.join(map(str, sizes))}", Counter()
        else:
            specs, source, uses = _layer_kernels(entry, i, path, catalog, profile, device)
            if not specs:
                continue  # `networks: {<profile>: []}`: not in this profile
        benchmarks.append(KernelBenchmark(spec.name, entry.name, tuple(specs), profile, policy, source,
                                          tuple(uses.items())))
    return KernelSuite(spec.name, spec.description, path, tuple(benchmarks), spec.ceilings)


def _square(kind: str, n: int, dtype: str) -> KernelSpec:
    if kind == "matmul":
        return KernelSpec.of("matmul", dtype, m=n, n=n, k=n)
    return KernelSpec.of("transpose", dtype, rows=n, cols=n)


def _layer_kernels(entry: LayersEntry, i: int, path: Path, catalog, profile: str, device: str):
    suite_path = catalog.suite_path(entry.suite)
    if suite_path is None:
        relative = path.parent / entry.suite
        suite_path = relative if relative.is_file() else None
    if suite_path is None or is_kernel_suite(suite_path):
        raise DefinitionError(path, f"benchmarks[{i}].suite",
                              f"unknown suite {entry.suite!r}; expected a suite of networks such as "
                              f"{', '.join(n for n in catalog.suite_names() if n != path.stem)}")
    distributed = catalog.suite_kind(suite_path) == "distributed"
    if entry.workers is not None and not distributed:
        raise DefinitionError(path, f"benchmarks[{i}].workers",
                              f"worker counts apply to a distributed suite; {entry.suite!r} is not one")
    if distributed:
        from ..definitions.distributed import batches

        suite = catalog.load_distributed_suite(suite_path, profile, device)
        batches_of = {}
        for b in suite.benchmarks:
            sizes = []
            for n in entry.workers or [1]:
                for batch in b.batch_sizes:
                    try:
                        sizes.append(batches(batch, n, suite.scaling)[0])
                    except ValueError as e:
                        raise DefinitionError(path, f"benchmarks[{i}].workers",
                                              f"{n} workers cannot split {b.network.name}'s global batch: {e}") from None
            batches_of[b.network.name] = list(dict.fromkeys(sizes))
    else:
        suite = catalog.load_suite(suite_path, profile, device, ("train", "infer"))
        batches_of = {}
        for b in suite.benchmarks:
            batches_of.setdefault(b.network.name, [])
            batches_of[b.network.name] += [n for n in b.batch_sizes if n not in batches_of[b.network.name]]
    networks = {b.network.name: b.network for b in suite.benchmarks}
    names = set(networks)
    subset = getattr(entry.networks, profile)
    for j, name in enumerate(subset or []):
        if name not in names:
            raise DefinitionError(path, f"benchmarks[{i}].networks.{profile}[{j}]",
                                  f"{name!r} is not a network of suite {suite.name} ({', '.join(sorted(names))})")
    seen: dict[str, KernelSpec] = {}
    uses: Counter[str] = Counter()
    used: list[str] = []
    for name, network in networks.items():
        if subset is not None and name not in subset:
            continue
        for batch in batches_of[name]:
            used.append(f"{name} b={batch}")
            # both modes' kernels: inference's are mostly training's, but not all (attention's core
            # without the dropout on its probabilities that training applies)
            workloads = [decompose(network.resolved, batch, mode) for mode in ("train", "infer")]
            counts = sum((kernel_uses(w) for w in workloads), Counter())
            distinct = {s.key: s for w in workloads for s in kernel_specs(w)}
            for s in distinct.values():
                for dtype in entry.dtypes:
                    if dtype != "float32" and s.kind in FLOAT32_ONLY:
                        continue
                    k = KernelSpec(s.kind, s.shape, dtype)
                    seen.setdefault(k.key, k)
                    uses[k.key] += counts[s.key]
    return list(seen.values()), f"layers of {', '.join(dict.fromkeys(used))}", uses


# ---------------------------------------------------------------------------------------- device


# ---------------------------------------------------------------------------------------- records


def ceiling_of(spec: KernelSpec, profile: MachineProfile | None) -> float | None:
    if profile is None:
        return None
    return profile.bandwidth(spec.bytes) if spec.memory_bound else profile.peak_flops(spec.dtype)


# ---------------------------------------------------------------------------------------- running


