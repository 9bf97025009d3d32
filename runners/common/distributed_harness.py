"""The worker side of multi-worker jobs (suites `distributed` and `comm`): the rank's place in the
job, the protocol, and the measurement that must be identical across frameworks. Standard library
only, plus numpy for the collectives' patterns and checks.

One process per rank, started by the framework's own launcher (torchrun) or by dlbench itself:

    [launcher ...] <env python> runners/<fw>/distributed_worker.py REQUEST.json JOB_DIR

The rank's place comes from the environment, under the names torchrun sets (dlbench sets the same
ones when it starts the ranks itself): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; and DLBENCH_WORKER_ADDRESSES, "host:port,..." one free port per rank on its host, for
frameworks that name every worker up front (TF_CONFIG). JOB_DIR is shared by every rank:

    rank<R>.log       the rank's stdout and stderr (file descriptors 1 and 2, redirected at start)
    rank<R>.started   {"pid", "host", "started_at"} once the rank runs (the controller watches the pid)
    rank<R>.json      the result, written atomically (a rank that dies leaves none)

What a multi-worker runner object, its DataParallel and its Collective provide is
runners/common/contract.py (the `DistributedRunner` and `Collective` protocols, the DataParallel base
class); runners/torch/distributed.py is the first port.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from runners.common.contract import typed_request
from runners.common.protocol import PROTOCOL_VERSION, Skip, classify, read_request, write_atomically


@dataclass(frozen=True)
class Cluster:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    coordinator_address: str
    coordinator_port: int
    worker_addresses: tuple[str, ...]  # "host:port" per rank, or empty where the launcher gives none
    device: str
    threads: int | None


def cluster_from_env(request: dict, env=os.environ) -> Cluster:
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise RuntimeError(f"not started as a rank of a job: {', '.join(missing)} not set")
    world = int(env["WORLD_SIZE"])
    addresses = tuple(a for a in env.get("DLBENCH_WORKER_ADDRESSES", "").split(",") if a)
    return Cluster(rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
                   coordinator_address=env["MASTER_ADDR"], coordinator_port=int(env["MASTER_PORT"]),
                   worker_addresses=addresses, device=request["device"], threads=request.get("threads"))


# ------------------------------------------------------------------ data-parallel training

def measure_data_parallel(dp, barrier: Callable[[], None], warmup_iters: int, measure_iters: int,
                          clock: Callable[[], int] = time.perf_counter_ns,
                          mark: Callable[[], int] = time.monotonic_ns) -> dict:
    """First iteration apart, a fixed warm-up, then a fixed number of timed iterations, each read
    between two synchronisations. All ranks run the same counts, so the collectives inside step()
    pair up; a barrier lines the ranks up before the measured window. The loss after the first and
    each warm-up step (where the runner reads it) shows that two ways of training the network train
    it alike; expert parallelism's all-to-all totals are read around the measured window. Then,
    where the framework can skip the gradient exchange, as many steps without it: the exposed
    communication time is the difference of the medians (the controller computes it)."""

    def timer(step):
        def timed() -> float:
            t0 = clock()
            step()
            dp.synchronize()
            return (clock() - t0) / 1e9
        return timed

    loss = dp.loss or (lambda: None)
    all_to_all = dp.all_to_all or (lambda: None)
    timed = timer(dp.step)
    dp.synchronize()
    first = timed()
    losses = [loss()]  # read between steps, outside the timed window
    warm = []
    for _ in range(warmup_iters):
        warm.append(timed())
        losses.append(loss())
    barrier()
    before = all_to_all()
    window_start = mark()
    times = [timed() for _ in range(measure_iters)]
    window_end = mark()
    after = all_to_all()
    local = None
    if dp.step_without_sync is not None:
        barrier()
        local_timed = timer(dp.step_without_sync)
        local_timed()  # the first unsynchronised step may set up hooks or buffers
        local = [local_timed() for _ in range(measure_iters)]
    barrier()
    out = {"first_iter_s": first, "warmup_iter_s": warm, "iter_s": times, "local_iter_s": local,
           "window_monotonic_ns": [window_start, window_end],
           "losses": None if losses[0] is None else losses}
    if before is not None and measure_iters:  # per measured step: what the window's all-to-alls took
        out["all_to_all"] = {key: None if after[key] is None else (after[key] - before[key]) / measure_iters
                             for key in ("seconds", "bytes", "calls")}
    return out


# ------------------------------------------------------------------ collectives

FLOAT32_BYTES = 4


def counts(op: str, size_bytes: int, world: int) -> tuple[int, int, int] | None:
    """(send, receive, total) float32 elements of one rank for a collective of `size_bytes` (the
    largest buffer, nccl-tests' convention); None when the size cannot be split over the ranks."""
    total = size_bytes // FLOAT32_BYTES
    if op in ("all_reduce", "broadcast"):
        return total, total, total
    block = total // world
    if block == 0:
        return None
    if op == "all_gather":
        return block, block * world, block * world
    if op == "reduce_scatter":
        return block * world, block, block * world
    if op == "all_to_all":  # block j of the send buffer goes to rank j; block j received comes from rank j
        return block * world, block * world, block * world
    raise ValueError(f"unknown collective {op!r}")


def pattern(np, rank: int, count: int):
    """Small integers, exact in float32 and in their sums over many ranks, and different per rank."""
    return (np.arange(count, dtype=np.int64) % 61 + 1 + 64 * rank).astype(np.float32)


def expected(np, op: str, rank: int, world: int, send: int, recv: int):
    if op == "all_reduce":  # sum over r of (base + 64 r)
        return (world * (np.arange(recv, dtype=np.int64) % 61 + 1) + 32 * world * (world - 1)).astype(np.float32)
    if op == "broadcast":
        return pattern(np, 0, recv)
    if op == "all_gather":
        return np.concatenate([pattern(np, r, send) for r in range(world)])
    if op == "reduce_scatter":  # block `rank` of the sum of every rank's pattern over `send` elements
        i = np.arange(rank * recv, (rank + 1) * recv, dtype=np.int64)
        return (world * (i % 61 + 1) + 32 * world * (world - 1)).astype(np.float32)
    if op == "all_to_all":  # block `rank` of every rank's pattern, in rank order
        block = send // world
        return np.concatenate([pattern(np, r, send)[rank * block:(rank + 1) * block] for r in range(world)])
    raise ValueError(f"unknown collective {op!r}")


def measure_collectives(runner, cluster: Cluster, ops: list[str], sizes: list[int], warmup_iters: int,
                        measure_iters: int, clock: Callable[[], int] = time.perf_counter_ns) -> dict:
    """Per collective and size: one checked run on patterned data, then the timed iterations on
    zeros (an in-place all-reduce of zeros stays zeros: no growth to inf, no denormals)."""
    import numpy as np

    out: dict[str, list[dict]] = {}
    unavailable = getattr(runner, "collective_unavailable", lambda op: None)
    size_unavailable = getattr(runner, "collective_size_unavailable", lambda op, size, runs: None)
    for op in ops:
        rows = out.setdefault(op, [])
        why_not = unavailable(op)
        if why_not:
            rows.extend({"size_bytes": size, "skipped": why_not} for size in sizes)
            continue
        for size in sizes:
            shape = counts(op, size, cluster.world_size)
            if shape is None:
                rows.append({"size_bytes": size, "skipped": f"{size} B is less than one float32 per rank "
                                                            f"over {cluster.world_size} ranks"})
                continue
            why_not = size_unavailable(op, size, 1 + warmup_iters + measure_iters)
            if why_not:
                rows.append({"size_bytes": size, "skipped": why_not})
                continue
            send, recv, total = shape
            coll = runner.collective(op, send, recv)
            coll.load(pattern(np, cluster.rank, send))
            coll.run()
            coll.synchronize()
            got = np.asarray(coll.result()).reshape(-1)
            want = expected(np, op, cluster.rank, cluster.world_size, send, recv)
            error = None
            if got.shape != want.shape:
                error = f"rank {cluster.rank}: result has {got.size} elements, expected {want.size}"
            elif not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0])
                error = (f"rank {cluster.rank}: element {bad} is {float(got[bad])!r}, expected {float(want[bad])!r} "
                         f"({int(np.count_nonzero(got != want))} of {want.size} wrong)")
            del got, want
            coll.load(np.zeros(send, dtype=np.float32))
            for _ in range(warmup_iters):
                coll.run()
            coll.synchronize()
            runner.barrier()
            times = []
            for _ in range(measure_iters):
                t0 = clock()
                coll.run()
                coll.synchronize()
                times.append((clock() - t0) / 1e9)
            rows.append({"size_bytes": size, "bytes": total * FLOAT32_BYTES, "send_count": send,
                         "recv_count": recv, "iter_s": times, "correct": error is None, "error": error})
            del coll
    runner.barrier()
    return {"collectives": out}


