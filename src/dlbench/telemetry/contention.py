"""Contention: how much CPU other processes used while a worker measured, and waiting for a quiet
machine before it starts.

Every sample of the telemetry sampler (host.py) adds three cumulative CPU-time columns, in seconds:
`busy_cpu_s`, the machine's (psutil.cpu_times() summed over CPUs: user, nice, system, irq, softirq;
idle, iowait and steal are not busy, and guest time is inside user on Linux); `worker_cpu_s`, the
worker's process tree (user + system of the worker and of every descendant seen so far, each at the
last value read, so that a child that exits keeps what it used; a child that lives and dies between
two samples is missed and counts as other processes' time); and `sampler_cpu_s`, the sampler's own.
Over a measured window, the CPU time of the other processes is

    others = d(busy) - d(worker) - d(sampler)

between the last sample at or before the window's start and the first at or after its end (the
samples inside it when the window is not bracketed). The controller waiting for the worker counts as
another process; it uses next to nothing.

`other_cpu_pct` is `others` as a share of the cores the worker was given (its --threads) over that
span. Other processes only take the worker's time when they use more than the cores it was not
given, so the figure that is compared with the threshold, `contention_pct`, is what they used
beyond those spare cores, as a share of the cores the worker was given; with every core given (the
default) the two are equal. Steal (time the hypervisor gave this machine's CPUs to another guest,
already sampled) is shown beside it and gated by the same threshold. The kernel counts CPU time in
ticks (100 per second per CPU): over a 1 s window of 2 cores a few ticks of error, 1-2%, far below
the default threshold.
"""

from __future__ import annotations

import time

import psutil

DEFAULT_THRESHOLD_PCT = 10.0  # others above this share of the worker's cores: the repeat is contended
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


def busy_cpu_s() -> float:
    """CPU seconds the machine has spent busy since boot, all CPUs together."""
    times = psutil.cpu_times()
    return float(sum(getattr(times, f, 0.0) for f in _BUSY_FIELDS))


def process_cpu_s(process: psutil.Process) -> float:
    t = process.cpu_times()
    return float(t.user + t.system)


class TreeClock:
    """The CPU time of a process and its descendants, cumulative: each process at the last value read.

    Listing the descendants reads every process of the machine (psutil's parent map), about 1 ms
    with 80 processes here, so the members are listed again only every `relist_s` (workers rarely
    start processes); each read takes the members' times, some 20 us each."""

    def __init__(self, pid: int, relist_s: float = 0.5, clock=time.monotonic):
        self.root = psutil.Process(pid)
        self._seen: dict[tuple[int, float], float] = {}
        self._members: list[psutil.Process] = []
        self._listed_at: float | None = None
        self._relist_s, self._clock = relist_s, clock

    def read(self) -> float:
        now = self._clock()
        if self._listed_at is None or now - self._listed_at >= self._relist_s:
            try:
                self._members = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                self._members = [p for p in self._members if p.is_running()]
            self._listed_at = now
        for p in self._members:
            try:
                key = (p.pid, p.create_time())
                # never backwards: an exited worker not yet reaped (a zombie) may read as zero
                self._seen[key] = max(self._seen.get(key, 0.0), process_cpu_s(p))
            except psutil.Error:
                continue  # gone between the listing and the read: its last value stays
        return float(sum(self._seen.values()))


def window_contention(cpu: dict, t_ns: list[int], window_ns: tuple[int, int], given_cores: int,
                      total_cores: int, threshold_pct: float, steal_pct: float | None = None) -> dict:
    """Other processes' CPU over a measured window (the module docstring); `cpu` is the sampler's
    host result (series with busy_cpu_s, worker_cpu_s, sampler_cpu_s)."""
    out: dict = {"measured": False, "threshold_pct": threshold_pct, "given_cores": given_cores,
                 "spare_cores": max(total_cores - given_cores, 0), "steal_pct": steal_pct, "contended": False}
    series = cpu.get("series", {})
    busy, worker, sampler = (series.get(k) for k in ("busy_cpu_s", "worker_cpu_s", "sampler_cpu_s"))
    if busy is None or worker is None:
        out["reason"] = cpu.get("unavailable", {}).get("busy_cpu_s") or "no CPU times sampled"
        return out
    start, end = window_ns
    rows = [i for i, t in enumerate(t_ns) if busy[i] is not None and worker[i] is not None]
    before = [i for i in rows if t_ns[i] <= start]
    after = [i for i in rows if t_ns[i] >= end]
    if before and after:
        a, b = before[-1], after[0]
    else:
        inside = [i for i in rows if start <= t_ns[i] <= end]
        if len(inside) < 2:
            out["reason"] = "fewer than 2 samples of CPU times around the window"
            return out
        a, b = inside[0], inside[-1]
    span_s = (t_ns[b] - t_ns[a]) / 1e9
    if span_s <= 0 or given_cores < 1:
        out["reason"] = "no time between the samples around the window"
        return out
    own = (sampler[b] - sampler[a]) if sampler is not None and sampler[a] is not None and sampler[b] is not None else 0.0
    others_s = max((busy[b] - busy[a]) - (worker[b] - worker[a]) - own, 0.0)
    others_cores = others_s / span_s
    out.update(measured=True, span_s=span_s, other_cpu_s=others_s, other_cores=others_cores,
               other_cpu_pct=100.0 * others_cores / given_cores,
               contention_pct=100.0 * max(others_cores - out["spare_cores"], 0.0) / given_cores)
    reasons = []
    if out["contention_pct"] > threshold_pct:
        reasons.append(f"other processes used {out['contention_pct']:.0f}% of the worker's {given_cores} cores")
    if steal_pct is not None and steal_pct > threshold_pct:
        reasons.append(f"steal {steal_pct:.0f}%")
    out["contended"] = bool(reasons)
    if reasons:
        out["reason"] = "; ".join(reasons)
    return out


def wait_for_quiet(max_wait_s: float, given_cores: int, total_cores: int, threshold_pct: float,
                   probe_s: float = 0.5, exclude_pid: int | None = None,
                   clock=time.monotonic, sleep=time.sleep) -> dict:
    """Before a repeat: probe the other processes' CPU (all but `exclude_pid`'s tree, by default this
    process's) over `probe_s` until it is at or under the threshold, for at most `max_wait_s`.
    {"waited_s", "quiet": bool, "contention_pct" of the last probe}."""
    tree = TreeClock(exclude_pid if exclude_pid is not None else psutil.Process().pid)
    spare = max(total_cores - given_cores, 0)
    started = clock()
    pct = None
    while True:
        b0, t0, c0 = busy_cpu_s(), tree.read(), clock()
        sleep(probe_s)
        b1, t1, c1 = busy_cpu_s(), tree.read(), clock()
        span = max(c1 - c0, 1e-9)
        others = max((b1 - b0) - (t1 - t0), 0.0) / span
        pct = 100.0 * max(others - spare, 0.0) / max(given_cores, 1)
        waited = c1 - started
        if pct <= threshold_pct:
            return {"waited_s": waited, "quiet": True, "contention_pct": pct}
        if waited >= max_wait_s:
            return {"waited_s": waited, "quiet": False, "contention_pct": pct}
