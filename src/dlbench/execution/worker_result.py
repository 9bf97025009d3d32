"""The worker's result file, parsed against one schema at the boundary (issue 18).

Whatever a worker wrote (another runner's bug, a framework printing into the wrong file, a hostile
process), `parse_result` returns a `WorkerResult` whose every field has the type and range the
controller relies on, or raises `ResultError` naming the first offending field. Nothing downstream
(the statistics, the telemetry's window, the record) ever sees the raw JSON.

Rules beyond the types: iteration times are finite and positive; the measured window is two marks
on the monotonic clock, the end after the start, both within the worker's lifetime when that is
known; integers fit in int64 (SQLite's); an `ok` benchmark has measured iterations; booleans are
not numbers and strings are not numbers (strict mode). A size limit and UTF-8 are checked before
JSON is parsed; pydantic's JSON parser refuses NaN/Infinity in the fields below, trailing bytes
and nesting deeper than its recursion limit.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

PROTOCOL_VERSION = 1  # of the request/result files; must match runners/common/protocol.py
INT64_MAX = 2**63 - 1
REASON_CHARS = 4000  # a reason longer than this is cut (the output tail carries the rest)
TRACEBACK_CHARS = 20000
# a reason keeps its head, a traceback its tail (where the exception is): cut, not refused
Reason = Annotated[str, AfterValidator(lambda v: v if len(v) <= REASON_CHARS else f"{v[:REASON_CHARS]} [...]")]
Traceback = Annotated[str, AfterValidator(
    lambda v: v if len(v) <= TRACEBACK_CHARS else f"[...] {v[-TRACEBACK_CHARS:]}")]

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # an iteration time: finite and positive
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Mark = Annotated[int, Field(ge=0, le=INT64_MAX)]  # time.monotonic_ns


class ResultError(ValueError):
    """The one error of `parse_result`: `field` is the offending field's dotted path ("result" for
    the file as a whole), `problem` what is wrong with it."""

    def __init__(self, field: str, problem: str, subject: str = "worker result"):
        self.field, self.problem = field, problem
        super().__init__(f"{subject} field {field!r}: {problem}" if field != "result" else f"{subject}: {problem}")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FrameworkInfo(BaseModel):
    """What `runner.framework_info` returned: a name and a version at least; the rest is the runner's."""

    model_config = ConfigDict(strict=True, extra="allow")
    name: str
    version: str | None = None
    build: dict[str, Any] = {}
    devices: list[Any] = []


class KernelEntry(BaseModel):
    """One kernel of a `kernels` request (harness.measure_kernels)."""

    model_config = ConfigDict(strict=True, extra="allow")
    spec: dict[str, Any]
    status: Literal["ok", "failed", "skipped"]
    reason: str | None = None
    first_s: Seconds | None = None
    times_s: list[Seconds] = []
    # a backward kernel timed with its forward is the median difference of paired calls, which may be 0
    median_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    forward_median_s: Seconds | None = None
    with_forward_median_s: Seconds | None = None
    settings: dict[str, Any] = {}
    traceback: str | None = None

    @model_validator(mode="after")
    def _measured(self):
        if self.status == "ok" and (not self.times_s or self.median_s is None):
            raise ValueError("an ok kernel needs its times (times_s) and median_s")
        return self


Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class LoadGenTest(_Strict):
    """One LoadGen test the worker ran (runners/common/loadgen_harness.py): its log folder (a plain
    name under the request's log folder), the server's rate, and what the worker saw of it; the
    record's figures come from the log itself (store/loadgen.py), never from these."""

    log_dir: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    target_qps: Rate | None = None
    wall_s: Seconds
    batches: Count
    loaded_samples: Count
    meets_bound: bool | None = None
    validity: str | None = None


