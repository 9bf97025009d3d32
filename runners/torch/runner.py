"""PyTorch runner: builds a resolved dlbench network with torch.nn and times its steps.

Runs inside the torch environment only. torch is imported in `framework_info`, after
`configure_threads` has set the OpenMP variables that torch reads at import. The network, its data,
loss and step are step.py's (built from layers.py's table), its weights weights.py's, and the
precision precision.py's (float32 math pinned and read back, torch.autocast, GradScaler). `compile`:
eager (the default) or torch.compile of the network (inductor), compiled by the first step, which
the harness times apart; after the measured window Prepared reports the CUDA caching allocator's
peak and, when compiled, dynamo's counters. A network with attention records in
settings["attention"] which kernel scaled_dot_product_attention ran (flash, memory-efficient, cuDNN
or math) and the backends torch has enabled (attention.py).
"""

from __future__ import annotations

import os

from runners.common.contract import COMPILE_MODES, KERNEL_PRECISION, Kernel, Prepared
from runners.common.protocol import Skip
from runners.torch import step as st
from runners.torch.attention import attention_kernels
from runners.torch.framework import host_array, load_torch, synchronizer
from runners.torch.precision import float32_math, in_precision, mixed_precision, request_precision
from runners.torch.weights import export_weights, load_weights


DEFAULT_COMPILE = "eager"  # runner.toml [execution] compile: what runs when a request names no mode
EAGER = "eager PyTorch: the module's operations called one by one from Python (no torch.compile)"


