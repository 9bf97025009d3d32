"""Apache MXNet runner: builds a resolved dlbench network with Gluon and times its steps.

Runs inside the mxnet environment only. mxnet is imported in `configure_threads`, after the OpenMP
variables that its engine reads when the library loads have been set.

Fast paths: every network is a Gluon HybridBlock hybridised with static_alloc and static_shape
(one cached graph per mode, memory planned once; the training graph holds forward, loss and
backward), the LSTM is the fused `RNN` operator (oneDNN's RNN primitive on CPU, cuDNN on GPU), and
on CPU convolutions, pooling, batch norm and dense layers run through the oneDNN (MKL-DNN) kernels
the wheel is built with. The optimiser applies MXNet's aggregated multi-tensor SGD-momentum update.
Attention is the GluonNLP BERT path: one Dense to q, k and v interleaved per head, sequence-first,
and MXNet's fused contrib operators interleaved_matmul_selfatt_qk (all heads' scaled scores) and
interleaved_matmul_selfatt_valatt (the weighted values, heads concatenated), the causal mask a
constant added to the scores; settings["attention"] records the operators MXNet's profiler saw it
run on one sample in the step's mode. Layer norm is nn.LayerNorm, GELU's erf form nn.GELU (the
LeakyReLU operator's gelu); its tanh form has no MXNet operator and is written from operators.
BERT (a masked_tokens input): the segment embedding is its (segments, D) table looked up by `take`
at the input's fixed segment ids (a graph constant) and broadcast-added; the pre-training heads are
GluonNLP's: a tanh Dense pooler on the [CLS] row with the next-sentence Dense, the masked positions
(a graph constant, the same for every sample) gathered by `take` on the sequence axis, the transform
Dense, GELU and nn.LayerNorm, and the decoder Dense, tied as lm_head is (below). The network gives
(masked-LM logits, next-sentence logits); the loss block takes masked_lm_and_next_sentence (the mean
cross-entropy over the B*M masked positions plus the next-sentence one over B) and returns the
masked-LM logits as the logits. y is (B, M + 1) float32 indices, as the token ids.
Not used: gluon.nn.BatchNormReLU (1.9.1's fused batch norm + relu returns wrong gamma/beta
gradients, measured) and the MKLDNN subgraph backend for inference (it folds batch norm into the
convolution weights once and does not see weights loaded afterwards).

Precision (the request's `precision`, runners/common/contract.py PRECISIONS):
- fp32: IEEE float32. On CUDA TF32 is pinned off with the NVIDIA libraries' NVIDIA_TF32_OVERRIDE=0
  (MXNet 1.9 has no TF32 switch of its own, and cuDNN 8 allows TF32 by default on compute
  capability 8.0+), and MXNet's own tensor-core variables are 0: MXNET_CUDA_ALLOW_TENSOR_CORE
  (float16 tensor-core math) and MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION (float32 convolutions
  and GEMMs converted to float16 tensor-core math). No-ops on the CPU, set there too; read back
  into settings["precision_effective"] (see precision.py for when each is read).
- tf32: skipped. On the CPU and below compute capability 8.0 there is no TF32; above, MXNet 1.9
  offers no TF32 mode to select or read back (it is whatever the NVIDIA libraries default to).
- amp_bf16 / amp_fp16: mxnet.contrib.amp, MXNet's own AMP: amp.init(target_dtype) before the
  network is built wraps the operators (Convolution, FullyConnected, and RNN for float16, in the
  target dtype; loss, softmax, mean and the like in float32, the rest in their input's dtype), in
  the imperative API and in the hybridised graph alike; weights, gradients and the SGD-momentum
  update stay float32. amp_fp16 adds amp.init_trainer(trainer) and amp.scale_loss: dynamic loss
  scaling (initial scale 2**16, halved on an overflow, whose update is skipped; doubled after 2000
  clean steps; the overflow test reads a flag back to the host every step). bfloat16 needs no loss
  scale. A layer MXNet cannot run in the reduced dtype on the device is a Skip naming it and the
  framework's message: on the CPU MXNet 1.9.1 has no float16 Convolution or FullyConnected
  ("FP16 gemm on cpu not implemented!"), and oneDNN's bfloat16 kernels need AVX-512 (on an AVX2 CPU:
  "could not create a primitive descriptor iterator").
- float64: what `dlbench check` compares in. float64 is Gluon's own
Block.cast before initialisation (every parameter and batch-norm statistic float64, the LSTM's zero
states too), images as float64 NDArrays, so activations, gradients and the loss are float64; token
ids and labels stay float32 indices. oneDNN has no float64 kernels, so every operator runs MXNet's
native implementation (measured: DNNL_VERBOSE shows no oneDNN primitive in a float64 step; the fused
RNN operator has a native float64 CPU path). MXNet's fused SGD update operators take lr and
momentum as float32 parameters (lr 0.01 is applied as 0.0099999998), so in float64 the same
momentum rule runs in NDArray arithmetic (scalars are doubles), with float64 momentum states.
Left in float32: BatchNorm's momentum and Dropout's p are float32 operator parameters; the first
only touches the running statistics' update, and settings["float64_float32_parameters"] names
every such value that float32 does not hold exactly. Three transformer operators do not compute in
float64, so a float64 network builds them from other operators (settings["float64_composites"]):
the fused attention operators' CPU kernels take float32 only (MXNet: "Only FP32 is supported on CPU
at the moment"; their documented batch_dot equivalent on the same interleaved projection instead),
the gelu operator computes in float32 for every dtype (0.5 x (1 + erf(x / sqrt 2)) from erf instead),
and LayerNorm takes eps as a float32 parameter (the same gamma and beta normalised by broadcast
operators instead, 3e-9 apart at eps 1e-3).

Compilation (the request's `compile`): `compiled` (also when absent: the runner's default, as in
runner.toml [execution]) is the hybridised block above; `eager` is the same Gluon block called
imperatively, without hybridize: every operator dispatched from Python to the engine. MXNet keeps no
compiler counters (no compile_stats); graph construction is paid in the first iteration.

Memory (Prepared.memory): MXNet 1.9 reports no allocator peak. On the CPU nothing; on CUDA the
device's free/total bytes (mx.context.gpu_memory_info) after the measured window, recorded as such.

Semantics (see src/dlbench/definitions/schema.py):
- Gluon's BatchNorm momentum is the weight of the *old* running value: momentum_mx = 1 - canonical.
  Two differences remain in the running statistics (which `dlbench check` does not compare): MXNet
  updates running_var with the biased batch variance (torch: unbiased), and on CPU its oneDNN
  batch norm updates the running statistics in the backward pass, so a training forward without
  backward (forward_loss) leaves them unchanged. Training and inference outputs are unaffected.
- Gluon's LSTM has two bias vectors per layer (i2h, h2h); h2h is zeroed and frozen (grad_req null)
  so that the trainable count is canonical, and the canonical bias lives in i2h. The fused
  operator's gate blocks are ordered i, f, g (cell), o, as in the canonical format.
- Attention's projection is one (3*H*S, D) Dense whose output feature h*3S + j*S + s is row h*S + s
  of the canonical q (j = 0), k (1) or v (2): q/k/v are interleaved on load and split on export.
  A tied lm_head, and a tied pretraining_heads' decoder, is a Dense built with the token embedding's
  ParameterDict (Gluon's sharing): its weight is the embedding's Parameter, exported once as
  000.weight; its bias is its own (the heads': NNN.decoder.bias). In AMP and float64 the heads are
  built as the other layers: their Dense layers in AMP's target dtype, layer norm and the loss in
  float32, `take` in float32 for bfloat16 and in its input's dtype for float16 (AMP's lists); in
  float64 the composed GELU and layer norm.
- AMP bfloat16 on a network with attention keeps the fused attention operators and Dropout in
  float32 (amp.init's fp32_ops): neither has a bfloat16 kernel in 1.9.1, and AMP lists neither.
- Trainer.step(batch_size) divides gradients by batch_size; the loss here is already the mean
  cross-entropy, so the step is trainer.step(1) and weight decay is 0. MXNet's momentum SGD is
  mom = momentum * mom - lr * grad; w += mom, whose first step is w - lr * grad, like torch's.
"""

