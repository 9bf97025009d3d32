"""The convergence suite with --workers (issue 44, part 3) in torch's and jax's real environments:
the smallest digits task (64 training images, 21 evaluation images, 8 steps of batch 8 on 2
ranks, one epoch, one seed) trained data-parallel dense and with top-k, to a target one epoch
cannot reach, so that both runs complete and say they missed it: the path, the rank shares and the
comparison with dense, not the accuracy (tests/integration/test_convergence.py has that)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import mllog_reader

from dlbench.cli import app
from dlbench.store.store import Store

pytestmark = pytest.mark.integration

TASK = """
name: conv_dp
kind: convergence
runs: {smoke: 1, default: 1, paper: 1}
tasks:
  - name: digits_dp
    network: digits_cnn
    dataset: {name: digits, train_samples: 64, eval_samples: 21}
    batch_size: 8
    optimizer: {name: sgd_momentum, learning_rate: 0.05, momentum: 0.9, weight_decay: 0.0005, warmup_epochs: 0.5,
                decay: {kind: cosine}}
    target: {value: 1.0}
    max_epochs: 1
    loader_workers: 1
"""


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_dense_and_top_k_train_data_parallel_and_a_miss_says_so(framework, tmp_path):
    path = tmp_path / "conv_dp.yaml"
    path.write_text(TASK)
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["run", "--suite", str(path), "--framework", framework, "--profile", "smoke",
                                      "--workers", "2", "--threads", "1", "--compression", "topk:0.01",
                                      "--store", str(store)], catch_exceptions=False)
    records = {r.workload.compression: r for r in Store(store).records()}
    assert sorted(records) == ["none", "topk:0.01"], result.output
    for method, record in records.items():
        (run,) = record.convergence.runs
        assert run.status == "ok", (record.reason, record.output_tail[-3000:])
        assert record.benchmark == "digits_dp-w2" and record.distributed.workers == 2
        assert record.distributed.per_worker_batch == 4 and record.distributed.exchange.method == method
        assert run.epochs == 1 and run.steps == 8 and run.train_samples == 64 and run.eval_samples == 21
        correct = run.evals[0]["accuracy"] * 21  # both ranks' shares (11 and 10 images) counted together
        assert abs(correct - round(correct)) < 1e-9
        assert not run.reached and record.status == "failed" and "did not reach the target" in record.reason
        assert record.settings.runner["compression"]["method"] == method
        events = mllog_reader.read(store / run.mllog)  # rank 0's log
        assert [e["value"] for e in events if e["key"] == "global_batch_size"] == [8]
    against = records["topk:0.01"].convergence.against_dense
    assert against.dense_run_id == records["none"].run_id and against.score_speedup is None
    assert against.seeds[0].reason.startswith("this run did not reach the target in 1 epochs")
    assert result.exit_code == 1  # runs without a score fail the command, as on one worker
