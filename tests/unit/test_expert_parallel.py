"""Expert parallelism (issue 45): the `Parallelism` axis, the planner's refusals (a network without
experts, one worker, experts that do not split evenly, a compression beside it), the bytes still
all-reduced, the harness's losses and all-to-all figures, runner.toml's [distributed]
parallelisms and their reasons, the schema-20 migration, and `dlbench run --parallelism` end to
end with the fake runner (which trains data-parallel only: an expert-parallel run is recorded
skipped with its reason). The frameworks' own steps: tests/integration/test_torch_distributed.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dlbench import paths
from dlbench.axes import Parallelism
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.distributed import moe_experts
from dlbench.definitions.loader import DefinitionError
from dlbench.execution.distributed import _exchange
from dlbench.execution.registry import RunnerRegistry, parse_runner_toml
from dlbench.store import migrations
from dlbench.store.record import SCHEMA_VERSION, Record
from dlbench.workflows.distributed import _check_expert_parallel
from dlbench.workflows.requests import RequestError
from runners.common.contract import DataParallel
from runners.common.distributed_harness import measure_data_parallel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


@pytest.fixture(scope="module")
def suite():
    return SuiteCatalog(paths.suites_dir()).load_distributed_suite(paths.suites_dir() / "distributed.yaml", "smoke",
                                                                   "cpu")


def benchmark(suite, network: str, **changes):
    b = next(b for b in suite.benchmarks if b.network.name == network)
    return dataclasses.replace(b, **changes)


# ------------------------------------------------------------------ the axis and the plan


def test_the_axis_parses_its_two_values_and_refuses_others():
    assert Parallelism.parse("expert", who="t") is Parallelism.EXPERT
    with pytest.raises(ValueError, match="parallelism 'pipeline' is not one it accepts"):
        Parallelism.parse("pipeline", who="t")


def test_the_experts_of_each_moe_layer(suite):
    assert moe_experts(benchmark(suite, "moe_tiny").network.resolved) == [4, 4]
    assert moe_experts(benchmark(suite, "fcn5").network.resolved) == []


def test_expert_parallelism_of_moe_tiny_over_two_and_four_workers_is_planned(suite):
    expert = benchmark(suite, "moe_tiny", parallelism="expert")
    for workers in (2, 4):
        _check_expert_parallel([expert, benchmark(suite, "fcn5")], workers, "distributed.yaml")


@pytest.mark.parametrize("network, workers, changes, message", [
    ("fcn5", 2, {}, "distributed.yaml: benchmarks: fcn5: --parallelism expert needs Mixture-of-Experts layers to "
                    "shard, and fcn5 has none (choose moe_tiny with --benchmark)"),
    ("moe_tiny", 1, {}, "--parallelism expert shards the experts over 2 workers at least (--workers 1)"),
    ("moe_tiny", 3, {}, "distributed.yaml: benchmarks: moe_tiny: --parallelism expert: 4 experts do not split "
                        "evenly over 3 workers"),
    ("moe_tiny", 2, {"compression": "topk:0.01"}, "--parallelism expert with --compression topk:0.01"),
])
def test_what_expert_parallelism_cannot_do_is_refused_before_anything_runs(suite, network, workers, changes,
                                                                          message):
    chosen = [benchmark(suite, network, parallelism="expert", **changes), benchmark(suite, "moe_tiny")]
    with pytest.raises(RequestError) as e:
        _check_expert_parallel(chosen, workers, "distributed.yaml")
    assert message in str(e.value)


def test_an_expert_parallel_run_all_reduces_every_weight_but_the_experts(suite):
    data = _exchange(benchmark(suite, "moe_tiny"), 2)
    expert = _exchange(benchmark(suite, "moe_tiny", parallelism="expert"), 2)
    experts = 2 * 3 * 4 * 128 * 64  # two blocks of 4 experts' gate, up and down, 128 x 64 each
    assert data.payload_bytes == 4 * 287_552
    assert expert.payload_bytes == 4 * (287_552 - experts)


# ------------------------------------------------------------------ the harness


class Counting:
    """A rank whose step advances a loss and all-to-all totals by known amounts."""

    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1

    def totals(self):
        return {"seconds": 0.5 * self.steps, "bytes": 1000 * self.steps, "calls": 10 * self.steps}


def test_the_harness_reads_the_losses_between_steps_and_the_all_to_alls_around_the_window():
    rank = Counting()
    dp = DataParallel(rank.step, None, lambda: None, 1, [1], {}, 4, loss=lambda: 10.0 - rank.steps,
                      all_to_all=rank.totals)
    out = measure_data_parallel(dp, lambda: None, warmup_iters=2, measure_iters=4)
    assert out["losses"] == [9.0, 8.0, 7.0]  # after the first step and each warm-up step
    assert out["all_to_all"] == {"seconds": 0.5, "bytes": 1000.0, "calls": 10.0}  # per measured step


def test_a_runner_that_reads_no_loss_reports_none():
    dp = DataParallel(lambda: None, None, lambda: None, 1, [1], {}, 4)
    out = measure_data_parallel(dp, lambda: None, warmup_iters=1, measure_iters=2)
    assert out["losses"] is None and "all_to_all" not in out


# ------------------------------------------------------------------ runner.toml


def runner_toml(tmp_path, distributed: str):
    path = tmp_path / "runner.toml"
    path.write_text('name = "x"\nimport_name = "x"\nworker = "w.py"\n[requirements]\ncpu = "a"\ncuda = "b"\n'
                    '[capabilities]\nprecisions = ["fp32"]\ncompile = ["eager"]\nmodes = ["train"]\n'
                    '[distributed]\nworker = "d.py"\nlaunch = "ranks"\n' + distributed)
    return path


def test_runner_toml_lists_parallelisms_data_where_it_names_none(tmp_path):
    toml = parse_runner_toml(runner_toml(tmp_path, 'parallelisms = ["data", "expert"]\n'))
    assert toml.distributed.parallelisms == (Parallelism.DATA, Parallelism.EXPERT)
    assert parse_runner_toml(runner_toml(tmp_path, "")).distributed.parallelisms == (Parallelism.DATA,)


def test_a_reason_for_a_listed_parallelism_is_refused(tmp_path):
    with pytest.raises(DefinitionError) as e:
        parse_runner_toml(runner_toml(tmp_path, 'parallelisms = ["data", "expert"]\n'
                                                '[distributed.parallelism_refused]\nexpert = "x"\n'))
    assert "parallelism_refused gives a reason for expert, which parallelisms lists" in str(e.value)


def test_every_shipped_runner_runs_expert_parallelism_or_says_why_not():
    registry = RunnerRegistry(paths.runners_dir())
    for name in ("torch", "jax", "mxnet", "tensorflow"):
        d = registry.get(name).distributed
        runs = Parallelism.EXPERT in d.capabilities.listed(Parallelism)
        assert runs != bool(d.refusal_reason(Parallelism.EXPERT)), name
    for name in ("torch", "jax", "tensorflow"):  # the ones whose step is written (MXNet's kvstore has no all-to-all)
        assert Parallelism.EXPERT in registry.get(name).distributed.capabilities.listed(Parallelism), name


# ------------------------------------------------------------------ the record


def record_of(version: int) -> dict:
    data = json.loads((FIXTURES / f"v{version}.json").read_text())
    data.pop("checksum", None)
    return data


def test_older_distributed_training_records_read_as_data_parallel():
    assert SCHEMA_VERSION == 20
    v5 = Record.model_validate(migrations.upgrade(record_of(5), SCHEMA_VERSION))  # torch fcn5-train-w2
    assert v5.workload.parallelism == "data" and v5.distributed.all_to_all is None
    v14 = Record.model_validate(migrations.upgrade(record_of(14), SCHEMA_VERSION))  # single-process
    assert v14.workload.parallelism is None


def test_runs_pair_on_their_parallelism():
    from dlbench.analysis.comparison import KEY_FIELDS

    assert "parallelism" in KEY_FIELDS


# ------------------------------------------------------------------ dlbench run --parallelism


def test_a_runner_without_expert_parallelism_records_it_skipped(cli_env, fast_fake_runner, invoke, tmp_path):
    store = tmp_path / "s"
    code, _, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                          "smoke", "--benchmark", "moe_tiny", "--store", str(store), "--parallelism", "data,expert",
                          "--workers", "2", "--threads", "1")
    records = [json.loads(p.read_text()) for p in (store / "runs").glob("*.json")]
    by = {(r["distributed"]["workers"], r["workload"]["parallelism"]): r for r in records}
    assert sorted(by) == [(1, "data"), (2, "data"), (2, "expert")], err  # one data-parallel baseline for both
    expert = by[(2, "expert")]
    assert expert["status"] == "skipped" and not expert["repeats"]
    assert expert["reason"] == ("fake data-parallel runner: parallelism expert is not one it trains in "
                                "(runner.toml [distributed] parallelisms: data)")


def test_expert_parallelism_of_a_network_without_experts_ends_the_command(cli_env, fast_fake_runner, invoke, tmp_path):
    code, _, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                          "smoke", "--benchmark", "fcn5", "--store", str(tmp_path / "s"), "--parallelism", "expert")
    assert code == 2 and "fcn5 has none (choose moe_tiny with --benchmark)" in err
    assert not (tmp_path / "s").exists()


def test_a_single_process_suite_refuses_parallelism(cli_env, fast_fake_runner, invoke, tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "fake", "--env", "current", "--profile", "smoke",
                          "--store", str(tmp_path / "s"), "--parallelism", "expert")
    assert code == 2 and "--parallelism is not taken by suite 'fcn'" in err
