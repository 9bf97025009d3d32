"""The MXNet runner's PowerSGD exchange (KVStoreExchange) on one worker with a local kvstore (run in
the mxnet environment; no dlbench controller, no servers):
    ~/.cache/dlbench/envs/mxnet-cpu-*/bin/python benchmarks/compression_arithmetic_mxnet.py
With one worker the push-pull returns the worker's own factors, so this checks the method's own
arithmetic (the factors, the LQ orthonormalisation, the error feedback; the sum over workers is
the kvstore's): with a constant gradient, how far the cumulative update is from the gradient's
after 1, 10 and 60 steps (it must shrink), and that a matrix of rank <= r comes through whole.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the `runners` package

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from runners.common.contract import Compression  # noqa: E402
from runners.mxnet.distributed import KVStoreExchange  # noqa: E402

rng = np.random.default_rng(0)
shapes = [(20, 30), (30,), (30, 5)]
constant = [rng.standard_normal(s).astype(np.float32) for s in shapes]
grads = [mx.nd.zeros(s) for s in shapes]
trainable = [SimpleNamespace(list_grad=lambda g=g: [g]) for g in grads]
exchange = KVStoreExchange(mx.kv.create("local"), trainable, Compression.parse("powersgd:2", who="x"), world=1, seed=1)
total = [np.zeros(s, np.float32) for s in shapes]
for step in range(1, 61):
    for g, c in zip(grads, constant):
        g[:] = c
    exchange.push_pull()
    total = [t + g.asnumpy() for t, g in zip(total, grads)]
    if step in (1, 10, 60):
        gap = sum(np.abs(t - step * c).sum() for t, c in zip(total, constant)) / sum(np.abs(step * c).sum()
                                                                                     for c in constant)
        print(f"powersgd:2 cumulative update's distance from the gradients' after {step} steps: {gap:.0%}")
low_rank = np.outer(rng.standard_normal(20), rng.standard_normal(30)).astype(np.float32)
exchange = KVStoreExchange(mx.kv.create("local"), trainable[:1], Compression.parse("powersgd:2", who="x"), seed=2)
grads[0][:] = low_rank
exchange.push_pull()
print(f"a rank-1 matrix through powersgd:2: max relative error "
      f"{np.abs(grads[0].asnumpy() - low_rank).max() / np.abs(low_rank).max():.1e}")