from __future__ import annotations

import ctypes
import os

from runners.common.contract import CHECK_PRECISION, COMPILE_MODES, Kernel, Prepared
from runners.common.protocol import Skip
from runners.mxnet.attention import attention_record
from runners.mxnet.framework import has_attention, load_mxnet, mxnet_loaded
from runners.mxnet.precision import (AMP_TARGET, FLOAT64_CPU, FLOAT64_CUDA, ReducedPrecisionUnsupported, amp_fp32_ops,
                                     amp_init, amp_settings, dtype_name, float32_math, float32_math_env,
                                     float32_operator_parameters, float64_composites, init_loss_scaling, loss_scale,
                                     pin_float32_math, probe_dtypes, probe_in_child, request_precision)
from runners.mxnet.step import (HYBRIDIZE, build_model, count_params, hybridize_model, output_shape, sgd_momentum,
                                synthetic_batch, to_device, trainable_params)
from runners.mxnet.transformer import fused_attention_unavailable
from runners.mxnet.weights import export_weights, load_weights


# What MXNet 1.9 has no operator for, and what each is composed of (transformer.py)
LLAMA_COMPOSITION = ("composed from MXNet's operators, which have no RMSNorm, rotary, SiLU or grouped attention: "
                     "RMSNorm as square, mean, rsqrt and two broadcast products; rotary as slices, a concat and "
                     "broadcast products with (1, 1, T, S) cos and sin tables; SiLU as x * sigmoid(x); grouped "
                     "attention as separate Dense q, k, v, the key/value heads repeated per group, batch_dot, "
                     "softmax and batch_dot (its fused interleaved operators take equal q, k and v heads)")