class LoadGenOutcome(_Strict):
    """The `loadgen` part of a loadgen request's result."""

    scenario: Literal["single_stream", "multi_stream", "offline", "server"]
    runs: Annotated[list[LoadGenTest], Field(min_length=1, max_length=1000)]
    chosen: str
    warmup_latency_s: dict[str, Seconds]
    expected: dict[str, Rate]

    @model_validator(mode="after")
    def _chosen_is_a_run(self):
        names = [r.log_dir for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError("two LoadGen tests name the same log folder")
        if self.chosen not in names:
            raise ValueError(f"chosen {self.chosen!r} is none of the tests' log folders")
        return self


class GenerationTimes(_Strict):
    """Mode generate's per-request times (harness.measure_generation): one TTFT and one TPOT per
    measured request, as many as `iter_s`; `first_ttft_s` is the first request's TTFT."""

    new_tokens: Annotated[int, Field(ge=2, le=INT64_MAX)]
    first_ttft_s: Seconds
    ttft_s: list[Seconds]
    tpot_s: list[Seconds]


Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Duration = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class EvalPoint(_Strict):
    epoch: Count
    accuracy: Fraction
    time_s: Duration


class ConvergenceRun(BaseModel):
    """One seeded run of a convergence task (runners/common/convergence.py); `pipeline`,
    `cache_clear` and the rest are the runner's description, kept as strict JSON."""

    model_config = ConfigDict(strict=True, extra="allow")
    seed: Count
    init_s: Duration
    reached: bool
    epochs: Count
    epochs_to_target: Count | None = None
    time_to_target_s: Duration | None = None
    run_s: Duration
    evals: list[EvalPoint]
    epoch_s: list[Duration] = []
    train_s: Duration
    input_wait_s: Duration
    input_bound_share: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    steps: Count
    steps_per_epoch: Count
    train_samples: Count
    eval_samples: Count
    read_s: Duration | None = None
    cache_clear: dict[str, Any] = {}
    pipeline: dict[str, Any] = {}

    @model_validator(mode="after")
    def _consistent(self):
        if self.reached and (self.time_to_target_s is None or self.epochs_to_target is None):
            raise ValueError("a run that reached its target needs time_to_target_s and epochs_to_target")
        return self


class WorkerResult(_Strict):
    """RESULT.json of runners/common/harness.py, for every action (benchmark, kernels, check, loadgen)."""

    protocol: Literal[PROTOCOL_VERSION] | None = None  # type: ignore[valid-type]
    status: Literal["ok", "failed", "skipped"]
    reason: Reason | None = None
    traceback: Traceback | None = None
    framework: FrameworkInfo | None = None
    threads: dict[str, Any] = {}
    params: Count | None = None
    output_shape: list[Count] | None = None
    settings: dict[str, Any] = {}
    # action benchmark (harness.measure)
    first_iter_s: Seconds | None = None
    warmup_iter_s: list[Seconds] = []
    warmup_settled: bool | None = None
    iter_s: list[Seconds] = []
    window_monotonic_ns: list[Mark] = []
    memory: dict[str, Any] | None = None
    compile: dict[str, Any] | None = None
    generation: GenerationTimes | None = None  # mode generate
    # action kernels
    kernels: list[KernelEntry] | None = None
    # actions benchmark and kernels, when asked: the machine's speed before the work (performance/yardstick.py)
    yardstick: list[KernelEntry] | None = None
    # action check
    outputs: str | None = None
    # action loadgen
    loadgen: LoadGenOutcome | None = None
    # action convergence
    convergence: ConvergenceRun | None = None

    @field_validator("window_monotonic_ns")
    @classmethod
    def _window(cls, v: list[int], info: ValidationInfo) -> list[int]:
        if not v:
            return v
        if len(v) != 2:
            raise ValueError(f"needs two marks [start, end], not {len(v)}")
        start, end = v
        if end <= start:
            raise ValueError(f"the end {end} is not after the start {start}")
        lifetime = (info.context or {}).get("lifetime_ns")
        if lifetime is not None and not (lifetime[0] <= start and end <= lifetime[1]):
            raise ValueError(f"[{start}, {end}] lies outside the worker's lifetime [{lifetime[0]}, {lifetime[1]}] "
                             "on the monotonic clock")
        return v

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo):
        # the free-form parts (threads, settings, memory, compile, the framework's build) go into
        # the record as they are: strict JSON (no NaN or infinity) with integers the store can hold
        for field in ("threads", "settings", "memory", "compile", "framework", "kernels", "yardstick",
                      "convergence"):
            value = getattr(self, field)
            if value is not None:
                _storable(value.model_dump() if isinstance(value, BaseModel) else value, field)
        action = (info.context or {}).get("action", "benchmark")
        if self.status != "ok":
            return self
        if self.framework is None:
            raise _FieldProblem("framework", "an ok result names its framework")
        if action == "benchmark":
            if not self.iter_s:
                raise _FieldProblem("iter_s", "an ok result has no measured iterations")
            if not self.window_monotonic_ns:
                raise _FieldProblem("window_monotonic_ns", "an ok result has no measured window")
            if (info.context or {}).get("mode") == "generate" and self.generation is None:
                raise _FieldProblem("generation", "an ok result of a generate request has no generation times")
            if self.generation is not None:
                for field in ("ttft_s", "tpot_s"):
                    if len(getattr(self.generation, field)) != len(self.iter_s):
                        raise _FieldProblem(f"generation.{field}", f"{len(getattr(self.generation, field))} "
                                            f"requests, iter_s has {len(self.iter_s)}")
        elif action == "loadgen" and self.loadgen is None:
            raise _FieldProblem("loadgen", "an ok result of a loadgen request has no loadgen tests")
        elif action == "kernels" and self.kernels is None:
            raise _FieldProblem("kernels", "an ok result of a kernels request has no kernels")
        elif action == "convergence" and self.convergence is None:
            raise _FieldProblem("convergence", "an ok result of a convergence request has no run")
        return self


