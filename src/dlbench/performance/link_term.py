"""The communication term on a shaped link (issue 44), checked against what the link's runs measured.

A data-parallel training run on a shaped link (`dlbench run --link`) records the link as measured
before its jobs (record.link.measured: one TCP stream's bandwidth, the median one-byte round trip)
and its method's analytical bytes (record.distributed.exchange: communication.exchange_bytes). The
term is the α–β time of that exchange on the longest path (communication.exchange_time) with the
link's own figures: α = half the measured round trip (one message's start-up, one way), β = 8 /
the measured bandwidth in bit/s (seconds per byte).

What the link does not set is taken from the same job on loopback, where the wire is nearly free:
its measured median iteration holds the computation, the method's compression and decompression,
and the collective's own CPU work (gloo's copies and reductions, which on a small CPU machine cost
more than loopback's wire). The prediction for a run on the link is that loopback iteration plus
the link's term, with nothing hidden behind the backward:

    predicted = t_loopback(method) + exchange_time(method).time(α, β)

and a second form, overlapped, where the loopback run also measured its step without the exchange
(distributed.local_median_s, `local`): the collective's CPU work on loopback (t_loopback − local,
compression included) and the wire's time overlap (gloo's ring moves its buffer in chunks, a
rank reducing one while the next is on the wire), so the slower of the two sets the pace:

    overlapped = local + max(t_loopback − local, wire)  =  max(t_loopback, local + wire)

The loopback run is the nearest in time of the same machine, benchmark, framework, batch,
precision, workers, threads per worker and compression; a link run without one is not scored and
says so. So the model is on trial for what the link adds, not for the computation
(`predict --accuracy` scores the compute model on the timed suites).

Crossover bandwidth: below it a method's iteration is shorter than dense's. Predicted by
communication.crossover_bandwidth with the method's extra cost the difference of the two
loopback iterations (what compressing, selecting and decompressing cost beyond what dense's
collective costs there) and α from the link runs' round trips (the additive form); in the
overlapped form, the bandwidth where the two overlapped predictions meet (found by bisection on
a log scale of the bandwidth); measured from the link runs of
both at several rates: the difference dense − method of their iterations at each link's measured
bandwidth, its zero interpolated between the two rates around it linearly in 1 / bandwidth (the
α–β form, in which that difference is a line: saved bytes × β less the extra cost).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .communication import ExchangeBytes, crossover_bandwidth, exchange_time


@dataclass(frozen=True)
class LinkTermCheck:
    """One training run on a shaped link: the term's prediction against its measured iteration."""

    run_id: str
    benchmark: str  # without the link (fcn5-train-w2)
    framework: str
    workers: int
    compression: str
    link: str  # as asked
    bandwidth_bps: float  # measured
    rtt_s: float  # measured
    measured_s: float  # median iteration, slowest rank
    loopback_run_id: str | None
    loopback_s: float | None  # the same job's median iteration on loopback
    wire_s: float | None  # the link's term: exchange_time(method).time(α, β)
    predicted_s: float | None  # loopback + wire
    overlapped_s: float | None = None  # max(loopback, local + wire); None: the loopback run has no local step
    reason: str | None = None  # why not predicted

    @property
    def error(self) -> float | None:
        return self.predicted_s / self.measured_s - 1 if self.predicted_s is not None else None

    @property
    def overlapped_error(self) -> float | None:
        return self.overlapped_s / self.measured_s - 1 if self.overlapped_s is not None else None

    def to_dict(self) -> dict:
        return {**self.__dict__, "error": self.error, "overlapped_error": self.overlapped_error}


