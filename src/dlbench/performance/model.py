"""Iteration time predicted from a network's work and a machine profile (Shi, Wang, Chu, DataCom 2018).

One worker: t_iter = t_io + t_h2d + t_f + t_b + t_u, where with prefetching the data path costs only
what the computation does not hide: max(0, t_io + t_h2d − (t_f + t_b + t_u)). The synthetic data
dlbench's runners use is already on the device: t_io = t_h2d = 0.

t_f, t_b and t_u are sums over the operations of `workload.decompose`. An operation whose kernel
(shape and dtype) the profile holds as measured on that framework takes its measured median time
(a whole LSTM layer; where only its step was measured, the step once per time step; attention's
fused core, where it was not measured, the sum of its parts: the batched products, measured too,
and the softmax; a dense layer's backward, where not measured, its GEMMs and bias gradient); a kernel
that was not timed but whose operation class calibrate probed on that
framework (performance/class_efficiency.py: convolutions by filter family, matmuls by aspect, LSTM,
attention, normalisation, element-wise, the loss, the optimiser) takes the class's fit of its
probes, overhead + slowdown x its roofline time (class_efficiency.fit_class); any other operation takes its roofline time,
max(FLOPs / peak FLOP/s, bytes / bandwidth at its working set), the bandwidth being what the
framework's own element-wise operation (relu) reached at that size where calibrate measured it,
else the machine's copy bandwidth. Every prediction says how much of its time came from each
source (`SOURCES`): a measured shape, a measured class efficiency (the framework's element-wise
bandwidth counts as one for work that is no kernel), the measured ceilings alone, or a datasheet.
A datasheet profile (performance/datasheet.py: a vendor's published figures,
no measurement) carries an efficiency per operation class: its roofline divides FLOPs by the peak
times the class's efficiency (matmul, convolution, attention; element-wise FLOPs unscaled) and
every operation's bytes by the bandwidth times the element-wise one; a measured profile has none (1).

What a framework spends on an operation besides the work (the call: dispatch, allocation, the
autograd record) is its smallest-operation time d, measured by calibrate. How often it is paid
depends on how the runner executes its step (FrameworkFacts.step: the runner's runner.toml says,
under [model]): an eager step (PyTorch) calls every operation from Python, so each roofline
operation adds d, and a kernel timed on its own paid it too, as it does in the step. A compiled step (a tf.function graph, one XLA executable, MXNet's
cached graph) is one call: d is paid once per iteration (the `step call` phase), and a kernel timed
on its own, which paid a whole call, counts as its time less that call (never below its roofline
time): d for a kernel timed warm, and for one timed cold (a CPU's caches flushed before the call,
the kernels suite's default) the smallest operation timed cold too, d_cold, since the flush evicts
the framework's own code and data as well (measured here: TensorFlow's call ~0.5 ms warm, some
1.5 ms cold). An eager step calls every operation as the kernel was called alone, so it pays the
warm call d per operation; but a kernel timed cold also paid for the framework's own code and data
coming back from memory (d_cold − d), which an operation called from a running step, its framework
hot, does not: that much is taken off (never below its roofline time plus d). Measured here:
torch's call 3 us warm, 76-93 us cold; charged, it over-predicted transformer_tiny's ~60
operations by 30-180%. An operation predicted from its class's efficiency pays the class's fitted
overhead (what the probes paid per call beyond their work and their call) in an eager step, and
none in a compiled one, whose operations run inside one executable: over 13 stored pairs of profile
and runs the median error fell in 8 (13.6% to 11.4% on the freshest), stayed in 4 and rose in one
(18.2% to 18.9%).

N workers, synchronous SGD on a per-worker batch: the same per-worker computation, plus gradient
all-reduce from the profile's fitted α–β cost for that framework (`communication.py`), scheduled
`none` (one all-reduce after the backward), `wfbp` or `mgwfbp` (by default the one its engine
uses, FrameworkFacts.schedule, from runner.toml too); only the communication the backward does not
hide (t_c^no) adds to the iteration: t_f + t_b + t_c^no + t_u. Layers without parameters send
nothing: their backward time counts towards the next layer (in backward order) that has
parameters, whose gradient they delay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..store.profiles import MachineProfile
from .class_efficiency import (ClassFit, ClassPoint, efficiency_class, fit_class, fitted, operand_elements,
                               output_elements)
from .communication import COSTS, SCHEDULES, AllReduceCost, AllToAllCost, Schedule, schedule
from .kernels import OP_CLASS, KernelSpec
from .workload import ELEMENT_BYTES, Op, Workload

MODEL_VERSION = 1

STEPS = ("eager", "graph")
# whether a framework's step computes the element-wise epilogues of its matrix products and
# convolutions inside them (workload.Op.epilogue) or as operations of their own
EPILOGUES = ("separate", "fused")
# the kernels whose output an epilogue can be fused into
CONTRACTIONS = ("matmul", "batched_matmul", "conv2d_fwd")

# Where a share of a predicted time came from: a kernel timed at that very shape, an operation class's
# efficiency measured by calibrate's probes (or the framework's measured element-wise bandwidth, for
# work that is no kernel), the roofline at a calibrated profile's measured ceilings alone, or the
# roofline at a datasheet's published peaks times stated efficiencies.
SOURCES = ("shape", "class", "ceilings", "datasheet")


@dataclass(frozen=True)
class FrameworkFacts:
    """What the model takes from a framework's runner rather than from measurement: how the runner
    executes a training step (`eager`: operation by operation from Python; `graph`: one compiled
    call, d paid once), the gradient schedule its data-parallel engine uses by default (one of
    communication.SCHEDULES) and whether its step fuses element-wise epilogues into the matrix
    product or convolution they follow (`fused`: a graph optimiser's rewrite, each such operation
    costs nothing of its own; `separate`: each is timed as an operation). Each runner states them,
    with its reasons, in its runner.toml's [model] section (execution/registry.py reads and checks
    it); the model itself knows no framework by name. The defaults are what a framework that
    states nothing is taken to do."""

    step: str = "eager"
    schedule: str = "mgwfbp"
    epilogues: str = "separate"

    def __post_init__(self):
        if self.step not in STEPS:
            raise ValueError(f"unknown step execution {self.step!r}; expected one of {', '.join(STEPS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if self.epilogues not in EPILOGUES:
            raise ValueError(f"unknown epilogues {self.epilogues!r}; expected one of {', '.join(EPILOGUES)}")

    @property
    def compiled(self) -> bool:
        return self.step == "graph"


class PredictionError(Exception):
    """The profile lacks what the prediction needs; the message says what to run."""


@dataclass
class DataPath:
    """Where a batch comes from. `read_bytes_per_s` None: synthetic data already in device memory."""

    bytes_per_sample: int
    read_bytes_per_s: float | None = None
    h2d_bytes_per_s: float | None = None  # None: the data is read where it is computed on (CPU)
    prefetch: bool = True

    def times(self, batch: int) -> tuple[float, float]:
        size = self.bytes_per_sample * batch
        t_io = size / self.read_bytes_per_s if self.read_bytes_per_s else 0.0
        t_h2d = size / self.h2d_bytes_per_s if self.h2d_bytes_per_s else 0.0
        return t_io, t_h2d

    def exposed(self, batch: int, compute_s: float) -> float:
        t_io, t_h2d = self.times(batch)
        return max(0.0, t_io + t_h2d - compute_s) if self.prefetch else t_io + t_h2d


@dataclass
class LayerTimes:
    index: int
    label: str
    params: int
    forward_s: float = 0.0
    backward_s: float = 0.0
    update_s: float = 0.0
    measured_s: float = 0.0  # of the above, from measured kernel times
    estimated_s: float = 0.0  # of the above, from the roofline (with or without a class efficiency)
    sources: dict[str, float] = field(default_factory=dict)  # of the above, seconds per SOURCES entry

    @property
    def gradient_bytes(self) -> int:
        return ELEMENT_BYTES * self.params


@dataclass
class Prediction:
    network: str
    framework: str
    batch: int  # per worker
    mode: str
    workers: int
    profile: str  # the profile's ref (machine@revision)
    layers: list[LayerTimes]
    io_s: float
    io_exposed_s: float
    forward_s: float
    backward_s: float
    update_s: float
    step_call_s: float = 0.0  # a compiled step's one call (FrameworkFacts.step graph)
    communication_s: float = 0.0
    communication_exposed_s: float = 0.0
    schedule: Schedule | None = None
    unmeasured: list[str] = field(default_factory=list)  # kernel keys estimated by the roofline
    notes: list[str] = field(default_factory=list)

    @property
    def compute_s(self) -> float:
        return self.step_call_s + self.forward_s + self.backward_s + self.update_s

    @property
    def iteration_s(self) -> float:
        return self.io_exposed_s + self.compute_s + self.communication_exposed_s

    @property
    def measured_share(self) -> float:
        total = sum(l.measured_s + l.estimated_s for l in self.layers)
        return sum(l.measured_s for l in self.layers) / total if total else 0.0

    @property
    def source_shares(self) -> dict[str, float]:
        """The share of the layers' predicted time from each source (SOURCES order, absent ones left out)."""
        seconds = {s: sum(l.sources.get(s, 0.0) for l in self.layers) for s in SOURCES}
        total = sum(seconds.values())
        return {s: v / total for s, v in seconds.items() if v > 0} if total else {}

    def phases(self) -> dict[str, float]:
        return {"io": self.io_exposed_s, "step_call": self.step_call_s, "forward": self.forward_s,
                "backward": self.backward_s, "update": self.update_s, "communication": self.communication_s,
                "communication_exposed": self.communication_exposed_s}

    def to_record(self) -> dict:
        """What a run record keeps (store/record.py: Prediction)."""
        return {"model_version": MODEL_VERSION, "profile": self.profile, "workers": self.workers,
                "schedule": self.schedule.kind if self.schedule else None,
                "iteration_s": self.iteration_s, "phases": self.phases(),
                "measured_share": self.measured_share, "sources": self.source_shares,
                "unmeasured_kernels": len(self.unmeasured), "notes": list(self.notes)}


