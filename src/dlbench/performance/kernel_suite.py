"""The `kernels` suite: matrix multiply, transpose, convolution and LSTM-step kernels timed in every
framework, at square sizes and at the shapes of dlbench's own networks, and the ceilings
`dlbench calibrate` measures the same way.

A suite file of `kind: kernels` (suites/kernels.yaml) lists benchmarks, each a set of kernels:
- `kind: matmul` / `kind: transpose`: square n x n matrices, per profile `sizes`;
- `kind: layer_shapes`: every GEMM, convolution (forward and backward) and LSTM step of the networks of
  another suite (`suite: cnn`), at the batch sizes that suite runs in the same profile on the same
  device (`performance/workload.py` names them), optionally only some of its networks per profile;
each in the `dtypes` listed. A profile's `policy` says how each kernel is timed inside a worker
(a first call apart, warm-up calls, then at least `min_iters` calls and `min_time_s`, each between
two synchronisations) and how many fresh worker processes (`repeats`) time the whole set.

One run per framework and benchmark, through the orchestrator's environments and worker launcher
(a child process per repeat, with the timeout; a crash or hang is recorded as failed and the suite
goes on). Reduced precisions run only where the device has the arithmetic (`dtype_support`: on a
CPU the avx512_bf16/amx_bf16 and avx512_fp16/amx_fp16 flags, on a GPU its compute capability);
the others are recorded as skipped with the reason, as are the kernels a framework refuses in a
reduced precision. Results are kernel records (`KernelRecord`) in `STORE/kernels/<run_id>.json`,
written like run records (temporary file, link, checksum), beside `runs/` rather than in it: a
kernel record has no network, batch or iteration time, so it is no row of `dlbench results` and
no entry of a leaderboard. Per kernel: the median time (pooled over the repeats), the achieved
FLOP/s (bytes/s for transpose and copy) and its fraction of the machine's ceiling when a machine
profile exists (else the fraction is left empty and says why).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..definitions.loader import DefinitionError, read_yaml, validate
from ..definitions.schema import PositiveInt, _Strict
from ..store.store import CHECKSUM_PREFIX, Store, checksum_of
from .kernels import KernelSpec
from .profile import MachineProfile
from .workload import decompose, kernel_specs

Dtype = Literal["float32", "float16", "bfloat16"]
# The loss and the optimiser's update stay in float32 under mixed precision (float32 master weights,
# the loss computed in float32): a reduced-precision layer set leaves them out.
FLOAT32_ONLY = ("softmax_xent_fwd", "softmax_xent_bwd", "sgd_momentum")
KERNEL_RECORD_FORMAT = 1


# ---------------------------------------------------------------------------------------- the file

class KernelPolicy(_Strict):
    warmup_iters: Annotated[int, Field(ge=0)] = 2
    min_iters: PositiveInt = 5
    min_time_s: Annotated[float, Field(ge=0)] = 0.2
    max_iters: PositiveInt = 1000
    repeats: PositiveInt = 1  # fresh worker processes, each timing every kernel
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
            source = f"square {', '.join(map(str, sizes))}"
        else:
            specs, source = _layer_kernels(entry, i, path, catalog, profile, device)
            if not specs:
                continue  # `networks: {<profile>: []}`: not in this profile
        benchmarks.append(KernelBenchmark(spec.name, entry.name, tuple(specs), profile, policy, source))
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
        from ..execution.distributed import batches  # the per-worker batch the distributed runs use

        suite = catalog.load_multi_worker(suite_path, profile, device)
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
        # every mode's kernels: a training iteration's are a superset of inference's at the same batch
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
    used: list[str] = []
    for name, network in networks.items():
        if subset is not None and name not in subset:
            continue
        for batch in batches_of[name]:
            used.append(f"{name} b={batch}")
            work = decompose(network.resolved, batch, "train")
            for s in kernel_specs(work):
                for dtype in entry.dtypes:
                    if dtype != "float32" and s.kind in FLOAT32_ONLY:
                        continue
                    k = KernelSpec(s.kind, s.shape, dtype)
                    seen.setdefault(k.key, k)
    return list(seen.values()), f"layers of {', '.join(dict.fromkeys(used))}"


# ---------------------------------------------------------------------------------------- device

def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def dtype_support(device: str, flags: set[str] | None = None, capability: tuple[int, int] | None = None) -> dict:
    """dtype -> None (the device computes in it) or why not. On a CPU: whether it has bfloat16 /
    float16 arithmetic instructions (without them a framework would convert every element, which
    measures the conversion, not the kernel); on a GPU: compute capability 5.3 (float16) and 8.0
    (bfloat16); unknown capability: left to the framework."""
    out: dict[str, str | None] = {"float32": None}
    if device == "cuda":
        if capability is None:
            return {**out, "float16": None, "bfloat16": None}
        out["float16"] = None if capability >= (5, 3) else f"compute capability {capability[0]}.{capability[1]} < 5.3"
        out["bfloat16"] = None if capability >= (8, 0) else f"compute capability {capability[0]}.{capability[1]} < 8.0"
        return out
    flags = cpu_flags() if flags is None else flags
    out["bfloat16"] = None if flags & {"avx512_bf16", "amx_bf16"} else \
        "this CPU has no bfloat16 arithmetic (neither avx512_bf16 nor amx_bf16)"
    out["float16"] = None if flags & {"avx512_fp16", "amx_fp16"} else \
        "this CPU has no float16 arithmetic (neither avx512_fp16 nor amx_fp16)"
    return out


def gpu_capability(nvml_module: str = "pynvml") -> tuple[int, int] | None:
    from ..telemetry.nvml import load, shutdown

    nvml, _ = load(nvml_module)
    if nvml is None:
        return None
    try:
        return tuple(nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(0)))
    except Exception:  # noqa: BLE001 - no GPU, or a binding without the query: the framework decides
        return None
    finally:
        shutdown(nvml)


# ---------------------------------------------------------------------------------------- records

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KernelResult(_Model):
    key: str
    spec: dict[str, Any]
    status: Literal["ok", "failed", "skipped"]
    reason: str | None = None
    median_s: float | None = None  # over every timed call of every repeat
    first_s: float | None = None  # the first repeat's first call
    times_s: list[float] = []
    flops: int
    bytes: int
    achieved: float | None = None  # FLOP/s, or bytes/s for the memory-bound kinds
    unit: str
    ceiling: float | None = None  # the machine's, in the same unit
    fraction: float | None = None  # achieved / ceiling
    settings: dict[str, Any] = {}


class KernelRecord(_Model):
    format: int = KERNEL_RECORD_FORMAT
    run_id: str
    started_at: datetime
    ended_at: datetime
    dlbench: dict[str, Any]
    suite: str
    benchmark: str
    source: str
    profile: str
    device: str
    framework: dict[str, Any]
    environment: dict[str, Any]
    machine: dict[str, Any]
    threads_requested: int | None
    threads_effective: dict[str, Any] = {}
    timeout_s: float
    policy: dict[str, Any]
    repeats: list[dict[str, Any]] = []  # index, status, reason, wall_s per worker process
    status: Literal["ok", "failed", "timeout", "skipped"]
    reason: str | None = None
    output_tail: str = ""
    ceilings: str | None = None  # the machine profile the fractions are of ("<id>@<revision>")
    kernels: list[KernelResult] = []


def ceiling_of(spec: KernelSpec, profile: MachineProfile | None) -> float | None:
    if profile is None:
        return None
    return profile.bandwidth(spec.bytes) if spec.memory_bound else profile.peak_flops(spec.dtype)


class KernelStore:
    """STORE/kernels/<run_id>.json, written whole or not at all, never replaced, checksummed."""

    def __init__(self, store: Store):
        self.store = store
        self.root = store.root / "kernels"

    def write(self, record: KernelRecord) -> Path:
        data = json.loads(record.model_dump_json())
        data["checksum"] = checksum_of(data)
        final = self.root / f"{record.run_id}.json"
        self.store.publish(json.dumps(data, indent=1).encode() + b"\n", final)
        return final

    @staticmethod
    def read(path: Path) -> KernelRecord:
        """ValueError naming the file when it is damaged or not a kernel record."""
        try:
            data = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: unreadable kernel record: {e}") from None
        stored = data.get("checksum") if isinstance(data, dict) else None
        if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX) or checksum_of(data) != stored:
            raise ValueError(f"{path}: checksum missing or mismatched: the file changed after it was written")
        try:
            return KernelRecord.model_validate({k: v for k, v in data.items() if k != "checksum"})
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None

    def records(self, problems: list[str] | None = None):
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                yield self.read(path)
            except ValueError as e:
                if problems is not None:
                    problems.append(str(e))

    def latest_times(self, machine_id: str, device: str, threads: int | None = None,
                     problems: list[str] | None = None) -> dict[str, dict[str, tuple[float, str, str]]]:
        """framework -> kernel key -> (median seconds, run id, "cold" | "warm"): the latest ok
        measurement of each kernel on this machine and device (and thread count, when given)."""
        out: dict[str, dict[str, tuple[float, str, str]]] = {}
        for rec in self.records(problems):  # oldest first (run ids sort by start time): later ones win
            if rec.machine.get("machine_id") != machine_id or rec.device != device:
                continue
            if threads is not None and rec.threads_requested not in (None, threads):
                continue
            framework = out.setdefault(str(rec.framework.get("name")), {})
            # records made before cold timing say nothing: they were warm; a GPU is never flushed
            cache = rec.policy.get("cache", "warm") if rec.device == "cpu" else "warm"
            for k in rec.kernels:
                if k.status == "ok" and k.median_s is not None:
                    framework[k.key] = (k.median_s, rec.run_id, cache)
        return out


# ---------------------------------------------------------------------------------------- running

@dataclass
class PlannedKernelRun:
    runner: Any  # execution.registry.RunnerInfo
    benchmark: KernelBenchmark


def plan_kernel_runs(runners: list, benchmarks: list[KernelBenchmark]) -> list[PlannedKernelRun]:
    return [PlannedKernelRun(r, b) for r in runners for b in benchmarks]


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache of CPU 0 (sysfs `size`, e.g. "307200K"), or None where it cannot be read."""
    sizes = []
    for index in sysfs.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


