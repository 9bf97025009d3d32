"""Figures of multi-worker jobs, from the ranks' own timings.

Data-parallel training
- An iteration is over when its slowest rank is done (the next one cannot start before the
  gradient exchange, which needs every rank), so the job's per-iteration time is the maximum over
  the ranks of that iteration's time; rank 0's own times are kept beside it.
- Global throughput = global batch / median of those per-iteration maxima.
- Scaling efficiency = throughput with N workers / (N x throughput of one worker), where the one
  worker trains the same global batch (strong scaling) or the same batch per worker (weak
  scaling) with the same threads per worker. 1 is perfect scaling.
- Exposed communication = (slowest rank's median step) - (slowest rank's median step without the
  gradient exchange): the share of the exchange that the backward pass did not hide. Both sides
  are per-rank medians, because steps without an exchange do not keep the ranks in step.

Collectives (nccl-tests' definitions, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)
- time: per iteration the slowest rank's, then the median over the measured iterations of every
  repeat (a collective has completed when its last rank has its result);
- algorithm bandwidth = size / time, size being the largest buffer (distributed.py);
- bus bandwidth = algorithm bandwidth x factor: all-reduce 2(n-1)/n, all-gather,
  reduce-scatter and all-to-all (n-1)/n, broadcast 1 (all-to-all: each rank keeps 1/n of its
  buffer and sends the other (n-1)/n, one block to each peer). It is the rate each rank's busiest
  link carries with an optimal algorithm, so it can be compared with the hardware's link bandwidth
  whatever n is.
"""

from __future__ import annotations

import statistics
from typing import Sequence


def bus_factor(collective: str, workers: int) -> float:
    n = workers
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def slowest_rank(series: Sequence[Sequence[float]]) -> list[float]:
    """Per iteration, the maximum over ranks. Every rank ran the same number of iterations."""
    if not series:
        return []
    lengths = {len(s) for s in series}
    if len(lengths) != 1:
        raise ValueError(f"ranks ran different numbers of iterations: {sorted(lengths)}")
    return [max(values) for values in zip(*series)]


def scaling_efficiency(throughput: float, workers: int, baseline_throughput: float) -> float:
    return throughput / (workers * baseline_throughput)


def exposed_communication_s(synced: Sequence[Sequence[float]], local: Sequence[Sequence[float]]) -> float:
    """Slowest rank's median step minus slowest rank's median step without the gradient exchange."""
    return max(statistics.median(s) for s in synced) - max(statistics.median(s) for s in local)


def bandwidths(size_bytes: int, time_s: float, collective: str, workers: int) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in bytes per second."""
    algorithm = size_bytes / time_s
    return algorithm, algorithm * bus_factor(collective, workers)
