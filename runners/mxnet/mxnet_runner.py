"""Apache MXNet runner: builds a resolved dlbench network with Gluon and times its steps.

Runs inside the mxnet environment only. mxnet is imported in `configure_threads`, after the OpenMP
variables that its engine reads when the library loads have been set.

Fast paths: every network is a Gluon HybridBlock hybridised with static_alloc and static_shape
(one cached graph per mode, memory planned once; the training graph holds forward, loss and
backward), the LSTM is the fused `RNN` operator (oneDNN's RNN primitive on CPU, cuDNN on GPU), and
on CPU convolutions, pooling, batch norm and dense layers run through the oneDNN (MKL-DNN) kernels
the wheel is built with. The optimiser applies MXNet's aggregated multi-tensor SGD-momentum update.
Not used: gluon.nn.BatchNormReLU (1.9.1's fused batch norm + relu returns wrong gamma/beta
gradients, measured) and the MKLDNN subgraph backend for inference (it folds batch norm into the
convolution weights once and does not see weights loaded afterwards).

Precision: float32, or float64 (what `dlbench check` compares in). float64 is Gluon's own
Block.cast before initialisation (every parameter and batch-norm statistic float64, the LSTM's zero
states too), images as float64 NDArrays, so activations, gradients and the loss are float64; token
ids and labels stay float32 indices. oneDNN has no float64 kernels, so every operator runs MXNet's
native implementation (measured: DNNL_VERBOSE shows no oneDNN primitive in a float64 step; the fused
RNN operator has a native float64 CPU path). MXNet's fused SGD update operators take lr and
momentum as float32 parameters (lr 0.01 is applied as 0.0099999998), so in float64 the same
momentum rule runs in NDArray arithmetic (scalars are doubles), with float64 momentum states.
Left in float32: BatchNorm's momentum and Dropout's p are float32 operator parameters; the first
only touches the running statistics' update, and settings["float64_float32_parameters"] names
every such value that float32 does not hold exactly.

Semantics (see src/dlbench/definitions/schema.py):
- Gluon's BatchNorm momentum is the weight of the *old* running value: momentum_mx = 1 - canonical.
  Two differences remain in the running statistics (which `dlbench check` does not compare): MXNet
  updates running_var with the biased batch variance (torch: unbiased), and on CPU its oneDNN
  batch norm updates the running statistics in the backward pass, so a training forward without
  backward (forward_loss) leaves them unchanged. Training and inference outputs are unaffected.
- Gluon's LSTM has two bias vectors per layer (i2h, h2h); h2h is zeroed and frozen (grad_req null)
  so that the trainable count is canonical, and the canonical bias lives in i2h. The fused
  operator's gate blocks are ordered i, f, g (cell), o, as in the canonical format.
- Trainer.step(batch_size) divides gradients by batch_size; the loss here is already the mean
  cross-entropy, so the step is trainer.step(1) and weight decay is 0. MXNet's momentum SGD is
  mom = momentum * mom - lr * grad; w += mom, whose first step is w - lr * grad, like torch's.
"""

from __future__ import annotations

import ctypes
import os

import mxnet_network as mn
from contract import Kernel, Prepared
from mxnet_network import load_mxnet


def _omp_max_threads() -> int | None:
    """OpenMP threads of this (the main) thread: MXNet sets it to its own maximum when it loads."""
    try:
        return int(ctypes.CDLL("libgomp.so.1").omp_get_max_threads())
    except (OSError, AttributeError):
        return None


def _distribution() -> tuple[str, str] | None:
    """(name, version) of the installed mxnet distribution (mxnet, mxnet-cu117, ...)."""
    import importlib.metadata as md

    for d in md.distributions():
        name = (d.metadata["Name"] or "").lower()
        if name == "mxnet" or name.startswith(("mxnet-cu", "mxnet-mkl", "mxnet-native")):
            return d.metadata["Name"], d.version
    return None


def _cuda_from_distribution(name: str | None) -> str | None:
    """mxnet-cu117 -> "11.7", mxnet-cu102 -> "10.2" (MXNet exposes no CUDA version at run time)."""
    if not name or "-cu" not in name.lower():
        return None
    digits = "".join(c for c in name.lower().split("-cu", 1)[1] if c.isdigit())
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 else None


