"""Traces in formats people already have, read into planning/trace.py's jobs: Gavel's trace files and
Slurm's accounting (`sacct --parsable2`), and Gavel's throughput table. What a format cannot say is
named in the trace's notes, never guessed silently.

Gavel (Narayanan et al., OSDI 2020; github.com/stanford-futuredata/gavel, scheduler/utils.py and
scheduler/traces/): one job per line, tab-separated. Its current form has ten fields: job type (e.g.
`ResNet-50 (batch size 64)`), command, working directory, the steps argument, needs-data-dir, total
steps, scale factor (GPUs), priority weight, SLO, arrival time (s); its traces derived from
Microsoft's Philly trace (traces/msr/) have the older seven: job type, command, steps argument,
needs-data-dir, total steps, arrival time, scale factor. A job becomes: network = its job type (for
Gavel's own throughput table) or, with `networks`, the dlbench network its family maps to (a family
not mapped is dropped and counted in the notes); batch from `(batch size N)` (1 where the type has
none: A3C, CycleGAN); workers = scale factor; iterations = total steps; weight = priority weight.
Gavel's jobs are PyTorch programs: framework `torch`.

Gavel's throughput table (scheduler/simulation_throughputs.json): worker type -> `('<job type>',
<scale factor>)` -> `null` (the job alone on the worker, steps per second) and the job's throughput
beside each other job it could share the GPU with (space sharing, which this planner does not model:
those are left out).

Slurm (`sacct --parsable2 --allocations --format=JobID,JobName,Submit,ElapsedRaw,AllocTRES,State`):
`|`-separated with a header. A job becomes: arrival = Submit less the trace's first; workers = GPUs
of AllocTRES (`gres/gpu=4`, typed as `gres/gpu:h100=4`) or AllocGRES/ReqGRES (`gpu:h100:4`); the
work = ElapsedRaw (or Elapsed, [D-]HH:MM:SS) seconds on the GPU type named there (else
`default_type`); network = the job name where it is a dlbench network or starts with one and a
non-letter (`resnet50-train`), else by `names` (job name -> network). What sacct does not record
(batch, framework, precision) comes from the caller's defaults, and the notes say so. Job steps
(`123.batch`), jobs that never ran and jobs without a GPU are skipped and counted.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from ..definitions.loader import DefinitionError
from .trace import MAX_JOBS, Job, Trace, Work, _check_size, too_many

BATCH = re.compile(r"\(batch size (\d+)\)")


def gavel_family(job_type: str) -> str:
    """`ResNet-50 (batch size 64)` -> `ResNet-50`."""
    return BATCH.sub("", job_type).strip()


def _lines(path: Path, limit: int | None):
    _check_size(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise DefinitionError(path, "", f"cannot read: {e.strerror or e}") from None
    with handle:
        try:
            for n, line in enumerate(handle, 1):
                if limit is not None and n > limit:
                    return
                if n > MAX_JOBS + 1:
                    raise too_many(path, n - 1)
                yield n, line.rstrip("\n")
        except UnicodeDecodeError:
            raise DefinitionError(path, "", "not UTF-8 text") from None


def read_gavel(path: Path, networks: Mapping[str, str] | None = None, limit: int | None = None) -> Trace:
    """Gavel's trace file; `networks`: Gavel job family -> dlbench network (None: keep Gavel's job types)."""
    jobs: list[Job] = []
    dropped: Counter[str] = Counter()
    for n, line in _lines(path, limit):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            if len(fields) == 10:
                job_type, steps, scale, weight, arrival = fields[0], fields[5], fields[6], fields[7], fields[9]
            elif len(fields) == 7:
                job_type, steps, arrival, scale, weight = fields[0], fields[4], fields[5], fields[6], "1"
            else:
                raise DefinitionError(path, f"line {n}", f"{len(fields)} tab-separated fields; Gavel's traces have "
                                                         "10 (or 7, the Philly-derived ones)")
            total, workers, priority, at = int(steps), int(scale), float(weight), float(arrival)
        except ValueError as e:
            raise DefinitionError(path, f"line {n}", f"not a Gavel trace line: {e}") from None
        if total < 1 or workers < 1 or priority <= 0 or not 0 <= at < 1e12:
            raise DefinitionError(path, f"line {n}", "total steps, scale factor and priority weight must be positive, "
                                                     "the arrival time a time")
        found = BATCH.search(job_type)
        batch = int(found.group(1)) if found else 1
        network = job_type
        if networks is not None:
            family = gavel_family(job_type)
            if family not in networks:
                dropped[family] += 1
                continue
            network = networks[family]
        jobs.append(Job(str(len(jobs)), at, network, "torch", "fp32", batch, workers, Work(iterations=float(total)),
                        priority, f"{path}: line {n}"))
    notes = [f"Gavel job type {family!r} maps to no dlbench network: {count} job(s) left out"
             for family, count in sorted(dropped.items())]
    if limit is not None:
        notes.append(f"at most the first {limit:,} lines (--limit)")
    if not jobs:
        raise DefinitionError(path, "", "no job of this trace could be read" + (f" ({'; '.join(notes)})" if notes else ""))
    return Trace(jobs, str(path), notes)


def read_gavel_throughputs(path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """(job type, scale factor) -> worker type -> steps per second of the job alone on it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DefinitionError(path, "", f"not a readable JSON file: {e}") from None
    if not isinstance(data, dict):
        raise DefinitionError(path, "", "expected worker type -> job -> throughputs")
    table: dict[tuple[str, int], dict[str, float]] = {}
    for worker_type, jobs in data.items():
        if not isinstance(jobs, dict):
            raise DefinitionError(path, worker_type, "expected job -> throughputs")
        for key, entry in jobs.items():
            try:
                job_type, scale = ast.literal_eval(key)
                alone = float(entry["null"])
            except (ValueError, SyntaxError, TypeError, KeyError):
                raise DefinitionError(path, f"{worker_type}.{key}", "expected \"('<job type>', <scale factor>)\" "
                                                                    "with a `null` (alone) throughput") from None
            table.setdefault((str(job_type), int(scale)), {})[worker_type] = alone
    return table


