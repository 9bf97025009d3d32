"""Records for the load, index and `results` tests, varied along the fields the filters select on."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from dlbench.analysis.timing import summarise
from dlbench.store.record import NetworkInfo, Record, Repeat, Settings, Workload, new_run_id

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def make_record(*, framework: str = "torch", network: str = "fcn5", mode: str = "train", machine: str = "hostA",
                started: datetime = T0, status: str = "ok", iterations: tuple[int, ...] = (5, 7, 6),
                batch_size: int = 16, device: str = "cpu", machine_id: str | None = None) -> Record:
    """A run with one repeat per entry of `iterations` (that many measured times each); a run that is
    not ok has a failed last repeat without times, like a worker that died."""
    repeats = []
    for i, n in enumerate(iterations):
        failed = status != "ok" and i == len(iterations) - 1
        repeats.append(Repeat(index=i, status="failed" if failed else "ok", first_iter_s=0.5,
                              warmup_iter_s=[0.2, 0.1], warmup_settled=True,
                              iter_s=[] if failed else [0.01 * (i + 1) + 0.001 * k for k in range(n)],
                              window_monotonic_ns=[0, 10], wall_s=1.0))
    fingerprint = {"hostname": machine, "cpu_model": "cpu", "gpus": []}
    if machine_id:
        fingerprint["machine_id"] = machine_id
    return Record(
        run_id=new_run_id(started), started_at=started, ended_at=started + timedelta(seconds=30),
        dlbench={"version": "0.1.0", "commit": "abc", "dirty": False}, suite="fcn", benchmark=f"{network}-{mode}",
        network=NetworkInfo(name=network, file=f"suites/networks/{network}.yaml", hash="ab" * 32,
                            params_described=1000, flops_per_sample=2000, definition={"name": network}),
        workload=Workload(mode=mode, batch_size=batch_size, precision="fp32", learning_rate=0.05, momentum=0.9,
                          device=device),
        framework={"name": framework, "version": "1.0"}, environment={"backend": "current"},
        machine=fingerprint,
        settings=Settings(profile="smoke", repeats=len(iterations), threads_requested=2, timeout_s=60.0, policy={}),
        repeats=repeats, summary=summarise(repeats, batch_size) if status == "ok" else None,
        params=1000 if status == "ok" else None, status=status, reason=None if status == "ok" else "it broke",
    )


def record_from_times(times: list[list[float]], *, started: datetime = T0, benchmark: str = "fcn5-train",
                      framework: str = "torch", version: str = "1.0", machine: str = "hostA", batch_size: int = 16,
                      machine_id: str | None = None, status: str = "ok") -> Record:
    """A run whose repeats measured exactly `times` (one list per repeat); a run that is not ok keeps
    its repeats but has no summary, as a run with a failed repeat would."""
    repeats = [Repeat(index=i, status="ok", iter_s=t, window_monotonic_ns=[0, 1]) for i, t in enumerate(times)]
    network = benchmark.rsplit("-", 1)[0]
    fingerprint = {"hostname": machine, **({"machine_id": machine_id} if machine_id else {})}
    return Record(
        run_id=new_run_id(started), started_at=started, ended_at=started + timedelta(seconds=30),
        dlbench={"version": "0.1.0"}, suite="fcn", benchmark=benchmark,
        network=NetworkInfo(name=network, file=f"{network}.yaml", hash="ab" * 32, params_described=1,
                            flops_per_sample=1, definition={}),
        workload=Workload(mode="train", batch_size=batch_size, precision="fp32", learning_rate=0.05,
                          momentum=0.9, device="cpu"),
        framework={"name": framework, "version": version}, environment={}, machine=fingerprint,
        settings=Settings(profile="smoke", repeats=len(times), threads_requested=2, timeout_s=60.0, policy={}),
        repeats=repeats, summary=summarise(repeats, batch_size) if status == "ok" else None, status=status,
        reason=None if status == "ok" else "it broke")
