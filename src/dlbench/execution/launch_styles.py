"""How a framework's ranks are started: the processes dlbench launches for one job.

A runner names its style in runner.toml (`[distributed] launch = ...`):
- torchrun: one `python -m torch.distributed.run` per host (static rendezvous at rank 0's host on
  a port chosen for the job, node rank = the host's place in the list, no restarts), which starts
  that host's ranks and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in each.
- ranks: dlbench starts every rank itself with those same variables set (for launchers-less
  engines: TF_CONFIG and jax.distributed.initialize are built from them by the runner).
- ps-lite: a parameter-server job (MXNet's kvstore dist_*): a scheduler on the coordinator's host
  at the job's port, one server per host, and every rank, each process running the worker file
  with ps-lite's DMLC_* variables (the worker file serves the scheduler and server roles itself).

Every rank also gets DLBENCH_WORKER_ADDRESSES ("host:port" per rank, a free port each), the
thread variables, and, when every host is a loopback address, GLOO_SOCKET_IFNAME=lo (so gloo does
not look for the peers on an interface that a name lookup of the hostname happens to return); on a
shaped link (--link) the interface every namespace names alike, through JobLayout.extra_env.
A style is a function of a JobLayout to ProcessSpecs; add one here (and to STYLES) for an engine
that needs other processes (parameter servers, a scheduler).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .placement import Host, Placement


@dataclass(frozen=True)
class ProcessSpec:
    """One process dlbench starts (locally: through ssh or srun when its host is remote)."""

    host: Host
    argv: list[str]
    env: dict[str, str]
    label: str  # for messages: "torchrun on 127.0.0.2 (ranks 0-1)", "rank 3 on node2"


@dataclass(frozen=True)
class JobLayout:
    python: Path  # the framework environment's interpreter (same path on every host)
    worker: Path  # runners/<fw>/<distributed worker>
    request: Path
    job_dir: Path  # shared by every rank (on remote hosts: a shared file system)
    placement: Placement
    threads: int  # per rank
    coordinator_port: int
    worker_ports: tuple[int, ...]  # one per rank
    extra_env: dict[str, str] = field(default_factory=dict)


def common_env(layout: JobLayout) -> dict[str, str]:
    hosts = layout.placement.rank_hosts()
    env = {
        "PYTHONUNBUFFERED": "1",
        # OpenMP pools size themselves when the library loads: set before the interpreter starts
        "OMP_NUM_THREADS": str(layout.threads), "MKL_NUM_THREADS": str(layout.threads),
        "DLBENCH_WORKER_ADDRESSES": ",".join(f"{h.address}:{p}" for h, p in zip(hosts, layout.worker_ports)),
    }
    if layout.placement.only_loopback():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(layout.extra_env)
    return env


def _ranks_label(first: int, count: int) -> str:
    return f"rank {first}" if count == 1 else f"ranks {first}-{first + count - 1}"


def torchrun_processes(layout: JobLayout) -> list[ProcessSpec]:
    p = layout.placement
    specs, first = [], 0
    for node_rank, host in enumerate(p.hosts):
        argv = [str(layout.python), "-m", "torch.distributed.run",
                "--nnodes", str(len(p.hosts)), "--node-rank", str(node_rank), "--nproc-per-node", str(host.slots),
                "--master-addr", p.coordinator, "--master-port", str(layout.coordinator_port),
                "--local-addr", host.address, "--max-restarts", "0", "--monitor-interval", "0.1",
                str(layout.worker), str(layout.request), str(layout.job_dir)]
        specs.append(ProcessSpec(host, argv, common_env(layout),
                                 f"torchrun on {host.address} ({_ranks_label(first, host.slots)})"))
        first += host.slots
    return specs


def rank_processes(layout: JobLayout) -> list[ProcessSpec]:
    """One process per rank. DLBENCH_MACHINE_SLOT: the rank's index among the ranks sharing its
    machine's cores (every rank of a host started directly, whatever its address or namespace, is on
    this machine), for runners that pin each rank to its share of them (jax)."""
    p = layout.placement
    specs, rank, here = [], 0, 0
    for host in p.hosts:
        for local_rank in range(host.slots):
            env = {**common_env(layout), "RANK": str(rank), "WORLD_SIZE": str(p.workers),
                   "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(host.slots),
                   "MASTER_ADDR": p.coordinator, "MASTER_PORT": str(layout.coordinator_port),
                   "DLBENCH_MACHINE_SLOT": str(here if host.local else local_rank)}
            here += host.local
            argv = [str(layout.python), str(layout.worker), str(layout.request), str(layout.job_dir)]
            specs.append(ProcessSpec(host, argv, env, f"rank {rank} on {host.address}"))
            rank += 1
    return specs


def _ip(address: str) -> str:
    """ps-lite binds and advertises a node by DMLC_NODE_HOST, which must be an address (zmq binds no
    host name); a name that does not resolve here is passed on as it is."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(address)
    except OSError:
        return address


