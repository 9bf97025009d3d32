"""Host telemetry through psutil: CPU load and memory, the worker process's resident memory, and
the cumulative CPU times that contention is measured from (the machine's busy time, the worker's
process tree's, the sampler's own: contention.py).

psutil's cpu_percent() and cpu_times_percent() report the share since their previous call, so
both are called once when sampling starts: every sample then covers exactly one interval.
"""

from __future__ import annotations

import psutil

from .contention import TreeClock, busy_cpu_s, process_cpu_s


class HostTelemetry:
    def __init__(self, pid: int | None):
        self.series: dict[str, list] = {"util_pct_per_core": [], "mem_used_bytes": [], "load_1m": []}
        self.unavailable: dict[str, str] = {}
        self.rss_stopped: dict | None = None
        psutil.cpu_percent(percpu=True)
        # steal exists on Linux only (time a hypervisor gave this machine's CPUs to another guest)
        if hasattr(psutil.cpu_times_percent(), "steal"):
            self.series["steal_pct"] = []
        else:
            self.unavailable["steal_pct"] = "psutil reports no steal time on this platform"
        self._worker: psutil.Process | None = None
        self._tree: TreeClock | None = None
        self._self = psutil.Process()  # the sampler: its own CPU time is not the other processes'
        self.series.update(busy_cpu_s=[], sampler_cpu_s=[])
        if pid is None:
            self.unavailable["rss_bytes"] = "no worker pid given"
        else:
            self.watch(pid, rows_so_far=0)

    def watch(self, pid: int, rows_so_far: int) -> None:
        """Follow this worker's resident memory from now on (earlier rows read as missing)."""
        self.unavailable.pop("rss_bytes", None)
        self.series.setdefault("rss_bytes", [None] * rows_so_far)
        self.series.setdefault("worker_cpu_s", [None] * rows_so_far)
        try:
            self._worker = psutil.Process(pid)
            self._tree = TreeClock(pid)
        except psutil.Error as e:
            self.rss_stopped = {"t_ns": None, "reason": f"worker pid {pid}: {e}"}

    def sample(self, t_ns: int) -> None:
        s = self.series
        s["util_pct_per_core"].append(psutil.cpu_percent(percpu=True))
        s["mem_used_bytes"].append(psutil.virtual_memory().used)
        s["load_1m"].append(psutil.getloadavg()[0])
        if "steal_pct" in s:
            s["steal_pct"].append(psutil.cpu_times_percent().steal)
        if "rss_bytes" in s:
            s["rss_bytes"].append(self._rss(t_ns))
        if "worker_cpu_s" in s:
            s["worker_cpu_s"].append(self._tree.read() if self._tree is not None else None)
        s["busy_cpu_s"].append(busy_cpu_s())
        s["sampler_cpu_s"].append(process_cpu_s(self._self))

    def _rss(self, t_ns: int) -> int | None:
        if self._worker is None:
            return None
        try:
            with self._worker.oneshot():
                # an exited worker that its parent has not reaped yet reads as zero memory, not as gone
                if self._worker.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.ZombieProcess(self._worker.pid)
                return self._worker.memory_info().rss
        except psutil.Error as e:
            self.rss_stopped = {"t_ns": t_ns, "reason": f"worker pid {self._worker.pid}: {e}"}
            self._worker = None
            return None

    def result(self) -> dict:
        return {"series": self.series, "unavailable": self.unavailable, "rss_stopped": self.rss_stopped}
