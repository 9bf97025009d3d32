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

"net of the call" exactly as model.op_time counts a kernel: the probe's own call, warm or cold as
it was timed (d or d_cold), is taken off; an eager step pays the warm d on every operation (so at
most half the probe's time is taken off, and d is added back to every operation predicted from
it), a compiled step pays it once per iteration (never below the roofline), and no class overhead
per operation either (below: what a probe paid per call beyond its work, which an operation inside
one executable does not).

Classes (`efficiency_class`), each per dtype: matmul (one class, its probes spread over its
aspects: below), the batched products of attention,
convolution forward and backward by filter family (`1x1`, `3x3` and smaller, `large`; a backward
without the input gradient, a network's first layer, apart, and so a forward over an
image's few channels, `image-input`), LSTM layers and steps forward and
backward, attention's fused core forward and backward with and without dropout on its
probabilities (torch takes another path with it), layer norm and batch norm (in training) forward
and backward (normalisation),
GELU forward and backward (element-wise), pooling forward and backward by operation (`max`, `avg`,
`global`: a window's maximum, its mean, and the mean over the whole map, which frameworks run as
a reduction, cost differently: torch's max-pool forward on the CPU runs at a fraction of the
bandwidth its average reaches), the loss forward and backward, and the SGD-momentum update
(optimiser). Work that is no kernel (activations, an inference batch norm, joins) is costed at the framework's
own measured element-wise (relu) bandwidth already (calibrate's ceilings).

Within a class the efficiency moves with size: a small kernel is mostly start-up (argument checks,
allocation, threads waking), which a large one amortises. So a class is fitted as

    net time = overhead + slowdown x roofline time

A matrix product's efficiency also moves with its shape, by its smallest dimension far above the
sizes that make it small: a GEMM packs its operands into blocks and writes its output, work that
costs per element of A, B and C, and elements per FLOP are (1/m + 1/n + 1/k) / 2. Measured here
(torch, one thread), a 1024 x 10000 x 256 product ran at 60% of the
roofline and 1024 x 256 x 10000 at 91%, FCN-5's m = 64 products at 51-69%, while the probes of
their old bucket (`small-m`, the smallest of m, n, k under SMALL_DIM) m = 16 and m = 38 ran at 16%
and 50%. Buckets by aspect, each fitted apart from its three probes at the ends of its range,
could not follow that, so a matmul class is one fit over every probe of its dtype, with the work
at the peak rate and an operand term:

    net time = overhead + slowdown x FLOPs / peak + per-operand time x (mk + kn + mn)

(`operand_elements`; its probes are still chosen per aspect, `probe_stratum`, so that all four
are seen). Fitted from one plain calibration's probes and checked against the fcn and rnn suites'
22 float32 matmul shapes timed alone by the kernels suite, the time-weighted error went from 34%
to 24% (torch), 23% to 20% (tensorflow), 23% to 19% (mxnet), and from 21% to 23% (jax); left out
in turn, each probe was predicted by the others within a median 12-26% (eager) against 37-71% for
the buckets.

How much a GEMM's output costs beside its inputs differs by framework (measured here: a fresh output
buffer of tens of MB faults in every page on each call in torch, where glibc's allocator hands such
buffers back to the system; tensorflow and jax keep them): so a matmul class has a third form,
the operand term plus a time per output element (mn) again,

    net time = overhead + slowdown x FLOPs / peak + per-operand time x (mk + kn + mn) + per-output time x mn

and each framework's class takes the form that predicts its probes best when each is left out in
turn and predicted by the others (`leave_one_out_error`, the median relative error; a richer form
must win by LOO_MARGIN; with too few probes to leave one out, the operand form).

A dense layer's backward (`dense_bwd`, the framework's own layer: the gradients as its autodiff lays
them out for the step) is probed as a class, its smallest, middle, largest and busiest shapes timed,
but not fitted (UNFITTED_KINDS): its probes are measured shapes, and any other of its shapes is its
parts, the GEMMs, from the matmul class's fit over its aspects. Fitted, its four probes across the
fcn suite's 64-row products and the transformers' 788-row ones predicted worse (one plain
calibration, the same 96 runs: the fcn suite 9.1% with the GEMMs, 18.0% from the class; torch's fcn
cell 1.2% and 18.1%), while the shapes it does time (LSTM-32's classifier, at twice its GEMMs' time
in jax's step) are the ones the GEMMs miss.

The forms are fitted by `fit_class`: relative least squares over the class's probes
(`scipy.optimize.lsq_linear`), the overhead and the per-operand time non-negative and the slowdown
at least 1, i.e. the marginal work never faster than the ceilings, unless a probe itself was. One
probe cannot tell overhead from slowdown: a probe whose time is mostly the framework's call or
other overhead (`overhead_bound`: model.class_points could not take the call off in full, or the
work at the ceilings takes less than one call) says only how much a call of that
class costs beyond the smallest operation, so it is read as overhead with the work at the ceilings
(slowdown 1), and so is one under MIN_STEADY_EFFICIENCY; any other single probe as a constant
efficiency (overhead 0). A class with MIN_STEADY_PROBES probes that are not overhead-bound is fitted
from those alone: an overhead-bound probe's net time is what was left after taking the call off
(clipped at the roofline in a compiled step), and with relative residuals a few such tiny probes
held every additive term at 0 (mxnet's matmul, from one plain calibration: the fcn suite
under-predicted by 28%, 8% with them left out). A probe's own shape is no concern of the fit: it is in the profile's
kernel times, a measured shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .kernels import KernelSpec

# one probe under this efficiency is read as overhead, not as a slow steady state: a kernel's work
# rarely runs at under a tenth of the measured ceilings once it is large, while fixed costs (the
# call's checks and allocation, threads waking, a cold first touch) easily are 10x a small kernel's work
MIN_STEADY_EFFICIENCY = 0.1
# a richer fit form is chosen only where its median leave-one-out error beats the simpler one's by
# more than this (a tie or a hair's breadth is noise in the probes, not a term)
LOO_MARGIN = 0.01
# a class with this many probes that are not overhead-bound is fitted from those alone
MIN_STEADY_PROBES = 3
SMALL_DIM = 128  # a GEMM dimension under this is "small": the others' blocking cannot hide it
# kinds probed for their shapes but not fitted into a class (the module docstring): an unmeasured
# shape is its parts
UNFITTED_KINDS = ("dense_bwd",)
# a convolution over this few input channels reads an image (RGB, grey): its reduction over
# kh x kw x channels is too short for the vector units, so it runs at a fraction of the efficiency
# of the same filter over feature maps, and fitted with them it reads as a large fixed overhead of
# every convolution of the family (jax's 3x3 forward: 1.8 ms per call from resnet56's first layer)
IMAGE_CHANNELS = 4


def efficiency_class(spec: KernelSpec) -> str:
    """The class a kernel's efficiency is measured and looked up under (see the module docstring)."""
    k = spec.kind
    if k == "matmul":
        return f"matmul {spec.dtype}"
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


def matmul_aspect(spec: KernelSpec) -> str:
    """A matmul's aspect: `small-m`, `small-n` or `small-k` when the smallest of its dimensions
    (the first of equals) is under SMALL_DIM, else `large`."""
    dims = {"m": spec["m"], "n": spec["n"], "k": spec["k"]}
    smallest = min(dims, key=lambda d: (dims[d], "mnk".index(d)))
    return f"small-{smallest}" if dims[smallest] < SMALL_DIM else "large"


def probe_stratum(spec: KernelSpec) -> str:
    """What a class's probes are spread over: a matmul class's aspects (one fit sees them all), else
    the class itself."""
    cls = efficiency_class(spec)
    return f"{cls} {matmul_aspect(spec)}" if spec.kind == "matmul" else cls


def operand_elements(spec: KernelSpec) -> int:
    """The elements of a matrix product's operands and output (mk + kn + mn), which its class's fit
    charges a time each (the module docstring); 0 for the kinds fitted without that term."""
    if spec.kind == "matmul":
        return spec["m"] * spec["k"] + spec["k"] * spec["n"] + spec["m"] * spec["n"]
    return 0


def output_elements(spec: KernelSpec) -> int:
    """The elements of a matrix product's output (mn), which a class fitted in the `outputs` form
    charges again apart from its operands; 0 for any other kind."""
    return spec["m"] * spec["n"] if spec.kind == "matmul" else 0


def fitted(spec: KernelSpec) -> bool:
    """Whether a probe of this kind is fitted into its class (UNFITTED_KINDS: timed as a shape only)."""
    return spec.kind not in UNFITTED_KINDS


def work_size(spec: KernelSpec) -> float:
    """A shape's work: bytes for the memory-bound kinds, else FLOPs (what probes are spread over)."""
    return float(spec.bytes if spec.memory_bound else spec.flops)


@dataclass(frozen=True)
class ClassPoint:
    """One probe of a class: its roofline time (a matmul's: its FLOPs at the peak), its time net of
    the call, whether that net time is mostly call (the call could not be taken off it in full), its
    operand elements and, of those, its output's (operand_elements, output_elements: 0 but for a
    matmul)."""

    roofline_s: float
    net_s: float
    key: str  # the probe kernel's key
    overhead_bound: bool = False
    operands: int = 0
    outputs: int = 0

    @property
    def efficiency(self) -> float:
        return self.roofline_s / self.net_s


@dataclass(frozen=True)
class ClassFit:
    """net time = overhead_s + slowdown x roofline time (+ per_operand_s x operand elements + per_output_s
    x output elements: a matmul class's, in the form its probes chose; see the module docstring)."""

    overhead_s: float
    slowdown: float
    probes: int
    per_operand_s: float = 0.0
    per_output_s: float = 0.0
    form: str = "affine"

    def seconds(self, roofline_s: float, operands: int = 0, outputs: int = 0) -> float:
        return self.overhead_s + self.slowdown * roofline_s + self.per_operand_s * operands + self.per_output_s * outputs

    @property
    def efficiency(self) -> float:
        """Of the marginal work: what a large kernel of the class tends to."""
        return 1.0 / self.slowdown


# the fitted forms, simplest first: the columns each adds to overhead + slowdown x roofline time
FORMS = {"affine": (), "operands": ("operands",), "outputs": ("operands", "outputs")}


def _identifiable(points: list[ClassPoint], form: str) -> bool:
    """Whether the probes tell the form's terms apart: a distinct probe per coefficient, and the
    terms present at all."""
    terms = FORMS[form]
    if any(not any(getattr(p, t) for p in points) for t in terms):
        return False
    return len({(p.roofline_s, *(getattr(p, t) for t in terms)) for p in points}) >= 2 + len(terms)


def _solve(points: list[ClassPoint], form: str) -> ClassFit:
    """Relative least squares of `form` over the probes (see the module docstring)."""
    from scipy.optimize import lsq_linear

    terms = FORMS[form]
    floor = min(1.0, min(p.net_s / p.roofline_s for p in points))
    net = np.array([p.net_s for p in points])
    columns = [np.ones_like(net), np.array([p.roofline_s for p in points])]
    columns += [np.array([float(getattr(p, t)) for p in points]) for t in terms]
    a = np.column_stack(columns) / net[:, None]  # relative residuals: every probe counts
    scale = 1.0 / np.abs(a).max(axis=0)  # columns of similar size for the solver
    lower = np.array([0.0, floor] + [0.0] * len(terms)) / scale
    solution = lsq_linear(a * scale, np.ones_like(net), bounds=(lower, np.full(len(columns), np.inf)))
    overhead, slowdown, *per_term = (float(v) for v in solution.x * scale)
    per = dict(zip(terms, per_term))
    return ClassFit(overhead, max(slowdown, floor), len(points), per.get("operands", 0.0), per.get("outputs", 0.0),
                    form)


def leave_one_out_error(points: list[ClassPoint], form: str) -> float:
    """The median relative error of each probe predicted by `form` fitted to the others; inf where
    a form cannot be told apart without some probe."""
    errors = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1:]
        if not _identifiable(rest, form):
            return float("inf")
        fit = _solve(rest, form)
        errors.append(abs(fit.seconds(p.roofline_s, p.operands, p.outputs) / p.net_s - 1.0))
    return float(np.median(errors))