PRECISIONS = ("float32", "float64")

# What float64 means for the operators (measured: DNNL_VERBOSE shows no oneDNN primitive executed in
# a float64 check; the logits agree with a float64 numpy forward to ~1e-15)
FLOAT64_CPU = ("every parameter, activation, gradient, batch-norm statistic, SGD-momentum state and the loss in "
               "float64; MXNet's native CPU operators (oneDNN has no float64 kernels): im2col + BLAS gemm "
               "convolution and dense, native pooling, batch norm, activations, fused RNN and softmax")
FLOAT64_CUDA = ("every parameter, activation, gradient, batch-norm statistic, SGD-momentum state and the loss in "
                "float64 (MXNet's CUDA and cuDNN operators in double)")


class MXNetRunner:
    name = "mxnet"

    def configure_threads(self, threads: int | None) -> dict:
        """Apply --threads before mxnet loads; return what MXNet actually took.

        MXNet sizes its OpenMP team once, when the library loads: OMP_NUM_THREADS if set, else half
        the logical cores on x86 (on a 2-core host: one). The controller already puts
        OMP/MKL_NUM_THREADS into the worker's environment; they are set here too (and
        OPENBLAS_NUM_THREADS for the few BLAS calls) so that a direct worker call behaves the same.
        One engine worker thread per CPU device (MXNet's default, MXNET_CPU_WORKER_NTHREADS=1) runs
        the operators one after another, each with the whole OpenMP team; more workers would only
        oversubscribe the cores for these sequential networks. Without --threads MXNet's own default
        stands (and is recorded).
        """
        if threads:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                os.environ[var] = str(threads)
        os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
        before_import = not mn.mxnet_loaded()
        load_mxnet()
        return {
            "requested": threads,
            # read back from libgomp: MXNet sets the loading thread's team size to its own maximum,
            # which caps every operator's team (measured: one busy OS thread per OpenMP thread)
            "intra_op": _omp_max_threads(),
            "inter_op": int(os.environ["MXNET_CPU_WORKER_NTHREADS"]),  # engine CPU worker threads
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "engine": os.environ.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice"),
            "applied_before_import": before_import,
        }

    def framework_info(self, device: str) -> dict:
        mx = load_mxnet()
        features = mx.runtime.Features()

        def on(name):
            return features.is_enabled(name) if name in features else False

        gpus = mx.context.num_gpus()
        devices = [{"type": "cpu"}]
        for i in range(gpus):
            d = {"type": "cuda", "index": i}
            try:
                major, minor = mx.util.get_cuda_compute_capability(mx.gpu(i))
                d["capability"] = f"{major}.{minor}"
                free, total = mx.context.gpu_memory_info(i)
                d["memory_bytes"] = total
            except Exception:  # noqa: BLE001 - descriptive only
                pass
            devices.append(d)
        dist = _distribution()
        cudnn = None
        if on("CUDNN"):
            try:  # the library libmxnet links (already loaded): its own version query
                cudnn = int(ctypes.CDLL("libcudnn.so.8").cudnnGetVersion())
            except (OSError, AttributeError):
                cudnn = None
        return {
            "name": "mxnet",
            "version": mx.__version__,
            "build": {
                "distribution": dist,  # mxnet, or mxnet-cu<version>: the CUDA release it targets
                "cuda": on("CUDA"),
                "cuda_version": _cuda_from_distribution(dist[0] if dist else None) if on("CUDA") else None,
                "cudnn": on("CUDNN"),
                "cudnn_version": cudnn,
                "nccl": on("NCCL"),
                "tensorrt": on("TENSORRT"),
                "mkldnn": on("MKLDNN"),  # oneDNN
                "blas": next((n for n in ("BLAS_MKL", "BLAS_OPEN", "BLAS_ATLAS", "BLAS_APPLE") if on(n)), None),
                "openmp": on("OPENMP"),
                "debug": on("DEBUG"),
                "features": sorted(name for name, f in features.items() if f.enabled),
            },
            "devices": devices,
        }

    def device_available(self, device: str) -> str | None:
        if device == "cuda":
            mx = load_mxnet()
            if not mx.runtime.Features().is_enabled("CUDA"):
                return "CUDA requested but this mxnet build has no CUDA support (install the cuda flavour)"
            if mx.context.num_gpus() < 1:
                return "CUDA requested but this host has no usable GPU"
        elif device != "cpu":
            return f"device {device!r} not supported by the mxnet runner"
        return None

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        from mxnet_kernels import prepare_kernel  # the kernels suite (runners/mxnet/mxnet_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        mx = load_mxnet()
        import numpy as np

        precision = request.get("precision", "float32")
        if precision not in PRECISIONS:
            raise NotImplementedError(f"the mxnet runner supports precision {' or '.join(PRECISIONS)}, "
                                      f"not {precision!r} (mxnet.contrib.amp is not wired in)")
        float64 = precision == "float64"
        network = request["network"]
        seed = request.get("seed", 0)
        mx.random.seed(seed)
        np.random.seed(seed)
        cuda = request["device"] == "cuda"
        ctx = mx.gpu(0) if cuda else mx.cpu()
        deterministic = bool(request.get("deterministic", False))

        net, blocks, model = mn.build_model(network, ctx, deterministic, dtype=precision)
        fused_lstm = any(l["type"] == "lstm" for l in network["layers"])
        settings = {"layout": "NCHW", "hybridize": {"static_alloc": True, "static_shape": True},
                    "precision": precision, "fused_lstm": fused_lstm,
                    # oneDNN has float32 (and bf16) kernels only: float64 runs MXNet's native operators
                    "onednn": mx.runtime.Features().is_enabled("MKLDNN") and not cuda and not float64,
                    "optimizer": "gluon.Trainer sgd(momentum), step(1) on the mean loss" if not float64 else
                    "gluon.Trainer, SGD momentum in float64 NDArray arithmetic (MXNet's fused sgd_mom_update "
                    "takes lr and momentum as float32), step(1) on the mean loss",
                    "deterministic": deterministic}
        if float64:
            settings["float64"] = FLOAT64_CPU if not cuda else FLOAT64_CUDA
            settings["float64_float32_parameters"] = mn.float32_operator_parameters(network, deterministic)
            if fused_lstm:
                settings["lstm_kernel"] = ("fused RNN operator, MXNet's native CPU implementation in float64 "
                                           "(oneDNN's RNN primitive is float32-only)") if not cuda else \
                    "fused RNN operator, cuDNN in float64"
        if cuda:
            settings["cudnn_autotune"] = os.environ.get("MXNET_CUDNN_AUTOTUNE_DEFAULT", "1")

        inp = network["input"]
        if request.get("inputs"):
            with np.load(request["inputs"]) as data:
                x_np, y_np = data["x"], data["y"]
        else:
            x_np, y_np = mn.synthetic_batch(network, request["batch_size"], np.random.default_rng(seed))
        if inp["kind"] == "tokens" and inp["vocabulary"] > 2 ** 24:
            raise ValueError("the mxnet runner passes token ids as float32: vocabulary must be <= 2**24")
        x, y = mn.to_device(x_np, y_np, ctx, dtype=precision)

        trainable = mn.trainable_params(net)
        params = mn.count_params(trainable)
        train = request["mode"] == "train"

        def make_trainer():
            optimizer, optimizer_params = mn.sgd_momentum(request["learning_rate"], request["momentum"], precision)
            return mx.gluon.Trainer(trainable, optimizer, optimizer_params, kvstore=None)

        trainer = make_trainer()

        def reset_optimizer():
            nonlocal trainer
            trainer = make_trainer()

        def forward_loss():
            if train:
                with mx.autograd.record(train_mode=True):  # batch statistics, as in the step
                    out, loss = model(x, y)
            else:
                with mx.autograd.predict_mode():
                    out, loss = model(x, y)
            return out.asnumpy().astype(precision), float(loss.asscalar())

        if train:
            def step():
                with mx.autograd.record(train_mode=True):
                    _, loss = model(x, y)
                loss.backward()
                trainer.step(1)  # the loss is the mean already: no further rescaling
        else:
            def step():
                net(x)  # not recording: predict mode (running statistics, no dropout)

        return Prepared(step, mx.nd.waitall, params, mn.output_shape(net, x), settings,
                        export_weights=lambda: mn.export_weights(blocks, network, precision),
                        load_weights=lambda arrays: mn.load_weights(blocks, network, arrays),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss)
