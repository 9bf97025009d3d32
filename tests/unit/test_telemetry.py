"""Telemetry without a process: the collector against the scripted NVML and a fake clock, derive()
against figures worked out by hand from the script, RAPL from a fake powercap tree, the config."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path

import pynvml
import pytest

from dlbench.machine import machine_capabilities
from dlbench.telemetry import TelemetryConfig, derive
from dlbench.telemetry.nvml import GpuTelemetry, clock_event_bits
from dlbench.telemetry.sampler import Collector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

import fake_pynvml  # noqa: E402

MS = 1_000_000
MIB = 2**20
BASE = 5_000_000 * MS  # the fake clock's first sample, on an arbitrary monotonic origin
IDLE, SW_POWER_CAP, HW_SLOWDOWN = (pynvml.nvmlClocksEventReasonGpuIdle, pynvml.nvmlClocksEventReasonSwPowerCap,
                                   pynvml.nvmlClocksEventReasonHwSlowdown)

# Eight samples, 100 ms apart (k = 0..7). The window [50 ms, 650 ms] holds k = 1..6.
WINDOW = (BASE + 50 * MS, BASE + 650 * MS)
WINDOW_S = 0.6
MODERN = {
    "static": {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0000", "power_limit_mw": 700_000, "max_sm_mhz": 1980,
               "max_mem_mhz": 2619, "memory_total": 80 * 1024 * MIB, "ecc": [1, 1], "persistence": 1},
    "frames": fake_pynvml.frames(
        power_mw=[100_000, 200_000, 300_000, 300_000, 250_000, 250_000, 150_000, 100_000],
        power_instant_mw=[90_000, 190_000, 310_000, 290_000, 260_000, 240_000, 140_000, 90_000],
        power_avg_mw=[100_000, 150_000, 200_000, 250_000, 260_000, 255_000, 230_000, 200_000],
        energy_mj=[1_000_000, 1_020_000, 1_050_000, 1_080_000, 1_105_000, 1_130_000, 1_150_000, 1_160_000],
        sm_mhz=[1980, 1980, 1755, 1755, 1410, 1410, 1980, 1980],
        mem_mhz=[2619] * 8, graphics_mhz=[1980, 1980, 1755, 1755, 1410, 1410, 1980, 1980],
        temp_c=[40, 45, 60, 70, 83, 85, 80, 90],  # the hottest sample (90) lies outside the window
        util_gpu=[0, 100, 100, 100, 100, 100, 100, 0], util_mem=[0, 60, 60, 60, 60, 60, 60, 0],
        mem_used=[m * MIB for m in (50_000, 1000, 2000, 3000, 3000, 2500, 2500, 100)],
        pstate=[8, 0, 0, 0, 0, 0, 0, 8], fan=[30] * 8,
        reasons=[IDLE, 0, SW_POWER_CAP, SW_POWER_CAP, SW_POWER_CAP | HW_SLOWDOWN, HW_SLOWDOWN, IDLE, IDLE]),
}
# An older GPU: no energy counter, no power fields, no ECC, and a driver without the renamed
# clock-event function; only nvmlDeviceGetPowerUsage gives power.
OLD = {
    "static": {"name": "Tesla P100", "uuid": "GPU-0001", "power_limit_mw": 250_000, "max_sm_mhz": 1480,
               "max_mem_mhz": 715, "memory_total": 16 * 1024 * MIB, "persistence": 0},
    "errors": {"nvmlDeviceGetEccMode": "NOT_SUPPORTED", "nvmlDeviceGetCurrentClocksEventReasons": "FUNCTION_NOT_FOUND"},
    "frames": fake_pynvml.frames(
        power_mw=[50_000, 200_000, 300_000, 300_000, 250_000, 250_000, 150_000, 50_000],
        sm_mhz=[1480] * 8, mem_mhz=[715] * 8, graphics_mhz=[1480] * 8, temp_c=[30, 40, 50, 60, 70, 75, 70, 60],
        util_gpu=[100] * 8, util_mem=[50] * 8, mem_used=[1000 * MIB] * 8, pstate=[0] * 8, fan=[40] * 8,
        reasons=[0, 0, HW_SLOWDOWN, 0, 0, 0, 0, 0]),
}


def script(monkeypatch, *devices, **extra) -> None:
    monkeypatch.setenv(fake_pynvml.ENV, json.dumps({"driver": "550.54.15", "cuda_driver": 12040,
                                                    "devices": list(devices), **extra}))


def collect(samples: int, config: TelemetryConfig, **kwargs) -> dict:
    """What the sampler process would send, sampled in this process at BASE + k * 100 ms."""
    clock = iter(BASE + k * 100 * MS for k in range(samples))
    collector = Collector(config, nvml_module="fake_pynvml", clock=clock.__next__, **kwargs)
    try:
        for _ in range(samples):
            collector.sample()
    finally:
        collector.close()
    return collector.result()


def assert_columns_aligned(result: dict) -> None:
    n = len(result["t_ns"])
    columns = [*result["cpu"]["series"].values(), *result["cpu"]["rapl"]["series"].values()]
    columns += [c for gpu in result["gpu"]["series"] for c in gpu.values()]
    assert n and columns and {len(c) for c in columns} == {n}


# --- the config -------------------------------------------------------------------------------

@pytest.mark.parametrize("interval", [0.009, 1.01, 0, -0.1, math.nan, "0.1", True, None])
def test_an_interval_outside_10_ms_to_1_s_is_refused(interval):
    with pytest.raises(ValueError, match="interval_s"):
        TelemetryConfig(interval_s=interval)


@pytest.mark.parametrize("interval", [0.01, 0.1, 1.0, 1])
def test_intervals_at_and_inside_the_bounds_are_accepted(interval):
    assert TelemetryConfig(interval_s=interval).interval_s == interval


def test_gpu_indices_become_a_tuple_and_bad_ones_are_refused():
    assert TelemetryConfig(gpu_indices=[1, 0]).gpu_indices == (1, 0)
    assert TelemetryConfig().gpu_indices is None and TelemetryConfig(gpu_indices=()).gpu_indices == ()
    for bad in ([-1], [0, 0], ["0"], [True]):
        with pytest.raises(ValueError, match="gpu_indices"):
            TelemetryConfig(gpu_indices=bad)
    with pytest.raises(FrozenInstanceError):
        TelemetryConfig().interval_s = 0.5


# --- NVML ---------------------------------------------------------------------------------------

def test_clock_event_names_come_from_the_bindings_constants():
    bits = clock_event_bits(pynvml)
    assert bits["gpu_idle"] == 0x1 and bits["sw_power_cap"] == 0x4 and bits["hw_slowdown"] == 0x8
    assert bits["hw_power_brake_slowdown"] == 0x80
    assert bits["board_limit"] == pynvml.nvmlClocksThrottleReasonBoardLimit  # only the older family has it
    assert "user_defined_clocks" not in bits  # a deprecated alias of applications_clocks_setting
    assert "none" not in bits and "all" not in bits
    assert sorted(bits.values()) == sorted(set(bits.values()))


def test_static_description_and_columns_of_a_modern_gpu(monkeypatch):
    script(monkeypatch, MODERN)
    result = collect(8, TelemetryConfig())
    gpu = result["gpu"]
    assert gpu["available"] and gpu["reason"] is None and gpu["requested"] is None
    static = gpu["static"][0]
    assert static == {"index": 0, "driver": "550.54.15", "cuda_driver": "12.4", "name": "NVIDIA H100 80GB HBM3",
                      "uuid": "GPU-0000", "power_limit_w": 700.0, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 2619,
                      "memory_total_bytes": 80 * 1024 * MIB, "ecc_mode": {"current": True, "pending": True},
                      "persistence_mode": True}
    series = gpu["series"][0]
    assert gpu["unsupported"] == [{}] and gpu["errors"] == [{}] and gpu["lost"] == [None]
    assert series["power_w"] == [100.0, 200.0, 300.0, 300.0, 250.0, 250.0, 150.0, 100.0]
    assert series["power_instant_w"][2] == 310.0 and series["power_avg_w"][3] == 250.0
    assert series["energy_mj"][-1] == 1_160_000 and series["sm_clock_mhz"][4] == 1410
    assert series["gpu_util_pct"][1] == 100 and series["mem_util_pct"][1] == 60 and series["pstate"][0] == 8
    assert series["clock_events"][4] == SW_POWER_CAP | HW_SLOWDOWN
    assert result["t_ns"] == [BASE + k * 100 * MS for k in range(8)]
    assert result["clock"] == "time.monotonic_ns" and result["error"] is None
    assert_columns_aligned(result)


def test_derive_from_the_energy_counter(monkeypatch):
    script(monkeypatch, MODERN)
    figures = derive(collect(8, TelemetryConfig()), WINDOW, iterations=60, batch_size=32)
    # Samples k = 1..6 lie inside; the first is 50 ms after the start, the last 50 ms before the end.
    assert figures["samples"] == 6 and figures["covered"] is True
    assert figures["edge_gaps_s"] == pytest.approx([0.05, 0.05])
    assert figures["window_s"] == pytest.approx(WINDOW_S)
    # Counter: 1_150_000 - 1_020_000 mJ = 130 J over the span 0.1 .. 0.6 s (0.5 s): 260 W.
    # Over the 0.6 s window: 260 W * 0.6 s = 156 J.
    assert figures["energy_source"] == "gpu" and figures["energy_method"] == "counter"
    assert figures["energy_j"] == pytest.approx(156.0)
    assert figures["avg_power_w"] == pytest.approx(260.0)
    assert figures["energy_per_iter_j"] == pytest.approx(156.0 / 60)
    assert figures["joules_per_sample"] == pytest.approx(156.0 / (60 * 32))
    assert figures["samples_per_joule"] == pytest.approx(60 * 32 / 156.0)
    # SM clock over k = 1..6: (1980 + 1755 + 1755 + 1410 + 1410 + 1980) / 6 = 10290 / 6 = 1715 MHz
    assert figures["mean_sm_clock_mhz"] == pytest.approx(1715.0)
    # Reasons over k = 1..6: -, SW, SW, SW|HW, HW, idle.
    # sw_power_cap 3/6, hw_slowdown 2/6, gpu_idle 1/6; any (idle left out) 4/6.
    throttled = figures["throttled_pct"]
    assert throttled["sw_power_cap"] == pytest.approx(50.0)
    assert throttled["hw_slowdown"] == pytest.approx(100 * 2 / 6)
    assert throttled["gpu_idle"] == pytest.approx(100 * 1 / 6)
    assert throttled["any"] == pytest.approx(100 * 4 / 6)
    assert throttled["hw_thermal_slowdown"] == 0.0
    # Peaks inside the window only: 85 C (not the 90 C of k = 7), 3000 MiB (not the 50000 of k = 0).
    assert figures["peak_temp_c"] == 85.0 and figures["peak_gpu_mem_mb"] == 3000.0
    (gpu,) = figures["gpus"]
    assert gpu["index"] == 0 and gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["samples"] == 6 and gpu["covered"]
    assert gpu["energy_j"] == pytest.approx(156.0) and gpu["missing"] == {}
    # This machine has no readable RAPL at the fake root, and that is said, not zeroed.
    assert figures["cpu_package_energy_j"] is None and "powercap" in figures["missing"]["cpu_package_energy_j"]
    assert figures["mean_cpu_util_pct"] is not None and "energy_j" not in figures["missing"]


def test_derive_integrates_power_where_there_is_no_counter(monkeypatch):
    instant_only = {"static": {"name": "A10"}, "frames": [
        {k: v for k, v in f.items() if k not in ("energy_mj", "power_avg_mw")} for f in MODERN["frames"]]}
    script(monkeypatch, OLD, instant_only)
    result = collect(8, TelemetryConfig())
    old_unsupported = result["gpu"]["unsupported"][0]
    assert old_unsupported["nvmlDeviceGetTotalEnergyConsumption"] == "Not Supported"
    assert old_unsupported["NVML_FI_DEV_POWER_AVERAGE"] == "Not Supported"
    assert old_unsupported["nvmlDeviceGetEccMode"] == "Not Supported"
    assert result["gpu"]["static"][0]["ecc_mode"] is None
    assert "energy_mj" not in result["gpu"]["series"][0] and "power_avg_w" not in result["gpu"]["series"][0]
    # the driver lacks ...ClocksEventReasons: the reasons came from ...ClocksThrottleReasons
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in old_unsupported
    assert result["gpu"]["series"][0]["clock_events"][2] == HW_SLOWDOWN
    assert_columns_aligned(result)

    figures = derive(result, WINDOW, iterations=60, batch_size=32)
    old, instant = figures["gpus"]
    # Old GPU, power_w at k = 1..6 (0.1 s apart): 200, 300, 300, 250, 250, 150 W.
    # Trapezoid: 0.1 * (200/2 + 300 + 300 + 250 + 250 + 150/2) = 0.1 * 1275 = 127.5 J over 0.5 s: 255 W,
    # over the 0.6 s window 153 J.
    assert old["energy_method"] == "integrated_power"
    assert old["energy_j"] == pytest.approx(153.0) and old["avg_power_w"] == pytest.approx(255.0)
    # Instant-only GPU integrates the instant field, not power_w: 190, 310, 290, 260, 240, 140 W:
    # 0.1 * (95 + 310 + 290 + 260 + 240 + 70) = 126.5 J over 0.5 s: 253 W, over 0.6 s 151.8 J.
    assert instant["energy_method"] == "integrated_power"
    assert instant["energy_j"] == pytest.approx(151.8)
    assert figures["energy_method"] == "integrated_power"
    assert figures["energy_j"] == pytest.approx(153.0 + 151.8)
    assert figures["avg_power_w"] == pytest.approx(255.0 + 253.0)
    assert old["throttled_pct"]["hw_slowdown"] == pytest.approx(100 / 6)
    # the top-level shares are the worst GPU's: the instant-only one has the modern trace's reasons
    assert figures["throttled_pct"]["hw_slowdown"] == pytest.approx(100 * 2 / 6)
    assert figures["peak_temp_c"] == 85.0  # old GPU peaked at 75 in the window


def test_an_older_binding_without_the_new_names_falls_back(monkeypatch):
    script(monkeypatch, MODERN,
           missing_from_binding=["nvmlDeviceGetCurrentClocksEventReasons", "NVML_FI_DEV_POWER_INSTANT"])
    result = collect(3, TelemetryConfig())
    assert result["gpu"]["series"][0]["clock_events"] == [IDLE, 0, SW_POWER_CAP]
    assert result["gpu"]["unsupported"][0] == {"NVML_FI_DEV_POWER_INSTANT": "Function Not Found"}


def test_a_gpu_lost_mid_window_keeps_its_samples_and_has_no_energy(monkeypatch):
    script(monkeypatch, {**MODERN, "lost_at_frame": 4})
    result = collect(8, TelemetryConfig())
    gpu = result["gpu"]
    assert gpu["lost"][0] == {"t_ns": BASE + 400 * MS, "reason": "nvmlDeviceGetPowerUsage: GPU is lost"}
    assert gpu["series"][0]["power_w"] == [100.0, 200.0, 300.0, 300.0, None, None, None, None]
    assert len(result["cpu"]["series"]["load_1m"]) == 8  # the rest goes on
    assert_columns_aligned(result)

    figures = derive(result, WINDOW, iterations=60, batch_size=32)
    (lost,) = figures["gpus"]
    assert lost["energy_j"] is None and lost["energy_method"] == "unavailable"
    assert lost["missing"]["energy_j"] == "GPU lost 0.350 s into the window: nvmlDeviceGetPowerUsage: GPU is lost"
    assert lost["samples"] == 3 and lost["covered"] is False
    assert lost["mean_sm_clock_mhz"] == pytest.approx((1980 + 1755 + 1755) / 3)  # what it did say still counts
    assert figures["energy_j"] is None and figures["joules_per_sample"] is None
    assert figures["missing"]["joules_per_sample"].startswith("GPU 0: GPU lost 0.350 s")


def test_a_failing_sample_is_a_gap_and_is_counted(monkeypatch):
    flaky = {**MODERN, "frames": [dict(f) for f in MODERN["frames"]]}
    flaky["frames"][2]["fail"] = {"nvmlDeviceGetTemperature": "UNKNOWN"}
    script(monkeypatch, flaky)
    result = collect(4, TelemetryConfig())
    assert result["gpu"]["series"][0]["temp_c"] == [40, 45, None, 70]
    assert result["gpu"]["errors"][0] == {"nvmlDeviceGetTemperature": {"count": 1, "last": "Unknown Error"}}


def test_a_gpu_index_nvml_does_not_have(monkeypatch):
    script(monkeypatch, MODERN)
    result = collect(2, TelemetryConfig(gpu_indices=(0, 3)))
    assert result["gpu"]["lost"][1] == {"t_ns": None, "reason": "nvmlDeviceGetHandleByIndex(3): Invalid Argument"}
    assert result["gpu"]["series"][1] == {}
    figures = derive(result, (BASE, BASE + 100 * MS), 1, 1)
    assert figures["gpus"][1]["missing"]["energy_j"].startswith("GPU lost before the window")


def test_nvml_without_its_library(monkeypatch):
    script(monkeypatch, MODERN, init_error="LIBRARY_NOT_FOUND")
    figures = derive(collect(4, TelemetryConfig()), (BASE, BASE + 300 * MS), 10, 8)
    assert figures["energy_j"] is None and figures["energy_method"] == "unavailable"
    # No GPU was sampled, so the energy is the CPU's: missing for RAPL's reason, not NVML's.
    assert figures["energy_source"] == "cpu"
    assert figures["missing"]["energy_j"] == figures["missing"]["cpu_package_energy_j"]
    assert figures["missing"]["peak_temp_c"] == "NVML: NVML Shared Library Not Found"
    assert figures["mean_cpu_util_pct"] is not None and figures["covered"]


def test_the_real_binding_on_this_machine(nvml_reason):
    expected = nvml_reason
    gpus = GpuTelemetry("pynvml", None)
    gpus.close()
    assert gpus.reason == expected and gpus.available == (expected is None)


def test_a_binding_that_cannot_be_imported():
    gpus = GpuTelemetry("no_such_nvml_binding", None)
    assert not gpus.available and gpus.reason.startswith("no_such_nvml_binding not importable: No module named")


def test_no_gpu_requested_never_touches_nvml(monkeypatch):
    monkeypatch.delenv(fake_pynvml.ENV, raising=False)  # the fake would raise if it were initialised
    result = collect(2, TelemetryConfig(gpu_indices=()))
    assert result["gpu"]["available"] is False and result["gpu"]["reason"] == "no GPU requested"
    assert result["gpu"]["requested"] == []


# --- derive() at the edges ------------------------------------------------------------------------

def test_samples_that_stop_short_of_the_window_do_not_cover_it(monkeypatch):
    script(monkeypatch, MODERN)
    result = collect(8, TelemetryConfig())
    # window 50 .. 900 ms: the last sample (700 ms) is 200 ms before the end, two intervals
    figures = derive(result, (BASE + 50 * MS, BASE + 900 * MS), 60, 32)
    assert figures["samples"] == 7 and figures["covered"] is False
    assert figures["edge_gaps_s"] == pytest.approx([0.05, 0.2])
    # a window between two samples has none: nothing is derived, and each figure says why
    figures = derive(result, (BASE + 110 * MS, BASE + 190 * MS), 60, 32)
    assert figures["samples"] == 0 and figures["covered"] is False and figures["edge_gaps_s"] is None
    assert figures["energy_j"] is None and figures["mean_cpu_util_pct"] is None
    assert "fewer than 2 readings" in figures["missing"]["energy_j"]
    assert figures["missing"]["mean_sm_clock_mhz"] == "GPU 0: no sample in the window"


def test_derive_of_a_failed_sampler_says_why_for_every_figure():
    failed = {"interval_s": 0.1, "clock": "time.monotonic_ns", "error": "telemetry sampler did not report ready"}
    figures = derive(failed, (0, 10**9), 10, 2)
    assert figures["energy_j"] is None and figures["peak_rss_mb"] is None
    assert figures["missing"]["energy_j"] == "no telemetry: telemetry sampler did not report ready"
    assert set(figures["missing"]) >= {"energy_j", "avg_power_w", "throttled_pct", "mean_cpu_util_pct"}


def test_derive_refuses_an_empty_window_and_no_work():
    with pytest.raises(ValueError, match="window"):
        derive({"interval_s": 0.1, "error": None}, (5, 5), 1, 1)
    with pytest.raises(ValueError, match="positive"):
        derive({"interval_s": 0.1, "error": None}, (0, 5), 0, 1)


# --- RAPL ---------------------------------------------------------------------------------------

def zone(root: Path, name: str, label: str, energy_uj: int | None, max_uj: int = 1_000_000_000) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(label + "\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    if energy_uj is None:
        (path / "energy_uj").mkdir()  # reads fail (IsADirectoryError): unreadable even as root
    else:
        (path / "energy_uj").write_text(f"{energy_uj}\n")
    return path


def test_rapl_energy_over_a_counter_wraparound(tmp_path):
    package = zone(tmp_path, "intel-rapl:0", "package-0", 999_000_000)
    zone(tmp_path, "intel-rapl:0:0", "core", 5)  # sampled neither as package nor as dram
    dram = zone(tmp_path, "intel-rapl:0:1", "dram", 100)
    collector = Collector(TelemetryConfig(gpu_indices=()), powercap_root=tmp_path,
                          clock=iter(BASE + k * 100 * MS for k in range(4)).__next__)
    readings = [(999_000_000, 100), (999_500_000, 200_100), (4_000_000, 400_100), (9_000_000, 600_100)]
    for package_uj, dram_uj in readings:
        (package / "energy_uj").write_text(f"{package_uj}\n")
        (dram / "energy_uj").write_text(f"{dram_uj}\n")
        collector.sample()
    result = collector.result()
    rapl = result["cpu"]["rapl"]
    assert rapl["available"] and rapl["reason"] is None and rapl["unreadable"] == []
    assert [d["name"] for d in rapl["domains"]] == ["package-0", "dram"]
    assert rapl["series"]["intel-rapl:0"] == [999_000_000, 999_500_000, 4_000_000, 9_000_000]
    assert_columns_aligned(result)

    figures = derive(result, (BASE - 20 * MS, BASE + 320 * MS), iterations=10, batch_size=4)
    # Package: 0.5 J, then a wrap: (1_000_000_000 - 999_500_000 + 4_000_000) uJ = 4.5 J, then 5 J:
    # 10 J over the 0.3 s span; over the 0.34 s window 10 / 0.3 * 0.34 J.
    assert figures["cpu_package_energy_j"] == pytest.approx(10 / 0.3 * 0.34)
    # DRAM: 0.6 J over 0.3 s, over the window 0.6 / 0.3 * 0.34 = 0.68 J.
    assert figures["cpu_dram_energy_j"] == pytest.approx(0.68)
    # A run without GPUs: its energy is the CPU's, package and DRAM.
    assert figures["energy_source"] == "cpu" and figures["energy_method"] == "counter"
    assert figures["energy_j"] == pytest.approx(10 / 0.3 * 0.34 + 0.68)
    assert figures["joules_per_sample"] == pytest.approx((10 / 0.3 * 0.34 + 0.68) / 40)


def test_unreadable_rapl_is_unavailable_with_the_reason(tmp_path):
    zone(tmp_path, "intel-rapl:0", "package-0", None)
    result = collect(3, TelemetryConfig(gpu_indices=()), powercap_root=tmp_path)
    rapl = result["cpu"]["rapl"]
    assert not rapl["available"] and "intel-rapl:0" in rapl["reason"] and "Is a directory" in rapl["reason"]
    figures = derive(result, (BASE, BASE + 200 * MS), 1, 1)
    assert figures["energy_j"] is None and "Is a directory" in figures["missing"]["energy_j"]
    assert derive(collect(3, TelemetryConfig(gpu_indices=()), powercap_root=tmp_path / "absent"),
                  (BASE, BASE + 200 * MS), 1, 1)["missing"]["cpu_package_energy_j"] \
        == f"no powercap interface at {tmp_path / 'absent'}"


def test_one_unreadable_package_spoils_the_package_sum(tmp_path):
    zone(tmp_path, "intel-rapl:0", "package-0", 10)
    zone(tmp_path, "intel-rapl:1", "package-1", None)
    result = collect(3, TelemetryConfig(gpu_indices=()), powercap_root=tmp_path)
    assert result["cpu"]["rapl"]["available"]
    figures = derive(result, (BASE, BASE + 200 * MS), 1, 1)
    assert figures["cpu_package_energy_j"] is None
    assert figures["missing"]["cpu_package_energy_j"].startswith("intel-rapl:1 (package-1): [Errno 21]")


# --- capabilities -----------------------------------------------------------------------------------

def test_machine_capabilities_with_the_scripted_gpus(monkeypatch, tmp_path):
    script(monkeypatch, MODERN, OLD)
    zone(tmp_path, "intel-rapl:0", "package-0", 10)
    zone(tmp_path, "intel-rapl:0:1", "dram", None)
    caps = machine_capabilities("fake_pynvml", powercap_root=tmp_path)
    gpu = caps["gpu"]
    assert gpu["available"] and gpu["driver"] == "550.54.15" and gpu["cuda_driver"] == "12.4"
    modern, old = gpu["devices"]
    assert modern["name"] == "NVIDIA H100 80GB HBM3" and modern["unsupported"] == {}
    assert "nvmlDeviceGetTotalEnergyConsumption" in modern["supported"]
    assert "NVML_FI_DEV_POWER_INSTANT" in modern["supported"]
    assert old["unsupported"]["nvmlDeviceGetTotalEnergyConsumption"] == "Not Supported"
    assert old["unsupported"]["nvmlDeviceGetEccMode"] == "Not Supported"
    assert "nvmlDeviceGetCurrentClocksEventReasons" in old["supported"]  # through the older function
    rapl = caps["rapl"]
    assert rapl["available"] and [(z["zone"], z["readable"]) for z in rapl["zones"]] == \
        [("intel-rapl:0", True), ("intel-rapl:0:1", False)]
    assert "Is a directory" in rapl["zones"][1]["reason"]
    cpu = caps["cpu"]
    assert cpu["model"] and cpu["logical_cores"] >= 1 and cpu["available_cores"] >= 1
    assert cpu["frequency_mhz"] is not None or cpu["frequency_reason"]


def test_machine_capabilities_here_with_the_real_binding(tmp_path):
    caps = machine_capabilities(powercap_root=tmp_path / "none")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        assert caps["gpu"] == {"available": False, "reason": f"NVML: {e}", "devices": []}
    else:
        pynvml.nvmlShutdown()
        assert caps["gpu"]["available"] and caps["gpu"]["devices"]
    assert caps["rapl"] == {"available": False, "reason": f"no powercap interface at {tmp_path / 'none'}", "zones": []}
