"""Multi-worker suites without running a job: their definitions, placement (local, hosts, Slurm),
the launch styles' commands, the figures (bus bandwidth, slowest rank, scaling efficiency) and the
runner.toml section."""

from __future__ import annotations

import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from dlbench.analysis.distributed import (
    bandwidths,
    bus_factor,
    exposed_communication_s,
    scaling_efficiency,
    slowest_rank,
)
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.distributed import batches
from dlbench.definitions.loader import DefinitionError
from dlbench.execution import placement as placement_mod
from dlbench.execution.launch_styles import JobLayout, rank_processes, torchrun_processes
from dlbench.execution.placement import PlacementError, detect, free_ports, hosts_placement, local_placement
from dlbench.execution.registry import RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "suites"


@pytest.fixture(scope="module")
def catalog():
    return SuiteCatalog(SUITES)


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------ definitions

def test_shipped_distributed_suites_are_listed_apart(catalog):
    assert {"cnn", "fcn", "rnn"} <= set(catalog.suite_names())  # what --suite all runs
    assert {"comm", "distributed"} <= set(catalog.distributed_suite_names())
    assert not set(catalog.suite_names()) & set(catalog.distributed_suite_names())
    assert catalog.suite_path("distributed") == SUITES / "distributed.yaml"
    assert catalog.suite_kind(SUITES / "comm.yaml") == "comm"
    assert catalog.suite_kind(SUITES / "fcn.yaml") == "benchmark"


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shipped_distributed_suite_resolves(catalog, profile, device):
    suite = catalog.load_distributed_suite(SUITES / "distributed.yaml", profile, device)
    names = [b.name for b in suite.benchmarks]
    assert names == (["fcn5-train", "lstm32-train"] if profile == "smoke" else
                     ["fcn5-train", "resnet56-train", "lstm32-train", "resnet50-train"])
    assert suite.kind == "distributed" and suite.scaling == "strong"
    for b in suite.benchmarks:
        assert b.policy.measure_iters >= 5 and b.batch_sizes
        assert all(size % 2 == 0 for size in b.batch_sizes)  # strong scaling over 2 workers splits them
    assert suite.benchmarks[0].learning_rate == 0.05


def test_shipped_comm_suite_sizes(catalog):
    default = catalog.load_distributed_suite(SUITES / "comm.yaml", "default", "cpu").comm
    assert default.collectives == ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")
    assert default.sizes[0] == 4 and default.sizes[-1] == 256 * 2**20
    assert all(b == 2 * a for a, b in zip(default.sizes, default.sizes[1:]))
    assert len(default.sizes) == 27
    smoke = catalog.load_distributed_suite(SUITES / "comm.yaml", "smoke", "cpu").comm
    assert 1 < len(smoke.sizes) <= 6 and set(smoke.sizes) <= set(default.sizes)


def comm_doc(**changes):
    doc = {"name": "c", "kind": "comm", "collectives": ["all_reduce"],
           "sizes": {"smoke": [4, 8], "default": {"start": 4, "stop": 64}, "paper": [4]},
           "policy": {p: {"warmup_iters": 1, "measure_iters": 5} for p in ("smoke", "default", "paper")}}
    doc.update(changes)
    return doc


def dist_doc(**changes):
    doc = {"name": "d", "kind": "distributed",
           "policy": {p: {"warmup_iters": 1, "measure_iters": 5} for p in ("smoke", "default", "paper")},
           "benchmarks": [{"network": "fcn5", "batch_sizes": {"smoke": [4], "default": [8]}}]}
    doc.update(changes)
    return doc


@pytest.mark.parametrize("doc, field, words", [
    (comm_doc(collectives=["all_reduce", "alltoall"]), "collectives[1]", "all_gather"),
    (comm_doc(collectives=["all_reduce", "all_reduce"]), "collectives", "twice"),
    (comm_doc(sizes={"smoke": [4, 6], "default": [4], "paper": [4]}), "sizes.smoke[1]", "float32"),
    (comm_doc(sizes={"smoke": [8, 4], "default": [4], "paper": [4]}), "sizes.smoke", "increasing"),
    (comm_doc(sizes={"smoke": [4], "default": {"start": 6, "stop": 64}, "paper": [4]}), "sizes.default.start",
     "float32"),
    (comm_doc(sizes={"smoke": [4], "default": {"start": 64, "stop": 4}, "paper": [4]}), "sizes.default", "below"),
    (comm_doc(dtype="float64"), "dtype", "float32"),
    (comm_doc(policy={"smoke": {"warmup_iters": 1, "measure_iters": 2}}), "policy.smoke.measure_iters", "5"),
    (comm_doc(kind="ring"), "kind", "expected distributed, comm"),
    (dist_doc(scaling="linear"), "scaling", "strong"),
    (dist_doc(benchmarks=[{"network": "nosuch", "batch_sizes": {"default": [8]}}]), "benchmarks[0].network",
     "unknown network"),
    (dist_doc(benchmarks=[{"network": "fcn5", "modes": ["infer"], "batch_sizes": {"default": [8]}}]),
     "benchmarks[0].modes", "unknown field"),
    (dist_doc(benchmarks=[{"network": "fcn5", "batch_sizes": {"default": [8]}}] * 2), "benchmarks[1]", "twice"),
])
def test_malformed_distributed_suite_names_file_and_field(catalog, tmp_path, doc, field, words):
    path = write(tmp_path / "mine.yaml", doc)
    with pytest.raises(DefinitionError) as info:
        catalog.suite_kind(path)
        catalog.load_distributed_suite(path, "smoke", "cpu")
    assert info.value.path == str(path) and info.value.field == field
    assert words in info.value.reason