# ------------------------------------------------------------------ time to accuracy

class _RankOf:
    """The runner as runners/common/convergence.py drives it: its trainer is this rank's share of
    a data-parallel run (the runner's prepare_distributed_convergence)."""

    def __init__(self, runner, cluster: Cluster):
        self.runner, self.cluster = runner, cluster

    def prepare_convergence(self, request: dict):
        return self.runner.prepare_distributed_convergence(request, self.cluster)


def train_to_target(runner, request: dict, cluster: Cluster) -> dict:
    """One seeded convergence run of a data-parallel job (the convergence suite with --workers):
    every rank runs runners/common/convergence.py's loop in lock-step on its share of each global
    batch; rank 0 writes the MLLOG (the others' would repeat it, event for event)."""
    from runners.common.convergence import run_convergence

    if not hasattr(runner, "prepare_distributed_convergence"):
        raise Skip(f"the {runner.name} distributed runner has no data-parallel convergence loop")
    if request["batch_size"] % cluster.world_size:
        raise ValueError(f"batch {request['batch_size']} does not split evenly over {cluster.world_size} ranks")
    if cluster.rank != 0:
        request = {**request, "mllog": os.devnull}
    started = time.monotonic_ns()
    run = run_convergence(_RankOf(runner, cluster), request)
    # the window the controller reads the link's counters over: the whole run, initialisation included
    window = [started, time.monotonic_ns()]
    return {"params": run.pop("params"), "settings": run.pop("settings"), "convergence": run,
            "window_monotonic_ns": window}


