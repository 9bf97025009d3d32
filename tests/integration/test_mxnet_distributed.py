"""MXNet's multi-worker runner in its real venv: the kvstore dist_sync over ps-lite (scheduler, a
server per host, the workers), on 2 workers of the smoke profile: training and its one-worker
baseline, every collective checked at every size, a rank and a server killed mid-run, and two
"hosts" on loopback addresses (where ps-lite, not the host list, decides who is rank 0)."""

from __future__ import annotations

import dataclasses
import json
import math
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

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mxnet_runner():
    return RunnerRegistry(paths.runners_dir()).get("mxnet")


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


def test_dist_sync_training_and_its_baseline(tmp_path, mxnet_runner, suites):
    bench, _ = suites
    base, two = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_distributed(mxnet_runner, bench)
    assert base.status == two.status == "ok", (base.reason, two.reason)
    d = two.distributed
    assert d.backend.startswith("kvstore dist_sync") and d.launch == "ps-lite" and d.workers == 2
    assert base.distributed.backend.startswith("one worker, no servers")
    assert d.grad_bytes == 4 * bench.network.params  # float32 gradients of every trainable parameter
    assert two.params == bench.network.params
    assert d.scaling.efficiency is not None and d.scaling.baseline_run_id == base.run_id
    assert d.exposed_comm_s is not None and d.local_median_s > 0
    assert two.settings.runner["kvstore"] == "dist_sync" and two.settings.runner["update_on_kvstore"] is False
    assert two.settings.threads_effective["intra_op"] == 1  # OpenMP threads per worker, read back from libgomp
    assert two.framework["version"] == "1.9.1"
    assert not job_processes(tmp_path)


@pytest.mark.parametrize("method, exchange, payload_share", [
    ("2bit:0.5", "set_gradient_compression 2bit", 1 / 15),  # the codes pushed: 1/16 of the float32 words
    ("powersgd:4", "PowerSGD: kv.pushpull of each compressed weight's P factor", 1 / 100),
])
def test_compressed_training(tmp_path, mxnet_runner, suites, method, exchange, payload_share):
    """MXNet's own 2-bit quantisation (push of the codes, pull of the sum) and the runner's PowerSGD
    through the kvstore: the run records its compression, the runner's account of it and the
    analytical bytes."""
    from dlbench.axes import Compression
    from dlbench.definitions.weights import is_state, weight_shapes
    from dlbench.performance.communication import exchange_bytes

    bench, _ = suites
    brief = dataclasses.replace(bench, compression=method,
                                policy=bench.policy.model_copy(update={"warmup_iters": 1, "measure_iters": 3}))
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        mxnet_runner, brief, local_placement(2, 2), 16, 32, None)
    assert record.status == "ok", (record.reason, record.output_tail)
    assert record.workload.compression == method
    settings = record.settings.runner["compression"]
    assert settings["method"] == method and settings["error_feedback"] and exchange in settings["exchange"]
    shapes = [s for name, s in weight_shapes(bench.network.resolved).items() if not is_state(name)]
    expected = exchange_bytes(Compression.parse(method, who="test"), shapes, 2)
    assert record.distributed.exchange.payload_bytes == expected.payload < record.distributed.grad_bytes * payload_share
    assert not job_processes(tmp_path)


def test_topk_all_gathers_each_workers_pairs_through_the_servers(tmp_path, mxnet_runner, suites):
    """Top-k through the kvstore (each worker's pairs pushed as its row of a row_sparse key, the other
    worker's row pulled): the run records the method, its loss after each step, and bytes that are
    the analytical count through parameter servers, 2% of the float32 gradients'. (Its arithmetic,
    exact against numpy on a real dist_sync job: benchmarks/compression_topk_mxnet.py.)"""
    bench, _ = suites
    brief = dataclasses.replace(bench, compression="topk:0.01",
                                policy=bench.policy.model_copy(update={"warmup_iters": 2, "measure_iters": 2}))
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        mxnet_runner, brief, local_placement(2, 2), 16, 32, None)
    assert record.status == "ok", (record.reason, record.output_tail)
    settings = record.settings.runner["compression"]
    assert settings["method"] == "topk:0.01" and settings["density"] == 0.01 and settings["error_feedback"]
    assert "row_sparse_pull of the other workers' rows" in settings["exchange"]
    exchange = record.distributed.exchange
    assert "through the parameter servers" in exchange.formula and exchange.rounds == 2
    # the runner's own account of what it pushes and pulls is the analytical payload, per rank
    assert settings["pushed_bytes_per_step"] == settings["pulled_bytes_per_step"] == exchange.payload_bytes
    assert exchange.bytes_per_rank == exchange.payload_bytes == 8 * settings["pairs"]
    assert exchange.payload_bytes < record.distributed.grad_bytes / 40  # 1% of the values, with their indices
    losses = record.distributed.step_losses
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and len(set(losses)) == 3  # it trains
    assert not job_processes(tmp_path)


