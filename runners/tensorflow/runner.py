"""TensorFlow runner: builds a resolved dlbench network with Keras 3 layers and times its steps.

Runs inside the tensorflow environment only. TensorFlow is imported in `configure_threads`, after
TF_CPP_MIN_LOG_LEVEL is set (framework.py, imported first), and its thread pools are sized
there, before any op runs. The choices (layout, padding, flatten, batch norm, LSTM) are
layers.py's, transformer.py's and precision.py's; step.py builds the network; the train step is one tf.function (forward,
sparse softmax cross-entropy, or for a masked_tokens input (BERT) the masked-LM plus next-sentence
cross-entropies, gradient, Keras SGD update).

Compile (the request's `compile`): `eager`, the runner's default (runner.toml [execution]), is that
tf.function as a TensorFlow graph run by TF's executor, without XLA; `compiled` is the same
tf.function with jit_compile=True, the whole step compiled by XLA. A network with a layer Keras
marks as not XLA-compatible (supports_jit False: the cuDNN LSTM kernel on a GPU) is skipped under
`compiled`, never run un-jitted under that label.

Precision (runners/common/contract.py): fp32 / tf32 pin TensorFlow's TF32 switch off / on and read
it back (tf32 is skipped off an NVIDIA GPU of compute capability >= 8.0); amp_bf16 / amp_fp16 build
model and optimiser under Keras' mixed policy (`precision_scope`), amp_fp16 with
keras.optimizers.LossScaleOptimizer (dynamic loss scale); float64 (for `dlbench check`): everything
float64, inputs cast once in prepare, weights exported as float64. The dtypes a real forward pass
gives (the first layer's output, the logits) are recorded with the flags.

A network with attention records in settings["attention"] which of keras.layers.MultiHeadAttention's
paths ran (keras.ops.dot_product_attention, or its own einsum path where the layer has dropout), the
flash_attention argument it passed, and the TensorFlow ops of one trace of it.
"""

from __future__ import annotations

import os

from runners.common.contract import CHECK_PRECISION, COMPILE_MODES, KERNEL_PRECISION, Kernel, Prepared
from runners.common.protocol import Skip
from runners.tensorflow.attention import attention_setting
from runners.tensorflow.framework import device_of, load_keras, load_tf, memory_peak, thread_settings
from runners.tensorflow.layers import set_batch_norm_floor
from runners.tensorflow.precision import (ACCEPTED, KERAS_POLICY, MIXED, float32_math, precision_scope,
                                          request_precision, storage_dtype, tf32_unavailable)
from runners.tensorflow.step import (build_network, compiled_step, count_params, describe_flatten, input_kind,
                                     logits_of, loss_function, lstm_setting, output_shape, sgd_with_loss_scaling,
                                     step_batch)
from runners.tensorflow.weights import canonical_variables, export_weights, load_weights

