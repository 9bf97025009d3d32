"""Operation classes and their measured efficiency: how a calibrated profile predicts a kernel shape
nobody timed.

A roofline at the machine's measured ceilings (peak matmul FLOP/s, copy or element-wise bandwidth)
is an upper bound that real kernels miss by a factor which depends mostly on what kind of kernel
it is and how big: a 3x3 convolution on few channels reaches a small fraction of the peak a large
square matmul reaches, a GEMM with a 10-wide output less than one with 2048. `dlbench calibrate`
therefore times, per framework, a handful of real layer shapes of every operation class (the
`probes`, chosen by `select_probes` from the suites' own layer shapes) and the model divides the
roofline time of any other shape of that class by the efficiency measured at the probes (in
the form fitted below):

    efficiency = roofline time at the ceilings / the probe's time net of the framework's call

"net of the call" exactly as model.op_time counts a kernel: an eager step pays the framework's
smallest-operation time d on every operation (so the probe's d is taken off, at most half its
time, and added back to every operation predicted from it), a compiled step pays it once per
iteration (so the probe's own call, warm or cold as it was timed, is taken off, never below the
roofline).

Classes (`efficiency_class`), each per dtype: matmul by aspect (the smallest of m, n, k under
SMALL_DIM: `small-m`, `small-n`, `small-k`, else `large`), the batched products of attention,
convolution forward and backward by filter family (`1x1`, `3x3` and smaller, `large`; a backward
without the input gradient, a network's first layer, apart, and so a forward over an
image's few channels, `image-input`), LSTM layers and steps forward and
backward, attention's fused core forward and backward with and without dropout on its
probabilities (torch takes another path with it), layer norm forward and backward (normalisation),
GELU forward and backward (element-wise), pooling forward and backward by operation (`max`, `avg`,
`global`: a window's maximum, its mean, and the mean over the whole map, which frameworks run as
a reduction, cost differently: torch's max-pool forward on the CPU runs at a fraction of the
bandwidth its average reaches), the loss forward and backward, and the SGD-momentum update
(optimiser). Work that is no kernel (activations, batch norm, joins) is costed at the framework's
own measured element-wise (relu) bandwidth already (calibrate's ceilings).

Within a class the efficiency moves with size: a small kernel is mostly start-up (argument checks,
allocation, threads waking), which a large one amortises. So a class is fitted as

    net time = overhead + slowdown x roofline time

(`fit_class`: relative least squares over its probes, `scipy.optimize.lsq_linear`, the overhead
non-negative and the slowdown at least 1, i.e. the marginal work never faster than the ceilings,
unless a probe itself was). One probe cannot tell the two apart: a probe whose time is mostly the
framework's call or other overhead (`overhead_bound`: model.class_points could not take the call off
in full, or the work at the ceilings takes less than one call) says only how much a call of that
class costs beyond the smallest operation, so it is read as overhead with the work at the ceilings
(slowdown 1), and so is one under MIN_STEADY_EFFICIENCY; any other single probe as a constant
efficiency (overhead 0). A probe's own shape is no concern of the fit: it is in the profile's
kernel times, a measured shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .kernels import KernelSpec

# one probe under this efficiency is read as overhead, not as a slow steady state: a kernel's work
# rarely runs at under a tenth of the measured ceilings once it is large, while fixed costs (the
# call's checks and allocation, threads waking, a cold first touch) easily are 10x a small kernel's work
MIN_STEADY_EFFICIENCY = 0.1
SMALL_DIM = 128  # a GEMM dimension under this is "small": the others' blocking cannot hide it
# a convolution over this few input channels reads an image (RGB, grey): its reduction over
# kh x kw x channels is too short for the vector units, so it runs at a fraction of the efficiency
# of the same filter over feature maps, and fitted with them it reads as a large fixed overhead of
# every convolution of the family (jax's 3x3 forward: 1.8 ms per call from resnet56's first layer)
IMAGE_CHANNELS = 4


def efficiency_class(spec: KernelSpec) -> str:
    """The class a kernel's efficiency is measured and looked up under (see the module docstring)."""
    k = spec.kind
    if k == "matmul":
        dims = {"m": spec["m"], "n": spec["n"], "k": spec["k"]}
        smallest = min(dims, key=lambda d: (dims[d], "mnk".index(d)))
        aspect = f"small-{smallest}" if dims[smallest] < SMALL_DIM else "large"
        return f"matmul {aspect} {spec.dtype}"
    if k.startswith("conv2d"):
        size = max(spec["kh"], spec["kw"])
        family = "1x1" if size == 1 else "3x3" if size <= 3 else "large"
        if k == "conv2d_bwd" and not spec["input_grad"]:
            family += " no-dx"
        elif spec["channels"] <= IMAGE_CHANNELS:
            family += " image-input"
        return f"{k} {family} {spec.dtype}"
    if k.startswith("attention"):
        return f"{k}{' dropout' if spec['dropout'] else ''} {spec.dtype}"
    if k.startswith("pool2d"):
        return f"{k} {spec.pool_op} {spec.dtype}"
    return f"{k} {spec.dtype}"


