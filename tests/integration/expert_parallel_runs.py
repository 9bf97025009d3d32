"""What every framework's expert-parallel integration test asserts, once: moe_tiny at 2 workers of
the smoke profile (a few steps), data parallelism then expert parallelism of the same network from
the same weights and data, training it alike."""

from __future__ import annotations

import dataclasses

import pytest

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.store.store import Store

# moe_tiny's experts: two blocks of 4 experts' gate, up and down (128 x 64 each)
MOE_TINY_EXPERT_PARAMS = 2 * 3 * 4 * 128 * 64


def data_and_expert_runs(store: Store, options: DistributedOptions, runner):
    """The 2-worker data-parallel and expert-parallel records of moe_tiny, after the checks common to
    every framework: both ok; the same loss after the first step (same weights, same data) and
    after each update (the experts' gradients summed over every rank's tokens and the others'
    all-reduced average as data parallelism's do), to float32 summation order; the experts (2 per
    rank) not among the exchanged gradients; no all-to-all in the data-parallel run."""
    catalog = SuiteCatalog(paths.suites_dir())
    dist = catalog.load_distributed_suite(paths.suites_dir() / "distributed.yaml", "smoke", "cpu")
    moe = next(b for b in dist.benchmarks if b.network.name == "moe_tiny")
    moe = dataclasses.replace(moe, policy=moe.policy.model_copy(update={"warmup_iters": 2, "measure_iters": 3}))
    orch = DistributedOrchestrator(store, options)
    base, data = orch.run_distributed(runner, moe)
    (expert,) = orch.run_distributed(runner, dataclasses.replace(moe, parallelism="expert"))  # same baseline
    assert base.status == data.status == expert.status == "ok", (base.reason, data.reason, expert.reason)
    assert (data.workload.parallelism, expert.workload.parallelism) == ("data", "expert")
    first, *updated = expert.distributed.step_losses
    assert first == pytest.approx(data.distributed.step_losses[0], rel=1e-6)
    assert updated == pytest.approx(data.distributed.step_losses[1:], rel=1e-5) and len(updated) == 2
    assert expert.params == data.params == moe.network.params
    assert expert.distributed.grad_bytes == 4 * (moe.network.params - MOE_TINY_EXPERT_PARAMS)
    assert expert.distributed.all_to_all.experts_per_worker == [2, 2]
    assert expert.settings.runner["expert_parallel"]["experts_held"] == [[0, 1], [0, 1]]  # rank 0's
    assert data.distributed.all_to_all is None
    return data, expert
