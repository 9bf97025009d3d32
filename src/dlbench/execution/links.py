"""Shaped links between the workers of a job on one machine (`dlbench run --link RATE[,DELAY]`).

Loopback moves tens of GB/s, so no choice about communication can be judged over it. With --link
every worker of a job runs in a network namespace of its own, joined to the others by a veth pair
and a bridge, and its traffic leaves through a rate limiter (and, with a delay, a delay line):

    netns dlb<T>-w0   iface dlb<T> 10.X.Y.1/24  --veth--  dlb<T>p0 ┐
    netns dlb<T>-w1   iface dlb<T> 10.X.Y.2/24  --veth--  dlb<T>p1 ├ bridge dlb<T>br  (netns dlb<T>-hub)
    ...                                                            ┘

`T` is the link's token (6 hex digits), in every name dlbench gives, so what a run left is found
by name and nothing else is ever touched. The bridge and the hub-side ends of the veth pairs live
in a namespace of their own (`dlb<T>-hub`), not in the host's: the host's network namespace never
gets a device, an address, a route or a qdisc, the host's firewall rules (a dockerd's FORWARD
chain) never see the traffic, and the bridge is connected to nothing but the workers. Addresses
exist only inside the worker namespaces, in a 10.X.Y.0/24 chosen not to overlap any route or
address of the host (a rank never reaches anything but its peers: the namespaces have no default
route and no other interface than `lo`). No iptables rule, sysctl of the host or NAT is changed.

Shaping, on each worker's egress (its own interface, inside its namespace):
- `tbf` (token bucket filter) at the rate: it is classless, exact on average, and built into
  every kernel (CONFIG_NET_SCH_TBF); `htb` would do the same with a class tree for nothing here.
  Its bucket holds 2 ms at the rate (at least 64 KiB, so a segmentation-offloaded packet passes
  whole) and its queue 20 ms at the rate (at least two buckets). Measured on this project's 2-core
  VM (one TCP stream, 1.5 s): a 1 ms bucket and a 5 ms queue moved 810-900 Mbit/s on 1gbit (drops
  and the VM's timer slack), 2 ms and 20 ms 945 Mbit/s, which is the rate less the headers'
  share (1448 payload bytes in a 1514-byte frame: 95.6%).
- with a delay, `netem delay D` as tbf's child (1:1 → 10:): tbf takes the rate, netem holds each
  packet D. A round trip crosses two egresses, so it gains 2 D. Kernels built without netem
  (CONFIG_NET_SCH_NETEM unset, as on this project's VM) cannot add a delay: the link is refused
  with that reason, not shaped without it.
Ingress is not shaped: a worker's incoming traffic is its peers' egress, shaped there.

Lifetime: `shaped_link` creates it (the owner file first: /run/dlbench/links/<T>.json, the owner's
pid and start time) and removes it when the block ends, whatever ends it (SIGINT, SIGTERM and
SIGHUP arrive as Interrupted: execution/interrupts.py; the removal is shielded). A controller
killed with SIGKILL leaves its namespaces: `sweep_orphans`, called by every dlbench command, removes
those whose owner is gone (a live owner's are left alone), killing any process still inside them
first, since a namespace outlives its name while a process holds it.

Root is needed (namespaces, links, qdiscs); without it `--link` is refused with that reason.
"""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from .interrupts import shielded

PREFIX = "dlb"
NETNS_DIR = Path("/run/netns")
OWNERS_DIR = Path("/run/dlbench/links")
# netns names dlbench gives: dlb<token>-hub, dlb<token>-w<i>
NETNS_NAME = re.compile(r"^dlb([0-9a-f]{6})-(hub|w\d+)$")
MIN_RATE_BPS = 1_000_000  # 1mbit: slower and a smoke run's gradients take minutes per step
MAX_RATE_BPS = 400_000_000_000  # 400gbit
MAX_DELAY_S = 1.0
BUCKET_S = 0.002  # tbf's bucket, in time at the rate
QUEUE_S = 0.02  # tbf's queue, in time at the rate
MIN_BUCKET_BYTES = 64 * 1024
COMMAND_TIMEOUT_S = 30.0

_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)bit$")
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}  # tc's: decimal
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


class LinkError(RuntimeError):
    """A link cannot be made, shaped or removed as asked; str() says why (one line)."""


