"""TensorFlow and Keras for the TensorFlow runner, imported on first use (`load_tf()`,
`load_keras()`): the runner's thread configuration (runner.py `configure_threads`) must precede
TensorFlow's first op, and TF_CPP_MIN_LOG_LEVEL must be set before TensorFlow is imported, so every
module of the runner imports this one first and reaches TensorFlow only through it."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere


def load_tf():
    """The tensorflow module (imported on first use)."""
    import tensorflow as tf

    return tf


def load_keras():
    """The keras module (imported on first use)."""
    import keras

    return keras


def device_of(cuda: bool) -> str:
    """The one device a single-process run places its ops on: GPU:0, or the CPU."""
    return "/GPU:0" if cuda else "/CPU:0"


def thread_settings() -> dict:
    tf = load_tf()
    return {"inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}


def memory_peak(cuda: bool) -> dict:
    """The BFC allocator's peak since the end of prepare on the GPU; on the CPU, why there is none."""
    tf = load_tf()
    if cuda:
        info = tf.config.experimental.get_memory_info("GPU:0")
        return {"peak_allocated_bytes": int(info["peak"]), "peak_reserved_bytes": None,
                "source": "tf.config.experimental.get_memory_info('GPU:0')['peak'] (peak in use since "
                          "tf.config.experimental.reset_memory_stats at the end of prepare; TensorFlow reports "
                          "no reserved size)"}
    # The CPU device's allocator keeps statistics where TensorFlow turns oneDNN's custom operations on
    # (its default on AVX-512 CPUs: three live 64 MiB tensors read as 192 MiB current, 256 MiB peak);
    # elsewhere the call raises
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
    except Exception as e:  # noqa: BLE001 - without those statistics TensorFlow raises
        return {"unavailable": f"tf.config.experimental.get_memory_info('CPU:0') raises {type(e).__name__}: {e}"}
    if not info.get("peak"):  # a step allocates something: a zero is a device whose tensors it did not count
        return {"unavailable": f"tf.config.experimental.get_memory_info('CPU:0') reports {dict(info)}: the step's "
                               "tensors were not counted by the allocator it reads"}
    return {"peak_allocated_bytes": int(info["peak"]), "peak_reserved_bytes": None,
            "source": "tf.config.experimental.get_memory_info('CPU:0')['peak']"}
