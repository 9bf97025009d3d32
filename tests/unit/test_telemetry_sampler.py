"""The Sampler as it runs: its own spawned process, the handshake, the schedule, the stop, and
every way it can fail without taking the caller down. The scripted NVML (tests/fixtures) reaches
the child by name: spawn gives it this process's sys.path and environment."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pynvml
import pytest

from dlbench.telemetry import Sampler, TelemetryConfig, derive
from dlbench.telemetry import sampler as sampler_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

import fake_pynvml  # noqa: E402

MIB = 2**20
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
# The GPU answers six samples (frames 0..5), then is lost.
GPU = {"static": {"name": "NVIDIA H100", "uuid": "GPU-1"}, "lost_at_frame": 6,
       "frames": fake_pynvml.frames(power_mw=[100_000 + 10_000 * k for k in range(6)],
                                    energy_mj=[1000 * k for k in range(6)], sm_mhz=[1980] * 6, temp_c=[50] * 6,
                                    reasons=[0, 0, SW_POWER_CAP, SW_POWER_CAP, 0, 0])}


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"driver": "550.54.15", "cuda_driver": 12040, "devices": [GPU]}))


@pytest.fixture
def worker():
    """A real process with a known resident size (40 MB it has written to), standing in for a worker."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(40 * 2**20); "
                             "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    yield proc
    proc.kill()
    proc.wait()


def gone(pid: int | None) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sampling_in_its_own_process_from_handshake_to_stop(scripted, worker):
    interval = 0.02
    before = time.monotonic_ns()
    with Sampler(TelemetryConfig(interval_s=interval), pid=worker.pid, nvml_module="fake_pynvml") as sampler:
        ready = time.monotonic_ns()
        child = psutil.Process(sampler.process_pid)
        assert child.pid != psutil.Process().pid and child.is_running()
        cpu_before = sum(child.cpu_times()[:2])
        time.sleep(0.6)
        cpu_used = sum(child.cpu_times()[:2]) - cpu_before
    after = time.monotonic_ns()
    assert gone(sampler.process_pid)
    result = sampler.result
    assert result["error"] is None and result["clock"] == "time.monotonic_ns" and result["interval_s"] == interval

    t = np.array(result["t_ns"])
    # one clock with this process: the first sample precedes the ready handshake, the last one the stop
    assert before < t[0] < ready and t[-1] < after and np.all(np.diff(t) > 0)
    assert len(t) >= 18  # 0.6 s at 20 ms, with room for a slow machine
    # drift-free: samples sit just after the ticks t0 + k * interval (the last one was taken at stop);
    # a sampler that waited an interval after each sample would drift through the whole 20 ms
    phase_ms = ((t[1:-1] - t[0]) % round(interval * 1e9)) / 1e6
    assert np.median(phase_ms) < 8, phase_ms
    # waiting is a poll on the pipe, not a spin: the sampler used a fraction of the 0.6 s it ran
    assert cpu_used < 0.3, cpu_used

    gpu = result["gpu"]
    columns = [*gpu["series"][0].values(), *result["cpu"]["series"].values()]
    assert {len(c) for c in columns} == {len(t)}
    assert gpu["series"][0]["power_w"][:6] == [100.0, 110.0, 120.0, 130.0, 140.0, 150.0]
    assert set(gpu["series"][0]["power_w"][6:]) == {None}
    assert gpu["lost"][0] == {"t_ns": result["t_ns"][6], "reason": "nvmlDeviceGetPowerUsage: GPU is lost"}
    assert gpu["unsupported"][0]["nvmlDeviceGetFanSpeed"] == "Not Supported"
    rss = result["cpu"]["series"]["rss_bytes"]
    assert None not in rss and min(rss) > 40 * MIB and result["cpu"]["rss_stopped"] is None
    cores = psutil.cpu_count()
    assert all(len(row) == cores for row in result["cpu"]["series"]["util_pct_per_core"])

    # the energy counter over samples 1..4 (1000 mJ apart, one interval each): 3 J in 3 intervals
    window = (result["t_ns"][1], result["t_ns"][4])
    figures = derive(result, window, iterations=3, batch_size=1)
    assert figures["energy_method"] == "counter" and figures["energy_j"] == pytest.approx(3.0)
    assert figures["throttled_pct"]["sw_power_cap"] == pytest.approx(50.0)
    assert figures["peak_rss_mb"] > 40


