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


def thread_settings() -> dict:
    tf = load_tf()
    return {"inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}