FLUSH_FALLBACK_BYTES = 256 << 20  # when sysfs says nothing
FLUSH_MAX_BYTES = 1 << 30


def flush_bytes(policy: KernelPolicy, device: str, llc: int | None = None) -> int:
    """What the worker writes before each call of a cold policy: 1.5 times the last-level cache."""
    if policy.cache == "warm" or device != "cpu":
        return 0
    llc = llc if llc is not None else last_level_cache_bytes()
    return min(FLUSH_MAX_BYTES, int(1.5 * llc) if llc else FLUSH_FALLBACK_BYTES)


def kernel_request(specs: list[KernelSpec], policy: KernelPolicy, device: str, threads: int | None,
                   seed: int = 0) -> dict:
    from ..execution.launcher import PROTOCOL_VERSION

    timing = policy.model_dump(exclude={"repeats", "cache"})
    timing["flush_bytes"] = flush_bytes(policy, device)
    return {"protocol": PROTOCOL_VERSION, "action": "kernels", "device": device, "threads": threads, "seed": seed,
            "kernel_policy": timing, "kernels": [s.to_dict() for s in specs]}


@dataclass
class KernelOutcome:
    """What the workers of one run returned, pooled per kernel."""

    results: dict[str, KernelResult] = field(default_factory=dict)
    repeats: list[dict] = field(default_factory=list)
    status: str = "ok"
    reason: str | None = None
    tail: str = ""
    last_result: dict = field(default_factory=dict)


