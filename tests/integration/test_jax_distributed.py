"""JAX's multi-worker runner in its real venv: jax.distributed with a data-sharded jitted step and
the lax collectives over gloo, on 2 workers of the smoke profile; a rank killed mid-run; two
"hosts" on loopback addresses."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time

import psutil
import pytest

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.execution.placement import hosts_placement, local_placement
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

from .compressed_runs import gtopk_run
from .expert_parallel_runs import data_and_expert_runs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def jax_runner():
    return RunnerRegistry(paths.runners_dir()).get("jax")


@pytest.fixture(scope="module")
def suites():
    catalog = SuiteCatalog(paths.suites_dir())
    dist = catalog.load_distributed_suite(paths.suites_dir() / "distributed.yaml", "smoke", "cpu")
    comm = catalog.load_distributed_suite(paths.suites_dir() / "comm.yaml", "smoke", "cpu").comm
    return dist.benchmarks[0], comm


def options(tmp_path, placement=None, **changes):
    return dataclasses.replace(DistributedOptions(
        device="cpu", env_backend="venv", placement=placement or local_placement(2, 2), threads=1, scaling="strong",
        timeout_s=300, cache=paths.cache_dir(), job_root=tmp_path / "jobs"), **changes)


def job_processes(tmp_path):
    jobs = str(tmp_path / "jobs")
    return [p for p in psutil.process_iter(["cmdline"]) if any(jobs in a for a in (p.info["cmdline"] or []))]


def test_data_parallel_training_and_its_baseline(tmp_path, jax_runner, suites):
    bench, _ = suites
    base, two = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_distributed(jax_runner, bench)
    assert base.status == two.status == "ok", (base.reason, two.reason)
    d = two.distributed
    assert d.backend == "gloo" and d.launch == "ranks" and d.workers == 2
    assert d.grad_bytes == 4 * bench.network.params  # float32 gradients of every trainable parameter
    assert two.params == bench.network.params
    assert d.scaling.efficiency is not None and d.scaling.baseline_run_id == base.run_id
    assert d.exposed_comm_s is not None and d.local_median_s > 0
    runner = two.settings.runner
    # the gradient exchange is in the compiled step (XLA combines the pmean's all-reduces)
    assert runner["collective_ops_in_step"] >= 1 and "pmean" in runner["gradient_exchange"]
    assert two.framework["version"] == "0.10.2"
    # one core per rank (XLA:CPU sizes its thread pools from the affinity mask)
    assert len(two.settings.threads_effective["cpus"]) == 1
    assert not job_processes(tmp_path)



def test_gtopk_compressed_training(tmp_path, jax_runner, suites):
    """gTop-k (the seed's method) at 2 workers: compressed_runs.gtopk_run's checks, and the runner's
    own way of exchanging the pairs."""
    runner = gtopk_run(Store(tmp_path / "s"), options(tmp_path), jax_runner, suites[0])
    assert "ppermute" in runner["gradient_exchange"]
    assert not job_processes(tmp_path)


def test_collectives_are_correct_at_every_size(tmp_path, jax_runner, suites):
    _, comm = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(jax_runner, comm)
    assert [r.status for r in records] == ["ok"] * 5, [r.reason for r in records]
    assert records[-1].comm.collective == "all_to_all" and records[-1].comm.bus_factor == 0.5
    for r in records:
        ran = [s for s in r.comm.sizes if not s.skipped]
        assert ran and all(s.correct and s.busbw_gbps > 0 for s in ran)
        assert r.distributed.backend == "gloo" and r.distributed.launch == "ranks"
    assert not job_processes(tmp_path)


def test_a_rank_killed_mid_run(tmp_path, jax_runner, suites):
    bench, _ = suites
    # enough measured steps that the kill lands inside them
    slow = dataclasses.replace(bench, policy=bench.policy.model_copy(update={"measure_iters": 400}))
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    box = {}
    thread = threading.Thread(target=lambda: box.update(
        record=orch._train_run(jax_runner, slow, local_placement(2, 2), 16, 32, None)))
    thread.start()
    deadline = time.monotonic() + 120
    started = None
    while time.monotonic() < deadline and started is None:
        started = next(iter((tmp_path / "jobs").glob("*/rank1.started")), None)
        time.sleep(0.05)
    assert started is not None, "rank 1 never started"
    log = started.with_name("rank1.log")
    # jax imported, the job joined (gloo connects at the first collective), steps running
    while time.monotonic() < deadline and "connected to 1 peer" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    time.sleep(5)
    rank1 = json.loads(started.read_text())["pid"]
    os.kill(rank1, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(120)
    record = box["record"]
    assert time.monotonic() - killed_at < 60
    assert record.status == "failed" and record.reason.startswith("rank 1 "), record.reason
    assert "died without a result" in record.reason
    assert not psutil.pid_exists(rank1) or psutil.Process(rank1).status() == psutil.STATUS_ZOMBIE
    assert not job_processes(tmp_path)


def test_two_hosts_on_loopback_addresses(tmp_path, jax_runner, suites):
    _, comm = suites
    placement = hosts_placement("127.0.0.2,127.0.0.3", 2, cpus=2)
    small = dataclasses.replace(comm, collectives=("all_reduce",), sizes=(4096,))
    (r,) = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        jax_runner, small)
    assert r.status == "ok", r.reason
    assert r.distributed.hosts == ["127.0.0.2", "127.0.0.3"] and r.comm.sizes[0].correct
    # loopback "hosts" share this machine's cores: the ranks took different ones
    assert r.settings.threads_effective["machine_slot"] == 0 and len(r.settings.threads_effective["cpus"]) == 1


def test_expert_parallel_training_equals_data_parallel(tmp_path, jax_runner):
    """moe_tiny at 2 workers, its experts sharded along the mesh (2 each), beside data parallelism
    of the same network from the same weights and data: expert_parallel_runs' checks (the same
    losses), and the step's all-to-alls counted in its compiled program."""
    _, expert = data_and_expert_runs(Store(tmp_path / "s"), options(tmp_path, repeats=1), jax_runner)
    a2a = expert.distributed.all_to_all
    assert a2a.dispatch.startswith("dropless, padded")
    assert expert.settings.runner["expert_parallel"]["all_to_alls_in_step"] > 0
    # per block: rows and expert ids dispatched, outputs combined, and the two float ones backward,
    # each a block of 256 tokens x min(k, E/W) = 512 rows to the other rank (64 float32 or one int32 each)
    assert a2a.calls_per_step == 10 and a2a.bytes_per_step == 2 * (4 * 512 * 64 * 4 + 512 * 4)
    assert a2a.seconds_per_step is None and a2a.timing.startswith("not timed apart")
    assert expert.distributed.exposed_comm_s is not None