def test_a_profile_left_out_skips_the_network(catalog, tmp_path):
    path = write(tmp_path / "d.yaml", dist_doc(benchmarks=[
        {"network": "fcn5", "batch_sizes": {"smoke": None, "default": {"cpu": [8], "cuda": [64]}}},
        {"network": "lstm32", "batch_sizes": {"smoke": [4], "default": [8]}}]))
    assert [b.name for b in catalog.load_distributed_suite(path, "smoke", "cpu").benchmarks] == ["lstm32-train"]
    assert catalog.load_distributed_suite(path, "default", "cuda").benchmarks[0].batch_sizes == (64,)
    assert catalog.load_distributed_suite(path, "paper", "cpu").benchmarks == ()


def test_strong_scaling_splits_the_global_batch():
    assert batches(32, 2, "strong") == (16, 32)
    assert batches(32, 2, "weak") == (32, 64)
    with pytest.raises(ValueError, match="multiple of --workers"):
        batches(33, 2, "strong")


# ------------------------------------------------------------------ figures

def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 8) == 1.0
    # all-to-all: each rank sends (n-1)/n of its buffer, one block per peer (PERFORMANCE.md)
    assert bus_factor("all_to_all", 2) == 0.5 and bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    algbw, busbw = bandwidths(2**20, 0.002, "all_to_all", 4)
    assert algbw == pytest.approx(2**20 / 0.002) and busbw == pytest.approx(algbw * 0.75)
    algbw, busbw = bandwidths(2**20, 0.001, "all_reduce", 4)
    assert algbw == pytest.approx(2**20 / 0.001) and busbw == pytest.approx(algbw * 1.5)
    with pytest.raises(ValueError):
        bus_factor("alltoall", 2)


