"""Running the `kernels` suite (performance/kernel_suite.py): one framework x one kernel benchmark
in fresh worker processes (a child per repeat, with the timeout; a crash or hang is recorded as
failed and the suite goes on), pooled per kernel into a kernel record (store/kernels.py)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..machine import dlbench_provenance, fingerprint, last_level_cache_bytes
from ..performance.kernel_suite import KernelBenchmark, KernelPolicy, ceiling_of
from ..performance import yardstick
from ..performance.kernels import KernelSpec
from ..store.kernels import KernelRecord, KernelResult, KernelStore
from ..store.profiles import MachineProfile
from ..store.record import new_run_id
from .environments import EnvironmentBuildError
from .launcher import PROTOCOL_VERSION, run_worker, thread_env


@dataclass
class PlannedKernelRun:
    runner: Any  # execution.registry.RunnerInfo
    benchmark: KernelBenchmark


def plan_kernel_runs(runners: list, benchmarks: list[KernelBenchmark]) -> list[PlannedKernelRun]:
    return [PlannedKernelRun(r, b) for r in runners for b in benchmarks]


FLUSH_FALLBACK_BYTES = 256 << 20  # when sysfs says nothing
FLUSH_MAX_BYTES = 1 << 30


def flush_bytes(policy: KernelPolicy, device: str, llc: int | None = None) -> int:
    """What the worker writes before each call of a cold policy: 1.5 times the last-level cache."""
    if policy.cache == "warm" or device != "cpu":
        return 0
    llc = llc if llc is not None else last_level_cache_bytes()
    return min(FLUSH_MAX_BYTES, int(1.5 * llc) if llc else FLUSH_FALLBACK_BYTES)


def kernel_request(specs: list[KernelSpec], policy: KernelPolicy, device: str, threads: int | None,
                   seed: int = 0) -> dict:
    timing = policy.model_dump(exclude={"repeats", "cache"})
    timing["flush_bytes"] = flush_bytes(policy, device)
    return {"protocol": PROTOCOL_VERSION, "action": "kernels", "device": device, "threads": threads, "seed": seed,
            "kernel_policy": timing, "kernels": [s.to_dict() for s in specs], "yardstick": yardstick.request()}


@dataclass
class KernelOutcome:
    """What the workers of one run returned, pooled per kernel."""

    results: dict[str, KernelResult] = field(default_factory=dict)
    repeats: list[dict] = field(default_factory=list)
    status: str = "ok"
    reason: str | None = None
    tail: str = ""
    last_result: dict = field(default_factory=dict)


def run_kernels(env, runner, specs: list[KernelSpec], policy: KernelPolicy, device: str, threads: int | None,
                timeout_s: float, support: dict, profile: MachineProfile | None,
                worker_runner=None) -> KernelOutcome:
    """Time `specs` in `policy.repeats` fresh worker processes of `runner` in `env` and pool them.
    `worker_runner` is execution.launcher.run_worker (a parameter for tests).

    A reduced precision the device has no arithmetic for (`support`) is skipped on a GPU; on a CPU
    it is measured anyway and marked `settings["arithmetic"] = "emulated: <why>"`: the frameworks
    run it by converting (an amp_bf16 run on that CPU does just that), and what it costs is what
    explains such a run's speed and what the performance model needs to predict it. The machine's
    ceilings (`dlbench calibrate`) still leave it out: an emulated rate is no hardware peak."""
    worker_runner = worker_runner or run_worker

    outcome = KernelOutcome()
    runnable = []
    emulated = {}
    for s in specs:
        why = support.get(s.dtype)
        if why and device == "cpu":
            emulated[s.key] = f"emulated: {why}"
            runnable.append(s)
        elif why:
            outcome.results[s.key] = KernelResult(key=s.key, spec=s.to_dict(), status="skipped", reason=why,
                                                  flops=s.flops, bytes=s.bytes, unit=s.unit)
        else:
            runnable.append(s)
    pooled: dict[str, list[dict]] = {s.key: [] for s in runnable}
    if runnable:
        request = kernel_request(runnable, policy, device, threads)
        for index in range(policy.repeats):
            res_outcome = worker_runner(env.python, runner.worker, request, timeout_s, thread_env(threads),
                                        None, container=env.container)
            res = res_outcome.result or {}
            outcome.last_result = res or outcome.last_result
            outcome.tail = res_outcome.output_tail
            outcome.repeats.append({"index": index, "status": res_outcome.status, "reason": res_outcome.reason,
                                    "wall_s": res_outcome.wall_s,
                                    **({"yardstick": ys} if (ys := yardstick.times(res.get("yardstick"))) else {})})
            if res_outcome.status != "ok":
                outcome.status, outcome.reason = res_outcome.status, res_outcome.reason
                break
            asked = {_canonical(s.to_dict()): s.key for s in runnable}
            for entry in res.get("kernels") or []:  # validated (launcher); a spec not asked for is ignored
                key = asked.get(_canonical(entry["spec"]))
                if key in pooled:
                    pooled[key].append(entry)
    for s in runnable:
        outcome.results[s.key] = _pool(s, pooled[s.key], profile, outcome)
        if s.key in emulated and outcome.results[s.key].status == "ok":
            outcome.results[s.key].settings["arithmetic"] = emulated[s.key]
    outcome.results = {s.key: outcome.results[s.key] for s in specs}  # in the suite's order
    return outcome


def _canonical(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)


def _pool(spec: KernelSpec, entries: list[dict], profile: MachineProfile | None, outcome: KernelOutcome) -> KernelResult:
    base = dict(key=spec.key, spec=spec.to_dict(), flops=spec.flops, bytes=spec.bytes, unit=spec.unit)
    if not entries:
        return KernelResult(**base, status="failed" if outcome.status != "ok" else "skipped",
                            reason=outcome.reason or "not measured")
    bad = next((e for e in entries if e.get("status") != "ok"), None)
    if bad is not None:
        return KernelResult(**base, status=bad.get("status", "failed"), reason=bad.get("reason"))
    times = [t for e in entries for t in e.get("times_s", [])]
    if any(e.get("forward_median_s") is not None for e in entries):
        # backward = (forward+backward) - forward, per repeat; the pooled median of those differences
        median = statistics.median(e["median_s"] for e in entries)
    else:
        median = statistics.median(times)
    ceiling = ceiling_of(spec, profile)
    achieved = spec.achieved(median) if median > 0 else None
    return KernelResult(**base, status="ok", median_s=median, first_s=entries[0].get("first_s"), times_s=times,
                        achieved=achieved, ceiling=ceiling,
                        fraction=achieved / ceiling if achieved and ceiling else None,
                        settings=entries[0].get("settings", {}))


def execute_kernel_run(orchestrator, run: PlannedKernelRun, kernel_store: KernelStore, support: dict,
                       profile: MachineProfile | None, worker_runner=None) -> KernelRecord:
    """One framework x one kernel benchmark: environment, workers, the record written to the store.
    `orchestrator` is an execution.orchestrator.Orchestrator (its options and environments)."""
    opts = orchestrator.options
    b = run.benchmark
    started = datetime.now(timezone.utc)
    env = orchestrator.environment(run.runner)
    if isinstance(env, EnvironmentBuildError):
        outcome = KernelOutcome(status="failed", reason=str(env))
        env_info = {"backend": opts.env_backend, "error": str(env)}
        for s in b.specs:
            outcome.results[s.key] = KernelResult(key=s.key, spec=s.to_dict(), status="failed", reason=str(env),
                                                  flops=s.flops, bytes=s.bytes, unit=s.unit)
    else:
        env_info = env.describe()
        outcome = run_kernels(env, run.runner, list(b.specs), b.policy, opts.device, opts.threads, opts.timeout_s,
                              support, profile, worker_runner)
    res = outcome.last_result
    record = KernelRecord(
        run_id=new_run_id(started), started_at=started, ended_at=datetime.now(timezone.utc),
        dlbench=dlbench_provenance(), suite=b.suite, benchmark=b.name, source=b.source, profile=b.profile,
        device=opts.device, framework=res.get("framework", {"name": run.runner.name}), environment=env_info,
        machine=fingerprint(), threads_requested=opts.threads, threads_effective=res.get("threads", {}),
        timeout_s=opts.timeout_s, policy=b.policy.model_dump(), repeats=outcome.repeats, status=outcome.status,
        reason=outcome.reason, output_tail=outcome.tail if outcome.status != "ok" else "",
        ceilings=profile.ref if profile else None, kernels=list(outcome.results.values()))
    kernel_store.write(record)
    return record
