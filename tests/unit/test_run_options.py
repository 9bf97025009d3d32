"""Every option of `dlbench run` is honoured or refused by each suite kind, from one table
(workflows/suite_kinds.py): an option a kind does not honour ends the command with one error naming
the option, the suite, its kind and what the option is for, exit 2, nothing run or written; the
options a kind honours reach its records. The fake runner stands in for a framework (--env current)."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from dlbench.axes import REQUEST_AXES
from dlbench.cli.run import run
from dlbench.definitions.catalog import SUITE_KINDS
from dlbench.workflows import RUN_OPTIONS, SUITE_KIND_TABLE, RunRequest


# a shipped suite of each kind
SUITE_OF_KIND = {"benchmark": "fcn", "distributed": "distributed", "comm": "comm", "kernels": "kernels",
                 "convergence": "convergence"}
# each option set away from its default, as the command line gives it (None: every kind honours it);
# an axis's option (REQUEST_AXES) at the last value a run may ask for
SET = {
    "suite": None, "framework": None, "store": None, "benchmark": None, "profile": None, "device": None,
    "env": None, "threads": None, "timeout": None, "repeats": None,
    "max_repeats": ["--max-repeats", "5"], "target_ci": ["--target-ci", "2"],
    "sample_interval": ["--sample-interval", "50"], "no_telemetry": ["--no-telemetry"],
    "contention_threshold": ["--contention-threshold", "5"], "replace_contended": ["--replace-contended", "1"],
    "quiet_wait": ["--quiet-wait", "1"], "workers": ["--workers", "2"], "scaling": ["--scaling", "weak"],
    "hosts": ["--hosts", "127.0.0.1"], "compile_mode": ["--compile-mode", "max-autotune"],
    "no_check": ["--no-check"], "data": ["--data", "."], "link": ["--link", "1gbit"],
    **{field: [spec.flag, spec.axis.runs()[-1].value] for field, spec in REQUEST_AXES.items()},
    "compression": ["--compression", "fp16"],  # its values carry a parameter (gtopk:0.01): one without
    "oversubscribe": ["--oversubscribe"],
}
# the fake runner's steps take half a millisecond
pytestmark = pytest.mark.usefixtures("fast_fake_runner")

REFUSED = [(kind, option) for kind, entry in SUITE_KIND_TABLE.items() for option in RUN_OPTIONS
           if option not in entry.honours]


def test_the_table_covers_every_option_and_every_kind():
    """A new option of `run`, or a new suite kind, fails here until the table has its entry."""
    parameters = list(inspect.signature(run).parameters)
    assert parameters == [f.name for f in dataclasses.fields(RunRequest)]
    assert set(parameters) == set(RUN_OPTIONS) == set(SET)
    assert set(SUITE_KIND_TABLE) == set(SUITE_KINDS) == set(SUITE_OF_KIND)
    for entry in SUITE_KIND_TABLE.values():
        assert entry.honours <= set(RUN_OPTIONS)
    assert all(SET[option] is not None for _, option in REFUSED)


def test_a_request_at_its_defaults_asks_for_nothing_but_its_suite():
    assert RunRequest(suite="fcn").given() == {"suite": "fcn"}
    assert RunRequest(suite="fcn", timeout=1800.0, precision=["fp32"]).given() == {"suite": "fcn",
                                                                                    "precision": ["fp32"]}


@pytest.mark.parametrize("kind, option", REFUSED)
def test_an_option_a_kind_does_not_honour_is_refused(cli_env, tmp_path, kind, option, invoke):
    suite = SUITE_OF_KIND[kind]
    code, out, err = invoke("run", "--suite", suite, "--framework", "fake", "--env", "current", "--profile", "smoke",
                            "--store", str(tmp_path / "s"), *SET[option])
    flag, purpose = RUN_OPTIONS[option]
    assert code == 2, err
    assert f"{flag} is not taken by suite {suite!r} of kind {kind}" in err and purpose in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "cache" / "envs").exists()


def test_a_distributed_suite_passes_precision_on(cli_env, tmp_path, invoke):
    """The bug of issue 42: `--precision amp_bf16` on a distributed suite ran fp32 and said nothing.
    Here a runner whose data-parallel step lists amp_bf16 (runner.toml [distributed] precisions)."""
    import shutil

    fake = cli_env / "runners" / "fake"
    source = fake.resolve()
    fake.unlink()
    shutil.copytree(source, fake)
    toml = fake / "runner.toml"
    toml.write_text(toml.read_text().replace('launch = "ranks"', 'launch = "ranks"\nprecisions = ["fp32", "amp_bf16"]'))
    store = tmp_path / "s"
    code, _, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                          "smoke", "--benchmark", "fcn5", "--store", str(store), "--precision", "amp_bf16,fp32",
                          "--repeats", "2", "--scaling", "weak", "--workers", "2", "--threads", "1")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (store / "runs").glob("*.json")]
    assert sorted((r["workload"]["precision"], r["distributed"]["workers"], r["status"]) for r in records) == [
        ("amp_bf16", 1, "ok"), ("amp_bf16", 2, "ok"), ("fp32", 1, "ok"), ("fp32", 2, "ok")]
    assert all(r["distributed"]["scaling"]["mode"] == "weak" and len(r["repeats"]) == 2
               and r["distributed"]["threads_per_worker"] == 1 for r in records)


def test_a_precision_a_data_parallel_runner_does_not_train_in_is_recorded_skipped(cli_env, tmp_path, invoke):
    """The fake runner's [distributed] lists no precisions: fp32 only, the default."""
    store = tmp_path / "s"
    code, out, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                            "smoke", "--benchmark", "fcn5", "--store", str(store), "--precision", "amp_bf16,fp32",
                            "--workers", "2")
    assert code == 0, err
    records = {(r["workload"]["precision"], r["distributed"]["workers"]): r
               for r in (json.loads(p.read_text()) for p in (store / "runs").glob("*.json"))}
    assert sorted(records) == [("amp_bf16", 1), ("amp_bf16", 2), ("fp32", 1), ("fp32", 2)]
    for workers in (1, 2):
        skipped = records[("amp_bf16", workers)]
        assert skipped["status"] == "skipped" and not skipped["repeats"]
        assert skipped["reason"] == ("fake data-parallel runner: precision amp_bf16 is not one it trains in "
                                     "(runner.toml [distributed] precisions: fp32)")
        assert records[("fp32", workers)]["status"] == "ok"
    assert "precision amp_bf16 is not one it trains in" in " ".join(err.split())