MOE_DISPATCH = ("dense dispatch: the router in float32 (float64 in a check) by dot and softmax, the top-k by each "
                "expert's rank among the token's (comparisons: ties to the lower expert), then every expert on "
                "every token (E/k times the chosen experts' products: a hybridised graph has no data-dependent "
                "shapes and MXNet no grouped product) summed with the renormalised weights, 0 for the experts not "
                "chosen")
MOE_COMPOSITION = (MOE_DISPATCH + "; the load-balancing loss's gradient through the custom operator "
                   "dlbench_add_auxiliary_loss; capacity factors refused")
MOE_GENERATION = (MOE_DISPATCH + "; no load-balancing loss in the decoding steps (never differentiated); capacity "
                  "factors refused")


def layer_compositions(network: dict, moe: str) -> dict:
    """settings["llama_layers"] (and settings["moe"], `moe`) where the network has the layers MXNet 1.9 has
    no operator for."""
    llama_types = {"rms_norm", "grouped_attention", "swiglu", "moe", "llama_block"}
    layers = network["layers"]
    if not any(l["type"] in llama_types for l in layers):
        return {}
    out = {"llama_layers": LLAMA_COMPOSITION}
    if any(l["type"] == "moe" or (l["type"] == "llama_block" and l["moe"]) for l in layers):
        out["moe"] = moe
    return out


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


DEFAULT_COMPILE = "compiled"  # runner.toml [execution] compile: what runs when a request names no mode
COMPILED = ("HybridBlock.hybridize(static_alloc=True, static_shape=True): Gluon's CachedOp, the network and its "
            "loss traced once into one graph per mode (training: forward, loss and backward), memory planned once")
