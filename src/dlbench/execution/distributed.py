"""Multi-worker runs (suites `distributed` and `comm`): jobs per repeat, one record per run.

- distributed: per framework, network and batch size, a job of N workers (each repeat a fresh
  job) and, for N > 1, first the one-worker baseline it is compared with: the same network with
  the same threads per worker, on the global batch (strong scaling) or on one worker's batch
  (weak). Both are ordinary records (benchmark `<network>-train-w<N>`); the N-worker record names
  the baseline's run id and says it was run in the same invocation.
- comm: per framework, one job (per repeat) runs every collective over every size; it gives one
  record per collective (benchmark `<collective>-w<N>`), failed when any size's result is wrong.
  A collective the runner declares its engine does not offer (runner.toml
  [distributed.collectives_not_offered]) is left out of the job and recorded as skipped, with why.

On a shaped link (`--link`, links.py: DistributedOptions.link), each job's ranks run in the link's
namespaces and the hub-side counters are sampled while it runs (wire.py); its records carry `link`
(as asked, as measured before the jobs, bytes on the wire per iteration) and benchmark names with
the link (`fcn5-train-w2@1gbit`); the one-worker baseline runs on loopback, having no peer.

A runner whose runner.toml has no [distributed] section has not been ported: its runs are recorded
as skipped, saying so. Nothing here imports a framework: jobs.py starts the ranks, launch_styles.py
says how, placement.py says where.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from ..analysis.distributed import bandwidths, bus_factor, exposed_communication_s, scaling_efficiency, slowest_rank
from ..analysis.timing import summarise
from ..axes import REQUEST_AXES, Compression, CompressionMethod, Parallelism
from ..definitions.distributed import CommBenchmark, DistributedBenchmark, batches, moe_experts
from ..definitions.layers.moe import is_expert_tensor
from ..definitions.weights import is_state, weight_shapes
from ..performance.communication import exchange_bytes
from ..machine import dlbench_provenance, fingerprint
from ..store.checks import CheckStore
from ..store.record import (
    AllToAllInfo,
    CommInfo,
    CommSize,
    DistributedInfo,
    ExchangeInfo,
    LinkInfo,
    LinkMeasurement,
    NetworkInfo,
    Oversubscription,
    Prediction,
    Record,
    Repeat,
    RepeatPolicy,
    Scaling,
    Settings,
    WireBytes,
    Workload,
    new_run_id,
)
from ..store.store import Store
from .backends import Environments, backend
from .environments import BuildProgress, Environment, EnvironmentBuildError
from .interrupts import temporary_folder
from .jobs import PROTOCOL_VERSION, JobOutcome, run_job
from .launch_styles import STYLES, JobLayout
from .links import Link, LinkError, describe_shaping
from .placement import Placement, free_port, free_ports
from .registry import DISTRIBUTED_AXES, RunnerInfo
from .wire import Measured, WireCounters, ring_allreduce_bytes

NOT_SAMPLED = {"enabled": False, "reason": "telemetry is not sampled for distributed jobs yet"}
EXPOSED_METHOD = "median step minus median step without the gradient exchange (slowest rank each)"


@dataclass(frozen=True)
class DistributedOptions:
    device: str  # cpu | cuda
    env_backend: str  # venv | current
    placement: Placement
    threads: int  # per worker (Placement.threads_per_worker)
    scaling: str  # strong | weak
    timeout_s: float  # per job
    cache: Path
    job_root: Path | None = None  # where job folders go: None = the system's temp (every rank on this machine)
    repeats: int | None = None  # None: the suite's
    seed: int = 0
    # the performance model's prediction of a training run, kept in its record (performance/runtime.py)
    predictor: Callable[..., dict | None] | None = None
    link: Link | None = None  # the shaped link the jobs' ranks run on (the placement's namespaces)
    link_measured: Measured | None = None  # its socket test, made before the first job


class DistributedEvents(Protocol):
    def environment(self, framework: str, progress: BuildProgress) -> None: ...
    def run_started(self, label: str, repeats: int) -> None: ...
    def repeat_done(self, label: str, index: int, status: str) -> None: ...
    def run_done(self, label: str, record: Record) -> None: ...


class SilentDistributedEvents:
    def environment(self, framework, progress): pass
    def run_started(self, label, repeats): pass
    def repeat_done(self, label, index, status): pass
    def run_done(self, label, record): pass


def not_ported(runner: RunnerInfo) -> str:
    return (f"{runner.name} has no distributed runner yet ({runner.folder.name}/runner.toml has no [distributed] "
            "section; the contract is in docs/architecture.md)")


def oversubscribed(placement: Placement, threads: int) -> Oversubscription | None:
    """The most crowded machine of a job whose ranks run more threads than it has cores (allowed by
    --oversubscribe only: the plan refuses it otherwise), for the record."""
    crowded = placement.oversubscription(threads)
    return Oversubscription(machine=crowded[0], threads=crowded[1], cores=crowded[2]) if crowded else None


def planned_runs(benchmarks: list[DistributedBenchmark], comm: CommBenchmark | None, workers: int) -> int:
    """Records one framework's share of the plan writes (for progress)."""
    runs = sum(len(b.batch_sizes) for b in benchmarks)
    if workers > 1:  # one one-worker baseline per network, precision and batch, whatever the compressions
        runs += len({(b.name, b.precision, batch) for b in benchmarks for batch in b.batch_sizes})
    return runs + (len(comm.collectives) if comm else 0)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class DistributedOrchestrator:
    def __init__(self, store: Store, options: DistributedOptions, events: DistributedEvents | None = None):
        self.store = store
        self.options = options
        self.events = events or SilentDistributedEvents()
        self.environments = Environments(backend(options.env_backend, options.cache), options.device,
                                         self.events.environment)
        # one-worker baselines run in this invocation, by what they train: the runs of several
        # compressions of one benchmark share theirs (with one worker nothing is exchanged)
        self._baselines: dict[tuple, Record] = {}

    def environment(self, runner: RunnerInfo) -> Environment | EnvironmentBuildError:
        return self.environments.get(runner)

    # ------------------------------------------------------------------ one job

    def job(self, runner: RunnerInfo, env: Environment, request: dict, placement: Placement) -> JobOutcome:
        assert runner.distributed is not None
        root = self.options.job_root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        with temporary_folder("dlbench-job-", root) as job_dir:  # removed whatever ends the job
            request_path = job_dir / "request.json"
            request_path.write_text(json.dumps({"protocol": PROTOCOL_VERSION, **request}))
            layout = JobLayout(python=env.python, worker=runner.distributed.worker.resolve(), request=request_path,
                               job_dir=job_dir, placement=placement, threads=self.options.threads,
                               coordinator_port=free_port(), worker_ports=tuple(free_ports(placement.workers)),
                               extra_env=self._layout_env(placement))
            specs = STYLES[runner.distributed.launch](layout)
            cwd = runner.distributed.worker.resolve().parent

            def start() -> JobOutcome:
                return run_job(specs, lambda s: placement.command_on(s.host, s.argv, s.env, str(cwd)), job_dir,
                               placement.workers, self.options.timeout_s, cwd, request=request)

            link = self.options.link
            if link is None or placement.hosts[0].namespace is None:
                return start()
            with WireCounters(link) as counters:
                outcome = start()
            window = (outcome.results.get(0) or {}).get("window_monotonic_ns")
            if outcome.status == "ok" and window:
                try:
                    outcome.wire_sent = counters.sent_between(*window)
                except LinkError as e:
                    outcome.wire_reason = str(e)
            return outcome

    def _layout_env(self, placement: Placement) -> dict[str, str]:
        """What every process of a job on the link is told beyond the placement: gloo's interface."""
        if self.options.link is None or placement.hosts[0].namespace is None:
            return {}
        return {"GLOO_SOCKET_IFNAME": self.options.link.interface}

    def _common(self, runner: RunnerInfo) -> tuple[Environment | None, str, str | None, dict]:
        """(environment, status, reason, env_info) before any job runs."""
        if runner.distributed is None:
            return None, "skipped", not_ported(runner), {"backend": self.options.env_backend}
        env = self.environment(runner)
        if isinstance(env, EnvironmentBuildError):
            return None, "failed", str(env), {"backend": self.options.env_backend, "error": str(env)}
        return env, "ok", None, env.describe()

    # ------------------------------------------------------------------ distributed training

    def run_distributed(self, runner: RunnerInfo, benchmark: DistributedBenchmark) -> list[Record]:
        o = self.options
        n = o.placement.workers
        records = []
        for batch in benchmark.batch_sizes:
            per_worker, global_batch = batches(batch, n, o.scaling)
            baseline = None
            if n > 1:
                # strong: the same global batch on one worker; weak: one worker's batch; dense, since
                # one worker exchanges nothing (a compressor there would only change the training)
                key = (runner.name, benchmark.name, benchmark.precision, batch, o.threads)
                baseline = self._baselines.get(key)
                if baseline is None:
                    dense = dataclasses.replace(benchmark, compression=CompressionMethod.NONE.value,
                                                parallelism=Parallelism.DATA.value)
                    baseline = self._train_run(runner, dense, o.placement.single_worker(), batch, batch, None)
                    self._baselines[key] = baseline
                    records.append(baseline)
            records.append(self._train_run(runner, benchmark, o.placement, per_worker, global_batch, baseline))
        return records

    def _train_run(self, runner: RunnerInfo, b: DistributedBenchmark, placement: Placement, per_worker: int,
                   global_batch: int, baseline: Record | None) -> Record:
        o = self.options
        n = placement.workers
        label = f"{runner.name} {b.name} x{n} b={global_batch}" + ("" if b.compression == "none" else f" {b.compression}") \
            + ("" if b.parallelism == Parallelism.DATA.value else f" {b.parallelism}-parallel")
        repeats_asked = o.repeats or b.policy.repeats
        started = datetime.now(timezone.utc)
        # the model's communication term is the dense all-reduce: a compressed run gets no prediction
        # rather than a dense one (performance/communication.py crossover_bandwidth compares them)
        # and its network is whole on every worker: an expert-parallel run gets none either
        predictable = o.predictor is not None and (n == 1 or b.compression == CompressionMethod.NONE.value) \
            and b.parallelism == Parallelism.DATA.value
        prediction = o.predictor(network=b.network.resolved, batch=per_worker, mode="train", precision=b.precision,
                                 framework=runner.name, workers=n) if predictable else None
        self.events.run_started(label, repeats_asked)
        refusal = _data_parallel_refusal(runner, b)
        if refusal is None:
            env, status, reason, env_info = self._common(runner)
        else:  # the runner says it cannot: no environment built, no job started
            env, status, reason, env_info = None, "skipped", refusal, {"backend": o.env_backend}
        repeats: list[Repeat] = []
        repeats_outcomes: list[JobOutcome] = []
        rank0: dict = {}
        tail = ""
        if env is not None:
            request = {
                "action": "data_parallel", "network": b.network.resolved, "mode": "train", "batch_size": per_worker,
                **_axes(b), "device": o.device, "threads": o.threads, "learning_rate": b.learning_rate,
                "momentum": b.momentum, "seed": o.seed, "policy": b.policy.model_dump(),
            }
            for index in range(repeats_asked):
                outcome = self.job(runner, env, request, placement)
                repeats_outcomes.append(outcome)
                rank0 = outcome.results.get(0) or rank0
                repeats.append(_train_repeat(index, outcome, n))
                self.events.repeat_done(label, index, outcome.status)
                if outcome.status != "ok":
                    status, reason, tail = outcome.status, outcome.reason, outcome.output_tail
                    break
        summary = summarise(repeats, global_batch) if status == "ok" else None
        launch = runner.distributed.launch if runner.distributed else "none"
        info = DistributedInfo(
            workers=n, hosts=[h.address for h in placement.hosts], placement=placement.variant,
            launch=launch,
            backend=(rank0.get("process_group") or {}).get("backend"), threads_per_worker=o.threads,
            per_worker_batch=per_worker, global_batch=global_batch, grad_bytes=rank0.get("grad_bytes"),
            scaling=_scaling(o.scaling, n, summary, baseline),
            exchange=_exchange(b, n, servers=launch == "ps-lite") if n > 1 else None,
            oversubscribed=oversubscribed(placement, o.threads),
        )
        if summary is not None:
            _training_figures(info, repeats)
        good = [oc for oc in repeats_outcomes if oc.status == "ok"]
        if good:
            info.step_losses = _step_losses(good[0], n)
            if b.parallelism == Parallelism.EXPERT.value:
                info.all_to_all = _all_to_all(good, n, b, rank0, info.slowest_median_s)
        on_link = o.link is not None and placement.hosts[0].namespace is not None
        record = self._record(runner, started, b.suite, self.benchmark_name(f"{b.name}-w{n}", placement),
                              NetworkInfo.of(b.network, b.network_file), Workload(
            mode="train", batch_size=global_batch, **_axes(b), compile=runner.default_compile,
            learning_rate=b.learning_rate, momentum=b.momentum, device=o.device), env_info, rank0, b.profile, repeats_asked,
            b.policy.model_dump(), repeats, summary, status, reason, tail)
        record.distributed = info
        if on_link:
            record.link = self.link_info(_wire(repeats_outcomes, n, info.grad_bytes))
        record.prediction = Prediction.model_validate(prediction) if prediction else None
        record.equivalence = CheckStore(self.store.root).status(
            b.network.name, b.network.definition_hash, runner.name, record.framework.get("version"))
        self.store.write(record)
        self.events.run_done(label, record)
        return record

    # ------------------------------------------------------------------ collectives

    def run_comm(self, runner: RunnerInfo, comm: CommBenchmark) -> list[Record]:
        o = self.options
        n = o.placement.workers
        label = f"{runner.name} {', '.join(comm.collectives)} x{n}"
        repeats_asked = o.repeats or comm.policy.repeats
        started = datetime.now(timezone.utc)
        self.events.run_started(label, repeats_asked)
        not_offered = {c: why for c in comm.collectives if runner.distributed
                       and (why := runner.distributed.not_offered(c))}
        offered = [c for c in comm.collectives if c not in not_offered]
        env, status, reason, env_info = self._common(runner) if offered else (
            None, "skipped", None, {"backend": o.env_backend})
        outcomes: list[JobOutcome] = []
        if env is not None:
            request = {"action": "collectives", "device": o.device, "threads": o.threads, "seed": o.seed,
                       "collectives": offered, "sizes": list(comm.sizes), "dtype": comm.dtype,
                       "policy": comm.policy.model_dump()}
            for index in range(repeats_asked):
                outcome = self.job(runner, env, request, o.placement)
                outcomes.append(outcome)
                self.events.repeat_done(label, index, outcome.status)
                if outcome.status != "ok":
                    status, reason = outcome.status, outcome.reason
                    break
        rank0 = next((oc.results[0] for oc in reversed(outcomes) if 0 in oc.results), {})
        records = []
        for collective in comm.collectives:
            repeats = [Repeat(index=i, status=oc.status, reason=oc.reason, wall_s=oc.wall_s)
                       for i, oc in enumerate(outcomes)] if collective in offered else []
            op_status, op_reason = status, reason
            info = _comm_info(collective, comm, n, outcomes) if status == "ok" and collective in offered else None
            wrong = [s for s in (info.sizes if info else []) if s.correct is False]
            if collective in not_offered:  # declared: no rank was asked
                op_status = "skipped"
                op_reason = (f"{runner.name} runner: {not_offered[collective]} "
                             "(runner.toml [distributed.collectives_not_offered])")
            elif info and info.sizes and all(s.skipped for s in info.sizes):
                # the engine offers no such collective here (or no size can be split over the ranks)
                op_status = "skipped"
                op_reason = "; ".join(dict.fromkeys(s.skipped for s in info.sizes))
            elif wrong:
                op_status = "failed"
                op_reason = f"wrong result at {wrong[0].size_bytes} B: {wrong[0].error}" + (
                    f" (and at {len(wrong) - 1} more sizes)" if len(wrong) > 1 else "")
            definition = comm.definition(collective)
            network = NetworkInfo(
                name=collective, file=comm.suite_file,
                hash=hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest(),
                params_described=0, flops_per_sample=0, definition=definition)
            tail = next((oc.output_tail for oc in outcomes if oc.status != "ok"), "") if collective in offered else ""
            record = self._record(runner, started, comm.suite, self.benchmark_name(f"{collective}-w{n}", o.placement),
                                  network, Workload(
                mode="collective", batch_size=1, precision=comm.dtype, learning_rate=0.0, momentum=0.0,
                device=o.device), env_info, rank0, comm.profile, repeats_asked, comm.policy.model_dump(),
                repeats, None, op_status, op_reason, tail if op_status != "ok" else "")
            record.distributed = DistributedInfo(
                workers=n, hosts=[h.address for h in o.placement.hosts], placement=o.placement.variant,
                launch=runner.distributed.launch if runner.distributed else "none",
                backend=(rank0.get("process_group") or {}).get("backend"), threads_per_worker=o.threads,
                oversubscribed=oversubscribed(o.placement, o.threads))
            record.comm = info
            if o.link is not None:
                record.link = self.link_info("bytes on the wire are counted for training runs only: a comm job "
                                              "runs every collective and size in one window")
            record.equivalence = {"status": "unchecked",
                                  "reason": "a collective's result is checked at every size (comm.sizes[].correct)"}
            self.store.write(record)
            records.append(record)
            self.events.run_done(f"{runner.name} {collective} x{n}", record)
        return records

    # ------------------------------------------------------------------ records

    def benchmark_name(self, benchmark: str, placement: Placement) -> str:
        """A job on a shaped link is another benchmark than the same job on loopback: its name says
        the link, so its runs never pool or pair with the others'."""
        if self.options.link is None or placement.hosts[0].namespace is None:
            return benchmark
        return f"{benchmark}@{self.options.link.spec.label}"

    def link_info(self, wire: WireBytes | str | None) -> LinkInfo:
        link, measured = self.options.link, self.options.link_measured
        return LinkInfo(
            asked=link.spec.asked, rate_bps=link.spec.rate_bps, delay_s=link.spec.delay_s,
            shaping=describe_shaping(link.spec), subnet=str(link.subnet),
            measured=LinkMeasurement(**vars(measured)) if measured else None,
            wire=wire if isinstance(wire, WireBytes) else None,
            wire_reason=wire if isinstance(wire, str) else None)

    def _record(self, runner, started, suite, benchmark, network, workload, env_info, rank0, profile, repeats_asked,
                policy, repeats, summary, status, reason, tail) -> Record:
        return Record(
            run_id=new_run_id(started), started_at=started, ended_at=datetime.now(timezone.utc),
            dlbench=dlbench_provenance(), suite=suite, benchmark=benchmark, network=network, workload=workload,
            framework=rank0.get("framework") or {"name": runner.name}, environment=env_info, machine=fingerprint(),
            settings=Settings(profile=profile, repeats=repeats_asked, threads_requested=self.options.threads,
                              threads_effective=rank0.get("threads") or {}, timeout_s=self.options.timeout_s,
                              policy=policy, runner=rank0.get("settings") or {}),
            repeats=repeats, summary=summary, params=rank0.get("params"), status=status, reason=reason,
            output_tail=tail if status != "ok" else "", telemetry=dict(NOT_SAMPLED),
            repeat_policy=RepeatPolicy(kind="fixed", min_repeats=repeats_asked, max_repeats=repeats_asked,
                                       stopped="fixed" if status == "ok" else (
                                           "not_started" if not repeats else "failed_repeat")),
        )