def fit_class(points: list[ClassPoint]) -> ClassFit:
    """The class's fit from its probes (see the module docstring): the form that predicts each of
    them best from the others, where there are enough to leave one out."""
    if not points:
        raise ValueError("no probe points")
    return _fit(tuple(points))


@functools.lru_cache(maxsize=4096)  # a profile's fits are asked for once per prediction; leaving out costs ~50 ms
def _fit(points: tuple[ClassPoint, ...]) -> ClassFit:
    steady = [p for p in points if not p.overhead_bound]
    # overhead-bound probes are read only where too few others are left to fit: their net time is
    # an artefact of taking the call off (clipped at the roofline in a compiled step), and relative
    # residuals made a few of them pin every additive term at 0 (mxnet's matmul: fcn under-predicted by 28%)
    points = steady if len(steady) >= MIN_STEADY_PROBES else list(points)
    if len(points) == 1 or len({p.roofline_s for p in points}) == 1:
        p = min(points, key=lambda q: q.roofline_s)
        if p.overhead_bound or p.efficiency < MIN_STEADY_EFFICIENCY:
            return ClassFit(max(0.0, p.net_s - p.roofline_s), 1.0, len(points))
        return ClassFit(0.0, p.net_s / p.roofline_s, len(points))
    forms = [f for f in FORMS if _identifiable(points, f)]
    if len(forms) == 1:
        return _solve(points, forms[0])
    scores = {f: leave_one_out_error(points, f) for f in forms}
    # too few probes to leave one out of two forms: the operand term, where it can be had
    if sum(v < float("inf") for v in scores.values()) < 2:
        return _solve(points, "operands" if "operands" in forms else forms[0])
    best = min(scores.values())
    # a richer form must predict the left-out probes better by more than LOO_MARGIN to be chosen
    return _solve(points, next(f for f in forms if scores[f] <= best + LOO_MARGIN))


