"""What every framework's gTop-k integration test asserts of a compressed data-parallel run, once:
the run records its compression, the runner's own account of it and the analytical bytes; the
one-worker baseline is dense."""

from __future__ import annotations

import dataclasses

from dlbench.axes import Compression
from dlbench.definitions.weights import is_state, weight_shapes
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.performance.communication import exchange_bytes
from dlbench.store.store import Store


def gtopk_run(store: Store, options: DistributedOptions, runner, bench, density: float = 0.01):
    """Trains `bench` at gTop-k `density` on 2 workers (a few steps) and checks what is common to
    every framework; returns the 2-worker record's runner settings for the framework's own checks."""
    method = f"gtopk:{density}"
    short = dataclasses.replace(bench, compression=method,
                                policy=bench.policy.model_copy(update={"warmup_iters": 2, "measure_iters": 5}))
    base, two = DistributedOrchestrator(store, options).run_distributed(runner, short)
    assert base.status == two.status == "ok", (base.reason, two.reason)
    assert base.workload.compression == "none" and two.workload.compression == method
    settings = two.settings.runner["compression"]
    assert settings["method"] == method and settings["density"] == density and settings["error_feedback"]
    assert settings["rounds"] == 2  # the binomial tree at 2 ranks: one round up, one down
    shapes = [s for name, s in weight_shapes(bench.network.resolved).items() if not is_state(name)]
    expected = exchange_bytes(Compression.parse(method, who="test"), shapes, 2)
    assert two.distributed.exchange.total_bytes == expected.total == 2 * expected.payload
    assert expected.payload < two.distributed.grad_bytes / 12  # 1% of the values, with their indices
    return two.settings.runner
