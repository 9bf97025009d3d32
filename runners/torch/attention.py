"""The attention report: which attention kernel torch actually ran for each attention of the
network (transformer.py's SelfAttention calls F.scaled_dot_product_attention, which picks one per
call), read back on the eager module and recorded in settings["attention"].
"""

from __future__ import annotations

from runners.torch.framework import load_torch

# F.scaled_dot_product_attention picks a kernel per call from its inputs (device, dtype, shapes,
# dropout, autograd) among the backends enabled (torch.backends.cuda.*_sdp_enabled(), which the CPU's
# choice also honours). Each fused kernel is an aten operator of its own, which a TorchDispatchMode
# sees; the math backend has none (a composite function, seen as its bmm and softmax).
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (torch's CPU kernel)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable (a backend's own)",
}
SDPA_ENABLED = ("flash", "mem_efficient", "math", "cudnn")  # torch.backends.cuda.<name>_sdp_enabled()


def attention_kernels(model, network: dict, autocast, train: bool) -> dict | None:
    """What torch ran for each attention (an attention layer, a transformer block's): the aten
    operator F.scaled_dot_product_attention dispatched to on one sample of the layer's shape, in the
    step's mode (training: autograd on and the layer's dropout, which decides the CPU's choice) under
    the step's autocast, on the eager module; and the backends torch has enabled. None when the
    network has no attention. torch's random state is left as it was."""
    torch = load_torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    attentions = []
    for i, (layer, module) in enumerate(zip(network["layers"], model)):
        if layer["type"] in ("attention", "transformer_block", "grouped_attention", "llama_block"):
            own = layer["type"] in ("attention", "grouped_attention")
            attentions.append((f"{i:03d}", layer["in_shape"], module if own else module.attn))
    if not attentions:
        return None

    class Dispatched(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, arg_types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    param = next(model.parameters())
    devices = [param.device] if param.device.type == "cuda" else []
    kernels, operators = {}, {}
    for name, shape, attn in attentions:
        was_training = attn.training
        attn.train(train)
        mode = Dispatched()
        try:
            with torch.random.fork_rng(devices=devices), (torch.enable_grad() if train else torch.no_grad()):
                x = torch.zeros(1, *shape, dtype=param.dtype, device=param.device)
                with autocast(), mode:
                    attn(x)
        finally:
            attn.train(was_training)
        fused = [op for op in mode.ops if op in SDPA_KERNELS]
        if fused:
            kernels[name], operators[name] = SDPA_KERNELS[fused[0]], f"aten.{fused[0]}"
        elif "bmm" in mode.ops:
            kernels[name], operators[name] = "math", "aten.bmm (the math backend's products)"
        else:
            kernels[name], operators[name] = "unknown", ", ".join(dict.fromkeys(mode.ops))

    def one_or_each(by_layer: dict):  # one value where every attention got the same, else per layer
        values = set(by_layer.values())
        return values.pop() if len(values) == 1 else by_layer

    return {
        "function": "torch.nn.functional.scaled_dot_product_attention",
        "kernel": one_or_each(kernels),
        "operator": one_or_each(operators),
        "enabled": {f"torch.backends.cuda.{n}_sdp_enabled()": getattr(torch.backends.cuda, f"{n}_sdp_enabled")()
                    for n in SDPA_ENABLED},
        "probe": ("one sample of each attention's input shape through its eager module (before any torch.compile) "
                  f"in {'training (autograd on, its dropout)' if train else 'inference'} mode under the step's "
                  "autocast; the aten operator torch dispatched to, seen by a TorchDispatchMode"),
    }
