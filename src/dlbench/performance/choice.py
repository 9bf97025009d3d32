"""Which machine for this job: each benchmark predicted for several frameworks on several machines and
worker counts, ranked.

`compare_machines` predicts every (benchmark, batch) of a suite for every framework given, on every
machine profile given (a calibrated one, or a datasheet's: performance/datasheet.py) at every worker
count, and returns one row per prediction: iteration time, samples per second (workers x per-worker
batch / iteration) and, where the profile states the board's power, the energy per sample (power x
workers x iteration / (workers x batch): the board at its maximum power the whole iteration, so an
upper bound). Rows are ranked per benchmark, batch and precision by samples per second, fastest
first (equal predictions share a rank), over every framework, machine and worker count (a
framework's step kind changes its time: an eager step pays a launch per operation, a compiled one
per iteration); a prediction the profile cannot make (a precision its datasheet gives no rate for,
more workers than one node holds) is a row with its reason and no rank, after the ranked ones.

The rows are plain data (`ChoiceRow.to_dict`): the CLI prints them as a table (`dlbench predict
--suite S --machine A --machine B`), and a scheduler can consume them as they are. Inference runs
exchange no gradients, so they are predicted at one worker only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from ..store.profiles import MachineProfile
from .datasheet import board_power_w
from .model import FrameworkFacts, PredictionError, predict
from .workload import decompose


@dataclass(frozen=True)
class Job:
    """One benchmark at one per-worker batch: what is predicted on each machine."""

    benchmark: str
    network: dict  # the resolved network (definitions/network.py)
    batch: int  # per worker
    mode: str
    precision: str = "fp32"


@dataclass
class ChoiceRow:
    benchmark: str
    batch: int  # per worker
    precision: str
    framework: str
    machine: str  # the profile's ref (datasheet:<name>, or <machine id>@<revision>)
    source: str  # datasheet | measured
    workers: int
    iteration_s: float | None = None
    samples_per_s: float | None = None
    power_w: float | None = None  # all workers' boards at their maximum
    energy_per_sample_j: float | None = None
    rank: int | None = None  # 1 = the most samples per second for this benchmark, batch and precision
    error: str | None = None  # why this machine cannot be predicted for it
    # the share of the predicted time from each source (model.SOURCES: shape, class, ceilings, datasheet)
    sources: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def compare_machines(jobs: Iterable[Job], frameworks: Mapping[str, FrameworkFacts | None],
                     profiles: Iterable[MachineProfile], workers: Iterable[int] = (1,),
                     schedule: str | None = None) -> list[ChoiceRow]:
    """Every job in every framework (name: its runner's model facts) on every profile at every worker
    count, ranked per (benchmark, batch, precision)."""
    profiles, counts = list(profiles), sorted(set(workers))
    groups: dict[tuple[str, int, str], list[ChoiceRow]] = {}
    for job in jobs:
        work = decompose(job.network, job.batch, job.mode, job.precision)
        rows = groups.setdefault((job.benchmark, job.batch, job.precision), [])
        for framework, facts in frameworks.items():
            for profile in profiles:
                for n in counts:
                    if n > 1 and job.mode != "train":
                        continue
                    rows.append(_row(job, work, framework, facts, profile, n, schedule))
    out: list[ChoiceRow] = []
    for rows in groups.values():
        ranked = sorted((r for r in rows if r.samples_per_s is not None), key=lambda r: -r.samples_per_s)
        for i, r in enumerate(ranked, 1):  # a tie shares the rank of the first of it (1, 1, 3)
            tied = i > 1 and math.isclose(r.samples_per_s, ranked[i - 2].samples_per_s, rel_tol=1e-9)
            r.rank = ranked[i - 2].rank if tied else i
        out += ranked + [r for r in rows if r.samples_per_s is None]
    return out


def _row(job: Job, work, framework: str, facts: FrameworkFacts | None, profile: MachineProfile, n: int,
         schedule: str | None) -> ChoiceRow:
    row = ChoiceRow(job.benchmark, job.batch, job.precision, framework, profile.ref, profile.source, n)
    try:
        p = predict(work, framework, profile, n, schedule, facts=facts)
    except (PredictionError, ValueError) as e:
        row.error = str(e)
        return row
    row.iteration_s = p.iteration_s
    row.sources = p.source_shares
    row.samples_per_s = n * job.batch / p.iteration_s if p.iteration_s > 0 else None
    board = board_power_w(profile)
    if board is not None:
        row.power_w = n * board
        row.energy_per_sample_j = row.power_w * p.iteration_s / (n * job.batch)
    return row


def jobs_of_suite(benchmarks: Iterable, batches: Mapping[str, Iterable[int]] | None = None) -> list[Job]:
    """The jobs of a suite's Benchmark objects (definitions/suite.py): one per batch size."""
    out = []
    for b in benchmarks:
        for batch in (batches or {}).get(b.name, b.batch_sizes):
            out.append(Job(b.name, b.network.resolved, batch, b.mode, b.precision))
    return out
