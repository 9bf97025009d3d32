"""The job trace: which jobs arrive when, what each trains and how much work it has.

dlbench's own trace is a YAML file (a `jobs:` list) or a CSV file whose header names the same
fields, one job per row:

    # yaml-language-server: $schema=../schemas/trace.schema.json
    jobs:
      - {id: a, arrival_s: 0, network: resnet50, framework: any, precision: fp32, batch: 64, workers: 4,
         iterations: 20000}
      - {arrival_s: 60, network: lstm32, framework: torch, batch: 32, epochs: 3, samples_per_epoch: 50000}

`network` is a network of `suites/networks/` by name or a path to its YAML (checked by the workflow,
which knows the catalog), or, with a throughput table, one of the table's job types. `framework` is
a runner or `any` (the framework-aware policy picks, the others run the trace's `--framework`);
`precision` one of the run precisions or `any` (with `framework: any`). `batch` is per worker.
The work is `iterations`, or `epochs` of `samples_per_epoch` samples (an iteration takes
workers x batch of them), or `seconds` of running on one type (`seconds_on`: what a Slurm
accounting record says, read with the throughput of that type), or `target`: a convergence task's
name (a `kind: convergence` suite's task, e.g. `digits_cnn`), the job training until that task's
quality target, its iterations those the store's time-to-accuracy runs of the task took (their
epochs to target x the steps of an epoch; the workflow reads them, and refuses a task the store has
no run of that reached its target). Gavel's and Slurm's formats are read
by planning/readers.py into the same jobs.

A trace is read whole before anything is simulated, and bounded: more than `MAX_JOBS` jobs (or a
file over `MAX_BYTES`) is one error naming the file, unless `limit` asks for the first N, which the
result then says it took.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from ..axes import PRECISIONS
import yaml

from ..definitions.loader import DefinitionError, _field_path
from ..definitions.schema import Int, Real, _Strict

MAX_JOBS = 200_000
MAX_BYTES = 256 * 2**20  # a CSV trace
MAX_YAML_LINES = 500_000  # a YAML trace is parsed whole: larger ones are written as CSV
MAX_VALUES = 20 * MAX_JOBS  # what a YAML trace may expand to, aliases followed
ANY = "any"
Name = Annotated[str, Field(min_length=1, max_length=300)]


class JobSpec(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    arrival_s: Real(ge=0, le=1e10) = 0.0
    network: Name
    framework: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")] = ANY
    precision: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,16}$")] = "fp32"
    batch: Int(1, 2**24)
    workers: Int(1, 65536) = 1
    iterations: Int(1, 10**15) | None = None
    epochs: Real(gt=0, le=1e9) | None = None
    samples_per_epoch: Int(1, 10**15) | None = None
    seconds: Real(gt=0, le=1e10) | None = None
    seconds_on: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    target: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")] | None = None
    weight: Real(gt=0, le=1e6) = 1.0

    @model_validator(mode="after")
    def _one_work(self):
        forms = [f for f, given in (("iterations", self.iterations is not None),
                                    ("epochs", self.epochs is not None or self.samples_per_epoch is not None),
                                    ("seconds", self.seconds is not None or self.seconds_on is not None),
                                    ("target", self.target is not None)) if given]
        if len(forms) != 1:
            raise ValueError("give the work as exactly one of: iterations; epochs with samples_per_epoch; "
                             f"seconds with seconds_on; target (got {', '.join(forms) or 'none'})")
        if forms == ["epochs"] and (self.epochs is None or self.samples_per_epoch is None):
            raise ValueError("epochs needs samples_per_epoch (and the reverse)")
        if forms == ["seconds"] and (self.seconds is None or self.seconds_on is None):
            raise ValueError("seconds needs seconds_on, the type it ran on (and the reverse)")
        if self.precision != ANY and self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; expected one of {', '.join(PRECISIONS)} or any")
        if self.precision == ANY and self.framework != ANY:
            raise ValueError("precision: any goes with framework: any (the framework-aware policy picks both)")
        return self


class TraceFile(_Strict):
    description: Annotated[str, Field(max_length=2000)] | None = None
    jobs: Annotated[list[JobSpec], Field(min_length=1, max_length=MAX_JOBS)]


@dataclass(frozen=True)
class Work:
    """How much a job has to do: `iterations` (an iteration: every worker one batch), or `seconds`
    on the type `on` (converted with that type's throughput when the matrix is known), or a
    convergence task's `target` (converted with the store's runs of the task, before the matrix)."""

    iterations: float | None = None
    seconds: float | None = None
    on: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class Job:
    id: str
    arrival_s: float
    network: str
    framework: str  # a runner's name or "any"
    precision: str  # a precision or "any"
    batch: int  # per worker
    workers: int
    work: Work
    weight: float = 1.0
    where: str = ""  # the file and field it came from, for messages

    @property
    def workload(self) -> tuple[str, int, str, str]:
        return (self.network, self.batch, self.precision, self.framework)


@dataclass
class Trace:
    jobs: list[Job]
    source: str
    notes: list[str] = field(default_factory=list)  # what a reader could not map, a limit taken


def job_of(spec: JobSpec, index: int, where: str) -> Job:
    if spec.iterations is not None:
        work = Work(iterations=float(spec.iterations))
    elif spec.epochs is not None:
        work = Work(iterations=float(math.ceil(spec.epochs * spec.samples_per_epoch / (spec.batch * spec.workers))))
    elif spec.target is not None:
        work = Work(target=spec.target)
    else:
        work = Work(seconds=spec.seconds, on=spec.seconds_on)
    return Job(spec.id or str(index), spec.arrival_s, spec.network, spec.framework, spec.precision, spec.batch,
               spec.workers, work, spec.weight, where)


def _check_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DefinitionError(path, "", f"cannot read: {e.strerror or e}") from None
    if size > MAX_BYTES:
        raise DefinitionError(path, "", f"{size / 2**20:.0f} MiB: a trace file may hold at most {MAX_BYTES // 2**20} MiB")


def too_many(path: Path | str, seen: int) -> DefinitionError:
    return DefinitionError(path, "jobs", f"more than {MAX_JOBS:,} jobs (read {seen:,} so far): the planner simulates "
                                         f"at most {MAX_JOBS:,}; --limit N takes the first N")


def load_trace(path: Path, limit: int | None = None) -> Trace:
    """dlbench's own trace (YAML or CSV), every job validated; one DefinitionError naming the file
    and the field (a CSV row by its line) when one is bad."""
    _check_size(path)
    lines = _count_lines(path)
    if path.suffix.lower() == ".csv":
        if limit is None and lines > MAX_JOBS + 1:
            raise too_many(path, lines - 1)
        return _load_csv(path, limit)
    if lines > MAX_YAML_LINES:
        raise DefinitionError(path, "", f"{lines:,} lines: a YAML trace may have at most {MAX_YAML_LINES:,}; "
                                        "write a larger one as CSV (one job per row)")
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise DefinitionError(path, "jobs", "expected a mapping with a list of jobs under `jobs`")
    notes = []
    rows = data["jobs"]
    if limit is not None and len(rows) > limit:
        notes.append(f"the first {limit:,} of {len(rows):,} jobs (--limit)")
        data = {**data, "jobs": rows[:limit]}
    elif len(rows) > MAX_JOBS:
        raise too_many(path, len(rows))
    try:
        spec = TraceFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise DefinitionError(path, _field_path(err["loc"]), msg) from None
    jobs = [job_of(j, i, f"{path}: jobs[{i}]") for i, j in enumerate(spec.jobs)]
    return Trace(jobs, str(path), notes)


def _count_lines(path: Path) -> int:
    count = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
    return count


def _read_yaml(path: Path):
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise DefinitionError(path, "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DefinitionError(path, "", "not UTF-8 text; save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise DefinitionError(path, "", f"invalid YAML: {where}{getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise DefinitionError(path, "", "invalid YAML: nested too deeply") from None
    seen, stack = 0, [data]
    while stack:  # aliases share nodes: count what validation would walk, and stop at the bound
        node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise DefinitionError(path, "", f"expands to more than {MAX_VALUES:,} values (nested aliases?)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return data


_NUMBERS = {"arrival_s": float, "batch": int, "workers": int, "iterations": int, "epochs": float,
            "samples_per_epoch": int, "seconds": float, "weight": float}


def _load_csv(path: Path, limit: int | None) -> Trace:
    jobs: list[Job] = []
    notes: list[str] = []
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise DefinitionError(path, "", f"cannot read: {e.strerror or e}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames or []
            unknown = [h for h in header if h not in JobSpec.model_fields]
            if unknown:
                raise DefinitionError(path, "line 1", f"unknown column {unknown[0]!r}; expected some of "
                                                      f"{', '.join(JobSpec.model_fields)}")
            for i, row in enumerate(reader):
                if limit is not None and i >= limit:
                    notes.append(f"the first {limit:,} jobs of the file (--limit)")
                    break
                if i >= MAX_JOBS:
                    raise too_many(path, i)
                line = reader.line_num
                values = {}
                for k, v in row.items():
                    if k is None:
                        raise DefinitionError(path, f"line {line}", "more values than the header has columns")
                    if v is None or v == "":
                        continue
                    try:
                        values[k] = _NUMBERS[k](v) if k in _NUMBERS else v
                    except ValueError:
                        raise DefinitionError(path, f"line {line}: {k}", f"not a number: {v!r}") from None
                try:
                    spec = JobSpec.model_validate(values)
                except ValidationError as e:
                    err = e.errors()[0]
                    msg = err["msg"].removeprefix("Value error, ")
                    where = f"line {line}" + (f": {_field_path(err['loc'])}" if err["loc"] else "")
                    raise DefinitionError(path, where, msg) from None
                jobs.append(job_of(spec, i, f"{path}: line {line}"))
        except UnicodeDecodeError:
            raise DefinitionError(path, "", "not UTF-8 text; save the file as UTF-8") from None
        except csv.Error as e:
            raise DefinitionError(path, f"line {reader.line_num}", f"invalid CSV: {e}") from None
    if not jobs:
        raise DefinitionError(path, "jobs", "no jobs in the file")
    return Trace(jobs, str(path), notes)
