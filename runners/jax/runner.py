"""JAX runner: builds a resolved dlbench network with flax.linen, trains it with optax, times it.

Runs inside the jax environment only. Nothing that starts threads (jax, numpy) is imported at
module level: `configure_threads` first restricts the process's CPU affinity, and XLA:CPU sizes its
thread pools from the affinity mask when jax is first imported (in `framework_info`).

Fast path: images are computed channels-last (NHWC, what XLA:CPU's convolutions prefer; canonical
NCHW inputs are transposed once, at prepare time), a whole training iteration (forward, loss,
backward, SGD-momentum update, batch-norm statistics, dropout key split) is one `jax.jit`
executable whose parameter, optimiser-state, batch-statistics and key buffers are donated, so a
step is a single dispatch with no host round trip. The LSTM is a fused cell: the input projection
of every step is one matmul hoisted out of a `lax.scan` over the (hidden x 4 hidden) recurrence.
The network and the training iteration are step.py's, its weights in and out weights.py's.

Precision (the request's `precision`, precision.py pins it): fp32 sets
jax_default_matmul_precision="highest" (XLA's float32 dots and convolutions without TF32) and, on
CUDA, NVIDIA_TF32_OVERRIDE=0 (cuBLAS and cuDNN read it when they load, so it is set before jax
creates its CUDA backend: `framework_info` creates it before `prepare` sees the request, which is
why `_init_jax` reads the precision from the request file this worker was started with); tf32 sets
"tensorfloat32" and leaves the variable unset (skipped on the CPU and below compute capability
8.0); amp_bf16 / amp_fp16 are flax's mixed precision (modules' dtype bfloat16 / float16, float32
parameters), amp_fp16 with dynamic loss scaling inside the jitted step. Compile: `compiled` (jax.jit,
the default) only; `eager` is skipped (check_compile, here: the compile choice is the runner's).

A network with attention records in settings["attention"] the function each attention calls
(jax.nn.dot_product_attention, its `implementation` asked: cuDNN's on a GPU in half precision, else
None; flax.linen.dot_product_attention for dropout on the probabilities and in float64) and the kernel
jax traced for it (cuDNN's fused attention or XLA's), read from the step's jaxpr (attention.py).

BERT (masked_tokens input): the segment embedding is an nn.Embed lookup of the fixed segment ids
added to every sample; the pretraining heads (pooler + next-sentence, and the masked-LM transform
and decoder, tied to the token embedding through Embed.attend) gather the masked positions with
jnp.take inside the same jitted step; the network's output is (masked-LM, next-sentence) logits, the
loss masked_lm_and_next_sentence, and the check's logits the masked-LM ones.
"""

from __future__ import annotations

import json
import os
import sys

from runners.common.contract import COMPILE_MODES, KERNEL_PRECISION, Kernel, Prepared
from runners.common.protocol import Skip
from runners.jax.framework import device_memory, device_of, load_jax
from runners.jax.precision import (ACCEPTED_PRECISIONS, TF32_OVERRIDE_VAR, pin_precision, precision_flags,
                                   request_precision, tf32_override)
from runners.jax.step import DeviceState, TrainingModel, logits_of
# as a module: prepare's own export_weights and load_weights are the Prepared's callables
from runners.jax import weights as canonical_weights

# jax.monitoring events: one per jaxpr trace, one per XLA compilation (jax/_src/dispatch.py's names)
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE_DEFAULT = "compiled"  # runner.toml [execution] compile: every step is one jax.jit executable
EAGER_SKIP = ("jax: training steps run under jax.jit (the whole iteration is one XLA executable); op-by-op "
              "dispatch of an un-jitted step, every primitive compiled and run on its own, is not how JAX trains, "
              "so the jax runner has no eager mode")


