"""What does LoadGen's harness cost a query? SingleStream over a null model against a bare loop.

The system under test is dlbench's own (runners/common/loadgen_harness.py: LoadGenRun, the SUT and
QSL every runner serves LoadGen through) over a Prepared whose infer(n) returns at once (a null
model): whatever latency LoadGen measures is LoadGen's issue path, the Python callback, the
harness's padding and QuerySamplesComplete. Against it, a bare Python loop calling the same
infer(1) and synchronize() between two perf_counter_ns reads. Rounds alternate (LoadGen, loop), so
machine drift hits both; per round the figures are LoadGen's mean and median (50th percentile)
latency from its detail log and the loop's mean and median per call, and their difference is the
overhead per query in microseconds. LoadGen's latency runs from a query's issue to its completion;
what a query costs end to end, LoadGen's own scheduling between queries included, is 1 / its QPS
(`result_qps_with_loadgen_overhead`), set against the loop's elapsed time per call. Needs mlperf_loadgen in this interpreter (the controller's test
extra installs it, as every runner environment does).

    .venv/bin/python benchmarks/loadgen_overhead.py [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the folder holding the runners package

from runners.common import loadgen_harness  # noqa: E402
from runners.common.contract import Prepared  # noqa: E402


def null_model() -> Prepared:
    def nothing(*_):
        return None

    return Prepared(nothing, nothing, 0, (), {}, infer=nothing)


def loadgen_round(lg, seconds: float, folder: str) -> dict:
    policy = {"batch_sizes": [1], "min_duration_s": seconds, "max_duration_s": seconds * 4, "min_query_count": 1024,
              "sample_count": 1024, "seed": 0, "samples_per_query": 1}
    run = loadgen_harness.LoadGenRun(lg, null_model(), policy)
    run.run("single_stream", folder, None, {"latency_s": 10e-6})
    detail = loadgen_harness.read_detail_log(f"{folder}/mlperf_log_detail.txt")
    return {"mean_us": detail["result_mean_latency_ns"] / 1e3, "p50_us": detail["result_50.00_percentile_latency_ns"] / 1e3,
            "p90_us": detail["result_90.00_percentile_latency_ns"] / 1e3, "queries": detail["result_query_count"],
            "validity": detail["result_validity"], "per_query_us": 1e6 / detail["result_qps_with_loadgen_overhead"]}


def loop_round(seconds: float) -> dict:
    prepared = null_model()
    infer, sync, clock = prepared.infer, prepared.synchronize, time.perf_counter_ns
    times = []
    start = clock()
    end = start + int(seconds * 1e9)
    while True:
        t0 = clock()
        infer(1)
        sync()
        t1 = clock()
        times.append(t1 - t0)
        if t1 >= end:
            break
    elapsed = clock() - start
    times.sort()
    return {"per_query_us": elapsed / len(times) / 1e3, "mean_us": statistics.fmean(times) / 1e3, "p50_us": times[len(times) // 2] / 1e3,
            "p90_us": times[int(len(times) * 0.9)] / 1e3, "queries": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="LoadGen's minimum duration and the loop's time per round")
    args = ap.parse_args()
    import mlperf_loadgen as lg

    print(f"{'round':>5} {'LoadGen mean':>13} {'p50':>8} {'p90':>8} {'1/QPS':>8} {'queries':>8} {'loop mean':>10} "
          f"{'p50':>8} {'per call':>9} {'overhead mean':>14} {'p50':>8} {'1/QPS':>8}  (microseconds)")
    over_mean, over_p50, over_query = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            g = loadgen_round(lg, args.seconds, f"{tmp}/round{i}")
            b = loop_round(args.seconds)
            over_mean.append(g["mean_us"] - b["mean_us"])
            over_p50.append(g["p50_us"] - b["p50_us"])
            over_query.append(g["per_query_us"] - b["per_query_us"])
            print(f"{i + 1:>5} {g['mean_us']:>13.2f} {g['p50_us']:>8.2f} {g['p90_us']:>8.2f} {g['per_query_us']:>8.2f} "
                  f"{g['queries']:>8} {b['mean_us']:>10.3f} {b['p50_us']:>8.3f} {b['per_query_us']:>9.3f} "
                  f"{over_mean[-1]:>14.2f} {over_p50[-1]:>8.2f} {over_query[-1]:>8.2f}  [{g['validity']}]")
    print(f"LoadGen SingleStream overhead per query over a bare loop: median of {args.rounds} rounds "
          f"{statistics.median(over_mean):.1f} us (mean latency; rounds {min(over_mean):.1f}-{max(over_mean):.1f}), "
          f"{statistics.median(over_p50):.1f} us (median latency; rounds {min(over_p50):.1f}-{max(over_p50):.1f}), "
          f"{statistics.median(over_query):.1f} us (per query end to end, 1/QPS; rounds "
          f"{min(over_query):.1f}-{max(over_query):.1f})")


if __name__ == "__main__":
    main()