def run_kernels(env, runner, specs: list[KernelSpec], policy: KernelPolicy, device: str, threads: int | None,
                timeout_s: float, support: dict, profile: MachineProfile | None,
                worker_runner=None) -> KernelOutcome:
    """Time `specs` in `policy.repeats` fresh worker processes of `runner` in `env` and pool them.
    `worker_runner` is execution.launcher.run_worker (a parameter for tests)."""
    if worker_runner is None:
        from ..execution.launcher import run_worker as worker_runner
    from ..execution.orchestrator import _thread_env

    outcome = KernelOutcome()
    runnable = []
    for s in specs:
        why = support.get(s.dtype)
        if why:
            outcome.results[s.key] = KernelResult(key=s.key, spec=s.to_dict(), status="skipped", reason=why,
                                                  flops=s.flops, bytes=s.bytes, unit=s.unit)
        else:
            runnable.append(s)
    pooled: dict[str, list[dict]] = {s.key: [] for s in runnable}
    if runnable:
        request = kernel_request(runnable, policy, device, threads)
        for index in range(policy.repeats):
            res_outcome = worker_runner(env.python, runner.worker, request, timeout_s, _thread_env(threads),
                                        None, container=env.container)
            res = res_outcome.result or {}
            outcome.last_result = res or outcome.last_result
            outcome.tail = res_outcome.output_tail
            outcome.repeats.append({"index": index, "status": res_outcome.status, "reason": res_outcome.reason,
                                    "wall_s": res_outcome.wall_s})
            if res_outcome.status != "ok":
                outcome.status, outcome.reason = res_outcome.status, res_outcome.reason
                break
            for entry in res.get("kernels", []):
                key = KernelSpec.from_dict(entry["spec"]).key
                if key in pooled:
                    pooled[key].append(entry)
    for s in runnable:
        outcome.results[s.key] = _pool(s, pooled[s.key], profile, outcome)
    outcome.results = {s.key: outcome.results[s.key] for s in specs}  # in the suite's order
    return outcome


