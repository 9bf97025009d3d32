"""The worker side of a LoadGen run (request action `loadgen`): MLPerf's LoadGen drives the runner.

Standard library and `mlperf_loadgen` (the `mlcommons-loadgen` package every runner environment
installs) only; the framework is reached through the runner's Prepared, whose `infer(n)` runs the
forward pass on the first n samples of its prepared synthetic batch and `synchronize()` waits for it.

The runner process is LoadGen's system under test (SUT) and its query sample library (QSL). The QSL
is the runner's synthetic samples: they are random and alike, so a query of n samples runs n rows of
the prepared batch whatever their indices (the samples are already on the device: load and unload
have nothing to move). LoadGen issues the queries on its own schedule, keeps the clock and writes
its summary and detail logs into the request's log folder; the controller parses those logs for the
record (src/dlbench/store/loadgen.py). What this module decides is how queries become batches:

- single_stream: one sample per query, run at once (batch 1);
- multi_stream: `samples_per_query` (8) per query, run as one batch;
- offline: every sample in one query, run in batches of `max_batch`;
- server: queries arrive on LoadGen's Poisson schedule; a batcher thread takes the first waiting
  sample, gathers more until `max_batch` or until `batch_timeout_ms` after that first one, runs them
  as one batch and completes them.

A batch of n samples is padded to the smallest of the policy's `batch_sizes` that holds it (frameworks
that compile per shape then compile only those), and every size is run once untimed and then timed
until its latency settles (at least `warmup_queries` calls) before LoadGen starts, so compilation and
a framework's slow first calls stay out of LoadGen's clock. The
fastest timed call gives LoadGen the expectations it plans a test with (single/multi-stream expected
latency, offline expected QPS, the server search's first rate).

The server scenario's figure is the highest Poisson rate whose 99th-percentile latency meets the bound
(`server_target_latency_ms`). It is found by a bounded search of LoadGen runs: from the capacity the
warm-up measured (max_batch / its latency), a rate is tried, halved while it misses the bound, then
bisected between the highest that met it and the lowest that missed, `server_search_steps` LoadGen
runs in all; "met" is LoadGen's own `result_perf_constraints_met`. The result is the LoadGen run at
the highest rate that met the bound (LoadGen's VALID or INVALID verdict on it, early stopping
included), every run of the search kept with its logs.

Generation (mode `generate`, decoder networks) runs the server scenario only, with LoadGen's token
latencies (`use_token_latencies`): each query is one request, the runner's Generator (prepared at
batch 1) prefills the prompt and decodes `new_tokens - 1` more, greedily. The serving policy is the
simplest a server can have: one thread takes the queued requests first come first served and runs
them one at a time to their end (no batching across requests, continuous or static). When the
prefill's token is on the host side of a synchronisation the SUT calls `FirstTokenComplete` (LoadGen's
time to first token, TTFT, queueing included), and after the last decode `QuerySamplesComplete`
with the request's token count (LoadGen's time per output token, TPOT: the rest of the request over
the tokens after the first). LoadGen judges the run against the profile's TTFT and TPOT bounds
(`server_ttft_ms`, `server_tpot_ms`, at the 99th percentile, as MLPerf states its LLM targets; with
token latencies LoadGen does not apply the per-query `server_target_latency_ms`), and the same
bounded search finds the highest Poisson rate that meets both, from the rate one request at a time
can sustain (1 / the warm-up's fastest request).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import threading
import time

SCENARIOS = {"single_stream": "SingleStream", "multi_stream": "MultiStream", "offline": "Offline",
             "server": "Server"}
MLLOG = ":::MLLOG "


def padded_size(n: int, sizes: list[int]) -> int:
    """The smallest allowed batch size that holds n samples (sizes ascending; n <= the largest)."""
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"a batch of {n} samples exceeds the largest batch size {sizes[-1]}")


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def read_detail_log(path: str) -> dict:
    """key -> value of LoadGen's detail log (its `:::MLLOG {json}` lines; a repeated key keeps the last)."""
    out: dict = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(MLLOG):
                try:
                    entry = json.loads(line[len(MLLOG):])
                except ValueError:
                    continue
                out[entry.get("key")] = entry.get("value")
    return out