@dataclass(frozen=True)
class Crossover:
    """The bandwidth below which `compression` beats dense, predicted and measured (bit/s)."""

    benchmark: str
    framework: str
    workers: int
    compression: str
    extra_s: float | None  # the method's loopback iteration less dense's
    predicted_bps: float | None  # additive form; None: never beats dense; inf: always
    overlapped_bps: float | None  # overlapped form; None: not bracketed in 1 kbit/s .. 10 Tbit/s, or no local step
    measured_bps: float | None  # None: not bracketed by the rates measured (see measured_side)
    measured_side: str  # "between" | "above" (beats dense at every rate measured) | "below" (at none)
    speedups: list[tuple[str, float, float]]  # (link asked, measured bit/s, dense / method) per rate
    times: list[tuple[float, float]]  # (dense, method) median iterations per rate, in the order of speedups

    def to_dict(self) -> dict:
        return {**self.__dict__, "speedups": [list(s) for s in self.speedups], "times": [list(t) for t in self.times]}


def _key(r) -> tuple:
    """What a link run and its loopback run share: all but the link (and the compression, added)."""
    d = r.distributed
    return (str(r.machine.get("machine_id")), r.benchmark.split("@", 1)[0], str(r.framework.get("name")),
            r.workload.batch_size, r.workload.precision, d.workers, d.threads_per_worker)


def _exchange(r) -> ExchangeBytes:
    """The run's analytical exchange (its record's distributed.exchange) among its workers."""
    info = r.distributed.exchange
    return ExchangeBytes(info.method, r.distributed.workers, info.payload_bytes, info.bytes_per_rank, info.total_bytes,
                         info.rounds, info.formula)


def _trainable(r) -> bool:
    return (r.status == "ok" and r.summary is not None and r.distributed is not None and r.comm is None
            and r.distributed.workers > 1 and r.distributed.exchange is not None and r.workload.mode == "train")


def _term(r) -> float:
    """The link's α–β time of the run's exchange, from its measured link."""
    m = r.link.measured
    return exchange_time(_exchange(r)).time(m.rtt_s / 2, 8 / m.bandwidth_bps)


def link_term_checks(records) -> tuple[list[LinkTermCheck], list[Crossover]]:
    """Every completed training run on a measured shaped link, predicted from its loopback run and
    its link; and per (benchmark, framework, workers, method other than none) with link runs of it
    and of dense at the same rates, the predicted and the measured crossover."""
    runs = [r for r in records if _trainable(r)]
    loopback: dict[tuple, list] = {}
    for r in runs:
        if r.link is None:
            loopback.setdefault((*_key(r), r.workload.compression), []).append(r)
    checks, linked = [], []
    for r in runs:
        if r.link is None:
            continue
        m = r.link.measured
        base = dict(run_id=r.run_id, benchmark=r.benchmark.split("@", 1)[0], framework=str(r.framework.get("name")),
                    workers=r.distributed.workers, compression=str(r.workload.compression), link=r.link.asked,
                    bandwidth_bps=m.bandwidth_bps if m else math.nan, rtt_s=m.rtt_s if m else math.nan,
                    measured_s=r.summary.median_s)
        if m is None or m.bandwidth_bps <= 0:
            checks.append(LinkTermCheck(**base, loopback_run_id=None, loopback_s=None, wire_s=None, predicted_s=None,
                                        reason="the link was not measured"))
            continue
        refs = loopback.get((*_key(r), r.workload.compression), [])
        wire = _term(r)
        if not refs:
            checks.append(LinkTermCheck(**base, loopback_run_id=None, loopback_s=None, wire_s=wire, predicted_s=None,
                                        reason="no loopback run of this job"))
            continue
        ref = min(refs, key=lambda x: abs((x.started_at - r.started_at).total_seconds()))
        checks.append(LinkTermCheck(**base, loopback_run_id=ref.run_id, loopback_s=ref.summary.median_s, wire_s=wire,
                                    predicted_s=ref.summary.median_s + wire, overlapped_s=_overlapped(ref, wire)))
        linked.append(r)
    return checks, _crossovers(linked, loopback)


