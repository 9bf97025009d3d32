"""Where the ranks of a multi-worker job run, and how a command reaches each host.

Three variants, one shape (a list of hosts, each with its number of ranks):
- local: every rank on this machine (`--workers N`).
- hosts: `--hosts H1,H2,...`, the ranks spread evenly, host-major (rank 0 on H1). A host that is
  this machine (its name, one of its addresses, or any loopback address: 127.0.0.2, 127.0.0.3, ...
  all reach `lo` on Linux, which is how the multi-host path is tested on one machine) is started
  directly; any other through `ssh -tt` (a terminal, so that the remote processes get SIGHUP when
  dlbench stops the ssh client). Repository and environments must be at the same paths there.
- link: `--link RATE[,DELAY]` (execution/links.py): one rank per network namespace of this machine,
  each namespace a "host" at its address on the link, every command started through
  `ip netns exec <namespace>`; the ranks share this machine's cores as local ones do.
- slurm: inside an allocation (SLURM_JOB_ID set, `srun` on PATH) and without --hosts: the nodes of
  $SLURM_JOB_NODELIST (expanded by `scontrol show hostnames`), each command started as a job step
  on its node (`srun --nodes 1 --ntasks 1 --nodelist NODE`); srun relays signals to the step.

Ports are chosen at run time by binding port 0 (the kernel hands out a free one) on the wildcard
address, then released for the launcher to take: each job gets its own, so two jobs never collide.
Only this machine's ports can be probed so; a port for a remote host is probed here too and is
assumed free there (the coordinator is rank 0's host, which is this machine in the usual setup:
dlbench started on the first host of the list or of the allocation).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Mapping

Variant = Literal["local", "hosts", "slurm"]


class PlacementError(ValueError):
    """The workers cannot be placed as asked; str() says why and which option to change."""


@dataclass(frozen=True)
class Host:
    address: str
    slots: int  # ranks on this host
    cpus: int  # cores the ranks on this host share
    local: bool  # started directly (this machine or a loopback address), else through ssh or srun
    namespace: str | None = None  # the network namespace of this machine its ranks run in (--link)


@dataclass(frozen=True)
class Placement:
    variant: Variant
    hosts: tuple[Host, ...]

    @property
    def workers(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def coordinator(self) -> str:
        """Rank 0's host: where the rendezvous or coordination service listens."""
        return self.hosts[0].address

    def rank_hosts(self) -> list[Host]:
        """The host of every global rank, host-major."""
        return [h for h in self.hosts for _ in range(h.slots)]

    def machines(self) -> list[tuple[str, int, int]]:
        """(name, ranks, cores) per machine: the hosts started directly are all this machine (loopback
        addresses standing in for hosts share its cores), every other host is a machine of its own."""
        here = [h for h in self.hosts if h.local]
        out = [("+".join(h.address for h in here), sum(h.slots for h in here), here[0].cpus)] if here else []
        return out + [(h.address, h.slots, h.cpus) for h in self.hosts if not h.local]

    def threads_per_worker(self, requested: int | None, oversubscribe: bool = False) -> int:
        """--threads, else the cores of the most crowded machine divided by its ranks (at least 1).
        PlacementError when the ranks of a machine would share more threads than it has cores,
        unless `oversubscribe` (--oversubscribe) allows it: the kernel then time-slices the ranks."""
        machines = self.machines()
        if not oversubscribe:
            for name, ranks, cpus in machines:
                if ranks > cpus:
                    raise PlacementError(f"{ranks} workers on {name} would oversubscribe its {cpus} cores; "
                                         "use fewer --workers (or more hosts), or --oversubscribe to let the ranks "
                                         "share cores (time-sliced)")
        if requested is None:
            return max(1, min(cpus // ranks for _, ranks, cpus in machines))
        if not oversubscribe:
            for name, ranks, cpus in machines:
                if requested * ranks > cpus:
                    raise PlacementError(f"--threads {requested} x {ranks} workers on {name} = "
                                         f"{requested * ranks} threads would oversubscribe its {cpus} cores; "
                                         "use fewer, or --oversubscribe to let them share cores (time-sliced)")
        return requested

    def oversubscription(self, threads: int) -> tuple[str, int, int] | None:
        """(machine, its ranks' threads, its cores) of the most crowded machine whose ranks run more
        threads than it has cores at `threads` per rank; None where every thread has a core."""
        crowded = [(name, ranks * threads, cpus) for name, ranks, cpus in self.machines() if ranks * threads > cpus]
        return max(crowded, key=lambda m: m[1] / m[2]) if crowded else None

    def only_loopback(self) -> bool:
        return all(_is_loopback(h.address) for h in self.hosts)

    def single_worker(self) -> "Placement":
        """One rank on the first host, with that host's cores (the scaling baseline). On a shaped
        link, one rank on loopback: it has no peer to talk to, so the link would change nothing."""
        first = self.hosts[0]
        if first.namespace is not None:
            return local_placement(1, first.cpus)
        return Placement(self.variant, (Host(first.address, 1, first.cpus, first.local),))

    def command_on(self, host: Host, argv: list[str], env: Mapping[str, str], cwd: str) -> list[str]:
        """The local command that runs `argv` with `env` added, in `cwd`, on `host`."""
        if host.namespace is not None:
            return ["ip", "netns", "exec", host.namespace, *argv]
        if host.local:
            return argv
        assignments = [f"{k}={v}" for k, v in sorted(env.items())]
        if self.variant == "slurm":
            return ["srun", "--nodes", "1", "--ntasks", "1", "--nodelist", host.address, "--overlap",
                    "--kill-on-bad-exit=1", "--chdir", cwd, "env", *assignments, *argv]
        remote = f"cd {shlex.quote(cwd)} && exec env {shlex.join(assignments)} {shlex.join(argv)}"
        return ["ssh", "-tt", "-o", "BatchMode=yes", host.address, remote]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


@lru_cache(maxsize=1)
def _own_names() -> frozenset[str]:
    import psutil

    names = {socket.gethostname(), socket.getfqdn(), "localhost"}
    for addresses in psutil.net_if_addrs().values():
        names.update(a.address.split("%")[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6))
    return frozenset(names)


def is_this_machine(address: str) -> bool:
    return _is_loopback(address) or address in _own_names()


def local_placement(workers: int, cpus: int) -> Placement:
    return Placement("local", (Host("127.0.0.1", workers, cpus, True),))


def namespace_placement(addresses: list[str], namespaces: list[str], cpus: int) -> Placement:
    """One rank per network namespace of this machine, at its address there (a shaped link)."""
    return Placement("local", tuple(Host(a, 1, cpus, True, ns) for a, ns in zip(addresses, namespaces, strict=True)))


def _spread(variant: Variant, names: list[str], workers: int, cpus: int, where: str) -> Placement:
    if len(set(names)) != len(names):
        raise PlacementError(f"{where}: a host is listed twice")
    if workers % len(names):
        raise PlacementError(f"--workers {workers} cannot be spread evenly over the {len(names)} hosts of {where}")
    per_host = workers // len(names)
    return Placement(variant, tuple(Host(n, per_host, cpus, variant != "slurm" and is_this_machine(n))
                                    for n in names))


def hosts_placement(hosts: str, workers: int, cpus: int) -> Placement:
    """`--hosts H1,H2,...`: remote hosts are assumed to have as many cores as this one (--threads
    sets the threads per worker where they differ)."""
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise PlacementError("--hosts: no host given")
    if len(names) > workers:
        raise PlacementError(f"--hosts lists {len(names)} hosts for {workers} workers; give at least one worker per host")
    return _spread("hosts", names, workers, cpus, "--hosts")


def slurm_placement(workers: int, environ: Mapping[str, str], run=subprocess.run) -> Placement:
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise PlacementError("inside a Slurm job but SLURM_JOB_NODELIST is not set")
    try:
        scontrol = shutil.which("scontrol", path=environ.get("PATH")) or "scontrol"
        out = run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PlacementError(f"cannot expand SLURM_JOB_NODELIST {nodelist!r} with scontrol: {e}") from None
    if out.returncode != 0:
        raise PlacementError(f"scontrol show hostnames {nodelist!r} failed: {out.stderr.strip()}")
    nodes = out.stdout.split()
    cpus = int(environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    nodes = nodes[:workers]  # fewer workers than nodes: the first nodes
    return _spread("slurm", nodes, workers, cpus, "the Slurm allocation")


def detect(workers: int, cpus: int, hosts: str | None = None, environ: Mapping[str, str] = os.environ,
           run=subprocess.run) -> Placement:
    """--hosts when given; else the Slurm allocation this runs in; else this machine."""
    if workers < 1:
        raise PlacementError("--workers must be at least 1")
    if hosts is not None:
        return hosts_placement(hosts, workers, cpus)
    if environ.get("SLURM_JOB_ID") and shutil.which("srun", path=environ.get("PATH")):
        return slurm_placement(workers, environ, run)
    return local_placement(workers, cpus)


def free_port() -> int:
    """A port no socket on this machine holds right now (bound on every address, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports, all held until all are chosen (so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
