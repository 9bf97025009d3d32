"""Running a `kind: convergence` suite (definitions/convergence.py): per framework and task, one
fresh worker process per seed (action `convergence`, runners/common/convergence.py), each writing
its MLLOG file; the logs go into the store beside the record (STORE/mllog/<run_id>/seed-<s>.log,
their SHA-256 in the record), the score is analysis/convergence.py's. A worker that crashes, hangs
or is skipped is recorded with its reason and the other seeds and tasks go on.

Data-parallel (the suite run with --workers N > 1; PlannedConvergenceRun.compression set): each
seed is a job of N ranks (distributed.py's DistributedOrchestrator.job: the runner's distributed
worker, action `convergence`, on the link's namespaces where there is one), rank 0's result and
MLLOG the run's; the record gains `distributed`, the compression and the link, and a compressed
run is compared seed by seed with the dense run of the same invocation (`against_dense`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..analysis.convergence import score
from ..definitions.convergence import ConvergenceTask
from ..machine import dlbench_provenance, fingerprint
from ..store.checks import CheckStore
from ..store.record import (ConvergenceInfo, ConvergenceRun, DenseComparison, NetworkInfo, Record, Repeat,
                            SeedAgainstDense, Settings, Workload, new_run_id)
from .environments import EnvironmentBuildError
from .interrupts import shielded, temporary_folder
from .launcher import PROTOCOL_VERSION, run_worker, thread_env

MLLOG_DIR = "mllog"


@dataclass(frozen=True)
class PlannedConvergenceRun:
    runner: Any  # execution.registry.RunnerInfo
    task: ConvergenceTask
    compression: str | None = None  # a data-parallel run's method (its spelling); None: one worker

    @property
    def label(self) -> str:
        return f"{self.runner.name} {self.task.name}" + (f" {self.compression}" if self.compression else "")


def plan_convergence(runners: list, tasks: list[ConvergenceTask],
                     compressions: list[str] | None = None) -> list[PlannedConvergenceRun]:
    """One run per (task, runner), or, data-parallel (`compressions`: the methods, dense first),
    one per (task, runner, method): the dense run of a (task, runner) ends before its compressed
    runs start, so that each is compared with it."""
    if compressions is None:
        return [PlannedConvergenceRun(r, t) for t in tasks for r in runners]
    return [PlannedConvergenceRun(r, t, c) for t in tasks for r in runners for c in compressions]


def platform_of(machine: dict, device: str) -> str:
    """MLLOG's submission_platform: the GPU model on CUDA, else the CPU model and its cores."""
    gpus = machine.get("gpus") or []
    if device == "cuda" and gpus:
        return f"{len(gpus)}x {gpus[0].get('name', 'GPU')}"
    return f"{machine.get('cpu_model', 'CPU')} ({machine.get('cpu_available') or machine.get('cpu_logical')} cores)"


def convergence_request(task: ConvergenceTask, runner_name: str, seed: int, device: str, threads: int | None,
                        data_dir: Path, mllog: Path, platform: str, precision: str | None = None) -> dict:
    part = task.request_part()
    if precision is not None:
        part["precision"] = precision
    return {"protocol": PROTOCOL_VERSION, "action": "convergence", **part, "device": device, "threads": threads,
            "seed": seed, "data_dir": str(data_dir), "mllog": str(mllog), "max_init_s": task.spec.max_init_s,
            "submission": {"benchmark": task.name, "division": "open", "org": "dlbench", "platform": platform,
                           "status": "research", "framework": runner_name}}


def _seed_run(seed: int, outcome, part: dict | None) -> ConvergenceRun:
    if outcome.status != "ok" or part is None:
        return ConvergenceRun(seed=seed, status=outcome.status if outcome.status != "ok" else "failed",
                              reason=outcome.reason or "no result")
    keep = {k: part[k] for k in ConvergenceRun.model_fields if k in part and k not in ("seed", "status", "reason")}
    return ConvergenceRun(seed=seed, status="ok", **keep)


@dataclass
class _SeedOutcome:
    """A seed's worker or job as the record needs it: its status, rank 0's result, the wall time."""

    status: str
    reason: str | None
    result: dict | None
    output_tail: str
    wall_s: float
    wire_sent: list[float] | None = None


def _refusal(run: PlannedConvergenceRun, precision: str) -> str | None:
    """Why the runner's ranks cannot train this data-parallel run, before any environment is built:
    not ported to multi-worker jobs, no convergence loop (runner.toml [distributed]
    convergence_not_offered), or an axis value its data-parallel step does not list."""
    from .distributed import data_parallel_refusal, not_ported

    runner = run.runner
    if runner.distributed is None:
        return not_ported(runner)
    if runner.distributed.convergence_not_offered:
        return (f"{runner.name} runner: {runner.distributed.convergence_not_offered} (runner.toml [distributed] "
                "convergence_not_offered)")
    # a convergence task trains the whole network on every rank: data parallelism
    return data_parallel_refusal(runner, {"precision": precision, "compression": run.compression,
                                          "parallelism": "data"})


