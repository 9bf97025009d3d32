"""The jax runner's GradientExchange against lax.pmean on 4 virtual CPU devices of one process
(run in the jax environment; no dlbench controller needed):
    ~/.cache/dlbench/envs/jax-cpu-*/bin/python benchmarks/compression_arithmetic_jax.py
Prints, per method, the largest relative difference from dense's averaged gradients and whether
every rank got the same; then, with constant gradients, how far the cumulative update of the
methods with error feedback is from dense's after 1, 10 and 60 steps (it must shrink).
"""

import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the `runners` package

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from runners.common.contract import Compression  # noqa: E402
from runners.jax.distributed import AXIS, GradientExchange  # noqa: E402
n = 4
mesh = Mesh(np.array(jax.devices()), (AXIS,))
rng = np.random.default_rng(0)
params = {"a": np.zeros((20, 30), np.float32), "b": np.zeros((30,), np.float32), "c": np.zeros((30, 5), np.float32)}
steps = [{k: rng.standard_normal((n,) + v.shape).astype(np.float32) for k, v in params.items()} for _ in range(3)]
def run(method):
    ex = GradientExchange(Compression.parse(method, "x"), n)
    kept = jax.tree.map(lambda a: np.stack([a] * n), ex.host_state(params, np.random.default_rng(1)))
    def body(g, kept):
        g = jax.tree.map(lambda a: a[0], g); kept = jax.tree.map(lambda a: a[0], kept)
        out, kept = ex.exchange(g, kept)
        return jax.tree.map(lambda a: a[None], out), jax.tree.map(lambda a: a[None], kept)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=(P(AXIS), P(AXIS)), check_vma=False))
    outs = []
    for g in steps:
        out, kept = f(g, kept)
        outs.append(out)
    return outs
dense = run("none")
for ref, got in zip(steps, dense):  # dense = mean over ranks, on every rank
    for k in ref: assert np.allclose(np.asarray(got[k]), ref[k].mean(0, keepdims=True).repeat(n, 0), atol=1e-6)
for method in ["fp16", "bf16", "topk:1", "gtopk:1", "powersgd:5", "topk:0.1", "gtopk:0.1"]:
    got = run(method)
    err = max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max() / np.abs(np.asarray(b[k])).max()) for a, b in zip(got, dense) for k in a)
    same = all(np.allclose(np.asarray(a[k])[0], np.asarray(a[k])[r]) for a in got for k in a for r in range(n))
    print(method, f"max rel err vs dense {err:.2e}", "identical on every rank:", same)
print("error feedback: constant gradients, 60 steps, cumulative applied vs cumulative dense")
steps = [steps[0]] * 60
dense = run("none")
for method in ["powersgd:2", "topk:0.1", "gtopk:0.1"]:
    got = run(method)
    for T in (1, 10, 60):
        err = max(float(np.abs(sum(np.asarray(a[k]) for a in got[:T]) - sum(np.asarray(b[k]) for b in dense[:T])).max()
                        / np.abs(sum(np.asarray(b[k]) for b in dense[:T])).max()) for k in got[0])
        print(method, T, f"{err:.3f}")
