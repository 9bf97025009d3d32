"""JAX itself, loaded lazily: the jax module (and flax.linen, jax.numpy) on first use, the device
of a run by its name, and what the device's allocator reports.

Nothing that starts threads (jax, flax, numpy) is imported at module level, here or in any module
of this runner: the runner restricts the CPU affinity first (runner.py, configure_threads), and
XLA:CPU sizes its thread pools from it when jax is first imported.
"""

from __future__ import annotations

import os


def load_jax():
    """The jax module (imported on first use)."""
    import jax

    return jax


def load_linen():
    """flax.linen (imported on first use)."""
    import flax.linen as nn

    return nn


def load_jnp():
    """jax.numpy (imported on first use)."""
    import jax.numpy as jnp

    return jnp


def device_of(device: str):
    """The jax device a run on `device` ("cuda" or "cpu") uses: the first GPU, else the CPU."""
    jax = load_jax()
    return jax.devices("gpu")[0] if device == "cuda" else jax.devices("cpu")[0]


def device_memory(dev) -> dict:
    """The allocator's peak on `dev` (jax.Device.memory_stats()), or why there is none."""
    stats = dev.memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return {"unavailable": f"jax: {dev.platform} device {dev.device_kind!r} memory_stats() returns "
                               f"{'None' if stats is None else sorted(stats)} (XLA:CPU's allocator keeps no statistics)"}
    reserved_key = next((k for k in ("peak_pool_bytes", "peak_bytes_reserved") if stats.get(k)), None)
    return {"peak_allocated_bytes": int(stats["peak_bytes_in_use"]),
            "peak_reserved_bytes": int(stats[reserved_key]) if reserved_key else None,
            "source": f"jax.Device.memory_stats(): peak_bytes_in_use, {reserved_key or 'no reserved peak'}",
            "bytes_limit": stats.get("bytes_limit"),
            "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default (true)"),
            "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default (bfc)")}