def warm_up(prepared, sizes: list[int], times: int, clock=time.perf_counter, max_s: float = 5.0) -> dict[int, dict]:
    """Each batch size run once untimed (compilation, allocation), then timed until it settles: at
    least `times` calls, until the median of the last `times` is within 10% of the `times` before
    (a fixed few calls misled LoadGen here: MXNet's alexnet_r took a median 144 ms over three
    warm-up calls, then 0.2 ms at LoadGen's median), or for `max_s` seconds. Per size the
    median and the fastest of the last `times` calls, in seconds."""
    out = {}
    for size in sizes:
        def call(size=size):
            prepared.infer(size)
            prepared.synchronize()
        out[size] = settle(call, times, clock, max_s)
    return out


def settle(call, times: int, clock=time.perf_counter, max_s: float = 5.0) -> dict:
    """`call()` once untimed, then timed until its time settles (warm_up's rule); the median and the
    fastest of the last `times` calls, in seconds, and how many calls it took."""
    window = max(times, 1)
    call()
    taken = []
    started = clock()
    while True:
        t0 = clock()
        call()
        taken.append(clock() - t0)
        if len(taken) >= 2 * window:
            before, latest = statistics.median(taken[-2 * window:-window]), statistics.median(taken[-window:])
            if abs(latest - before) <= 0.1 * before:
                break
        if clock() - started >= max_s and len(taken) >= window:
            break
    last = taken[-window:]
    return {"median_s": statistics.median(last), "min_s": min(last), "calls": len(taken) + 1}


class Batcher:
    """The server scenario's batching: samples queue up as LoadGen issues them; one thread runs them
    in batches of at most `max_batch`, waiting at most `timeout_s` after a batch's first sample for
    more to join it."""

    def __init__(self, run_batch, max_batch: int, timeout_s: float):
        self.run_batch, self.max_batch, self.timeout_s = run_batch, max_batch, timeout_s
        self.waiting: queue.Queue = queue.Queue()
        self.batches = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="dlbench-batcher", daemon=True)
        self.thread.start()

    def submit(self, samples) -> None:
        for s in samples:
            self.waiting.put(s)

    def close(self) -> None:
        self.waiting.put(None)
        self.thread.join()

    def _loop(self) -> None:
        while True:
            first = self.waiting.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.timeout_s
            closing = False
            while len(batch) < self.max_batch:
                left = deadline - time.perf_counter()
                try:
                    nxt = self.waiting.get(timeout=left) if left > 0 else self.waiting.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    closing = True
                    break
                batch.append(nxt)
            try:
                self.run_batch(batch)
                self.batches += 1
            except BaseException as e:  # noqa: BLE001 - kept and raised in the worker's thread
                self.error = self.error or e
            if closing:
                return