def _pool(spec: KernelSpec, entries: list[dict], profile: MachineProfile | None, outcome: KernelOutcome) -> KernelResult:
    base = dict(key=spec.key, spec=spec.to_dict(), flops=spec.flops, bytes=spec.bytes, unit=spec.unit)
    if not entries:
        return KernelResult(**base, status="failed" if outcome.status != "ok" else "skipped",
                            reason=outcome.reason or "not measured")
    bad = next((e for e in entries if e.get("status") != "ok"), None)
    if bad is not None:
        return KernelResult(**base, status=bad.get("status", "failed"), reason=bad.get("reason"))
    times = [t for e in entries for t in e.get("times_s", [])]
    if any(e.get("forward_median_s") is not None for e in entries):
        # backward = (forward+backward) - forward, per repeat; the pooled median of those differences
        median = statistics.median(e["median_s"] for e in entries)
    else:
        median = statistics.median(times)
    ceiling = ceiling_of(spec, profile)
    achieved = spec.achieved(median) if median > 0 else None
    return KernelResult(**base, status="ok", median_s=median, first_s=entries[0].get("first_s"), times_s=times,
                        achieved=achieved, ceiling=ceiling,
                        fraction=achieved / ceiling if achieved and ceiling else None,
                        settings=entries[0].get("settings", {}))


def execute_kernel_run(orchestrator, run: PlannedKernelRun, kernel_store: KernelStore, support: dict,
                       profile: MachineProfile | None, worker_runner=None) -> KernelRecord:
    """One framework x one kernel benchmark: environment, workers, the record written to the store.
    `orchestrator` is an execution.orchestrator.Orchestrator (its options and environments)."""
    from ..execution.environments import EnvironmentBuildError
    from ..machine import dlbench_provenance, fingerprint
    from ..store.record import new_run_id

    opts = orchestrator.options
    b = run.benchmark
    started = datetime.now(timezone.utc)
    env = orchestrator.environment(run.runner)
    if isinstance(env, EnvironmentBuildError):
        outcome = KernelOutcome(status="failed", reason=str(env))
        env_info = {"backend": opts.env_backend, "error": str(env)}
        for s in b.specs:
            outcome.results[s.key] = KernelResult(key=s.key, spec=s.to_dict(), status="failed", reason=str(env),
                                                  flops=s.flops, bytes=s.bytes, unit=s.unit)
    else:
        env_info = env.describe()
        outcome = run_kernels(env, run.runner, list(b.specs), b.policy, opts.device, opts.threads, opts.timeout_s,
                              support, profile, worker_runner)
    res = outcome.last_result
    record = KernelRecord(
        run_id=new_run_id(started), started_at=started, ended_at=datetime.now(timezone.utc),
        dlbench=dlbench_provenance(), suite=b.suite, benchmark=b.name, source=b.source, profile=b.profile,
        device=opts.device, framework=res.get("framework", {"name": run.runner.name}), environment=env_info,
        machine=fingerprint(), threads_requested=opts.threads, threads_effective=res.get("threads", {}),
        timeout_s=opts.timeout_s, policy=b.policy.model_dump(), repeats=outcome.repeats, status=outcome.status,
        reason=outcome.reason, output_tail=outcome.tail if outcome.status != "ok" else "",
        ceilings=profile.ref if profile else None, kernels=list(outcome.results.values()))
    kernel_store.write(record)
    return record