def check_compile(request: dict) -> str:
    """The compile mode that runs: `compiled` (jax.jit, also when the request names none); `eager`
    is skipped (JAX's training step is a jitted function); anything else is a ValueError."""
    mode = request.get("compile") or COMPILE_DEFAULT
    if mode not in COMPILE_MODES:
        raise ValueError(f"jax runner: compile mode {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if mode == "eager":
        raise Skip(EAGER_SKIP)
    return mode


def started_with_precision() -> str | None:
    """The `precision` of the request file this worker was started with (worker.py and
    distributed_worker.py take it as their first argument), or None (none named: a kernels or
    collectives request): needed before jax creates its CUDA backend, which `framework_info` (or a
    rank's `join`) does before `prepare` is handed the request."""
    try:
        with open(sys.argv[1]) as f:
            request = json.load(f)
    except (IndexError, OSError, ValueError):
        return None
    return request.get("precision") if isinstance(request, dict) else None


class CompileCounter:
    """Counts jax's own monitoring events (traces and XLA compilations) from when it is made, in
    all and for the named functions."""

    def __init__(self, names: tuple[str, ...]):
        import jax.monitoring

        self.names = {*names, *(f"jit({n})" for n in names)}  # traces name the function, compiles jit(name)
        self.counts = {"traces": 0, "compiles": 0, "step_traces": 0, "step_compiles": 0}
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration_s: float, **kwargs) -> None:
        kind = {TRACE_EVENT: "traces", COMPILE_EVENT: "compiles"}.get(event)
        if kind:
            self.counts[kind] += 1
            if kwargs.get("fun_name") in self.names:
                self.counts[f"step_{kind}"] += 1