def work_size(spec: KernelSpec) -> float:
    """A shape's work: bytes for the memory-bound kinds, else FLOPs (what probes are spread over)."""
    return float(spec.bytes if spec.memory_bound else spec.flops)


@dataclass(frozen=True)
class ClassPoint:
    """One probe of a class: its roofline time, its time net of the call, and whether that net time
    is mostly call (the call could not be taken off it in full)."""

    roofline_s: float
    net_s: float
    key: str  # the probe kernel's key
    overhead_bound: bool = False

    @property
    def efficiency(self) -> float:
        return self.roofline_s / self.net_s


@dataclass(frozen=True)
class ClassFit:
    """net time = overhead_s + slowdown x roofline time (see the module docstring)."""

    overhead_s: float
    slowdown: float
    probes: int

    def seconds(self, roofline_s: float) -> float:
        return self.overhead_s + self.slowdown * roofline_s

    @property
    def efficiency(self) -> float:
        """Of the marginal work: what a large kernel of the class tends to."""
        return 1.0 / self.slowdown


def fit_class(points: list[ClassPoint]) -> ClassFit:
    """The class's overhead and slowdown from its probes (see the module docstring)."""
    if not points:
        raise ValueError("no probe points")
    if len(points) == 1 or len({p.roofline_s for p in points}) == 1:
        p = min(points, key=lambda q: q.roofline_s)
        if p.overhead_bound or p.efficiency < MIN_STEADY_EFFICIENCY:
            return ClassFit(max(0.0, p.net_s - p.roofline_s), 1.0, len(points))
        return ClassFit(0.0, p.net_s / p.roofline_s, len(points))
    from scipy.optimize import lsq_linear

    floor = min(1.0, min(p.net_s / p.roofline_s for p in points))
    net = np.array([p.net_s for p in points])
    roof = np.array([p.roofline_s for p in points])
    a = np.column_stack([np.ones_like(net), roof]) / net[:, None]  # relative residuals: every probe counts
    scale = np.array([net.min(), net.min() / roof.min()])  # columns of similar size for the solver
    solution = lsq_linear(a * scale, np.ones_like(net), bounds=([0.0, floor / scale[1]], [np.inf, np.inf]))
    overhead, slowdown = solution.x * scale
    return ClassFit(float(overhead), float(max(slowdown, floor)), len(points))


def select_probes(candidates: Iterable[KernelSpec], per_class: int,
                  estimate_s: Callable[[KernelSpec], float] | None = None,
                  max_probe_s: float | None = None) -> list[KernelSpec]:
    """Up to `per_class` shapes of each class among `candidates` (the suites' own layer shapes),
    spread over the class's range of work: the smallest and largest and evenly between them in
    rank (1: the median one). `estimate_s` with `max_probe_s`: shapes estimated to take longer
    than that per call are left out first (a bounded calibration). Order: by class, then size."""
    by_class: dict[str, dict[str, KernelSpec]] = {}
    for spec in candidates:
        if estimate_s is not None and max_probe_s is not None and estimate_s(spec) > max_probe_s:
            continue
        by_class.setdefault(efficiency_class(spec), {}).setdefault(spec.key, spec)
    chosen: list[KernelSpec] = []
    for cls in sorted(by_class):
        specs = sorted(by_class[cls].values(), key=lambda s: (work_size(s), s.key))
        if per_class <= 0:
            continue
        if per_class == 1 or len(specs) == 1:
            picks = [len(specs) // 2]
        else:
            n = min(per_class, len(specs))
            picks = sorted({round(i * (len(specs) - 1) / (n - 1)) for i in range(n)})
        chosen += [specs[i] for i in picks]
    return chosen
