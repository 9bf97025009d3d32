"""`plan`: a job trace simulated on a cluster under each scheduling policy, from the throughput matrix
dlbench measures and predicts (src/dlbench/planning/). Printing nothing: the command line
(cli/plan.py) renders what it returns, the report page (reporting/plan_page.py) charts it.

    from dlbench.workflows.planning import PlanRequest, plan
    result = plan(PlanRequest(cluster=Path("cluster.yaml"), trace=Path("jobs.yaml")))
    for s in result.summaries: print(s.policy, s.average_jct_s, s.makespan_s)

Bad input (a file, a field, an unknown network or machine, a job that fits nowhere, a what-if that
names no type) is one RequestError naming it, raised before anything is simulated.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..axes import PRECISIONS
from ..definitions.loader import DefinitionError
from ..machine import fingerprint
from ..planning.cluster import Cluster, load_cluster
from ..planning.matrix import Measured, Sources, ThroughputMatrix, throughput_vectors, work_iterations
from ..planning.metrics import Summary, summarise
from ..planning.policies import LP_POLICIES, POLICIES, InfeasibleError, policy
from ..planning.readers import read_gavel, read_gavel_throughputs, read_sacct
from ..planning.simulator import MAX_ROUNDS, Simulation, simulate
from ..planning.trace import ANY, Job, Trace, Work, load_trace
from . import lookup
from .suite_kinds import RequestError

TRACE_FORMATS = ("dlbench", "gavel", "sacct")

# Gavel's job families (its workloads, scheduler/workloads/ of its repository) -> the dlbench network
# closest to each, for running Gavel's traces on dlbench's matrix. Each is an approximation, said so:
GAVEL_NETWORKS = {
    "ResNet-50": "resnet50",  # the same network (ImageNet, 224x224)
    "ResNet-18": "resnet56",  # Gavel's CIFAR-10 ResNet-18 -> dlbench's CIFAR ResNet-56 (deeper, thinner)
    "Transformer": "transformer_tiny",  # Gavel's translation Transformer (Multi30k) -> the smallest transformer
    "LM": "lstm32",  # Gavel's LSTM language model (WikiText-2) -> an LSTM of 32 time steps
    "Recommendation": "fcn5",  # Gavel's autoencoder recommender (ML-20M) -> a fully connected network
}  # CycleGAN and A3C have no counterpart: such jobs are left out, and the trace's notes count them


@dataclass(frozen=True)
class PlanRequest:
    """`dlbench plan`'s options. `trace_format`: dlbench (YAML or CSV), gavel or sacct. `throughputs`:
    Gavel's throughput table (its types are then the cluster's type names, and jobs keep Gavel's
    job types); without one a Gavel trace's jobs map to dlbench networks (GAVEL_NETWORKS).
    `framework`: what `framework: any` jobs run in under every policy but the framework-aware one
    (None: the single framework fastest over the trace's such jobs). `what_if`: changes to the
    cluster ("add 8 h200", "remove 4 l4", "replace l4 with h100"), each simulated again."""

    cluster: Path
    trace: Path
    trace_format: str = "dlbench"
    throughputs: Path | None = None
    policies: list[str] | None = None
    framework: str | None = None
    seed: int = 0
    what_if: list[str] | None = None
    limit: int | None = None
    sacct_batch: int = 32
    sacct_type: str | None = None
    max_rounds: int = MAX_ROUNDS
    store: Path | None = None
    measure: tuple[int, int] | None = None  # jobs first..last (trace order, both included): a steady-state window


@dataclass
class PolicyRun:
    summary: Summary
    simulation: Simulation
    seconds: float  # the simulation's wall time (the LP solves included)
    cpu_seconds: float = 0.0  # the process's CPU time over it (less swayed by a busy machine)


@dataclass
class WhatIf:
    question: str
    cluster: Cluster
    runs: list[PolicyRun]


@dataclass
class PlanResult:
    cluster: Cluster
    trace: Trace
    jobs: list[Job]
    matrix: list[dict]  # every cell computed (planning/matrix.py Cell rows)
    runs: list[PolicyRun]
    pinned: str | None  # the framework of `any` jobs under the other policies
    what_if: list[WhatIf] = field(default_factory=list)
    matrix_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def summaries(self) -> list[Summary]:
        return [r.summary for r in self.runs]

    def to_dict(self) -> dict:
        return {
            "cluster": {"name": self.cluster.name, "types": [
                {"name": t.name, "machine": t.machine, "devices": t.count, "per_node": t.per_node,
                 "price_per_hour": t.price_per_hour} for t in self.cluster.types],
                "round_s": self.cluster.round_s, "preemption_s": self.cluster.preemption_s},
            "trace": {"source": self.trace.source, "jobs": len(self.jobs), "notes": self.trace.notes},
            "framework_for_any": self.pinned,
            "policies": [dict(r.summary.to_dict(), simulate_s=r.seconds, simulate_cpu_s=r.cpu_seconds)
                         for r in self.runs],
            "what_if": [{"question": w.question, "policies": [dict(r.summary.to_dict(), simulate_s=r.seconds)
                                                              for r in w.runs]} for w in self.what_if],
            "matrix": self.matrix, "matrix_s": self.matrix_s, "notes": self.notes}


def _refused(e: DefinitionError) -> RequestError:
    return RequestError(str(e))


def read_trace(request: PlanRequest, known_network) -> Trace:
    r = request
    lookup.check_choice("trace format", r.trace_format, list(TRACE_FORMATS))
    if not r.trace.is_file():
        raise RequestError(f"no trace file {r.trace}")
    try:
        if r.trace_format == "gavel":
            return read_gavel(r.trace, None if r.throughputs else GAVEL_NETWORKS, r.limit)
        if r.trace_format == "sacct":
            return read_sacct(r.trace, known_network, default_type=r.sacct_type, batch=r.sacct_batch, limit=r.limit)
        return load_trace(r.trace, r.limit)
    except DefinitionError as e:
        raise _refused(e) from None


def _networks(jobs: list[Job]) -> dict[str, dict]:
    from ..definitions.loader import load_network

    catalog = lookup.catalog()
    out: dict[str, dict] = {}
    for job in jobs:
        if job.network in out:
            continue
        path = catalog.networks_dir / f"{job.network}.yaml"
        if not path.is_file():
            candidate = Path(job.network)
            if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
                path = candidate
            else:
                raise RequestError(f"{job.where}: network: unknown network {job.network!r}; valid networks: "
                                   f"{', '.join(catalog.network_names())} (or a path to a .yaml file)")
        try:
            out[job.network] = load_network(path).resolved
        except DefinitionError as e:
            raise _refused(e) from None
    return out


def _profiles(cluster: Cluster, store, frameworks: list[str]) -> dict:
    from ..performance.datasheet import DatasheetMachines
    from ..store.profiles import ProfileError, ProfileStore

    catalog = lookup.catalog()
    machines = DatasheetMachines(catalog.machines_dir)
    out = {}
    for t in cluster.types:
        where = f"{cluster.source}: types.{t.name}.machine"
        if t.machine is None:
            raise RequestError(f"{where}: the type names no machine; give a datasheet machine "
                               f"({', '.join(machines.names())}) or profile:<machine> (or plan with --throughputs)")
        if t.machine.startswith("profile:"):
            spec = t.machine.removeprefix("profile:")
            try:
                out[t.name] = ProfileStore(store).resolve(None if spec == "this" else spec, fingerprint()["machine_id"])
            except ProfileError as e:
                raise RequestError(f"{where}: {e}") from None
        elif t.machine in machines.names():
            try:
                out[t.name] = machines.profile(t.machine, frameworks)
            except DefinitionError as e:
                raise _refused(e) from None
        else:
            raise RequestError(f"{where}: unknown machine {t.machine!r}; datasheet machines: "
                               f"{', '.join(machines.names())}, or profile:<machine id, hostname or this>")
    return out


def _from_store(store, cluster: Cluster, profiles: dict) -> tuple[dict, dict, dict, list[str]]:
    """The one-worker training runs of the store on each type's machine (the latest per workload),
    each calibrated type's and board's prediction error, and the frameworks whose runs of a
    network failed its equivalence check."""
    from ..performance.accuracy import datasheet_matcher, prediction_errors
    from ..performance.datasheet import DatasheetMachines
    from ..store.rows import run_row

    records = [r for r in store.records([]) if r.status == "ok" and r.workload.mode == "train"
               and r.summary is not None and (r.distributed is None or r.distributed.workers == 1)]
    machines = DatasheetMachines(lookup.catalog().machines_dir)
    match = datasheet_matcher({name: machines.sheet(name).gpu_names for name in machines.names()})
    by_type: dict[str, list] = {}
    for r in records:
        for t in cluster.types:
            p = profiles[t.name]
            mine = (match(r.machine) == p.machine_id if p.source == "datasheet"
                    else r.machine.get("machine_id") == p.machine_id and r.workload.device == p.device)
            if mine:
                by_type.setdefault(t.name, []).append(r)
    measured: dict = {}
    for type_name, runs in by_type.items():
        for r in sorted(runs, key=lambda r: r.started_at):
            row = run_row(r)
            if not row["ms_per_iter"]:
                continue
            half = ((row["ci_high_ms"] - row["ci_low_ms"]) / 2 / row["ms_per_iter"]
                    if row["ci_high_ms"] is not None and row["ci_low_ms"] is not None else None)
            measured[(r.network.name, r.workload.batch_size, r.workload.precision, row["framework"], type_name)] = \
                Measured(row["ms_per_iter"] / 1e3, half, r.run_id)
    validation: dict = {}
    for type_name, runs in by_type.items():
        p = profiles[type_name]
        if p.source == "datasheet":
            rows = prediction_errors(runs, datasheets={p.machine_id: p}, match_datasheet=match)
            errors = [abs(x["datasheet_error"]) for x in rows if x.get("datasheet_error") is not None]
        else:
            errors = [abs(x["error"]) for x in prediction_errors(runs) if x.get("error") is not None]
        if errors:
            validation[type_name] = (statistics.median(errors), len(errors))
    not_equivalent: dict = {}
    for r in records:
        if r.equivalence.get("status") in ("mismatch", "failed"):
            not_equivalent.setdefault(r.network.name, set()).add(r.framework.get("name"))
    notes = [f"{len(measured)} measured workload(s) from the store" if measured else
             "no measured run in the store matches a type's machine: every cell is predicted"]
    return measured, validation, not_equivalent, notes


def _steps_to_target(record) -> tuple[float, float, float] | None:
    """(iterations, epochs to target, steps per epoch) of a stored convergence record that reached its
    target: the score's epochs to target (the mean over its scored seeds) times the steps its runs
    trained per epoch (their steps over their epochs: what the loader made of the dataset and batch)."""
    c = record.convergence
    if c is None or record.status != "ok" or c.epochs_to_target is None:
        return None
    per_epoch = [run.steps / run.epochs for run in c.runs if run.status == "ok" and run.steps and run.epochs]
    if not per_epoch:
        return None
    steps = statistics.median(per_epoch)
    return c.epochs_to_target * steps, c.epochs_to_target, steps


def iterations_to_target(jobs: list[Job], store) -> tuple[list[Job], list[str]]:
    """The jobs whose work is a convergence task's target, with that work in iterations: the iterations
    the store's latest run of the task per framework took to reach it (_steps_to_target). A job in one
    framework takes that framework's run where the store has one; a `framework: any` job, or one whose
    framework has none, the median over the frameworks that have one, which the notes say (the same
    network, data, optimiser and batch in another framework: an estimate, stated). The job must be
    the task's network at the task's batch (workers x batch): other batches converge otherwise, and are
    refused. A task with no run that reached its target is one RequestError naming the job."""
    tasks = {j.work.target for j in jobs if j.work.target is not None}
    runs: dict[str, dict[str, tuple]] = {}  # task -> framework -> (iterations, epochs, steps/epoch, record)
    for record in sorted((r for r in store.records([]) if r.convergence is not None and r.convergence.task in tasks),
                         key=lambda r: r.started_at):
        counted = _steps_to_target(record)
        if counted is not None:  # the latest run per framework wins
            runs.setdefault(record.convergence.task, {})[record.framework.get("name")] = (*counted, record)
    out, used = [], Counter()
    for job in jobs:
        task = job.work.target
        if task is None:
            out.append(job)
            continue
        per_framework = runs.get(task)
        if not per_framework:
            raise RequestError(f"{job.where}: target: no run of convergence task {task!r} in the store {store.root} "
                               "reached its target, so its iterations are not known: run the task first (dlbench run "
                               "--suite <its convergence suite>), or give the job's work as iterations or epochs")
        some = next(iter(per_framework.values()))[3]
        network, batch = some.network.name, some.convergence.batch_size
        if job.network != network:
            raise RequestError(f"{job.where}: network: convergence task {task!r} trains {network}, not {job.network}")
        if job.batch * job.workers != batch:
            raise RequestError(f"{job.where}: batch: convergence task {task!r} reached its target at a batch of {batch}; "
                               f"this job's is {job.workers} x {job.batch} (another batch converges in other iterations)")
        if job.framework in per_framework:
            iterations, epochs, steps, record = per_framework[job.framework]
            basis = f"{job.framework}'s run {record.run_id}: {epochs:g} epochs x {steps:g} steps"
        else:
            iterations = statistics.median(v[0] for v in per_framework.values())
            basis = (f"the median of {', '.join(sorted(per_framework))}'s runs (" +
                     "; ".join(f"{fw} {v[1]:g} epochs x {v[2]:g} steps" for fw, v in sorted(per_framework.items())) +
                     ")" + ("" if job.framework == ANY else f", {job.framework} having none: an estimate"))
        used[(task, math.ceil(iterations), basis)] += 1
        out.append(replace(job, work=Work(iterations=float(math.ceil(iterations)))))
    notes = [f"{count} job(s) train to convergence task {task}'s target: {iterations:,} iterations, from {basis}"
             for (task, iterations, basis), count in sorted(used.items())]
    return out, notes


def _apply_what_if(cluster: Cluster, question: str) -> Cluster:
    words = question.lower().split()
    names = cluster.names
    def kind(name: str):
        if name not in names:
            raise RequestError(f"--what-if {question!r}: no type {name!r} in the cluster file (types: {', '.join(names)}; "
                               "a type with nodes: 0 can be added to)")
        return cluster.type(name)
    if len(words) == 3 and words[0] in ("add", "remove") and words[1].isdigit():
        t, count = kind(words[2]), int(words[1])
        nodes = math.ceil(count / t.per_node)
        if words[0] == "remove" and nodes > t.nodes:
            raise RequestError(f"--what-if {question!r}: {t.name} has only {t.count} devices")
        changed = cluster.with_type(replace(t, nodes=t.nodes + (nodes if words[0] == "add" else -nodes)))
    elif len(words) == 4 and words[0] == "replace" and words[2] == "with":
        old, new = kind(words[1]), kind(words[3])
        changed = cluster.with_type(replace(old, nodes=0))
        changed = changed.with_type(replace(new, nodes=new.nodes + math.ceil(old.count / new.per_node)))
    else:
        raise RequestError(f"--what-if {question!r}: expected 'add N TYPE', 'remove N TYPE' or 'replace TYPE with TYPE'")
    if changed.devices == 0:
        raise RequestError(f"--what-if {question!r} leaves the cluster with no devices")
    return changed


def plan(request: PlanRequest) -> PlanResult:
    r = request
    names = list(r.policies or POLICIES)
    for name in names:
        lookup.check_choice("policy", name, list(POLICIES))
    if r.limit is not None and r.limit < 1:
        raise RequestError("--limit must be at least 1")
    try:
        cluster = load_cluster(r.cluster)
    except DefinitionError as e:
        raise _refused(e) from None
    questions = [(q, _apply_what_if(cluster, q)) for q in r.what_if or []]
    registry = lookup.registry()
    frameworks = registry.names()
    if r.framework is not None:
        lookup.check_choice("framework", r.framework, frameworks)
    catalog = lookup.catalog()
    table = None
    if r.throughputs is not None:
        try:
            table = read_gavel_throughputs(r.throughputs)
        except DefinitionError as e:
            raise _refused(e) from None
    trace = read_trace(r, lambda n: (catalog.networks_dir / f"{n}.yaml").is_file())
    jobs = trace.jobs
    notes: list[str] = []
    if any(j.work.target is not None for j in jobs):
        jobs, found = iterations_to_target(jobs, lookup.open_store(r.store))
        notes += found
    if table is not None:
        known_types = {t for row in table.values() for t in row}
        missing = [t.name for t in cluster.types if t.name not in known_types]
        if missing:
            raise RequestError(f"{cluster.source}: types: {', '.join(missing)} not in the throughput table "
                               f"{r.throughputs} (its types: {', '.join(sorted(known_types))})")
        absent = Counter((j.network, j.workers) for j in jobs if (j.network, j.workers) not in table)
        if absent:  # left out and named, as a reader leaves out what it cannot map
            jobs = [j for j in jobs if (j.network, j.workers) in table]
            trace.notes.append(f"{sum(absent.values())} job(s) left out, the table having no throughput for them: "
                               + ", ".join(f"{n} x{w} ({c})" for (n, w), c in sorted(absent.items())))
            if not jobs:
                raise RequestError(f"{r.trace}: no job of the trace has a throughput in {r.throughputs}")
        sources = Sources(table=table)
    else:
        for job in jobs:
            if job.framework != ANY and job.framework not in frameworks:
                raise RequestError(f"{job.where}: framework: unknown framework {job.framework!r}; valid: "
                                   f"{', '.join(frameworks)}, any")
        store = lookup.open_store(r.store)
        profiles = _profiles(cluster, store, frameworks)
        measured, validation, not_equivalent, found = _from_store(store, cluster, profiles)
        notes += found
        facts = {f: lookup.runner(registry, f).model for f in frameworks}
        sources = Sources(networks=_networks(jobs), profiles=profiles, facts=facts, measured=measured,
                          validation=validation, not_equivalent=not_equivalent, precisions=tuple(PRECISIONS))
    started = time.perf_counter()
    matrix = ThroughputMatrix(cluster, sources)
    pinned = r.framework if r.framework is not None else _best_single(matrix, jobs, frameworks)
    if pinned is not None and any(j.framework == ANY for j in jobs) and table is None:
        notes.append(f"`framework: any` jobs run in {pinned} under every policy but framework_aware"
                     + ("" if r.framework else " (the single framework fastest over them)"))
    if r.measure is not None:
        first, last = r.measure
        if not 0 <= first <= last < len(jobs):
            raise RequestError(f"--measure-jobs {first}:{last}: the trace has jobs 0 to {len(jobs) - 1}"
                               + (" (after the jobs left out: see its notes)" if trace.notes else ""))
    runs = _simulate_all(cluster, matrix, jobs, names, pinned, r)
    result = PlanResult(cluster, trace, jobs, [], runs, pinned, notes=notes)
    for question, changed in questions:
        other = ThroughputMatrix(changed, sources)
        result.what_if.append(WhatIf(question, changed, _simulate_all(changed, other, jobs, names, pinned, r)))
    result.matrix = matrix.rows()
    result.matrix_s = time.perf_counter() - started - sum(x.seconds for x in runs) - sum(
        x.seconds for w in result.what_if for x in w.runs)
    return result


def _best_single(matrix: ThroughputMatrix, jobs: list[Job], frameworks: list[str]) -> str | None:
    """The framework whose geometric mean throughput over the `any` jobs' workloads and the cluster's
    types (where it runs at all) is highest, counting a workload it cannot run as a loss."""
    if matrix.sources.table is not None:
        return None
    flexible = {j.workload: j for j in jobs if j.framework == ANY}
    if not flexible:
        return None
    scores = {}
    for fw in frameworks:
        logs = []
        for job in flexible.values():
            best = max((matrix.best(job, t, fw).iterations_per_s or 0.0) for t in matrix.cluster.types)
            logs.append(math.log(best) if best > 0 else -1e9)
        scores[fw] = sum(logs) / len(logs)
    return max(scores, key=lambda fw: (scores[fw], fw))


def _simulate_all(cluster: Cluster, matrix: ThroughputMatrix, jobs: list[Job], names: list[str],
                  pinned: str | None, r: PlanRequest) -> list[PolicyRun]:
    ids = [j.id for j in jobs]
    arrival = [j.arrival_s for j in jobs]
    workers = [j.workers for j in jobs]
    weight = [j.weight for j in jobs]
    type_index = {t.name: i for i, t in enumerate(cluster.types)}
    runs = []
    both = {aware: throughput_vectors(matrix, jobs, pinned, aware=aware)
            for aware in {policy(name).framework_aware for name in names} | {True}}
    vectors = {aware: found[0] for aware, found in both.items()}
    spread = {aware: found[2] for aware, found in both.items()}  # the same jobs spread over nodes
    # a job's work given as seconds on a type (Slurm's) becomes iterations at its fastest throughput there
    # (a `framework: any` job's best framework and precision; another's own): the same work under every
    # policy and whatever --framework pins
    iterations = []
    for j, job in enumerate(jobs):
        if job.work.on is not None and job.work.on not in type_index:
            raise RequestError(f"{job.where}: it ran on {job.work.on!r}, which is no type of the cluster "
                               f"({', '.join(cluster.names)}); name it in the cluster file")
        work = work_iterations(job, lambda on: vectors[True][j][type_index[on]])
        if work is None:
            raise RequestError(f"{job.where}: it ran on {job.work.on}, where the matrix has no throughput "
                               "for it: its work cannot be known")
        iterations.append(work)
    for name in names:
        chosen = policy(name)
        speed = vectors[chosen.framework_aware]
        started, cpu = time.perf_counter(), time.process_time()
        try:
            sim = simulate(cluster, ids, arrival, workers, weight, iterations, speed, chosen, r.seed, r.max_rounds,
                           None if r.measure is None else list(range(r.measure[0], r.measure[1] + 1)),
                           spread[chosen.framework_aware])
        except InfeasibleError as e:
            raise RequestError(f"{chosen.title}: {e}") from None
        seconds = time.perf_counter() - started
        runs.append(PolicyRun(summarise(sim, cluster, chosen.title), sim, seconds, time.process_time() - cpu))
    return runs


__all__ = ["PlanRequest", "PlanResult", "plan", "TRACE_FORMATS", "GAVEL_NETWORKS", "LP_POLICIES"]