class JaxRunner:
    name = "jax"

    def __init__(self):
        self._threads: dict | None = None
        self._tf32_env: dict | None = None  # how NVIDIA_TF32_OVERRIDE was settled (CUDA only)

    # --- threads: XLA:CPU has no working thread-count flag; it sizes its pools from the affinity mask
    def configure_threads(self, threads: int | None) -> dict:
        import sys

        allowed = sorted(os.sched_getaffinity(0))
        if threads:
            os.sched_setaffinity(0, allowed[:threads])
        effective = sorted(os.sched_getaffinity(0))
        self._threads = {"requested": threads, "mechanism": "cpu_affinity", "affinity": len(effective),
                         "cpus": effective, "intra_op": len(effective),
                         "jax_imported_before": "jax" in sys.modules}
        return self._threads

    def _init_jax(self, device: str, precision: str | None = None):
        if device == "cuda":
            self._pin_tf32_override(precision or started_with_precision())
        else:
            self._tf32_env = {"value": os.environ.get(TF32_OVERRIDE_VAR), "when": f"{device}: no CUDA library reads it"}
        jax = load_jax()
        if device == "cpu":
            # do not initialise (and preallocate memory on) a GPU for a CPU run
            try:
                jax.config.update("jax_platforms", "cpu")
            except Exception:  # noqa: BLE001 - a backend was already initialised; devices("cpu") still works
                pass
        return jax

    def _pin_tf32_override(self, precision: str | None) -> None:
        """NVIDIA_TF32_OVERRIDE for `precision` on CUDA ("0" but for tf32), set before jax creates
        its CUDA backend; afterwards, what the environment held then is recorded (and tf32 is
        skipped if the libraries were loaded with TF32 overridden off)."""
        if precision not in ACCEPTED_PRECISIONS:
            return  # unknown (prepare refuses it) or not a training request (kernels)
        var, want = TF32_OVERRIDE_VAR, tf32_override(precision)
        have = os.environ.get(var)
        loaded = False
        if "jax" in sys.modules:
            try:
                from jax._src import xla_bridge

                loaded = xla_bridge.backends_are_initialized()
            except Exception:  # noqa: BLE001 - a jax without this accessor: assume the worst
                loaded = True
        if not loaded:
            if want is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = want
            self._tf32_env = {"value": want, "when": ("set" if want is not None else "unset") +
                              " before jax created its CUDA backend",
                              **({"replaced": have} if have is not None and have != want else {})}
        elif have == want:  # set before the backend by the first call, or by the caller's environment
            self._tf32_env = self._tf32_env or {"value": have, "when": "in the environment when jax created its "
                                                                       "CUDA backend"}
        elif precision == "tf32":
            raise Skip(f"tf32: {var}={have} was in the environment when the CUDA libraries were loaded, so "
                       "cuBLAS and cuDNN run no TF32")
        else:
            os.environ[var] = want
            self._tf32_env = {"value": want, "when": f"set after jax created its CUDA backend (then {have!r}): "
                                                     "jax_default_matmul_precision still pins XLA's float32 math"}

    def framework_info(self, device: str) -> dict:
        return self._framework_info(device, query_backend=True)

    def _framework_info(self, device: str, query_backend: bool) -> dict:
        """Versions and build; with `query_backend`, the backend's platform and devices too (which
        creates the backend: a distributed rank must join its job first)."""
        import importlib.metadata as md

        jax = self._init_jax(device)
        import jaxlib

        build: dict = {"jaxlib": getattr(jaxlib, "__version__", None)}
        for pkg in ("flax", "optax", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                    "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"):
            try:
                build[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                pass
        try:
            from jax._src.lib import cuda_versions  # present when a CUDA plugin is installed
        except Exception:  # noqa: BLE001
            cuda_versions = None
        build["cuda"] = build["cudnn"] = None
        if cuda_versions is not None:
            for key, fn in (("cuda", "cuda_runtime_get_version"), ("cudnn", "cudnn_get_version"),
                            ("cuda_driver", "cuda_driver_get_version")):
                try:
                    build[key] = getattr(cuda_versions, fn)()
                except Exception:  # noqa: BLE001
                    pass
        devices = []
        if query_backend:
            try:
                backend = jax.extend.backend.get_backend()
                build["platform"] = backend.platform
                build["platform_version"] = backend.platform_version
                devices = [{"type": d.platform, "index": d.id, "name": d.device_kind} for d in jax.devices()]
                if device == "cuda":
                    for d in jax.devices():
                        stats = d.memory_stats() if d.platform == "gpu" else None
                        if stats:
                            next(x for x in devices if x["index"] == d.id and x["type"] == d.platform)[
                                "memory_bytes"] = stats.get("bytes_limit")
            except Exception as e:  # noqa: BLE001 - e.g. no usable GPU: device_available says so next
                build["backend_error"] = f"{type(e).__name__}: {e}"
        build["matmul_precision"] = jax.config.jax_default_matmul_precision or "default"
        build["x64"] = bool(jax.config.jax_enable_x64)
        build["xla_flags"] = os.environ.get("XLA_FLAGS")
        return {"name": "jax", "version": jax.__version__, "build": build, "devices": devices,
                "threads": self._threads}

    def device_available(self, device: str) -> str | None:
        jax = load_jax()
        if device == "cuda":
            try:
                if jax.devices("gpu"):
                    return None
            except Exception:  # noqa: BLE001
                pass
            return "CUDA requested but this jax build or host has no usable GPU"
        if device != "cpu":
            return f"device {device!r} is not supported by the jax runner"
        return None

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        from runners.jax.kernels import prepare_kernel  # the kernels suite (runners/jax/kernels.py)

        # a float32 kernel is IEEE float32, as an fp32 run's layers are (jax allows TF32 by default):
        # NVIDIA_TF32_OVERRIDE=0 before the CUDA backend exists, the matmul precision "highest"
        precision = KERNEL_PRECISION[spec["dtype"]]
        self._init_jax(device, precision)
        pin_precision(precision, device)
        kernel = prepare_kernel(spec, device)
        kernel.settings["precision_effective"] = {**precision_flags(), "NVIDIA_TF32_OVERRIDE": self._tf32_env}
        return kernel

    def prepare_generation(self, request: dict):
        """Mode generate: the network's parameters as prepare makes them, decoded with flax cache
        variables in jitted prefill and decode steps (generate.py); compiled only, as training."""
        from runners.jax.generate import prepare_generation

        self._init_jax(request["device"], request_precision(request))
        check_compile(request)  # eager is skipped
        generator = prepare_generation(request, device_of(request["device"]))
        generator.settings["precision_effective"]["NVIDIA_TF32_OVERRIDE"] = self._tf32_env
        return generator

    def prepare_convergence(self, request: dict):
        from runners.jax.convergence import prepare_convergence  # the convergence suite (convergence.py)

        self._init_jax(request["device"], request_precision(request))
        return prepare_convergence(request, device_of(request["device"]))

    def prepare(self, request: dict) -> Prepared:
        import numpy as np

        jax = self._init_jax(request["device"], request_precision(request))
        counter = CompileCounter(("train_step", "infer_step"))
        # refuses an unknown precision or compile mode; skips eager, and tf32 where there is no TF32
        tm = TrainingModel(request, check_compile(request))
        mode = request["mode"]
        dev = device_of(request["device"])
        batch = request["batch_size"]
        seed = request.get("seed", 0)
        rng = np.random.default_rng(seed)
        # Data and initial weights come from numpy on the host and are put on the device once,
        # committed to it (so every step sees the same placement and the step compiles once):
        # jax.random would compile a threefry kernel per shape, tens of seconds on a small CPU.
        x_np, y_np = tm.host_batch(batch, rng, request.get("inputs"))
        x = jax.device_put(x_np, dev)
        y = jax.device_put(y_np, dev)
        variables = jax.device_put(tm.host_variables(x.shape[1:], x.dtype, rng), dev)
        params = variables["params"]
        batch_stats = variables.get("batch_stats", {})

        def make_opt_state(p):
            return jax.device_put(tm.host_opt_state(p), dev)

        apply, loss_of = tm.apply, tm.loss_of
        train = mode == "train"

        def forward_loss_fn(p, stats, key, x, y):
            out, _ = apply(p, stats, key, x, train)  # train mode: batch statistics, no state change
            logits = logits_of(out)  # pretraining heads: the masked-LM logits (B, M, V)
            return logits.astype(jax.numpy.promote_types(logits.dtype, np.float32)), loss_of(out, y)

        device_state = DeviceState({"params": params, "batch_stats": batch_stats,
                                       "opt_state": make_opt_state(params),
                                       "key": jax.device_put(tm.host_key(seed + 1), dev), "x": x, "y": y})
        state = device_state.state
        if train:
            jitted = jax.jit(tm.train_step, donate_argnums=(0, 1, 2, 3))
            step = device_state.train_step(jitted)
        else:
            def infer_step(p, stats, x):
                return apply(p, stats, None, x, False)[0]

            jitted = jax.jit(infer_step)
            step = device_state.infer_step(jitted)
        forward_loss_jit = jax.jit(forward_loss_fn)
        # LoadGen's queries (runners/common/loadgen_harness.py): the first n samples, put on the
        # device once per batch size from the host batch (committed like x; jax.jit compiles each size once)
        firsts: dict = {}

        def infer(n: int):
            if n not in firsts:
                firsts[n] = jax.device_put(x_np[:n], dev)
            device_state.last[:] = [jitted(state["params"], state["batch_stats"], firsts[n])]

        def export_weights():
            variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
            return canonical_weights.export_weights(variables, tm.network, tm.plan)

        def load_weights(arrays):
            like = {"params": state["params"], "batch_stats": state["batch_stats"]}
            host = canonical_weights.canonical_to_variables(arrays, tm.network, tm.plan, like)
            on_device = jax.device_put(host, dev)
            state.update(params=on_device["params"], batch_stats=on_device["batch_stats"])
            device_state.last.clear()

        def reset_optimizer():
            state["opt_state"] = make_opt_state(state["params"])  # fresh: zero momentum

        def forward_loss():
            logits, loss = forward_loss_jit(state["params"], state["batch_stats"], state["key"], state["x"], state["y"])
            return np.asarray(logits), float(loss)

        def memory():
            return device_memory(dev)

        def compile_stats():
            out = {**counter.counts, "source": f"jax.monitoring events {TRACE_EVENT} and {COMPILE_EVENT} since "
                                               "prepare (step_*: the jitted step's own)"}
            try:
                out["step_cache_entries"] = jitted._cache_size()  # executables in the jitted step's cache
            except Exception:  # noqa: BLE001 - a private accessor that another jax may not have
                pass
            return out

        settings = tm.settings(dev.platform, request, params, batch_stats, x)
        settings["precision_effective"]["tf32_override"] = self._tf32_env
        settings["compile_api"] = ("jax.jit(train_step, donate_argnums=(0, 1, 2, 3)): one XLA executable per "
                                   "iteration" if train else "jax.jit(infer_step): one XLA executable per iteration")
        settings["compiled_step"] = "jax.jit, one executable per iteration"
        settings["donated"] = ["params", "batch_stats", "opt_state", "dropout_key"] if train else []
        if tm.loss_scaling:
            settings["donated"].append("loss_scale")
        return Prepared(step, device_state.synchronize, tm.count_params(params),
                        tm.output_shape(params, batch_stats, x), settings, export_weights=export_weights,
                        load_weights=load_weights, reset_optimizer=reset_optimizer, forward_loss=forward_loss,
                        memory=memory, compile_stats=compile_stats, infer=None if train else infer)
