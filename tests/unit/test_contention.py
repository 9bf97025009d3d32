"""Contention: other processes' CPU over a measured window (telemetry/contention.py), the worker's
process tree's own time, the quiet wait, and the orchestrator's guard that marks and replaces
contended repeats (bounded, in repeat_policy)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from dlbench.execution.orchestrator import Orchestrator, RunOptions, plan
from dlbench.store.store import Store
from dlbench.telemetry import contention
from dlbench.telemetry.contention import TreeClock, wait_for_quiet, window_contention
from dlbench.telemetry.host import HostTelemetry

S = 1_000_000_000  # ns


def host(busy, worker, sampler=None):
    n = len(busy)
    return {"series": {"busy_cpu_s": busy, "worker_cpu_s": worker, "sampler_cpu_s": sampler or [0.0] * n},
            "unavailable": {}}


def test_others_are_the_machine_less_the_worker_tree_and_the_sampler():
    # samples at 0, 1, 2, 3 s; the window [1 s, 2 s] is bracketed by the samples at 1 and 2 s
    cpu = host(busy=[0.0, 2.0, 4.0, 6.0], worker=[0.0, 1.0, 2.4, 3.0], sampler=[0.0, 0.1, 0.2, 0.3])
    out = window_contention(cpu, [0, 1 * S, 2 * S, 3 * S], (1 * S, 2 * S), given_cores=2, total_cores=2,
                            threshold_pct=10.0)
    # busy 2.0 - worker 1.4 - sampler 0.1 = 0.5 core-seconds over 1 s of 2 cores
    assert out["measured"] and out["other_cpu_s"] == pytest.approx(0.5) and out["span_s"] == 1.0
    assert out["other_cpu_pct"] == pytest.approx(25.0) == out["contention_pct"]
    assert out["contended"] and "25%" in out["reason"]


def test_the_bracketing_samples_cover_a_window_shorter_than_an_interval():
    cpu = host(busy=[0.0, 0.02, 0.04], worker=[0.0, 0.02, 0.04])
    out = window_contention(cpu, [0, S // 10, 2 * S // 10], (S // 20, S // 20 + 1000), 1, 1, 10.0)
    assert out["measured"] and out["span_s"] == pytest.approx(0.1) and out["other_cpu_s"] == 0.0
    assert not out["contended"] and "reason" not in out


def test_spare_cores_are_not_contention():
    # 1 of 4 cores given; others use 2.5 cores: 250% of the worker's share, 3 cores were theirs to use
    cpu = host(busy=[0.0, 3.5], worker=[0.0, 1.0])
    out = window_contention(cpu, [0, S], (0, S), given_cores=1, total_cores=4, threshold_pct=10.0)
    assert out["other_cpu_pct"] == pytest.approx(250.0) and out["contention_pct"] == 0.0
    assert out["spare_cores"] == 3 and not out["contended"]
    cpu = host(busy=[0.0, 4.5], worker=[0.0, 1.0])  # now 3.5 cores: half a core beyond the spare ones
    out = window_contention(cpu, [0, S], (0, S), given_cores=1, total_cores=4, threshold_pct=10.0)
    assert out["contention_pct"] == pytest.approx(50.0) and out["contended"]


def test_steal_beside_it_is_gated_by_the_same_threshold():
    cpu = host(busy=[0.0, 1.0], worker=[0.0, 1.0])
    quiet = window_contention(cpu, [0, S], (0, S), 1, 1, 10.0, steal_pct=2.0)
    stolen = window_contention(cpu, [0, S], (0, S), 1, 1, 10.0, steal_pct=30.0)
    assert quiet["steal_pct"] == 2.0 and not quiet["contended"]
    assert stolen["contended"] and "steal 30%" in stolen["reason"] and stolen["contention_pct"] == 0.0


@pytest.mark.parametrize("cpu, t_ns, why", [
    ({"series": {}, "unavailable": {}}, [0, S], "no CPU times sampled"),
    (host(busy=[0.0], worker=[0.0]), [S // 2], "fewer than 2 samples"),
    (host(busy=[0.0, 1.0, 2.0], worker=[None, None, 1.0]), [0, S // 2, S], "fewer than 2 samples"),
])
def test_what_cannot_be_measured_says_why_and_is_never_contended(cpu, t_ns, why):
    out = window_contention(cpu, t_ns, (S // 4, 3 * S // 4), 1, 1, 10.0)
    assert not out["measured"] and not out["contended"] and why in out["reason"]


BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_the_tree_clock_counts_a_child_that_exited():
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.3)!r}])\n"
                               "time.sleep(30)\n"])
    try:
        tree = TreeClock(parent.pid, relist_s=0)  # every read lists the tree: the burner is seen
        proc = psutil.Process(parent.pid)
        child_seen = 0.0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            total = tree.read()
            children = proc.children()
            if not children and total >= 0.3:
                break  # the burner is gone and its time stays in the tree's
            child_seen = max(child_seen, total)
            time.sleep(0.05)
        assert tree.read() >= 0.3 - 0.02  # one tick or two of resolution
        assert tree.read() >= child_seen  # never backwards
    finally:
        parent.kill()
        parent.wait()


def test_the_sampler_reads_the_worker_tree_and_the_machine():
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.4)])
    try:
        telemetry = HostTelemetry(burner.pid)
        while burner.poll() is None:  # sampled while it runs: a sample sees what it used so far
            telemetry.sample(0)
            time.sleep(0.05)
        s = telemetry.series
        worker = s["worker_cpu_s"][-1] - s["worker_cpu_s"][0]
        busy = s["busy_cpu_s"][-1] - s["busy_cpu_s"][0]
        assert worker > 0.2 and busy >= worker - 0.05  # the machine was busy at least with the worker
        assert len(s["sampler_cpu_s"]) == len(s["worker_cpu_s"]) == len(s["busy_cpu_s"])
    finally:
        burner.kill()
        burner.wait()


class _Scripted:
    """busy_cpu_s and the excluded tree's time, scripted per probe: others use `cores[i]` cores."""

    def __init__(self, monkeypatch, cores):
        self.cores, self.now, self.busy, self.reads = list(cores), 0.0, 0.0, 0
        monkeypatch.setattr(contention, "busy_cpu_s", lambda: self.busy)
        monkeypatch.setattr(contention.TreeClock, "read", lambda _self: 0.0)

    def clock(self):
        return self.now

    def sleep(self, s):
        self.busy += (self.cores.pop(0) if self.cores else 0.0) * s
        self.now += s