@dataclass(frozen=True)
class LinkSpec:
    """`--link RATE[,DELAY]` parsed: the rate in bit/s, the one-way delay each egress adds."""

    asked: str  # as given, lower-cased, without spaces: "10gbit,50us"
    rate_bps: int
    delay_s: float = 0.0

    @property
    def label(self) -> str:
        """For benchmark names and tables: the rate, and the delay where there is one."""
        return self.asked.replace(",", "+")


def parse_link(text: str) -> LinkSpec:
    """`RATE[,DELAY]`: RATE a number and kbit, mbit, gbit or tbit (or bit; decimal, as tc's), DELAY a
    number and us, ms or s. ValueError naming --link and what is wrong."""
    asked = "".join(text.split()).lower()
    parts = asked.split(",")
    if not asked or len(parts) > 2:
        raise ValueError(f"--link {text!r}: expected RATE[,DELAY], e.g. 1gbit or 10gbit,50us")
    rate = _RATE.match(parts[0])
    if rate is None:
        raise ValueError(f"--link {text!r}: rate {parts[0]!r} is not a number followed by bit, kbit, mbit, gbit "
                         "or tbit (e.g. 100mbit, 2.5gbit)")
    rate_bps = int(float(rate.group(1)) * _RATE_UNITS[rate.group(2)])
    if not MIN_RATE_BPS <= rate_bps <= MAX_RATE_BPS:
        raise ValueError(f"--link {text!r}: rate {parts[0]} is outside 1mbit..400gbit")
    delay_s = 0.0
    if len(parts) == 2:
        delay = _DELAY.match(parts[1])
        if delay is None:
            raise ValueError(f"--link {text!r}: delay {parts[1]!r} is not a number followed by us, ms or s "
                             "(e.g. 50us, 2ms)")
        delay_s = float(delay.group(1)) * _DELAY_UNITS[delay.group(2)]
        if not 0 < delay_s <= MAX_DELAY_S:
            raise ValueError(f"--link {text!r}: delay {parts[1]} is outside (0, 1s]")
    return LinkSpec(asked, rate_bps, delay_s)


def tbf_sizes(rate_bps: int) -> tuple[int, int]:
    """(bucket, queue limit) in bytes for tbf at `rate_bps` (the module's docstring says why)."""
    per_s = rate_bps / 8
    bucket = max(int(per_s * BUCKET_S), MIN_BUCKET_BYTES)
    return bucket, max(int(per_s * QUEUE_S), 2 * bucket)


def shaping_commands(spec: LinkSpec, namespace: str, interface: str) -> list[list[str]]:
    """The tc commands that shape one worker's egress."""
    bucket, limit = tbf_sizes(spec.rate_bps)
    commands = [["tc", "-n", namespace, "qdisc", "add", "dev", interface, "root", "handle", "1:", "tbf",
                 "rate", f"{spec.rate_bps}bit", "burst", str(bucket), "limit", str(limit)]]
    if spec.delay_s:
        commands.append(["tc", "-n", namespace, "qdisc", "add", "dev", interface, "parent", "1:1", "handle", "10:",
                         "netem", "delay", f"{round(spec.delay_s * 1e6)}us"])
    return commands


def describe_shaping(spec: LinkSpec) -> str:
    bucket, limit = tbf_sizes(spec.rate_bps)
    text = f"tbf rate {spec.rate_bps} bit/s, bucket {bucket} B, queue {limit} B on each worker's egress"
    if spec.delay_s:
        text += f", netem delay {spec.delay_s * 1e6:g} us under it"
    return text


# ------------------------------------------------------------------ the commands (a boundary tests fake)

Run = Callable[[list[str]], str]