def op_class(op: Op) -> str:
    """matmul, convolution, attention (work on the matrix units) or elementwise (the rest)."""
    return OP_CLASS.get(op.kernel.kind, "elementwise") if op.kernel is not None else "elementwise"


def roofline_time(op: Op, profile: MachineProfile, framework: str | None = None, tf32: bool = False) -> float:
    """One execution at the ceilings: max(FLOPs / peak, bytes / bandwidth at its size), the bandwidth
    being the framework's element-wise one where calibrate measured it, else the machine's copy.
    A profile's `efficiency` (a datasheet profile's) scales the peak by the operation's class and
    the bandwidth by `elementwise`; `tf32`: float32 products at the profile's TF32 rate, where it has one."""
    dtype = op.kernel.dtype if op.kernel is not None else "float32"
    kind = op_class(op)
    peak = profile.peak_flops("tf32" if tf32 and dtype == "float32" and kind != "elementwise" else dtype)
    bandwidth = profile.bandwidth(op.bytes, framework)
    if peak is None and kind == "elementwise" and bandwidth is not None and profile.source == "datasheet":
        peak = math.inf  # a sheet without a vector rate: memory-bound work by its bytes alone
    if peak is None or bandwidth is None:
        if profile.source == "datasheet":
            raise PredictionError(f"{profile.ref} gives no {'peak rate' if peak is None else 'memory bandwidth'} "
                                  f"for {dtype} (its datasheet file lists what was not found); try another --precision")
        raise PredictionError(f"profile {profile.ref} has no {'matmul peak' if peak is None else 'copy bandwidth'}; "
                              "run `dlbench calibrate`")
    if kind != "elementwise":  # element-wise FLOPs run at the vector rate, unscaled: they are memory-bound
        peak *= profile.efficiency.get(kind, 1.0)
    bandwidth *= profile.efficiency.get("elementwise", 1.0)
    return max(op.flops / peak, op.bytes / bandwidth)


