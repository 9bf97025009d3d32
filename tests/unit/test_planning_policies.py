"""The planner's policies and simulator (src/dlbench/planning/policies.py, simulator.py, metrics.py) on
two jobs and two device types, each answer worked out on paper beforehand:

    type fast: 1 device ($36/h), type slow: 1 device ($3.6/h); both jobs arrive at t = 0
    job a: 120 iterations, 2 it/s on fast, 1 it/s on slow  (60 s or 120 s)
    job b:  60 iterations, 3 it/s on fast, 1 it/s on slow  (20 s or 60 s)

Rounds of 10,000 s (longer than the trace) unless a test says otherwise; no restart cost unless so."""

import math
import random

import pytest

from dlbench.planning.cluster import Cluster, DeviceType
from dlbench.planning.metrics import jct_cdf, summarise, utilisation_over_time
from dlbench.planning.policies import LP_POLICIES, POLICIES, InfeasibleError, MaxMinFairness, MinMakespan, policy
from dlbench.planning.simulator import State, simulate

SPEED = [[2.0, 1.0], [3.0, 1.0]]
WORK = [120.0, 60.0]


def two_types(round_s=10_000.0, preemption_s=0.0, fast=1, slow=1) -> Cluster:
    return Cluster("hand", (DeviceType("fast", None, fast, 1, 36.0, None), DeviceType("slow", None, slow, 1, 3.6, None)),
                   None, preemption_s, round_s)


def run(name, cluster=None, seed=0, speed=SPEED, work=WORK, arrival=(0.0, 0.0), workers=(1, 1)):
    cluster = cluster or two_types()
    sim = simulate(cluster, ["a", "b"], list(arrival), list(workers), [1.0, 1.0], list(work), speed, policy(name), seed)
    return sim, summarise(sim, cluster, name)


def jcts(sim):
    return [o.jct_s for o in sim.outcomes]


def test_the_table_holds_every_policy_with_its_source():
    assert list(POLICIES) == ["fifo", "srtf", "las", "las_aware", "maxmin_agnostic", "gavel_maxmin", "gavel_makespan",
                              "framework_aware"]
    assert set(LP_POLICIES) == {"maxmin_agnostic", "gavel_maxmin", "gavel_makespan"}
    assert all(p.source and p.title for p in POLICIES.values())


@pytest.mark.parametrize("name", ["fifo", "las"])
@pytest.mark.parametrize("seed", range(6))
def test_agnostic_fifo_and_las_place_a_at_random_and_b_on_what_is_left(name, seed):
    """Both visit a first (same arrival and attained service: by index). a on fast: a 60 s, b on slow
    60 s; a on slow: a 120 s, b on fast 20 s. The seed decides, the same way every time."""
    sim, s = run(name, seed=seed)
    a_on_fast = random.Random(seed).randrange(2) == 0
    assert jcts(sim) == ([60.0, 60.0] if a_on_fast else [120.0, 20.0])
    assert s.average_jct_s == (60.0 if a_on_fast else 70.0) and s.makespan_s == (60.0 if a_on_fast else 120.0)
    again, _ = run(name, seed=seed)
    assert jcts(again) == jcts(sim)


def test_srtf_runs_the_shortest_predicted_job_on_the_fastest_type():
    """b's 20 s on fast is the shortest: b on fast, a on slow, 120 s (no round moves it)."""
    sim, s = run("srtf")
    assert jcts(sim) == [120.0, 20.0] and s.preemptions == 0


def test_a_round_moves_a_job_to_the_faster_type_and_it_pays_the_restart():
    """Rounds of 30 s, 5 s per restart: at t = 30 a (90 iterations left) moves to fast, now free:
    30 + 5 + 90 / 2 = 80 s."""
    sim, s = run("srtf", cluster=two_types(round_s=30.0, preemption_s=5.0))
    assert jcts(sim) == [pytest.approx(80.0), 20.0] and s.preemptions == 1
    assert sim.outcomes[0].seconds_on == {"slow": pytest.approx(30.0), "fast": pytest.approx(50.0)}


@pytest.mark.parametrize("name", ["las_aware", "framework_aware"])
def test_aware_las_places_the_first_job_on_its_fastest_type(name):
    """LAS order (a first), aware placement: a on fast (60 s), b on slow (60 s)."""
    sim, _ = run(name)
    assert jcts(sim) == [60.0, 60.0]


