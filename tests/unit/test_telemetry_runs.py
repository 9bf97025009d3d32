"""Telemetry wired into runs: the sampler is up before the worker starts, follows its pid, and every
record carries its samples, the figures for each measured window and the run's summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import Orchestrator, RunOptions, plan
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store
from dlbench.telemetry import TelemetryConfig
from dlbench.telemetry.summary import summarise_repeats

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap


@pytest.fixture
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


@pytest.fixture
def fcn5_train():
    suite = SuiteCatalog(ROOT / "suites").load_suite(ROOT / "suites" / "fcn.yaml", "smoke", "cpu")
    return next(b for b in suite.benchmarks if b.name == "fcn5-train")


@pytest.fixture(autouse=True)
def slow_enough_steps(monkeypatch):
    # 5 measured steps of 30 ms: a window of ~150 ms that a 20 ms sampler must cover.
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.03")
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)


def _run(tmp_path, fake, bench, telemetry, nvml_module="pynvml", repeats=2):
    store = Store(tmp_path / "store")
    options = RunOptions(device="cpu", env_backend="current", threads=1, repeats=repeats, timeout_s=60,
                         cache=tmp_path / "cache", telemetry=telemetry, nvml_module=nvml_module)
    return Orchestrator(store, options).execute_one(plan([fake], [bench])[0])


def test_monitor_is_ready_before_the_worker_and_follows_its_pid(fake, fcn5_train):
    events = []

    class Monitor:
        def __enter__(self):
            events.append("enter")
            return self

        def __exit__(self, *exc):
            events.append("exit")

        def watch(self, pid):
            events.append(("watch", pid))

    from dlbench.execution.orchestrator import PlannedRun, build_request
    request = build_request(PlannedRun(fake, fcn5_train, 4),
                            RunOptions("cpu", "current", 1, 1, 60, Path("/nonexistent")))
    outcome = run_worker(Path(sys.executable), fake.worker, request, 60, monitor=Monitor())
    assert outcome.status == "ok"
    assert events[0] == "enter" and events[-1] == "exit" and events[1][0] == "watch"
    assert len(events) == 3 and isinstance(events[1][1], int) and events[1][1] > 0


def test_cpu_host_records_cpu_samples_over_every_window_and_why_gpu_is_missing(tmp_path, fake, fcn5_train,
                                                                            nvml_reason):
    reason = nvml_reason
    if reason is None:
        pytest.skip("this host has NVML; the fake-NVML test below covers GPU sampling")
    record = _run(tmp_path, fake, fcn5_train, TelemetryConfig(interval_s=0.02, gpu_indices=None))
    assert record.status == "ok"
    assert record.telemetry["enabled"] is True
    assert record.telemetry["gpu"] == {"available": False, "reason": reason}
    for rep in record.repeats:
        start, end = rep.window_monotonic_ns
        t = rep.telemetry["t_ns"]
        assert t[0] <= start and t[-1] >= end  # sampling spans the whole measured window
        assert rep.derived["covered"] is True and rep.derived["samples"] >= 3
        cpu = rep.telemetry["cpu"]["series"]
        assert all(len(col) == len(t) for col in cpu.values())
        assert max(r for r in cpu["rss_bytes"] if r is not None) > 1 * MIB  # the worker was followed
    summary = record.telemetry["summary"]
    assert summary["covered"] is True and summary["peak_mem_mb"] > 1
    assert summary["mean_sm_clock_mhz"] is None and summary["missing"]["mean_sm_clock_mhz"] == reason
    # Persisted and read back like everything else.
    back = next(Store(tmp_path / "store").records())
    assert back.telemetry == record.telemetry and back.repeats[0].derived == record.repeats[0].derived


def test_fake_gpu_figures_reach_the_record(tmp_path, monkeypatch, fake, fcn5_train):
    """A constant 200 W, 1500 MHz, power-capped GPU without an energy counter (integrated power)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fixtures"))  # spawn gives the sampler our sys.path
    trace = {"driver": "550.54.15", "cuda_driver": 12040, "devices": [{
        "static": {"name": "Fake GPU", "uuid": "GPU-fake", "power_limit_mw": 300_000, "max_sm_mhz": 1980,
                   "max_mem_mhz": 2619, "memory_total": 80 * 1024 * MIB, "ecc": [0, 0], "persistence": 1},
        "frames": [{"power_mw": 200_000, "sm_mhz": 1500, "mem_mhz": 2619, "graphics_mhz": 1500, "temp_c": 61,
                    "util_gpu": 100, "util_mem": 50, "mem_used": 3000 * MIB, "pstate": 0, "fan": 40,
                    "reasons": SW_POWER_CAP}]}]}
    monkeypatch.setenv("DLBENCH_FAKE_NVML", json.dumps(trace))
    record = _run(tmp_path, fake, fcn5_train, TelemetryConfig(interval_s=0.02), nvml_module="fake_pynvml")
    assert record.status == "ok"
    assert record.telemetry["gpu"] == {"available": True, "reason": None}
    s = record.telemetry["summary"]
    windows = [(r.window_monotonic_ns[1] - r.window_monotonic_ns[0]) / 1e9 for r in record.repeats]
    samples = record.workload.batch_size * sum(len(r.iter_s) for r in record.repeats)
    assert s["energy_method"] == "integrated_power"
    assert s["avg_power_w"] == pytest.approx(200.0)
    assert s["energy_j"] == pytest.approx(200.0 * sum(windows))
    assert s["joules_per_sample"] == pytest.approx(200.0 * sum(windows) / samples)
    assert s["mean_sm_clock_mhz"] == pytest.approx(1500.0)
    assert s["throttled_pct"] == pytest.approx(100.0)
    assert s["peak_temp_c"] == 61 and s["peak_mem_mb"] == pytest.approx(3000.0)


