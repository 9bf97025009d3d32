"""Telemetry beside a benchmark: GPU power, clocks, throttling and energy through NVML, host CPU,
memory and RAPL energy through psutil and powercap, sampled in a process of its own on the
controller's side (it never imports a framework), and the figures derived for a measured window.

    with Sampler(TelemetryConfig(interval_s=0.1, gpu_indices=(0,)), pid=worker_pid) as sampler:
        ...                                    # the worker runs and marks its window
    figures = derive(sampler.result, window_ns, iterations, batch_size)
"""

from .derive import derive
from .sampler import Sampler, TelemetryConfig

__all__ = ["Sampler", "TelemetryConfig", "derive"]