def _train_repeat(index: int, outcome: JobOutcome, workers: int) -> Repeat:
    if outcome.status != "ok":
        return Repeat(index=index, status=outcome.status, reason=outcome.reason, wall_s=outcome.wall_s)
    ranks = [outcome.results[r] for r in range(workers)]
    warm = [r.get("warmup_iter_s") or [] for r in ranks]
    return Repeat(
        index=index, status="ok", first_iter_s=max(r["first_iter_s"] for r in ranks),
        warmup_iter_s=slowest_rank(warm) if all(warm) else [], warmup_settled=None,
        iter_s=slowest_rank([r["iter_s"] for r in ranks]), window_monotonic_ns=ranks[0].get("window_monotonic_ns", []),
        wall_s=outcome.wall_s,
        ranks=[{"rank": i, "host": r.get("host"), "first_iter_s": r.get("first_iter_s"), "iter_s": r.get("iter_s"),
                "local_iter_s": r.get("local_iter_s")} for i, r in enumerate(ranks)],
    )


def _wire(outcomes: list[JobOutcome], workers: int, grad_bytes: int | None) -> WireBytes | str | None:
    """Bytes on the wire per measured iteration, per worker, the median over the ok repeats; or why
    there are none (a repeat whose counters could not be read); None when no repeat completed."""
    good = [oc for oc in outcomes if oc.status == "ok"]
    if not good:
        return None
    missing = next((oc.wire_reason or "no measured window" for oc in good if oc.wire_sent is None), None)
    if missing:
        return missing
    per_iter = [[sent / len(oc.results[0]["iter_s"]) for sent in oc.wire_sent] for oc in good]
    sent = [statistics.median(rep[w] for rep in per_iter) for w in range(workers)]
    return WireBytes(
        sent_per_iter=sent, mean_per_worker=statistics.fmean(sent),
        ring_allreduce_bytes=ring_allreduce_bytes(grad_bytes, workers) if grad_bytes else None,
        iterations=sum(len(oc.results[0]["iter_s"]) for oc in good),
        source=("frame bytes each worker's hub-side veth port received, sampled every 10 ms on the monotonic "
                "clock and interpolated at rank 0's measured window, divided by its iterations"))


