"""TensorFlow's multi-worker runner in its real venv: MultiWorkerMirroredStrategy (TF_CONFIG, RING
over gRPC) training and TF's collective ops, on 2 workers of the smoke profile; a rank killed
mid-run; two "hosts" on loopback addresses."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.execution.placement import hosts_placement, local_placement
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

from .expert_parallel_runs import data_and_expert_runs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tf_runner():
    return RunnerRegistry(paths.runners_dir()).get("tensorflow")


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


def test_strategy_training_and_its_baseline(tmp_path, tf_runner, suites):
    bench, _ = suites
    base, two = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_distributed(tf_runner, bench)
    assert base.status == two.status == "ok", (base.reason, two.reason, two.output_tail)
    d = two.distributed
    assert d.backend == "ring (gRPC)" and d.launch == "ranks" and d.workers == 2
    assert d.grad_bytes == 4 * bench.network.params  # float32 gradients of every trainable parameter
    assert two.params == bench.network.params
    assert d.scaling.efficiency is not None and d.scaling.baseline_run_id == base.run_id
    # the step without Keras' all-reduce was traced and timed on every rank
    assert d.exposed_comm_s is not None and d.local_median_s > 0
    assert all(entry["local_iter_s"] for entry in two.repeats[0].ranks)
    runner_settings = two.settings.runner
    assert runner_settings["communication"]["implementation"] == "RING"
    assert "holds 1 CollectiveReduceV2" in runner_settings["gradient_exchange"]  # one pack: every gradient at once
    assert "holds no collective" in base.settings.runner["gradient_exchange"]  # one worker reduces nothing
    assert two.framework["version"].startswith("2.21.0")
    assert not job_processes(tmp_path)


def test_the_replicas_stay_equal_only_with_the_exchange(tmp_path, tf_runner, suites, monkeypatch):
    """Each worker trains on its own batch: with the gradient all-reduce both copies of the weights
    move and stay equal; the step without it lets them drift apart (so it really leaves it out)."""
    import numpy as np

    bench, _ = suites
    probe = dataclasses.replace(tf_runner, distributed=dataclasses.replace(
        tf_runner.distributed, worker=Path(__file__).with_name("tf_replica_probe_worker.py")))
    out = tmp_path / "weights"
    out.mkdir()
    monkeypatch.setenv("DLBENCH_TF_PROBE_OUT", str(out))
    brief = dataclasses.replace(bench, policy=bench.policy.model_copy(update={"warmup_iters": 1, "measure_iters": 2}))
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    record = orch._train_run(probe, brief, local_placement(2, 2), 16, 32, None)
    assert record.status == "ok", (record.reason, record.output_tail)

    def weights(rank, when):
        with np.load(out / f"rank{rank}-{when}.npz") as f:
            return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    assert same(weights(0, "initial"), weights(1, "initial"))  # the strategy broadcasts worker 0's values
    assert same(weights(0, "synced"), weights(1, "synced"))
    assert not same(weights(0, "synced"), weights(0, "initial"))
    assert not same(weights(0, "local"), weights(1, "local"))


def test_powersgd_compressed_training_keeps_the_replicas_equal(tmp_path, tf_runner, suites, monkeypatch):
    """PowerSGD rank 4 in the runner's own exchange (the Keras optimizer's all-reduce replaced): two
    all-reduces in the traced step, the analytical bytes in the record, and both workers applying
    the same decompressed sum (their weights move and stay equal, though each keeps its own error)."""
    import numpy as np

    from dlbench.axes import Compression
    from dlbench.definitions.weights import is_state, weight_shapes
    from dlbench.performance.communication import exchange_bytes

    bench, _ = suites
    probe = dataclasses.replace(tf_runner, distributed=dataclasses.replace(
        tf_runner.distributed, worker=Path(__file__).with_name("tf_replica_probe_worker.py")))
    out = tmp_path / "weights"
    out.mkdir()
    monkeypatch.setenv("DLBENCH_TF_PROBE_OUT", str(out))
    brief = dataclasses.replace(bench, compression="powersgd:4",
                                policy=bench.policy.model_copy(update={"warmup_iters": 1, "measure_iters": 3}))
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        probe, brief, local_placement(2, 2), 16, 32, None)
    assert record.status == "ok", (record.reason, record.output_tail)
    assert record.workload.compression == "powersgd:4"
    settings = record.settings.runner["compression"]
    assert settings["method"] == "powersgd:4" and settings["rank"] == 4 and settings["error_feedback"]
    assert settings["compressed_tensors"] == 4  # fcn5's four kernels; its biases go whole
    assert "holds 2 CollectiveReduceV2" in record.settings.runner["gradient_exchange"]  # P, then Q
    shapes = [s for name, s in weight_shapes(bench.network.resolved).items() if not is_state(name)]
    expected = exchange_bytes(Compression.parse("powersgd:4", who="test"), shapes, 2)
    assert record.distributed.exchange.bytes_per_rank == expected.per_rank < record.distributed.grad_bytes / 100

    def weights(rank, when):
        with np.load(out / f"rank{rank}-{when}.npz") as f:
            return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]

    synced = [weights(r, "synced") for r in (0, 1)]
    assert all(np.array_equal(a, b) for a, b in zip(*synced, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(synced[0], weights(0, "initial"), strict=True))
    assert not job_processes(tmp_path)


def test_expert_parallel_training_equals_data_parallel(tmp_path, tf_runner):
    """moe_tiny at 2 workers, its experts sharded (2 each: plain variables of each rank's, outside
    the strategy's scope), beside data parallelism of the same network from the same weights and
    data: expert_parallel_runs' checks (the same losses, so the custom gradient of the all-to-all,
    the inverse all-to-all, is right), and the step's all-to-alls counted in its traced graph."""
    _, expert = data_and_expert_runs(Store(tmp_path / "s"), options(tmp_path, repeats=1), tf_runner)
    a2a = expert.distributed.all_to_all
    assert a2a.dispatch.startswith("dropless, padded")
    # per block: the expert ids and rows dispatched, the outputs combined, and the two float ones
    # backward, each a block of 256 tokens x min(k, E/W) = 512 rows to the other rank (64 float32
    # or one int32 each): JAX's buffers
    assert expert.settings.runner["expert_parallel"]["all_to_alls_in_step"] == 10
    assert a2a.calls_per_step == 10 and a2a.bytes_per_step == 2 * (4 * 512 * 64 * 4 + 512 * 4)
    assert a2a.seconds_per_step is None and a2a.timing.startswith("not timed apart")
    assert "holds 1 CollectiveReduceV2" in expert.settings.runner["gradient_exchange"]  # the mirrored weights'
    assert expert.distributed.exposed_comm_s is not None
    assert not job_processes(tmp_path)


