"""The scheduling policies: which jobs run in a round, and on which device type. One class each, in
the table `POLICIES`; each says where it comes from.

Every policy is asked at each round boundary for an allocation (job -> type) of the devices, and in
between, when a job finishes or arrives, to fill devices that are free without moving any running
job (`fill`). A job runs on `workers` devices of one type. The simulator (planning/simulator.py)
passes its state; a policy reads, never writes it:

    now, active (job indices), speed[j][t] (iterations/s of job j on type t, 0: cannot run there),
    preference[j] (the types job j runs on, fastest first), best[j] (its fastest speed), and as numpy
    arrays arrivals, remaining, attained, received, best (for the orders, computed whole),
    workers[j], arrival[j], remaining[j] (iterations), attained[j] (device-seconds received),
    received[j][t] (seconds run on t), weight[j], running_on[j] (type or -1), capacity[t],
    rng (random.Random of the plan's seed)

Placement: a heterogeneity-agnostic policy puts a job on any type with room (chosen at random, the
plan's seed deciding; a running job stays where it is), as a scheduler that sees only a device count
does; a heterogeneity-aware one on the fastest type for that job with room. Jobs are visited in the
policy's order and a job that does not fit is passed over (the next ones may use the room:
backfilling).

The linear programs (Gavel's) are solved with scipy's HiGHS whenever the set of jobs changed since
the last solve; `lp_solve_s` keeps every solve's time. Their fractional allocation X[j][t] (the
share of time job j should spend on type t) is turned into rounds by Gavel's mechanism: the pairs
(j, t) in order of X[j][t] over the share of time j has received on t so far, highest first.
"""

from __future__ import annotations

import time

import numpy as np
from scipy import sparse
from scipy.optimize import linprog


class InfeasibleError(Exception):
    """The policy's program has no allocation that runs every job; the message says which job."""


class Policy:
    name = ""
    title = ""
    source = ""
    aware = True  # heterogeneity-aware placement
    framework_aware = False  # `framework: any` jobs run in the fastest framework and precision per type
    static = False  # the allocation depends only on which jobs there are (not on time, service or work done)

    def __init__(self):
        self.lp_solve_s: list[float] = []

    def order(self, state, jobs: list[int]) -> list[int]:
        raise NotImplementedError

    def allocate(self, state) -> dict[int, int]:
        free = list(state.capacity)
        return self._greedy(state, self.order(state, list(state.active)), free, {})

    def fill(self, state, waiting: list[int], free: list[int]) -> dict[int, int]:
        return self._greedy(state, self.order(state, waiting), free, {})

    def _greedy(self, state, ordered: list[int], free: list[int], out: dict[int, int]) -> dict[int, int]:
        left = sum(free)
        for j in ordered:
            if left == 0:
                break
            need = state.workers[j]
            if need > left:
                continue
            current = state.running_on[j]
            if self.aware:
                # the job's types fastest first (state.preference): the first with room, or the type it
                # runs on where that is as fast
                t = next((k for k in state.preference[j] if free[k] >= need), -1)
                if t < 0:
                    continue
                if current >= 0 and current != t and free[current] >= need and \
                        state.speed[j][current] >= state.speed[j][t]:
                    t = current
            else:
                room = [k for k in state.preference[j] if free[k] >= need]
                if not room:
                    continue
                room.sort()  # the cluster's order, so that the seed's draw means the same type
                t = current if current in room else room[state.rng.randrange(len(room))]
            free[t] -= need
            left -= need
            out[j] = t
        return out


class Fifo(Policy):
    name = "fifo"
    title = "FIFO"
    source = "first come, first served; heterogeneity-agnostic placement (the baseline of Gavel's and Tiresias' evaluations)"
    aware = False
    static = True

    def order(self, state, jobs):
        jobs = np.asarray(jobs, dtype=np.intp)
        return jobs[np.lexsort((jobs, state.arrivals[jobs]))].tolist()


