"""The MXNet runner's top-k exchange (KVStoreExchange) on 2 workers of a real dist_sync kvstore, no
dlbench controller (run in the mxnet environment; it starts its own ps-lite scheduler, servers and
workers on 127.0.0.1):
    ~/.cache/dlbench/envs/mxnet-cpu-*/bin/python benchmarks/compression_topk_mxnet.py [SERVERS] [BIGARRAY_BOUND]
Every worker makes every worker's gradients from one seed, so each can compute the exchange's
expected result in numpy (each worker's k largest |gradient + residual| per tensor, summed over
the workers, the residual kept) and compare it with what came back through the servers: at
density 1 (every entry: the dense sum) and at density 0.1 over several steps (error feedback).
It also shows MXNet 1.9.1's handling of row_sparse pushes of scattered rows (each worker's k entries
as k rows of an (n, 1) key, the union pulled): through a key initialised row_sparse they come back
wrong, through one initialised dense right (runners/mxnet/distributed.py's docstring says why).
SERVERS (default 1) servers; BIGARRAY_BOUND (MXNET_KVSTORE_BIGARRAY_BOUND, default MXNet's) small
splits every key's rows over the servers.
"""

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the `runners` package

WORKERS = 2
SHAPES = [(40, 30), (30,), (30, 7)]


def launch(servers: int, bound: str | None) -> int:
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": os.environ.get("CHECK_SCHEDULER_PORT", "29517"),
           "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(WORKERS), "DMLC_NODE_HOST": "127.0.0.1",
           "OMP_NUM_THREADS": "1"}
    if bound:
        env["MXNET_KVSTORE_BIGARRAY_BOUND"] = bound
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * WORKERS
    procs = [subprocess.Popen([sys.executable, __file__], env={**env, "DMLC_ROLE": role}) for role in roles]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            break  # one died: the others would wait for it forever
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return max(p.wait() for p in procs)


def expected_sums(all_grads, residuals, density):
    """Each worker's per-tensor top-k of gradient + residual, summed over the workers; residuals updated."""
    from runners.common.contract import topk_count
    import numpy as np

    sums = [np.zeros(g.size, np.float32) for g in all_grads[0]]
    for w, grads in enumerate(all_grads):
        for i, g in enumerate(grads):
            acc = g.reshape(-1) + residuals[w][i]
            k = topk_count(acc.size, density)
            picked = np.argpartition(-np.abs(acc), k - 1)[:k]
            sent = np.zeros_like(acc)
            sent[picked] = acc[picked]
            residuals[w][i] = acc - sent
            sums[i] += sent
    return sums


def work() -> int:
    import mxnet as mx
    import numpy as np

    from runners.common.contract import Compression
    from runners.mxnet.distributed import EXCHANGE_KEY_BASE, KVStoreExchange

    kv = mx.kv.create("dist_sync")
    rank = kv.rank
    failures = 0
    for check, (density, steps) in enumerate(((1.0, 1), (0.1, 5))):
        grads = [mx.nd.zeros(s) for s in SHAPES]
        trainable = [SimpleNamespace(list_grad=lambda g=g: [g]) for g in grads]
        exchange = KVStoreExchange(kv, trainable, Compression.parse(f"topk:{density:g}", who="check"), WORKERS,
                                   key_base=EXCHANGE_KEY_BASE + 100 * check)
        # every worker's residuals, kept in numpy for the expected sums
        residuals = [[np.zeros(int(np.prod(s)), np.float32) for s in SHAPES] for _ in range(WORKERS)]
        worst = 0.0
        for step in range(steps):
            rng = np.random.default_rng(100 * step + int(density * 10))
            all_grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(WORKERS)]
            for g, mine in zip(grads, all_grads[rank]):
                g[:] = mine
            exchange.push_pull()
            expected = expected_sums(all_grads, residuals, density)
            for g, e in zip(grads, expected):
                worst = max(worst, float(np.abs(g.asnumpy().reshape(-1) - e).max() / np.abs(e).max()))
        ok = worst < 1e-6
        failures += not ok
        print(f"rank {rank} topk:{density:g} over {steps} step(s): max relative error against numpy {worst:.1e} "
              f"({'ok' if ok else 'WRONG'})", flush=True)
    # scattered rows pushed to an (n, 1) key, the union pulled: what the runner does not do, and why
    n = 1000
    rows = [np.array([3, 100, 500, 700, 900]), np.array([3, 50, 501, 701, 990])]
    values = [np.arange(1, 6, dtype=np.float32), np.arange(10, 15, dtype=np.float32)]
    expected = np.zeros(n, np.float32)
    for r, v in zip(rows, values):
        expected[r] += v
    union = np.unique(np.concatenate(rows))
    every_row = mx.nd.array(np.arange(n), dtype="int64")
    for key, (what, init) in enumerate((
            ("initialised row_sparse (every row present)",
             mx.nd.sparse.row_sparse_array((mx.nd.zeros((n, 1)), every_row), shape=(n, 1))),
            ("initialised dense", mx.nd.zeros((n, 1)))), start=1 << 22):
        kv.init(key, init)
        kv.push(key, mx.nd.sparse.row_sparse_array((mx.nd.array(values[rank][:, None]),
                                                    mx.nd.array(rows[rank], dtype="int64")), shape=(n, 1)))
        out = mx.nd.sparse.zeros("row_sparse", (n, 1))
        kv.row_sparse_pull(key, out=out, row_ids=mx.nd.array(union, dtype="int64"))
        got = out.tostype("default").asnumpy().reshape(-1)
        print(f"rank {rank} an (n, 1) key {what}, 5 scattered rows pushed by each worker, the union pulled: "
              f"max error {np.abs(got - expected).max():g} (expected {expected[union].tolist()}, "
              f"got {got[union].tolist()})", flush=True)
    kv._barrier()
    del kv
    return 1 if failures else 0


if __name__ == "__main__":
    role = os.environ.get("DMLC_ROLE")
    if role is None:
        sys.exit(launch(int(sys.argv[1]) if len(sys.argv) > 1 else 1, sys.argv[2] if len(sys.argv) > 2 else None))
    if role in ("scheduler", "server"):
        import mxnet  # noqa: F401  - serves the role until the workers leave
        sys.exit(0)
    sys.exit(work())
