"""The throughput matrix: how many iterations per second each job makes on each device type, and where
that number came from.

A cell is one (network, per-worker batch, precision, framework, workers, type). Its number comes from
the first source that has it:

- `measured`: a run of that network, batch, precision and framework in the store, on the machine the
  type names (a one-worker run; more workers add the communication below to its time). Its
  uncertainty is the half-width of the run's reported interval of the median, relative.
- `calibrated` / `datasheet`: the performance model (performance/model.py) from the type's machine
  profile, a calibrated one or a datasheet's. A calibrated cell's uncertainty is the median relative
  error of that machine's stored predictions against its measured runs, where the store has any; a
  datasheet cell's is the same for runs of that board, and is stated as unvalidated (None) where the
  store has none, which is the usual case for hardware one does not own.
- `table`: a throughput table read from elsewhere (Gavel's, planning/readers.py), keyed by its job
  types and scale factors; its numbers carry no uncertainty of their own (None, said so).

Multi-worker jobs (synchronous data parallel, the batch per worker) are the one-worker computation
plus the gradient communication the backward does not hide (performance/communication.py: ring
all-reduce under the framework's schedule, WFBP or MG-WFBP), over the link of the placement: packed
in one node (the type's `link`, else its datasheet's node link), or spread over several nodes, the
ring crossing the cluster's `network` (its bottleneck). A job larger than a node is always spread; one
that fits a node has both cells, packed and spread (`spread=True`), and the simulator
(planning/simulator.py) gives it the spread one when no single node has room for it (fragmentation).
A throughput table (Gavel's) has one number per job and worker count: both placements take it.

`framework: any` (with `precision: any`) jobs have a cell per framework and precision; a framework
whose stored equivalence check of the network failed (mismatch or failed) is not one of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..performance.communication import AllReduceCost, schedule
from ..performance.model import FrameworkFacts, PredictionError, gradient_layers, predict
from ..performance.workload import decompose
from ..store.profiles import MachineProfile
from .cluster import Cluster, DeviceType
from .trace import ANY, Job

SOURCES = ("measured", "calibrated", "datasheet", "table")


@dataclass(frozen=True)
class Cell:
    iterations_per_s: float | None  # None: cannot run there (the reason in `note`)
    source: str  # one of SOURCES, or "" when it cannot run
    framework: str
    precision: str
    placement: str  # one (a single device), packed (one node), spread (several nodes)
    uncertainty: float | None = None  # relative half-width; None: not known (`basis` says why)
    basis: str = ""
    note: str = ""

    def to_dict(self) -> dict:
        return {"iterations_per_s": self.iterations_per_s, "source": self.source, "framework": self.framework,
                "precision": self.precision, "placement": self.placement, "uncertainty": self.uncertainty,
                "basis": self.basis, "note": self.note}


@dataclass(frozen=True)
class Measured:
    """A stored one-worker run: its seconds per iteration and the relative half-width of its interval."""

    iteration_s: float
    uncertainty: float | None
    run_id: str


@dataclass
class Sources:
    """What the matrix is built from; the workflow gathers it (store, catalog, runners)."""

    networks: Mapping[str, dict] = field(default_factory=dict)  # network -> resolved network
    profiles: Mapping[str, MachineProfile] = field(default_factory=dict)  # type -> its machine's profile
    facts: Mapping[str, FrameworkFacts] = field(default_factory=dict)  # frameworks the plan may run
    # (network, batch, precision, framework, type) -> a stored run on that type's machine
    measured: Mapping[tuple[str, int, str, str, str], Measured] = field(default_factory=dict)
    # type -> (median relative error of its profile's predictions, how many runs; None when none)
    validation: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # network -> frameworks whose stored equivalence check of it failed
    not_equivalent: Mapping[str, set[str]] = field(default_factory=dict)
    table: Mapping[tuple[str, int], Mapping[str, float]] | None = None  # (job type, workers) -> type -> it/s
    precisions: tuple[str, ...] = ("fp32",)  # what `precision: any` may choose from


class ThroughputMatrix:
    """Cells computed once each, on demand (a trace has few distinct workloads)."""

    def __init__(self, cluster: Cluster, sources: Sources):
        self.cluster = cluster
        self.sources = sources
        self.cells: dict[tuple, Cell] = {}
        self._predictions: dict[tuple, object] = {}
        self._work: dict[tuple, object] = {}

    # ---- the choices a job has
    def choices(self, job: Job, pinned: str | None) -> list[tuple[str, str]]:
        """(framework, precision) a job may run in: its own, or for `any` every framework (less those
        not equivalent on its network) and precision; with `pinned` that framework in every precision
        (a single-framework plan still picks the precision: the framework is what it does not pick)."""
        if self.sources.table is not None:
            return [(job.framework if job.framework != ANY else "torch", job.precision if job.precision != ANY else "fp32")]
        if job.framework != ANY:
            return [(job.framework, job.precision)]
        precisions = list(self.sources.precisions) if job.precision == ANY else [job.precision]
        if pinned is not None:  # one framework for every such job; its precision still the fastest
            return [(pinned, p) for p in precisions]
        excluded = self.sources.not_equivalent.get(job.network, set())
        return [(fw, p) for fw in self.sources.facts if fw not in excluded for p in precisions]

    def cell(self, job: Job, framework: str, precision: str, kind: DeviceType, workers: int | None = None,
             spread: bool = False) -> Cell:
        """The cell of the job's workload in one framework and precision on `kind`: packed in one node
        where it fits one, else (or with `spread`) spread over nodes."""
        workers = workers or job.workers
        placement = self._placement(workers, kind, spread)
        key = (job.network, job.batch, precision, framework, workers, kind.name, placement)
        found = self.cells.get(key)
        if found is None:
            found = self.cells[key] = self._compute(job.network, job.batch, precision, framework, workers, kind,
                                                    placement)
        return found

    def best(self, job: Job, kind: DeviceType, pinned: str | None = None) -> Cell:
        """The fastest of the job's choices on `kind` (framework-aware), or its one choice."""
        cells = [self.cell(job, fw, p, kind) for fw, p in self.choices(job, pinned)]
        running = [c for c in cells if c.iterations_per_s]
        if not running:
            return cells[0] if len(cells) == 1 else Cell(None, "", cells[0].framework, cells[0].precision, "",
                                                         note="; ".join(sorted({c.note for c in cells if c.note})))
        return max(running, key=lambda c: c.iterations_per_s)

    # ---- one cell
    def _placement(self, workers: int, kind: DeviceType, spread: bool = False) -> str:
        if workers == 1:
            return "one"
        return "packed" if workers <= kind.per_node and not spread else "spread"

    def _compute(self, network: str, batch: int, precision: str, framework: str, workers: int,
                 kind: DeviceType, placement: str) -> Cell:
        if workers > kind.count and kind.count > 0:
            return Cell(None, "", framework, precision, placement, note=f"{workers} workers; {kind.name} has {kind.count}")
        if self.sources.table is not None:
            return self._from_table(network, workers, kind, framework, precision, placement)
        profile = self.sources.profiles.get(kind.name)
        if profile is None:
            return Cell(None, "", framework, precision, placement, note=f"type {kind.name} names no machine")
        facts = self.sources.facts.get(framework)
        if facts is None:
            return Cell(None, "", framework, precision, placement, note=f"no runner {framework!r}")
        try:
            one = self._prediction(network, batch, precision, framework, kind.name, profile, facts)
        except (PredictionError, ValueError) as e:
            return Cell(None, "", framework, precision, placement, note=str(e))
        measured = self.sources.measured.get((network, batch, precision, framework, kind.name))
        if measured is not None:
            compute_s, source = measured.iteration_s, "measured"
            uncertainty, basis = measured.uncertainty, f"the interval of the median of run {measured.run_id}"
        else:
            compute_s, source = one.iteration_s, profile.source if profile.source == "datasheet" else "calibrated"
            validated = self.sources.validation.get(kind.name)
            if validated is not None:
                uncertainty, basis = validated[0], f"median error of {validated[1]} stored predictions of this machine"
            else:
                uncertainty, basis = None, "unvalidated: no measured run of this machine in the store"
        note = ""
        if workers > 1:
            cost, why = self._all_reduce(workers, kind, profile, framework, placement == "spread")
            if cost is None:
                return Cell(None, "", framework, precision, placement, note=why)
            t_b, p = gradient_layers(one.layers)
            scale = compute_s / one.iteration_s if one.iteration_s > 0 else 1.0
            sched = schedule(facts.schedule, [t * scale for t in t_b], p, cost)
            compute_s += sched.exposed
            note = f"{why}; {sched.exposed * 1e3:.3g} ms of communication not hidden ({facts.schedule})"
        if not compute_s > 0 or not math.isfinite(compute_s):
            return Cell(None, "", framework, precision, placement, note="no positive time predicted")
        return Cell(1.0 / compute_s, source, framework, precision, placement, uncertainty, basis, note)

    def _prediction(self, network: str, batch: int, precision: str, framework: str, type_name: str,
                    profile: MachineProfile, facts: FrameworkFacts):
        key = (network, batch, precision, framework, type_name)
        if key not in self._predictions:
            resolved = self.sources.networks.get(network)
            if resolved is None:
                raise ValueError(f"unknown network {network!r}")
            wkey = (network, batch, precision)
            if wkey not in self._work:
                self._work[wkey] = decompose(resolved, batch, "train", precision)
            try:
                self._predictions[key] = predict(self._work[wkey], framework, profile, 1, facts=facts)
            except (PredictionError, ValueError) as e:
                self._predictions[key] = e
        found = self._predictions[key]
        if isinstance(found, Exception):
            raise found
        return found

    def _all_reduce(self, workers: int, kind: DeviceType, profile: MachineProfile,
                    framework: str, spread: bool) -> tuple[AllReduceCost | None, str]:
        if spread:
            net = self.cluster.network
            if net is None:
                return None, f"{workers} workers spread over nodes; the cluster file gives no network"
            return (AllReduceCost.ring(net.alpha_s, net.beta_s_per_byte, workers),
                    f"ring over the network between nodes ({net.gb_per_s:g} GB/s, α {net.alpha_us:g} µs)")
        if kind.link is not None:
            return (AllReduceCost.ring(kind.link.alpha_s, kind.link.beta_s_per_byte, workers),
                    f"ring inside a node ({kind.link.gb_per_s:g} GB/s, α {kind.link.alpha_us:g} µs)")
        fit = profile.comm_fit(framework, workers) or next((c for c in profile.comm if c.workers == workers), None)
        if fit is None or fit.workers != workers:
            return None, f"no link inside a {kind.name} node: give the type a `link`"
        return AllReduceCost(workers, fit.startup_s, fit.per_byte_s), f"the {profile.ref} node's all-reduce"

    def _from_table(self, network: str, workers: int, kind: DeviceType, framework: str, precision: str,
                    placement: str) -> Cell:
        row = self.sources.table.get((network, workers))
        if row is None:
            return Cell(None, "", framework, precision, placement, note=f"no throughput of {network!r} x{workers} in the table")
        value = row.get(kind.name)
        if not value:
            return Cell(None, "", framework, precision, placement, note=f"the table has no {kind.name} throughput")
        return Cell(value, "table", framework, precision, placement, None, "a published table: no interval given")

    # ---- output
    def rows(self) -> list[dict]:
        """Every cell computed, as rows (the plan's --format json and the report's matrix table)."""
        out = []
        for (network, batch, precision, framework, workers, type_name, _), c in sorted(self.cells.items()):
            out.append({"network": network, "batch": batch, "workers": workers, "type": type_name, **c.to_dict()})
        return out


