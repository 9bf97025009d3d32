"""The compression runs of a store, side by side with the dense run of the same invocation, and the
link bandwidth below which each method is predicted to beat dense (no framework needed).

Per (framework, network, workers, batch): each method's median iteration (slowest rank, over its
ok repeats), its speedup over the dense run, its analytical bytes per rank and on the longest path
(performance/communication.py), and the crossover bandwidth `crossover_bandwidth` predicts for a
link of start-up --alpha-us, taking the method's extra compute as its measured iteration minus
dense's on the store's own link (loopback here). That difference also holds the two exchanges'
cost on that link, of which dense's is the larger, so it overstates the extra work and the
crossover printed is a lower bound of the one the model would give with the extra work measured
alone. On a shaped link (`--link`) the difference also holds the link's transfers, so
the crossover column means nothing there: use it on loopback stores only.
Usage: .venv/bin/python benchmarks/compression_crossover.py STORE [--alpha-us 50]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from dlbench.axes import Compression
from dlbench.definitions.weights import is_state, weight_shapes
from dlbench.performance.communication import crossover_bandwidth, exchange_bytes, exchange_time
from dlbench.store.store import Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store", type=Path)
    parser.add_argument("--alpha-us", type=float, default=50.0, help="the link's start-up per message, µs")
    args = parser.parse_args()
    records = [r for r in Store(args.store).records() if r.distributed and r.workload.compression
               and r.distributed.workers > 1]
    groups: dict[tuple, dict[str, object]] = {}
    for r in records:
        key = (r.framework.get("name"), r.benchmark, r.distributed.workers, r.workload.batch_size)
        groups.setdefault(key, {})[r.workload.compression] = r
    print("| framework | network | workers | method | status | ms/iter | × dense | MB/iter/rank | MB on longest path "
          f"| crossover below (α = {args.alpha_us:g} µs) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (framework, benchmark, workers, _), by in sorted(groups.items()):
        dense = by.get("none")
        dense_s = _median(dense)
        for method, r in sorted(by.items(), key=lambda kv: (kv[0] != "none", kv[0])):
            median = _median(r)
            shapes = [s for n, s in weight_shapes(r.network.definition).items() if not is_state(n)]
            counted = exchange_bytes(Compression.parse(method, who="store"), shapes, workers)
            speedup = crossover = ""
            if median and dense_s and method != "none":
                speedup = f"{dense_s / median:.2f}"
                dense_counted = exchange_bytes(Compression.parse("none", who="store"), shapes, workers)
                bandwidth = crossover_bandwidth(counted, dense_counted, args.alpha_us * 1e-6, median - dense_s)
                crossover = ("never" if bandwidth is None else "any" if bandwidth == float("inf")
                             else f"{bandwidth * 8 / 1e9:.3g} Gbit/s")
            status = r.status if r.status == "ok" else f"{r.status}: {r.reason}"
            print(f"| {framework} | {benchmark} | {workers} | {method} | {status} | "
                  f"{median * 1e3:.0f} | {speedup} | {counted.per_rank / 1e6:.3g} | "
                  f"{exchange_time(counted).bytes / 1e6:.3g} | {crossover} |" if median else
                  f"| {framework} | {benchmark} | {workers} | {method} | {status} | | | "
                  f"{counted.per_rank / 1e6:.3g} | {exchange_time(counted).bytes / 1e6:.3g} | |")


def _median(r) -> float | None:
    if r is None or r.status != "ok":
        return None
    times = [t for rep in r.repeats if rep.status == "ok" for t in rep.iter_s]
    return statistics.median(times) if times else None


if __name__ == "__main__":
    main()