def test_no_telemetry_records_why(tmp_path, fake, fcn5_train):
    record = _run(tmp_path, fake, fcn5_train, None, repeats=1)
    assert record.telemetry == {"enabled": False, "reason": "--no-telemetry"}
    assert record.repeats[0].telemetry is None and record.repeats[0].derived is None


def _derived(window_s, energy, clock, throttled, peak_rss, samples=5):
    return {"window_s": window_s, "covered": True, "samples": samples, "energy_j": energy,
            "energy_method": "counter", "mean_sm_clock_mhz": clock, "throttled_pct": {"any": throttled},
            "peak_temp_c": 70, "peak_gpu_mem_mb": None, "peak_rss_mb": peak_rss, "mean_cpu_util_pct": 50.0,
            "mean_steal_pct": 1.0, "missing": {}}


def test_summarise_repeats_by_hand():
    s = summarise_repeats([_derived(1.0, 100.0, 1000.0, 0.0, 10.0), _derived(3.0, 500.0, 2000.0, 40.0, 30.0)],
                          batch_size=8, iterations=[10, 30])
    assert s["energy_j"] == 600.0
    assert s["avg_power_w"] == 600.0 / 4.0
    assert s["joules_per_sample"] == 600.0 / (8 * 40)
    assert s["samples_per_joule"] == (8 * 40) / 600.0
    assert s["mean_sm_clock_mhz"] == (1000.0 * 1 + 2000.0 * 3) / 4  # weighted by window length
    assert s["throttled_pct"] == (0.0 * 1 + 40.0 * 3) / 4
    assert s["peak_mem_mb"] == 30.0 and s["samples"] == 10 and s["covered"] is True


def test_summarise_repeats_never_sums_part_of_the_energy():
    missing = _derived(3.0, None, 2000.0, 0.0, 30.0)
    missing["missing"] = {"energy_j": "RAPL unreadable"}
    s = summarise_repeats([_derived(1.0, 100.0, 1000.0, 0.0, 10.0), missing], batch_size=8, iterations=[10, 30])
    assert s["energy_j"] is None and s["joules_per_sample"] is None
    assert s["missing"]["joules_per_sample"] == "RAPL unreadable"


def test_cli_validates_the_sample_interval(tmp_path):
    for bad in ("5", "1001"):
        result = CliRunner().invoke(app, ["run", "--no-check", "--suite", "fcn", "--framework", "torch", "--device", "cpu",
                                          "--sample-interval", bad, "--store", str(tmp_path)])
        assert result.exit_code == 2
        assert "sample-interval" in result.output + result.stderr
    assert not (tmp_path / "runs").exists()