def test_slowest_rank_and_efficiency():
    assert slowest_rank([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]
    with pytest.raises(ValueError, match="different numbers"):
        slowest_rank([[1.0], [1.0, 2.0]])
    # 2 workers, each as fast as one worker alone on the same global batch would be: half efficiency
    assert scaling_efficiency(throughput=100.0, workers=2, baseline_throughput=100.0) == 0.5
    assert scaling_efficiency(throughput=190.0, workers=2, baseline_throughput=100.0) == pytest.approx(0.95)
    assert exposed_communication_s([[3.0, 3.0, 3.0], [4.0, 4.0, 4.0]], [[2.0, 2.0], [2.5, 2.5]]) == 1.5


# ------------------------------------------------------------------ placement

def test_local_placement_threads_do_not_oversubscribe():
    p = local_placement(2, cpus=2)
    assert p.workers == 2 and p.coordinator == "127.0.0.1" and p.threads_per_worker(None) == 1
    assert local_placement(2, cpus=16).threads_per_worker(None) == 8
    assert local_placement(3, cpus=16).threads_per_worker(None) == 5
    with pytest.raises(PlacementError, match="oversubscribe"):
        local_placement(3, cpus=2).threads_per_worker(None)
    with pytest.raises(PlacementError, match="--threads 2 x 2 workers"):
        local_placement(2, cpus=2).threads_per_worker(2)
    assert local_placement(1, cpus=2).single_worker().workers == 1


def test_oversubscribe_lets_ranks_share_cores_and_says_how_crowded():
    """--oversubscribe: 4 workers on 2 cores get a thread each (time-sliced), --threads past the cores
    too; without it the refusal names the option."""
    with pytest.raises(PlacementError, match="4 workers on 127.0.0.1 would oversubscribe its 2 cores.*--oversubscribe"):
        local_placement(4, cpus=2).threads_per_worker(None)
    with pytest.raises(PlacementError, match="--threads 2 x 2 workers.*--oversubscribe"):
        local_placement(2, cpus=2).threads_per_worker(2)
    four = local_placement(4, cpus=2)
    assert four.threads_per_worker(None, oversubscribe=True) == 1
    assert four.oversubscription(1) == ("127.0.0.1", 4, 2)
    assert local_placement(2, cpus=2).threads_per_worker(2, oversubscribe=True) == 2
    assert local_placement(2, cpus=2).oversubscription(2) == ("127.0.0.1", 4, 2)
    # allowed but not needed: every thread has a core, nothing to record
    assert local_placement(2, cpus=2).threads_per_worker(None, oversubscribe=True) == 1
    assert local_placement(2, cpus=2).oversubscription(1) is None
    assert four.single_worker().oversubscription(1) is None  # the one-worker baseline is never crowded
    # the most crowded of several machines
    p = hosts_placement("127.0.0.2,10.0.0.9", 4, cpus=2)
    assert p.oversubscription(2) == ("127.0.0.2", 4, 2)


def test_hosts_placement_spreads_ranks_host_major():
    p = hosts_placement("127.0.0.2, 127.0.0.3", 4, cpus=8)
    assert p.variant == "hosts" and [h.address for h in p.hosts] == ["127.0.0.2", "127.0.0.3"]
    assert [h.address for h in p.rank_hosts()] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert all(h.local for h in p.hosts) and p.only_loopback()
    # loopback "hosts" are this machine: their 4 ranks share its 8 cores
    assert p.machines() == [("127.0.0.2+127.0.0.3", 4, 8)] and p.threads_per_worker(None) == 2
    with pytest.raises(PlacementError, match="4 workers on 127.0.0.2\\+127.0.0.3 would oversubscribe its 2 cores"):
        hosts_placement("127.0.0.2,127.0.0.3", 4, cpus=2).threads_per_worker(None)
    single = p.single_worker()
    assert single.workers == 1 and single.coordinator == "127.0.0.2"
    for hosts, workers, words in [("a,b", 3, "evenly"), ("a,a", 2, "twice"), ("a,b,c", 2, "at least one worker"),
                                  (" , ", 2, "no host")]:
        with pytest.raises(PlacementError, match=words):
            hosts_placement(hosts, workers, 8)


def test_this_machine_by_name_is_local_and_others_go_through_ssh():
    p = hosts_placement(f"{socket.gethostname()},node-b.example", 2, cpus=4)
    here, there = p.hosts
    assert here.local and not there.local and not p.only_loopback()
    assert p.threads_per_worker(None) == 4  # one rank here, one on a machine assumed to have as many cores
    assert p.command_on(here, ["python", "w.py"], {"A": "1"}, "/repo") == ["python", "w.py"]
    cmd = p.command_on(there, ["/env/bin/python", "w.py", "a b"], {"RANK": "1", "X": "it's"}, "/repo dir")
    assert cmd[:5] == ["ssh", "-tt", "-o", "BatchMode=yes", "node-b.example"]
    remote = shlex.split(cmd[5])  # what the remote shell runs
    assert remote[:4] == ["cd", "/repo dir", "&&", "exec"]
    assert remote[4:] == ["env", "RANK=1", "X=it's", "/env/bin/python", "w.py", "a b"]


def test_slurm_placement_from_the_allocation(tmp_path):
    calls = []

    def scontrol(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="node1\nnode2\n", stderr="")

    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_ON_NODE": "16",
           "PATH": str(tmp_path)}
    p = detect(4, cpus=2, environ=env, run=scontrol)
    assert calls == [["scontrol", "show", "hostnames", "node[1-2]"]]  # not on PATH here: by name
    assert p.variant == "slurm" and [(h.address, h.slots, h.cpus, h.local) for h in p.hosts] == \
        [("node1", 2, 16, False), ("node2", 2, 16, False)]
    assert p.threads_per_worker(None) == 8
    cmd = p.command_on(p.hosts[1], ["py", "w.py"], {"RANK": "2"}, "/repo")
    assert cmd[:cmd.index("env")] == ["srun", "--nodes", "1", "--ntasks", "1", "--nodelist", "node2", "--overlap",
                                      "--kill-on-bad-exit=1", "--chdir", "/repo"]
    assert cmd[cmd.index("env"):] == ["env", "RANK=2", "py", "w.py"]
    # --hosts wins over the allocation; outside one (or without srun) the workers are local
    assert detect(2, cpus=2, hosts="127.0.0.2,127.0.0.3", environ=env, run=scontrol).variant == "hosts"
    assert detect(2, cpus=2, environ={"PATH": str(tmp_path)}).variant == "local"
    assert detect(2, cpus=2, environ={"SLURM_JOB_ID": "1", "PATH": "/nonexistent"}).variant == "local"


def test_slurm_nodelist_that_scontrol_cannot_expand(tmp_path):
    def broken(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr="invalid hostlist")

    with pytest.raises(PlacementError, match="invalid hostlist"):
        placement_mod.slurm_placement(2, {"SLURM_JOB_NODELIST": "x[", "SLURM_JOB_ID": "1"}, run=broken)


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))