def _crossovers(linked: list, loopback: dict) -> list[Crossover]:
    by_job: dict[tuple, dict[str, dict[str, object]]] = {}
    for r in linked:  # the latest run of each method on each link asked
        methods = by_job.setdefault(_key(r), {})
        latest = methods.setdefault(str(r.workload.compression), {})
        if r.link.asked not in latest or latest[r.link.asked].started_at < r.started_at:
            latest[r.link.asked] = r
    out = []
    for key, methods in by_job.items():
        dense = methods.get("none")
        dense_refs = loopback.get((*key, "none"), [])
        if dense is None or not dense_refs:
            continue
        for method, on_links in sorted(methods.items()):
            refs = loopback.get((*key, method), [])
            if method == "none" or not refs:
                continue
            ref = max(refs, key=lambda x: x.started_at)
            dense_ref = min(dense_refs, key=lambda x: abs((x.started_at - ref.started_at).total_seconds()))
            extra = ref.summary.median_s - dense_ref.summary.median_s
            some = next(iter(on_links.values()))
            rtts = [r.link.measured.rtt_s for r in [*on_links.values(), *dense.values()]]
            predicted = crossover_bandwidth(_exchange(ref), _exchange(dense_ref),
                                            statistics.median(rtts) / 2, extra)
            rates = sorted(
                ((asked, statistics.mean([r.link.measured.bandwidth_bps, dense[asked].link.measured.bandwidth_bps]),
                  dense[asked].summary.median_s, r.summary.median_s)
                 for asked, r in on_links.items() if asked in dense), key=lambda s: s[1])
            if not rates:
                continue
            measured, side = _crossing([(bps, d - m) for _, bps, d, m in rates])
            alpha = statistics.median(rtts) / 2
            out.append(Crossover(benchmark=key[1], framework=key[2], workers=some.distributed.workers,
                                 compression=method, extra_s=extra,
                                 predicted_bps=None if predicted is None else predicted * 8,
                                 overlapped_bps=_overlapped_crossing(ref, dense_ref, alpha),
                                 measured_bps=measured, measured_side=side,
                                 speedups=[(asked, bps, d / m) for asked, bps, d, m in rates],
                                 times=[(d, m) for _, _, d, m in rates]))
    return out


def _overlapped(ref, wire_s: float) -> float | None:
    """max(t_loopback, local + wire) of a loopback run that measured its step without the exchange."""
    local = ref.distributed.local_median_s
    return max(ref.summary.median_s, local + wire_s) if local is not None else None


def _overlapped_crossing(method_ref, dense_ref, alpha_s: float) -> float | None:
    """The bandwidth (bit/s) where the overlapped predictions of the method and of dense meet, the
    method ahead below it: bisection of dense − method on log bandwidth over 1 kbit/s .. 10 Tbit/s;
    None where one run has no local step or the difference does not change sign over that range."""
    def saved(bps: float) -> float:
        wire = [exchange_time(_exchange(r)).time(alpha_s, 8 / bps) for r in (dense_ref, method_ref)]
        d, m = _overlapped(dense_ref, wire[0]), _overlapped(method_ref, wire[1])
        return d - m

    if dense_ref.distributed.local_median_s is None or method_ref.distributed.local_median_s is None:
        return None
    low, high = math.log(1e3), math.log(1e13)
    if not saved(math.exp(low)) > 0 >= saved(math.exp(high)):
        return None
    for _ in range(100):
        mid = (low + high) / 2
        if saved(math.exp(mid)) > 0:
            low = mid
        else:
            high = mid
    return math.exp((low + high) / 2)


def _crossing(saved: list[tuple[float, float]]) -> tuple[float | None, str]:
    """Where the time the method saves, dense − method, falls through 0 going up in bandwidth
    (`saved`: (bit/s, seconds) by bandwidth): the first neighbouring pair with the method ahead at the
    slower and not at the faster, interpolated linearly in 1 / bandwidth. (None, "above") where the
    method is ahead at every rate (the crossover lies above the fastest), (None, "below") where at
    none, (None, "not monotonic") where it falls behind and then ahead again going up."""
    for (b0, s0), (b1, s1) in zip(saved, saved[1:]):
        if s0 > 0 >= s1:
            x0, x1 = 1 / b0, 1 / b1
            return 1 / (x1 + (x0 - x1) * (0 - s1) / (s0 - s1)), "between"
    if all(s > 0 for _, s in saved):
        return None, "above"
    if all(s <= 0 for _, s in saved):
        return None, "below"
    return None, "not monotonic"