def throughput_vectors(matrix: ThroughputMatrix, jobs: Iterable[Job], pinned: str | None,
                       aware: bool = True) -> tuple[list[list[float]], list[list[Cell | None]], list[list[float]]]:
    """Per job, its iterations per second on each type in the cluster's order (0 where it cannot run),
    the cell chosen (the fastest of its choices when `aware`, the framework-aware placement, else its
    pinned one), and its iterations per second there when spread over nodes in that framework and
    precision (the same where it cannot be packed anyway, or runs on one device)."""
    kinds = matrix.cluster.types
    speeds, chosen, spread = [], [], []
    for job in jobs:
        row, cells, apart = [], [], []
        for kind in kinds:
            c = matrix.best(job, kind, None if aware else pinned)
            row.append(c.iterations_per_s or 0.0)
            cells.append(c)
            if c.placement == "packed":
                other = matrix.cell(job, c.framework, c.precision, kind, spread=True)
                apart.append(other.iterations_per_s or 0.0)
            else:
                apart.append(row[-1])
        speeds.append(row)
        chosen.append(cells)
        spread.append(apart)
    return speeds, chosen, spread


def work_iterations(job: Job, speed_on: Callable[[str], float]) -> float | None:
    """A job's iterations: given, or its seconds on the type it ran on times that type's speed."""
    if job.work.iterations is not None:
        return job.work.iterations
    speed = speed_on(job.work.on)
    return job.work.seconds * speed if speed else None