# ------------------------------------------------------------------ launch styles

def layout(tmp_path, placement, threads=1):
    return JobLayout(python=Path("/env/bin/python"), worker=Path("/repo/runners/x/distributed_worker.py"),
                     request=tmp_path / "request.json", job_dir=tmp_path, placement=placement, threads=threads,
                     coordinator_port=29999, worker_ports=tuple(range(30000, 30000 + placement.workers)))


def test_torchrun_style_one_launcher_per_host(tmp_path):
    specs = torchrun_processes(layout(tmp_path, hosts_placement("127.0.0.2,127.0.0.3", 4, 8), threads=2))
    assert len(specs) == 2
    for node_rank, spec in enumerate(specs):
        argv = spec.argv
        assert argv[:3] == ["/env/bin/python", "-m", "torch.distributed.run"]

        def opt(name):
            return argv[argv.index(name) + 1]
        assert opt("--nnodes") == "2" and opt("--node-rank") == str(node_rank) and opt("--nproc-per-node") == "2"
        assert opt("--master-addr") == "127.0.0.2" and opt("--master-port") == "29999"
        assert opt("--local-addr") == spec.host.address and opt("--max-restarts") == "0"
        assert argv[-3:] == ["/repo/runners/x/distributed_worker.py", str(tmp_path / "request.json"), str(tmp_path)]
        assert spec.env["OMP_NUM_THREADS"] == "2" and spec.env["GLOO_SOCKET_IFNAME"] == "lo"
        assert spec.env["DLBENCH_WORKER_ADDRESSES"] == \
            "127.0.0.2:30000,127.0.0.2:30001,127.0.0.3:30002,127.0.0.3:30003"
    assert specs[1].label == "torchrun on 127.0.0.3 (ranks 2-3)"


def test_ranks_style_sets_torchruns_variables_itself(tmp_path):
    specs = rank_processes(layout(tmp_path, hosts_placement("127.0.0.2,127.0.0.3", 4, 8)))
    assert [s.env["RANK"] for s in specs] == ["0", "1", "2", "3"]
    assert [s.env["LOCAL_RANK"] for s in specs] == ["0", "1", "0", "1"]
    assert {s.env["WORLD_SIZE"] for s in specs} == {"4"} and {s.env["MASTER_ADDR"] for s in specs} == {"127.0.0.2"}
    assert [s.host.address for s in specs] == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert specs[0].argv == ["/env/bin/python", "/repo/runners/x/distributed_worker.py",
                             str(tmp_path / "request.json"), str(tmp_path)]


def test_gloo_interface_is_pinned_only_when_every_host_is_loopback(tmp_path):
    remote = hosts_placement(f"{socket.gethostname()},node-b", 2, 8)
    assert "GLOO_SOCKET_IFNAME" not in rank_processes(layout(tmp_path, remote))[0].env


# ------------------------------------------------------------------ runner.toml

CAPABILITIES = '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\n'


def runner_folder(tmp_path, distributed: str) -> Path:
    folder = tmp_path / "runners" / "r"
    folder.mkdir(parents=True)
    for name in ("requirements-cpu.txt", "requirements-cuda.txt", "worker.py", "distributed_worker.py"):
        (folder / name).write_text("")
    (folder / "runner.toml").write_text('name = "r"\nimport_name = "json"\nworker = "worker.py"\n'
                                        '[requirements]\ncpu = "requirements-cpu.txt"\n'
                                        'cuda = "requirements-cuda.txt"\n' + CAPABILITIES + distributed)
    return folder


def test_runner_toml_distributed_section(tmp_path):
    folder = runner_folder(tmp_path, '[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\n')
    info = RunnerRegistry(folder.parent).get("r")
    assert info.distributed.launch == "ranks" and info.distributed.worker == folder / "distributed_worker.py"
    assert RunnerRegistry(ROOT / "runners").get("torch").distributed.launch == "torchrun"


@pytest.mark.parametrize("section, field, words", [
    ('[distributed]\nworker = "distributed_worker.py"\nlaunch = "mpirun"\n', "distributed.launch", "torchrun"),
    ('[distributed]\nlaunch = "ranks"\n', "distributed.worker", "missing"),
    ('[distributed]\nworker = "absent.py"\nlaunch = "ranks"\n', "distributed.worker", "does not exist"),
    ('[distributed]\nworker = "distributed_worker.py"\nlaunch = "ranks"\nhosts = 2\n', "distributed.hosts",
     "unknown field"),
])
def test_runner_toml_distributed_errors_name_the_field(tmp_path, section, field, words):
    folder = runner_folder(tmp_path, section)
    with pytest.raises(DefinitionError) as info:
        RunnerRegistry(folder.parent).get("r")
    assert info.value.field == field and words in info.value.reason
