"""The worker-side harness: measure() against a fake device clock, run_request() and main()."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runners" / "common"))

from runners.common import harness  # noqa: E402

NS = 1_000_000_000
MARK_BASE = 7 * 10**15  # far from the fake clock's values, so mark and clock cannot be confused


class FakeDevice:
    """An asynchronous 'device': step() only queues work, time advances when synchronize() drains it.

    So an interval read without a synchronisation before its closing clock read would miss the
    step's work. `durations` are the successive step times in seconds (the last one repeats).
    """

    def __init__(self, durations):
        self.durations = list(durations)
        self.steps = 0
        self.now = 0
        self.pending = 0
        self.log: list[str] = []
        self.marks = 0
        # what Prepared provides
        self.params = 123
        self.output_shape = (10,)
        self.settings = {"fake": True}

    def step(self):
        d = self.durations[min(self.steps, len(self.durations) - 1)]
        self.steps += 1
        self.pending += round(d * NS)
        self.log.append("step")

    def synchronize(self):
        self.now += self.pending
        self.pending = 0
        self.log.append("sync")

    def clock(self):
        self.log.append("clock")
        return self.now

    def mark(self):
        self.log.append("mark")
        self.marks += 1
        return MARK_BASE + self.marks


def run(durations, warmup=None, measure=None):
    dev = FakeDevice(durations)
    w = {"min_iters": 0, "max_iters": 1000, "max_time_s": 1e9, "window": 2, "tolerance": 0.1}
    m = {"min_iters": 5, "min_time_s": 0.0, "max_iters": 1000}
    w.update(warmup or {})
    m.update(measure or {})
    out = harness.measure(dev, w, m, clock=dev.clock, mark=dev.mark)
    return dev, out


# ---------------------------------------------------------------- measure(): first iteration, warm-up


def test_first_iteration_is_timed_apart():
    dev, out = run([5.0, 1.0])
    assert out["first_iter_s"] == pytest.approx(5.0)
    assert 5.0 not in out["warmup_iter_s"]
    assert 5.0 not in out["iter_s"]
    assert all(t == pytest.approx(1.0) for t in out["warmup_iter_s"] + out["iter_s"])
    # first + warm-up + measured = every step the device saw
    assert dev.steps == 1 + len(out["warmup_iter_s"]) + len(out["iter_s"])


def test_warmup_stops_when_window_medians_settle():
    # window 2: [3,2] vs [1,1] -> no; [2,1] vs [1,1] -> no; [1,1] vs [1,1] -> settled at 6 iterations
    dev, out = run([9.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0], warmup={"window": 2, "tolerance": 0.1})
    assert out["warmup_settled"] is True
    assert out["warmup_iter_s"] == pytest.approx([3.0, 2.0, 1.0, 1.0, 1.0, 1.0])


def test_warmup_settles_within_tolerance_not_only_on_equality():
    # [2.0, 2.0] vs [2.1, 2.1]: |2.1 - 2| = 0.1 <= 0.1 * 2 -> settled after 4 iterations
    _, out = run([1.0, 2.0, 2.0, 2.1, 2.1, 5.0], warmup={"window": 2, "tolerance": 0.1})
    assert out["warmup_settled"] is True
    assert out["warmup_iter_s"] == pytest.approx([2.0, 2.0, 2.1, 2.1])
    # ... and not when the tolerance is tighter
    _, out = run([1.0, 2.0, 2.0, 2.1, 2.1, 2.1, 2.1], warmup={"window": 2, "tolerance": 0.01})
    assert out["warmup_iter_s"] == pytest.approx([2.0, 2.0, 2.1, 2.1, 2.1, 2.1])


def test_warmup_tolerance_boundary_counts_as_settled():
    # [1.0, 1.0] vs [1.5, 1.5] with tolerance 0.5: |1.5 - 1.0| == 0.5 * 1.0 exactly -> settled
    _, out = run([1.0, 1.0, 1.0, 1.5, 1.5, 9.0], warmup={"window": 2, "tolerance": 0.5})
    assert out["warmup_settled"] is True
    assert out["warmup_iter_s"] == [1.0, 1.0, 1.5, 1.5]


def test_warmup_honours_min_iters_even_when_settled_earlier():
    _, out = run([1.0], warmup={"window": 2, "min_iters": 9})
    assert out["warmup_settled"] is True
    assert len(out["warmup_iter_s"]) == 9
    _, out = run([1.0], warmup={"window": 3, "min_iters": 0})
    assert len(out["warmup_iter_s"]) == 6  # two full windows are needed to compare


def test_warmup_gives_up_at_max_iters_when_never_settled():
    growing = [1.0] + [float(i) for i in range(1, 200)]  # each window's median well above the last
    _, out = run(growing, warmup={"window": 2, "max_iters": 7, "tolerance": 0.1})
    assert out["warmup_settled"] is False
    assert out["warmup_iter_s"] == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])


def test_warmup_gives_up_at_max_time_when_never_settled():
    growing = [0.5] + [float(i) for i in range(1, 200)]
    # 1+2+3+4 = 10 s of warm-up reaches max_time_s=10 after the 4th iteration
    _, out = run(growing, warmup={"window": 2, "max_iters": 1000, "max_time_s": 10.0})
    assert out["warmup_settled"] is False
    assert out["warmup_iter_s"] == pytest.approx([1.0, 2.0, 3.0, 4.0])


# ---------------------------------------------------------------- measure(): measured phase


def test_measured_phase_stops_at_min_iters_when_min_time_is_zero():
    _, out = run([1.0], measure={"min_iters": 5, "min_time_s": 0.0, "max_iters": 100})
    assert len(out["iter_s"]) == 5


def test_measured_phase_runs_until_min_time():
    _, out = run([1.0], measure={"min_iters": 5, "min_time_s": 12.0, "max_iters": 100})
    assert len(out["iter_s"]) == 12
    assert sum(out["iter_s"]) == pytest.approx(12.0)


def test_measured_phase_runs_until_min_iters_even_past_min_time():
    _, out = run([1.0], measure={"min_iters": 8, "min_time_s": 2.0, "max_iters": 100})
    assert len(out["iter_s"]) == 8


def test_measured_phase_stops_at_max_iters():
    _, out = run([1.0], measure={"min_iters": 5, "min_time_s": 1000.0, "max_iters": 7})
    assert len(out["iter_s"]) == 7
    _, out = run([1.0], measure={"min_iters": 5, "min_time_s": 0.0, "max_iters": 3})
    assert len(out["iter_s"]) == 3  # max_iters wins over min_iters


def test_measured_times_are_the_step_times():
    durations = [4.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.125, 2.0, 3.0, 3.0]
    _, out = run(durations, warmup={"window": 2, "max_iters": 4},
                 measure={"min_iters": 5, "min_time_s": 0.0, "max_iters": 100})
    assert out["warmup_iter_s"] == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert out["iter_s"] == pytest.approx([0.5, 0.25, 0.125, 2.0, 3.0])


# ---------------------------------------------------------------- measure(): synchronisation and marks


def test_synchronize_precedes_every_clock_read_that_ends_an_interval():
    dev, out = run([2.0, 1.0], warmup={"window": 2, "min_iters": 3},
                   measure={"min_iters": 6, "min_time_s": 0.0, "max_iters": 100})
    log = dev.log
    # the device is drained before the first interval starts
    assert log.index("sync") < log.index("clock") < log.index("step")
    # after every step, a sync comes before the next clock read (or mark)
    for i, ev in enumerate(log):
        if ev == "step":
            rest = log[i + 1:]
            nxt = next(j for j, e in enumerate(rest) if e in ("clock", "mark", "step"))
            assert "sync" in rest[:nxt], f"clock read after step #{log[:i + 1].count('step')} without sync: {log}"
            assert rest[nxt] != "step"
    assert log.count("sync") == dev.steps + 1
    assert dev.steps == 1 + len(out["warmup_iter_s"]) + len(out["iter_s"])


def test_missing_synchronisation_would_be_detected():
    """The fake device is what makes the test above meaningful: skipping sync measures nothing."""

    class NoSync(FakeDevice):
        def synchronize(self):
            self.log.append("sync")  # does not drain the queue

    dev = NoSync([1.0])
    w = {"min_iters": 0, "max_iters": 4, "max_time_s": 1e9, "window": 2, "tolerance": 0.1}
    out = harness.measure(dev, w, {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5},
                          clock=dev.clock, mark=dev.mark)
    assert out["iter_s"] == [0.0] * 5


def test_window_marks_come_from_mark_and_bound_the_measured_phase():
    dev, out = run([1.0], warmup={"window": 2, "max_iters": 4},
                   measure={"min_iters": 5, "min_time_s": 0.0, "max_iters": 5})
    assert out["window_monotonic_ns"] == [MARK_BASE + 1, MARK_BASE + 2]
    assert dev.log.count("mark") == 2
    first, last = (i for i, e in enumerate(dev.log) if e == "mark")
    steps_before = dev.log[:first].count("step")
    steps_inside = dev.log[first:last].count("step")
    assert steps_before == 1 + len(out["warmup_iter_s"])
    assert steps_inside == len(out["iter_s"]) == 5
    # the window ends after the last measured step has been synchronised
    assert dev.log[:last][::-1].index("sync") < dev.log[:last][::-1].index("step")


# ---------------------------------------------------------------- run_request()

POLICY = {"warmup": {"min_iters": 0, "max_iters": 3, "max_time_s": 5.0, "window": 1, "tolerance": 0.5},
          "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}


def request(**over):
    req = {"protocol": harness.PROTOCOL_VERSION, "action": "benchmark", "device": "cpu", "threads": 2,
           "network": {"name": "n"}, "batch_size": 4, "policy": POLICY}
    req.update(over)
    return req


class Prepared:
    params = 42
    output_shape = (10,)
    settings = {"layout": "x"}

    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1

    def synchronize(self):
        pass


class Runner:
    name = "fakefw"

    def __init__(self, prepare_error=None, unavailable=None):
        self.prepare_error = prepare_error
        self.unavailable = unavailable
        self.prepared = Prepared()

    def configure_threads(self, n):
        return {"requested": n}

    def framework_info(self, device):
        return {"name": "fakefw", "version": "1.2"}

    def device_available(self, device):
        return self.unavailable

    def prepare(self, req):
        if self.prepare_error is not None:
            raise self.prepare_error
        return self.prepared


def test_run_request_ok():
    runner = Runner()
    res = harness.run_request(runner, request())
    assert res["status"] == "ok"
    assert res["protocol"] == harness.PROTOCOL_VERSION
    assert res["framework"] == {"name": "fakefw", "version": "1.2"}
    assert res["threads"] == {"requested": 2}
    assert res["params"] == 42 and res["output_shape"] == [10] and res["settings"] == {"layout": "x"}
    assert len(res["iter_s"]) == 5 and res["first_iter_s"] >= 0
    assert len(res["window_monotonic_ns"]) == 2
    assert runner.prepared.steps == 1 + len(res["warmup_iter_s"]) + 5
    json.dumps(res)  # the result must be JSON


def test_run_request_non_benchmark_action_does_not_measure():
    runner = Runner()
    res = harness.run_request(runner, request(action="describe"))
    assert res["status"] == "ok" and res["params"] == 42
    assert "iter_s" not in res and runner.prepared.steps == 0


def test_run_request_skipped_by_device_available():
    res = harness.run_request(Runner(unavailable="no GPU here"), request(device="cuda"))
    assert res["status"] == "skipped" and res["reason"] == "no GPU here"
    assert "traceback" not in res


def test_run_request_skipped_by_skip_exception():
    res = harness.run_request(Runner(prepare_error=harness.Skip("not for this network")), request())
    assert res["status"] == "skipped" and res["reason"] == "not for this network"


def test_run_request_failed_with_traceback():
    res = harness.run_request(Runner(prepare_error=ValueError("bad layer")), request())
    assert res["status"] == "failed"
    assert res["reason"] == "ValueError: bad layer"
    assert "Traceback" in res["traceback"] and "prepare" in res["traceback"] and "bad layer" in res["traceback"]
    assert res["framework"]["name"] == "fakefw"


def test_run_request_memory_error_is_out_of_memory():
    res = harness.run_request(Runner(prepare_error=MemoryError("cannot allocate")), request())
    assert res["status"] == "failed"
    assert res["reason"].startswith("out of memory: MemoryError")


def test_run_request_framework_oom_message_is_out_of_memory():
    res = harness.run_request(Runner(prepare_error=RuntimeError("CUDA out of memory. Tried to allocate")), request())
    assert res["reason"].startswith("out of memory: RuntimeError")
    res = harness.run_request(Runner(prepare_error=RuntimeError("shape mismatch")), request())
    assert not res["reason"].startswith("out of memory")


# ---------------------------------------------------------------- main()


def _main(monkeypatch, tmp_path, req, runner=None):
    rq, rs = tmp_path / "request.json", tmp_path / "result.json"
    rq.write_text(json.dumps(req))
    monkeypatch.setattr(sys, "argv", ["worker.py", str(rq), str(rs)])
    return harness.main(runner or Runner()), rs


def test_main_protocol_mismatch_returns_2(monkeypatch, tmp_path, capsys):
    code, rs = _main(monkeypatch, tmp_path, request(protocol=harness.PROTOCOL_VERSION + 1))
    assert code == 2
    assert not rs.exists()
    assert "protocol" in capsys.readouterr().err


def test_main_missing_protocol_returns_2(monkeypatch, tmp_path):
    req = request()
    del req["protocol"]
    code, rs = _main(monkeypatch, tmp_path, req)
    assert code == 2 and not rs.exists()


def test_main_wrong_arguments_returns_2(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["worker.py", "only-one"])
    assert harness.main(Runner()) == 2


def test_main_writes_result_atomically(monkeypatch, tmp_path):
    code, rs = _main(monkeypatch, tmp_path, request())
    assert code == 0
    assert json.loads(rs.read_text())["status"] == "ok"
    assert not (tmp_path / "result.json.partial").exists()


def test_main_failed_returns_1_skipped_returns_0(monkeypatch, tmp_path):
    code, rs = _main(monkeypatch, tmp_path, request(), Runner(prepare_error=RuntimeError("x")))
    assert code == 1 and json.loads(rs.read_text())["status"] == "failed"
    code, rs = _main(monkeypatch, tmp_path, request(), Runner(unavailable="nope"))
    assert code == 0 and json.loads(rs.read_text())["status"] == "skipped"


def test_kernels_are_timed_after_a_cache_flush_when_asked():
    """Each call (the first, warm-up and measured) follows a flush; the flush is outside the call's time."""
    log = []

    class Kernel:
        def step(self):
            log.append("step")

        def synchronize(self):
            pass

    ticks = iter(range(0, 10**12, 10**6))  # 1 ms per clock read
    policy = {"warmup_iters": 1, "min_iters": 3, "min_time_s": 0.0, "max_iters": 10}
    out = harness._time_kernel(Kernel(), policy, lambda: next(ticks), flush=lambda: log.append("flush"))
    assert log == ["flush", "step"] * 5 and len(out["times_s"]) == 3
    assert out["times_s"] == [0.001] * 3  # one tick between the two reads around each call
    flush = harness.CacheFlush(1 << 20)
    flush()
    flush()
    assert flush._value == 2 and harness.CacheFlush(0)() is None


