"""The convergence suite with --workers (issue 44, part 3): each seed a data-parallel job, dense
and each --compression method, compared seed by seed; the refusals made before anything runs. The
fake runner (tests/fixtures/runners/fake) trains its numpy learner data-parallel over its own TCP
engine and lists no compression but none, so a compressed run of it is recorded skipped."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from runners.common.convergence import rank_share
from dlbench.execution.convergence import PlannedConvergenceRun, _refusal, against_dense
from dlbench.store.record import ConvergenceRun
from dlbench.workflows import RequestError, RunRequest, execute_run, plan_run
from dlbench.workflows import lookup

SUITE = """
name: conv_parallel
kind: convergence
runs: {smoke: 1, default: 1, paper: 1}
tasks:
  - name: digits_linear
    network: digits_fcn5
    dataset: {name: digits}
    batch_size: 32
    optimizer: {name: sgd_momentum, learning_rate: 0.05, momentum: 0.9, weight_decay: 0.0001,
                warmup_epochs: 1, decay: {kind: cosine}}
    target: {value: 0.9}
    max_epochs: 10
"""


def request(tmp_path: Path, **options) -> RunRequest:
    suite = tmp_path / "conv_parallel.yaml"
    suite.write_text(SUITE)
    asked = {"framework": ["fake"], "env": "current", "profile": "smoke", "device": "cpu", "store": tmp_path / "s"}
    return RunRequest(suite=str(suite), **{**asked, **options})


@pytest.mark.usefixtures("cli_env")
def test_each_seed_is_a_data_parallel_job_dense_first_a_method_the_runner_lacks_skipped(tmp_path):
    plan = plan_run(request(tmp_path, workers=2, threads=1, compression=["topk:0.01,none"]))
    assert plan.workers == 2 and [r.compression for r in plan.runs] == ["none", "topk:0.01"]  # dense first
    records = execute_run(plan)
    dense, topk = records
    assert dense.status == "ok", dense.reason
    assert dense.benchmark == "digits_linear-w2" and dense.workload.compression == "none"
    assert dense.distributed.workers == 2 and dense.distributed.per_worker_batch == 16
    assert dense.distributed.global_batch == 32 and dense.distributed.exchange.method == "none"
    c = dense.convergence
    assert c.reached == 1 and [r.seed for r in c.runs] == [0] and c.against_dense is None
    for run in c.runs:  # rank 0's run: the whole evaluation split counted (both ranks' shares)
        assert run.eval_samples == 359 and run.evals[-1]["accuracy"] >= 0.9 and run.mllog
        assert (tmp_path / "s" / run.mllog).is_file()
    assert topk.status == "skipped" and topk.workload.compression == "topk:0.01" and not topk.convergence.runs
    assert topk.reason == ("fake data-parallel runner: compression topk is not one it trains in "
                           "(runner.toml [distributed] compressions: none)")


@pytest.mark.usefixtures("cli_env")
@pytest.mark.parametrize("options, words", [
    ({"compression": ["fp16"]}, "--compression: a convergence task on one worker exchanges no gradients"),
    ({"link": "1gbit"}, "--link: a convergence task on one worker exchanges no gradients"),
    ({"workers": 3}, "batch_size 32 does not split evenly over --workers 3"),
    ({"workers": 2, "env": "docker"}, "--env docker does not run multi-worker jobs"),
    ({"workers": 2, "compression": ["lz4"]}, "--compression: compression 'lz4' is not one it accepts"),
    ({"workers": 2, "scaling": "weak"}, "--scaling is not taken by suite 'conv_parallel' of kind convergence"),
    ({"workers": 2, "hosts": "a,b"}, "--hosts is not taken by suite 'conv_parallel' of kind convergence"),
])
def test_a_bad_data_parallel_request_is_one_error_with_nothing_written(tmp_path, options, words):
    with pytest.raises(RequestError, match=words):
        plan_run(request(tmp_path, **options))
    assert not (tmp_path / "s").exists()


@pytest.mark.usefixtures("cli_env")
def test_more_workers_than_cores_needs_oversubscribe(tmp_path):
    from dlbench.machine import available_cpus

    if available_cpus() >= 32:
        pytest.skip("32 workers fit this machine's cores")
    with pytest.raises(RequestError, match="32 workers on .* would oversubscribe its .* cores.*--oversubscribe"):
        plan_run(request(tmp_path, workers=32, threads=1))
    plan = plan_run(request(tmp_path, workers=32, threads=1, oversubscribe=True))
    assert plan.workers == 32 and plan.jobs.threads == 1


def test_a_runner_without_a_convergence_loop_says_why_before_anything_runs():
    registry = lookup.registry()
    task = SimpleNamespace(name="digits_cnn")
    for name in ("tensorflow", "mxnet"):
        why = _refusal(PlannedConvergenceRun(registry.get(name), task, "none"), "fp32")
        assert why.startswith(f"{name} runner: the runner's ranks have no convergence loop yet")
        assert why.endswith("(runner.toml [distributed] convergence_not_offered)")
    for name in ("torch", "jax"):
        assert _refusal(PlannedConvergenceRun(registry.get(name), task, "powersgd:4"), "fp32") is None
    assert "amp_fp16 is not one it trains in" in _refusal(PlannedConvergenceRun(registry.get("jax"), task, "none"),
                                                          "amp_fp16")


def _run(seed, time_s=None, status="ok", epochs=5, best=0.95):
    return ConvergenceRun(seed=seed, status=status, reached=time_s is not None, time_to_target_s=time_s,
                          epochs=epochs, evals=[{"epoch": epochs, "accuracy": best, "time_s": 1.0}],
                          reason=None if status == "ok" else "killed")


def test_a_compressed_run_is_compared_with_dense_seed_by_seed_and_a_miss_says_so():
    dense = SimpleNamespace(run_id="dense-1", reason=None, convergence=SimpleNamespace(
        runs=[_run(0, 10.0), _run(1, 12.0), _run(2, None, best=0.96)], score_s=11.0, reason=None))
    info = SimpleNamespace(runs=[_run(0, 5.0), _run(1, None, best=0.931), _run(2, 8.0), _run(3, 1.0)],
                           max_epochs=30, score_s=None, reason="2 of 4 runs did not reach the target")
    d = against_dense(info, dense)
    assert d.dense_run_id == "dense-1"
    assert [s.speedup for s in d.seeds] == [2.0, None, None, None]
    assert d.seeds[1].reason == "this run did not reach the target in 5 epochs (best top-1 0.931)"
    assert d.seeds[2].reason == "the dense run did not reach the target in 5 epochs (best top-1 0.960)"
    assert d.seeds[3].reason == "the dense run has no such seed"
    assert d.score_speedup is None and d.reason == "this run has no score (2 of 4 runs did not reach the target)"
    info.score_s = 5.5
    assert against_dense(info, dense).score_speedup == pytest.approx(2.0)


@pytest.mark.parametrize("total, world", [(32, 2), (359, 2), (359, 4), (8, 4), (3, 4)])
def test_the_ranks_shares_cover_every_item_once(total, world):
    shares = [rank_share(total, r, world) for r in range(world)]
    items = [i for s in shares for i in range(total)[s]]
    assert items == list(range(total))
    assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1