def test_the_metrics_of_srtf_worked_out_by_hand():
    """a: JCT 120, alone on the average device (1.5 it/s) 80 s, 1 job in the system: ρ 1.5;
    b: JCT 20, 30 s alone (2 it/s), 2 jobs: ρ 1/3. fast held 20 s of 120, slow 120 of 120.
    Cost used: 20 s at $36/h + 120 s at $3.6/h = $0.32; the cluster's: 120 s at $39.6/h."""
    sim, s = run("srtf")
    assert [o.isolated_s for o in sim.outcomes] == [80.0, 30.0] and [o.contention for o in sim.outcomes] == [1, 2]
    assert s.ftf_max == pytest.approx(1.5) and s.ftf_median == pytest.approx((1.5 + 1 / 3) / 2)
    assert s.utilisation == {"fast": pytest.approx(20 / 120), "slow": pytest.approx(1.0)}
    assert s.cost_used == pytest.approx(0.32) and s.cost_cluster == pytest.approx(39.6 * 120 / 3600)
    assert s.average_jct_s == 70.0 and s.p99_jct_s == pytest.approx(20 + 0.99 * 100)
    assert jct_cdf(sim) == [(20.0, 0.5), (120.0, 1.0)]
    held = utilisation_over_time(sim, two_types(), points=2)  # 0-60 s: both devices, 60-120 s: ... (20 s of fast)
    assert held == [(30.0, pytest.approx((20 + 60) / 120)), (90.0, pytest.approx(60 / 120))]


def state_of(speed=SPEED, work=WORK, capacity=(1, 1), workers=(1, 1)):
    st = State(["a", "b"], [0.0, 0.0], list(workers), [1.0, 1.0], list(work), speed, list(capacity), 0)
    st.active = [0, 1]
    return st


def test_gavel_max_min_fairness_lp_by_hand():
    """With 2 slow devices, an equal share (1/3 of the devices fast, 2/3 slow) gives a 4/3 it/s and b 5/3.
    Each job runs all the time (X[j][fast] + X[j][slow] = 1) and fast is shared: x of it to a, 1 - x to b.
    Then a: (2x + 1 - x) / (4/3) and b: (3 (1 - x) + x) / (5/3), equal where x = 7/13 (s = 15/13)."""
    x = MaxMinFairness().solve(state_of(capacity=(1, 2)), [0, 1])
    assert x[0] == pytest.approx([7 / 13, 6 / 13], abs=1e-6) and x[1] == pytest.approx([6 / 13, 7 / 13], abs=1e-6)


def test_gavel_min_makespan_lp_by_hand():
    """Maximise u = 1/M with a: 2 Xaf + Xas >= 120 u, b: 3 Xbf + Xbs >= 60 u, each job at most all the time
    and each device once: with a on fast for x of the time, a makes 1 + x it/s and b 3 - 2x; 120 / (1 + x)
    = 60 / (3 - 2x) at x = 1: a on fast, b on slow, both done at M = 60 s."""
    x = MinMakespan().solve(state_of(), [0, 1])
    assert x[0] == pytest.approx([1.0, 0.0], abs=1e-6) and x[1] == pytest.approx([0.0, 1.0], abs=1e-6)
    sim, s = run("gavel_makespan", cluster=two_types(round_s=5.0))
    assert s.makespan_s == pytest.approx(60.0) and jcts(sim) == [pytest.approx(60.0), pytest.approx(60.0)]


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_finishes_the_jobs_and_is_deterministic_per_seed(name):
    cluster = two_types(round_s=7.0, preemption_s=1.0)
    first, s = run(name, cluster=cluster, seed=3)
    again, _ = run(name, cluster=cluster, seed=3)
    assert s.finished == 2 and jcts(first) == jcts(again)
    assert all(o.jct_s >= min(WORK[j] / max(SPEED[j]) for j in range(2)) for o in first.outcomes)
    if name in LP_POLICIES:
        assert s.lp_solves >= 1 and s.lp_solve_mean_s > 0


def test_an_lp_with_no_feasible_allocation_is_one_clear_error():
    """b asks 2 workers; each type has 1 device: no allocation runs it."""
    with pytest.raises(InfeasibleError, match=r"no feasible allocation: job b \(2 workers\)"):
        MaxMinFairness().solve(state_of(workers=(1, 2)), [0, 1])
    with pytest.raises(InfeasibleError, match="job b"):
        run("fifo", workers=(1, 2))


def test_a_job_arriving_later_waits_for_free_devices_and_a_bounded_run_says_what_it_left():
    """One slow device: a (arrives at 0) runs 120 s, then b (arrives at 10) 60 s: JCT 120 and 170."""
    cluster = two_types(fast=0)
    sim, s = run("fifo", cluster=cluster, speed=[[0.0, 1.0], [0.0, 1.0]], arrival=(0.0, 10.0))
    assert jcts(sim) == [120.0, 170.0] and s.makespan_s == 180.0
    stopped = simulate(two_types(round_s=10.0, fast=0), ["a", "b"], [0.0, 10.0], [1, 1], [1.0, 1.0], list(WORK),
                       [[0.0, 1.0], [0.0, 1.0]], policy("fifo"), max_rounds=3)
    assert stopped.unfinished == 2 and "stopped after 3 rounds" in stopped.notes[0]
    assert all(math.isclose(o.seconds_on.get("slow", 0.0), 30.0) or o.seconds_on == {} for o in stopped.outcomes)