def test_a_backward_timed_with_its_forward_is_the_median_of_paired_differences():
    """The forward+backward and the forward calls alternate, each after a flush, so a slow spell of
    the machine (here 10x, over the second measured pair) slows both calls of a pair; the backward
    is the median of the pairs' differences."""
    log = []
    clock_ns = [0]
    speed = iter([1, 1, 1, 1, 1, 1, 10, 10, 1, 1])  # per call: first pair, warm-up pair, 3 measured pairs

    class Kernel:
        def __init__(self, name, ms):
            self.name, self.ms = name, ms

        def step(self):
            log.append(self.name)
            clock_ns[0] += self.ms * next(speed) * 10**6

        def synchronize(self):
            pass

    policy = {"warmup_iters": 1, "min_iters": 3, "min_time_s": 0.0, "max_iters": 10}
    out = harness._time_paired(Kernel("both", 5), Kernel("forward", 2), policy, lambda: clock_ns[0],
                               flush=lambda: log.append("flush"))
    assert log == ["flush", "both", "flush", "forward"] * 5
    assert out["times_s"] == [0.005, 0.05, 0.005] and out["forward_times_s"] == [0.002, 0.02, 0.002]
    assert out["median_s"] == pytest.approx(0.003)  # the pairs' differences: 3, 30, 3 ms
    assert (out["with_forward_median_s"], out["forward_median_s"]) == (0.005, 0.002)


