"""MLPerf LoadGen scenarios without a framework: the profile's LoadGen policy, the runner-side
harness's batching and server search (runners/common/loadgen_harness.py, standard library), the
reading of LoadGen's detail log (store/loadgen.py), and `dlbench run --scenario` end to end over the
fake runner under the real LoadGen (mlcommons-loadgen, from the test extra): records with LoadGen's
results, its logs in the store beside them, `store verify` and `store merge` over those logs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions.loader import DefinitionError, read_yaml, validate
from dlbench.definitions.suite import LoadGenPolicy, ProfilesFile
from dlbench.store.loadgen import LoadGenLogError, metric_of, read_detail, result_of
from dlbench.store.merge import merge
from dlbench.store.store import Store
from dlbench.store.verify import verify

ROOT = Path(__file__).resolve().parents[2]

from runners.common import loadgen_harness  # noqa: E402


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# ------------------------------------------------------------------ the policy


def test_batch_sizes_per_scenario():
    policy = LoadGenPolicy(max_batch=8, samples_per_query=8)
    assert policy.batch_sizes("single_stream") == [1]
    assert policy.batch_sizes("multi_stream") == [8]
    assert policy.batch_sizes("server") == policy.batch_sizes("offline") == [1, 2, 4, 8]
    assert LoadGenPolicy(max_batch=6).batch_sizes("server") == [1, 2, 4, 6]
    assert LoadGenPolicy(max_batch=1).batch_sizes("offline") == [1]


def test_shipped_profiles_give_loadgen_seconds_on_smoke():
    profiles = validate(ProfilesFile, read_yaml(ROOT / "suites" / "profiles.yaml"), ROOT / "suites" / "profiles.yaml")
    assert profiles.smoke.loadgen.max_duration_s <= 10 <= profiles.default.loadgen.min_duration_s
    assert profiles.paper.loadgen.min_duration_s == 600  # MLPerf Inference's own minimum


def test_a_bad_loadgen_setting_names_the_file_and_field(tmp_path):
    data = read_yaml(ROOT / "suites" / "profiles.yaml")
    data["smoke"]["loadgen"]["max_duration_s"] = 0.5  # below min_duration_s
    path = tmp_path / "profiles.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(DefinitionError) as info:
        validate(ProfilesFile, read_yaml(path), path)
    assert str(path) in str(info.value) and "smoke.loadgen" in str(info.value) and "min_duration_s" in str(info.value)


# ------------------------------------------------------------------ the runner-side harness


def test_a_batch_is_padded_to_the_next_size():
    sizes = [1, 2, 4, 8]
    assert [loadgen_harness.padded_size(n, sizes) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="exceeds the largest batch size 8"):
        loadgen_harness.padded_size(9, sizes)


def test_the_server_search_halves_then_bisects():
    tried = []

    def meets(rate):  # the bound holds up to 30 queries/s
        tried.append(rate)
        return {"meets_bound": rate <= 30}

    loadgen_harness.search_rates(100.0, 5, meets)
    assert tried == [100.0, 50.0, 25.0, 37.5, 31.25]
    tried.clear()
    loadgen_harness.search_rates(10.0, 3, meets)  # the capacity estimate was low: look higher
    assert tried == [10.0, 20.0, 40.0]


def test_the_batcher_fills_batches_up_to_the_maximum():
    done, release = [], threading.Event()

    def run(batch):
        release.wait(5)  # the first batch holds the thread while the rest queue up
        done.append(list(batch))

    batcher = loadgen_harness.Batcher(run, max_batch=3, timeout_s=0.05)
    batcher.submit([0])
    time.sleep(0.2)  # the first batch has left (its timeout passed) and is running
    batcher.submit(range(1, 8))
    release.set()
    batcher.close()
    assert done[0] == [0] and [s for b in done for s in b] == list(range(8))
    assert all(len(b) <= 3 for b in done) and [len(b) for b in done[1:]] == [3, 3, 1]
    assert batcher.error is None


def test_the_batcher_keeps_an_error_for_the_worker():
    def run(batch):
        raise RuntimeError("device lost")

    batcher = loadgen_harness.Batcher(run, max_batch=2, timeout_s=0.0)
    batcher.submit([1])
    batcher.close()
    assert isinstance(batcher.error, RuntimeError)


# ------------------------------------------------------------------ LoadGen's detail log


def mllog(key, value, error=False, warning=False) -> str:
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "metadata": {"is_error": error, "is_warning": warning}})


def test_a_valid_single_stream_result():
    detail = read_detail("\n".join([
        "not a log line", mllog("loadgen_version", "6.0.17 @ x"), mllog("result_validity", "VALID"),
        mllog("result_min_duration_met", True), mllog("result_query_count", 882),
        mllog("result_qps_with_loadgen_overhead", 880.95), mllog("result_90.00_percentile_latency_ns", 1129856),
        mllog("result_99.00_percentile_latency_ns", 2249659), mllog("result_mean_latency_ns", 1131761),
        mllog("early_stopping_latency_ss", 1132845), mllog("early_stopping_result", " * Processed at least 64 queries (882)."),
    ]))
    result = result_of(detail, "single_stream", "single_stream", "x/mlperf_log_detail.txt")
    assert result.validity == "VALID" and result.invalid_reasons == [] and result.query_count == 882
    assert result.latency_ns == {"90.00": 1129856, "99.00": 2249659, "mean": 1131761}
    assert result.samples_per_s == 880.95 and result.figures["early_stopping_latency_ss"] == 1132845
    assert metric_of("single_stream", result) == ("p90 latency (ns)", 1129856.0)


def test_an_invalid_server_result_says_loadgen_s_reasons():
    detail = read_detail("\n".join([
        mllog("result_validity", "INVALID"), mllog("effective_target_qps", 654.5), mllog("result_invalid_reason", ""),
        mllog("result_perf_constraints_met", True), mllog("early_stopping_met", False),
        mllog("early_stopping_result", " * Run unsuccessful.\n * Processed 190 queries."),
        mllog("error_runtime", "SUT failed", error=True),
    ]))
    result = result_of(detail, "server", "server-2", "x")
    assert result.meets_bound is True and result.target_qps == 654.5
    assert result.invalid_reasons == ["early stopping was not satisfied",
                                      "early stopping: * Run unsuccessful. * Processed 190 queries.",
                                      "LoadGen error: SUT failed"]
    assert metric_of("server", result)[1] == 654.5  # the rate met the bound, though early stopping did not hold


def test_a_log_without_a_verdict_is_one_error_naming_it():
    with pytest.raises(LoadGenLogError, match="server-1/mlperf_log_detail.txt: result_validity"):
        result_of(read_detail(mllog("effective_target_qps", 10)), "server", "server-1", "server-1/mlperf_log_detail.txt")


# ------------------------------------------------------------------ dlbench run --scenario, end to end


def fake_project(tmp_path_factory):
    """A project whose only runner is the fake one, over this repository's suites and reports."""
    project = tmp_path_factory.mktemp("project")
    (project / "runners").mkdir()
    for name in ("suites", "reports"):
        (project / name).symlink_to(ROOT / name)
    (project / "runners" / "fake").symlink_to(ROOT / "tests" / "fixtures" / "runners" / "fake")
    (project / "runners" / "common").symlink_to(ROOT / "runners" / "common")
    return project


