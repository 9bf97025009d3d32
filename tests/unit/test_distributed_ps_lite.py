"""The ps-lite launch style (MXNet's kvstore dist_sync: scheduler, servers, workers) and the
harness's per-size skip that MXNet's broadcast needs. No framework: the processes are only
described, and the harness runs in-process against a one-rank runner written here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dlbench.execution.launch_styles import STYLES, JobLayout, ps_lite_processes
from dlbench.execution.placement import hosts_placement, local_placement
from dlbench.execution.registry import LAUNCH_STYLES, RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]


def layout(tmp_path, placement, threads=1, ports=(30007, 30003, 30005, 30001)):
    return JobLayout(python=Path("/env/bin/python"), worker=Path("/repo/runners/x/distributed_worker.py"),
                     request=tmp_path / "request.json", job_dir=tmp_path, placement=placement, threads=threads,
                     coordinator_port=29999, worker_ports=tuple(ports[:placement.workers]))


def by_role(specs):
    roles: dict[str, list] = {}
    for s in specs:
        roles.setdefault(s.env.get("DMLC_ROLE"), []).append(s)
    return roles


def test_style_is_registered_for_runner_toml():
    assert "ps-lite" in LAUNCH_STYLES and STYLES["ps-lite"] is ps_lite_processes
    assert set(STYLES) == set(LAUNCH_STYLES)


def test_one_host_scheduler_server_and_workers_in_port_order(tmp_path):
    specs = ps_lite_processes(layout(tmp_path, local_placement(2, 2)))
    roles = by_role(specs)
    assert [len(roles[r]) for r in ("scheduler", "server", "worker")] == [1, 1, 2] and len(specs) == 4
    (scheduler,), (server,) = roles["scheduler"], roles["server"]
    for s in specs:  # every process: the worker file, told where the scheduler is and how many of each
        assert s.argv == ["/env/bin/python", "/repo/runners/x/distributed_worker.py", str(tmp_path / "request.json"),
                          str(tmp_path)]
        assert s.env["DMLC_PS_ROOT_URI"] == "127.0.0.1" and s.env["DMLC_PS_ROOT_PORT"] == "29999"
        assert s.env["DMLC_NUM_SERVER"] == "1" and s.env["DMLC_NUM_WORKER"] == "2"
        assert s.env["OMP_NUM_THREADS"] == "1"
    assert scheduler.label == "kvstore scheduler on 127.0.0.1:29999" and "DMLC_NODE_HOST" not in scheduler.env
    assert server.env["DMLC_NODE_HOST"] == "127.0.0.1" and "RANK" not in server.env
    workers = roles["worker"]
    # ps-lite numbers the workers of one address by port: the lower port is rank 0
    assert [(w.env["RANK"], w.env["PORT"]) for w in workers] == [("0", "30003"), ("1", "30007")]
    assert {w.env["WORLD_SIZE"] for w in workers} == {"2"} and [w.env["LOCAL_RANK"] for w in workers] == ["0", "1"]
    assert workers[0].env["DLBENCH_WORKER_ADDRESSES"] == "127.0.0.1:30003,127.0.0.1:30007"
    assert workers[1].label == "rank 1 on 127.0.0.1"


def test_hosts_ranked_as_ps_lite_sorts_them_with_a_server_each(tmp_path):
    placement = hosts_placement("127.0.0.2,127.0.0.3", 4, 8)
    roles = by_role(ps_lite_processes(layout(tmp_path, placement, threads=2)))
    (scheduler,) = roles["scheduler"]
    assert scheduler.host.address == "127.0.0.2"  # the coordinator: the first host
    assert [(s.host.address, s.env["DMLC_NODE_HOST"]) for s in roles["server"]] == \
        [("127.0.0.2", "127.0.0.2"), ("127.0.0.3", "127.0.0.3")]
    workers = roles["worker"]
    # van.cc sorts nodes by address, descending, then by port: 127.0.0.3's workers come first
    assert [(w.env["RANK"], w.host.address, w.env["PORT"], w.env["LOCAL_RANK"]) for w in workers] == [
        ("0", "127.0.0.3", "30001", "0"), ("1", "127.0.0.3", "30003", "1"),
        ("2", "127.0.0.2", "30005", "0"), ("3", "127.0.0.2", "30007", "1")]
    assert all(w.env["DMLC_NODE_HOST"] == w.host.address for w in workers)
    assert {w.env["DMLC_NUM_SERVER"] for w in workers} == {"2"} and {w.env["OMP_NUM_THREADS"] for w in workers} == {"2"}
    assert {w.env["MASTER_ADDR"] for w in workers} == {"127.0.0.2"}


def test_address_order_is_bytewise_like_std_string_compare(tmp_path):
    # "127.0.0.9" > "127.0.0.10" as strings: ps-lite gives 127.0.0.9 the lower ranks
    roles = by_role(ps_lite_processes(layout(tmp_path, hosts_placement("127.0.0.10,127.0.0.9", 2, 8))))
    assert [w.host.address for w in roles["worker"]] == ["127.0.0.9", "127.0.0.10"]


def test_one_worker_is_just_the_rank_without_servers(tmp_path):
    (spec,) = ps_lite_processes(layout(tmp_path, local_placement(1, 2)))
    assert spec.env["RANK"] == "0" and spec.env["WORLD_SIZE"] == "1"
    assert not any(k.startswith("DMLC_") for k in spec.env)


def test_runner_toml_accepts_the_style_and_mxnet_uses_it(tmp_path):
    folder = tmp_path / "runners" / "r"
    folder.mkdir(parents=True)
    for name in ("requirements-cpu.txt", "requirements-cuda.txt", "worker.py", "distributed_worker.py"):
        (folder / name).write_text("")
    (folder / "runner.toml").write_text('name = "r"\nimport_name = "json"\nworker = "worker.py"\n'
                                        '[requirements]\ncpu = "requirements-cpu.txt"\ncuda = "requirements-cuda.txt"\n'
                                        '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\n'
                                        '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ps-lite"\n')
    assert RunnerRegistry(folder.parent).get("r").distributed.launch == "ps-lite"
    assert RunnerRegistry(ROOT / "runners").get("mxnet").distributed.launch == "ps-lite"


# ------------------------------------------------------------------ harness: a size the runner declines

@pytest.fixture()
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "runners" / "common"))
    from runners.common import distributed_harness

    yield distributed_harness
    sys.modules.pop("distributed_harness", None)


class OneRank:
    """A one-rank 'engine': every collective of one rank is the identity (a sum over one rank)."""

    def __init__(self, budget_bytes):
        self.budget, self.used, self.asked, self.made = budget_bytes, 0, [], []

    def barrier(self):
        pass

    def collective_size_unavailable(self, op, size_bytes, runs):
        self.asked.append((op, size_bytes, runs))
        if op == "broadcast" and self.used + size_bytes * runs > self.budget:
            return f"{size_bytes * runs} B of keys would pass the budget"
        if op == "broadcast":
            self.used += size_bytes * runs
        return None

    def collective(self, op, send, recv):
        self.made.append((op, send))
        import numpy as np

        class Identity:
            def load(self, array):
                self.buf = np.array(array, dtype=np.float32)

            def run(self):
                pass

            def synchronize(self):
                pass

            def result(self):
                return self.buf

        return Identity()


def test_a_size_the_runner_declines_is_skipped_and_never_run(harness):
    cluster = harness.Cluster(0, 1, 0, 1, "127.0.0.1", 1, (), "cpu", 1)
    runner = OneRank(budget_bytes=2 * 4096 * 4)  # room for 4096 B x 4 runs, not 8192 B more
    out = harness.measure_collectives(runner, cluster, ["all_reduce", "broadcast"], [4096, 8192], warmup_iters=1,
                                      measure_iters=2)["collectives"]
    assert all(row["correct"] for row in out["all_reduce"])
    ran, declined = out["broadcast"]
    assert ran["correct"] and len(ran["iter_s"]) == 2
    assert declined == {"size_bytes": 8192, "skipped": f"{8192 * 4} B of keys would pass the budget"}
    assert ("broadcast", 8192, 4) in runner.asked  # runs: the checked one, 1 warm-up, 2 timed
    assert ("broadcast", 8192 // 4) not in runner.made


# ------------------------------------------------------------------ a server (a launcher, not a rank) dies

RANK_SLEEPS = """
import json, os, socket, sys, time
job = sys.argv[1]
json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()},
          open(os.path.join(job, "rank0.started"), "w"))
time.sleep(60)
"""
SERVER_DIES = """
import os, sys, time
while not os.path.exists(os.path.join(sys.argv[1], "rank0.started")):
    time.sleep(0.02)
time.sleep(0.3)
print("server lost", flush=True)
sys.exit(3)
"""


def test_a_server_that_dies_is_the_reason_not_the_ranks_the_teardown_stops(tmp_path):
    from dlbench.execution.jobs import run_job
    from dlbench.execution.launch_styles import ProcessSpec

    job = tmp_path / "jobs" / "j"
    job.mkdir(parents=True)
    host = local_placement(1, 2).hosts[0]
    specs = [ProcessSpec(host, [sys.executable, "-c", SERVER_DIES, str(job)], {}, "kvstore server on 127.0.0.1"),
             ProcessSpec(host, [sys.executable, "-c", RANK_SLEEPS, str(job)], {}, "rank 0 on 127.0.0.1")]
    outcome = run_job(specs, lambda s: s.argv, job, 1, timeout_s=30, cwd=tmp_path)
    assert outcome.status == "failed" and outcome.failed_rank is None
    assert outcome.reason == "kvstore server on 127.0.0.1 exited with status 3: server lost"
    assert not outcome.left_behind
