"""What goes over a shaped link (links.py), measured from outside the frameworks: the link as it
performs (a socket test between two worker namespaces, before the jobs) and the bytes each worker
puts on the wire (the counters of the hub-side ends of the veth pairs, during a job).

Counters: a thread enters the hub's network namespace (setns(2) through libc: it moves that thread
only) and reads /proc/thread-self/net/dev every `interval_s`, on the monotonic clock the ranks mark
their measured window with (distributed_harness: `window_monotonic_ns`). A hub port receives
exactly what its worker sent, so the bytes a worker sent in the window are its port's received
bytes, interpolated at the window's two ends. They are the frames as they crossed the veth
(Ethernet, IP and TCP headers included; ARP too, which in a job's steady state is nothing): what a
framework's own accounting cannot see and cannot get wrong.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from .links import Link, LinkError
from .placement import free_port

CLONE_NEWNET = 0x40000000
INTERVAL_S = 0.01
PROBE_SECONDS = 1.0
PROBE_ROUNDS = 50
PROBE_SCRIPT = Path(__file__).with_name("link_probe.py")


@dataclass(frozen=True)
class Measured:
    bandwidth_bps: float  # achieved by one TCP stream from worker 0 to worker 1, at the receiver
    rtt_s: float  # median round trip of one byte between them
    seconds: float  # how long the stream was received
    method: str


def measure(link: Link, seconds: float = PROBE_SECONDS, rounds: int = PROBE_ROUNDS,
            python: str = sys.executable) -> Measured:
    """The socket test between worker 0 and worker 1 of `link` (link_probe.py); LinkError when it fails."""
    port = str(free_port())
    server = subprocess.Popen(["ip", "netns", "exec", link.namespace(1), python, str(PROBE_SCRIPT), "serve",
                               link.address(1), port], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        if server.stdout.readline().strip() != "ready":
            raise LinkError(f"the link's socket test did not start: {server.stderr.read().strip()}")
        client = subprocess.run(["ip", "netns", "exec", link.namespace(0), python, str(PROBE_SCRIPT), "send",
                                 link.address(1), port, str(seconds), str(rounds)],
                                capture_output=True, text=True, timeout=60 + seconds * 10, stdin=subprocess.DEVNULL)
        if client.returncode != 0:
            raise LinkError(f"the link's socket test failed: {client.stderr.strip()[-500:]}")
        received, err = server.communicate(timeout=60)
        if server.returncode != 0:
            raise LinkError(f"the link's socket test failed at the receiver: {err.strip()[-500:]}")
        stream, sender = json.loads(received), json.loads(client.stdout)
    except subprocess.TimeoutExpired:
        raise LinkError("the link's socket test did not finish within its time") from None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if stream["seconds"] <= 0:
        raise LinkError("the link's socket test received nothing")
    return Measured(bandwidth_bps=stream["bytes"] * 8 / stream["seconds"], rtt_s=statistics.median(sender["rtt_s"]),
                    seconds=stream["seconds"],
                    method=(f"one TCP stream worker 0 -> worker 1 for {seconds:g} s, bytes over the receiver's first "
                            f"to last byte; round trip: median of {rounds} one-byte TCP echoes (TCP_NODELAY)"))


def _read_dev(path: str = "/proc/thread-self/net/dev") -> dict[str, tuple[int, int]]:
    """interface -> (received bytes, sent bytes) of this thread's network namespace."""
    out = {}
    with open(path) as f:
        for line in f.readlines()[2:]:
            name, _, fields = line.partition(":")
            values = fields.split()
            out[name.strip()] = (int(values[0]), int(values[8]))
    return out


class WireCounters:
    """Samples the link's hub-side counters while the block runs (a context manager)."""

    def __init__(self, link: Link, interval_s: float = INTERVAL_S, netns_dir: Path = Path("/run/netns")):
        self.link, self.interval_s = link, interval_s
        self.ports = [link.port(i) for i in range(link.workers)]
        self.times: list[int] = []  # monotonic ns
        self.received: list[list[int]] = []  # per sample, per worker: its hub port's received bytes
        self._path = netns_dir / link.hub
        self._stop = threading.Event()
        self._error: str | None = None
        self._thread = threading.Thread(target=self._sample, name="dlbench-wire-counters", daemon=True)

    def __enter__(self) -> "WireCounters":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            fd = os.open(self._path, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            finally:
                os.close(fd)
            while True:
                stopping = self._stop.is_set()  # one last sample after the stop
                counters = _read_dev()
                self.times.append(time.monotonic_ns())
                self.received.append([counters[p][0] for p in self.ports])
                if stopping:
                    return
                self._stop.wait(self.interval_s)
        except (OSError, KeyError, ValueError) as e:
            self._error = f"the link's counters could not be read: {e}"

    def sent_between(self, start_ns: int, end_ns: int) -> list[float]:
        """Bytes each worker sent between two monotonic times inside the sampled span (linear
        between the samples around each); LinkError where the span does not cover them."""
        if self._error:
            raise LinkError(self._error)
        if len(self.times) < 2 or not self.times[0] <= start_ns <= end_ns <= self.times[-1]:
            raise LinkError("the link's counters were not sampled over the whole measured window")
        return [self._at(end_ns, w) - self._at(start_ns, w) for w in range(len(self.ports))]

    def _at(self, t: int, worker: int) -> float:
        i = bisect_left(self.times, t)
        if self.times[i] == t or i == 0:
            return float(self.received[i][worker])
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.received[i - 1][worker], self.received[i][worker]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def ring_allreduce_bytes(grad_bytes: int, workers: int) -> float:
    """What each worker sends per all-reduce of `grad_bytes` in a ring: 2(n-1)/n of it
    (reduce-scatter, then all-gather, each (n-1)/n)."""
    return 2 * (workers - 1) / workers * grad_bytes