@pytest.fixture(scope="module")
def loadgen_store(tmp_path_factory):
    """One `dlbench run --scenario single_stream,offline,server` of fcn5-infer on the fake runner."""
    pytest.importorskip("mlperf_loadgen")  # the test extra installs it
    project = fake_project(tmp_path_factory)
    store = tmp_path_factory.mktemp("lg") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLBENCH_ROOT", str(project))
        mp.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
        mp.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
        code, out, err = invoke("run", "--suite", "fcn", "--framework", "fake", "--env", "current", "--device", "cpu",
                                "--profile", "smoke", "--benchmark", "fcn5-infer", "--scenario",
                                "single_stream,offline,server", "--no-check", "--no-telemetry", "--threads", "1",
                                "--store", str(store))
    assert code == 0, err
    return Store(store), out


def test_each_scenario_is_one_record_with_loadgen_s_result(loadgen_store):
    store, out = loadgen_store
    records = {r.workload.scenario: r for r in store.records()}
    assert set(records) == {"single_stream", "offline", "server"}
    for scenario, r in records.items():
        assert r.status == "ok" and r.summary is None and r.loadgen.scenario == scenario
        assert r.loadgen.result.validity in ("VALID", "INVALID")
        assert r.loadgen.result.validity == "VALID" or r.loadgen.result.invalid_reasons
        assert r.loadgen.loadgen_version.startswith("6.0.17")
        assert r.loadgen.settings["min_duration_s"] == 1.0 and r.loadgen.settings["seed"] == 0
        assert r.loadgen.effective["effective_min_duration_ms"] == 1000
        assert r.loadgen.result.latency_ns["50.00"] <= r.loadgen.result.latency_ns["99.00"]
    assert records["single_stream"].workload.batch_size == 1
    assert records["offline"].workload.batch_size == 8 and records["offline"].loadgen.batching["max_batch"] == 8
    server = records["server"].loadgen
    assert len(server.search) == 3 and server.result in server.search
    met = [s.target_qps for s in server.search if s.meets_bound]
    assert server.metric_value == (max(met) if met else None)
    assert "LoadGen scenarios" in out and "single_stream" in out and "server" in out