def ps_lite_processes(layout: JobLayout) -> list[ProcessSpec]:
    """Scheduler, one server per host, one worker per rank (ps-lite's DMLC_ROLE scheduler | server |
    worker). ps-lite numbers the workers itself once all have registered: by address in descending
    byte order, then by port (van.cc's sort), so ranks are numbered here in that order (the first
    host's ranks need not be 0..k) and each worker is given its port (PORT, from the job's free
    ports, ascending within a host): RANK is then the kvstore's rank, which the runner checks.
    One worker needs no servers: just the rank, without DMLC_ROLE (the runner trains without a
    kvstore). Servers sum what the workers push while the workers wait, so they run with the ranks'
    threads and are not counted by the placement."""
    p = layout.placement
    if p.workers == 1:
        return rank_processes(layout)
    base = common_env(layout)
    scheduler_ip = _ip(p.coordinator)
    dmlc = {"DMLC_PS_ROOT_URI": scheduler_ip, "DMLC_PS_ROOT_PORT": str(layout.coordinator_port),
            "DMLC_NUM_SERVER": str(len(p.hosts)), "DMLC_NUM_WORKER": str(p.workers)}
    argv = [str(layout.python), str(layout.worker), str(layout.request), str(layout.job_dir)]
    specs = [ProcessSpec(p.hosts[0], argv, {**base, **dmlc, "DMLC_ROLE": "scheduler"},
                         f"kvstore scheduler on {p.coordinator}:{layout.coordinator_port}")]
    for host in p.hosts:
        specs.append(ProcessSpec(host, argv, {**base, **dmlc, "DMLC_ROLE": "server", "DMLC_NODE_HOST": _ip(host.address)},
                                 f"kvstore server on {host.address}"))
    ports = iter(sorted(layout.worker_ports))
    ranked = sorted(p.hosts, key=lambda h: _ip(h.address).encode(), reverse=True)
    workers = [(host, local_rank, next(ports)) for host in ranked for local_rank in range(host.slots)]
    addresses = ",".join(f"{_ip(h.address)}:{port}" for h, _, port in workers)
    for rank, (host, local_rank, port) in enumerate(workers):
        env = {**base, **dmlc, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": _ip(host.address), "PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(p.workers), "LOCAL_RANK": str(local_rank),
               "LOCAL_WORLD_SIZE": str(host.slots), "MASTER_ADDR": p.coordinator,
               "MASTER_PORT": str(layout.coordinator_port), "DLBENCH_WORKER_ADDRESSES": addresses}
        specs.append(ProcessSpec(host, argv, env, f"rank {rank} on {host.address}"))
    return specs


STYLES: dict[str, Callable[[JobLayout], list[ProcessSpec]]] = {
    "torchrun": torchrun_processes,
    "ranks": rank_processes,
    "ps-lite": ps_lite_processes,
}