def _training_figures(info: DistributedInfo, repeats: list[Repeat]) -> None:
    """Pooled over the repeats: rank 0's and the slowest rank's median, the exposed communication."""
    good = [r for r in repeats if r.status == "ok" and r.ranks]
    per_rank: dict[int, list[float]] = {}
    local: dict[int, list[float]] = {}
    for rep in good:
        for entry in rep.ranks:
            per_rank.setdefault(entry["rank"], []).extend(entry["iter_s"] or [])
            if entry.get("local_iter_s"):
                local.setdefault(entry["rank"], []).extend(entry["local_iter_s"])
    info.rank0_median_s = _median(per_rank.get(0, []))
    info.slowest_median_s = _median([t for r in good for t in r.iter_s])
    if local and set(local) == set(per_rank):
        ranks = sorted(per_rank)
        info.exposed_comm_s = exposed_communication_s([per_rank[r] for r in ranks], [local[r] for r in ranks])
        info.local_median_s = max(statistics.median(local[r]) for r in ranks)
        info.exposed_comm_method = EXPOSED_METHOD
    else:
        info.exposed_comm_method = "not measured: the runner cannot step without the gradient exchange"


def _scaling(mode: str, workers: int, summary, baseline: Record | None) -> Scaling:
    if baseline is None:
        return Scaling(mode=mode, reason="one worker: this run is the baseline")
    s = Scaling(mode=mode, baseline_run_id=baseline.run_id, baseline_source="same_invocation")
    if baseline.status != "ok" or baseline.summary is None:
        s.reason = f"the one-worker baseline did not complete ({baseline.status})"
        return s
    s.baseline_samples_per_s = baseline.summary.samples_per_s
    if summary is None:
        s.reason = "this run did not complete"
        return s
    s.speedup = summary.samples_per_s / baseline.summary.samples_per_s
    s.efficiency = scaling_efficiency(summary.samples_per_s, workers, baseline.summary.samples_per_s)
    return s