def test_loadgen_s_logs_are_in_the_store_and_verified(loadgen_store, tmp_path):
    store, _ = loadgen_store
    for r in store.records():
        names = {Path(log.path).name for log in r.loadgen.logs}
        assert names == {"mlperf_log_summary.txt", "mlperf_log_detail.txt"}
        assert all((store.root / log.path).is_file() and log.path.startswith(f"loadgen/{r.run_id}/")
                   for log in r.loadgen.logs)
        assert len(r.loadgen.logs) == 2 * (len(r.loadgen.search) or 1)
    assert verify(store).problems == []
    # a copy whose log was changed: verify names it
    import shutil

    copy = Store(tmp_path / "copy")
    shutil.copytree(store.root, copy.root)
    victim = next(copy.records()).loadgen.logs[0]
    with open(copy.root / victim.path, "a") as f:
        f.write("edited\n")
    problems = verify(copy).problems
    assert len(problems) == 1 and str(copy.root / victim.path) in problems[0].reason
    assert "checksum mismatch" in problems[0].reason


def test_merge_carries_the_logs_and_refuses_a_damaged_one(loadgen_store, tmp_path):
    import shutil

    store, _ = loadgen_store
    merged = Store(tmp_path / "merged")
    report = merge(merged, [store.root])
    assert report.clean and len(report.added) == 3
    assert verify(merged).problems == [] and len(list(merged.records())) == 3
    assert merge(merged, [store.root]).duplicates  # again: duplicates, nothing else
    damaged = tmp_path / "damaged"
    shutil.copytree(store.root, damaged)
    victim = next(Store(damaged).records())
    (damaged / victim.loadgen.logs[0].path).unlink()
    other = Store(tmp_path / "other")
    report = merge(other, [damaged])
    assert [p.name for p, _ in report.unreadable] == [f"{victim.run_id}.json"]
    assert not (other.runs / f"{victim.run_id}.json").exists() and len(list(other.records())) == 2


def test_results_show_loadgen_s_columns(loadgen_store):
    store, _ = loadgen_store
    code, out, _ = invoke("results", "--store", str(store.root), "--format", "json")
    rows = json.loads(out)
    assert code == 0 and {r["scenario"] for r in rows} == {"single_stream", "offline", "server"}
    for row in rows:
        assert row["loadgen_result"] in ("VALID", "INVALID") and row["latency_p99_ms"] > 0
        if row["scenario"] != "server":
            assert row["server_qps"] is None
    server = next(r for r in store.records() if r.workload.scenario == "server")
    assert next(row for row in rows if row["scenario"] == "server")["server_qps"] == server.loadgen.metric_value


def test_scenario_refuses_training_benchmarks(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "torch", "--device", "cpu", "--profile", "smoke",
                          "--scenario", "server", "--store", str(tmp_path / "s"))
    assert code == 2 and "--scenario runs inference under LoadGen" in err and "add --mode infer" in err
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "torch", "--device", "cpu", "--mode", "infer",
                          "--scenario", "bursty", "--store", str(tmp_path / "s"))
    assert code == 2 and "bursty" in err
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "torch", "--device", "cpu", "--mode", "infer",
                          "--scenario", "server", "--repeats", "3", "--store", str(tmp_path / "s"))
    assert code == 2 and "--repeats does not apply to --scenario" in err


