"""torch itself, for every module of the torch runner: imported on first use (`load_torch()`), never
at module level, since the runner sets the OpenMP variables that torch reads at import first
(runner.py's configure_threads); and the device helpers everything else needs (waiting for the
device, a tensor brought to the host).
"""

from __future__ import annotations


def load_torch():
    """The torch module (imported on first use)."""
    import torch

    return torch


def synchronizer(device):
    torch = load_torch()
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def host_array(t):
    """A tensor as numpy: float64 stays float64 (the check's precision), anything else float32."""
    torch = load_torch()
    return t.detach().to(torch.float64 if t.dtype == torch.float64 else torch.float32).cpu().numpy().copy()


