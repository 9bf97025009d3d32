"""MXNet itself, for every module of the mxnet runner: the library imported on first use
(`load_mxnet()`), after the runner has set the OpenMP variables that its engine reads when the
library loads (runner.py, configure_threads), and what the modules above share of the framework:
Gluon's layer namespace, MXNet's error sentences, the CPU's bfloat16 instruction set and the names
of the fused self-attention operators.

Nothing here imports mxnet or numpy at module level: the layer table (layers.py) must import without
the framework.
"""

from __future__ import annotations

_mx = None


def load_mxnet():
    """The mxnet module (imported on first use, its import-time warnings silenced)."""
    global _mx
    if _mx is None:
        import warnings

        with warnings.catch_warnings():
            # mxnet 1.9.1 warns on import (numpy aliases, distutils); nothing the user can act on.
            warnings.simplefilter("ignore")
            import mxnet

        _mx = mxnet
    return _mx


def mxnet_loaded() -> bool:
    """Whether load_mxnet() has imported mxnet already."""
    return _mx is not None


def gluon_nn():
    """mxnet.gluon.nn, Gluon's layer blocks."""
    return load_mxnet().gluon.nn


def framework_message(e: Exception) -> str:
    """The framework's own sentence of an MXNetError (its last "MXNetError: ..." line, the source file)."""
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    message = next((l for l in reversed(lines) if l.startswith("MXNetError:")), lines[-1] if lines else repr(e))
    where = next((l.split('"')[1] for l in lines if l.startswith('File "') and '"' in l[6:]), None)
    message = message.replace("MXNetError: ", "", 1)
    return f"{message} ({where.lstrip('./')})" if where else message


def cpu_bf16_isa() -> str:
    """What this CPU offers oneDNN for bfloat16, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l for l in f if l.startswith("flags")), "").split(":", 1)[-1].split())
    except OSError:
        return "its instruction set is unknown"
    wanted = ("avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
    have = [w for w in wanted if w in flags]
    if have:
        return f"this CPU has {', '.join(have)}"
    return (f"this CPU has {'avx2' if 'avx2' in flags else 'no avx2'} and none of {', '.join(wanted)}; oneDNN's "
            "bfloat16 kernels need AVX-512 (avx512_core) or newer")


# The layer types with a self-attention (a standalone one, a transformer block's), and MXNet's fused
# operators that compute it (transformer.py's SelfAttention): what AMP must keep in float32
# (precision.py), what the attention report looks for (attention.py).
ATTENTION_TYPES = ("attention", "transformer_block")
FUSED_ATTENTION_OPS = ("_contrib_interleaved_matmul_selfatt_qk", "_contrib_interleaved_matmul_selfatt_valatt")


def has_attention(network: dict) -> bool:
    return any(layer["type"] in ATTENTION_TYPES for layer in network["layers"])