INTER_OP_MAX = 2  # inter-op pool: min(threads, this)
DEFAULT_COMPILE = "eager"  # runner.toml [execution] compile: what runs when a request names no mode
COMPILE_FRAMEWORK = {
    "eager": "tf.function(jit_compile=False): the step traced once into a TensorFlow graph, run op by op by "
             "TF's executor (no XLA)",
    "compiled": "tf.function(jit_compile=True): the whole step (forward, loss, gradient, optimiser update) "
                "compiled by XLA",
}


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
        from runners.tensorflow.kernels import prepare_kernel  # the kernels suite (runners/tensorflow/kernels.py)

        # a float32 kernel is IEEE float32, as an fp32 run's layers are (TensorFlow allows TF32 by default)
        flags = float32_math(KERNEL_PRECISION[spec["dtype"]])
        kernel = prepare_kernel(spec, device)
        kernel.settings["precision_effective"] = flags
        return kernel

    def prepare_generation(self, request: dict):
        """Mode generate: the network's Keras layers decoded with a keras_hub-style cache in
        tf.function steps, XLA-compiled under `compiled` (generate.py)."""
        from runners.tensorflow.generate import prepare_generation

        cuda = request["device"] == "cuda"
        precision = request_precision(request, ACCEPTED)
        if precision not in ("fp32", "tf32", CHECK_PRECISION):
            raise Skip(f"generate: the tensorflow runner generates in fp32, tf32 and the check's float64, not "
                       f"{precision}")
        if precision == "tf32":
            why_not = tf32_unavailable(cuda)
            if why_not:
                raise Skip(why_not)
        mode, asked = compile_choice(request)
        settings: dict = {"precision_effective": float32_math(precision),
                          "compile": {"mode": mode, "requested": asked,
                                      "framework": f"tf.function(jit_compile={mode == 'compiled'}) of the prefill and "
                                                   "of the decode step" + (": XLA" if mode == "compiled" else
                                                                           ": TensorFlow graphs, no XLA")}}
        generator = prepare_generation(request, mode == "compiled", precision, device_of(cuda), settings)
        generator.memory = lambda: memory_peak(cuda)
        if cuda:
            load_tf().config.experimental.reset_memory_stats("GPU:0")
        return generator

    def prepare_convergence(self, request: dict):
        from runners.tensorflow.convergence import prepare_convergence  # the convergence suite (convergence.py)

        return prepare_convergence(request)

    def prepare(self, request: dict) -> Prepared:
        tf, keras = load_tf(), load_keras()
        network = request["network"]
        cuda = request["device"] == "cuda"
        precision = request_precision(request, ACCEPTED)
        mode, asked = compile_choice(request)
        jit = mode == "compiled"
        if precision == "tf32":
            why_not = tf32_unavailable(cuda)
            if why_not:
                raise Skip(why_not)
        storage = storage_dtype(precision)
        keras.utils.set_random_seed(request.get("seed", 0))
        _, images, has_lstm = input_kind(network)
        settings: dict = {"precision": precision, "precision_effective": float32_math(precision),
                          "data_format": "channels_last" if images else None}
        bn_floor = set_batch_norm_floor(cuda)
        device = device_of(cuda)

        with tf.device(device), precision_scope(precision):
            model, per_layer, flatten_modes, permuted = build_network(
                network, request.get("deterministic", False), precision)
            variables = canonical_variables(network, per_layer, permuted)
            if jit:
                no_xla = [layer for layer in model.layers if not getattr(layer, "supports_jit", True)]
                if no_xla:
                    raise Skip("compiled: XLA cannot compile this step: " + ", ".join(
                        f"{type(layer).__name__} {layer.name!r}" for layer in no_xla)
                        + (" runs the cuDNN LSTM kernel (CudnnRNNV3), which is not XLA-compatible"
                           if any(isinstance(layer, keras.layers.LSTM) for layer in no_xla) else
                           " is marked not XLA-compatible by Keras") + " (Keras sets supports_jit=False)")

            x, y = step_batch(request, network, storage)
            loss_of, loss_setting = loss_function(network)  # (labels, the model's output) -> mean loss

            trainable = model.trainable_variables
            params = count_params(trainable)
            sgd, optimizer, scaled = sgd_with_loss_scaling(request["learning_rate"], request["momentum"], precision)
            optimizer.build(trainable)
            # the dtypes of a real forward pass (one sample, inference mode: no state changes)
            probe = x[:1]
            first_dtype = model.layers[0](probe, training=False).dtype.name
            logits_dtype = logits_of(model(probe, training=False)).dtype.name

            attention = attention_setting(network, per_layer, request["mode"] == "train", jit, cuda)
            if attention is not None:  # which of Keras' attention paths ran, read from a trace
                settings["attention"] = attention

        logits_layer = model.layers[-2] if precision in MIXED else model.layers[-1]  # before the float32 cast
        settings["precision_effective"].update({
            "keras_dtype_policy": model.layers[0].dtype_policy.name,
            "variable_dtype": str(trainable[0].dtype),  # Keras 3 variables give their dtype as a string
            "first_layer_output_dtype": first_dtype,
            "logits_layer_compute_dtype": logits_layer.compute_dtype,
            "logits_dtype": logits_dtype,
            "loss_scale": float(optimizer.dynamic_scale.numpy()) if scaled else None,
        })

        def reset_optimizer():
            for m in sgd.momentums:
                m.assign(tf.zeros_like(m))
            sgd.iterations.assign(0)
            if scaled:
                optimizer.dynamic_scale.assign(optimizer.initial_scale)
                optimizer.step_counter.assign(0)

        train = request["mode"] == "train"

        def forward_loss():
            with tf.device(device):
                outputs = model(x, training=train)
                loss = loss_of(y, outputs)
            return logits_of(outputs).numpy(), float(loss)

        compiled = compiled_step(model, loss_of, optimizer, trainable, scaled, train, jit)

        last = []

        def step():
            with tf.device(device):
                last[:] = [compiled(x, y)]

        firsts: dict = {}  # the first n samples, sliced once per batch size (tf.function traces each size once)

        def infer(n: int):  # LoadGen's queries (runners/common/loadgen_harness.py)
            with tf.device(device):
                if n not in firsts:
                    firsts[n] = tf.identity(x[:n])
                last[:] = [compiled(firsts[n], y)]

        sync_devices = tf.test.experimental.sync_devices

        def synchronize():
            # GPU kernels run asynchronously: SyncDevice on every device + the eager executor's
            # async_wait blocks until everything queued (the whole step, updates included) is done.
            # On CPU the call returns computed tensors already; this costs microseconds.
            sync_devices()

        def compile_stats() -> dict:
            traced = compiled.experimental_get_tracing_count()
            return {"source": "tf.function experimental_get_tracing_count() of the step", "tracings": traced,
                    "retracings": max(traced - 1, 0), "jit_compile": jit}

        policy = KERAS_POLICY[precision]
        settings.update({
            "compile": {"mode": mode, "requested": asked, "framework": COMPILE_FRAMEWORK[mode]},
            "input_transpose": "NCHW->NHWC once in prepare" if images else None,
            "flatten": describe_flatten(network["layers"], flatten_modes, permuted),
            "step": "tf.function" + (" (XLA)" if jit else ""),
            "jit_compile": jit,
            "batch_norm": (("keras BatchNormalization via FusedBatchNormV3" + (
                                " (cuDNN)" if cuda else " (oneDNN)" if precision not in MIXED else " (CPU kernel)")
                            + (f", {KERAS_POLICY[precision].split('_')[1]} activations with float32 statistics"
                               if precision in MIXED else ""))
                           if storage == "float32" else
                           "keras BatchNormalization variables, unfused tf.nn.moments + tf.nn.batch_normalization "
                           "(FusedBatchNormV3 has no float64 kernel), running variance unbiased as the kernel's"),
            "batch_norm_epsilon_floor": bn_floor,
            "lstm": lstm_setting(has_lstm, cuda),
            "loss": loss_setting,
            "optimizer": "keras.optimizers.SGD(momentum)" + (
                f" in keras.optimizers.LossScaleOptimizer (dynamic: initial scale {float(optimizer.initial_scale):g}, "
                f"doubled after {int(optimizer.dynamic_growth_steps)} finite steps, halved and the step skipped on a "
                "non-finite gradient)" if scaled else ""),
            **({} if policy is None else {"dtype_policy": (
                f"keras.config.set_dtype_policy({policy!r}) + set_floatx({CHECK_PRECISION!r}) while model and "
                "optimiser are built: variables, activations, gradients, running statistics, momentum slots, learning rate "
                "and loss all " + precision) if precision == CHECK_PRECISION else (
                f"keras.config.set_dtype_policy({policy!r}) while model and optimiser are built: float32 variables "
                f"(and optimiser state), {policy.split('_')[1]} computation; the logits cast to float32 by a last "
                "keras.layers.Activation('linear', dtype='float32'), the loss float32")}),
            **thread_settings(),
        })
        logits_shape = output_shape(model)
        if cuda:  # the allocator's peak from here on: model, data and the steps
            synchronize()
            tf.config.experimental.reset_memory_stats("GPU:0")
        return Prepared(step, synchronize, params, logits_shape, settings,
                        export_weights=lambda: export_weights(variables, precision),
                        load_weights=lambda arrays: load_weights(variables, arrays, precision),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss,
                        memory=lambda: memory_peak(cuda), compile_stats=compile_stats,
                        infer=None if train else infer)


def compile_choice(request: dict) -> tuple[str, str | None]:
    """(the mode that runs, the mode asked) for the request's `compile`: absent or "default" is the
    runner's default (eager); `compile_mode` is torch's and ignored here."""
    asked = request.get("compile")
    mode = DEFAULT_COMPILE if asked in (None, "default") else asked
    if mode not in COMPILE_MODES:
        raise ValueError(f"tensorflow runner: compile {asked!r} is not one it accepts ({', '.join(COMPILE_MODES)}, "
                         f"or absent for its default, {DEFAULT_COMPILE})")
    return mode, asked