def kernel_roofline(kernel: KernelSpec, profile: MachineProfile) -> float:
    """A measured kernel's work at the machine's ceilings (0 for what the profile lacks)."""
    peak = profile.peak_flops(kernel.dtype)
    bandwidth = profile.bandwidth(kernel.bytes)
    return max(kernel.flops / peak if peak else 0.0, kernel.bytes / bandwidth if bandwidth else 0.0)


def class_work(kernel: KernelSpec, profile: MachineProfile, framework: str, tf32: bool = False) -> float:
    """A kernel's work at the ceilings as its class is fitted (class_efficiency.py): a matrix
    product's FLOPs at the peak alone, its operands' traffic being the fit's operand term; any
    other kernel's roofline time."""
    if operand_elements(kernel):
        peak = profile.peak_flops("tf32" if tf32 and kernel.dtype == "float32" else kernel.dtype)
        if peak:
            return kernel.flops / peak
    return roofline_time(Op(kernel.key, kernel.flops, kernel.bytes, kernel), profile, framework, tf32)


def timed_call(profile: MachineProfile, framework: str, cache: str) -> float:
    """The framework's call as a kernel or probe timed with `cache` paid it: d_cold for one timed cold
    (the flush evicted the framework's code and data too; d where the profile predates d_cold), else d."""
    call = profile.dispatch_s.get(framework, 0.0)
    return profile.dispatch_cold_s.get(framework, call) if cache == "cold" else call


