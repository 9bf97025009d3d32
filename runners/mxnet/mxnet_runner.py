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
import functools
import os

_mx = None


def _mxnet():
    global _mx
    if _mx is None:
        import warnings

        with warnings.catch_warnings():
            # mxnet 1.9.1 warns on import (numpy aliases, distutils); nothing the user can act on.
            warnings.simplefilter("ignore")
            import mxnet

        _mx = mxnet
    return _mx


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


# ---------------------------------------------------------------------------------------------
# Building the network


@functools.lru_cache(maxsize=None)
def _blocks() -> dict:
    """Gluon block classes that need the framework (defined once, lazily)."""
    mx = _mxnet()
    nn = mx.gluon.nn

    class SequenceLSTM(mx.gluon.HybridBlock):
        """gluon.rnn.LSTM (the fused RNN operator), batch-major, returning the output sequence."""

        def __init__(self, features: int, hidden: int, layers: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.lstm = mx.gluon.rnn.LSTM(hidden, num_layers=layers, layout="NTC", input_size=features,
                                              h2h_bias_initializer="zeros", i2h_bias_initializer="zeros")
            for k in range(layers):
                getattr(self.lstm, f"l{k}_h2h_bias").grad_req = "null"  # canonical: one bias per layer

        def hybrid_forward(self, F, x):
            return self.lstm(x)  # no states given: zero initial state, output sequence only

    class OptionA(mx.gluon.HybridBlock):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra

        def hybrid_forward(self, F, x):
            s = self.stride
            if s > 1:
                x = F.slice(x, begin=(None, None, None, None), end=(None, None, None, None), step=(1, 1, s, s))
            if self.extra:
                zero = F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1))
                x = F.concat(x, F.broadcast_axis(zero, axis=1, size=self.extra), dim=1)
            return x

    class Residual(mx.gluon.HybridBlock):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1 (bottleneck), + shortcut, then relu."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            cin, cout = spec["in_shape"][0], spec["out_shape"][0]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                convs = [(cin, f, 3, s, True), (f, f, 3, 1, False)]
            else:
                convs = [(cin, f, 1, 1, True), (f, f, 3, s, True), (f, cout, 1, 1, False)]
            self.kind = spec["shortcut"]
            with self.name_scope():
                self.body = nn.HybridSequential(prefix="body_")
                self.conv_bn = []  # (conv, bn) positions in body, for the canonical weight names
                with self.body.name_scope():
                    for ci, co, k, stride, relu in convs:
                        self.conv_bn.append((len(self.body), len(self.body) + 1))
                        self.body.add(nn.Conv2D(co, k, stride, k // 2, in_channels=ci, use_bias=False),
                                      nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=co))
                        if relu:
                            self.body.add(nn.Activation("relu"))
                if self.kind == "projection":
                    self.proj = nn.Conv2D(cout, 1, s, 0, in_channels=cin, use_bias=False)
                    self.proj_bn = nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout)
                elif self.kind == "option_a":
                    self.option_a = OptionA(s, cout - cin)

        def hybrid_forward(self, F, x):
            if self.kind == "projection":
                short = self.proj_bn(self.proj(x))
            elif self.kind == "option_a":
                short = self.option_a(x)
            else:
                short = x
            # Activation, not F.relu: on CPU only Activation is a oneDNN primitive; the plain relu
            # operator forces oneDNN-layout tensors back to NCHW around it, forward and backward
            # (measured on ResNet-50 training, b4: 10-25% of the step).
            return F.Activation(self.body(x) + short, act_type="relu")

    class WithLoss(mx.gluon.HybridBlock):
        """The network and its mean softmax cross-entropy (over the batch, and the steps of an LM)."""

        def __init__(self, net, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.net = net
                self.loss = mx.gluon.loss.SoftmaxCrossEntropyLoss(axis=-1, sparse_label=True)

        def hybrid_forward(self, F, x, y):
            out = self.net(x)
            # per sample the loss is already the mean over the steps (of an LM); then the batch mean
            return out, F.mean(self.loss(out, y))

    return {"SequenceLSTM": SequenceLSTM, "OptionA": OptionA, "Residual": Residual, "WithLoss": WithLoss}


def build_block(spec: dict, classes: dict):
    """One resolved layer (see dlbench.definitions.analysis) as a Gluon HybridBlock."""
    nn = _mxnet().gluon.nn
    t = spec["type"]
    in_shape = spec["in_shape"]
    if t == "dense":
        # flatten=False keeps a (batch, steps, features) input and applies the weights at every step
        return nn.Dense(spec["units"], use_bias=spec["bias"], flatten=len(in_shape) != 2, in_units=in_shape[-1])
    if t == "conv2d":
        return nn.Conv2D(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]), tuple(spec["padding"]),
                         in_channels=in_shape[0], use_bias=spec["bias"], layout="NCHW")
    if t == "max_pool":
        # pooling_convention "valid" (ceil_mode False) is the canonical floor; padded cells never win
        return nn.MaxPool2D(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]), ceil_mode=False)
    if t == "avg_pool":
        return nn.AvgPool2D(tuple(spec["size"]), tuple(spec["stride"]), 0, ceil_mode=False)
    if t == "global_avg_pool":
        seq = nn.HybridSequential()
        seq.add(nn.GlobalAvgPool2D(), nn.Flatten())
        return seq
    if t == "batch_norm":
        return nn.BatchNorm(axis=1, momentum=1.0 - spec["momentum"], epsilon=spec["eps"], in_channels=in_shape[0])
    if t in ("relu", "sigmoid", "tanh"):
        return nn.Activation(t)
    if t == "flatten":
        return nn.Flatten()  # (C, H, W) row-major: the canonical order for NCHW
    if t == "dropout":
        return nn.Dropout(spec["rate"])
    if t == "embedding":
        return nn.Embedding(spec["vocabulary"], spec["dim"])
    if t == "lstm":
        return classes["SequenceLSTM"](in_shape[-1], spec["hidden"], spec["layers"])
    if t == "residual":
        return classes["Residual"](spec)
    raise ValueError(f"mxnet runner: unsupported layer type {t!r}")


