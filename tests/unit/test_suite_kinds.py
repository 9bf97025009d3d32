"""Every suite kind is one entry of workflows/suite_kinds.py's table, with its planner and its
executor, and runs from Python as `dlbench run` runs it: `plan_run` checks the whole request (nothing
run or written on bad input), `execute_run` runs the plan, reporting through an events object and
printing nothing, and returns the records. The fake runner (tests/fixtures/runners/fake) stands in
for a framework (--env current)."""

from __future__ import annotations

import pytest

from dlbench.cli.run import DISPLAYS
from dlbench.definitions.catalog import SUITE_KINDS
from dlbench.workflows import (
    SUITE_KIND_TABLE,
    ConvergencePlan,
    DistributedPlan,
    KernelPlan,
    RequestError,
    RunRequest,
    execute_run,
    plan_run,
    run_suite,
)
from dlbench.workflows import kernels as kernels_workflow

pytestmark = pytest.mark.usefixtures("cli_env", "fast_fake_runner")


class Events:
    """Records every event by name; any event is taken."""

    def __init__(self):
        self.seen: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.seen.append((name, *args))

    def named(self, name: str) -> list[tuple]:
        return [e[1:] for e in self.seen if e[0] == name]


def request(suite: str, tmp_path, **options) -> RunRequest:
    asked = {"framework": ["fake"], "env": "current", "profile": "smoke", "device": "cpu", "store": tmp_path / "s"}
    return RunRequest(suite=suite, **{**asked, **options})


def test_every_kind_has_a_planner_an_executor_and_a_display():
    assert set(SUITE_KIND_TABLE) == set(SUITE_KINDS) == set(DISPLAYS)
    for kind in SUITE_KIND_TABLE.values():
        assert callable(kind.plan) and callable(kind.execute)


def test_a_distributed_suite_from_python(tmp_path, capsys):
    plan = plan_run(request("distributed", tmp_path, benchmark=["fcn5"], workers=2, scaling="weak", repeats=1))
    assert isinstance(plan, DistributedPlan) and plan.kind == "distributed" and plan.options.scaling == "weak"
    assert plan.options.placement.workers == 2 and plan.steps == 2  # the one-worker baseline and the job
    events = Events()
    records: list = []
    returned = execute_run(plan, events, records)
    assert returned is records
    assert sorted((r.benchmark, r.distributed.workers, r.status) for r in records) == [
        ("fcn5-train-w1", 1, "ok"), ("fcn5-train-w2", 2, "ok")]
    # weak scaling: the baseline runs one worker's batch, the job each worker's
    assert [label for label, _ in events.named("run_done")] == ["fake fcn5-train x1 b=32", "fake fcn5-train x2 b=64"]
    assert {p.stem for p in (tmp_path / "s" / "runs").glob("*.json")} == {r.run_id for r in records}
    assert capsys.readouterr() == ("", "")


def test_a_comm_suite_from_python(tmp_path, capsys):
    records = run_suite(request("comm", tmp_path, benchmark=["all_reduce", "broadcast"], workers=2))
    assert sorted(r.benchmark for r in records) == ["all_reduce-w2", "broadcast-w2"]
    assert all(r.status == "ok" and r.comm is not None for r in records)
    assert capsys.readouterr() == ("", "")


def test_a_kernel_suite_from_python(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kernels_workflow, "dtype_support_of", lambda device: {"float32": None, "float16": None,
                                                                             "bfloat16": None})
    plan = plan_run(request("kernels", tmp_path, benchmark=["transpose"], repeats=1, threads=1))
    assert isinstance(plan, KernelPlan) and [b.name for b in plan.benchmarks] == ["transpose"]
    assert plan.benchmarks[0].policy.repeats == 1 and plan.steps == 1 and plan.machine_profile is None
    events = Events()
    records = execute_run(plan, events)
    [record] = records
    assert record.benchmark == "transpose" and record.status == "ok" and record.kernels
    assert events.named("kernel_runs_planned") == [(1,)]
    assert [label for label, _ in events.named("kernel_run_done")] == ["fake transpose"]
    assert list((tmp_path / "s" / "kernels").rglob("*.json")) and not list((tmp_path / "s" / "runs").glob("*.json"))
    assert capsys.readouterr() == ("", "")


def test_a_convergence_suite_from_python_keeps_what_completed_when_interrupted(tmp_path, capsys):
    plan = plan_run(request("convergence", tmp_path, repeats=1))
    assert isinstance(plan, ConvergencePlan) and plan.precision is None
    assert len(plan.runs) == len(plan.tasks) > 1 and plan.steps == len(plan.runs)  # one seed each

    class StopAfterTheFirst(Events):
        def run_done(self, run, record):
            raise KeyboardInterrupt

    records: list = []
    with pytest.raises(KeyboardInterrupt):
        execute_run(plan, StopAfterTheFirst(), records)
    [record] = records  # the one written before the interrupt, handed back through the caller's list
    assert record.benchmark == plan.tasks[0].name and record.convergence is not None
    assert [p.stem for p in (tmp_path / "s" / "runs").glob("*.json")] == [record.run_id]
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("suite, options, words", [
    ("distributed", {"scaling": "diagonal"}, "unknown scaling 'diagonal'"),
    ("distributed", {"env": "docker"}, "--env docker does not run distributed jobs"),
    ("comm", {"benchmark": ["alltoall"]}, "unknown benchmark 'alltoall'"),
    ("comm", {"precision": ["amp_bf16"]}, "--precision is not taken by suite 'comm' of kind comm"),
    ("kernels", {"env": "docker"}, "--env docker does not run the kernels suite"),
    ("kernels", {"benchmark": ["fft"]}, "unknown benchmark 'fft'"),
    ("convergence", {"precision": ["fp32,amp_bf16"]}, "a convergence suite runs one precision at a time"),
    ("convergence", {"precision": ["float64"]}, "unknown precision 'float64'"),
    ("convergence", {"framework": ["nosuch"]}, "unknown framework 'nosuch'"),
    ("fcn", {"profile": "huge"}, "unknown profile 'huge'"),
])
def test_a_bad_request_of_each_kind_is_one_error_with_nothing_written(tmp_path, suite, options, words):
    with pytest.raises(RequestError, match=words):
        plan_run(request(suite, tmp_path, **options))
    assert not (tmp_path / "s").exists() and not (tmp_path / "cache" / "envs").exists()