def _comm_info(collective: str, comm: CommBenchmark, workers: int, outcomes: list[JobOutcome]) -> CommInfo:
    sizes = []
    for j, size in enumerate(comm.sizes):
        pooled: list[float] = []
        entry = CommSize(size_bytes=size)
        errors = []
        for oc in outcomes:
            rows = [oc.results[r]["collectives"][collective][j] for r in range(workers)]
            if any("skipped" in row for row in rows):
                entry.skipped = rows[0].get("skipped") or "skipped"
                break
            pooled.extend(slowest_rank([row["iter_s"] for row in rows]))
            entry.bytes = rows[0]["bytes"]
            errors += [row.get("error") or "wrong result" for row in rows if not row["correct"]]
        if entry.skipped is None and pooled:
            entry.iterations = len(pooled)
            entry.time_s = statistics.median(pooled)
            algbw, busbw = bandwidths(entry.bytes, entry.time_s, collective, workers)
            entry.algbw_gbps, entry.busbw_gbps = algbw / 1e9, busbw / 1e9
            entry.correct = not errors
            entry.error = errors[0] if errors else None
        sizes.append(entry)
    return CommInfo(collective=collective, dtype=comm.dtype, workers=workers, bus_factor=bus_factor(collective, workers),
                    sizes=sizes)


