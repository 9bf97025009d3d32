"""CPU time of the simulator alone (planning/simulator.py): 10,000 jobs on the scale benchmark's 2,048
devices (5 types, 8 per node), with synthetic throughputs of the matrix's shape (not its numbers;
spread over nodes 0.7 of packed), Philly's workers per job and lengths: what placing jobs on nodes
costs, without the matrix's minute of building.

Usage: .venv/bin/python benchmarks/planner_simulate_cpu.py
"""

import os
import random
import time

from dlbench.planning.cluster import Cluster, DeviceType, LinkSpec
from dlbench.planning.simulator import simulate
from dlbench.planning.policies import policy
rng = random.Random(0)
types = (DeviceType("h100", None, 64, 8, 3.0, None), DeviceType("h200", None, 64, 8, 3.8, None),
         DeviceType("a100", None, 64, 8, 1.8, None), DeviceType("l4", None, 32, 8, 0.8, None),
         DeviceType("mi300x", None, 32, 8, 3.5, None))
cluster = Cluster("scale", types, LinkSpec(alpha_us=10, gb_per_s=25), 30.0, 360.0)
n = 10_000
workers = [1 if r < 0.7 else 2 if r < 0.8 else 4 if r < 0.95 else 8 for r in (rng.random() for _ in range(n))]
speed = [[rng.uniform(0.5, 2.0) * f for f in (1.0, 1.1, 0.6, 0.2, 0.9)] for _ in range(n)]
spread = [[s * (0.7 if w > 1 else 1.0) for s in row] for row, w in zip(speed, workers)]
secs = [60 * 10 ** rng.uniform(1.5, 3.5) for _ in range(n)]
iters = [s * row[0] for s, row in zip(secs, speed)]
rate = 0.8 * 1229 / (1.9 * 1000 * 60)
t, arrival = 0.0, []
for _ in range(n):
    arrival.append(t); t += rng.expovariate(rate)
for name in ("fifo", "las_aware"):
    cpu = time.process_time()
    sim = simulate(cluster, [str(i) for i in range(n)], arrival, workers, [1.0] * n, iters, speed, policy(name),
                   spread=spread)
    print(name, f"CPU {time.process_time() - cpu:.1f} s", "done", n - sim.unfinished,
          "spread starts", sum(o.spread_starts for o in sim.outcomes), "load", os.getloadavg()[0])
