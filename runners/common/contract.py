"""The runner contract in code: what a runner object is (`Runner`, `DistributedRunner`), and the
objects it hands the harnesses (`Prepared`, `Kernel`, `DataParallel`, `Collective`). Standard library
only: every runner imports this inside its framework's environment.

The protocols are structural (typing.Protocol): a runner class satisfies them by having the members,
without inheriting. `Prepared`, `Kernel` and `DataParallel` are concrete base classes that every
runner uses as they are or subclasses: a runner builds the callables (its step, its device
synchronisation, its weight export and import) and the base class holds them under the names the
harnesses read. `step` and `synchronize` are stored as plain attributes (a subclass passes its
own bound methods), so the timed loop calls the runner's function directly, through no extra layer.
`LayerTable` is the table of layer builders each runner builds its network from
(runners/<fw>/layers.py).

The measurement and the protocol around these objects are runners/common/harness.py (one process),
runners/common/distributed_harness.py (a multi-worker job) and runners/common/protocol.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Protocol, runtime_checkable

from runners.common.protocol import Skip

Arrays = dict  # canonical weight name (src/dlbench/definitions/weights.py) -> numpy.ndarray, float32

# ------------------------------------------------------------------ the axes


class Axis(str, Enum):
    """A benchmark's axis (precision, compile, mode, scenario): a closed set of values, each its own
    string, since requests and records carry them as JSON text and compare them to strings.
    Defined here once, standard library only, for the runners and the controller alike (which
    re-exports them: src/dlbench/axes.py); declared order is display order."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        # messages quote a value as the request and the command line spell it ('fp32')
        return repr(self.value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def runs(cls) -> tuple:
        """The values a timed run may ask for, in display order (a subclass leaves some out)."""
        return tuple(cls)

    @classmethod
    def not_a_run(cls, values: list[str]) -> str:
        """Why these values (of this axis, none of runs()) are not a run's: runner.toml's message."""
        return f"{', '.join(values)} is not a run's {cls.axis_name()}"

    @classmethod
    def parse(cls, value, who: str, accepted=None):
        """`value` as a member of the axis, or one ValueError naming `who` (a runner, a command's
        option), the value and the values accepted (`accepted`: a subset, default the whole axis)."""
        allowed = tuple(cls) if accepted is None else tuple(cls(a) for a in accepted)
        try:
            member = cls(value)
        except ValueError:
            member = None
        if member not in allowed:
            raise ValueError(f"{who}: {cls.axis_name()} {value!r} is not one it accepts "
                             f"({', '.join(m.value for m in allowed)})")
        return member

    @classmethod
    def axis_name(cls) -> str:
        return cls.__name__.lower()


class Precision(Axis):
    """The request's `precision`, what it means in every runner:
      fp32      IEEE float32 everywhere: TF32 and reduced-precision reductions pinned off;
      tf32      float32 storage, TF32 tensor-core math allowed (skipped where the device has none);
      amp_bf16  float32 weights, bfloat16 compute, the framework's own mixed-precision mechanism;
      amp_fp16  float16 compute with dynamic loss scaling;
      float64   `dlbench check` only: everything in float64, where rounding decides no branch."""

    FP32 = "fp32"
    TF32 = "tf32"
    AMP_BF16 = "amp_bf16"
    AMP_FP16 = "amp_fp16"
    FLOAT64 = "float64"

    @property
    def check_only(self) -> bool:
        """float64 is the equivalence check's reference precision, never a timed run's."""
        return self is Precision.FLOAT64

    @property
    def mixed(self) -> bool:
        """Float32 weights with a reduced-precision compute type (the framework's AMP)."""
        return self in (Precision.AMP_BF16, Precision.AMP_FP16)

    @property
    def compute_dtype(self) -> str:
        """The dtype the products are computed in (tf32: float32 operands, TF32 math inside)."""
        return _COMPUTE_DTYPE[self]

    @property
    def unit_roundoff(self) -> float:
        """2^-p of the compute type's p-bit significand: the scale of one rounding (tf32's 10
        explicit bits are TF32's; the equivalence tolerance multiplies it by a layer's depth)."""
        return _UNIT_ROUNDOFF[self]

    @classmethod
    def runs(cls) -> tuple["Precision", ...]:
        """The precisions a timed run may ask for, in display order."""
        return tuple(p for p in cls if not p.check_only)

    @classmethod
    def not_a_run(cls, values: list[str]) -> str:
        # float64 is the equivalence check's, which every runner takes for `dlbench check` and none lists
        return f"{', '.join(values)} is the equivalence check's precision, not a run's"

    @classmethod
    def of_kernel(cls, dtype: str) -> "Precision":
        """The precision whose math settings a kernel of the kernels suite runs under, by its dtype:
        a float32 kernel is IEEE float32 (TF32 off), as an fp32 run's layers are; reduced ones as
        the AMP runs set them."""
        try:
            return _KERNEL_PRECISION[dtype]
        except KeyError:
            raise ValueError(f"kernel dtype {dtype!r} is not one of {', '.join(_KERNEL_PRECISION)}") from None


_COMPUTE_DTYPE = {Precision.FP32: "float32", Precision.TF32: "float32", Precision.AMP_BF16: "bfloat16",
                  Precision.AMP_FP16: "float16", Precision.FLOAT64: "float64"}
_UNIT_ROUNDOFF = {Precision.FP32: 2.0 ** -24, Precision.TF32: 2.0 ** -11, Precision.AMP_BF16: 2.0 ** -8,
                  Precision.AMP_FP16: 2.0 ** -11, Precision.FLOAT64: 2.0 ** -53}
_KERNEL_PRECISION = {"float32": Precision.FP32, "bfloat16": Precision.AMP_BF16, "float16": Precision.AMP_FP16}


class Compile(Axis):
    """The request's `compile`: the framework's default execution (torch eager, a TensorFlow
    tf.function graph, MXNet imperative) or its compiler (torch.compile, XLA, jax.jit, a hybridized
    MXNet block). A suite or the command line may also say `default`: whichever the runner runs
    when not asked (its runner.toml's [execution] compile), resolved before a request is made."""

    EAGER = "eager"
    COMPILED = "compiled"


class Mode(Axis):
    """What a benchmark times: a training step, the forward pass, or (decoder networks) a prompt
    then new tokens one by one with a key/value cache."""

    TRAIN = "train"
    INFER = "infer"
    GENERATE = "generate"


class Scenario(Axis):
    """MLPerf LoadGen's scenarios (infer mode; generate mode: server only)."""

    SINGLE_STREAM = "single_stream"
    MULTI_STREAM = "multi_stream"
    OFFLINE = "offline"
    SERVER = "server"

    @property
    def loadgen_name(self) -> str:
        """LoadGen's own name of the scenario (mlperf_loadgen.TestScenario.<name>)."""
        return "".join(part.capitalize() for part in self.value.split("_"))


class Parallelism(Axis):
    """How a training job of the distributed suite splits the network over its workers:
      data    every worker holds the whole network and trains on its share of the batch; the
              gradients of every weight are averaged over the workers (all-reduce);
      expert  the experts of each Mixture-of-Experts block are sharded over the workers (E / W
              whole experts each, worker w holding experts w*E/W ... (w+1)*E/W - 1); every
              other weight is held by every worker as in data parallelism, its gradients
              averaged by all-reduce. Each worker routes its own tokens, sends every token to the
              worker holding each expert it chose (all-to-all), and the experts' outputs come back
              to the token's worker by a second all-to-all (combine); backward runs the two in
              reverse. An expert's gradient is the sum over every worker's tokens, divided by the
              workers as data parallelism's average is, so the two train the same network alike."""

    DATA = "data"
    EXPERT = "expert"


class CompressionMethod(Axis):
    """How a data-parallel job's gradients are exchanged (the method of `Compression`):
      none      dense all-reduce of the float32 gradients;
      fp16      the gradients cast to float16 for the all-reduce, back to float32 after;
      bf16      the same in bfloat16;
      powersgd  rank-r PowerSGD (Vogels, Karimireddy, Jaggi 2019): each matrix-shaped gradient
                (a convolution's flattened to out x rest) is sent as its two factors P (n x r) and
                Q (m x r), one power iteration per step warm-started from the last Q, the part the
                factors miss kept as error feedback; vectors (biases, norms) all-reduced as they are;
      topk      each gradient tensor's k = ceil(density x size) largest magnitudes, after adding
                the residual of what earlier steps did not send (error feedback), all-gathered as
                (index, value) pairs and summed;
      gtopk     global top-k (Shi et al. 2019): the local top-k pairs merged up a binomial tree in
                ceil(log2 P) rounds, keeping the k largest of each merge, and the global k pairs
                sent back down the tree in as many rounds; what a rank selected but the global set
                dropped goes back to its residual;
      2bit      MXNet kvstore's own 2-bit quantisation (set_gradient_compression type "2bit"):
                each value of gradient + residual sent as +threshold, -threshold or 0 (2 bits,
                16 values to a float32 word) to the parameter servers, the rest kept as the
                residual (error feedback); the servers' sum comes back dense (float32).
                A parameter-server exchange: the frameworks without one skip it."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    TOPK = "topk"
    GTOPK = "gtopk"
    TWO_BIT = "2bit"

    @property
    def parameter(self) -> str | None:
        """The name of the method's parameter (`powersgd:RANK`, `topk:DENSITY`), None for none."""
        return _COMPRESSION_PARAMETER.get(self)

    @classmethod
    def _missing_(cls, value):
        """A spelling with its parameter names its method: CompressionMethod("topk:0.01") is TOPK
        (what runner.toml [distributed] compressions list and a refusal checks)."""
        if isinstance(value, str) and ":" in value:
            method = value.partition(":")[0]
            return next((m for m in cls if m.value == method), None)
        return None

    @classmethod
    def axis_name(cls) -> str:
        return "compression"

    @classmethod
    def parse(cls, value, who: str, accepted=None) -> "Compression":
        """The request's whole value, method and parameter (Compression.parse): what a harness hands
        the runner (typed_request)."""
        return Compression.parse(value, who, accepted)


_COMPRESSION_PARAMETER = {CompressionMethod.POWERSGD: "rank", CompressionMethod.TOPK: "density",
                          CompressionMethod.GTOPK: "density", CompressionMethod.TWO_BIT: "threshold"}


class Compression:
    """The request's `compression`: a CompressionMethod and its parameter, spelt `method[:value]`
    (`none`, `fp16`, `bf16`, `powersgd:4`, `topk:0.01`, `gtopk:0.01`, `2bit:0.5`). rank is an
    integer >= 1, density a number in (0, 1], threshold a number > 0; methods without a parameter
    take none. A value is immutable,
    compares and hashes as its spelling, and prints as it (requests and records carry the text)."""

    __slots__ = ("method", "rank", "density", "threshold")

    def __init__(self, method: CompressionMethod, rank: int | None = None, density: float | None = None,
                 threshold: float | None = None):
        object.__setattr__(self, "method", CompressionMethod(method))
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "density", density)
        object.__setattr__(self, "threshold", threshold)
        wants = self.method.parameter
        given = {"rank": rank, "density": density, "threshold": threshold}
        if any((wants == name) != (value is not None) for name, value in given.items()):
            raise ValueError(f"compression {self.method.value} takes {wants or 'no parameter'}")

    def __setattr__(self, name, value):
        raise AttributeError("a Compression is immutable")

    @property
    def value(self) -> str:
        if self.rank is not None:
            return f"{self.method.value}:{self.rank}"
        if self.density is not None:
            return f"{self.method.value}:{self.density:g}"
        if self.threshold is not None:
            return f"{self.method.value}:{self.threshold:g}"
        return self.method.value

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __eq__(self, other) -> bool:
        if isinstance(other, Compression):
            return self.value == other.value
        if isinstance(other, str):
            return self.value == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    @property
    def dense(self) -> bool:
        return self.method is CompressionMethod.NONE

    @classmethod
    def axis_name(cls) -> str:
        return "compression"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The spellings, a parameter shown by its name (for help texts and messages)."""
        return tuple(f"{m.value}:{m.parameter.upper()}" if m.parameter else m.value for m in CompressionMethod)

    @classmethod
    def every(cls) -> tuple["Compression", ...]:
        """What `all` means: every method once, at the parameters issue 44 compares (PowerSGD
        rank 4, top-k and gTop-k density 0.01; 2-bit at MXNet's default threshold 0.5)."""
        return tuple(cls.parse(text, who="Compression.every") for text in EVERY_COMPRESSION)

    @classmethod
    def parse(cls, value, who: str, accepted=None) -> "Compression":
        """`value` (text, or a Compression) as a Compression, or one ValueError naming `who`, the
        value and what is accepted (`accepted`: methods, default all)."""
        if isinstance(value, Compression):
            text = value.value
        else:
            text = str(value).strip()
        allowed = tuple(CompressionMethod) if accepted is None else tuple(CompressionMethod(a) for a in accepted)
        method_text, sep, parameter = text.partition(":")
        spellings = ", ".join(f"{m.value}:{m.parameter.upper()}" if m.parameter else m.value for m in allowed)

        def refuse(why: str) -> ValueError:
            return ValueError(f"{who}: compression {text!r} {why} ({spellings})")

        try:
            method = CompressionMethod(method_text)
        except ValueError:
            raise refuse("is not one it accepts") from None
        if method not in allowed:
            raise refuse("is not one it accepts")
        if method.parameter is None:
            if sep:
                raise refuse(f"takes no parameter after {method.value}")
            return cls(method)
        if not parameter:
            raise refuse(f"needs its {method.parameter}, as {method.value}:{method.parameter.upper()}")
        if method.parameter == "rank":
            if not parameter.isdigit() or int(parameter) < 1:
                raise refuse("needs a rank that is a whole number >= 1")
            return cls(method, rank=int(parameter))
        try:
            number = float(parameter)
        except ValueError:
            number = float("nan")
        if method.parameter == "threshold":
            if not 0.0 < number < float("inf"):  # NaN fails too
                raise refuse("needs a threshold > 0")
            return cls(method, threshold=number)
        if not 0.0 < number <= 1.0:  # NaN fails too
            raise refuse("needs a density in (0, 1]")
        return cls(method, density=number)


# 2bit at MXNet's own default threshold (KVStore.set_gradient_compression)
EVERY_COMPRESSION = ("none", "fp16", "bf16", "powersgd:4", "topk:0.01", "gtopk:0.01", "2bit:0.5")


def topk_count(size: int, density: float) -> int:
    """k of a gradient tensor of `size` elements at `density`: ceil(density x size), at least 1,
    computed as every runner and the analytical byte count compute it (a float product rounded
    up, with a tolerance that keeps 0.01 x 100 at 1, not 2)."""
    product = density * size
    k = int(product)
    if product - k > 1e-9 * max(1.0, product):
        k += 1
    return max(1, min(size, k))


def gtopk_tree(world_size: int) -> tuple[list[list[tuple[int, int]]], list[list[tuple[int, int]]]]:
    """gTop-k's binomial tree over ranks 0..P-1: (reduce rounds, broadcast rounds), each round a
    list of (sender, receiver). Reduce round j: every rank r with r mod 2^(j+1) = 2^j sends its
    pairs to r - 2^j, which merges them with its own; after ceil(log2 P) rounds rank 0 holds the
    global top-k. Broadcast: the same edges reversed, highest round first."""
    rounds = []
    step = 1
    while step < world_size:
        rounds.append([(r, r - step) for r in range(world_size) if r % (2 * step) == step])
        step *= 2
    return rounds, [[(dst, src) for src, dst in edges] for edges in reversed(rounds)]


class RequestAxis:
    """What the code asks of one axis beyond its values: everything the controller and the
    harnesses do with an axis reads it from here (REQUEST_AXES), so that a new axis is its Axis
    class, one entry below, its field where a run carries it (the planned benchmark, the request,
    the command's option, the record: docs/extending.md, "Add an axis") and the runners that act
    on it.

      field       its name in a worker's request, on a planned benchmark and in the record's
                  `workload` (src/dlbench/store/record.py), and `dlbench run`'s option (--<field>);
      axis        the Axis class of its values;
      noun        what an error calls one of its values ("unknown compile mode 'x'"; default: the field);
      purpose     what the option is for, in the words of an error that refuses it
                  (src/dlbench/workflows/suite_kinds.py);
      capability  the runner.toml [capabilities] field listing the values a runner's single-process
                  worker runs (a value it does not list is recorded skipped, no worker started);
      unlisted    the values a runner runs whose runner.toml leaves that field out; None: every
                  runner.toml must list at least one;
      distributed_capability, distributed_unlisted
                  the same for the runner's data-parallel step (runner.toml [distributed]: the
                  distributed suites' jobs, recorded skipped before any rank starts);
      runner_default
                  a benchmark may ask for `default`: each runner's own value (runner.toml
                  [execution]), resolved per runner before the capability check and the record;
      optional    None is a value: the axis not asked (a run outside LoadGen has no scenario);
      pairs       part of the key that pairs runs (`dlbench compare`, `dlbench history`, the
                  report's leaderboard entries and series): runs that differ in it are different
                  quantities; mode is not, the benchmark's name carries it;
      side_by_side
                  benchmarks that differ only in this axis are planned one after the other at each
                  batch size, so that their ratio is measured side by side (compile);
      own_figures a run with a value of this axis is measured by another harness whose figures are
                  not the timed iterations' (LoadGen's scenario): the report and `dlbench history`
                  show it apart, `dlbench compare` pairs it apart (compare_loadgen);
      suite_kinds the suite kinds (src/dlbench/definitions/catalog.py SUITE_KINDS) whose requests
                  carry it: `dlbench run --<field>` on a suite of another kind is refused."""

    __slots__ = ("field", "axis", "noun", "purpose", "capability", "unlisted", "distributed_capability",
                 "distributed_unlisted", "runner_default", "optional", "pairs", "side_by_side", "own_figures",
                 "suite_kinds")

    def __init__(self, field: str, axis: type[Axis], purpose: str, *, capability: str | None,
                 unlisted: tuple | None = None, distributed_capability: str | None = None,
                 distributed_unlisted: tuple | None = None, runner_default: bool = False, optional: bool = False,
                 pairs: bool = True, side_by_side: bool = False, own_figures: bool = False,
                 suite_kinds: tuple[str, ...] = ("benchmark",), noun: str | None = None):
        self.field, self.axis, self.noun, self.purpose = field, axis, noun or field, purpose
        self.capability, self.unlisted, self.runner_default = capability, unlisted, runner_default
        self.distributed_capability, self.distributed_unlisted = distributed_capability, distributed_unlisted
        self.optional, self.pairs, self.side_by_side, self.own_figures = optional, pairs, side_by_side, own_figures
        self.suite_kinds = frozenset(suite_kinds)

    @property
    def flag(self) -> str:
        """`dlbench run`'s option."""
        return "--" + self.field.replace("_", "-")

    def __repr__(self) -> str:
        return f"RequestAxis({self.field!r}, {self.axis.__name__})"


# The request's axes, in the order the records' keys list them (src/dlbench/execution/orchestrator.py
# build_request). Precision is also passed on to the data-parallel runs (a runner's step trains in
# fp32 unless its runner.toml [distributed] lists more) and the convergence runs (the runner's own
# check).
REQUEST_AXES = {axis.field: axis for axis in (
    RequestAxis("precision", Precision, "the precision a network is run at", capability="precisions",
                distributed_capability="precisions", distributed_unlisted=("fp32",),
                suite_kinds=("benchmark", "distributed", "convergence")),
    RequestAxis("compile", Compile, "running a network eagerly or through the framework's compiler",
                capability="compile", runner_default=True, side_by_side=True, noun="compile mode"),
    RequestAxis("mode", Mode, "timing training, inference or generation", capability="modes", pairs=False),
    RequestAxis("scenario", Scenario, "MLPerf LoadGen's scenarios for inference", capability="scenarios",
                unlisted=(), optional=True, own_figures=True),
    # a data-parallel job's (a distributed suite's, or a convergence suite's with --workers): its
    # runner.toml [distributed] compressions list methods (any parameter runs); None on every other run
    RequestAxis("compression", CompressionMethod, "how a data-parallel job exchanges its gradients",
                capability=None, distributed_capability="compressions", distributed_unlisted=("none",),
                optional=True, suite_kinds=("distributed", "convergence")),
    # a training job of the distributed suite's: its runner.toml [distributed] parallelisms list
    # what its step splits (data unlisted: every runner's data parallelism); None on every other run
    RequestAxis("parallelism", Parallelism, "how a training job splits the network over its workers",
                capability=None, distributed_capability="parallelisms", distributed_unlisted=("data",),
                optional=True, suite_kinds=("distributed",)),
)}


def typed_request(request: dict) -> dict:
    """The request with each axis field as its axis's member, checked once where a worker reads its
    request (the harnesses), so that a runner is handed values it can compare, look up and print
    as the strings they are, and an unknown value fails once, naming the field."""
    typed = dict(request)
    for field, spec in REQUEST_AXES.items():
        if typed.get(field) is not None:
            typed[field] = spec.axis.parse(typed[field], who=f"the request's {field!r}")
    return typed


# The names as tuples, for code that lists or tests membership of strings.
PRECISIONS = tuple(p.value for p in Precision.runs())
CHECK_PRECISION = Precision.FLOAT64.value
KERNEL_PRECISION = {dtype: p.value for dtype, p in _KERNEL_PRECISION.items()}
COMPILE_MODES = Compile.names()
# A pool2d kernel's `op` is the index of its operation here: the spec's shape holds integers only.
# The controller's table is src/dlbench/performance/kernels.py POOL_OPS (tests keep the two equal).
POOL_OPS = ("max", "avg", "global")


def pool_op(shape: dict) -> str:
    """A pool2d kernel's operation, by name: max, avg or global."""
    return POOL_OPS[shape["op"]]


# ------------------------------------------------------------------ what the harnesses are handed


class _CheckHooks:
    """What Prepared and Generator share: the hooks only `dlbench check` needs, optional to build."""

    def _needs(self, what: str, fn):
        """`fn`, which only `dlbench check` calls, or why this object cannot do what it asks."""
        if fn is None:
            raise NotImplementedError(f"this {type(self).__name__} was built without {what} "
                                      "(needed by `dlbench check`)")
        return fn


class Prepared(_CheckHooks):
    """One network, its optimiser and its data on the device, ready to be timed (`prepare`).

    params: trainable parameters as the framework built them; output_shape: the per-sample output
    shape; settings: what the runner chose (layout, fused kernels, ...); step(): one iteration (it
    may return before the device has finished); synchronize(): wait for all queued device work.

    After the measured iterations the harness asks, where the runner gave them: memory() -> the
    framework allocator's peak device memory ({"peak_allocated_bytes", "peak_reserved_bytes",
    "source"}, or {"unavailable": why}); compile_stats() -> what the compiler reports
    ({"graph_breaks", "recompiles", ...}, the framework's own counters).

    For LoadGen's scenarios (runners/common/loadgen_harness.py): infer(n) -> the forward pass in
    inference mode on the first n samples of the prepared batch (prepared at the largest batch the
    scenario runs; it may return before the device has finished, as step() may); None where the
    runner gives none (its LoadGen runs then fail, saying so).

    For `dlbench check`: export_weights() -> every canonical tensor, float32 (float64 when the
    request's precision is float64), running statistics included; load_weights(arrays) -> the inverse, after which the optimiser state is fresh (zero
    momentum); forward_loss() -> (logits ndarray in the canonical layout, loss float) of the step's
    mode on the prepared data. The runner gives `export_weights`, `load_weights`, `reset_optimizer`
    and `forward_loss` as callables; the device is synchronised before weights are read or written.
    """

    def __init__(self, step: Callable[[], Any], synchronize: Callable[[], Any], params: int, output_shape,
                 settings: dict, *, export_weights: Callable[[], Arrays] | None = None,
                 load_weights: Callable[[Arrays], None] | None = None,
                 reset_optimizer: Callable[[], None] | None = None,
                 forward_loss: Callable[[], tuple[Any, float]] | None = None,
                 memory: Callable[[], dict] | None = None, compile_stats: Callable[[], dict] | None = None,
                 infer: Callable[[int], Any] | None = None):
        self.step = step
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self._export, self._load, self._reset_optimizer = export_weights, load_weights, reset_optimizer
        self._forward_loss = forward_loss
        self.memory = memory
        self.compile_stats = compile_stats
        self.infer = infer


    def export_weights(self) -> Arrays:
        export = self._needs("export_weights", self._export)
        self.synchronize()  # a step may still be writing the weights
        return export()

    def load_weights(self, arrays: Arrays) -> None:
        load = self._needs("load_weights", self._load)
        reset = self._needs("reset_optimizer", self._reset_optimizer)
        self.synchronize()
        load(arrays)
        reset()

    def forward_loss(self) -> tuple[Any, float]:
        return self._needs("forward_loss", self._forward_loss)()


class Generator(_CheckHooks):
    """A decoder network ready to generate text (`prepare_generation`, mode `generate`): a prompt
    of the request's `generation.prompt_length` tokens per sequence, then greedy decoding with the
    framework's key/value cache until `generation.new_tokens` tokens per sequence exist.

    prefill(): the prompt through the network, its keys and values into the cache, the first new
    token chosen (argmax of the last position's logits); every call starts a new request, so the
    cache of the previous one is overwritten, not carried over. decode(): one more token from the
    last one and the cache. synchronize(): wait for the device; the harness reads the clock between
    two synchronisations, so a token's time is the time until it exists on the device (a server
    would stream it from there). prefill + (new_tokens - 1) decodes make one request.

    For `dlbench check --mode generate`: load_weights(arrays) (canonical weights, as Prepared's),
    tokens() -> (batch, new_tokens) int array of the last request's generated ids, first_logits()
    -> (batch, vocabulary) logits of the prompt's last position in the last request (float32, or
    float64 when the request's precision is float64). The prompt is the request's `inputs` x
    (its first prompt_length columns) when given, else synthetic ids from the seed."""

    def __init__(self, prefill: Callable[[], Any], decode: Callable[[], Any], synchronize: Callable[[], Any],
                 params: int, settings: dict, *, load_weights: Callable[[Arrays], None] | None = None,
                 tokens: Callable[[], Any] | None = None, first_logits: Callable[[], Any] | None = None,
                 memory: Callable[[], dict] | None = None, compile_stats: Callable[[], dict] | None = None):
        self.prefill = prefill
        self.decode = decode
        self.synchronize = synchronize
        self.params = params
        self.settings = settings
        self._load, self._tokens, self._first_logits = load_weights, tokens, first_logits
        self.memory = memory
        self.compile_stats = compile_stats


    def load_weights(self, arrays: Arrays) -> None:
        load = self._needs("load_weights", self._load)
        self.synchronize()
        load(arrays)

    def tokens(self):
        self.synchronize()
        return self._needs("tokens", self._tokens)()

    def first_logits(self):
        self.synchronize()
        return self._needs("first_logits", self._first_logits)()


class Kernel:
    """One kernel of the kernels suite (src/dlbench/performance/kernels.py) on its operands on the
    device (`prepare_kernel`): step() runs it once, synchronize() waits for it, settings says how it
    is done, and includes_forward that step() also runs the matching forward kernel (a framework
    that offers no backward alone): the harness then times the forward too and keeps the difference."""

    def __init__(self, step: Callable[[], Any], synchronize: Callable[[], Any], settings: dict | None = None,
                 includes_forward: bool = False):
        self.step = step
        self.synchronize = synchronize
        self.settings = settings or {}
        self.includes_forward = includes_forward


class DataParallel:
    """One synchronous data-parallel training job's rank, ready to be timed (`prepare_data_parallel`).

    params, output_shape, settings as Prepared; grad_bytes: gradient bytes exchanged per iteration;
    step(): one step, the gradient exchange included; synchronize(); step_without_sync: the same step
    without the exchange, or None where the framework cannot leave it out (the exposed
    communication is then not measured); loss(): the last step's training loss on this rank (the
    network's loss, the auxiliary load-balancing loss left out), or None where the runner cannot
    read it; all_to_all(): expert parallelism's running totals since the job began, {"seconds":
    time in the dispatch and combine all-to-alls, forward and backward (None where they cannot be
    timed apart), "bytes": the bytes this rank sent by them, "calls": how many it made}, or None
    where the step makes none."""

    def __init__(self, step: Callable[[], Any], step_without_sync: Callable[[], Any] | None,
                 synchronize: Callable[[], Any], params: int, output_shape, settings: dict, grad_bytes: int,
                 loss: Callable[[], float] | None = None, all_to_all: Callable[[], dict] | None = None):
        self.step = step
        self.step_without_sync = step_without_sync
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self.grad_bytes = grad_bytes
        self.loss = loss
        self.all_to_all = all_to_all


@runtime_checkable
class Collective(Protocol):
    """One collective of the comm suite over buffers made once. Counts are float32 elements:
    all_reduce and broadcast (root 0) send and receive `count` in one buffer, in place; all_gather
    sends count/n and receives count; reduce_scatter sends count and receives block `rank` of the sum;
    all_to_all sends count and receives count, block j of the send buffer going to rank j and block j
    of the receive buffer coming from rank j (n blocks of count/n)."""

    def load(self, array) -> None:
        """Fill this rank's send buffer from a numpy array."""

    def run(self) -> None:
        """Issue the collective once (it may return before it has finished)."""

    def synchronize(self) -> None:
        """Wait until every issued run has finished."""

    def result(self):
        """This rank's receive buffer as a numpy array."""


# ------------------------------------------------------------------ building a network


class Trainer:
    """One convergence run's network, optimiser and input pipelines (`prepare_convergence`), driven
    by runners/common/convergence.py. The runner builds the callables; this class holds them:

    attach(train, eval, seed): the splits as numpy (x uint8 (N, C, H, W), y int64), read from disk
      after the clock started; builds the framework's own input pipelines over them (normalisation,
      the task's augmentation, shuffling per epoch, batching; the last partial training batch
      dropped), returns a description of them for the record;
    train_batches(epoch) -> an iterator of the framework's batches for one epoch (the loop times
      each `next` as the pipeline's wait);
    train_step(batch, lr): one SGD step at this learning rate (it may return before the device is done);
    eval_batches() -> an iterator over the evaluation split; eval_step(batch) -> (correct, count),
      host integers;
    synchronize(): wait for the device; close(): stop the pipelines' workers;
    across_ranks(correct, count) -> (correct, count) of every rank of a data-parallel run together
      (each rank evaluates its own share of the split, so that every rank sees the same accuracy
      and stops at the same epoch); one process: as given.
    """

    def __init__(self, attach: Callable, train_batches: Callable, train_step: Callable, eval_batches: Callable,
                 eval_step: Callable, synchronize: Callable, params: int, settings: dict | None = None,
                 close: Callable[[], Any] | None = None, across_ranks: Callable[[int, int], tuple] | None = None):
        self.attach, self.train_batches, self.train_step = attach, train_batches, train_step
        self.eval_batches, self.eval_step, self.synchronize = eval_batches, eval_step, synchronize
        self.params = params
        self.settings = settings or {}
        self.close = close or (lambda: None)
        self.across_ranks = across_ranks or (lambda correct, count: (correct, count))


class Layer:
    """One layer type in a runner: `build`, the function that builds it the framework's way, and
    `weights`, the function that names its canonical tensors (src/dlbench/definitions/weights.py)
    and says where the framework keeps each one, or None for a type without weights (relu, pooling).
    Both have the runner's own signature: the table keeps everything a runner knows of one type in
    one entry, so that its weight export and import never branch on the type."""

    __slots__ = ("build", "weights")

    def __init__(self, build: Callable, weights: Callable | None = None):
        self.build = build
        self.weights = weights


class LayerTable(dict):
    """A runner's layer types: the `type` of a resolved layer (src/dlbench/definitions/schema.py)
    -> its `Layer`. A new layer type is one entry; a lookup refuses a type the runner has no entry
    for, naming it: a Skip (the run is recorded as skipped, with that reason), since the
    description is valid and another runner may build it."""

    def __init__(self, runner: str, layers: dict[str, Layer]):
        not_layers = sorted(k for k, v in layers.items() if not isinstance(v, Layer))
        if not_layers:
            raise TypeError(f"{runner} runner's layer table: {', '.join(not_layers)} not a Layer(build, weights)")
        super().__init__(layers)
        self.runner = runner

    def layer(self, layer_type: str) -> Layer:
        try:
            return self[layer_type]
        except KeyError:
            raise Skip(f"{self.runner} runner: no builder for layer type {layer_type!r} "
                       f"(it builds {', '.join(sorted(self))})") from None

    def builder(self, layer_type: str) -> Callable:
        return self.layer(layer_type).build

    def weights(self, layer_type: str) -> Callable | None:
        """The type's weight function, None where the type has no weights."""
        return self.layer(layer_type).weights


# ------------------------------------------------------------------ generation


class DecoderLayout:
    """Where the parts of a decoder network are in its resolved layers (mode `generate`): the token
    `embedding` (index 0), the `position` embedding, the transformer `blocks`, the optional final
    `norm` and the `head` (the last layer); or of a Llama-style one (LLAMA_PATTERN: rotary positions
    in the blocks, `position` None, no table to overrun), which every runner generates too. The
    controller allows mode generate only on networks of these shapes
    (src/dlbench/definitions/generation.py says the same); a runner handed another network skips,
    saying why."""

    PATTERN = "embedding position_embedding [dropout] transformer_block... [layer_norm] lm_head"
    LLAMA_PATTERN = "embedding llama_block... rms_norm lm_head"

    def __init__(self, network: dict):
        kinds = [layer["type"] for layer in network["layers"]]
        why = None
        self.llama = (len(kinds) >= 4 and kinds[0] == "embedding" and kinds[-2:] == ["rms_norm", "lm_head"]
                      and all(k == "llama_block" for k in kinds[1:-2]))
        if self.llama:
            self.embedding, self.position, self.blocks = 0, None, list(range(1, len(kinds) - 2))
            self.norm, self.head, self.max_length = len(kinds) - 2, len(kinds) - 1, None
            return
        if network["input"]["kind"] != "tokens":
            why = f"takes {network['input']['kind']} input, not tokens"
        else:
            i = 2 if kinds[:2] == ["embedding", "position_embedding"] else None
            if i is not None and i < len(kinds) and kinds[i] == "dropout":
                i += 1
            blocks = []
            while i is not None and i < len(kinds) and kinds[i] == "transformer_block":
                blocks.append(i)
                i += 1
            norm = i if i is not None and i < len(kinds) and kinds[i] == "layer_norm" else None
            if norm is not None:
                i += 1
            if i is None or not blocks or i != len(kinds) - 1 or kinds[i] != "lm_head":
                why = f"is {', '.join(kinds)}, not {self.PATTERN}"
            elif not all(network["layers"][b]["causal"] for b in blocks):
                why = "has non-causal transformer blocks"
            else:
                self.embedding, self.position, self.blocks, self.norm, self.head = 0, 1, blocks, norm, i
        if why:
            raise Skip(f"mode generate needs a decoder network; {network['name']} {why}")
        self.max_length = network["layers"][1]["max_length"]

    def request_lengths(self, request: dict) -> tuple[int, int]:
        """(prompt_length, new_tokens) of a generate request, refused when together they overrun the
        position table (the controller refuses such a suite first; this guards a hand-made request)."""
        gen = request["generation"]
        prompt_length, new_tokens = gen["prompt_length"], gen["new_tokens"]
        if self.max_length is not None and prompt_length + new_tokens > self.max_length:
            raise ValueError(f"prompt {prompt_length} + {new_tokens} new tokens exceed the position table's "
                             f"{self.max_length} rows")
        return prompt_length, new_tokens


# ------------------------------------------------------------------ the runner objects


@runtime_checkable
class Framework(Protocol):
    """What every runner object has, in one process or as a rank of a job."""

    name: str

    def configure_threads(self, threads: int | None) -> dict:
        """Apply --threads the framework's way (before it starts its pools); the effective setting."""

    def framework_info(self, device: str) -> dict:
        """Version and build (CUDA, cuDNN, MKL, ...), devices."""

    def device_available(self, device: str) -> str | None:
        """None, or why the device cannot be used (the run is then `skipped`)."""


@runtime_checkable
class Runner(Framework, Protocol):
    """The runner object of `worker.py` (runners/common/harness.py)."""

    def prepare(self, request: dict) -> Prepared:
        """The resolved network built idiomatically, SGD with momentum, data on the device. Honours
        `inputs` (an .npz with `x` in the canonical layout and `y`, instead of synthetic data) and
        `deterministic` (dropout as the identity)."""

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        """One kernel of the kernels suite, called the way the runner's own step calls it."""

    def prepare_generation(self, request: dict) -> Generator:
        """Mode `generate`: the resolved decoder network (the same layers and weights `prepare`
        builds) with the framework's own key/value cache; `request["generation"]` holds
        `prompt_length` and `new_tokens`. Honours `precision`, `compile`, `inputs` and `seed` as
        `prepare` does; a network that is not a decoder, or an axis it cannot generate in, is a Skip."""


class ConvergenceRunner(Protocol):
    """What a Runner may add for the convergence suite (runners/common/convergence.py); a runner
    without it has its convergence runs skipped, saying so."""

    def prepare_convergence(self, request: dict) -> Trainer:
        """Action `convergence`, initialisation (timed apart, before the clock starts): the network
        built and seeded, SGD with momentum and weight decay, steps compiled where the framework
        compiles (without touching the data)."""


@runtime_checkable
class DistributedRunner(Framework, Protocol):
    """The runner object of `distributed_worker.py` (runners/common/distributed_harness.py); it may
    also have the members of `CollectiveLimits`."""

    def join(self, cluster) -> dict:
        """Join the job's process group (distributed_harness.Cluster); at least {"backend": ...}."""

    def barrier(self) -> None:
        """Every rank waits for every other."""

    def leave(self) -> None:
        """Leave the process group, after a successful job."""

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        """Action `data_parallel`: this rank's part of a synchronous data-parallel training job."""

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        """Action `collectives`: one collective over buffers of these float32 counts."""


class CollectiveLimits(Protocol):
    """What a DistributedRunner may add: where its engine offers less (the harness asks each, if present)."""

    def collective_unavailable(self, op: str) -> str | None:
        """None, or why this engine offers no such collective on this device (TensorFlow's
        reduce-scatter is NCCL-only): every size of it is skipped with that reason, no rank runs it."""

    def collective_size_unavailable(self, op: str, size_bytes: int, runs: int) -> str | None:
        """None, or why this one size is not run, knowing it would be issued `runs` times (MXNet's
        broadcast keeps a kvstore key per call); every rank must decide alike."""


def members(protocol: type) -> frozenset[str]:
    """The names a class must have to satisfy `protocol` (its own and its protocol bases')."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        names.update(getattr(cls, "__annotations__", {}))
        names.update(k for k, v in vars(cls).items() if callable(v) and not k.startswith("_"))
    return frozenset(names)
