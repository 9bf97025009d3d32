"""A rank's files in a distributed job's folder, parsed against a schema at the boundary (issue 18).

A rank of a multi-worker job (runners/common/distributed_harness.py) announces itself in
`rank<R>.started` (pid, host, start time) and leaves its result in `rank<R>.json`. Like a worker's
result (worker_result.py), neither is trusted: `parse_rank_result` and `parse_rank_started` return
the validated content or raise `ResultError` naming the first offending field ("rank 1 result
field 'iter_s[0]': Input should be greater than 0, not -1.0"). The job's watcher (jobs.py) counts
a malformed file as that rank's failure: the job is torn down, its record is `failed` with that
reason, and the suite goes on. What the orchestrator reads of a result (distributed.py) is then
there with the type it relies on.

Rules, beyond the types (strict: no booleans or strings as numbers): the rank and world size are
the ones the file is for; iteration times finite and positive; integers within int64; the free-form
parts (framework, threads, settings, process_group) strict JSON the store can hold; the measured
window two marks, the end after the start. An `ok` result of a `data_parallel` request names its
framework and has its first, measured iterations and window; an `ok` result of a `collectives`
request has one row per requested size for every requested collective, each skipped (saying why)
or measured (bytes, iteration times, whether it was correct); an `ok` result of a `convergence`
request has its seeded run (worker_result.ConvergenceRun's checks).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .worker_result import (
    INT64_MAX,
    ConvergenceRun,
    PROTOCOL_VERSION,
    Reason,
    Traceback,
    Count,
    FrameworkInfo,
    Mark,
    ResultError,
    Seconds,
    _FieldProblem,
    _first_error,
    _storable,
)

Timestamp = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # time.time()


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class RankStarted(_Strict):
    """rank<R>.started: who the rank is, so the watcher can see it die."""

    pid: Annotated[int, Field(gt=0, le=INT64_MAX)]
    host: str
    started_at: Timestamp | None = None


class CollectiveRow(_Strict):
    """One size of one collective (distributed_harness.measure_collectives)."""

    size_bytes: Count
    skipped: str | None = None
    bytes: Count | None = None
    send_count: Count | None = None
    recv_count: Count | None = None
    iter_s: list[Seconds] = []
    correct: bool | None = None
    error: str | None = None


Finite = Annotated[float, Field(allow_inf_nan=False)]
PerStep = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class AllToAllPerStep(_Strict):
    """Expert parallelism's all-to-alls per measured step (distributed_harness.measure_data_parallel)."""

    seconds: PerStep | None  # None: not timed apart (inside one compiled program)
    bytes: PerStep
    calls: PerStep


class RankResult(_Strict):
    """rank<R>.json, for both actions (data_parallel, collectives)."""

    protocol: Literal[PROTOCOL_VERSION] | None = None  # type: ignore[valid-type]
    status: Literal["ok", "failed", "skipped"]
    reason: Reason | None = None
    traceback: Traceback | None = None
    rank: Count
    world_size: Annotated[int, Field(ge=1, le=INT64_MAX)]
    local_rank: Count | None = None
    host: str | None = None
    framework: FrameworkInfo | None = None
    threads: dict[str, Any] = {}
    process_group: dict[str, Any] | None = None
    finished_at: Timestamp | None = None
    # action data_parallel
    params: Count | None = None
    output_shape: list[Count] | None = None
    settings: dict[str, Any] = {}
    grad_bytes: Count | None = None
    first_iter_s: Seconds | None = None
    warmup_iter_s: list[Seconds] = []
    iter_s: list[Seconds] = []
    local_iter_s: list[Seconds] | None = None
    window_monotonic_ns: list[Mark] = []
    losses: list[Finite] | None = None  # the loss after the first and each warm-up step, where read
    all_to_all: AllToAllPerStep | None = None  # expert parallelism only
    # action collectives
    collectives: dict[str, list[CollectiveRow]] | None = None
    # action convergence (the convergence suite with --workers): the seeded run, every rank's the
    # same loop; window_monotonic_ns spans it
    convergence: ConvergenceRun | None = None

    @field_validator("window_monotonic_ns")
    @classmethod
    def _window(cls, v: list[int]) -> list[int]:
        if v and (len(v) != 2 or v[1] <= v[0]):
            raise ValueError(f"needs two marks [start, end], the end after the start, not {v}")
        return v

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo):
        expect = info.context or {}
        for field in ("rank", "world_size"):
            want = expect.get(field)
            if want is not None and getattr(self, field) != want:
                raise _FieldProblem(field, f"is {getattr(self, field)}, but this is the file of {field} {want}")
        for field in ("threads", "settings", "process_group", "framework"):
            value = getattr(self, field)
            if value is not None:
                _storable(value.model_dump() if isinstance(value, BaseModel) else value, field)
        if self.status != "ok":
            return self
        if self.framework is None:
            raise _FieldProblem("framework", "an ok result names its framework")
        request = expect.get("request") or {}
        action = request.get("action")
        if action == "data_parallel":
            for field in ("first_iter_s", "iter_s", "window_monotonic_ns"):
                if not getattr(self, field):
                    raise _FieldProblem(field, "an ok result of a data_parallel request has none")
        elif action == "collectives":
            self._all_collectives(request)
        elif action == "convergence" and self.convergence is None:
            raise _FieldProblem("convergence", "an ok result of a convergence request has no run")
        return self

    def _all_collectives(self, request: dict) -> None:
        if self.collectives is None:
            raise _FieldProblem("collectives", "an ok result of a collectives request has none")
        sizes = list(request.get("sizes") or [])
        for op in request.get("collectives") or []:
            rows = self.collectives.get(op)
            if rows is None:
                raise _FieldProblem("collectives", f"has no rows for {op!r}")
            if [row.size_bytes for row in rows] != sizes:
                raise _FieldProblem(f"collectives.{op}", f"sizes {[row.size_bytes for row in rows][:8]} are not "
                                                          f"the {len(sizes)} sizes asked for")
            for i, row in enumerate(rows):
                if row.skipped is None and (row.bytes is None or not row.iter_s or row.correct is None):
                    raise _FieldProblem(f"collectives.{op}[{i}]", "a row not skipped needs bytes, iter_s and "
                                                                  "correct")


def _validated(model: type[BaseModel], data: bytes | str, subject: str, context: dict) -> BaseModel:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResultError("result", f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
                              subject) from None
    try:
        return model.model_validate_json(data, context=context)
    except ValidationError as e:
        raise _first_error(e, subject) from None
    except (ValueError, RecursionError, MemoryError) as e:  # never expected from pydantic; still one error
        raise ResultError("result", f"unreadable ({type(e).__name__}: {e})", subject) from None


def parse_rank_result(data: bytes | str, rank: int, world_size: int, request: dict | None = None) -> dict:
    """The content of rank<rank>.json, validated (for `request`'s action when given), as the dict
    of the fields the rank wrote. Raises ResultError and nothing else."""
    parsed = _validated(RankResult, data, f"rank {rank} result",
                        {"rank": rank, "world_size": world_size, "request": request})
    return parsed.model_dump(exclude_unset=True)


def parse_rank_started(data: bytes | str, rank: int) -> dict:
    """The content of rank<rank>.started, validated. Raises ResultError and nothing else."""
    return _validated(RankStarted, data, f"rank {rank} announcement", {}).model_dump()