def run_command(argv: list[str]) -> str:
    """Run an `ip`/`tc` command; its stdout, or LinkError with its stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LinkError(f"{' '.join(argv)}: {e}") from None
    if done.returncode != 0:
        raise LinkError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit status {done.returncode}'}")
    return done.stdout


def netem_missing(config: Path = Path("/proc/config.gz"), sys_module: Path = Path("/sys/module")) -> bool:
    """Whether the running kernel surely has no netem qdisc: not loaded (no /sys/module/sch_netem)
    and its build configuration (/proc/config.gz) neither builds it in nor has loadable modules.
    False where that cannot be told (no config exposed): making the link then says so if it fails."""
    if (sys_module / "sch_netem").exists():
        return False
    try:
        with gzip.open(config, "rt") as f:
            options = dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))
    except OSError:
        return False
    return options.get("CONFIG_NET_SCH_NETEM") != "y" and not (
        options.get("CONFIG_MODULES") == "y" and options.get("CONFIG_NET_SCH_NETEM") == "m")


def refusal(spec: LinkSpec | None = None) -> str | None:
    """Why this process cannot make links (not root, no ip or tc; for `spec` with a delay, a kernel
    without netem), or None."""
    if spec is not None and spec.delay_s and netem_missing():
        return (f"--link {spec.asked}: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM unset, no loadable "
                "modules), so a delay cannot be added; give a rate only")
    if os.geteuid() != 0:
        return ("--link needs root: it creates network namespaces, veth pairs, a bridge and tc qdiscs; "
                "run dlbench as root, or leave out --link")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"--link needs {' and '.join(missing)} (iproute2) on PATH"
    return None


# ------------------------------------------------------------------ one link


@dataclass(frozen=True)
class Link:
    token: str
    spec: LinkSpec
    workers: int
    subnet: ipaddress.IPv4Network

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.token}-hub"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.token}br"

    @property
    def interface(self) -> str:
        """Each worker's interface, the same name in every worker namespace (GLOO_SOCKET_IFNAME)."""
        return f"{PREFIX}{self.token}"

    def namespace(self, worker: int) -> str:
        return f"{PREFIX}{self.token}-w{worker}"

    def port(self, worker: int) -> str:
        """The hub-side end of the worker's veth pair (its counters are the worker's traffic)."""
        return f"{PREFIX}{self.token}p{worker}"

    def address(self, worker: int) -> str:
        return str(self.subnet.network_address + 1 + worker)

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(self.namespace(i) for i in range(self.workers))]


def owner_file(token: str, owners: Path = OWNERS_DIR) -> Path:
    return owners / f"{token}.json"


def _write_owner(link: Link, owners: Path) -> None:
    owners.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    data = {"token": link.token, "pid": me.pid, "create_time": me.create_time(), "subnet": str(link.subnet),
            "namespaces": link.namespaces}
    tmp = owner_file(link.token, owners).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, owner_file(link.token, owners))


def host_networks(run: Run = run_command) -> list[ipaddress.IPv4Network]:
    """Every IPv4 prefix the host's namespace routes or holds an address in (the default route
    aside: it covers everything and is what a private subnet is meant to stay off)."""
    found = []
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for link in json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for a in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                found.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return found