def test_a_distributed_suite_refuses_a_precision_no_run_has(cli_env, tmp_path, invoke):
    code, _, err = invoke("run", "--suite", "distributed", "--framework", "fake", "--env", "current", "--profile",
                          "smoke", "--store", str(tmp_path / "s"), "--precision", "float64")
    assert code == 2 and ("Invalid value for '--precision': unknown precision 'float64'; valid precisions: fp32, tf32, "
                          "amp_bf16, amp_fp16, all") in err
    assert not (tmp_path / "s").exists()


def test_a_comm_suite_honours_its_options(cli_env, tmp_path, invoke):
    store = tmp_path / "s"
    code, _, err = invoke("run", "--suite", "comm", "--framework", "fake", "--env", "current", "--profile", "smoke",
                          "--benchmark", "all_reduce", "--store", str(store), "--repeats", "2", "--workers", "2",
                          "--hosts", "127.0.0.1")
    assert code == 0, err
    [record] = [json.loads(p.read_text()) for p in (store / "runs").glob("*.json")]
    assert record["benchmark"] == "all_reduce-w2" and record["distributed"]["workers"] == 2
    assert record["distributed"]["hosts"] == ["127.0.0.1"] and len(record["repeats"]) == 2


def test_a_catalog_parses_each_file_once(monkeypatch):
    """`dlbench run --suite cnn` parsed the suite files ~70 times before its first network loaded:
    every lookup by name read every suite's kind, and the suite was resolved twice."""
    from pathlib import Path

    from dlbench.definitions import catalog as catalog_module
    from dlbench.definitions import loader
    from dlbench.definitions.catalog import SuiteCatalog

    reads: list[Path] = []
    real = loader.read_yaml

    def counting(path):
        reads.append(Path(path).resolve())
        return real(path)

    monkeypatch.setattr(catalog_module, "read_yaml", counting)
    monkeypatch.setattr(loader, "read_yaml", counting)
    suites = SuiteCatalog(Path(__file__).resolve().parents[2] / "suites")
    path = suites.suite_path("cnn")
    assert suites.suite_kind(path) == "benchmark" and suites.suite_path("fcn") is not None
    for modes in (None, ("train", "infer")):
        suites.load_suite(path, "smoke", "cpu", modes)
    assert reads and len(reads) == len(set(reads))


def test_the_python_api_runs_a_suite_and_prints_nothing(cli_env, tmp_path, capsys):
    """What `dlbench run` does, from a notebook: records back, progress through events, no output."""
    from dlbench.workflows import RequestError, run_suite

    class Events:
        def __init__(self):
            self.done = []

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

        def run_done(self, run, record):
            self.done.append(record.benchmark)

    events = Events()
    request = RunRequest(suite="fcn", framework=["fake"], env="current", profile="smoke", benchmark=["fcn5"],
                         repeats=1, precision=["fp32,amp_bf16"], no_check=True, no_telemetry=True,
                         store=tmp_path / "s")
    records = run_suite(request, events)
    assert [(r.benchmark, r.workload.precision, r.status) for r in records] == [
        ("fcn5-train", "fp32", "ok"), ("fcn5-train", "amp_bf16", "ok")]
    assert events.done == ["fcn5-train", "fcn5-train"] and len(list((tmp_path / "s" / "runs").glob("*.json"))) == 2
    assert capsys.readouterr() == ("", "")
    with pytest.raises(RequestError, match="--workers is not taken by suite 'fcn' of kind benchmark"):
        run_suite(dataclasses.replace(request, workers=2, store=tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_every_axis_is_a_field_of_the_benchmark_the_request_and_the_record():
    """An axis (runners/common/contract.py REQUEST_AXES) is carried by field name from the command
    line to the record: a new entry without one of its fields fails here, naming it."""
    from dlbench.definitions.suite import Benchmark
    from dlbench.store.record import Workload

    carriers = {"the planned benchmark (definitions/suite.py Benchmark)": {f.name for f in dataclasses.fields(Benchmark)},
                "the request (workflows/requests.py RunRequest)": {f.name for f in dataclasses.fields(RunRequest)},
                "the record (store/record.py Workload)": set(Workload.model_fields)}
    missing = [f"{field} in {where}" for field in REQUEST_AXES for where, fields in carriers.items()
               if field not in fields]
    assert not missing, f"an axis without its field: {', '.join(missing)}"
