"""The event-driven simulator: jobs arrive, a policy allocates devices in rounds, jobs run at their
matrix throughput and finish.

Time moves from event to event: a round boundary (every `round_s`, Gavel's mechanism: the policy's
allocation is made again), an arrival, a job finishing. At a round boundary the policy allocates
every device afresh (planning/policies.py); between boundaries an arrival or a finished job only
fills devices that are free, moving no running job. A job that starts again after it ran before
(stopped by a round, or moved to another type) pays `preemption_s` first, on its devices, with no
progress (checkpoint, restore, warm-up). A job runs on `workers` devices of one type at the
throughput the matrix gives it there. The policy picks the type by its free devices; the simulator
then places the job on that type's nodes: packed in one node where one has room (the fullest that
has: best fit, which keeps whole nodes free for large jobs), else spread over the nodes with the most
free devices (the fewest nodes), at its `spread` throughput, the ring crossing the network between
nodes. A job that would fit a node but is spread for want of one with room is fragmentation: each
such start, and the device-seconds run so, are counted (Outcome.spread_starts, Simulation.spread_device_s).
A job stays on its nodes while it keeps its type; a job whose spread throughput is 0 (the cluster
file gives no network) waits for a node with room. With no job waiting or running it jumps to the
next arrival, and a round starts there.
A policy whose allocation depends only on which jobs there are (FIFO: `static`) is not asked again
until a job arrives or finishes: the rounds in between pass as they are (and are counted).

Deterministic per seed: the only chance in it is the agnostic placement's choice among types with
room (policies.py), drawn from random.Random(seed); everything else is ordered by (time, job index).
A simulation longer than `max_rounds` rounds stops and says how many jobs were left unfinished.

A steady-state measurement (Gavel's: the average JCT of jobs 4000 to 5000 of a continuous trace)
names the jobs it `measures`: the simulation stops when they are all done, the jobs after them still
arriving and competing until then, so that the measured ones see a loaded cluster and not its
draining tail. The jobs still running then are not counted as unfinished: the summary reports the
measured ones (planning/metrics.py).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import numpy as np

from .cluster import Cluster
from .policies import InfeasibleError, Policy

MAX_ROUNDS = 2_000_000


@dataclass
class Outcome:
    """One job's fate."""

    id: str
    arrival_s: float
    workers: int = 1
    start_s: float | None = None
    finish_s: float | None = None
    seconds_on: dict[str, float] = field(default_factory=dict)  # type -> seconds it held devices there
    preemptions: int = 0
    spread_starts: int = 0  # starts spread over nodes although the job fits one (no node had room)
    contention: int = 1  # jobs in the system when it arrived, itself included
    isolated_s: float = 0.0  # its work alone on the cluster's average device (for finish-time fairness)

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s


@dataclass
class Simulation:
    policy: str
    seed: int
    outcomes: list[Outcome]
    busy_device_s: list[float]  # per type, devices held (running or restarting) x seconds
    timeline: list[tuple[float, tuple[int, ...]]]  # (time, devices held per type) at every change
    rounds: int
    preemptions: int
    lp_solve_s: list[float]
    unfinished: int = 0
    notes: list[str] = field(default_factory=list)
    measured: list[int] | None = None  # the job indices a steady-state window measures (None: all)
    spread_device_s: float = 0.0  # device-seconds held by jobs spread although each fits a node


class State:
    """What a policy reads (planning/policies.py names the fields)."""

    def __init__(self, ids, arrival, workers, weight, remaining, speed, capacity, seed):
        n, types = len(arrival), len(capacity)
        self.ids = ids
        self.arrival = arrival
        self.workers = workers
        self.weight = weight
        self.remaining = remaining
        self.speed = speed
        self.capacity = capacity
        # each job's types where it runs at all, fastest first (ties: the cluster's order), and its best speed
        self.preference = [sorted((t for t in range(types) if row[t] > 0), key=lambda t: (-row[t], t)) for row in speed]
        self.best = np.array([max(row) if row else 0.0 for row in speed])
        self.arrivals = np.array(arrival, dtype=float)
        self.attained = np.zeros(n)
        self.received = np.zeros((n, types))
        self.running_on = [-1] * n
        self.active: list[int] = []
        self.now = 0.0
        self.rng = random.Random(seed)


def check_runnable(ids, workers, speed, capacity) -> None:
    for j, row in enumerate(speed):
        if not any(s > 0 and workers[j] <= capacity[t] for t, s in enumerate(row)):
            raise InfeasibleError(f"no feasible allocation: job {ids[j]} ({workers[j]} workers) can run on no type of "
                                  "the cluster (no throughput, or too few devices, on every type)")