def test_compare_pairs_loadgen_runs_per_scenario(loadgen_store):
    from dlbench.analysis.comparison import compare_loadgen, parse_selector

    store, _ = loadgen_store
    base = list(store.records())
    cand = []
    for r in base:  # the same runs from a "newer version", twice as fast: latency halved, rates doubled
        info = r.loadgen.model_copy(update={"metric_value": r.loadgen.metric_value and (
            r.loadgen.metric_value / 2 if r.loadgen.scenario == "single_stream" else r.loadgen.metric_value * 2)})
        cand.append(r.model_copy(update={"run_id": r.run_id + "x", "loadgen": info,
                                         "framework": {**r.framework, "version": "0.1"}}))
    pairs = compare_loadgen(base + cand, parse_selector("version=0.0"), parse_selector("version=0.1"))
    assert sorted(c.key["scenario"] for c in pairs) == ["offline", "server", "single_stream"]
    for c in pairs:
        assert c.lower_is_better == (c.key["scenario"] == "single_stream")
        assert c.speedup == pytest.approx(2.0) or not c.baseline  # a server search that met the bound nowhere
    # different scenarios are never set against each other
    assert compare_loadgen(base, parse_selector("scenario=server"), parse_selector("scenario=offline")) == []
    code, out, _ = invoke("compare", "--store", str(store.root), "--baseline", "scenario=server",
                          "--candidate", "scenario=offline")
    assert code == 1


def test_the_report_charts_loadgen_s_percentiles_per_framework(loadgen_store, tmp_path):
    store, _ = loadgen_store
    site = tmp_path / "site"
    code, _, err = invoke("report", "--store", str(store.root), "--out", str(site))
    assert code == 0, err
    index = (site / "index.html").read_text()
    assert "LoadGen scenarios" in index
    pages = list((site / "benchmarks").glob("*fcn5-infer*.html"))
    assert len(pages) == 1
    page = pages[0].read_text()
    assert "fcn5-infer on fake: LoadGen latency percentiles" in page  # the chart of the one framework
    for scenario in ("single_stream", "offline", "server"):
        assert f'data-scenario="{scenario}"' in page
    assert ">p99.9<" in page and "Throughput per framework" not in page  # LoadGen runs only: no harness sections
    server = next(r for r in store.records() if r.workload.scenario == "server")
    run_page = (site / "runs" / f"{server.run_id}.html").read_text()
    assert "LoadGen: server" in run_page and "the server's search" in run_page
    assert all(log.sha256 in run_page for log in server.loadgen.logs)


def test_load_types_loadgen_s_columns(loadgen_store):
    import dlbench

    store, _ = loadgen_store
    frame = dlbench.load(store.root)
    assert str(frame["scenario"].dtype) == "string" and str(frame["latency_p99_ms"].dtype) == "float64"
    assert set(frame["loadgen_result"]) <= {"VALID", "INVALID"} and len(frame) == 3
    assert frame.loc[frame.scenario == "offline", "samples_per_s"].iloc[0] > 0


def test_the_worker_s_loadgen_result_is_checked_at_the_boundary():
    from dlbench.execution.worker_result import ResultError, parse_result

    test = {"log_dir": "server-1", "target_qps": 10.0, "wall_s": 1.0, "batches": 3, "loaded_samples": 64,
            "meets_bound": True, "validity": "VALID"}
    good = {"status": "ok", "framework": {"name": "fake"},
            "loadgen": {"scenario": "server", "runs": [test], "chosen": "server-1",
                        "warmup_latency_s": {"1": 0.001}, "expected": {"latency_s": 0.001, "qps": 100.0}}}
    assert parse_result(json.dumps(good), "loadgen").loadgen.chosen == "server-1"
    for change, field in ((lambda d: d.pop("loadgen"), "loadgen"),
                          (lambda d: d["loadgen"].update(chosen="server-9"), "loadgen"),
                          (lambda d: d["loadgen"]["runs"][0].update(log_dir="../../etc"), "loadgen.runs[0].log_dir"),
                          (lambda d: d["loadgen"]["runs"][0].update(target_qps=-1.0), "loadgen.runs[0].target_qps")):
        bad = json.loads(json.dumps(good))
        change(bad)
        with pytest.raises(ResultError) as info:
            parse_result(json.dumps(bad), "loadgen")
        assert info.value.field == field