SACCT_NEEDED = ("JobID", "JobName", "Submit")
_TRES_GPU = re.compile(r"gres/gpu(?::([A-Za-z0-9_.-]+))?=(\d+)")
_GRES_GPU = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?(?::(\d+))?")
_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")
RAN = ("COMPLETED", "TIMEOUT", "FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


def _gpus(row: Mapping[str, str]) -> tuple[int, str | None]:
    """(GPUs, their type or None) of an allocation: AllocTRES first (its typed entry where there is
    one), else AllocGRES or ReqGRES."""
    tres = row.get("AllocTRES") or row.get("ReqTRES") or ""
    found = _TRES_GPU.findall(tres)
    typed = [(t, int(c)) for t, c in found if t]
    if typed:
        return typed[0][1], typed[0][0]
    if found:
        return int(found[0][1]), None
    for column in ("AllocGRES", "ReqGRES", "Gres"):
        for entry in (row.get(column) or "").split(","):
            m = _GRES_GPU.fullmatch(entry.strip())
            if m and entry.strip():
                kind, count = m.group(1), m.group(2)
                if count is None and kind is not None and kind.isdigit():
                    kind, count = None, kind
                return int(count or 1), kind
    return 0, None


def _seconds(row: Mapping[str, str]) -> float | None:
    raw = (row.get("ElapsedRaw") or "").strip()
    if raw:
        return float(raw) if raw.isdigit() else None
    m = _ELAPSED.match((row.get("Elapsed") or "").strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def network_of_name(known: Callable[[str], bool], names: Mapping[str, str] | None) -> Callable[[str], str | None]:
    """job name -> network: `names` first, then a known network name, whole or as a prefix ended by a
    non-letter (`resnet50-train`, `resnet50_lr0.1`)."""
    def find(job_name: str) -> str | None:
        if names and job_name in names:
            return names[job_name]
        if known(job_name):
            return job_name
        for cut in range(len(job_name) - 1, 0, -1):
            if not job_name[cut].isalnum() and known(job_name[:cut]):
                return job_name[:cut]
        return None
    return find


def read_sacct(path: Path, known_network: Callable[[str], bool], *, names: Mapping[str, str] | None = None,
               types: Mapping[str, str] | None = None, default_type: str | None = None, batch: int = 32,
               framework: str = "any", precision: str = "fp32", limit: int | None = None) -> Trace:
    """`sacct --parsable2` output. `types`: Slurm GPU type -> the cluster's type name (same name when
    absent); `default_type`: the type of a job whose GRES names none."""
    rows = _lines(path, None if limit is None else limit + 1)
    try:
        _, header_line = next(rows)
    except StopIteration:
        raise DefinitionError(path, "", "empty file") from None
    header = header_line.split("|")
    missing = [c for c in SACCT_NEEDED if c not in header]
    if missing or not ({"ElapsedRaw", "Elapsed"} & set(header)):
        raise DefinitionError(path, "line 1", f"missing column(s) {', '.join(missing or ['ElapsedRaw or Elapsed'])}: "
                                              "run sacct --parsable2 --format=JobID,JobName,Submit,ElapsedRaw,AllocTRES,State")
    find = network_of_name(known_network, names)
    skipped: Counter[str] = Counter()
    unmapped: Counter[str] = Counter()
    raw_jobs = []
    for n, line in rows:
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(header):
            raise DefinitionError(path, f"line {n}", f"{len(values)} fields; the header has {len(header)}")
        row = dict(zip(header, values))
        if "." in row["JobID"]:
            skipped["job steps"] += 1
            continue
        state = (row.get("State") or "COMPLETED").split()[0]
        if state not in RAN:
            skipped[f"state {state}"] += 1
            continue
        gpus, kind = _gpus(row)
        if gpus == 0:
            skipped["no GPU"] += 1
            continue
        seconds = _seconds(row)
        if not seconds:
            skipped["no elapsed time"] += 1
            continue
        try:
            submitted = datetime.fromisoformat(row["Submit"])
        except ValueError:
            raise DefinitionError(path, f"line {n}: Submit", f"not a time: {row['Submit']!r}") from None
        network = find(row["JobName"])
        if network is None:
            unmapped[row["JobName"]] += 1
            continue
        on = (types or {}).get(kind, kind) if kind else default_type
        if on is None:
            skipped["a GPU of no type (give a default type)"] += 1
            continue
        raw_jobs.append((submitted, row["JobID"], network, gpus, seconds, on, n))
    if not raw_jobs:
        raise DefinitionError(path, "", "no job of this file could be read: " + _counted(skipped, unmapped))
    first = min(j[0] for j in raw_jobs)
    jobs = [Job(job_id, (at - first).total_seconds(), network, framework, precision, batch, gpus,
                Work(seconds=seconds, on=on), 1.0, f"{path}: line {n}")
            for at, job_id, network, gpus, seconds, on, n in raw_jobs]
    notes = [f"not in sacct, taken as given: batch {batch} per GPU, framework {framework}, precision {precision}"]
    if skipped or unmapped:
        notes.append("left out: " + _counted(skipped, unmapped))
    return Trace(jobs, str(path), notes)


def _counted(skipped: Counter, unmapped: Counter) -> str:
    parts = [f"{count} ({why})" for why, count in sorted(skipped.items())]
    if unmapped:
        parts.append(f"{sum(unmapped.values())} whose job name maps to no network "
                     f"({', '.join(sorted(unmapped)[:5])}{', ...' if len(unmapped) > 5 else ''})")
    return "; ".join(parts) or "nothing"
