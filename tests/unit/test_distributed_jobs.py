"""Multi-worker jobs with the fake runner (tests/fixtures/runners/fake: a TCP-star 'engine', no
framework): records of distributed training and collectives, and every way a job can go wrong:
a rank killed from outside mid-run, a rank that dies, raises or hangs, a launcher that abandons
its ranks, a rank's orphaned child. Each checks the record, the reason (which rank, its log) and
that no process of the job is left."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.execution.jobs import run_job
from dlbench.execution.launch_styles import ProcessSpec
from dlbench.execution.placement import detect, hosts_placement, local_placement
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


@pytest.fixture(scope="module")
def suites():
    catalog = SuiteCatalog(ROOT / "suites")
    dist = catalog.load_distributed_suite(ROOT / "suites" / "distributed.yaml", "smoke", "cpu")
    comm = catalog.load_distributed_suite(ROOT / "suites" / "comm.yaml", "smoke", "cpu").comm
    return dist.benchmarks[0], comm  # fcn5-train at global batch 32


@pytest.fixture(autouse=True)
def behaviour(monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.002")
    monkeypatch.delenv("DLBENCH_FAKE_DIST", raising=False)
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.delenv("DLBENCH_FAKE_UNOFFERED", raising=False)


def options(tmp_path, placement=None, **changes) -> DistributedOptions:
    placement = placement or local_placement(2, cpus=2)
    base = DistributedOptions(device="cpu", env_backend="current", placement=placement, threads=1, scaling="strong",
                              timeout_s=60, cache=tmp_path / "cache", job_root=tmp_path / "jobs")
    return dataclasses.replace(base, **changes)


def job_processes(tmp_path: Path) -> list[psutil.Process]:
    """Processes of this user whose command line names a job folder of this test."""
    jobs = str(tmp_path / "jobs")
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(jobs in part for part in (p.info["cmdline"] or [])) and p.pid != os.getpid():
            out.append(p)
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------ jobs that work

def test_distributed_training_records_baseline_and_scaling(tmp_path, fake, suites):
    bench, _ = suites
    store = Store(tmp_path / "store")
    records = DistributedOrchestrator(store, options(tmp_path)).run_distributed(fake, bench)
    assert [r.benchmark for r in records] == ["fcn5-train-w1", "fcn5-train-w2"]
    base, two = records
    assert all(r.status == "ok" for r in records)
    assert base.workload.batch_size == 32 and base.distributed.per_worker_batch == 32  # strong: the global batch
    assert two.workload.batch_size == 32 and two.distributed.per_worker_batch == 16
    d = two.distributed
    assert d.workers == 2 and d.placement == "local" and d.launch == "ranks" and d.backend == "fake-tcp"
    assert d.grad_bytes == bench.network.params * 4 and d.threads_per_worker == 1
    # the repeat's time is the slowest rank's, per iteration, from both ranks' own timings
    rep = two.repeats[0]
    assert [e["rank"] for e in rep.ranks] == [0, 1]
    assert rep.iter_s == [max(a, b) for a, b in zip(rep.ranks[0]["iter_s"], rep.ranks[1]["iter_s"])]
    assert len(rep.iter_s) == bench.policy.measure_iters
    assert two.summary.samples_per_s == pytest.approx(32 / two.summary.median_s)
    s = d.scaling
    assert s.baseline_run_id == base.run_id and s.baseline_source == "same_invocation" and s.mode == "strong"
    assert s.efficiency == pytest.approx(two.summary.samples_per_s / (2 * base.summary.samples_per_s))
    assert base.distributed.scaling.efficiency is None and "baseline" in base.distributed.scaling.reason
    # without the exchange a fake step is a bare sleep: the exposed time is the barrier's, not below zero by much
    assert d.exposed_comm_s is not None and d.local_median_s is not None and "without" in d.exposed_comm_method
    # stored like every run, read back at the current schema
    assert sorted(r.run_id for r in store.records()) == sorted(r.run_id for r in records)
    assert not job_processes(tmp_path)


def test_weak_scaling_keeps_the_per_worker_batch(tmp_path, fake, suites):
    bench, _ = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, scaling="weak")).run_distributed(
        fake, bench)
    base, two = records
    assert (base.workload.batch_size, two.workload.batch_size, two.distributed.per_worker_batch) == (32, 64, 32)
    assert two.distributed.scaling.mode == "weak" and two.distributed.scaling.efficiency is not None


def test_collectives_one_record_each_with_checked_bandwidths(tmp_path, fake, suites):
    _, comm = suites
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(fake, comm)
    assert [r.benchmark for r in records] == [f"{c}-w2" for c in comm.collectives]
    for r in records:
        assert r.status == "ok" and r.workload.mode == "collective" and r.summary is None
        c = r.comm
        assert c.workers == 2 and [s.size_bytes for s in c.sizes] == list(comm.sizes)
        for s in c.sizes:
            if s.skipped:  # 4 B cannot give each of 2 ranks a float32 to gather or scatter
                assert c.collective in ("all_gather", "reduce_scatter", "all_to_all") and s.size_bytes == 4
                continue
            assert s.correct is True and s.iterations == comm.policy.measure_iters
            assert s.algbw_gbps == pytest.approx(s.bytes / s.time_s / 1e9)
            assert s.busbw_gbps == pytest.approx(s.algbw_gbps * c.bus_factor)
        assert r.network.name == c.collective and r.network.definition["sizes_bytes"] == list(comm.sizes)
    assert {r.comm.collective: r.comm.bus_factor for r in records} == {
        "all_reduce": 1.0, "all_gather": 0.5, "broadcast": 1.0, "reduce_scatter": 0.5, "all_to_all": 0.5}


def test_a_wrong_result_fails_that_collectives_record(tmp_path, fake, suites, monkeypatch):
    _, comm = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "wrong:1")
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(fake, comm)
    for r in records:
        assert r.status == "failed"
        assert "wrong result at" in r.reason and "rank 1: element 1" in r.reason
        assert any(s.correct is False for s in r.comm.sizes)


def test_a_collective_the_engine_does_not_offer_is_a_skipped_record(tmp_path, fake, suites, monkeypatch):
    _, comm = suites
    monkeypatch.setenv("DLBENCH_FAKE_UNOFFERED", "reduce_scatter")
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(fake, comm)
    by_op = {r.comm.collective: r for r in records}
    scatter = by_op.pop("reduce_scatter")
    assert scatter.status == "skipped" and scatter.reason.startswith("the fake engine does not offer reduce_scatter")
    assert all(s.skipped == scatter.reason and s.time_s is None for s in scatter.comm.sizes)
    assert all(r.status == "ok" for r in by_op.values()), [r.reason for r in by_op.values()]


def test_every_rank_skipping_is_a_skipped_run(tmp_path, fake, suites, monkeypatch):
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "skip:0")
    base, two = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_distributed(fake, bench)
    assert base.status == two.status == "skipped" and "skips on request" in two.reason


def test_a_runner_without_a_distributed_part_is_skipped_saying_so(tmp_path, fake, suites):
    _, comm = suites
    unported = dataclasses.replace(fake, distributed=None)
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(unported, comm)
    assert len(records) == 5
    assert all(r.status == "skipped" and "[distributed]" in r.reason for r in records)


def test_a_collective_the_runner_declares_not_offered_is_skipped_without_asking_a_rank(tmp_path, fake, suites):
    _, comm = suites
    declared = dataclasses.replace(fake, distributed=dataclasses.replace(
        fake.distributed, collectives_not_offered=(("all_to_all", "the fake engine has no all-to-all"),)))
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path)).run_comm(declared, comm)
    by_op = {r.benchmark: r for r in records}
    skipped = by_op.pop("all_to_all-w2")
    assert skipped.status == "skipped" and skipped.comm is None and skipped.repeats == []
    assert skipped.reason == ("fake runner: the fake engine has no all-to-all "
                              "(runner.toml [distributed.collectives_not_offered])")
    assert all(r.status == "ok" for r in by_op.values()), [r.reason for r in by_op.values()]
    # only one collective, and that one not offered: no job at all
    alone = dataclasses.replace(comm, collectives=("all_to_all",))
    (only,) = DistributedOrchestrator(Store(tmp_path / "t"), options(tmp_path)).run_comm(declared, alone)
    assert only.status == "skipped" and only.repeats == [] and "no all-to-all" in only.reason
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


# ------------------------------------------------------------------ jobs that fail

def run_in_thread(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()))
    thread.start()
    return thread, box


def wait_for(predicate, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def test_a_rank_killed_mid_run_tears_the_job_down(tmp_path, fake, suites, monkeypatch):
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.05")  # 10 measured steps: about half a second of them
    orch = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))
    thread, box = run_in_thread(lambda: orch._train_run(fake, bench, local_placement(2, 2), 16, 32, None))
    started = wait_for(lambda: next(iter((tmp_path / "jobs").glob("*/rank1.started")), None))
    rank1 = json.loads(started.read_text())["pid"]
    time.sleep(0.4)  # into the measured iterations
    os.kill(rank1, signal.SIGKILL)
    t_kill = time.monotonic()
    thread.join(30)
    record = box["value"]
    assert time.monotonic() - t_kill < 10  # not the job's 60 s timeout: the death is seen at once
    assert record.status == "failed"
    assert record.reason.startswith("rank 1 (of 2, on") and "died without a result" in record.reason
    assert record.repeats[0].status == "failed" and record.summary is None
    assert "rank 1 on " in record.output_tail and "died without a result" in record.output_tail
    assert "rank 0 on " in record.output_tail
    assert not alive(rank1) and not job_processes(tmp_path)
    assert not list((tmp_path / "jobs").iterdir())  # the job folder is gone too


@pytest.mark.parametrize("what, words", [("die", "died without a result"), ("raise", "fake failure on rank 1")])
def test_the_first_rank_to_fail_is_the_reason(tmp_path, fake, suites, monkeypatch, what, words):
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", f"{what}:1")
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        fake, bench, local_placement(2, 2), 16, 32, None)
    # rank 0 fails too, on losing its peer, but later: the reason is rank 1's
    assert record.status == "failed" and record.reason.startswith("rank 1 ") and words in record.reason
    assert not job_processes(tmp_path)


def test_a_rank_that_exits_without_a_result(tmp_path, fake, suites, monkeypatch):
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "exit0:1")
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        fake, bench, local_placement(2, 2), 16, 32, None)
    assert record.status == "failed" and "rank 1" in record.reason
    assert not job_processes(tmp_path)


def test_a_hanging_rank_times_the_job_out(tmp_path, fake, suites, monkeypatch):
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "hang:1")
    t0 = time.monotonic()
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, timeout_s=4))._train_run(
        fake, bench, local_placement(2, 2), 16, 32, None)
    assert time.monotonic() - t0 < 4 + 15  # the timeout, then a grace period and SIGKILL
    assert record.status == "timeout" and "timeout of 4 s" in record.reason and "[0, 1]" in record.reason
    assert not job_processes(tmp_path)


def test_a_ranks_orphan_in_a_session_of_its_own_is_found_by_its_job_tag(tmp_path, fake, suites, monkeypatch):
    bench, _ = suites
    pidfile = tmp_path / "orphan.pid"
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "orphan:1")
    monkeypatch.setenv("DLBENCH_FAKE_PIDFILE", str(pidfile))
    record = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path))._train_run(
        fake, bench, local_placement(2, 2), 16, 32, None)
    assert record.status == "failed" and record.reason.startswith("rank 1 ")
    orphan = int(pidfile.read_text())
    assert wait_for(lambda: not alive(orphan), within=5)


ABANDONING_LAUNCHER = """
import os, signal, subprocess, sys
# like torchrun: each rank in a session of its own; unlike it, abandon them on SIGTERM
signal.signal(signal.SIGTERM, lambda *a: os._exit(1))
world = int(sys.argv[1])
procs = [subprocess.Popen(sys.argv[2:], env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                                "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)},
                          start_new_session=True) for r in range(world)]