def test_a_record_comes_back_to_logs_the_store_already_holds(loadgen_store, tmp_path):
    import shutil

    store, _ = loadgen_store
    main = Store(tmp_path / "main")
    shutil.copytree(store.root, main.root)
    victim = next(main.records())
    spare = Store(tmp_path / "spare")  # as a failed record write leaves it: the record alone
    spare.runs.mkdir(parents=True)
    shutil.move(main.runs / f"{victim.run_id}.json", spare.runs / f"{victim.run_id}.json")
    report = merge(main, [spare.root])
    assert report.clean and [p.name for p in report.added] == [f"{victim.run_id}.json"]
    assert verify(main).problems == []


# ------------------------------------------------------------------ generation's server (token latencies)


def test_generation_serves_one_request_at_a_time():
    assert LoadGenPolicy().batch_sizes("server", "generate") == [1]
    assert LoadGenPolicy(max_batch=8).batch_sizes("server") == [1, 2, 4, 8]


def test_a_token_latency_result_keeps_ttft_and_tpot_apart_from_the_query_latency():
    text = "\n".join([
        mllog("result_validity", "INVALID"), mllog("result_perf_constraints_met", False),
        mllog("result_invalid_reason", "TTFT constrain not met: Reduce target QPS to improve latency. "),
        mllog("effective_target_qps", 40.0), mllog("result_completed_samples_per_sec", 39.5),
        mllog("result_99.00_percentile_latency_ns", 30e6), mllog("result_first_token_99.00_percentile_latency_ns", 20e6),
        mllog("result_first_token_min_latency_ns", 2e6), mllog("result_time_per_output_token_99.00_percentile_ns", 1.5e6),
        mllog("result_time_to_output_token_mean", 1.1e6), mllog("result_completed_tokens_per_second", 316.0),
        mllog("early_stopping_met", False), mllog("early_stopping_ttft_result", " * Run unsuccessful."),
        mllog("early_stopping_tpot_result", ""),
    ])
    result = result_of(read_detail(text), "server", "server-1", "server-1/mlperf_log_detail.txt")
    assert result.latency_ns == {"99.00": 30e6}  # the query's latency only, not the token latencies
    assert result.ttft_ns == {"99.00": 20e6, "min": 2e6} and result.tpot_ns == {"99.00": 1.5e6, "mean": 1.1e6}
    assert result.tokens_per_s == 316.0 and result.early_stopping == "TTFT: * Run unsuccessful."
    assert result.invalid_reasons[0].startswith("TTFT constrain not met")
    assert "early stopping: TTFT: * Run unsuccessful." in result.invalid_reasons
    assert metric_of("server", result) == ("queries/s within the p99 TTFT and TPOT bounds (highest rate found)", None)
    met = result.model_copy(update={"meets_bound": True})
    assert metric_of("server", met)[1] == 40.0


class _FakeLoadGen:
    """LoadGen's library boundary as GenerationServerRun uses it: the responses it is handed, in order."""

    def __init__(self):
        self.events: list[tuple] = []

    def QuerySampleResponse(self, sample_id, data, size, n_tokens):
        return (sample_id, n_tokens)

    def FirstTokenComplete(self, responses):
        self.events.append(("first", responses))

    def QuerySamplesComplete(self, responses):
        self.events.append(("done", responses))


def test_a_request_reports_its_first_token_then_all_its_tokens():
    from types import SimpleNamespace

    calls: list[str] = []
    generator = SimpleNamespace(prefill=lambda: calls.append("prefill"), decode=lambda: calls.append("decode"),
                                synchronize=lambda: calls.append("sync"))
    lg = _FakeLoadGen()
    run = loadgen_harness.GenerationServerRun(lg, generator, {"batch_sizes": [1]}, new_tokens=4, batch=1)
    run._serve([SimpleNamespace(id=7), SimpleNamespace(id=8)])
    assert lg.events == [("first", [(7, 1)]), ("done", [(7, 4)]), ("first", [(8, 1)]), ("done", [(8, 4)])]
    # the first token is complete only once synchronised; every decode is synchronised before the next
    assert calls[:2] == ["prefill", "sync"] and calls[2:8] == ["decode", "sync"] * 3 and run.batches == 2