def class_points(profile: MachineProfile, framework: str, compiled: bool = False) -> dict[str, list[ClassPoint]]:
    """The framework's class probes per class (class_efficiency.efficiency_class): each probe's
    roofline time and its time net of the call, warm or cold as the probe was timed (eager: at most
    half the time taken off, since every operation predicted from it pays the warm call again;
    compiled: never below the roofline); `overhead_bound` where that limit was reached or the probe's
    work at the ceilings takes less than one call."""
    out: dict[str, list[ClassPoint]] = {}
    for probe in profile.class_probes.get(framework, []):
        spec = KernelSpec.from_dict(probe.spec)
        if not fitted(spec):  # timed as a shape only (class_efficiency.UNFITTED_KINDS): in the kernel times
            continue
        roofline = class_work(spec, profile, framework)
        own_call = timed_call(profile, framework, probe.cache)
        net, bound = probe.median_s - own_call, (roofline if compiled else probe.median_s / 2)
        if roofline > 0:
            # overhead-bound: the call could not be taken off in full, or the work at the ceilings is
            # shorter than one call: its time says what the class's calls cost, not how fast its work runs
            out.setdefault(efficiency_class(spec), []).append(
                ClassPoint(roofline, max(net, bound), spec.key, overhead_bound=net <= bound or roofline < own_call,
                           operands=operand_elements(spec), outputs=output_elements(spec)))
    return out


def class_fits(profile: MachineProfile, framework: str, compiled: bool = False) -> dict[str, ClassFit]:
    """Each probed class's overhead and slowdown (class_efficiency.fit_class) for `framework`."""
    return {cls: fit_class(points) for cls, points in class_points(profile, framework, compiled).items()}


def _add(sources: dict[str, float], more: dict[str, float], factor: float = 1.0) -> dict[str, float]:
    for k, v in more.items():
        sources[k] = sources.get(k, 0.0) + factor * v
    return sources


def op_time(op: Op, framework: str, profile: MachineProfile, measured: dict,
            compiled: bool = False, tf32: bool = False,
            classes: dict[str, ClassFit] | None = None) -> tuple[float, dict[str, float], list[str]]:
    """(seconds for all `op.repeat` executions, those seconds per source (SOURCES), the keys of the
    kernels not measured at their shape); `compiled`: the framework's step is one compiled call
    (FrameworkFacts.step graph); `tf32`: the run's precision is tf32 (roofline_time); `classes`:
    the framework's class fits (class_fits). The op's kernel, else the first measured
    alternative, else the class efficiency of the op's kernel or of an alternative, else the sum of
    its parts (each timed so in turn), else its roofline."""
    call = profile.dispatch_s.get(framework, 0.0)
    candidates = ([(op.kernel, 1)] if op.kernel is not None else []) + list(op.alternatives)
    for kernel, count in candidates:
        if kernel.key in measured:
            timed = measured[kernel.key]
            seconds = timed.median_s
            own_call = timed_call(profile, framework, timed.cache)
            if compiled:  # the step is one call: the kernel's own call, timed as it was, is not part of it
                seconds = max(seconds - own_call, kernel_roofline(kernel, profile))
            elif own_call > call:  # an eager step pays the warm call, not what the flush added to it
                seconds = max(seconds - (own_call - call), min(seconds, kernel_roofline(kernel, profile) + call))
            total = op.repeat * count * seconds
            return total, {"shape": total}, []
    missing = [k.key for k, _ in candidates]
    for kernel, count in candidates:
        fit = (classes or {}).get(efficiency_class(kernel))
        if fit is not None:
            seconds = fit.seconds(class_work(kernel, profile, framework, tf32), operand_elements(kernel),
                                  output_elements(kernel))
            # a compiled step runs the operation inside its one executable: neither the call nor what
            # the class's probes paid per call beyond it and their work (the fit's overhead: argument
            # checks, allocation, code and state the flush evicted) is paid per operation
            seconds += -fit.overhead_s if compiled else call
            total = op.repeat * count * seconds
            return total, {"class": total}, missing
    if op.parts:  # the kernel counts as unmeasured only where none of its parts' kernels was measured
        seconds = 0.0
        sources: dict[str, float] = {}
        parts_missing: list[str] = []
        for part in op.parts:
            s, by_source, keys = op_time(part, framework, profile, measured, compiled, tf32, classes)
            seconds += s
            _add(sources, by_source)
            parts_missing += keys
        return (op.repeat * seconds, _add({}, sources, op.repeat),
                parts_missing if sources.get("shape") else missing + parts_missing)
    total = op.repeat * (roofline_time(op, profile, framework, tf32) + (0.0 if compiled else call))
    if profile.source == "datasheet":
        source = "datasheet"
    elif op.kernel is None and profile.elementwise_bandwidth.get(framework):
        source = "class"  # element-wise work at the framework's own measured element-wise bandwidth
    else:
        source = "ceilings"
    return total, {source: total}, missing