# ------------------------------------------------------------------ the rank

def run_request(runner, request: dict, cluster: Cluster) -> tuple[dict, bool]:
    """(result, joined): whether the rank is in the process group (and should leave it)."""
    result: dict = {"protocol": PROTOCOL_VERSION, "framework": {"name": runner.name}, "rank": cluster.rank,
                    "world_size": cluster.world_size, "local_rank": cluster.local_rank, "host": socket.gethostname()}
    joined = False
    try:
        request = typed_request(request)  # the axes' values checked once, as their types
        result["threads"] = runner.configure_threads(request.get("threads"))
        result["framework"] = runner.framework_info(cluster.device)
        why_not = runner.device_available(cluster.device)
        if why_not:
            raise Skip(why_not)
        result["process_group"] = runner.join(cluster)
        joined = True
        if request["action"] == "data_parallel":
            policy = request["policy"]
            dp = runner.prepare_data_parallel(request, cluster)
            result.update(params=dp.params, output_shape=list(dp.output_shape), settings=dp.settings,
                          grad_bytes=dp.grad_bytes)
            result.update(measure_data_parallel(dp, runner.barrier, policy["warmup_iters"], policy["measure_iters"]))
        elif request["action"] == "collectives":
            policy = request["policy"]
            result.update(measure_collectives(runner, cluster, request["collectives"], request["sizes"],
                                              policy["warmup_iters"], policy["measure_iters"]))
        elif request["action"] == "convergence":
            result.update(train_to_target(runner, request, cluster))
        else:
            raise ValueError(f"unknown action {request['action']!r}")
        result["status"] = "ok"
    except Skip as e:
        result.update(status="skipped", reason=str(e))
    except BaseException as e:  # noqa: BLE001 - the rank reports everything it can
        result.update(status="failed", reason=classify(e), traceback=traceback.format_exc())
    result["finished_at"] = time.time()  # the controller orders the ranks' failures by it
    return result, joined


def _redirect_output(job_dir: str, rank: int) -> None:
    """This rank's stdout and stderr (native libraries' too) into its own log in the job folder."""
    fd = os.open(os.path.join(job_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(runner) -> int:
    if len(sys.argv) != 3:
        print("usage: distributed_worker.py REQUEST.json JOB_DIR", file=sys.stderr)
        return 2
    request_path, job_dir = sys.argv[1], sys.argv[2]
    request, why_not = read_request(request_path)
    if request is None:
        print(why_not, file=sys.stderr)
        return 2
    cluster = cluster_from_env(request)
    _redirect_output(job_dir, cluster.rank)
    write_atomically(os.path.join(job_dir, f"rank{cluster.rank}.started"),
                      {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()})
    result, joined = run_request(runner, request, cluster)
    write_atomically(os.path.join(job_dir, f"rank{cluster.rank}.json"), result)
    sys.stdout.flush()
    sys.stderr.flush()
    if result["status"] == "failed":
        # a failed rank does not try to leave the group: with a peer gone that can block for the
        # backend's whole timeout, and the framework's exit handlers can do the same
        os._exit(1)
    if joined:
        runner.leave()
    return 0