def simulate(cluster: Cluster, ids: list[str], arrival: list[float], workers: list[int], weight: list[float],
             iterations: list[float], speed: list[list[float]], policy: Policy, seed: int = 0,
             max_rounds: int = MAX_ROUNDS, measured: list[int] | None = None,
             spread: list[list[float]] | None = None) -> Simulation:
    """Run `policy` over the jobs (parallel lists; `speed[j][t]`: iterations per second of job j on the
    cluster's type t, 0 where it cannot run). InfeasibleError when a job can run nowhere. `measured`:
    stop once these jobs (indices) are done. `spread[j][t]`: job j's iterations per second on type t
    spread over nodes (None: the same as `speed`)."""
    capacity = [t.count for t in cluster.types]
    check_runnable(ids, workers, speed, capacity)
    n, types = len(ids), len(capacity)
    st = State(ids, arrival, workers, weight, np.array(iterations, dtype=float), speed, capacity, seed)
    names = cluster.names
    total = sum(capacity)
    average = [sum(capacity[t] * row[t] for t in range(types)) / total for row in speed]
    outcomes = [Outcome(ids[j], arrival[j], workers[j], isolated_s=iterations[j] / average[j] if average[j] > 0 else math.inf)
                for j in range(n)]
    order = sorted(range(n), key=lambda j: (arrival[j], j))
    pending = 0  # index into order
    used = [0] * types
    busy = [0.0] * types
    timeline: list[tuple[float, tuple[int, ...]]] = [(0.0, tuple(used))]
    since = np.zeros(n)  # when the job's progress was last accounted
    ready = np.zeros(n)  # when its restart overhead ends
    pace = np.zeros(n)  # its iterations per second where it runs now
    # each type's free devices per node, and the (node, devices) each running job holds
    node_free = [np.full(t.nodes, t.per_node, dtype=np.int64) for t in cluster.types]
    per_node = [t.per_node for t in cluster.types]
    holds: dict[int, list[tuple[int, int]]] = {}
    fragmented = np.zeros(n, dtype=bool)  # running spread although it fits a node
    spread_busy = 0.0
    device_count = np.array(workers, dtype=float)
    running: set[int] = set()
    has_run = [False] * n
    version = [0] * n  # a job's entries in the heap of finish times are valid while this is unchanged
    finished = 0
    watched = np.zeros(n, dtype=bool)
    watched[list(measured) if measured is not None else slice(None)] = True
    to_watch = int(watched.sum())  # measured jobs not done yet: the simulation's end
    rounds = preemptions = 0
    active_set: set[int] = set()

    def note_use(now: float) -> None:
        if timeline[-1][0] == now:
            timeline[-1] = (now, tuple(used))
        else:
            timeline.append((now, tuple(used)))

    remaining, attained, received = st.remaining, st.attained, st.received

    def account(j: int, now: float) -> None:
        nonlocal spread_busy
        t = st.running_on[j]
        start = since[j]
        held = now - start
        if held <= 0:
            return
        if fragmented[j]:
            spread_busy += workers[j] * held
        busy_from = ready[j] if ready[j] > start else start
        if now > busy_from:
            left = remaining[j] - pace[j] * (now - busy_from)
            remaining[j] = left if left > 0 else 0.0
        attained[j] += workers[j] * held
        received[j, t] += held  # received[j] doubles as the seconds held on each type
        busy[t] += workers[j] * held
        since[j] = now

    def account_all(now: float) -> None:
        """account() for every running job at once (numpy): what a round's end costs."""
        nonlocal spread_busy
        if not running:
            return
        idx = np.fromiter(running, dtype=np.intp, count=len(running))
        on = np.array([st.running_on[j] for j in idx], dtype=np.intp)
        held = now - since[idx]
        busy_from = np.maximum(ready[idx], since[idx])
        remaining[idx] = np.maximum(remaining[idx] - pace[idx] * np.maximum(now - busy_from, 0.0), 0.0)
        attained[idx] += device_count[idx] * held
        spread_busy += float((device_count[idx] * held)[fragmented[idx]].sum())
        received[idx, on] += held
        per_type = np.bincount(on, weights=device_count[idx] * held, minlength=types)
        for t in range(types):
            busy[t] += per_type[t]
        since[idx] = now

    def stop(j: int, now: float) -> None:
        account(j, now)
        t = st.running_on[j]
        used[t] -= workers[j]
        for node, count in holds.pop(j):
            node_free[t][node] += count
        fragmented[j] = False
        st.running_on[j] = -1
        running.discard(j)
        version[j] += 1

    def place(j: int, t: int) -> list[tuple[int, int]] | None:
        """The (node, devices) job j gets on type t: one node with room (the fullest such), else the
        nodes with the most free devices; None when it must be packed and no node has room."""
        need, free = workers[j], node_free[t]
        if need <= per_node[t]:
            fits = np.flatnonzero(free >= need)
            if len(fits):
                return [(int(fits[np.argmin(free[fits])]), need)]
            if spread is not None and spread[j][t] <= 0:
                return None
        got = []
        for node in np.argsort(-free, kind="stable"):
            take = min(int(free[node]), need)
            if take <= 0:
                break
            got.append((int(node), take))
            need -= take
            if need == 0:
                break
        return got

    def start(j: int, t: int, now: float, heap: list) -> bool:
        nonlocal preemptions
        got = place(j, t)
        if got is None:
            return False
        for node, count in got:
            node_free[t][node] -= count
        holds[j] = got
        apart = len(got) > 1 and workers[j] <= per_node[t]
        fragmented[j] = apart
        if apart:
            outcomes[j].spread_starts += 1
        st.running_on[j] = t
        running.add(j)
        pace[j] = spread[j][t] if apart and spread is not None else speed[j][t]
        used[t] += workers[j]
        since[j] = now
        if has_run[j]:
            ready[j] = now + cluster.preemption_s
            outcomes[j].preemptions += 1
            preemptions += 1
        else:
            ready[j] = now
            has_run[j] = True
            outcomes[j].start_s = now
        version[j] += 1
        heapq.heappush(heap, (ready[j] + st.remaining[j] / pace[j], j, version[j]))
        return True

    def admit(now: float) -> None:
        nonlocal pending
        while pending < n and arrival[order[pending]] <= now:
            j = order[pending]
            pending += 1
            active_set.add(j)
            outcomes[j].contention = len(active_set)

    def fill(now: float, heap: list) -> None:
        free = [capacity[t] - used[t] for t in range(types)]
        if not any(free):
            return
        waiting = sorted(j for j in active_set if st.running_on[j] < 0)
        if not waiting:
            return
        st.now = now
        st.active = sorted(active_set)
        for j, t in policy.fill(st, waiting, free).items():
            start(j, t, now, heap)
        note_use(now)

    now = 0.0
    heap: list = []  # (finish time, job, its version when pushed)
    changed = True  # an arrival or a finish since the last allocation
    while to_watch:
        if not active_set:
            now = max(now, arrival[order[pending]])
        if pending < n and arrival[order[pending]] <= now:
            admit(now)
            changed = True
        if rounds >= max_rounds:
            break
        rounds += 1
        end = now + cluster.round_s
        if changed or not policy.static:
            st.now = now
            st.active = sorted(active_set)
            allocation = policy.allocate(st)
            for j in st.active:
                if st.running_on[j] >= 0 and allocation.get(j) != st.running_on[j]:
                    stop(j, now)
            for j, t in sorted(allocation.items()):
                if st.running_on[j] < 0:
                    start(j, t, now, heap)
            note_use(now)
            changed = False
        if policy.static:
            # its allocation changes only with the jobs: the rounds until the next arrival or finish pass
            # as they are
            while heap and version[heap[0][1]] != heap[0][2]:
                heapq.heappop(heap)
            upcoming = min(heap[0][0] if heap else math.inf, arrival[order[pending]] if pending < n else math.inf)
            if upcoming < math.inf and upcoming >= end:
                skipped = min(math.floor((upcoming - now) / cluster.round_s), max_rounds - rounds)
                rounds += max(skipped - 1, 0)
                end = now + max(skipped, 1) * cluster.round_s
        while True:
            while heap and version[heap[0][1]] != heap[0][2]:
                heapq.heappop(heap)  # the job stopped or moved since the entry was pushed
            done_at = heap[0][0] if heap else math.inf
            arrives_at = arrival[order[pending]] if pending < n else math.inf
            at = min(done_at, arrives_at)
            if at > end:  # a finish right at the boundary is this round's
                break
            changed = True
            if done_at <= arrives_at:
                _, j, _ = heapq.heappop(heap)
                stop(j, at)
                st.remaining[j] = 0.0
                outcomes[j].finish_s = at
                active_set.discard(j)
                finished += 1
                to_watch -= bool(watched[j])
                note_use(at)
                now = at
                if not to_watch:
                    break
            else:
                admit(at)
            fill(at, heap)
        if not to_watch:
            break
        now = end
        if not policy.static:  # what the policy reads next round: service, remaining work, time per type
            account_all(end)
    unfinished = to_watch
    for j in sorted(active_set):
        if st.running_on[j] >= 0:
            stop(j, now)
    note_use(now)
    for j, o in enumerate(outcomes):
        o.seconds_on = {names[t]: float(held) for t, held in enumerate(received[j]) if held > 0}
    notes = [f"stopped after {max_rounds:,} rounds: {unfinished} job(s) unfinished"] if unfinished else []
    if measured is not None and finished < n:
        notes.append(f"stopped when the {len(measured):,} measured jobs were done: {n - finished:,} other job(s) "
                     "had not arrived or finished (as a steady-state measurement does)")
    return Simulation(policy.name, seed, outcomes, busy, timeline, rounds, preemptions, list(policy.lp_solve_s),
                      unfinished, notes, None if measured is None else sorted(measured), spread_busy)