def predict(workload: Workload, framework: str, profile: MachineProfile, workers: int = 1,
            schedule_kind: str | None = None, data_path: DataPath | None = None,
            threads: int | None = None, facts: FrameworkFacts | None = None) -> Prediction:
    """`facts`: how the framework's runner steps and sends gradients (the caller reads them from the
    runner's runner.toml); None: FrameworkFacts()'s defaults."""
    facts = facts or FrameworkFacts()
    measured = profile.kernels.get(framework, {})
    classes = class_fits(profile, framework, facts.compiled)
    notes: list[str] = []
    if profile.source == "datasheet":
        notes.append(datasheet_note(profile))
    elif not measured and not classes:
        notes.append(f"no kernel times or class probes of {framework} in the profile: every operation is a "
                     "roofline estimate at the measured ceilings")
    elif not classes:
        notes.append(f"no class probes of {framework} in the profile: kernels not timed at their shape are "
                     "roofline estimates at the measured ceilings (`dlbench calibrate` probes the classes)")
    if threads is not None and profile.threads is not None and threads != profile.threads:
        notes.append(f"the profile was measured with {profile.threads} threads, this run uses {threads}")
    if framework not in profile.dispatch_s and profile.dispatch_s:
        notes.append(f"no smallest-operation time of {framework} in the profile: none added")
    unmeasured: dict[str, None] = {}
    layers: list[LayerTimes] = []
    fused = fused_epilogues(workload) if facts.epilogues == "fused" else set()
    if fused:
        notes.append(f"{len(fused)} element-wise operations of the forward run fused into the matrix product or "
                     f"convolution before them (the {framework} runner's step fuses epilogues): no time of their own")
    for work in workload.layers:
        lt = LayerTimes(work.index, work.label, work.params)
        for phase, ops in (("forward_s", work.forward), ("backward_s", work.backward), ("update_s", work.update)):
            for op in ops:
                if id(op) in fused:
                    continue
                seconds, by_source, missing = op_time(op, framework, profile, measured, facts.compiled,
                                                      workload.precision == "tf32", classes)
                setattr(lt, phase, getattr(lt, phase) + seconds)
                from_measured = by_source.get("shape", 0.0)
                lt.measured_s += from_measured
                lt.estimated_s += seconds - from_measured
                _add(lt.sources, by_source)
                unmeasured.update((key, None) for key in missing)
        layers.append(lt)
    forward = sum(l.forward_s for l in layers)
    backward = sum(l.backward_s for l in layers)
    update = sum(l.update_s for l in layers)
    path = data_path or DataPath(workload.input_bytes_per_sample)
    t_io, t_h2d = path.times(workload.batch)
    if path.read_bytes_per_s is None:
        notes.append("synthetic data already on the device: no I/O time")
    step_call = profile.dispatch_s.get(framework, 0.0) if facts.compiled else 0.0
    prediction = Prediction(
        workload.network, framework, workload.batch, workload.mode, workers, profile.ref, layers,
        io_s=t_io + t_h2d, io_exposed_s=path.exposed(workload.batch, step_call + forward + backward + update),
        forward_s=forward, backward_s=backward, update_s=update, step_call_s=step_call,
        unmeasured=list(unmeasured), notes=notes)
    if workers > 1:
        if workload.mode != "train":
            raise PredictionError("only training exchanges gradients: --workers needs --mode train")
        cost = collective_cost(profile, framework, workers, notes)
        kind = schedule_kind or facts.schedule
        t_b, p = gradient_layers(layers)
        sched = schedule(kind, t_b, p, cost)
        prediction.schedule = sched
        prediction.communication_s = sched.communication
        prediction.communication_exposed_s = sched.exposed
    return prediction


