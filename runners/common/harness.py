"""The worker side of the runner contract: protocol, threads, measurement. Standard library only.

Every runner folder has a `worker.py` that the controller starts by path with the framework
environment's interpreter:

    <env python> runners/<fw>/worker.py REQUEST.json RESULT.json

The worker reads the request, builds the network through its runner object, measures, and writes
RESULT.json atomically (a temporary file renamed into place), so the controller sees a whole result
or none. Anything that goes wrong inside the worker becomes a result with status "failed" and the
traceback; a worker that dies without a result is classified by the controller from its exit
status and stderr.

What the runner object and its Prepared and Kernel provide is runners/common/contract.py (the
`Runner` protocol and the Prepared and Kernel base classes the runners use); the request and result
files' protocol is runners/common/protocol.py.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback
from typing import Callable

from runners.common.contract import typed_request
from runners.common.protocol import Skip, classify, read_request, write_atomically

# protocol.PROTOCOL_VERSION, spelled out: tests/unit/test_no_framework_import.py compares this file's
# literal with the controller's (tests/unit/test_runner_contract.py keeps the two equal)
PROTOCOL_VERSION = 1
# how a backward kernel timed with its forward got its time (the kernel's settings say it)
PAIRED = "forward+backward minus forward (median of paired calls)"


def _time_calls(call: Callable[[], tuple], sync: Callable[[], None], warmup: dict, measure: dict,
                clock: Callable[[], int], mark: Callable[[], int]) -> tuple[tuple, dict, list[tuple]]:
    """The timing both `measure` and `measure_generation` follow. `call()` -> (seconds, *more): one
    step or request, read between synchronisations. The first call apart, warm-up calls until their
    times settle (the median of the last `window` within `tolerance` of the window before it) or
    `max_iters`/`max_time_s` run out, then at least `min_iters` calls and `min_time_s` seconds of them
    (at most `max_iters`). Returns (the first call's result, the timing part of a result, the measured
    calls' results)."""
    sync()
    first = call()

    warm: list[float] = []
    settled = False
    w = warmup["window"]
    started = clock()
    while len(warm) < warmup["max_iters"]:
        warm.append(call()[0])
        if len(warm) >= max(warmup["min_iters"], 2 * w):
            before = statistics.median(warm[-2 * w:-w])
            latest = statistics.median(warm[-w:])
            if abs(latest - before) <= warmup["tolerance"] * before:
                settled = True
                break
        if (clock() - started) / 1e9 >= warmup["max_time_s"]:
            break

    measured: list[tuple] = []
    window_start = mark()
    started = clock()
    while True:
        measured.append(call())
        n = len(measured)
        if n >= measure["max_iters"]:
            break
        if n >= measure["min_iters"] and (clock() - started) / 1e9 >= measure["min_time_s"]:
            break
    window_end = mark()
    return first, {
        "first_iter_s": first[0],
        "warmup_iter_s": warm,
        "warmup_settled": settled,
        "iter_s": [m[0] for m in measured],
        "window_monotonic_ns": [window_start, window_end],
    }, measured


def measure(prepared, warmup: dict, measure: dict,
            clock: Callable[[], int] = time.perf_counter_ns,
            mark: Callable[[], int] = time.monotonic_ns) -> dict:
    """Time the first iteration, warm up until iteration times settle, then measure.

    Every interval is read between two device synchronisations, so it covers exactly one step's
    device work. `mark` gives the measured window's bounds on the system-wide monotonic clock, which
    the telemetry sampler uses too.
    """
    step, sync = prepared.step, prepared.synchronize

    def timed() -> tuple[float]:
        t0 = clock()
        step()
        sync()
        return ((clock() - t0) / 1e9,)

    return _time_calls(timed, sync, warmup, measure, clock, mark)[1]


def measure_generation(generator, warmup: dict, measure: dict, new_tokens: int,
                       clock: Callable[[], int] = time.perf_counter_ns,
                       mark: Callable[[], int] = time.monotonic_ns) -> dict:
    """Time whole generation requests the way `measure` times steps: the first request apart
    (compilation, cache allocation), warm-up requests until their times settle, then at least
    `min_iters` requests and `min_time_s` seconds of them.

    A request is one prefill and `new_tokens - 1` decodes. Its time to first token (TTFT) is the
    prefill read between two synchronisations; each decode is read the same way, and its time per
    output token (TPOT) is the mean of those, i.e. (request time - TTFT) / (new_tokens - 1), as
    MLPerf defines it. `iter_s` holds whole requests, so the run's summary (samples/s = batch /
    median request time) is of completed sequences."""
    gen_prefill, gen_decode, sync = generator.prefill, generator.decode, generator.synchronize
    decodes = new_tokens - 1

    def request() -> tuple[float, float, float]:
        t0 = clock()
        gen_prefill()
        sync()
        t1 = clock()
        for _ in range(decodes):
            gen_decode()
            sync()
        t2 = clock()
        return (t2 - t0) / 1e9, (t1 - t0) / 1e9, (t2 - t1) / 1e9 / decodes

    first, timing, measured = _time_calls(request, sync, warmup, measure, clock, mark)
    return {**timing, "generation": {"new_tokens": new_tokens, "first_ttft_s": first[1],
                                     "ttft_s": [m[1] for m in measured], "tpot_s": [m[2] for m in measured]}}


class CacheFlush:
    """Evicts the CPU's caches by writing a buffer larger than the last-level cache (memset, through
    ctypes): a kernel timed after it finds its operands in memory, as a training step finds a layer's
    weights, gradients and momentum, last touched an iteration ago. `nbytes` 0: no flushing."""

    def __init__(self, nbytes: int):
        import ctypes

        self.nbytes = nbytes
        self._buffer = ctypes.create_string_buffer(nbytes) if nbytes else None
        self._memset = ctypes.memset
        self._value = 0

    def __call__(self) -> None:
        if self._buffer is not None:
            self._value = (self._value + 1) % 251  # a new value: every line is written again
            self._memset(self._buffer, self._value, self.nbytes)


def _timed_call(kernel, clock: Callable[[], int], flush: Callable[[], None]) -> float:
    """Seconds of one call of a kernel between two synchronisations, after a flush (not timed)."""
    flush()
    t0 = clock()
    kernel.step()
    kernel.synchronize()
    return (clock() - t0) / 1e9


def _time_kernel(kernel, policy: dict, clock: Callable[[], int], flush: Callable[[], None] = lambda: None) -> dict:
    """One kernel: a first call timed apart, `warmup_iters` more, then at least `min_iters` calls and
    `min_time_s` seconds of them (at most `max_iters`), each between two synchronisations and, with
    `flush`, after the caches were flushed (the flush is not timed, but `min_time_s` is wall time,
    flushes included: a cold microsecond kernel would otherwise take `max_iters` flushes of a
    last-level cache's size, tens of seconds, to add up to `min_time_s` of calls)."""
    kernel.synchronize()
    first = _timed_call(kernel, clock, flush)
    for _ in range(policy["warmup_iters"]):
        _timed_call(kernel, clock, flush)
    times: list[float] = []
    started = clock()
    while len(times) < policy["max_iters"]:
        times.append(_timed_call(kernel, clock, flush))
        if len(times) >= policy["min_iters"] and (clock() - started) / 1e9 >= policy["min_time_s"]:
            break
    return {"first_s": first, "times_s": times, "median_s": statistics.median(times)}


def _time_paired(combined, forward, policy: dict, clock: Callable[[], int],
                 flush: Callable[[], None] = lambda: None) -> dict:
    """A backward kernel that runs with its forward (`combined`) and that forward, their calls
    alternating (each after a flush, as `_time_kernel` times one): the backward is the median of
    the differences of each pair of calls made back to back. On a shared machine, whose speed moves
    from one second to the next, two medians taken apart (the forward's a few seconds after the
    pair's) differed by more than the backward itself: TensorFlow's 64-step LSTM layer backward came
    out 46 ms, its 32-step one 137 ms, in one calibration."""
    def timed(kernel) -> float:
        return _timed_call(kernel, clock, flush)

    combined.synchronize()
    forward.synchronize()
    first, forward_first = timed(combined), timed(forward)
    for _ in range(policy["warmup_iters"]):
        timed(combined)
        timed(forward)
    times: list[float] = []
    forward_times: list[float] = []
    started = clock()
    while len(times) < policy["max_iters"]:
        times.append(timed(combined))
        forward_times.append(timed(forward))
        if len(times) >= policy["min_iters"] and (clock() - started) / 1e9 >= policy["min_time_s"]:
            break
    difference = statistics.median(t - f for t, f in zip(times, forward_times))
    return {"first_s": first, "times_s": times, "forward_first_s": forward_first, "forward_times_s": forward_times,
            "with_forward_median_s": statistics.median(times), "forward_median_s": statistics.median(forward_times),
            "median_s": max(difference, 0.0)}


def measure_yardstick(runner, request: dict, clock: Callable[[], int] = time.perf_counter_ns) -> list[dict]:
    """The request's `yardstick` kernels (src/dlbench/performance/yardstick.py), timed as every kernel
    is, before the worker's own work: how fast the machine ran at that moment. A framework that
    cannot time one says why in its entry; the worker's own work goes on either way."""
    yardstick = request["yardstick"]
    return measure_kernels(runner, {"kernels": yardstick["kernels"], "kernel_policy": yardstick["policy"],
                                    "device": request["device"]}, clock)


def measure_kernels(runner, request: dict, clock: Callable[[], int] = time.perf_counter_ns) -> list[dict]:
    """Every kernel of the request, each on its own: one that the framework cannot run in a reduced
    precision is `skipped` with the framework's reason, any other error `failed`; the rest go on.
    A backward kernel that can only be timed together with its forward is timed both ways, the calls
    alternating, and its time is the median of the pairs' differences (said in its settings)."""
    out = []
    policy = request["kernel_policy"]
    flush = CacheFlush(int(policy.get("flush_bytes", 0)))
    for spec in request["kernels"]:
        entry: dict = {"spec": spec}
        try:
            kernel = runner.prepare_kernel(spec, request["device"])
            paired = getattr(kernel, "includes_forward", False)
            if paired:
                forward = dict(spec, kind=spec["kind"].replace("_bwd", "_fwd"))
                forward["shape"] = {k: v for k, v in spec["shape"].items() if k != "input_grad"}
                entry.update(_time_paired(kernel, runner.prepare_kernel(forward, request["device"]), policy, clock,
                                          flush))
            else:
                entry.update(_time_kernel(kernel, policy, clock, flush))
            entry["settings"] = dict(getattr(kernel, "settings", {}) or {})
            if paired:
                entry["settings"]["backward_time"] = PAIRED
            entry["status"] = "ok"
        except Skip as e:
            entry.update(status="skipped", reason=str(e))
        except Exception as e:  # noqa: BLE001 - one kernel's failure must not end the others
            reduced = spec.get("dtype", "float32") != "float32"
            entry.update(status="skipped" if reduced else "failed",
                         reason=(f"not available in {spec['dtype']}: " if reduced else "") + classify(e))
            if not reduced:
                entry["traceback"] = traceback.format_exc()
        out.append(entry)
    return out


def check(prepared, request: dict) -> dict:
    """One equivalence probe: export, load the shared weights, forward, one training step, export.

    Everything numeric goes to request["outputs"] (.npz): `init/<name>` (the framework's own
    initialisation, exported), `loaded/<name>` (exported right after loading the shared weights:
    the round trip), `logits`, `loss`, and `after/<name>` (after one optimiser step).
    """
    import numpy as np  # every framework environment has numpy; only the check needs it here

    arrays = {f"init/{k}": v for k, v in prepared.export_weights().items()}
    with np.load(request["weights_in"]) as shared:
        prepared.load_weights({k: shared[k] for k in shared.files})
    arrays.update({f"loaded/{k}": v for k, v in prepared.export_weights().items()})
    logits, loss = prepared.forward_loss()
    logits = np.asarray(logits)
    arrays["logits"] = logits.astype(np.float64 if logits.dtype == np.float64 else np.float32)  # float64: the check's
    arrays["loss"] = np.asarray(loss, dtype=np.float64)
    prepared.step()
    prepared.synchronize()
    arrays.update({f"after/{k}": v for k, v in prepared.export_weights().items()})
    tmp = request["outputs"] + ".partial.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, request["outputs"])
    return {"outputs": request["outputs"]}


def check_generation(generator, request: dict) -> dict:
    """The generation probe of `dlbench check --mode generate`: load the shared weights, generate
    once greedily from the shared prompt, and write `tokens` (batch, new_tokens) and `first_logits`
    (batch, vocabulary) to request["outputs"] (.npz)."""
    import numpy as np

    with np.load(request["weights_in"]) as shared:
        generator.load_weights({k: shared[k] for k in shared.files})
    generator.prefill()
    for _ in range(request["generation"]["new_tokens"] - 1):
        generator.decode()
    generator.synchronize()
    logits = np.asarray(generator.first_logits())
    arrays = {"tokens": np.asarray(generator.tokens()).astype(np.int64),
              "first_logits": logits.astype(np.float64 if logits.dtype == np.float64 else np.float32)}
    tmp = request["outputs"] + ".partial.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, request["outputs"])
    return {"outputs": request["outputs"]}


def _after_timing(prepared, result: dict) -> None:
    """After the measured window: the allocator's peak over the whole process and the compiler's
    counters, where the runner reports them (Prepared.memory, Prepared.compile_stats)."""
    memory, compile_stats = getattr(prepared, "memory", None), getattr(prepared, "compile_stats", None)
    if memory is not None:
        result["memory"] = memory()
    if compile_stats is not None:
        result["compile"] = compile_stats()


def run_generation(runner, request: dict, result: dict) -> None:
    """Mode `generate` (the runner's prepare_generation; a runner without one skips, saying so): timed
    requests (benchmark), LoadGen's server scenario with token latencies (loadgen), or the check."""
    prepare = getattr(runner, "prepare_generation", None)
    if prepare is None:
        raise Skip(f"the {runner.name} runner does not generate (it has no prepare_generation)")
    generator = prepare(request)
    new_tokens = request["generation"]["new_tokens"]
    result.update(params=generator.params, output_shape=[new_tokens], settings=generator.settings)
    if request["action"] == "benchmark":
        result.update(measure_generation(generator, request["policy"]["warmup"], request["policy"]["measure"],
                                         new_tokens))
        _after_timing(generator, result)
    elif request["action"] == "loadgen":
        from runners.common.loadgen_harness import serve_generation  # imports mlperf_loadgen, which only this action needs

        result["loadgen"] = serve_generation(generator, request)
        _after_timing(generator, result)
    elif request["action"] == "check":
        result.update(check_generation(generator, request))


def run_request(runner, request: dict) -> dict:
    result: dict = {"protocol": PROTOCOL_VERSION, "framework": {"name": runner.name}}
    device = request["device"]
    try:
        request = typed_request(request)  # the axes' values checked once, as their types
        result["threads"] = runner.configure_threads(request.get("threads"))
        result["framework"] = runner.framework_info(device)
        why_not = runner.device_available(device)
        if why_not:
            raise Skip(why_not)
        if request.get("yardstick") and request["action"] in ("kernels", "benchmark"):
            result["yardstick"] = measure_yardstick(runner, request)
        if request["action"] == "kernels":
            result["kernels"] = measure_kernels(runner, request)
            result["status"] = "ok"
            return result
        if request["action"] == "convergence":
            if not hasattr(runner, "prepare_convergence"):
                raise Skip(f"the {runner.name} runner has no convergence loop (contract.ConvergenceRunner)")
            from runners.common.convergence import run_convergence  # time to accuracy: runners/common/convergence.py

            run = run_convergence(runner, request)
            result.update(params=run.pop("params"), settings=run.pop("settings"), convergence=run, status="ok")
            return result
        if request.get("mode") == "generate":
            run_generation(runner, request, result)
            result["status"] = "ok"
            return result
        prepared = runner.prepare(request)
        result.update(params=prepared.params, output_shape=list(prepared.output_shape),
                      settings=prepared.settings)
        if request["action"] == "benchmark":
            result.update(measure(prepared, request["policy"]["warmup"], request["policy"]["measure"]))
            _after_timing(prepared, result)
        elif request["action"] == "loadgen":
            from runners.common.loadgen_harness import run_loadgen  # imports mlperf_loadgen, which only this action needs

            result["loadgen"] = run_loadgen(prepared, request, runner.name)
            _after_timing(prepared, result)  # after LoadGen's tests, as after a measured window
        elif request["action"] == "check":
            result.update(check(prepared, request))
        result["status"] = "ok"
    except Skip as e:
        result.update(status="skipped", reason=str(e))
    except BaseException as e:  # noqa: BLE001 - the worker reports everything it can
        result.update(status="failed", reason=classify(e), traceback=traceback.format_exc())
    return result


def main(runner) -> int:
    if len(sys.argv) != 3:
        print("usage: worker.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request, why_not = read_request(sys.argv[1])
    if request is None:
        print(why_not, file=sys.stderr)
        return 2
    result = run_request(runner, request)
    write_atomically(sys.argv[2], result)
    return 0 if result["status"] in ("ok", "skipped") else 1