EAGER = "imperative Gluon (no hybridize): every operator dispatched from Python to MXNet's engine one by one"


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
        before_import = not mxnet_loaded()
        pin_float32_math()  # TF32 off before cuBLAS and cuDNN load with libmxnet (see precision.py)
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
                cc = mx.util.get_cuda_compute_capability(mx.gpu(i))  # an int: 80 for sm_80
                d["capability"] = f"{cc // 10}.{cc % 10}"
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
        from runners.mxnet.kernels import prepare_kernel  # the kernels suite (runners/mxnet/kernels.py)

        # TF32 and the float32 -> float16 conversion were pinned off before libmxnet loaded
        # (configure_threads); the tensor-core variable keeps MXNet's default, for float16 kernels
        kernel = prepare_kernel(spec, device)
        kernel.settings["precision_effective"] = float32_math_env()
        return kernel

    def prepare_generation(self, request: dict):
        """Mode generate: the network's Gluon blocks decoded with a key/value cache built from MXNet's
        operators, in two hybridised steps under `compiled` (generate.py)."""
        from runners.mxnet.generate import prepare_generation

        mx = load_mxnet()
        precision = request_precision(request)
        if precision not in ("fp32", CHECK_PRECISION):
            raise Skip(f"generate: the mxnet runner generates in fp32 and the check's float64, not {precision}")
        cuda = request["device"] == "cuda"
        ctx = mx.gpu(0) if cuda else mx.cpu()
        settings = {"precision_effective": float32_math(precision, ctx),
                    **layer_compositions(request["network"], MOE_GENERATION)}
        compiled, compile_settings = compile_choice(request)
        used_at_prepare = _gpu_used_bytes(mx) if cuda else None
        generator = prepare_generation(request, ctx, compiled, compile_settings, settings)
        generator.memory = lambda: memory_report(cuda, used_at_prepare)
        return generator

    def prepare_convergence(self, request: dict):
        from runners.mxnet.convergence import prepare_convergence  # the convergence suite (convergence.py)

        mx = load_mxnet()
        ctx = mx.gpu(0) if request["device"] == "cuda" else mx.cpu()
        return prepare_convergence(request, ctx, float32_math(request_precision(request), ctx))

    def prepare(self, request: dict) -> Prepared:
        mx = load_mxnet()
        import numpy as np

        precision = request_precision(request)
        cuda = request["device"] == "cuda"
        ctx = mx.gpu(0) if cuda else mx.cpu()
        effective = float32_math(precision, ctx)  # Skip: tf32; before any operator runs
        compiled, compile_settings = compile_choice(request)
        float64 = precision == CHECK_PRECISION
        storage = "float64" if float64 else "float32"  # of weights and images: AMP keeps float32 weights
        target = AMP_TARGET.get(precision)
        network = request["network"]
        seed = request.get("seed", 0)
        train = request["mode"] == "train"
        fp32_ops = amp_fp32_ops(target, network) if target else []
        if target and not cuda and not request.get("isolated_probe"):
            probe_in_child(request, target)  # a Skip where MXNet cannot run the network in `target` here
        if target:
            amp_init(target, fp32_ops)  # before the network is built: MXNet wraps the operators it will call
        mx.random.seed(seed)
        np.random.seed(seed)
        deterministic = bool(request.get("deterministic", False))
        used_at_prepare = _gpu_used_bytes(mx) if cuda else None

        # MXNet's fused self-attention operators where they run in the network's dtype (not float64 on the CPU)
        fused_unavailable = fused_attention_unavailable(ctx, storage) if has_attention(network) else None
        net, blocks, model = build_model(network, ctx, deterministic, dtype=storage, hybridize=False,
                                         fused_attention=fused_unavailable is None)
        fused_lstm = any(l["type"] == "lstm" for l in network["layers"])
        settings = {"layout": "NCHW", "hybridize": dict(HYBRIDIZE) if compiled else None,
                    "precision": precision, "fused_lstm": fused_lstm,
                    # oneDNN has float32 (and bf16) kernels only: float64 runs MXNet's native operators
                    "onednn": mx.runtime.Features().is_enabled("MKLDNN") and not cuda and not float64,
                    "optimizer": "gluon.Trainer sgd(momentum), step(1) on the mean loss" if not float64 else
                    "gluon.Trainer, SGD momentum in float64 NDArray arithmetic (MXNet's fused sgd_mom_update "
                    "takes lr and momentum as float32), step(1) on the mean loss",
                    "deterministic": deterministic}
        if float64:
            settings["float64"] = FLOAT64_CPU if not cuda else FLOAT64_CUDA
            settings["float64_float32_parameters"] = float32_operator_parameters(network, deterministic)
            composites = float64_composites(network, fused_unavailable)
            if composites:
                settings["float64_composites"] = composites
            if fused_lstm:
                settings["lstm_kernel"] = ("fused RNN operator, MXNet's native CPU implementation in float64 "
                                           "(oneDNN's RNN primitive is float32-only)") if not cuda else \
                    "fused RNN operator, cuDNN in float64"
        if cuda:
            settings["cudnn_autotune"] = os.environ.get("MXNET_CUDNN_AUTOTUNE_DEFAULT", "1")
        settings.update(layer_compositions(network, MOE_COMPOSITION))

        inp = network["input"]
        if request.get("inputs"):
            with np.load(request["inputs"]) as data:
                x_np, y_np = data["x"], data["y"]
        else:
            x_np, y_np = synthetic_batch(network, request["batch_size"], np.random.default_rng(seed))
        if inp["kind"] in ("tokens", "masked_tokens") and inp["vocabulary"] > 2 ** 24:
            raise ValueError("the mxnet runner passes token ids as float32: vocabulary must be <= 2**24")
        x, y = to_device(x_np, y_np, ctx, dtype=storage)

        # a real forward pass (one sample, imperative, before hybridize): the dtypes; a layer MXNet
        # cannot run in the AMP dtype here is a Skip that names it
        try:
            effective.update(probe_dtypes(net, blocks, network, x, precision, train))
        except ReducedPrecisionUnsupported as e:
            raise Skip(str(e)) from e
        attention = attention_record(blocks, network, ctx, storage, train, fused_unavailable)
        if attention is not None:  # the attention operators MXNet ran, fused or not
            settings["attention"] = attention
        if compiled:
            hybridize_model(model)  # the graph is traced and planned by the first step
        settings["compile"] = compile_settings

        trainable = trainable_params(net)
        params = count_params(trainable)
        scaled = target == "float16" and train  # dynamic loss scaling: AMP float16's, in training

        def make_trainer():
            optimizer, optimizer_params = sgd_momentum(request["learning_rate"], request["momentum"], storage)
            t = mx.gluon.Trainer(trainable, optimizer, optimizer_params, kvstore=None)
            if scaled:
                init_loss_scaling(t)  # a fresh dynamic loss scaler
            return t

        trainer = make_trainer()
        effective["loss_scale"] = loss_scale(trainer) if scaled else None
        if target:
            effective["amp"] = amp_settings(target, scaled, compiled, fp32_ops)
        settings["precision_effective"] = effective

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
            if dtype_name(out.dtype) != storage:  # AMP's bfloat16 or float16 logits: MXNet's own cast
                out = out.astype(storage)
            return out.asnumpy(), float(loss.asscalar())

        if train and scaled:
            from mxnet.contrib import amp

            def step():  # MXNet's AMP training loop
                with mx.autograd.record(train_mode=True):
                    _, loss = model(x, y)
                    with amp.scale_loss(loss, trainer) as scaled_loss:  # loss * scale; the step divides it out
                        mx.autograd.backward(scaled_loss)
                trainer.step(1)  # skips the update on an overflow, then adapts the scale
        elif train:
            def step():
                with mx.autograd.record(train_mode=True):
                    _, loss = model(x, y)
                loss.backward()
                trainer.step(1)  # the loss is the mean already: no further rescaling
        else:
            def step():
                net(x)  # not recording: predict mode (running statistics, no dropout)

        firsts: dict = {}  # the first n samples, copied once per batch size

        def infer(n: int):  # LoadGen's queries (runners/common/loadgen_harness.py), in predict mode as step()
            if n not in firsts:
                firsts[n] = x[:n].copy()
            return net(firsts[n])

        return Prepared(step, mx.nd.waitall, params, output_shape(net, x), settings,
                        export_weights=lambda: export_weights(blocks, network, storage),
                        load_weights=lambda arrays: load_weights(blocks, network, arrays),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss,
                        memory=lambda: memory_report(cuda, used_at_prepare),
                        infer=None if train else infer)