def fused_epilogues(workload: Workload) -> set[int]:
    """The forward operations (by id) a step that fuses epilogues computes inside a kernel: each run of
    epilogue operations (workload.Op.epilogue) right after a matrix product or convolution, across
    layers (a dense layer's bias and the activation layer after it); any other operation ends the run."""
    fused: set[int] = set()
    open_run = False
    for work in workload.layers:
        for op in work.forward:
            if open_run and op.epilogue:
                fused.add(id(op))
            else:
                open_run = op.kernel is not None and op.kernel.kind in CONTRACTIONS
    return fused


def gradient_layers(layers: list[LayerTimes]) -> tuple[list[float], list[float]]:
    """(t_b, p) over the layers that have parameters, in network order; a parameter-free layer's
    backward time goes to the next layer in backward order that has parameters."""
    t_b: list[float] = []
    p: list[float] = []
    pending = 0.0
    for layer in reversed(layers):
        pending += layer.backward_s
        if layer.params:
            t_b.append(pending)
            p.append(float(layer.gradient_bytes))
            pending = 0.0
    if t_b:
        t_b[-1] += pending  # below the first layer with parameters: nothing delays, but it is backward
    return t_b[::-1], p[::-1]


def datasheet_note(profile: MachineProfile) -> str:
    """What every prediction from a datasheet profile says about itself."""
    factors = ", ".join(f"{k} {v:g}" for k, v in profile.efficiency.items())
    return (f"datasheet prediction ({profile.ref}): the vendor's published peaks and bandwidths corrected by "
            f"stated efficiencies ({factors}) and an assumed launch overhead: an estimate from an upper bound, "
            "not a measurement")


def collective_cost(profile: MachineProfile, framework: str, workers: int, notes: list[str],
                    collective: str = "all_reduce") -> AllReduceCost | AllToAllCost:
    """The α–β line of one collective (communication.COSTS) among `workers`: the framework's own fit
    for that count, else another fit's (α, β) extrapolated by the collective's model."""
    words = collective.replace("_", "-")
    model = COSTS[collective]
    fit = profile.comm_fit(framework, workers, collective)
    fits = [c for c in profile.comm if c.collective == collective]
    if profile.source == "datasheet" and fits and (fit is None or fit.workers != workers):
        most = max((c.workers for c in fits), default=1)
        raise PredictionError(f"{profile.ref} describes one node of up to {most} GPUs; {workers} workers would need "
                              "the network between nodes, which no datasheet file gives")
    if fit is None:
        if not fits:
            raise PredictionError(f"profile {profile.ref} has no {words} fit: run the comm suite with "
                                  f"--workers {workers}, then `dlbench calibrate --workers {workers}`")
        fit = min(fits, key=lambda c: abs(c.workers - workers))
        notes.append(f"no {words} fit of {framework}: {fit.framework}'s ({fit.workers} workers) used")
    if fit.workers == workers:
        return model(workers, fit.startup_s, fit.per_byte_s)
    how = "the ring model" if collective == "all_reduce" else "pairwise exchange"
    notes.append(f"{words} for {workers} workers extrapolated by {how} from the "
                 f"{fit.workers}-worker fit (α {fit.alpha_s * 1e6:.1f} µs, β {fit.beta_s_per_byte * 1e9:.3f} ns/B)")
    if collective == "all_reduce":
        return AllReduceCost.ring(fit.alpha_s, fit.beta_s_per_byte, workers)
    return AllToAllCost.pairwise(fit.alpha_s, fit.beta_s_per_byte, workers)
