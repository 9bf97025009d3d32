"""What a simulation comes to: job completion times, makespan, utilisation and cost per type, and
finish-time fairness.

- JCT: finish less arrival; the average and the 99th percentile (numpy's linear interpolation).
- Makespan: the last finish less the first arrival.
- Utilisation of a type: the device-seconds jobs held on it (restarts included) over its devices x
  the makespan (x the time simulated, where a bounded simulation stopped with jobs unfinished).
- Fragmentation: the starts of jobs spread over nodes although each fits one (no node had room:
  planning/simulator.py), and the share of the device-seconds held that such jobs held.
- Cost: what the devices jobs held cost at each type's hourly price (`used`), and what the whole
  cluster costs over the makespan (`cluster`), the bill if it is rented for the trace.
- Finish-time fairness ρ (Mahajan et al., "Themis", NSDI 2020; the form Gavel uses, §4.2): a job's
  JCT over the time it would take with 1/n of the cluster, n the jobs in the system when it arrived
  (itself included), that time taken as its work alone on the cluster's average device (the
  device-weighted mean of its throughputs) times n.
- Every figure of JCT, makespan and ρ is of the jobs that finished (`finished` of `jobs`); where the
  simulation measured a steady-state window (`measured`: Gavel's jobs 4000 to 5000), JCT and ρ are of
  those jobs only, and utilisation and the bill are over the time simulated. ρ <= 1: the job did at least as well as its
  fair share; the median, the 99th percentile and the largest are reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .cluster import Cluster
from .simulator import Simulation


@dataclass
class Summary:
    policy: str
    title: str
    jobs: int
    finished: int
    average_jct_s: float | None
    p99_jct_s: float | None
    makespan_s: float | None
    utilisation: dict[str, float]
    cost_used: float
    cost_cluster: float
    ftf_median: float | None
    ftf_p99: float | None
    ftf_max: float | None
    rounds: int
    preemptions: int
    lp_solves: int
    lp_solve_mean_s: float | None
    lp_solve_max_s: float | None
    notes: list[str]
    measured: str | None = None  # the window of jobs JCT and ρ are of ("4000-5000"), None: every job
    spread_starts: int = 0  # starts spread over nodes although the job fits one
    spread_share: float = 0.0  # of the device-seconds held, those of such jobs

    def to_dict(self) -> dict:
        return asdict(self)


def summarise(sim: Simulation, cluster: Cluster, title: str) -> Summary:
    window = sim.outcomes if sim.measured is None else [sim.outcomes[j] for j in sim.measured]
    done = [o for o in window if o.finish_s is not None]
    jct = np.array([o.jct_s for o in done], dtype=float)
    rho = np.array([o.jct_s / (o.isolated_s * o.contention) for o in done if o.isolated_s > 0], dtype=float)
    first = min(o.arrival_s for o in sim.outcomes)
    ended = [o.finish_s for o in sim.outcomes if o.finish_s is not None]
    makespan = (max(ended) - first) if ended else None
    # what utilisation and the cluster's bill are over: the makespan, or where a bounded simulation stopped
    stopped_early = sim.unfinished or len(ended) < len(sim.outcomes)
    span = (sim.timeline[-1][0] - first) if stopped_early else (makespan or 0.0)
    price = {t.name: t.price_per_hour for t in cluster.types}
    used = sum(s * o.workers * price[name] / 3600 for o in sim.outcomes for name, s in o.seconds_on.items())
    util = {t.name: (sim.busy_device_s[i] / (t.count * span) if t.count and span > 0 else 0.0)
            for i, t in enumerate(cluster.types)}
    cluster_cost = sum(t.count * t.price_per_hour for t in cluster.types) * span / 3600
    lp = sim.lp_solve_s
    return Summary(
        policy=sim.policy, title=title, jobs=len(window), finished=len(done),
        average_jct_s=float(jct.mean()) if len(jct) else None,
        p99_jct_s=float(np.percentile(jct, 99)) if len(jct) else None,
        makespan_s=makespan, utilisation=util, cost_used=used, cost_cluster=cluster_cost,
        ftf_median=float(np.median(rho)) if len(rho) else None,
        ftf_p99=float(np.percentile(rho, 99)) if len(rho) else None,
        ftf_max=float(rho.max()) if len(rho) else None,
        rounds=sim.rounds, preemptions=sim.preemptions, lp_solves=len(lp),
        lp_solve_mean_s=float(np.mean(lp)) if lp else None, lp_solve_max_s=float(np.max(lp)) if lp else None,
        notes=list(sim.notes),
        measured=None if sim.measured is None else _span_of(sim.measured),
        spread_starts=sum(o.spread_starts for o in sim.outcomes),
        spread_share=sim.spread_device_s / sum(sim.busy_device_s) if sum(sim.busy_device_s) > 0 else 0.0)


def _span_of(indices: list[int]) -> str:
    """`4000-5000` for a contiguous window of job indices, else how many."""
    if indices and indices[-1] - indices[0] + 1 == len(indices):
        return f"jobs {indices[0]}-{indices[-1]} of the trace"
    return f"{len(indices):,} jobs of the trace"


def jct_cdf(sim: Simulation, points: int = 200) -> list[tuple[float, float]]:
    """(JCT seconds, share of finished jobs at or under it), at most `points` of them."""
    jct = np.sort(np.array([o.jct_s for o in sim.outcomes if o.finish_s is not None], dtype=float))
    if not len(jct):
        return []
    idx = np.unique(np.linspace(0, len(jct) - 1, min(points, len(jct))).astype(int))
    return [(float(jct[i]), float((i + 1) / len(jct))) for i in idx]


def utilisation_over_time(sim: Simulation, cluster: Cluster, points: int = 200) -> list[tuple[float, float]]:
    """(time, share of all devices held), the timeline averaged over `points` equal windows."""
    if len(sim.timeline) < 2:
        return []
    total = cluster.devices
    times = np.array([t for t, _ in sim.timeline], dtype=float)
    held = np.array([sum(u) for _, u in sim.timeline], dtype=float) / total
    start, end = times[0], times[-1]
    if end <= start:
        return []
    edges = np.linspace(start, end, points + 1)
    # the integral of the step function held(t) up to each edge
    durations = np.diff(times)
    cumulative = np.concatenate([[0.0], np.cumsum(held[:-1] * durations)])
    at_edges = np.interp(edges, times, cumulative)
    means = np.diff(at_edges) / np.diff(edges)
    return [(float((a + b) / 2), float(m)) for a, b, m in zip(edges[:-1], edges[1:], means)]