def probe_roles(candidates: Iterable[KernelSpec], per_class: int,
                estimate_s: Callable[[KernelSpec], float] | None = None,
                max_probe_s: float | None = None,
                uses: Mapping[str, int] | None = None) -> list[tuple[KernelSpec, str]]:
    """Up to `per_class` shapes of each class's stratum (probe_stratum: a matmul class's aspects)
    among `candidates` (the suites' own layer shapes), spread over its range of work, each with its
    role in rank of work: `middle` (of two, the larger), `largest`, `smallest`, `between` the others. With more
    than one, a matmul stratum also times its shape with the most output elements (`widest`,
    output_elements) and, in a small aspect, its shape with the largest small dimension (`thickest`:
    the most work among those), where the spread did not pick them. `estimate_s` with `max_probe_s`:
    shapes estimated to take longer than that per call are left out first (a bounded calibration).
    Order: by stratum, then size."""
    by_class: dict[str, dict[str, KernelSpec]] = {}
    for spec in candidates:
        if estimate_s is not None and max_probe_s is not None and estimate_s(spec) > max_probe_s:
            continue
        by_class.setdefault(probe_stratum(spec), {}).setdefault(spec.key, spec)
    chosen: list[tuple[KernelSpec, str]] = []
    for cls in sorted(by_class):
        specs = sorted(by_class[cls].values(), key=lambda s: (work_size(s), s.key))
        if per_class <= 0:
            continue
        if per_class == 1 or len(specs) == 1:
            roles = {len(specs) // 2: "middle"}
        else:
            n = min(per_class, len(specs))
            spread = sorted({round(i * (len(specs) - 1) / (n - 1)) for i in range(n)})
            middle = spread[len(spread) // 2]
            roles = {i: ("middle" if i == middle else "largest" if i == spread[-1]
                         else "smallest" if i == spread[0] else "between") for i in spread}
            for i, role in _matmul_extremes(specs):
                roles.setdefault(i, role)
            if uses:
                busiest = max(range(len(specs)), key=lambda i: (uses.get(specs[i].key, 0), work_size(specs[i]), i))
                roles.setdefault(busiest, "busiest")
        chosen += [(specs[i], roles[i]) for i in sorted(roles)]
    return chosen


def _matmul_extremes(specs: list[KernelSpec]) -> list[tuple[int, str]]:
    """A matmul stratum's shapes (sorted by work) that its spread by work can miss:
    - `widest`, the most output elements: a matmul's output cost is not its work's (an LSTM's
      1024 x 10000 x 256 classifier wrote 4x the elements of its backward's product of the same
      FLOPs, and took 2x as long in jax);
    - in a small aspect, `thickest`, the largest small dimension: how far a GEMM's blocking is
      filled moves with it (one plain calibration on an AMX Xeon probed small-m at m = 2, 16 and 38,
      which ran at up to 37% of the roofline in jax, and FCN-5's m = 64 products, unprobed, were
      predicted from them 45-58% slow)."""
    if not specs or specs[0].kind != "matmul":
        return []
    out = [(max(range(len(specs)), key=lambda i: (output_elements(specs[i]), work_size(specs[i]))), "widest")]
    if matmul_aspect(specs[0]) != "large":
        out.append((max(range(len(specs)), key=lambda i: (smallest_dimension(specs[i]), work_size(specs[i]))),
                    "thickest"))
    return out


def smallest_dimension(spec: KernelSpec) -> int:
    """A matrix product's smallest of m, n and k."""
    return min(spec["m"], spec["n"], spec["k"])


def select_probes(candidates: Iterable[KernelSpec], per_class: int,
                  estimate_s: Callable[[KernelSpec], float] | None = None,
                  max_probe_s: float | None = None, uses: Mapping[str, int] | None = None) -> list[KernelSpec]:
    """The shapes of probe_roles, without their roles."""
    return [spec for spec, _ in probe_roles(candidates, per_class, estimate_s, max_probe_s, uses)]