sys.exit(max(p.wait() for p in procs))
"""


def test_ranks_abandoned_by_their_launcher_are_stopped_too(tmp_path, fake, suites, monkeypatch):
    """The launcher is SIGTERMed first and exits, leaving ranks in sessions of their own: the job
    still ends them (they were seen under the launcher)."""
    bench, _ = suites
    monkeypatch.setenv("DLBENCH_FAKE_DIST", "hang:1")
    job = tmp_path / "jobs" / "j"
    job.mkdir(parents=True)
    request = {"protocol": 1, "action": "data_parallel", "network": bench.network.resolved, "mode": "train",
               "batch_size": 16, "device": "cpu", "threads": 1, "learning_rate": 0.1, "momentum": 0.9,
               "policy": bench.policy.model_dump()}
    (job / "request.json").write_text(json.dumps(request))
    port = socket.socket()
    port.bind(("", 0))
    master = port.getsockname()[1]
    port.close()
    spec = ProcessSpec(local_placement(2, 2).hosts[0],
                       [sys.executable, "-c", ABANDONING_LAUNCHER, "2", sys.executable, str(fake.distributed.worker),
                        str(job / "request.json"), str(job)],
                       {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master)}, "abandoning launcher")
    outcome = run_job([spec], lambda s: s.argv, job, 2, timeout_s=4, cwd=tmp_path)
    assert outcome.status == "timeout" and outcome.left_behind == []
    ranks = [json.loads((job / f"rank{r}.started").read_text())["pid"] for r in (0, 1)]
    assert not any(alive(pid) for pid in ranks)
    assert not job_processes(tmp_path)


def test_a_launcher_that_cannot_start_is_a_failed_job(tmp_path):
    job = tmp_path / "jobs" / "j"
    job.mkdir(parents=True)
    spec = ProcessSpec(local_placement(1, 2).hosts[0], [str(tmp_path / "no-such-launcher")], {}, "missing launcher")
    outcome = run_job([spec], lambda s: s.argv, job, 1, timeout_s=10, cwd=tmp_path)
    assert outcome.status == "failed" and "could not start missing launcher" in outcome.reason


def test_a_launcher_failing_before_any_rank_says_so(tmp_path):
    job = tmp_path / "jobs" / "j"
    job.mkdir(parents=True)
    spec = ProcessSpec(local_placement(1, 2).hosts[0],
                       [sys.executable, "-c", "import sys; print('bad launcher option', file=sys.stderr); sys.exit(2)"],
                       {}, "torchrun on 127.0.0.1 (rank 0)")
    outcome = run_job([spec], lambda s: s.argv, job, 1, timeout_s=10, cwd=tmp_path)
    assert outcome.status == "failed"
    assert outcome.reason == "torchrun on 127.0.0.1 (rank 0) exited with status 2: bad launcher option"


# ------------------------------------------------------------------ malformed rank files (issue 18)

RANK_WRITER = """
import json, os, socket, sys
job, rank, world = sys.argv[1], int(sys.argv[2]), sys.argv[3]
content = sys.argv[4].replace("RANK", sys.argv[2]).replace("WORLD", world).encode()
def put(name, data):
    with open(os.path.join(job, name + ".tmp"), "wb") as f:
        f.write(data)
    os.replace(os.path.join(job, name + ".tmp"), os.path.join(job, name))