def test_collectives_are_correct_at_every_size(tmp_path, mxnet_runner, suites):
    _, comm = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(mxnet_runner, comm)
    *offered, all_to_all = records
    assert [r.status for r in offered] == ["ok"] * 4, [r.reason for r in offered]
    # the kvstore has no all-to-all (runner.toml): skipped, saying why, no rank asked
    assert all_to_all.status == "skipped" and "no all-to-all" in all_to_all.reason and all_to_all.comm is None
    for r in offered:
        ran = [s for s in r.comm.sizes if not s.skipped]
        assert ran and all(s.correct and s.busbw_gbps > 0 for s in ran)
        assert r.distributed.backend.startswith("kvstore dist_sync")
    assert not job_processes(tmp_path)


def _kill_mid_run(tmp_path, mxnet_runner, bench, victim):
    """Train with enough measured steps that the kill lands inside them; `victim(job_dir)` -> pid."""
    slow = dataclasses.replace(bench, policy=bench.policy.model_copy(update={"measure_iters": 400}))
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    box = {}
    thread = threading.Thread(target=lambda: box.update(
        record=orch._train_run(mxnet_runner, slow, local_placement(2, 2), 16, 32, None)))
    thread.start()
    deadline = time.monotonic() + 120
    started = None
    while time.monotonic() < deadline and started is None:
        started = next(iter((tmp_path / "jobs").glob("*/rank1.started")), None)
        time.sleep(0.05)
    assert started is not None, "rank 1 never started"
    time.sleep(8)  # mxnet imported, the kvstore joined, steps running
    pid = victim(started.parent)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(120)
    assert time.monotonic() - killed_at < 60
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not job_processes(tmp_path)  # the scheduler, the server and the other worker too
    return box["record"]


def test_a_rank_killed_mid_run_tears_down_the_whole_job(tmp_path, mxnet_runner, suites):
    bench, _ = suites
    record = _kill_mid_run(tmp_path, mxnet_runner, bench,
                           lambda job: json.loads((job / "rank1.started").read_text())["pid"])
    assert record.status == "failed" and record.reason.startswith("rank 1 "), record.reason
    assert "died without a result" in record.reason


def test_a_server_killed_mid_run_fails_the_job_naming_it(tmp_path, mxnet_runner, suites):
    bench, _ = suites

    def server(job):
        (pid,) = [p.pid for p in psutil.process_iter(["cmdline", "environ"])
                  if str(job) in " ".join(p.info["cmdline"] or []) and (p.info["environ"] or {}).get("DMLC_ROLE") == "server"]
        return pid

    record = _kill_mid_run(tmp_path, mxnet_runner, bench, server)
    assert record.status == "failed" and "kvstore server on 127.0.0.1 killed by SIGKILL" in record.reason, record.reason


def test_two_hosts_on_loopback_addresses(tmp_path, mxnet_runner, suites):
    _, comm = suites
    placement = hosts_placement("127.0.0.2,127.0.0.3", 2, cpus=2)
    small = dataclasses.replace(comm, collectives=("all_reduce", "broadcast"), sizes=(4096,))
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        mxnet_runner, small)
    for r in records:  # broadcast's root is ps-lite's rank 0: right only if the launcher numbered as ps-lite does
        assert r.status == "ok", r.reason
        assert r.distributed.hosts == ["127.0.0.2", "127.0.0.3"] and r.comm.sizes[0].correct
        assert r.distributed.backend.startswith("kvstore dist_sync")
    assert not job_processes(tmp_path)


def test_a_device_it_does_not_run_on_is_skipped_and_the_servers_still_end(tmp_path, mxnet_runner, suites):
    bench, _ = suites
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    env = orch.environment(mxnet_runner)
    request = {"action": "data_parallel", "network": bench.network.resolved, "mode": "train", "batch_size": 16,
               "precision": "fp32", "device": "cuda", "threads": 1, "learning_rate": 0.01, "momentum": 0.9,
               "seed": 0, "policy": bench.policy.model_dump()}
    outcome = orch.job(mxnet_runner, env, request, local_placement(2, 2))
    assert outcome.status == "skipped" and "runs on cpu only" in outcome.reason, outcome.reason
    assert outcome.wall_s < 25  # the scheduler and the server left with the workers, not at the exit grace
    assert not job_processes(tmp_path)