def _storable(value: Any, path: str) -> None:
    """Raise _FieldProblem at the first float that is not finite or integer outside int64."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _FieldProblem(path, f"holds {value}, which JSON cannot store")
    elif isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise _FieldProblem(path, "holds an integer outside int64")
    elif isinstance(value, dict):
        for k, v in value.items():
            _storable(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _storable(v, f"{path}[{i}]")


class _FieldProblem(ValueError):
    """Raised inside a model validator to name a field (pydantic would locate it at the model)."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(problem)


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_error(e: ValidationError, subject: str = "worker result") -> ResultError:
    error = e.errors(include_url=False)[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldProblem):
        return ResultError(cause.field, str(cause), subject)
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "json_invalid":
        return ResultError("result", f"not valid JSON ({msg.removeprefix('Invalid JSON: ')})", subject)
    if not loc:
        return ResultError("result", f"not a JSON object but {_shown(error.get('input'))}"
                           if error["type"] == "model_type" else msg, subject)
    if error["type"] not in ("value_error", "missing", "extra_forbidden"):
        msg += f", not {_shown(error.get('input'))}"
    extra = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
    return ResultError(loc, msg + extra, subject)


def parse_result(data: bytes | str, action: str = "benchmark",
                 lifetime_ns: tuple[int, int] | None = None, mode: str | None = None) -> WorkerResult:
    """The result a worker wrote, validated for a request of `action`; `lifetime_ns` (monotonic
    clock) bounds its measured window. Raises ResultError and nothing else."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResultError("result", f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        return WorkerResult.model_validate_json(data, context={"action": action, "lifetime_ns": lifetime_ns,
                                                                 "mode": mode})
    except ValidationError as e:
        raise _first_error(e) from None
    except (ValueError, RecursionError, MemoryError) as e:  # never expected from pydantic; still one error
        raise ResultError("result", f"unreadable ({type(e).__name__}: {e})") from None