def test_collectives_are_correct_at_every_size(tmp_path, tf_runner, suites):
    _, comm = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(tf_runner, comm)
    by_op = {r.comm.collective if r.comm else r.benchmark: r for r in records}
    scatter = by_op.pop("reduce_scatter")
    # TensorFlow's reduce-scatter has an NCCL implementation only: not offered by the CPU ring
    assert scatter.status == "skipped" and "NCCL implementation only" in scatter.reason
    assert all(s.skipped and s.time_s is None for s in scatter.comm.sizes)
    assert "all_to_all" in by_op  # CollectiveAllToAllV2 runs on the CPU ring's gRPC
    for r in by_op.values():
        assert r.status == "ok", r.reason
        ran = [s for s in r.comm.sizes if not s.skipped]
        assert ran and all(s.correct and s.busbw_gbps > 0 for s in ran)
        assert r.distributed.backend == "ring (gRPC)"
    assert not job_processes(tmp_path)


def test_a_rank_killed_mid_run(tmp_path, tf_runner, suites):
    bench, _ = suites
    # enough measured steps that the kill lands inside them
    slow = dataclasses.replace(bench, policy=bench.policy.model_copy(update={"measure_iters": 400}))
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    box = {}
    thread = threading.Thread(target=lambda: box.update(
        record=orch._train_run(tf_runner, slow, local_placement(2, 2), 16, 32, None)))
    thread.start()
    deadline = time.monotonic() + 120
    started = None
    while time.monotonic() < deadline and started is None:
        started = next(iter((tmp_path / "jobs").glob("*/rank1.started")), None)
        time.sleep(0.05)
    assert started is not None, "rank 1 never started"
    time.sleep(20)  # TensorFlow imported, the strategy's cluster joined, steps running
    job_dir = started.parent
    assert not (job_dir / "rank0.json").exists() and not (job_dir / "rank1.json").exists()
    rank1 = json.loads(started.read_text())["pid"]
    rank0 = json.loads((job_dir / "rank0.started").read_text())["pid"]
    os.kill(rank1, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(120)
    record = box["record"]
    assert time.monotonic() - killed_at < 60
    assert record.status == "failed" and record.reason.startswith("rank 1 "), record.reason
    assert "died without a result" in record.reason
    for pid in (rank0, rank1):  # the survivor was stopped with the job
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not job_processes(tmp_path)


def test_two_hosts_on_loopback_addresses(tmp_path, tf_runner, suites):
    _, comm = suites
    placement = hosts_placement("127.0.0.2,127.0.0.3", 2, cpus=2)
    small = dataclasses.replace(comm, collectives=("all_reduce", "broadcast"), sizes=(4096,))
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        tf_runner, small)
    for r in records:
        assert r.status == "ok", r.reason
        assert r.distributed.hosts == ["127.0.0.2", "127.0.0.3"] and r.comm.sizes[0].correct