class LoadGenRun:
    """One LoadGen test of one scenario over a prepared network (a SUT and a QSL, built and destroyed)."""

    def __init__(self, lg, prepared, policy: dict):
        self.lg, self.prepared, self.policy = lg, prepared, policy
        self.sizes = sorted(policy["batch_sizes"])
        self.batches = 0

    def _run_and_complete(self, samples) -> None:
        lg = self.lg
        self.prepared.infer(padded_size(len(samples), self.sizes))
        self.prepared.synchronize()
        self.batches += 1
        # performance mode: LoadGen needs each sample's completion, not its output
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0) for s in samples])

    def settings(self, scenario: str, target_qps: float | None, expected: dict) -> object:
        lg, p = self.lg, self.policy
        ts = lg.TestSettings()
        ts.scenario = getattr(lg.TestScenario, SCENARIOS[scenario])
        ts.mode = lg.TestMode.PerformanceOnly
        ts.min_duration_ms = int(p["min_duration_s"] * 1000)
        ts.max_duration_ms = int(p["max_duration_s"] * 1000)
        ts.min_query_count = int(p["min_query_count"])
        ts.qsl_rng_seed = ts.sample_index_rng_seed = ts.schedule_rng_seed = int(p["seed"])
        if scenario == "single_stream":
            ts.single_stream_expected_latency_ns = max(int(expected["latency_s"] * 1e9), 1)
            ts.single_stream_target_latency_percentile = 0.9
        elif scenario == "multi_stream":
            ts.multi_stream_samples_per_query = int(p["samples_per_query"])
            ts.multi_stream_expected_latency_ns = max(int(expected["latency_s"] * 1e9), 1)
            ts.multi_stream_target_latency_percentile = 0.99
        elif scenario == "offline":
            ts.offline_expected_qps = max(float(expected["qps"]), 1.0)
        else:
            ts.server_target_qps = float(target_qps)
            ts.server_target_latency_ns = int(p["server_target_latency_ms"] * 1e6)
            ts.server_target_latency_percentile = 0.99
        return ts

    def issuer(self, scenario: str) -> tuple:
        """(LoadGen's issue callback, the server's Batcher or None) for one test."""
        if scenario == "server":
            batcher = Batcher(self._run_and_complete, max(self.sizes), self.policy["batch_timeout_ms"] / 1000)
            return batcher.submit, batcher
        if scenario == "offline":
            def issue(samples):
                for chunk in chunks(list(samples), max(self.sizes)):
                    self._run_and_complete(chunk)
            return issue, None
        return self._run_and_complete, None

    def run(self, scenario: str, log_dir: str, target_qps: float | None, expected: dict) -> dict:
        lg = self.lg
        os.makedirs(log_dir, exist_ok=True)
        self.batches = 0
        issue, batcher = self.issuer(scenario)
        loaded: list[int] = []
        sut = lg.ConstructSUT(issue, lambda: None)
        count = int(self.policy["sample_count"])
        # the samples are the runner's prepared batch, already on the device: nothing to load or unload
        qsl = lg.ConstructQSL(count, count, lambda indices: loaded.append(len(indices)), lambda indices: None)
        log = lg.LogSettings()
        log.log_output.outdir = log_dir
        log.log_output.copy_summary_to_stdout = False
        log.enable_trace = False
        started = time.perf_counter()
        try:
            lg.StartTestWithLogSettings(sut, qsl, self.settings(scenario, target_qps, expected), log)
        finally:
            if batcher is not None:
                batcher.close()
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        if batcher is not None and batcher.error is not None:
            raise batcher.error
        detail = read_detail_log(os.path.join(log_dir, "mlperf_log_detail.txt"))
        return {"log_dir": os.path.basename(log_dir), "target_qps": target_qps, "wall_s": time.perf_counter() - started,
                "batches": self.batches, "loaded_samples": sum(loaded),
                "meets_bound": bool(detail.get("result_perf_constraints_met")) if scenario == "server" else None,
                "validity": detail.get("result_validity")}


def serve_request(generator, new_tokens: int, first_token=lambda: None) -> None:
    """One request as a server streams it: the prompt's prefill, `first_token()` once that token
    exists on the host side of a synchronisation, then `new_tokens - 1` decodes, each synchronised
    before the next is asked for."""
    generator.prefill()
    generator.synchronize()
    first_token()
    for _ in range(new_tokens - 1):
        generator.decode()
        generator.synchronize()


class GenerationServerRun(LoadGenRun):
    """LoadGen's server scenario over a Generator: each query one request (prompt, then `new_tokens`
    tokens, greedy), served one at a time, first come first served, with LoadGen's token latencies."""

    def __init__(self, lg, generator, policy: dict, new_tokens: int, batch: int):
        super().__init__(lg, None, policy)
        self.generator, self.new_tokens, self.batch = generator, new_tokens, batch

    def _serve(self, samples) -> None:
        lg, gen = self.lg, self.generator
        for sample in samples:
            serve_request(gen, self.new_tokens,
                          lambda sid=sample.id: lg.FirstTokenComplete([lg.QuerySampleResponse(sid, 0, 0, self.batch)]))
            self.batches += 1
            lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0, self.batch * self.new_tokens)])

    def issuer(self, scenario: str) -> tuple:
        batcher = Batcher(self._serve, 1, 0.0)  # one request at a time, in arrival order
        return batcher.submit, batcher

    def settings(self, scenario: str, target_qps: float | None, expected: dict) -> object:
        ts = super().settings(scenario, target_qps, expected)
        ts.use_token_latencies = True
        ts.ttft_latency = int(self.policy["server_ttft_ms"] * 1e6)
        ts.tpot_latency = int(self.policy["server_tpot_ms"] * 1e6)
        return ts