class TorchRunner:
    name = "torch"

    def configure_threads(self, threads: int | None) -> dict:
        if threads:
            # torch reads these at import for its OpenMP pool; set_num_threads below is the rule.
            os.environ["OMP_NUM_THREADS"] = str(threads)
            os.environ["MKL_NUM_THREADS"] = str(threads)
        torch = load_torch()
        if threads:
            torch.set_num_threads(threads)
        return {"requested": threads, "intra_op": torch.get_num_threads(),
                "inter_op": torch.get_num_interop_threads()}

    def framework_info(self, device: str) -> dict:
        torch = load_torch()
        cuda = torch.cuda.is_available()
        devices = [{"type": "cpu"}]
        if cuda:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"type": "cuda", "index": i, "name": p.name,
                                "capability": f"{p.major}.{p.minor}", "memory_bytes": p.total_memory})
        return {
            "name": "torch",
            "version": torch.__version__,
            "build": {
                "git": getattr(torch.version, "git_version", None),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if cuda else None,
                "mkl": torch.backends.mkl.is_available(),
                "mkldnn": torch.backends.mkldnn.is_available(),
                "openmp": torch.backends.openmp.is_available(),
                "debug": torch.version.debug,
            },
            "devices": devices,
        }

    def device_available(self, device: str) -> str | None:
        if device == "cuda" and not load_torch().cuda.is_available():
            return "CUDA requested but this torch build or host has no usable GPU"
        return None

    def prepare_kernel(self, spec: dict, device: str) -> Kernel:
        from runners.torch.kernels import prepare_kernel  # the kernels suite (runners/torch/kernels.py)

        # a float32 kernel is IEEE float32, as an fp32 run's layers are (cuDNN's TF32 is on by default)
        flags = float32_math(KERNEL_PRECISION[spec["dtype"]], load_torch().device(device))
        kernel = prepare_kernel(spec, device)
        kernel.settings["precision_effective"] = flags
        return kernel

    def prepare_generation(self, request: dict):
        """Mode generate: the network as built for train/infer, driven with a static key/value cache
        (generate.py); `compiled` torch.compile's the decode step."""
        from runners.torch.generate import prepare_generation

        torch = load_torch()
        device = torch.device(request["device"])
        precision = request.get("precision") or "fp32"
        settings: dict = {}
        if precision in ("fp32", "tf32"):
            settings["precision_effective"] = float32_math(precision, device)
        compiled, compile_settings = compile_choice(request, device)
        if compiled:
            compile_settings = {**compile_settings, "scope": "the decode step (one token through every block, the "
                                                             "cache update and the argmax); prefill runs eager"}
        generator = prepare_generation(request, device, compiled, compile_settings, settings)
        generator.memory = lambda: memory_peak(device)
        generator.compile_stats = dynamo_counters if compiled else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        return generator

    def prepare_convergence(self, request: dict):
        from runners.torch.convergence import prepare_convergence  # the convergence suite (convergence.py)

        return prepare_convergence(request)

    def prepare(self, request: dict) -> Prepared:
        torch = load_torch()
        network = request["network"]
        device = torch.device(request["device"])
        precision = request_precision(request)
        train = request["mode"] == "train"
        settings: dict = {"precision": precision.value}
        # before anything is built: a precision or compile mode that cannot run here is skipped
        settings["precision_effective"] = float32_math(precision, device)
        compiled, compile_settings = compile_choice(request, device)
        torch.manual_seed(request.get("seed", 0))
        model, memory_format = st.place(st.build_network(network, deterministic=request.get("deterministic", False)),
                                        network, device, settings)
        if request.get("inputs"):
            x, y = st.loaded_batch(network, request["inputs"], device, memory_format)
        else:
            x, y = st.synthetic_batch(network, request["batch_size"], device, memory_format)

        model, x = in_precision(model, x, precision)
        autocast, scaler, amp = mixed_precision(precision, device, train)
        try:
            dtypes = st.probe_dtypes(model, x, autocast, precision, network, train)
        except st.ReducedPrecisionUnsupported as e:
            raise Skip(str(e)) from e
        settings["precision_effective"].update(amp, **dtypes)
        attention = attention_kernels(model, network, autocast, train)  # flash, memory-efficient, cudnn or math
        if attention is not None:
            settings["attention"] = attention
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        out_shape = st.output_shape(model, x, train)  # on the eager module: a compiled one compiles in step 1

        def forward_loss():
            grad = torch.enable_grad() if train else torch.inference_mode()
            with grad, autocast():
                out = model(x)
                loss = st.loss(out, y)
            return host_array(st.logits_of(out)), float(loss)

        # the timed module: torch.compile's, compiled lazily by its first call (the harness's first iteration)
        stepped = torch.compile(model, mode=compile_settings["compile_mode"]) if compiled else model
        settings["compile"] = compile_settings
        train_step, reset_optimizer = st.train_step(stepped, x, y, lambda: st.sgd(st.trainable_params(model), request),
                                                    autocast, scaler)
        if train:
            model.train()
            step = train_step
        else:
            model.eval()

            def step():
                with torch.inference_mode(), autocast():
                    stepped(x)

        def infer(n: int):  # LoadGen's queries (runners/common/loadgen_harness.py): the first n samples
            with torch.inference_mode(), autocast():
                return stepped(x[:n])

        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)  # the peak from here on: the model, data and steps

        return Prepared(step, synchronizer(device), params, out_shape, settings,
                        export_weights=lambda: export_weights(model, network),
                        load_weights=lambda arrays: load_weights(model, network, arrays),
                        reset_optimizer=reset_optimizer, forward_loss=forward_loss,
                        memory=lambda: memory_peak(device),
                        compile_stats=dynamo_counters if compiled else None,
                        infer=None if train else infer)


# ------------------------------------------------------------------ compilation, memory


