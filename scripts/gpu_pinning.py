"""The fp32 pinning, proved on a GPU: an 8192x8192 float32 matmul in each framework installed here,
timed with TF32 pinned off (what `--precision fp32` sets) and allowed (`tf32`). On Ampere or newer
the pinned rate must be well below the TF32 rate (an H200: ~60 against ~400+ TFLOP/s dense); the
flags each mode set are read back and printed beside the rate. A framework not installed is said
so. Exit 1 when a framework's fp32 rate is not below RATIO_LIMIT x its tf32 rate.

Usage: python3 scripts/gpu_pinning.py [--n 8192] [--iters 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

RATIO_LIMIT = 0.7


def _rate(n: int, seconds: float, iters: int) -> float:
    return 2 * n**3 * iters / seconds / 1e12


def torch_rates(n: int, iters: int) -> dict:
    import torch

    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    out = {}
    for mode, allow in (("fp32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
        torch.set_float32_matmul_precision("high" if allow else "highest")
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()
        out[mode] = (_rate(n, time.perf_counter() - t0, iters),
                     {"matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                      "float32_matmul_precision": torch.get_float32_matmul_precision()})
    return out


def jax_rates(n: int, iters: int) -> dict:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    out = {}
    for mode, precision in (("fp32", "highest"), ("tf32", "tensorfloat32")):
        f = jax.jit(lambda x, y, p=precision: jnp.matmul(x, y, precision=p))
        f(a, b).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(iters):
            r = f(a, b)
        r.block_until_ready()
        out[mode] = (_rate(n, time.perf_counter() - t0, iters), {"precision": precision})
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    status = 0
    for name, fn in (("torch", torch_rates), ("jax", jax_rates), ("tensorflow", None), ("mxnet", None)):
        if importlib.util.find_spec(name) is None or fn is None:
            why = "not installed here" if importlib.util.find_spec(name) is None else "no GPU build on this host"
            print(f"{name:<11} {why}")
            continue
        rates = fn(args.n, args.iters)
        (fp32, fp32_flags), (tf32, tf32_flags) = rates["fp32"], rates["tf32"]
        ok = fp32 < RATIO_LIMIT * tf32
        status |= not ok
        print(f"{name:<11} fp32 {fp32:7.1f} TFLOP/s {fp32_flags}  tf32 {tf32:7.1f} TFLOP/s {tf32_flags}  "
              f"fp32/tf32 {fp32 / tf32:.2f} {'ok' if ok else f'NOT below {RATIO_LIMIT}: fp32 is not pinned'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