def serve_generation(generator, request: dict) -> dict:
    """Action `loadgen` in mode generate: the server scenario with TTFT and TPOT bounds over the
    runner's Generator; what the worker result's `loadgen` holds (as run_loadgen's)."""
    lg = _import_loadgen()
    policy = request["loadgen"]
    if policy["scenario"] != "server":
        raise ValueError(f"generation runs LoadGen's server scenario only (time to first token and per output "
                         f"token bounds), not {policy['scenario']!r}")
    new_tokens, batch = int(request["generation"]["new_tokens"]), int(request["batch_size"])
    if new_tokens < 2:
        raise ValueError(f"generation under LoadGen needs at least 2 new tokens for a time per output token, "
                         f"not {new_tokens}")

    warm = settle(lambda: serve_request(generator, new_tokens), int(policy["warmup_queries"]))
    # one request at a time: the fastest request's rate is what the server can sustain at best
    expected = {"latency_s": warm["min_s"], "qps": 1.0 / warm["min_s"]}
    test = GenerationServerRun(lg, generator, policy, new_tokens, batch)
    runs: list[dict] = []

    def meets(rate: float) -> dict:
        outcome = test.run("server", os.path.join(policy["log_dir"], f"server-{len(runs) + 1}"), rate, expected)
        runs.append(outcome)
        return outcome

    search_rates(expected["qps"], int(policy["server_search_steps"]), meets)
    return {"scenario": "server", "runs": runs, "chosen": _chosen_server_test(runs),
            "warmup_latency_s": {str(batch): warm["median_s"]}, "expected": expected}


def _chosen_server_test(runs: list[dict]) -> str:
    """The server search's result: the highest rate that met the bound, else the lowest tried."""
    passing = [r for r in runs if r["meets_bound"]]
    return (max(passing, key=lambda r: r["target_qps"]) if passing
            else min(runs, key=lambda r: r["target_qps"]))["log_dir"]


def _import_loadgen():
    try:
        import mlperf_loadgen as lg
    except ImportError as e:
        raise RuntimeError(f"mlperf_loadgen is not importable in this environment ({e}); the runner's "
                           "requirements install mlcommons-loadgen") from e
    return lg


def search_rates(capacity_qps: float, steps: int, meets) -> list[dict]:
    """The server search: `meets(rate) -> dict with "meets_bound"` for at most `steps` rates. Start at
    the capacity; halve while the bound is missed and nothing met it yet; then bisect between the
    highest rate that met it and the lowest that missed it. Returns every tried run, in order."""
    tried: list[dict] = []
    best, worst = None, None  # highest rate that met the bound, lowest that missed it
    rate = capacity_qps
    for _ in range(steps):
        outcome = meets(rate)
        tried.append(outcome)
        if outcome["meets_bound"]:
            best = rate if best is None else max(best, rate)
        else:
            worst = rate if worst is None else min(worst, rate)
        if best is None:
            rate = worst / 2
        elif worst is None:
            rate = best * 2  # the capacity estimate was low: look higher
        else:
            rate = (best + worst) / 2
    return tried


def run_loadgen(prepared, request: dict, runner_name: str) -> dict:
    """Action `loadgen` on a prepared network: warm up every batch size, run the scenario's LoadGen
    test(s) with their logs in request["loadgen"]["log_dir"]; what the worker result's `loadgen` holds."""
    lg = _import_loadgen()
    policy = request["loadgen"]
    scenario = policy["scenario"]
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    if getattr(prepared, "infer", None) is None:
        raise RuntimeError(f"the {runner_name} runner's Prepared gives no infer(n): it cannot serve LoadGen queries")
    sizes = sorted(policy["batch_sizes"])
    warm = warm_up(prepared, sizes, int(policy["warmup_queries"]))
    largest = max(sizes)
    # LoadGen plans a test from these: it generates queries for about twice the minimum duration at
    # the expected latency, and sizes offline's one query from the expected rate; an estimate that
    # is too slow leaves it short of queries (INVALID), one too fast only generates more. So the
    # fastest warm-up call, not the median: a loaded machine's outliers must not starve the test.
    expected = {"latency_s": warm[sizes[0] if scenario == "single_stream" else largest]["min_s"],
                "qps": largest / warm[largest]["min_s"]}
    test = LoadGenRun(lg, prepared, policy)
    root = policy["log_dir"]
    runs: list[dict] = []
    if scenario != "server":
        runs.append(test.run(scenario, os.path.join(root, scenario), None, expected))
        chosen = runs[0]["log_dir"]
    else:
        def meets(rate: float) -> dict:
            outcome = test.run(scenario, os.path.join(root, f"server-{len(runs) + 1}"), rate, expected)
            runs.append(outcome)
            return outcome

        search_rates(expected["qps"], int(policy["server_search_steps"]), meets)
        chosen = _chosen_server_test(runs)
    return {"scenario": scenario, "runs": runs, "chosen": chosen,
            "warmup_latency_s": {str(k): v["median_s"] for k, v in warm.items()},
            "expected": expected}
