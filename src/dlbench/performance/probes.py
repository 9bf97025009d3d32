"""What `dlbench calibrate` times to measure the operation classes' efficiencies (class_efficiency.py),
and how it keeps that within a bounded time.

The candidates are the kernels suite's own layer shapes: every kernel of the `layer_shapes`
benchmarks of the single-process suites (fcn, cnn, rnn, transformer) at the profile calibrate uses
(`default`: the shapes the default runs of this device meet; `smoke` for `--quick`), in float32
and in each reduced dtype the device computes in. `select_probes` keeps a few per class, spread
over the class's range of work; each is timed by the framework's own kernel code (the runner's
`runners/<fw>/kernels.py`, the same `kernels` request as the kernels suite) under the kernels suite's
policy of that profile with fewer calls (PROBE_CALLS: the cache policy, warm or cold, stays the
suite's).

The time is bounded before anything runs: each candidate's time per call is estimated from the
ceilings just measured (its roofline over PESSIMISTIC_EFFICIENCY, plus the framework's call and,
for a cold policy, the cache flush), candidates over `max_probe_s` per call are left out, and
while the estimated total of the chosen probes exceeds the budget the costliest is dropped: the
reduced precisions' before float32's, and each class's smallest probes first, then its largest
(and a matmul's widest and thickest), its middle and busiest ones last (ROLE_TIERS). The
estimate is on the slow side by design; what it took is measured and printed.

Probes are grouped into a few kernel runs per framework (GROUPS: matrix products, convolutions,
recurrent and attention cores, memory-bound work), so the progress bar moves as each group ends;
the smoke profile's few probes (`--quick`, for tests) go in one run, one worker start per framework.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from ..definitions.loader import read_yaml, validate
from ..store.profiles import MachineProfile, ProbeTime
from .class_efficiency import efficiency_class, probe_roles, select_probes
from .kernel_suite import KernelBenchmark, KernelPolicy, KernelSuite, KernelSuiteFile, LayersEntry
from .kernels import KernelSpec
from .model import roofline_time
from .workload import Op

PESSIMISTIC_EFFICIENCY = 0.05  # for the time estimate only: slow kernels reach a few % of the roofline
# calls per probe: (warm-up calls, minimum timed calls, most timed calls); no minimum time
PROBE_CALLS = {"default": (1, 3, 5), "smoke": (0, 1, 2)}
PROBES_PER_CLASS = {"default": 3, "smoke": 1}
# per framework, the default of `calibrate --budget`; at 120 s the pooling classes' probes left no room
# for 4 of the 11 float32 matmul ones; 180 s, with the cap at 2.5 s, gave up 15 small reduced-precision ones
BUDGET_S = 200.0
# per call, estimated (a cold call writes 1.5x the LLC first); at 2.0 s the rnn suite's classifier
# layers were never probed (LSTM-32's dense backward and LSTM-64's product, estimated at 2.05 s a call,
# took 0.1-0.2 s), and jax's, whose classifier backward runs at half the speed of its other dense
# layers, was predicted from the transformers' (one plain calibration: its rnn cell 25.5%)
MAX_PROBE_S = {"default": 2.5, "smoke": 0.5}

GROUPS = (("matmul", ("matmul", "batched_matmul", "dense_fwd", "dense_bwd")), ("convolution", ("conv2d_fwd", "conv2d_bwd")),
          ("recurrent-attention", ("lstm_layer_fwd", "lstm_layer_bwd", "lstm_step_fwd", "lstm_step_bwd",
                                   "attention_fwd", "attention_bwd")))
MEMORY_GROUP = "memory-bound"  # the rest: layer and batch norm, GELU, pooling, the loss, the update
ALL_GROUP = "all"  # the smoke profile's probes, in one run


@dataclass(frozen=True)
class ProbePlan:
    benchmarks: tuple[KernelBenchmark, ...]  # one per group that has probes
    classes: int
    estimated_s: float  # per framework, by the estimate above
    left_out: tuple[str, ...]  # keys dropped for the per-call cap or the budget


def layer_benchmarks(suite_path: Path, single_suites: Iterable[str]) -> dict[str, str]:
    """The kernel suite file's `layer_shapes` benchmarks over single-process suites: name -> the suite
    whose layers it times, in the file's order."""
    spec = validate(KernelSuiteFile, read_yaml(suite_path), suite_path)
    singles = set(single_suites)
    return {e.name: e.suite for e in spec.benchmarks if isinstance(e, LayersEntry) and e.suite in singles}


def layer_sets(suite: KernelSuite, layer_names: dict[str, str], suites: Iterable[str] | None = None,
               dtypes: Iterable[str] | None = None) -> list[KernelBenchmark]:
    """What `calibrate --full` times: the suite's layer_shapes benchmarks (`layer_names`, from
    layer_benchmarks), those of `suites` only and with the kernels of `dtypes` only when given (a set
    left with none is left out). ValueError naming the suites there are for a suite none times."""
    chosen, kept = set(suites or ()), set(dtypes or ())
    unknown = sorted(chosen - set(layer_names.values()))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: the kernels suite times the layers of "
                         f"{', '.join(sorted(set(layer_names.values())))}")
    out = []
    for b in suite.benchmarks:
        if b.name not in layer_names or (chosen and layer_names[b.name] not in chosen):
            continue
        specs = tuple(s for s in b.specs if not kept or s.dtype in kept)
        if specs:
            out.append(b if len(specs) == len(b.specs) else replace(b, specs=specs))
    return out