def compile_choice(request: dict, device) -> tuple[bool, dict]:
    """(compiled?, settings["compile"]) for the request's `compile` (absent or "default": eager, the
    runner's default, runner.toml [execution]) and, when compiled, `compile_mode` (torch.compile's
    mode, "default" when absent). A mode torch does not have, or an inductor that cannot run here
    (no C++ compiler on the CPU, no Triton on the GPU), is a Skip saying why."""
    torch = load_torch()
    asked = request.get("compile")
    mode = DEFAULT_COMPILE if asked in (None, "default") else asked
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile {asked!r} is not one the torch runner accepts ({', '.join(COMPILE_MODES)}, "
                         f"or absent for its default, {DEFAULT_COMPILE})")
    if mode == "eager":
        return False, {"mode": "eager", "requested": asked, "framework": EAGER}
    import torch._dynamo
    import torch._inductor

    compile_mode = request.get("compile_mode") or "default"
    modes = sorted(torch._inductor.list_mode_options())
    if compile_mode not in modes:
        raise Skip(f"torch.compile has no mode {compile_mode!r} in torch {torch.__version__} (it has {', '.join(modes)})")
    if device.type == "cpu":
        cxx = compiler(cxx_candidates(), "compiled: torch.compile's inductor backend generates C++ for the CPU and "
                                         "needs a C++ compiler")
    else:
        from torch.utils._triton import has_triton

        if not has_triton():
            raise Skip(f"compiled: torch.compile's inductor backend generates Triton kernels for {device.type}; "
                       f"Triton is not usable in this environment")
        cxx = compiler([os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"],
                       "compiled: Triton builds its GPU launcher with a C compiler")
    torch._dynamo.config.suppress_errors = False  # a compile error fails the run; never a silent eager fallback
    return True, {"mode": "compiled", "requested": asked, "compile_mode": compile_mode,
                  "framework": f"torch.compile(mode={compile_mode!r}, backend='inductor')",
                  "scope": "the network module (in training AOTAutograd compiles its backward too); the loss's "
                           "backward call, the optimiser step and a GradScaler stay eager",
                  "suppress_errors": torch._dynamo.config.suppress_errors, "compiler": cxx}


def cxx_candidates() -> list[str]:
    """The C++ compilers inductor tries on the CPU: $CXX, else torch._inductor.config.cpp.cxx."""
    import torch._inductor.config as config

    if os.environ.get("CXX"):
        return [os.environ["CXX"]]
    configured = (config.cpp.cxx,) if isinstance(config.cpp.cxx, str) else tuple(config.cpp.cxx)
    return [c for c in configured if c] or ["g++"]


def compiler(candidates: list[str], needs: str) -> str:
    """The path of the first of `candidates` on PATH; Skip (`needs`, and what was looked for) if none is."""
    import shutil

    for c in candidates:
        found = shutil.which(c)
        if found:
            return found
    raise Skip(f"{needs}; none found on PATH (looked for {', '.join(candidates)})")


def dynamo_counters() -> dict:
    """What torch's compiler reports after the measured window: graph breaks (torch._dynamo.utils.counters
    ["graph_break"], by reason), compiled frames and recompilations (torch._dynamo.utils.get_compilation_metrics(),
    a recompilation being a compile with a recompile reason), unique graphs, inductor's own counters."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    breaks = counters["graph_break"]
    compiles = list(get_compilation_metrics())  # one entry per compiled frame, and per backward AOTAutograd compiled
    reasons = [m.recompile_reason for m in compiles if getattr(m, "recompile_reason", None)]
    backward = sum(1 for m in compiles if getattr(m, "is_forward", True) is False)
    return {
        "source": "torch._dynamo.utils.counters, torch._dynamo.utils.get_compilation_metrics()",
        "graph_breaks": sum(breaks.values()),
        "graph_break_reasons": {reason.strip().splitlines()[0][:200]: n for reason, n in breaks.items()},
        "recompiles": len(reasons),
        "recompile_reasons": [r[:200] for r in reasons],
        # a backward served from AOTAutograd's cache (aot_autograd.autograd_cache_hit) is not compiled again
        "compilations": {"forward": len(compiles) - backward, "backward": backward},
        "frames": dict(counters["frames"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "aot_autograd": dict(counters["aot_autograd"]),
        "inductor": dict(counters["inductor"]),
    }


def memory_peak(device) -> dict:
    """The caching allocator's peak since the end of prepare (CUDA), or why there is none (the CPU)."""
    torch = load_torch()
    if device.type != "cuda":
        return {"unavailable": "torch keeps no allocator statistics for the CPU"}
    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "source": "torch.cuda.max_memory_allocated / max_memory_reserved (peak since the end of prepare, "
                      "torch.cuda.reset_peak_memory_stats)"}
