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
The network, its weights in and out and the training iteration are jax_network.py's.
"""

from __future__ import annotations

import os

import jax_network as jn
from contract import Kernel, Prepared
from jax_network import load_jax


class JaxRunner:
    name = "jax"

    def __init__(self):
        self._threads: dict | None = None

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

    def _init_jax(self, device: str):
        jax = load_jax()
        if device == "cpu":
            # do not initialise (and preallocate memory on) a GPU for a CPU run
            try:
                jax.config.update("jax_platforms", "cpu")
            except Exception:  # noqa: BLE001 - a backend was already initialised; devices("cpu") still works
                pass
        return jax

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
        from jax_kernels import prepare_kernel  # the kernels suite (runners/jax/jax_kernels.py)

        self._init_jax(device)
        return prepare_kernel(spec, device)

    def _device(self, device: str):
        jax = load_jax()
        return jax.devices("gpu")[0] if device == "cuda" else jax.devices("cpu")[0]

    def prepare(self, request: dict) -> Prepared:
        import numpy as np

        jax = self._init_jax(request["device"])
        tm = jn.TrainingModel(request)
        mode = request["mode"]
        dev = self._device(request["device"])
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
            logits, _ = apply(p, stats, key, x, train)  # train mode: batch statistics, no state change
            return logits.astype(jax.numpy.promote_types(logits.dtype, np.float32)), loss_of(logits, y)

        device_state = jn.DeviceState({"params": params, "batch_stats": batch_stats,
                                       "opt_state": make_opt_state(params),
                                       "key": jax.device_put(tm.host_key(seed + 1), dev), "x": x, "y": y})
        state = device_state.state
        if train:
            step = device_state.train_step(jax.jit(tm.train_step, donate_argnums=(0, 1, 2, 3)))
        else:
            def infer_step(p, stats, x):
                return apply(p, stats, None, x, False)[0]

            step = device_state.infer_step(jax.jit(infer_step))
        forward_loss_jit = jax.jit(forward_loss_fn)

        def export_weights():
            return jn.export_weights({"params": state["params"], "batch_stats": state["batch_stats"]},
                                     tm.network, tm.plan)

        def load_weights(arrays):
            like = {"params": state["params"], "batch_stats": state["batch_stats"]}
            on_device = jax.device_put(jn.canonical_to_variables(arrays, tm.network, tm.plan, like), dev)
            state.update(params=on_device["params"], batch_stats=on_device["batch_stats"])
            device_state.last.clear()

        def reset_optimizer():
            state["opt_state"] = make_opt_state(state["params"])  # fresh: zero momentum

        def forward_loss():
            logits, loss = forward_loss_jit(state["params"], state["batch_stats"], state["key"], state["x"], state["y"])
            return np.asarray(logits), float(loss)

        settings = tm.settings(dev.platform, request)
        settings["compiled_step"] = "jax.jit, one executable per iteration"
        settings["donated"] = ["params", "batch_stats", "opt_state", "dropout_key"] if train else []
        return Prepared(step, device_state.synchronize, tm.count_params(params),
                        tm.output_shape(params, batch_stats, x), settings, export_weights=export_weights,
                        load_weights=load_weights, reset_optimizer=reset_optimizer, forward_loss=forward_loss)
