"""TensorFlow runner: builds a resolved dlbench network with Keras 3 layers and times its steps.

Runs inside the tensorflow environment only. TensorFlow is imported in `configure_threads`, after
TF_CPP_MIN_LOG_LEVEL is set (tensorflow_network.py, imported first), and its thread pools are sized
there, before any op runs. The choices (layout, padding, flatten, batch norm, LSTM) are
tensorflow_network.py's, where the network is built; the train step is one tf.function (forward,
sparse softmax cross-entropy, gradient, Keras SGD update), XLA (jit_compile) when the request asks.
Precision float32, or float64 (for `dlbench check`): model and optimiser built under
`tn.precision_scope`, inputs cast to float64 once in prepare, weights exported as float64.
"""

from __future__ import annotations

import os

import tensorflow_network as tn
from contract import Kernel, Prepared
from tensorflow_network import load_keras, load_tf

INTER_OP_MAX = 2  # inter-op pool: min(threads, this)
PRECISIONS = ("float32", "float64")  # what `prepare` builds (the multi-worker step: float32 only)


def _default_parallelism() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class TensorFlowRunner:
    name = "tensorflow"

    def configure_threads(self, threads: int | None) -> dict:
        tf = load_tf()
        if threads:
            # must precede the first op (the eager context reads them when it starts)
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(min(threads, INTER_OP_MAX))
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
        # 0 means "TensorFlow decides": both pools then get one thread per schedulable CPU
        return {"requested": threads, "intra_op": intra or _default_parallelism(),
                "inter_op": inter or _default_parallelism(), "tf_setting": {"intra_op": intra, "inter_op": inter}}

    def framework_info(self, device: str) -> dict:
        tf, keras = load_tf(), load_keras()
        build = dict(tf.sysconfig.get_build_info())
        try:
            from tensorflow.python.util import _pywrap_util_port

            onednn = bool(_pywrap_util_port.IsMklEnabled())
        except Exception:  # noqa: BLE001 - private API; absent means unknown
            onednn = None
        devices = [{"type": "cpu"}]
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            cc = details.get("compute_capability")
            devices.append({"type": "cuda", "index": i, "name": details.get("device_name"),
                            "capability": f"{cc[0]}.{cc[1]}" if cc else None})
        return {
            "name": "tensorflow",
            "version": tf.__version__,
            "build": {
                "git": tf.version.GIT_VERSION,
                "compiler": tf.version.COMPILER_VERSION,
                "keras": keras.__version__,
                "keras_backend": keras.backend.backend(),
                "cuda_build": bool(build.get("is_cuda_build")),
                "rocm_build": bool(build.get("is_rocm_build")),
                "cuda": build.get("cuda_version"),
                "cudnn": build.get("cudnn_version"),
                "onednn": onednn,
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                "xla": tf.test.is_built_with_xla(),
            },
            "devices": devices,
        }

    def device_available(self, device: str) -> str | None:
        tf = load_tf()
        gpus = tf.config.list_physical_devices("GPU")
        if device == "cuda":
            if not gpus:
                return "CUDA requested but this TensorFlow build or host has no usable GPU"
            return None
        if gpus:  # a CPU benchmark on a GPU host: keep TensorFlow off the GPUs entirely
            try:
                tf.config.set_visible_devices([], "GPU")
            except RuntimeError:
                pass
        return None

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        from tensorflow_kernels import prepare_kernel  # the kernels suite (runners/tensorflow/tensorflow_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        import numpy as np

        tf, keras = load_tf(), load_keras()
        network = request["network"]
        cuda = request["device"] == "cuda"
        precision = tn.check_precision(request, PRECISIONS)
        float_dtype = getattr(tf, precision)
        keras.utils.set_random_seed(request.get("seed", 0))
        inp = network["input"]
        tokens, images, has_lstm = tn.input_kind(network)
        jit = bool(request.get("jit_compile", False))
        settings: dict = {"precision": precision, "data_format": "channels_last" if images else None,
                          "jit_compile_requested": jit}
        if jit and cuda and has_lstm:
            jit = False  # Keras' cuDNN LSTM kernel cannot be compiled by XLA
            settings["jit_compile_note"] = "disabled: the cuDNN LSTM kernel is not XLA-compatible"
        bn_floor = tn.set_batch_norm_floor(cuda)
        device = "/GPU:0" if cuda else "/CPU:0"

        with tf.device(device), tn.precision_scope(precision):
            model, per_layer, flatten_modes, permuted = tn.build_network(
                network, request.get("deterministic", False), precision)
            variables = tn.canonical_variables(network, per_layer, permuted)

            batch = request["batch_size"]
            if request.get("inputs"):
                with np.load(request["inputs"]) as data:
                    x_np, y_np = data["x"], data["y"]
                if images:  # canonical NCHW -> NHWC, once, outside the timed step
                    x_np = np.ascontiguousarray(x_np.transpose(0, 2, 3, 1))
                if not tokens and precision != "float32":  # float32 -> float64 is exact
                    x_np = x_np.astype(precision)
                x = tf.identity(tf.constant(x_np))
                y = tf.identity(tf.constant(y_np))
            elif tokens:
                shape = (batch, inp["sequence_length"])
                x = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
                y = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
            else:
                x = tf.random.normal(tn.sample_shape(network, batch), dtype=float_dtype)
                y = tf.random.uniform((batch,), 0, inp["classes"], dtype=tf.int64)

            def loss_of(labels, logits):
                return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.reshape(labels, [-1]), logits=tf.reshape(logits, [-1, logits.shape[-1]])))

            trainable = model.trainable_variables
            params = tn.count_params(trainable)
            optimizer = keras.optimizers.SGD(learning_rate=request["learning_rate"], momentum=request["momentum"])
            optimizer.build(trainable)

        def reset_optimizer():
            for m in optimizer.momentums:
                m.assign(tf.zeros_like(m))
            optimizer.iterations.assign(0)

        train = request["mode"] == "train"

        def forward_loss():
            with tf.device(device):
                logits = model(x, training=train)
                loss = loss_of(y, logits)
            return logits.numpy(), float(loss)

        if train:
            @tf.function(jit_compile=jit)
            def compiled(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_of(y, model(x, training=True))
                grads = tape.gradient(loss, trainable)
                optimizer.apply_gradients(zip(grads, trainable))
                return loss
        else:
            @tf.function(jit_compile=jit)
            def compiled(x, y):
                return model(x, training=False)

        last = []

        def step():
            with tf.device(device):
                last[:] = [compiled(x, y)]

        sync_devices = tf.test.experimental.sync_devices

        def synchronize():
            # GPU kernels run asynchronously: SyncDevice on every device + the eager executor's
            # async_wait blocks until everything queued (the whole step, updates included) is done.
            # On CPU the call returns computed tensors already; this costs microseconds.
            sync_devices()

        settings.update({
            "input_transpose": "NCHW->NHWC once in prepare" if images else None,
            "flatten": tn.describe_flatten(network["layers"], flatten_modes, permuted),
            "step": "tf.function" + (" (XLA)" if jit else ""),
            "jit_compile": jit,
            "batch_norm": (("keras BatchNormalization via FusedBatchNormV3" + (" (oneDNN)" if not cuda else " (cuDNN)"))
                           if precision == "float32" else
                           "keras BatchNormalization variables, unfused tf.nn.moments + tf.nn.batch_normalization "
                           "(FusedBatchNormV3 has no float64 kernel), running variance unbiased as the kernel's"),
            "batch_norm_epsilon_floor": bn_floor,
            "lstm": tn.lstm_setting(has_lstm, cuda),
            "loss": "sparse_softmax_cross_entropy_with_logits, mean",
            "optimizer": "keras.optimizers.SGD(momentum)",
            **({} if precision == "float32" else {
                "dtype_policy": f"keras.config.set_dtype_policy({precision!r}) + set_floatx({precision!r}) while "
                                "model and optimiser are built: variables, activations, gradients, running "
                                "statistics, momentum slots, learning rate and loss all " + precision}),
            **tn.thread_settings(),
        })
        output_shape = [int(d) for d in model.output_shape[1:]]
        return Prepared(step, synchronize, params, output_shape, settings,
                        export_weights=lambda: tn.export_weights(variables, precision),
                        load_weights=lambda arrays: tn.load_weights(variables, arrays, precision),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss)