class ShortestRemaining(Policy):
    name = "srtf"
    title = "SRTF"
    source = ("shortest remaining time first, preemptive at rounds, the remaining time predicted from the "
              "throughput matrix (the job's remaining iterations on its fastest type); aware placement")

    def order(self, state, jobs):
        jobs = np.asarray(jobs, dtype=np.intp)
        left_s = state.remaining[jobs] / state.best[jobs]  # every job runs somewhere: best > 0
        return jobs[np.lexsort((jobs, state.arrivals[jobs], left_s))].tolist()


# Tiresias' queues: a job moves down a queue when its attained service (device-seconds) passes each
# threshold. Tiresias tunes them per cluster; these (1 and 10 device-hours) are this planner's choice.
LAS_THRESHOLDS_S = np.array([3600.0, 36000.0])


class LeastAttained(Policy):
    name = "las"
    title = "Tiresias LAS"
    source = ("Tiresias' discretised two-dimensional least-attained service (Gu et al., NSDI 2019): queues by "
              "device-seconds attained (thresholds 1 and 10 device-hours), first come first served within a "
              "queue, so that jobs of similar service do not preempt each other every round; "
              "heterogeneity-agnostic as Tiresias is")
    aware = False

    def order(self, state, jobs):
        jobs = np.asarray(jobs, dtype=np.intp)
        queue = np.searchsorted(LAS_THRESHOLDS_S, state.attained[jobs], side="right")
        return jobs[np.lexsort((jobs, state.arrivals[jobs], queue))].tolist()


class LeastAttainedAware(LeastAttained):
    name = "las_aware"
    title = "LAS, aware placement"
    source = ("Tiresias' LAS order with heterogeneity-aware placement (the fastest type with room): the "
              "framework-aware policy less its framework choice, what it is compared with")
    aware = True


class FrameworkAware(LeastAttainedAware):
    name = "framework_aware"
    title = "framework-aware LAS"
    source = ("dlbench's: LAS order, aware placement, and a `framework: any` job in the framework and "
              "precision the matrix says is fastest on the type it gets (among the equivalent ones)")
    framework_aware = True


class LinearProgram(Policy):
    """Gavel's policies: an allocation X from a linear program, rounds by Gavel's priorities."""

    uses_throughput = True

    def __init__(self):
        super().__init__()
        self._x: dict[int, list[float]] = {}
        self._solved_for: frozenset[int] | None = None

    def solve(self, state, jobs: list[int]) -> dict[int, list[float]]:
        n, types = len(jobs), len(state.capacity)
        speed = np.array([state.speed[j] for j in jobs], dtype=float)
        need = np.array([state.workers[j] for j in jobs], dtype=float)
        cap = np.array(state.capacity, dtype=float)
        runnable = (speed > 0) & (need[:, None] <= cap[None, :])
        stuck = np.flatnonzero(~runnable.any(axis=1))
        if len(stuck):
            j = jobs[stuck[0]]
            raise InfeasibleError(f"no feasible allocation: job {state.ids[j]} ({state.workers[j]} workers) can run on "
                                  "no type of the cluster (too few devices of every type it has a throughput on)")
        effective = speed if self.uses_throughput else runnable.astype(float)
        coefficient = self.coefficients(state, jobs, speed, runnable)
        # variables: X (n x types, row-major), then s; minimise -s
        nx = n * types
        c = np.zeros(nx + 1)
        c[-1] = -1.0
        rows = np.repeat(np.arange(n), types)
        cols = np.arange(nx)
        # each job's row divided by its coefficient: s - sum_t X[j][t] * speed[j][t] / coefficient[j] <= 0
        fair = sparse.csr_matrix(((-effective / coefficient[:, None]).ravel(), (rows, cols)), shape=(n, nx))
        fair = sparse.hstack([fair, sparse.csr_matrix(np.ones((n, 1)))])
        one_each = sparse.hstack([sparse.csr_matrix((np.ones(nx), (rows, cols)), shape=(n, nx)),
                                  sparse.csr_matrix((n, 1))])
        per_type = sparse.hstack([sparse.csr_matrix((np.repeat(need, types), (np.tile(np.arange(types), n), cols)),
                                                    shape=(types, nx)), sparse.csr_matrix((types, 1))])
        a_ub = sparse.vstack([fair, one_each, per_type]).tocsr()
        b_ub = np.concatenate([np.zeros(n), np.ones(n), cap])
        bounds = [(0.0, 1.0 if ok else 0.0) for ok in runnable.ravel()] + [(0.0, None)]
        started = time.perf_counter()
        result = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
        self.lp_solve_s.append(time.perf_counter() - started)
        if result.status != 0:
            raise InfeasibleError(f"{self.title}: HiGHS found no allocation ({result.message})")
        x = result.x[:nx].reshape(n, types)
        return {j: list(x[i]) for i, j in enumerate(jobs)}

    def coefficients(self, state, jobs, speed, runnable) -> np.ndarray:
        """Per job, what its throughput under X is divided by in the objective max min_j (throughput_j / c_j)."""
        raise NotImplementedError

    def allocate(self, state) -> dict[int, int]:
        active = frozenset(state.active)
        if active != self._solved_for:
            self._x = self.solve(state, sorted(active)) if active else {}
            self._solved_for = active
        free = list(state.capacity)
        out: dict[int, int] = {}
        pairs = []
        for j in state.active:
            elapsed = max(state.now - state.arrival[j], 1e-9)
            for t, share in enumerate(self._x.get(j, ())):
                if share > 1e-6:
                    got = state.received[j][t] / elapsed
                    pairs.append((share / max(got, 1e-6), share, -j, t, j))
        pairs.sort(reverse=True)
        for _, _, _, t, j in pairs:
            if j in out or free[t] < state.workers[j]:
                continue
            free[t] -= state.workers[j]
            out[j] = t
        return out

    def fill(self, state, waiting, free):
        pairs = sorted(((self._x.get(j, [0.0] * len(free))[t], -j, t, j) for j in waiting for t in range(len(free))),
                       reverse=True)
        out: dict[int, int] = {}
        for share, _, t, j in pairs:
            if share <= 1e-6 or j in out or free[t] < state.workers[j]:
                continue
            free[t] -= state.workers[j]
            out[j] = t
        return out