def build_network(network: dict, deterministic: bool = False):
    """(HybridSequential, [block per resolved layer, None where the layer is dropped])."""
    mx = _mxnet()
    classes = _blocks()
    net = mx.gluon.nn.HybridSequential(prefix="net_")
    blocks = []
    with net.name_scope():
        for layer in network["layers"]:
            if deterministic and layer["type"] == "dropout":
                blocks.append(None)  # dropout as the identity: simply not in the graph
                continue
            block = build_block(layer, classes)
            net.add(block)
            blocks.append(block)
    return net, blocks, classes


# ---------------------------------------------------------------------------------------------
# Canonical weights (see src/dlbench/definitions/weights.py) <-> Gluon parameters. Gluon's layouts
# are the canonical ones (OIHW, out x in, LSTM gates i f g o), so only the LSTM's biases need care.


def _bn_params(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.gamma, f"{prefix}.beta": bn.beta,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def canonical_params(blocks: list, network: dict) -> dict:
    """name -> gluon Parameter for every canonical weight except LSTM biases."""
    out = {}
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        p, t = f"{i:03d}", layer["type"]
        if block is None:
            continue
        if t in ("dense", "conv2d"):
            out[f"{p}.weight"] = block.weight
            if block.bias is not None:
                out[f"{p}.bias"] = block.bias
        elif t == "batch_norm":
            out.update(_bn_params(p, block))
        elif t == "embedding":
            out[f"{p}.weight"] = block.weight
        elif t == "lstm":
            for k in range(layer["layers"]):
                out[f"{p}.l{k}.w_ih"] = getattr(block.lstm, f"l{k}_i2h_weight")
                out[f"{p}.l{k}.w_hh"] = getattr(block.lstm, f"l{k}_h2h_weight")
        elif t == "residual":
            for j, (c, b) in enumerate(block.conv_bn, start=1):
                out[f"{p}.conv{j}.weight"] = block.body[c].weight
                out.update(_bn_params(f"{p}.bn{j}", block.body[b]))
            if layer["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = block.proj.weight
                out.update(_bn_params(f"{p}.proj_bn", block.proj_bn))
    return out


def _lstm_biases(blocks: list, network: dict):
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        if layer["type"] == "lstm":
            for k in range(layer["layers"]):
                yield (f"{i:03d}.l{k}.bias", getattr(block.lstm, f"l{k}_i2h_bias"),
                       getattr(block.lstm, f"l{k}_h2h_bias"))


def export_weights(blocks: list, network: dict) -> dict:
    import numpy as np

    out = {n: p.data().asnumpy().astype(np.float32, copy=True) for n, p in canonical_params(blocks, network).items()}
    for name, b_i2h, b_h2h in _lstm_biases(blocks, network):
        out[name] = (b_i2h.data() + b_h2h.data()).asnumpy().astype(np.float32, copy=True)
    return out


def load_weights(blocks: list, network: dict, arrays: dict) -> None:
    mx = _mxnet()
    params = canonical_params(blocks, network)
    biases = {name: (b_i2h, b_h2h) for name, b_i2h, b_h2h in _lstm_biases(blocks, network)}
    expected = set(params) | set(biases)
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(expected))[:5]}")
    for name, p in params.items():
        src = arrays[name]
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)}, mxnet expects {tuple(p.shape)}")
        p.set_data(mx.nd.array(src, dtype="float32"))
    for name, (b_i2h, b_h2h) in biases.items():
        b_i2h.set_data(mx.nd.array(arrays[name], dtype="float32"))
        b_h2h.set_data(mx.nd.zeros(b_h2h.shape))
    mx.nd.waitall()


# ---------------------------------------------------------------------------------------------