def test_run_request_reports_the_allocator_peak_and_compiler_counters_after_the_window():
    runner = Runner()
    prepared = runner.prepared
    steps_when_asked = []

    def memory():
        steps_when_asked.append(prepared.steps)
        return {"peak_allocated_bytes": 123, "peak_reserved_bytes": 456, "source": "fake allocator"}

    prepared.memory = memory
    prepared.compile_stats = lambda: {"graph_breaks": 2, "recompiles": 0}
    res = harness.run_request(runner, request())
    assert res["status"] == "ok", res
    assert res["memory"] == {"peak_allocated_bytes": 123, "peak_reserved_bytes": 456, "source": "fake allocator"}
    assert res["compile"] == {"graph_breaks": 2, "recompiles": 0}
    assert steps_when_asked == [prepared.steps] and prepared.steps > 0  # once, after every step


def test_run_request_without_memory_or_compile_hooks_reports_neither():
    res = harness.run_request(Runner(), request())
    assert res["status"] == "ok" and "memory" not in res and "compile" not in res


def test_run_request_hands_the_runner_the_axes_as_their_types():
    """The harness checks a request's axis fields once: the runner gets Precision, Compile and Mode
    members, which compare, hash and print as the strings the request carried."""
    from runners.common.contract import Compile, Mode, Precision

    seen = {}

    class Recording(Runner):
        def prepare(self, req):
            seen.update(req)
            return super().prepare(req)

    res = harness.run_request(Recording(), request(precision="amp_bf16", compile="compiled", mode="train"))
    assert res["status"] == "ok"
    assert seen["precision"] is Precision.AMP_BF16 and seen["compile"] is Compile.COMPILED and seen["mode"] is Mode.TRAIN
    assert seen["precision"] == "amp_bf16" and {"amp_bf16": 1}[seen["precision"]] == 1
    assert f"{seen['precision']}" == "amp_bf16" and repr(seen["precision"]) == "'amp_bf16'"
    assert json.loads(json.dumps({"p": seen["precision"]})) == {"p": "amp_bf16"}


def test_run_request_fails_once_on_an_axis_value_no_runner_knows():
    runner = Runner()
    res = harness.run_request(runner, request(precision="fp8"))
    assert res["status"] == "failed" and runner.prepared.steps == 0
    assert "the request's 'precision': precision 'fp8' is not one it accepts" in res["reason"]
    assert "fp32, tf32, amp_bf16, amp_fp16, float64" in res["reason"]