put(f"rank{rank}.started", json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
put(f"rank{rank}.json", b"\\xff" if content == b"not-utf8" else content)
"""


@pytest.mark.parametrize("content, words", [
    ('{"status": "ok", "rank": RANK, "world_size": WORLD, "framework": {"name": "fake"}, "first_iter_s": 0.1, '
     '"iter_s": [-1.0], "window_monotonic_ns": [1, 2]}', "field 'iter_s[0]': Input should be greater than 0"),
    ('{"status": "ok", "rank": RANK, "world_size": WORLD, "framework": {"name": "fake"}}', "field 'first_iter_s'"),
    ("not-utf8", "not UTF-8"),
    ('["a", "list"]', "not a JSON object"),
], ids=["negative-time", "no-iterations", "not-utf8", "list"])
def test_a_malformed_rank_result_is_a_failed_record_naming_the_field(tmp_path, fake, suites, monkeypatch,
                                                                      content, words):
    """Every job of the benchmark (the one-worker baseline, then two workers) gets ranks that write
    a malformed result: each is a failed record saying which rank and field, and the plan goes on."""
    from dlbench.execution import distributed

    def writers(layout):
        return [ProcessSpec(host, [sys.executable, "-c", RANK_WRITER, str(layout.job_dir), str(rank),
                                   str(layout.placement.workers), content], {},
                            f"rank {rank}") for rank, host in enumerate(layout.placement.hosts[0] for _ in
                                                                           range(layout.placement.workers))]

    monkeypatch.setitem(distributed.STYLES, "ranks", writers)
    bench, _ = suites
    store = Store(tmp_path / "store")
    records = DistributedOrchestrator(store, options(tmp_path)).run_distributed(fake, bench)
    assert [r.benchmark for r in records] == ["fcn5-train-w1", "fcn5-train-w2"]
    for r in records:
        assert r.status == "failed", r.reason
        assert re.search(r"rank \d \(of \d, on .*\) failed: wrote a malformed file: rank \d result", r.reason), r.reason
        assert words in r.reason, r.reason
    assert len(list(store.records())) == 2
    assert not job_processes(tmp_path)


# ------------------------------------------------------------------ where the ranks run

def test_hosts_on_loopback_addresses(tmp_path, fake, suites):
    _, comm = suites
    placement = hosts_placement("127.0.0.2,127.0.0.3", 2, cpus=2)
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        fake, dataclasses.replace(comm, collectives=("all_reduce",)))
    (r,) = records
    assert r.status == "ok" and r.distributed.placement == "hosts"
    assert r.distributed.hosts == ["127.0.0.2", "127.0.0.3"]


FAKE_SRUN = """#!/usr/bin/env python3
# Slurm's srun for one-task steps, run here: skip the options, then exec the command (env K=V ... argv).
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
valued = {"--nodes", "--ntasks", "--nodelist", "--chdir"}
i = 0
while args[i].startswith("--"):
    if args[i] == "--chdir":
        os.chdir(args[i + 1])
    i += 2 if args[i] in valued else 1
os.execvp(args[i], args[i:])
"""


def test_under_slurm_every_command_is_a_job_step(tmp_path, fake, suites, monkeypatch):
    _, comm = suites
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "scontrol").write_text("#!/bin/sh\nprintf '127.0.0.2\\n127.0.0.3\\n'\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "fake[2-3]", "SLURM_CPUS_ON_NODE": "2"}
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.log"))
    placement = detect(2, cpus=2, environ=env)
    assert placement.variant == "slurm"
    monkeypatch.setenv("PATH", env["PATH"])
    records = DistributedOrchestrator(Store(tmp_path / "s"), options(tmp_path, placement=placement)).run_comm(
        fake, dataclasses.replace(comm, collectives=("broadcast",)))
    assert records[0].status == "ok" and records[0].distributed.placement == "slurm"
    steps = (tmp_path / "srun.log").read_text().splitlines()
    assert sorted(s.split()[s.split().index("--nodelist") + 1] for s in steps) == ["127.0.0.2", "127.0.0.3"]
    assert all("RANK=" in s for s in steps)


# ------------------------------------------------------------------ the command line

def test_cli_runs_both_suites_and_results_shows_them(cli_env, tmp_path, invoke):
    store = str(tmp_path / "store")
    code, out, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current",
                            "--profile", "smoke", "--benchmark", "fcn5", "--store", store)
    assert code == 0, err
    assert "2 workers (local: 127.0.0.1 x2), 1 threads per worker, strong scaling" in err
    assert "fcn5-train-w1" in out and "fcn5-train-w2" in out and "(strong)" in out
    code, out, err = invoke("run", "--suite", "comm", "--framework", "fake", "--env", "current", "--profile", "smoke",
                            "--benchmark", "all_reduce", "--store", store)
    assert code == 0, err
    assert "all_reduce-w2" in out and "busbw GB/s" in out and "correct" in out
    code, out, err = invoke("results", "--store", store)
    assert code == 0 and "distributed training runs" in out and "all_reduce-w2: fake" in out
    code, out, _ = invoke("results", "--store", store, "--format", "json")
    rows = json.loads(out)
    assert {r["benchmark"]: r["workers"] for r in rows} == {"fcn5-train-w1": 1, "fcn5-train-w2": 2,
                                                            "all_reduce-w2": 2}
    assert next(r for r in rows if r["benchmark"] == "all_reduce-w2")["peak_busbw_gbps"] > 0
    assert next(r for r in rows if r["benchmark"] == "fcn5-train-w2")["scaling_efficiency"] > 0


@pytest.mark.parametrize("args, words", [
    (["--suite", "fcn", "--workers", "2"], "--workers is not taken by suite 'fcn' of kind benchmark"),
    (["--suite", "comm", "--scaling", "weak"], "--scaling is not taken by suite 'comm' of kind comm"),
    (["--suite", "distributed", "--scaling", "diagonal"], "unknown scaling 'diagonal'"),
    (["--suite", "distributed", "--workers", "3"], "3 workers on 127.0.0.1 would oversubscribe"),
    (["--suite", "comm", "--workers", "4"], "or --oversubscribe to let the ranks share cores"),
    (["--suite", "distributed", "--threads", "2"], "--threads 2 x 2 workers"),
    (["--suite", "distributed", "--mode", "infer"], "--mode is not taken"),
    (["--suite", "distributed", "--env", "docker"], "--env docker does not run distributed jobs"),
    (["--suite", "distributed", "--hosts", "127.0.0.2,127.0.0.2"], "listed twice"),
    (["--suite", "comm", "--benchmark", "alltoall"], "unknown benchmark 'alltoall'"),
])
def test_cli_refuses_bad_distributed_input(cli_env, tmp_path, args, words, monkeypatch, invoke):
    monkeypatch.setattr("dlbench.workflows.distributed.available_cpus", lambda: 2)
    code, _, err = invoke("run", "--framework", "fake", "--env", "current", "--profile", "smoke",
                          "--store", str(tmp_path / "s"), *args)
    assert code == 2 and words in err
    assert not (tmp_path / "s").exists()


def test_cli_oversubscribed_runs_are_recorded_warned_and_shown(cli_env, tmp_path, monkeypatch, invoke):
    """--workers 4 --oversubscribe on 2 cores: the jobs run, time-sliced; the header warns, the
    N-worker records say how crowded (the one-worker baseline is not), `results` shows the column."""
    monkeypatch.setattr("dlbench.workflows.distributed.available_cpus", lambda: 2)
    store = str(tmp_path / "store")
    code, out, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current",
                            "--profile", "smoke", "--benchmark", "fcn5", "--workers", "4", "--oversubscribe",
                            "--store", store)
    assert code == 0, err
    assert "4 workers (local: 127.0.0.1 x4), 1 threads per worker" in err
    assert "oversubscribed (--oversubscribe): 4 threads of 4 workers share the 2 cores of 127.0.0.1" in " ".join(err.split())
    assert "the ranks time-sliced; their iteration times include waiting for a core" in " ".join(out.split())
    code, out, _ = invoke("results", "--store", store, "--format", "json")
    rows = {r["benchmark"]: r for r in json.loads(out)}
    assert rows["fcn5-train-w4"]["oversubscribed"] == "4 threads/2 cores" and rows["fcn5-train-w1"]["oversubscribed"] is None
    records = {r.benchmark: r for r in Store(Path(store)).records()}
    assert records["fcn5-train-w4"].distributed.oversubscribed.model_dump() == {"machine": "127.0.0.1", "threads": 4,
                                                                                "cores": 2}
    assert records["fcn5-train-w1"].distributed.oversubscribed is None
    # the default table's column, only where a shown run was oversubscribed (read from the plain
    # columns, which keep the columns' names whole: the rich table may shorten a header to fit)
    from dlbench.cli import results as results_cli

    monkeypatch.setattr(results_cli, "RICH_TABLE_MAX_ROWS", 0)
    code, out, _ = invoke("results", "--store", store, "--benchmark", "fcn5-train-w4")
    header = next(line for line in out.splitlines() if "run_id" in line)
    assert code == 0 and "oversubscribed" in header.split(), out
    code, out, _ = invoke("results", "--store", store, "--benchmark", "fcn5-train-w1")
    header = next(line for line in out.splitlines() if "run_id" in line)
    assert code == 0 and "oversubscribed" not in header.split(), out


def test_cli_strong_scaling_needs_an_even_split(cli_env, tmp_path, monkeypatch, invoke):
    suite = tmp_path / "odd.yaml"
    suite.write_text((ROOT / "suites" / "distributed.yaml").read_text().replace("smoke: [32]", "smoke: [33]"))
    code, _, err = invoke("run", "--suite", str(suite), "--framework", "fake", "--env", "current", "--profile", "smoke",
                          "--store", str(tmp_path / "s"))
    assert code == 2 and "global batch 33 over 2 workers" in err and "fcn5" in err


def test_cli_lists_distributed_suites(cli_env, invoke):
    code, out, _ = invoke("list", "--suite", "comm", "--profile", "smoke")
    assert code == 0 and "reduce_scatter" in out and "4 B .. 4 MiB (4 sizes)" in out
    code, out, _ = invoke("list", "--suite", "distributed", "--profile", "smoke")
    assert code == 0 and "fcn5-train" in out and "lstm32-train" in out and "resnet50" not in out
    code, out, _ = invoke("list", "--profile", "smoke")
    assert code == 0 and "distributed suites (--workers): comm, distributed" in " ".join(out.split())


def test_the_exit_clock_dates_two_deaths_in_their_order_even_inside_one_poll(tmp_path):
    # the torchrun race: a killed rank and the peer its launcher stops next die within one look of
    # the watcher, so "last seen alive" cannot tell them apart; their exit times can
    from dlbench.execution.jobs import _ExitClock

    first, second = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2))
    clock = _ExitClock()
    try:
        clock.watch(first.pid)
        clock.watch(second.pid)
        time.sleep(0.2)  # both registered with the waiting thread
        first.kill()
        time.sleep(0.02)  # far less than a look's interval
        second.kill()
        for p in (first, second):
            p.wait(5)
        deadline = time.monotonic() + 5
        while len(clock.exited) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        clock.close()
        for p in (first, second):
            p.kill()
    assert clock.exited[first.pid] < clock.exited[second.pid]


def test_the_exit_clock_ignores_a_process_already_gone():
    from dlbench.execution.jobs import _ExitClock

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    clock = _ExitClock()
    clock.watch(gone.pid)  # reaped: no pidfd, nothing known, no error
    clock.close()
    assert gone.pid not in clock.exited