@pytest.fixture(scope="module")
def generation_server_store(tmp_path_factory):
    """One `dlbench run --mode generate --scenario server` of transformer_tiny on the fake runner."""
    pytest.importorskip("mlperf_loadgen")
    project = fake_project(tmp_path_factory)
    store = tmp_path_factory.mktemp("lg") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLBENCH_ROOT", str(project))
        mp.setenv("DLBENCH_FAKE_STEP_S", "0.002")  # a request: 2 ms prefill, 7 decodes of 0.5 ms
        mp.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
        code, out, err = invoke("run", "--suite", "transformer", "--framework", "fake", "--env", "current",
                                "--device", "cpu", "--profile", "smoke", "--benchmark", "transformer_tiny",
                                "--mode", "generate", "--scenario", "server", "--no-check", "--no-telemetry",
                                "--threads", "1", "--store", str(store))
    assert code == 0, err
    return Store(store), out


def test_generation_s_server_is_loadgen_s_token_latencies_within_both_bounds(generation_server_store):
    store, out = generation_server_store
    (record,) = store.records()
    info = record.loadgen
    assert record.status == "ok" and record.workload.mode == "generate" and record.workload.scenario == "server"
    assert record.workload.batch_size == 1 and info.batching["max_batch"] == 1
    assert info.generation["prompt_length"] == 8 and info.generation["new_tokens"] == 8
    assert info.generation["ttft_ms"] == 100.0 and info.generation["tpot_ms"] == 25.0  # the smoke profile's
    assert "one request at a time" in info.generation["serving"]
    assert info.metric == "queries/s within the p99 TTFT and TPOT bounds (highest rate found)"
    assert len(info.search) == 3 and info.result in info.search
    for test in info.search:
        assert test.ttft_ns["50.00"] <= test.ttft_ns["99.00"] and test.tpot_ns["50.00"] <= test.tpot_ns["99.00"]
        assert test.tokens_per_s > 0
        # LoadGen's verdict on both bounds, as its own percentiles show it
        within = test.ttft_ns["99.00"] <= 100e6 and test.tpot_ns["99.00"] <= 25e6
        assert test.meets_bound == within
        assert test.figures.get("result_token_throughput_with_loadgen_overhead") is not None
    passing = [t.target_qps for t in info.search if t.meets_bound]
    assert info.metric_value == (max(passing) if passing else None)
    assert info.result.validity == "VALID" or info.result.invalid_reasons
    detail = (store.root / next(log.path for log in info.logs if log.path.endswith("detail.txt"))).read_text()
    assert '"key": "requested_use_token_latencies", "value": true' in detail
    assert '"key": "requested_server_ttft_latency", "value": 100000000' in detail
    assert "LoadGen server on generation" in out and verify(store).problems == []


def test_results_show_ttft_tpot_and_the_rate_of_generation_s_server(generation_server_store):
    store, _ = generation_server_store
    (record,) = store.records()
    code, out, _ = invoke("results", "--store", str(store.root), "--format", "json")
    (row,) = json.loads(out)
    assert code == 0 and row["scenario"] == "server" and row["mode"] == "generate"
    assert row["ttft_p99_ms"] == record.loadgen.result.ttft_ns["99.00"] / 1e6
    assert row["tpot_p99_ms"] == record.loadgen.result.tpot_ns["99.00"] / 1e6
    assert row["server_qps"] == record.loadgen.metric_value and row["tokens_per_s"] > 0
    code, out, _ = invoke("results", "--store", str(store.root))
    assert code == 0 and "TTFT p99" in out and "TPOT p99" in out and "server q/s" in out


def test_generation_runs_only_the_server_scenario(tmp_path):
    code, _, err = invoke("run", "--suite", "transformer", "--framework", "torch", "--device", "cpu", "--profile",
                          "smoke", "--benchmark", "transformer_tiny", "--mode", "generate", "--scenario",
                          "single_stream,server", "--store", str(tmp_path / "s"))
    assert code == 2 and "--scenario single_stream: generation (--mode generate) runs LoadGen's server" in err


def test_the_report_shows_generation_s_server_bounds_and_token_latencies(generation_server_store, tmp_path):
    store, _ = generation_server_store
    (record,) = store.records()
    site = tmp_path / "site"
    code, _, err = invoke("report", "--store", str(store.root), "--out", str(site))
    assert code == 0, err
    run_page = (site / "runs" / f"{record.run_id}.html").read_text()
    assert "Generation under LoadGen&#39;s server" in run_page or "Generation under LoadGen's server" in run_page
    assert "time to first token 100.0 ms" in run_page and "TTFT p99 ms" in run_page
    (bench_page,) = [p.read_text() for p in (site / "benchmarks").glob("*generate*.html")]
    assert "TTFT p99 ms" in bench_page and "TPOT p99 ms" in bench_page