def test_real_nvml_here_cpu_samples_cover_a_marked_window(nvml_reason):
    reason = nvml_reason
    if reason is None:
        pytest.skip("this machine has NVML; the scripted tests cover sampling it")
    with Sampler(TelemetryConfig(interval_s=0.05)) as sampler:
        start = time.monotonic_ns()
        time.sleep(0.3)
        end = time.monotonic_ns()
    result = sampler.result
    assert result["error"] is None
    assert result["gpu"]["available"] is False and result["gpu"]["reason"] == reason
    figures = derive(result, (start, end), iterations=10, batch_size=8)
    assert figures["covered"] is True and figures["samples"] >= 5
    assert 0 <= figures["mean_cpu_util_pct"] <= 100
    assert figures["energy_source"] == "cpu"  # no GPU sampled: RAPL's energy, or its reason
    if figures["energy_j"] is None:
        assert figures["missing"]["energy_j"] == figures["missing"]["cpu_package_energy_j"]
    assert figures["missing"]["peak_temp_c"] == reason
    assert figures["peak_rss_mb"] is None and figures["missing"]["peak_rss_mb"] == "no worker pid given"


def test_a_worker_that_exits_ends_its_memory_column():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with Sampler(TelemetryConfig(interval_s=0.02, gpu_indices=()), pid=proc.pid) as sampler:
        time.sleep(0.1)
        proc.stdin.close()  # the worker ends, and stays a zombie until it is reaped
        deadline = time.monotonic() + 5
        while not gone(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # a few samples of the zombie
        proc.wait()
        time.sleep(0.05)
    cpu = sampler.result["cpu"]
    stopped = cpu["rss_stopped"]
    assert stopped is not None
    assert stopped["reason"] == f"worker pid {proc.pid}: PID still exists but it's a zombie (pid={proc.pid})"
    rss = cpu["series"]["rss_bytes"]
    first_gap = rss.index(None)
    assert first_gap > 0 and set(rss[first_gap:]) == {None} and None not in rss[:first_gap]
    assert sampler.result["t_ns"][first_gap] == stopped["t_ns"]


def test_a_sampler_that_never_gets_ready_is_killed_and_reported(monkeypatch):
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"init_sleep_s": 30, "devices": []}))
    monkeypatch.setattr(sampler_module, "READY_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with Sampler(TelemetryConfig(), nvml_module="fake_pynvml") as sampler:
        pass
    assert time.monotonic() - started < 10
    assert sampler.result == {"interval_s": 0.1, "clock": "time.monotonic_ns",
                              "error": "telemetry sampler did not report ready within 0.5 s"}
    assert gone(sampler.process_pid)


def test_a_sampler_stuck_in_a_sample_is_killed_at_stop(monkeypatch):
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"devices": [{**GPU, "hang_at_frame": 2}]}))
    monkeypatch.setattr(sampler_module, "STOP_TIMEOUT_S", 0.5)
    with Sampler(TelemetryConfig(interval_s=0.02), nvml_module="fake_pynvml") as sampler:
        time.sleep(0.1)  # the sampler is now stuck in its third sample
    assert sampler.result == {"interval_s": 0.02, "clock": "time.monotonic_ns",
                              "error": "telemetry sampler did not send its result within 0.5 s"}
    assert gone(sampler.process_pid)


def test_a_sampler_that_raises_is_reported_with_its_traceback(monkeypatch):
    monkeypatch.delenv(fake_pynvml.ENV, raising=False)  # the fake binding refuses to start without a script
    with Sampler(TelemetryConfig(), nvml_module="fake_pynvml") as sampler:
        pass
    result = sampler.result
    assert result["error"] == ("telemetry sampler failed: "
                               "RuntimeError: fake_pynvml needs its trace in $DLBENCH_FAKE_NVML")
    assert "Traceback" in result["traceback"]
    assert derive(result, (0, 10**9), 1, 1)["missing"]["energy_j"].startswith("no telemetry: telemetry sampler failed")
    assert gone(sampler.process_pid)


def test_an_error_in_the_body_still_stops_the_sampler(scripted):
    sampler = Sampler(TelemetryConfig(interval_s=0.02), nvml_module="fake_pynvml")
    with pytest.raises(KeyError):
        with sampler:
            raise KeyError("benchmark failed")
    assert gone(sampler.process_pid)
    assert sampler.result["error"] is None and len(sampler.result["t_ns"]) >= 2
    with pytest.raises(RuntimeError, match="once"):
        sampler.__enter__()