def execute_convergence_run(orchestrator, run: PlannedConvergenceRun, data_dir: Path, precision: str | None = None,
                            events=None, worker_runner=None, dense: Record | None = None) -> Record:
    """One framework x one task: every seed in a fresh worker, the logs kept, the record written.
    `orchestrator` is an execution.orchestrator.Orchestrator (its options, store and environments),
    or, for a data-parallel run (run.compression set), a distributed.DistributedOrchestrator, whose
    options say the placement and link; `dense`: the dense record a compressed run is compared with."""
    opts = orchestrator.options
    store = orchestrator.store
    worker_runner = worker_runner or run_worker
    task = run.task
    parallel = run.compression is not None
    started = datetime.now(timezone.utc)
    run_id = new_run_id(started)
    machine = fingerprint()
    refusal = _refusal(run, precision or task.spec.precision) if parallel else None
    env = orchestrator.environment(run.runner) if refusal is None else None
    runs: list[ConvergenceRun] = []
    repeats: list[Repeat] = []
    last: dict = {}
    tail = ""
    if refusal is not None:
        env_info = {"backend": opts.env_backend}
        status, reason = "skipped", refusal
    elif isinstance(env, EnvironmentBuildError):
        env_info = {"backend": opts.env_backend, "error": str(env)}
        status, reason = "failed", str(env)
    else:
        env_info = env.describe()
        status, reason = "ok", None
        with temporary_folder("dlbench-mllog-") as logs:
            for index, seed in enumerate(task.seeds):
                log_path = logs / f"seed-{seed}.log"
                request = convergence_request(task, run.runner.name, seed, opts.device, opts.threads, data_dir,
                                              log_path, platform_of(machine, opts.device), precision)
                if events is not None:
                    events.seed_started(run, seed, index)
                if parallel:
                    job = orchestrator.job(run.runner, env, {**request, "compression": run.compression},
                                           opts.placement)
                    outcome = _SeedOutcome(job.status, job.reason, job.results.get(0), job.output_tail, job.wall_s,
                                           job.wire_sent)
                else:
                    outcome = worker_runner(env.python, run.runner.worker, request, opts.timeout_s,
                                            thread_env(opts.threads), None, container=env.container,
                                            shared_dirs=(logs, Path(data_dir)))
                res = outcome.result or {}
                last = res or last
                tail = outcome.output_tail
                seed_run = _seed_run(seed, outcome, res.get("convergence"))
                if parallel and outcome.wire_sent:
                    seed_run.wire_sent_bytes = list(outcome.wire_sent)
                if log_path.is_file():
                    content = log_path.read_bytes()
                    kept = store.root / MLLOG_DIR / run_id / log_path.name
                    try:
                        store.publish(content, kept)
                    except OSError as e:
                        raise store.keep_file_elsewhere(kept, content, e, "MLLOG file") from None
                    seed_run.mllog = str(kept.relative_to(store.root))
                    seed_run.mllog_sha256 = hashlib.sha256(content).hexdigest()
                runs.append(seed_run)
                repeats.append(Repeat(index=index, status=seed_run.status, reason=seed_run.reason,
                                      wall_s=outcome.wall_s))
                if events is not None:
                    events.seed_done(run, seed_run)
                if outcome.status == "skipped":
                    break  # the framework cannot run it here: every other seed would say the same
    result = score([r.time_to_target_s if r.status == "ok" and r.reached else None for r in runs])
    if status == "ok":
        bad = [r for r in runs if r.status != "ok"]
        if runs and all(r.status == "skipped" for r in runs):
            status, reason = "skipped", runs[0].reason
        elif bad:
            status, reason = "failed", f"{len(bad)} of {len(task.seeds)} runs did not complete: seed {bad[0].seed}: {bad[0].reason}"
        elif result.seconds is None:
            status, reason = "failed", result.reason
    scored = [runs[i] for i in result.scored]
    trained = [r.input_bound_share for r in runs if r.input_bound_share is not None]
    d = task.dataset
    spec = task.spec
    info = ConvergenceInfo(
        task=task.name,
        dataset={"name": d.name, "format": d.format, "source": d.source, "folder": str(data_dir),
                 "train_samples": next((r.train_samples for r in runs if r.train_samples), None),
                 "eval_samples": next((r.eval_samples for r in runs if r.eval_samples), None)},
        metric=spec.target.metric, target=spec.target.value, optimizer=spec.optimizer.model_dump(),
        augmentation=spec.augmentation.model_dump(), batch_size=spec.batch_size, max_epochs=spec.max_epochs,
        eval_every_epochs=spec.eval_every_epochs, loader_workers=spec.loader_workers, max_init_s=spec.max_init_s,
        runs=runs, score_s=result.seconds, score_rule=result.rule, scored_seeds=[r.seed for r in scored],
        reached=sum(r.reached for r in runs),
        epochs_to_target=(sum(r.epochs_to_target for r in scored) / len(scored)) if scored else None,
        input_bound_share=sum(trained) / len(trained) if trained else None,
        reason=result.reason)
    if parallel and run.compression != "none" and dense is not None and runs:
        info.against_dense = against_dense(info, dense)
    net = task.network
    benchmark = task.name
    if parallel:
        benchmark = orchestrator.benchmark_name(f"{task.name}-w{opts.placement.workers}", opts.placement)
    record = Record(
        run_id=run_id, started_at=started, ended_at=datetime.now(timezone.utc), dlbench=dlbench_provenance(),
        suite=task.suite, benchmark=benchmark,
        network=NetworkInfo.of(net, task.network_file),
        workload=Workload(mode="convergence", batch_size=spec.batch_size, precision=precision or spec.precision,
                          compile=run.runner.compile_mode("default"), compile_requested="default",
                          learning_rate=spec.optimizer.learning_rate, momentum=spec.optimizer.momentum,
                          device=opts.device, compression=run.compression),
        framework=last.get("framework", {"name": run.runner.name}), environment=env_info, machine=machine,
        settings=Settings(profile=task.profile, repeats=len(task.seeds), threads_requested=opts.threads,
                          threads_effective=last.get("threads", {}), timeout_s=opts.timeout_s,
                          policy={"seeds": list(task.seeds)}, runner=last.get("settings", {})),
        repeats=repeats, params=last.get("params"), status=status, reason=reason,
        output_tail=tail if status not in ("ok", "skipped") else "", convergence=info)
    record.equivalence = CheckStore(store.root).status_for_run(
        net.name, net.definition_hash, run.runner.name, record.framework.get("version"), record.workload.precision)
    if parallel:
        _data_parallel_parts(record, orchestrator, run, last)
    with shielded():
        store.write(record)
    return record