# The axes a data-parallel job's request and record carry: those the distributed suites take
# (RequestAxis.suite_kinds), each a field of the DistributedBenchmark.
DATA_PARALLEL_AXES = tuple(spec for spec in REQUEST_AXES.values() if "distributed" in spec.suite_kinds)


def _axes(b: DistributedBenchmark) -> dict:
    return {spec.field: getattr(b, spec.field) for spec in DATA_PARALLEL_AXES}


def _data_parallel_refusal(runner: RunnerInfo, b: DistributedBenchmark) -> str | None:
    """Why the runner's data-parallel step cannot train this benchmark (the first value of an axis
    its runner.toml [distributed] does not list), or None where it can or the runner takes no part
    (its record then says so)."""
    return data_parallel_refusal(runner, {spec.field: getattr(b, spec.field) for spec in DISTRIBUTED_AXES.values()})


def data_parallel_refusal(runner: RunnerInfo, axes: dict[str, str]) -> str | None:
    """Why the runner's data-parallel step cannot train at these axis values (field -> value: the
    first its runner.toml [distributed] does not list), or None where it can or the runner takes no
    part (its record then says so)."""
    if runner.distributed is None:
        return None
    for spec in DISTRIBUTED_AXES.values():
        value = spec.axis(axes[spec.field])
        why = runner.distributed.capabilities.refusal(runner.name, value)
        if why:
            reason = runner.distributed.refusal_reason(value)
            return f"{why}: {reason}" if reason else why
    return None