def choose_subnet(token: str, taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A 10.X.Y.0/24 overlapping none of `taken`, starting from the token's own (so that two links
    alive at once differ too), skipping 10.0.0.0/16 and 10.255.0.0/16, the most often used."""
    spans = [(int(t.network_address), int(t.broadcast_address)) for t in taken if t.version == 4]
    first = int(ipaddress.ip_address("10.1.0.0"))
    start = int(token, 16) % (254 * 256)
    for step in range(254 * 256):
        low = first + ((start + step) % (254 * 256)) * 256
        if not any(a <= low + 255 and low <= b for a, b in spans):
            return ipaddress.ip_network(f"{ipaddress.ip_address(low)}/24")
    raise LinkError("no 10.X.Y.0/24 is free of the host's routes and addresses")


def _live_subnets(owners: Path) -> list[ipaddress.IPv4Network]:
    out = []
    for path in owners.glob("*.json") if owners.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            out.append(ipaddress.ip_network(json.loads(path.read_text())["subnet"]))
    return out


def create(spec: LinkSpec, workers: int, run: Run = run_command, owners: Path = OWNERS_DIR,
           token: str | None = None, netns_dir: Path = NETNS_DIR) -> Link:
    """Make the link (its owner file first); on any failure remove what was made and raise LinkError."""
    token = token or secrets.token_hex(3)
    link = Link(token, spec, workers, choose_subnet(token, host_networks(run) + _live_subnets(owners)))
    _write_owner(link, owners)
    try:
        _build(link, run)
    except BaseException:
        with shielded():
            remove(link.token, run, owners, netns_dir)
        raise
    return link


def _build(link: Link, run: Run) -> None:
    hub, br = link.hub, link.bridge
    run(["ip", "netns", "add", hub])
    # addrgenmode none: no IPv6 link-local address, so nothing but the job's traffic on the wire
    run(["ip", "-n", hub, "link", "add", br, "type", "bridge"])
    run(["ip", "-n", hub, "link", "set", br, "addrgenmode", "none", "up"])
    for i in range(link.workers):
        ns, port = link.namespace(i), link.port(i)
        run(["ip", "netns", "add", ns])
        run(["ip", "-n", hub, "link", "add", port, "type", "veth", "peer", "name", link.interface, "netns", ns])
        run(["ip", "-n", hub, "link", "set", port, "addrgenmode", "none", "master", br, "up"])
        run(["ip", "-n", ns, "link", "set", link.interface, "addrgenmode", "none"])
        run(["ip", "-n", ns, "addr", "add", f"{link.address(i)}/{link.subnet.prefixlen}", "dev", link.interface])
        run(["ip", "-n", ns, "link", "set", link.interface, "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        for command in shaping_commands(link.spec, ns, link.interface):
            try:
                run(command)
            except LinkError as e:
                if "netem" in command and "unknown" in str(e).lower():
                    raise LinkError(f"--link {link.spec.asked}: this kernel has no netem qdisc "
                                    "(CONFIG_NET_SCH_NETEM), so a delay cannot be added; give a rate only") from None
                raise


def _ns_pids(namespace: str, run: Run) -> list[int]:
    try:
        return [int(p) for p in run(["ip", "netns", "pids", namespace]).split()]
    except LinkError:
        return []


def remove(token: str, run: Run = run_command, owners: Path = OWNERS_DIR, netns_dir: Path = NETNS_DIR) -> list[str]:
    """Remove every namespace of the link `token` (killing any process left inside first: a
    namespace lives on while a process holds it, its devices and qdiscs with it), then its owner
    file. The names removed; LinkError naming what could not be removed."""
    names = sorted(n for n in _netns_names(netns_dir) if NETNS_NAME.match(n) and NETNS_NAME.match(n).group(1) == token)
    for name in names:
        for pid in _ns_pids(name, run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    errors = []
    for name in names:
        try:
            run(["ip", "netns", "del", name])
        except LinkError as e:
            errors.append(str(e))
    if errors:
        raise LinkError("; ".join(errors))
    with contextlib.suppress(FileNotFoundError):
        owner_file(token, owners).unlink()
    return names


def _netns_names(netns_dir: Path) -> list[str]:
    try:
        return os.listdir(netns_dir)
    except OSError:
        return []


def _owner_alive(token: str, owners: Path) -> bool:
    try:
        data = json.loads(owner_file(token, owners).read_text())
        p = psutil.Process(int(data["pid"]))
        return abs(p.create_time() - float(data["create_time"])) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return False


def leftovers(owners: Path = OWNERS_DIR, netns_dir: Path = NETNS_DIR) -> list[str]:
    """Tokens of links whose owner is gone (its namespaces, or only its owner file, are left)."""
    tokens = {m.group(1) for m in map(NETNS_NAME.match, _netns_names(netns_dir)) if m}
    if owners.is_dir():
        tokens |= {p.stem for p in owners.glob("*.json") if re.fullmatch(r"[0-9a-f]{6}", p.stem)}
    return sorted(t for t in tokens if not _owner_alive(t, owners))


def sweep_orphans(run: Run = run_command, owners: Path = OWNERS_DIR, netns_dir: Path = NETNS_DIR) -> list[str]:
    """Remove the links whose owner died without removing them (kill -9); a live owner's are left
    alone. The namespaces removed; LinkError when some cannot be (not root: the names are in it)."""
    orphans = leftovers(owners, netns_dir)
    if not orphans:
        return []
    if os.geteuid() != 0:
        raise LinkError(f"links left by a dlbench that was killed ({', '.join(PREFIX + t for t in orphans)}) "
                        "need root to remove: run any dlbench command as root")
    removed = []
    for token in orphans:
        removed += remove(token, run, owners, netns_dir)
    return removed


@contextlib.contextmanager
def shaped_link(spec: LinkSpec, workers: int, run: Run = run_command, owners: Path = OWNERS_DIR):
    """The link for the block (a Link), removed whatever ends it."""
    why = refusal() if run is run_command else None
    if why:
        raise LinkError(why)
    link = create(spec, workers, run, owners)
    try:
        yield link
    finally:
        with shielded():
            remove(link.token, run, owners)