# ------------------------------------------------------------------ compilation, memory


def compile_choice(request: dict) -> tuple[bool, dict]:
    """(hybridised?, settings["compile"]) for the request's `compile` (absent or "default": compiled)."""
    asked = request.get("compile")
    mode = DEFAULT_COMPILE if asked in (None, "default") else asked
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile {asked!r} is not one the mxnet runner accepts ({', '.join(COMPILE_MODES)}, "
                         f"or absent for its default, {DEFAULT_COMPILE})")
    return mode == "compiled", {"mode": mode, "requested": asked, "framework": COMPILED if mode == "compiled" else EAGER}


def _gpu_used_bytes(mx) -> int | None:
    try:
        free, total = mx.context.gpu_memory_info(0)
    except Exception:  # noqa: BLE001 - descriptive only
        return None
    return int(total - free)


def memory_report(cuda: bool, used_at_prepare: int | None) -> dict:
    """After the measured window: MXNet 1.9 exposes no allocator peak (its storage managers have no
    statistics API). On CUDA the device's used bytes (total - free, mx.context.gpu_memory_info), which
    is not a peak of this run's tensors: it counts the CUDA context, cuDNN workspaces, what MXNet's
    pooled GPU storage keeps of freed blocks (released only on an allocation failure) and any other
    process on the GPU; taken at the start of prepare and after the window."""
    if not cuda:
        return {"unavailable": "MXNet 1.9 reports no allocator statistics for the CPU (its CPU storage manager has "
                               "no query API; mx.context.gpu_memory_info is CUDA's cudaMemGetInfo)"}
    mx = load_mxnet()
    free, total = mx.context.gpu_memory_info(0)
    return {"unavailable": "MXNet 1.9 exposes no allocator peak (no peak_allocated_bytes / peak_reserved_bytes)",
            "device_used_bytes": int(total - free), "device_total_bytes": int(total),
            "device_used_bytes_at_prepare": used_at_prepare,
            "source": "mx.context.gpu_memory_info(0) (cudaMemGetInfo: device-wide free/total, not an allocator "
                      "peak) at the start of prepare and after the measured window; MXNet's pooled GPU storage "
                      "keeps freed blocks, so the difference approximates the pool's high-water mark"}