def test_quiet_wait_returns_once_the_others_fall_under_the_threshold(monkeypatch):
    script = _Scripted(monkeypatch, [2.0, 1.5, 0.05])
    out = wait_for_quiet(60, 2, 2, 10.0, probe_s=0.5, clock=script.clock, sleep=script.sleep)
    assert out["quiet"] and out["waited_s"] == pytest.approx(1.5) and out["contention_pct"] == pytest.approx(2.5)


def test_quiet_wait_gives_up_after_its_bound(monkeypatch):
    script = _Scripted(monkeypatch, [2.0] * 100)
    out = wait_for_quiet(2.0, 2, 2, 10.0, probe_s=0.5, clock=script.clock, sleep=script.sleep)
    assert not out["quiet"] and out["waited_s"] == pytest.approx(2.0) and out["contention_pct"] == 100.0


# --------------------------------------------------------------------------- the orchestrator's guard


def guarded(tmp_path, monkeypatch, contended: list[bool], **options):
    """An orchestrator whose repeats' contention is scripted (the sampler's figures are tested above)."""
    verdicts = iter(contended)

    def scripted(self, series, window, derived, waited):
        c = next(verdicts, False)
        return {"measured": True, "contended": c, "contention_pct": 80.0 if c else 1.0,
                "reason": "other processes used 80% of the worker's 1 cores" if c else None}

    monkeypatch.setattr(Orchestrator, "_contention", scripted)
    store = Store(tmp_path / "store")
    opts = RunOptions(device="cpu", env_backend="current", threads=1, repeats=2, timeout_s=60.0,
                      cache=tmp_path / "cache", **options)
    return store, Orchestrator(store, opts)


def test_a_contended_repeat_is_replaced_and_counted_nowhere(tmp_path, monkeypatch, suite, fake, fast_fake_runner):
    store, orch = guarded(tmp_path, monkeypatch, [False, True, False], max_replacements=3)
    rec = orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert [r.status for r in rec.repeats] == ["ok", "contended", "ok"]
    assert rec.repeats[1].iter_s and "replaced by a fresh repeat" in rec.repeats[1].reason  # kept, not counted
    assert rec.summary.repeats == 2 and len(rec.summary.repeat_medians_s) == 2
    policy = rec.repeat_policy
    assert policy.replaced == 1 and policy.max_replacements == 3 and policy.stopped == "fixed"
    [on_disk] = Store(store.root).records()
    assert [r.status for r in on_disk.repeats] == ["ok", "contended", "ok"]


def test_replacements_are_bounded_then_contended_repeats_are_only_marked(tmp_path, monkeypatch, suite, fake,
                                                                         fast_fake_runner):
    store, orch = guarded(tmp_path, monkeypatch, [True] * 10, max_replacements=2)
    rec = orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert [r.status for r in rec.repeats] == ["contended", "contended", "ok", "ok"]
    assert all(r.contention["contended"] for r in rec.repeats)  # the last two are marked, and counted
    assert rec.repeat_policy.replaced == 2 and rec.summary.repeats == 2


def test_without_replacements_nothing_changes_but_the_mark(tmp_path, monkeypatch, suite, fake, fast_fake_runner):
    store, orch = guarded(tmp_path, monkeypatch, [True, False])
    rec = orch.execute_one(plan([fake], [suite.benchmarks[0]])[0])
    assert [r.status for r in rec.repeats] == ["ok", "ok"] and rec.repeats[0].contention["contended"]
    assert rec.repeat_policy.replaced == 0 and rec.repeat_policy.max_replacements == 0