class MaxMinFairness(LinearProgram):
    name = "gavel_maxmin"
    title = "Gavel max-min fairness"
    source = ("Gavel's heterogeneity-aware max-min fairness (Narayanan et al., OSDI 2020, §4.1): maximise the "
              "smallest weighted throughput relative to an equal share of every type, an LP (HiGHS)")

    def coefficients(self, state, jobs, speed, runnable):
        effective = speed if self.uses_throughput else runnable.astype(float)
        cap = np.array(state.capacity, dtype=float)
        equal = effective @ (cap / cap.sum())  # the throughput of an equal share of every type
        weight = np.array([state.weight[j] for j in jobs])
        return weight * np.where(equal > 0, equal, 1.0)


class MaxMinAgnostic(MaxMinFairness):
    name = "maxmin_agnostic"
    title = "max-min fairness (agnostic)"
    source = ("the same program with every type taken as equally fast (Gavel's heterogeneity-agnostic LAS "
              "baseline of its Figure 8): a fair share of device time, whatever the device")
    uses_throughput = False


class MinMakespan(LinearProgram):
    name = "gavel_makespan"
    title = "Gavel min makespan"
    source = ("Gavel's heterogeneity-aware makespan policy (OSDI 2020, §4.2): maximise 1/M such that every "
              "job's remaining work is done within M at its allocated throughput, an LP (HiGHS)")

    def coefficients(self, state, jobs, speed, runnable):
        # max min_j throughput_j / remaining_j = 1 / M: every job done within M
        return np.maximum(np.array([state.remaining[j] for j in jobs], dtype=float), 1e-9)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Fifo, ShortestRemaining, LeastAttained, LeastAttainedAware,
                                                         MaxMinAgnostic, MaxMinFairness, MinMakespan, FrameworkAware)}
LP_POLICIES = tuple(name for name, p in POLICIES.items() if issubclass(p, LinearProgram))


def policy(name: str) -> Policy:
    if name not in POLICIES:
        raise KeyError(name)
    return POLICIES[name]()