def _data_parallel_parts(record: Record, orchestrator, run: PlannedConvergenceRun, rank0: dict) -> None:
    """What a data-parallel convergence record has beyond one worker's: its placement and the
    method's analytical bytes per step (`distributed`), the link it ran on (`link`)."""
    from ..store.record import DistributedInfo
    from .distributed import exchange_info, oversubscribed

    opts = orchestrator.options
    placement = opts.placement
    n = placement.workers
    batch = run.task.spec.batch_size
    launch = run.runner.distributed.launch if run.runner.distributed else "none"
    record.distributed = DistributedInfo(
        workers=n, hosts=[h.address for h in placement.hosts], placement=placement.variant,
        launch=launch,
        backend=(rank0.get("process_group") or {}).get("backend"), threads_per_worker=opts.threads,
        per_worker_batch=batch // n, global_batch=batch,
        exchange=exchange_info(run.task.network.resolved, run.compression, n, servers=launch == "ps-lite"),
        oversubscribed=oversubscribed(placement, opts.threads))
    if opts.link is not None:
        record.link = orchestrator.link_info(
            "a convergence run's bytes on the wire are per seed (convergence.runs[].wire_sent_bytes: the whole "
            "job, initialisation included), not per measured iteration")


def against_dense(info: ConvergenceInfo, dense: Record) -> DenseComparison:
    """A compressed run's seeds beside the dense run's (the same seeds, in the same invocation):
    the speedup dense / compressed of each seed both reached the target in, why not for the rest;
    the scores' ratio where both have one."""
    theirs = {r.seed: r for r in (dense.convergence.runs if dense.convergence else [])}
    seeds = []
    for mine in info.runs:
        other = theirs.get(mine.seed)
        row = SeedAgainstDense(seed=mine.seed, time_s=mine.time_to_target_s,
                               dense_s=other.time_to_target_s if other else None)
        if other is None:
            row.reason = "the dense run has no such seed"
        elif not _reached(mine):
            row.reason = f"this run {_missed(mine, info.max_epochs)}"
        elif not _reached(other):
            row.reason = f"the dense run {_missed(other, info.max_epochs)}"
        else:
            row.speedup = other.time_to_target_s / mine.time_to_target_s
        seeds.append(row)
    comparison = DenseComparison(dense_run_id=dense.run_id, seeds=seeds)
    dense_score = dense.convergence.score_s if dense.convergence else None
    if info.score_s is not None and dense_score is not None:
        comparison.score_speedup = dense_score / info.score_s
    else:
        comparison.reason = "; ".join(why for why, missing in (
            (f"this run has no score ({info.reason})", info.score_s is None),
            (f"the dense run has no score ({dense.convergence.reason if dense.convergence else dense.reason})",
             dense_score is None)) if missing)
    return comparison


def _reached(run: ConvergenceRun) -> bool:
    return run.status == "ok" and run.reached and run.time_to_target_s is not None


def _missed(run: ConvergenceRun, max_epochs: int) -> str:
    """Why a seed has no time to target, in words."""
    if run.status != "ok":
        return f"did not complete ({run.status}: {run.reason})"
    best = max((e["accuracy"] for e in run.evals), default=None)
    return f"did not reach the target in {run.epochs or max_epochs} epochs" + (
        f" (best top-1 {best:.3f})" if best is not None else "")