class Prepared:
    def __init__(self, step, synchronize, params, output_shape, settings, blocks=None, network=None,
                 forward_loss=None, reset_optimizer=None):
        self.step = step
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self._blocks, self._network = blocks, network
        self.forward_loss = forward_loss
        self._reset_optimizer = reset_optimizer

    def export_weights(self) -> dict:
        self.synchronize()
        return export_weights(self._blocks, self._network)

    def load_weights(self, arrays: dict) -> None:
        self.synchronize()
        load_weights(self._blocks, self._network, arrays)
        self._reset_optimizer()


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
        before_import = _mx is None
        _mxnet()
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
        mx = _mxnet()
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
            mx = _mxnet()
            if not mx.runtime.Features().is_enabled("CUDA"):
                return "CUDA requested but this mxnet build has no CUDA support (install the cuda flavour)"
            if mx.context.num_gpus() < 1:
                return "CUDA requested but this host has no usable GPU"
        elif device != "cpu":
            return f"device {device!r} not supported by the mxnet runner"
        return None

    def prepare_kernel(self, spec: dict, device: str):
        from mxnet_kernels import prepare_kernel  # the kernels suite (runners/mxnet/mxnet_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        mx = _mxnet()
        import numpy as np

        precision = request.get("precision", "float32")
        if precision != "float32":
            raise NotImplementedError(f"the mxnet runner supports float32 only, not {precision!r} "
                                      "(mxnet.contrib.amp is not wired in)")
        network = request["network"]
        seed = request.get("seed", 0)
        mx.random.seed(seed)
        np.random.seed(seed)
        cuda = request["device"] == "cuda"
        ctx = mx.gpu(0) if cuda else mx.cpu()
        deterministic = bool(request.get("deterministic", False))

        net, blocks, classes = build_network(network, deterministic)
        # He-normal weights (fan-in); biases, BN and LSTM biases keep their own initialisers.
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctx)
        model = classes["WithLoss"](net)
        model.hybridize(static_alloc=True, static_shape=True)  # also hybridises `net` (infer)
        settings = {"layout": "NCHW", "hybridize": {"static_alloc": True, "static_shape": True},
                    "precision": precision, "fused_lstm": any(l["type"] == "lstm" for l in network["layers"]),
                    "onednn": mx.runtime.Features().is_enabled("MKLDNN") and not cuda,
                    "optimizer": "gluon.Trainer sgd(momentum), step(1) on the mean loss",
                    "deterministic": deterministic}
        if cuda:
            settings["cudnn_autotune"] = os.environ.get("MXNET_CUDNN_AUTOTUNE_DEFAULT", "1")

        batch = request["batch_size"]
        inp = network["input"]
        tokens = inp["kind"] == "tokens"
        if request.get("inputs"):
            with np.load(request["inputs"]) as data:
                x_np, y_np = data["x"], data["y"]
        else:
            rng = np.random.default_rng(seed)
            if tokens:
                shape = (batch, inp["sequence_length"])
                x_np = rng.integers(0, inp["vocabulary"], shape)
                y_np = rng.integers(0, inp["vocabulary"], shape)
            else:
                x_np = rng.standard_normal((batch, *inp["shape"]), dtype=np.float32)
                y_np = rng.integers(0, inp["classes"], (batch,))
        # Gluon's Embedding and the sparse-label loss take indices as float32 (exact below 2**24).
        if tokens and inp["vocabulary"] > 2 ** 24:
            raise ValueError("the mxnet runner passes token ids as float32: vocabulary must be <= 2**24")
        x = mx.nd.array(x_np, ctx=ctx, dtype="float32")
        y = mx.nd.array(y_np, ctx=ctx, dtype="float32")

        trainable = [p for p in net.collect_params().values() if p.grad_req != "null"]
        params = int(sum(int(np.prod(p.shape)) for p in trainable))
        train = request["mode"] == "train"

        def make_trainer():
            return mx.gluon.Trainer(trainable, "sgd", {"learning_rate": request["learning_rate"],
                                                       "momentum": request["momentum"], "wd": 0.0},
                                    kvstore=None)

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
            return out.asnumpy().astype(np.float32), float(loss.asscalar())

        if train:
            def step():
                with mx.autograd.record(train_mode=True):
                    _, loss = model(x, y)
                loss.backward()
                trainer.step(1)  # the loss is the mean already: no further rescaling
        else:
            def step():
                net(x)  # not recording: predict mode (running statistics, no dropout)

        # The per-sample output shape as the framework infers it (no computation, no rebinding).
        sym = net(mx.sym.var("data"))
        _, out_shapes, _ = sym.infer_shape(data=(1, *x.shape[1:]))
        out_shape = list(out_shapes[0][1:])

        synchronize = mx.nd.waitall
        return Prepared(step, synchronize, params, out_shape, settings, blocks, network, forward_loss,
                        reset_optimizer)
