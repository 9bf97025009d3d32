"""PyTorch's multi-worker runner in its real venv: DDP under torchrun (gloo) and the collectives,
on 2 workers of the smoke profile; a rank killed mid-run; two "hosts" on loopback addresses."""

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
def torch_runner():
    return RunnerRegistry(paths.runners_dir()).get("torch")


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


def test_ddp_training_and_its_baseline(tmp_path, torch_runner, suites):
    bench, _ = suites
    base, two = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_distributed(torch_runner, bench)
    assert base.status == two.status == "ok", (base.reason, two.reason)
    d = two.distributed
    assert d.backend == "gloo" and d.launch == "torchrun" and d.workers == 2
    assert d.grad_bytes == 4 * bench.network.params  # float32 gradients of every trainable parameter
    assert two.params == bench.network.params
    assert d.scaling.efficiency is not None and d.scaling.baseline_run_id == base.run_id
    assert d.exposed_comm_s is not None and d.local_median_s > 0
    assert two.settings.runner["ddp"]["bucket_cap_mb"] == 25
    assert two.framework["version"].startswith("2.13.0")
    assert not job_processes(tmp_path)



def test_gtopk_compressed_training(tmp_path, torch_runner, suites):
    """gTop-k (the seed's method) at 2 workers: compressed_runs.gtopk_run's checks, and the runner's
    own way of exchanging the pairs."""
    runner = gtopk_run(Store(tmp_path / "s"), options(tmp_path), torch_runner, suites[0])
    assert runner["compression"]["hook"].startswith("runner gtopk_hook")
    assert not job_processes(tmp_path)


def test_collectives_are_correct_at_every_size(tmp_path, torch_runner, suites):
    _, comm = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(torch_runner, comm)
    assert [r.status for r in records] == ["ok"] * 5, [r.reason for r in records]
    assert records[-1].comm.collective == "all_to_all" and records[-1].comm.bus_factor == 0.5
    for r in records:
        ran = [s for s in r.comm.sizes if not s.skipped]
        assert ran and all(s.correct and s.busbw_gbps > 0 for s in ran)
        assert r.distributed.backend == "gloo"


def test_a_rank_killed_mid_run_under_torchrun(tmp_path, torch_runner, suites):
    bench, _ = suites
    # enough measured steps that the kill lands inside them
    slow = dataclasses.replace(bench, policy=bench.policy.model_copy(update={"measure_iters": 400}))
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    box = {}
    thread = threading.Thread(target=lambda: box.update(
        record=orch._train_run(torch_runner, slow, local_placement(2, 2), 16, 32, None)))
    thread.start()
    deadline = time.monotonic() + 120
    started = None
    while time.monotonic() < deadline and started is None:
        started = next(iter((tmp_path / "jobs").glob("*/rank1.started")), None)
        time.sleep(0.05)
    assert started is not None, "rank 1 never started"
    time.sleep(8)  # torch imported, the process group joined, steps running
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


def test_two_hosts_on_loopback_addresses(tmp_path, torch_runner, suites):
    _, comm = suites
    placement = hosts_placement("127.0.0.2,127.0.0.3", 2, cpus=2)
    small = dataclasses.replace(comm, collectives=("all_reduce",), sizes=(4096,))
    (r,) = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        torch_runner, small)
    assert r.status == "ok", r.reason
    assert r.distributed.hosts == ["127.0.0.2", "127.0.0.3"] and r.comm.sizes[0].correct


def test_expert_parallel_training_equals_data_parallel(tmp_path, torch_runner):
    """moe_tiny at 2 workers, its experts sharded (2 each), beside data parallelism of the same
    network from the same weights and data: expert_parallel_runs' checks (the same losses), and the
    all-to-alls counted and timed."""
    _, expert = data_and_expert_runs(Store(tmp_path / "s"), options(tmp_path, repeats=1), torch_runner)
    a2a = expert.distributed.all_to_all
    assert a2a.dispatch.startswith("dropless")
    assert a2a.calls_per_step == 10  # per block: the counts, dispatch and combine, and their two backward
    assert a2a.bytes_per_step > 0 and 0 < a2a.share <= 1