def candidates(suite: KernelSuite, benchmark_names: Iterable[str], support: dict) -> list[KernelSpec]:
    """Every distinct kernel of those benchmarks in a dtype the device computes in (`support`:
    machine.dtype_support), in the suite's order."""
    names = set(benchmark_names)
    seen: dict[str, KernelSpec] = {}
    for b in suite.benchmarks:
        if b.name in names:
            for s in b.specs:
                if not support.get(s.dtype):
                    seen.setdefault(s.key, s)
    return list(seen.values())


def candidate_uses(suite: KernelSuite, benchmark_names: Iterable[str]) -> dict[str, int]:
    """Each candidate's executions per iteration summed over those benchmarks' networks, batch
    sizes and modes (KernelBenchmark.uses): what makes a shape the busiest of its class."""
    names = set(benchmark_names)
    out: Counter[str] = Counter()
    for b in suite.benchmarks:
        if b.name in names:
            out.update(dict(b.uses))
    return out


def probe_policy(base: KernelPolicy, profile: str) -> KernelPolicy:
    """The kernels suite's policy of that profile (its cache policy kept) with PROBE_CALLS' calls."""
    warmup, least, most = PROBE_CALLS[profile]
    return base.model_copy(update={"warmup_iters": warmup, "min_iters": least, "max_iters": most,
                                   "min_time_s": 0.0, "repeats": 1})


def call_estimate(ceilings: MachineProfile, framework_call_s: float, flush_s: float) -> Callable[[KernelSpec], float]:
    """Seconds one call of a kernel is expected to take at most, from a ceilings-only profile."""
    def estimate(spec: KernelSpec) -> float:
        roofline = roofline_time(Op(spec.key, spec.flops, spec.bytes, spec), ceilings)
        return roofline / PESSIMISTIC_EFFICIENCY + framework_call_s + flush_s

    return estimate


def plan_probes(specs: list[KernelSpec], policy: KernelPolicy, profile: str, suite_name: str,
                estimate: Callable[[KernelSpec], float], budget_s: float,
                uses: dict[str, int] | None = None) -> ProbePlan:
    """The probes within `budget_s` (see the module docstring), grouped into kernel benchmarks;
    `uses` (candidate_uses) adds each stratum's busiest shape."""
    calls = 1 + policy.warmup_iters + policy.max_iters
    fitting = probe_roles(specs, PROBES_PER_CLASS[profile], estimate, MAX_PROBE_S[profile], uses)
    everything = select_probes(specs, PROBES_PER_CLASS[profile], uses=uses)
    left_out = [s.key for s in everything if s.key not in {f.key for f, _ in fitting}]
    chosen = [s for s, _ in fitting]
    tier = probe_tiers(fitting)
    while chosen and sum(calls * estimate(s) for s in chosen) > budget_s:
        last_tier = max(tier[s.key] for s in chosen)
        costliest = max((s for s in chosen if tier[s.key] == last_tier), key=estimate)
        chosen.remove(costliest)
        left_out.append(costliest.key)
    grouped: dict[str, list[KernelSpec]] = {}
    for s in chosen:
        group = (next((name for name, kinds in GROUPS if s.kind in kinds), MEMORY_GROUP) if profile != "smoke"
                 else ALL_GROUP)
        grouped.setdefault(group, []).append(s)
    order = [name for name, _ in GROUPS] + [MEMORY_GROUP, ALL_GROUP]
    benchmarks = tuple(
        KernelBenchmark(suite_name, f"probes-{name}", tuple(grouped[name]), "calibrate", policy,
                        f"class probes ({name}): {len(grouped[name])} layer shapes of the suites, {profile} profile")
        for name in order if name in grouped)
    return ProbePlan(benchmarks, len({efficiency_class(s) for s in chosen}),
                     sum(calls * estimate(s) for s in chosen), tuple(left_out))


# what a budget gives up first (the larger tier): the reduced-precision classes' probes before any
# float32 one (every precision's default run is fp32, `REDUCED_TIER` more), and within those each
# stratum keeps its middle probe and its busiest shape (the most of the class's work in the suites'
# runs) longest, then its largest and a matmul's widest output and largest
# small dimension (the amortised end a large shape is predicted from, what writing an output costs,
# how far a GEMM's blocking is filled), the smallest and any between them last
ROLE_TIERS = {"middle": 0, "busiest": 0, "largest": 1, "widest": 1, "thickest": 1, "smallest": 2, "between": 2}
REDUCED_TIER = 3


def probe_tiers(roles: list[tuple[KernelSpec, str]]) -> dict[str, int]:
    """Each chosen probe's tier (ROLE_TIERS) from its role (class_efficiency.probe_roles)."""
    return {s.key: ROLE_TIERS[role] + (0 if s.dtype == "float32" else REDUCED_TIER) for s, role in roles}


def class_probes(records) -> dict[str, list[ProbeTime]]:
    """framework -> its probes' times from the probe runs' kernel records (ok kernels only)."""
    out: dict[str, list[ProbeTime]] = {}
    for r in records:
        if r.status != "ok":
            continue
        cache = r.policy.get("cache", "warm") if r.device == "cpu" else "warm"
        for k in r.kernels:
            if k.status == "ok" and k.median_s:
                out.setdefault(str(r.framework.get("name")), []).append(
                    ProbeTime(spec=k.spec, median_s=k.median_s, run_id=r.run_id, cache=cache))
    return out