def _step_losses(outcome: JobOutcome, workers: int) -> list[float] | None:
    """The loss after the first step and each warm-up step, the mean over the ranks (each rank's
    loss is the mean over its own batch, so this is the global batch's); None where a runner does
    not read its loss."""
    per_rank = [outcome.results[r].get("losses") for r in range(workers)]
    if not all(per_rank):
        return None
    return [statistics.fmean(step) for step in zip(*per_rank)]


def _all_to_all(outcomes: list[JobOutcome], workers: int, b: DistributedBenchmark, rank0: dict,
                step_s: float | None) -> AllToAllInfo | None:
    """Expert parallelism's all-to-alls per measured step, from each rank's totals around its
    measured window (mean over the ok repeats): the bytes a rank sends (mean over the ranks), the
    calls, and the slowest rank's seconds in them, with their share of the slowest rank's median step."""
    figures = [[oc.results[r].get("all_to_all") for r in range(workers)] for oc in outcomes]
    if not all(all(ranks) for ranks in figures):
        return None

    def mean(key: str, pool=statistics.fmean) -> float | None:
        if any(rank[key] is None for ranks in figures for rank in ranks):
            return None
        return statistics.fmean(pool([rank[key] for rank in ranks]) for ranks in figures)

    seconds = mean("seconds", max)
    experts = moe_experts(b.network.resolved)
    said = (rank0.get("settings") or {}).get("expert_parallel", {})
    return AllToAllInfo(
        experts_per_worker=[e // workers for e in experts], dispatch=said.get("dispatch", "not said by the runner"),
        bytes_per_step=mean("bytes"), calls_per_step=mean("calls"), seconds_per_step=seconds,
        share=seconds / step_s if seconds is not None and step_s else None, timing=said.get("all_to_all_timing"))


def _exchange(b: DistributedBenchmark, workers: int, servers: bool = False) -> ExchangeInfo:
    """The analytical bytes of one iteration's exchange of the network's trainable tensors; with expert
    parallelism, of every tensor but the experts' (sharded, never all-reduced)."""
    return exchange_info(b.network.resolved, b.compression, workers,
                         leave_out_experts=b.parallelism == Parallelism.EXPERT.value, servers=servers)


def exchange_info(network: dict, compression: str, workers: int, leave_out_experts: bool = False,
                  servers: bool = False) -> ExchangeInfo:
    """The analytical bytes of one iteration's exchange of the (resolved) network's trainable
    tensors (their canonical shapes, definitions/weights.py) by `compression`; `leave_out_experts`:
    every tensor but the experts' (expert parallelism shards them, never all-reduced); `servers`:
    through parameter servers (the runner's launch style is ps-lite)."""
    shapes = [shape for name, shape in weight_shapes(network).items()
              if not is_state(name) and not (leave_out_experts and is_expert_tensor(name))]
    counted = exchange_bytes(Compression.parse(compression, who="the data-parallel run"), shapes, workers,
                             servers=servers)
    return ExchangeInfo(method=counted.method, payload_bytes=counted.payload, bytes_per_rank=counted.per_rank,
                        total_bytes=counted.total, rounds=counted.rounds, formula=counted.formula)