def test_las_lets_a_new_job_past_one_that_left_the_first_queue():
    """One slow device, rounds of 1000 s. a (20,000 s of work) has 4000 device-seconds at t = 4000, past
    the first threshold (1 device-hour), when b (100 s) arrives: b runs at once and a waits 100 s.
    FIFO runs a to the end first: b waits until 20,000 s."""
    cluster = two_types(round_s=1000.0, fast=0)
    kw = dict(cluster=cluster, speed=[[0.0, 1.0], [0.0, 1.0]], work=[20000.0, 100.0], arrival=(0.0, 4000.0))
    las, _ = run("las", **kw)
    assert jcts(las) == [pytest.approx(20100.0), pytest.approx(100.0)]
    fifo, _ = run("fifo", **kw)
    assert jcts(fifo) == [pytest.approx(20000.0), pytest.approx(16100.0)]


def test_a_bounded_run_counts_utilisation_over_the_time_it_simulated():
    """Rounds of 10 s, stopped after 3: a (120 s) is still running on the one slow device, b waits.
    The slow device was held all 30 s simulated: utilisation 1, not 30 s over a makespan of nothing."""
    cluster = two_types(round_s=10.0, fast=0)
    sim = simulate(cluster, ["a", "b"], [0.0, 0.0], [1, 1], [1.0, 1.0], list(WORK), [[0.0, 1.0], [0.0, 1.0]],
                   policy("fifo"), max_rounds=3)
    s = summarise(sim, cluster, "fifo")
    assert s.finished == 0 and s.makespan_s is None and s.utilisation["slow"] == pytest.approx(1.0)
    assert s.cost_cluster == pytest.approx(3.6 * 30 / 3600)


def test_a_steady_state_window_reports_its_jobs_and_stops_when_they_are_done():
    """One slow device, FIFO, a (120 s) at 0 and b (60 s) at 10, measuring b only (Gavel's jobs 4000-5000
    in small): b runs 120 to 180, JCT 170, and the simulation stops there. Measuring a only, it stops at
    120 with b not started: not counted as unfinished, said in the notes, the bill over the 120 s."""
    cluster = two_types(fast=0)
    kw = dict(arrival=[0.0, 10.0], workers=[1, 1], weight=[1.0, 1.0], iterations=list(WORK),
              speed=[[0.0, 1.0], [0.0, 1.0]])
    only_b = simulate(cluster, ["a", "b"], policy=policy("fifo"), measured=[1], **kw)
    s = summarise(only_b, cluster, "fifo")
    assert (s.jobs, s.finished, s.average_jct_s, s.measured) == (1, 1, 170.0, "jobs 1-1 of the trace")
    only_a = simulate(cluster, ["a", "b"], policy=policy("fifo"), measured=[0], **kw)
    s = summarise(only_a, cluster, "fifo")
    assert (s.jobs, s.average_jct_s, only_a.unfinished) == (1, 120.0, 0)
    assert only_a.outcomes[1].finish_s is None and "stopped when the 1 measured jobs were done" in only_a.notes[0]
    assert s.cost_cluster == pytest.approx(3.6 * 120 / 3600) and s.utilisation["slow"] == pytest.approx(1.0)


def test_jobs_are_placed_on_nodes_best_fit_and_a_fragmented_job_runs_spread():
    """One type of 2 nodes x 2 devices, FIFO, every job at t = 0 and 1 it/s packed: a (1 worker, 100 it)
    and b (1 worker, 1000 it) fill node 0 (best fit: the fullest node with room), c (1 worker, 1000 it)
    takes node 1, d (2 workers, 100 it) waits. At 100 a ends: 2 devices free, one on each node, so d
    starts spread, at its spread 0.5 it/s: done at 300, JCT 300; 200 s x 2 devices of 2,500
    device-seconds held were spread (0.16). With no spread throughput (no network) d waits for a node:
    b and c end at 1000, d runs packed to 1100."""
    cluster = Cluster("nodes", (DeviceType("gpu", None, 2, 2, 1.0, None),), None, 0.0, 10_000.0)
    kw = dict(arrival=[0.0] * 4, workers=[1, 1, 1, 2], weight=[1.0] * 4, iterations=[100.0, 1000.0, 1000.0, 100.0],
              speed=[[1.0]] * 4)
    sim = simulate(cluster, list("abcd"), policy=policy("fifo"), spread=[[1.0], [1.0], [1.0], [0.5]], **kw)
    s = summarise(sim, cluster, "fifo")
    assert jcts(sim) == [100.0, 1000.0, 1000.0, 300.0]
    assert (s.spread_starts, sim.outcomes[3].spread_starts) == (1, 1) and s.spread_share == pytest.approx(400 / 2500)
    waits = simulate(cluster, list("abcd"), policy=policy("fifo"), spread=[[1.0], [1.0], [1.0], [0.0]], **kw)
    assert jcts(waits) == [100.0, 1000.0, 1000.0, 1100.0]
    assert summarise(waits, cluster, "fifo").spread_starts == 0
