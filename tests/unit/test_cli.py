"""The command line: input validation (exit 2 with the valid choices), listing, results, report, and an
end-to-end run with the fake runner under a temporary project root."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.store.rows import COLUMNS, run_row
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX = re.compile("[\u2500-\u257f]")  # the frame typer draws around a usage error, wrapped at 80 columns


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(BOX.sub("", ANSI.sub("", result.stderr)).split())


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("DLBENCH_ROOT", raising=False)
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------- validation: exit 2, valid choices listed


def test_unknown_suite(tmp_path):
    code, _, err = invoke("run", "--suite", "nosuch", "--device", "cpu", "--store", str(tmp_path / "s"))
    assert code == 2
    assert "unknown suite 'nosuch'" in err
    for name in ("cnn", "fcn", "rnn"):
        assert name in err
    assert not (tmp_path / "s").exists()


def test_unknown_framework(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "nosuch", "--device", "cpu",
                          "--store", str(tmp_path / "s"))
    assert code == 2
    assert "unknown framework 'nosuch'" in err and "torch" in err


def test_unknown_framework_in_comma_list(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--framework", "torch,nosuch", "--device", "cpu",
                          "--store", str(tmp_path / "s"))
    assert code == 2 and "unknown framework 'nosuch'" in err


def test_unknown_benchmark(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--benchmark", "nosuch", "--device", "cpu",
                          "--store", str(tmp_path / "s"))
    assert code == 2
    assert "unknown benchmark 'nosuch'" in err
    for name in ("fcn5-train", "fcn5-infer", "fcn8-train", "fcn8-infer", "fcn5", "fcn8"):
        assert name in err


def test_unknown_profile(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--profile", "nosuch", "--device", "cpu",
                          "--store", str(tmp_path / "s"))
    assert code == 2
    assert "unknown profile 'nosuch'" in err
    for name in ("smoke", "default", "paper"):
        assert name in err


def test_unknown_device(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--device", "tpu", "--store", str(tmp_path / "s"))
    assert code == 2
    assert "unknown device 'tpu'" in err
    for name in ("auto", "cpu", "cuda"):
        assert name in err


def test_unknown_env_backend_and_format(tmp_path):
    code, _, err = invoke("run", "--suite", "fcn", "--env", "conda", "--device", "cpu", "--store", str(tmp_path / "s"))
    assert code == 2 and "conda" in err and "venv" in err and "current" in err
    code, _, err = invoke("results", "--format", "xml", "--store", str(tmp_path / "s"))
    assert code == 2 and "xml" in err and "json" in err and "csv" in err


def test_list_validation():
    code, _, err = invoke("list", "--profile", "nosuch")
    assert code == 2 and "smoke" in err
    code, _, err = invoke("list", "--suite", "nosuch", "--device", "cpu")
    assert code == 2 and "unknown suite 'nosuch'" in err and "fcn" in err


@pytest.mark.parametrize("body, field", [
    ("name: mine\nbenchmarks:\n  - network: fcn5\n    batch_sizes: {smoke: [0], default: [4], paper: [4]}\n",
     "benchmarks[0].batch_sizes.smoke[0]"),
    ("name: mine\nbenchmarks:\n  - network: fcn5\n    colour: red\n    batch_sizes: {smoke: [1], default: [4], paper: [4]}\n",
     "benchmarks[0].colour"),
    ("name: mine\nbenchmarks:\n  - network: nosuchnet\n    batch_sizes: {smoke: [1], default: [4], paper: [4]}\n",
     "benchmarks[0].network"),
])
def test_malformed_user_suite_names_file_and_field(tmp_path, body, field):
    path = tmp_path / "mine.yaml"
    path.write_text(body)
    code, _, err = invoke("run", "--suite", str(path), "--device", "cpu", "--env", "current",
                          "--store", str(tmp_path / "s"))
    assert code == 2
    assert str(path) in err and field in err
    code, _, err = invoke("list", "--suite", str(path), "--profile", "smoke", "--device", "cpu")
    assert code == 2 and str(path) in err and field in err


def test_invalid_yaml_user_suite(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    code, _, err = invoke("run", "--suite", str(path), "--device", "cpu", "--store", str(tmp_path / "s"))
    assert code == 2 and str(path) in err and "invalid YAML" in err


# ---------------------------------------------------------------- list, results, report on an empty store


def test_list_shows_every_suite_and_parameter_counts():
    code, out, _ = invoke("list", "--device", "cpu")
    assert code == 0
    catalog = SuiteCatalog(ROOT / "suites")
    assert {"cnn", "fcn", "rnn"} <= set(catalog.suite_names())  # the seed suites; a new suite is a file
    for name in catalog.suite_names():
        suite = catalog.load_suite(catalog.suite_path(name), "default", "cpu")
        for b in suite.benchmarks:
            line = next((ln for ln in out.splitlines() if f" {b.name} " in ln), None)
            assert line is not None, f"{b.name} missing from `dlbench list`"
            assert f" {name} " in line
            heads = b.network.head_params
            assert f"{b.network.params - heads:,}" in line and (not heads or f"+ {heads:,} heads" in line)
    from dlbench.execution.registry import RunnerRegistry

    names = RunnerRegistry(ROOT / "runners").names()
    assert "torch" in names
    assert f"frameworks: {', '.join(names)}" in out


def test_list_transformer_suite_prints_the_published_counts_and_lengths():
    code, out, _ = invoke("list", "--suite", "transformer", "--device", "cpu")
    assert code == 0
    rows = {ln.split("│")[2].strip(): [c.strip() for c in ln.split("│")] for ln in out.splitlines() if "-train" in ln}
    # sequence column, then the parameters: GPT-2 small, BERT-base (encoder with pooler), ViT-B/16
    assert rows["gpt2_small-train"][6:8] == ["128", "124,439,808"]
    assert rows["bert_base-train"][6:8] == ["128", "109,482,240 + 624,188 heads"]
    assert rows["vit_b16-train"][6:8] == ["", "86,567,656"]
    code, out, _ = invoke("list", "--suite", "transformer", "--device", "cuda")
    gpu = {ln.split("│")[2].strip(): [c.strip() for c in ln.split("│")] for ln in out.splitlines() if "-train" in ln}
    assert code == 0 and gpu["gpt2_small-train"][6] == "1024" and gpu["bert_base-train"][6] == "512"


def test_list_one_suite_with_profile():
    code, out, _ = invoke("list", "--suite", "fcn", "--profile", "paper", "--device", "cpu")
    assert code == 0
    assert "fcn5-train" in out and "alexnet" not in out and "342,512,1024,2048,4096" in out


def test_results_on_empty_store(tmp_path):
    store = tmp_path / "empty"
    store.mkdir()  # a store without records; a folder that is not there is no store (test_missing_store.py)
    code, out, _ = invoke("results", "--store", str(store), "--format", "json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = invoke("results", "--store", str(store), "--format", "csv")
    assert code == 0
    assert next(csv.reader(io.StringIO(out))) == list(COLUMNS)
    assert len(out.strip().splitlines()) == 1
    code, out, _ = invoke("results", "--store", str(store))
    assert code == 0 and "0 runs" in out


def test_report_on_empty_store_exits_1(tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = invoke("report", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "site"))
    assert code == 1
    assert "no records" in err
    assert not (tmp_path / "site" / "index.html").exists()


# ---------------------------------------------------------------- end to end with the fake runner




FCN_SMOKE = ["fcn5-infer", "fcn5-train", "fcn8-infer", "fcn8-train"]


def run_fcn(store: Path, *extra: str, modes=("--mode", "train", "--mode", "infer")):
    # not about the equivalence check nor contention: no check, contended repeats marked, not replaced
    return invoke("run", "--no-check", "--replace-contended", "0", "--suite", "fcn", "--framework", "all",
                  "--profile", "smoke", "--device", "cpu", "--env", "current", "--store", str(store),
                  "--threads", "1", *modes, *extra)


def test_smoke_runs_train_only_unless_a_mode_or_benchmark_says_otherwise(project, tmp_path):
    code, _, err = run_fcn(tmp_path / "a", "--repeats", "1", modes=())
    assert code == 0, err
    assert sorted(r.benchmark for r in Store(tmp_path / "a").records()) == ["fcn5-train", "fcn8-train"]
    code, _, err = run_fcn(tmp_path / "b", "--repeats", "1", "--benchmark", "fcn5-infer", "--benchmark", "fcn8",
                           modes=())
    assert code == 0, err
    assert sorted(r.benchmark for r in Store(tmp_path / "b").records()) == ["fcn5-infer", "fcn8-train"]
    code, _, err = run_fcn(tmp_path / "c", "--repeats", "1", modes=("--mode", "inference"))
    assert code != 0 and "inference" in err


def test_end_to_end_run_results_report(project, tmp_path):
    store = tmp_path / "store"
    code, out, err = run_fcn(store)
    assert code == 0, err
    assert "4 runs" in err and "fake" in err
    for name in FCN_SMOKE:
        assert name in out
    records = list(Store(store).records())
    assert sorted(r.benchmark for r in records) == FCN_SMOKE
    repeats = SuiteCatalog(ROOT / "suites").profiles().smoke.repeats
    assert all(r.status == "ok" and len(r.repeats) == repeats and r.summary is not None for r in records)

    code, out, _ = invoke("results", "--store", str(store), "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert sorted(r["benchmark"] for r in rows) == FCN_SMOKE
    assert all(r["framework"] == "fake" and r["status"] == "ok" and r["samples_per_s"] > 0 for r in rows)
    assert all(r["params"] == r["params_described"] for r in rows)

    code, out, _ = invoke("results", "--store", str(store), "--format", "csv")
    assert code == 0
    assert sorted(r["benchmark"] for r in csv.DictReader(io.StringIO(out))) == FCN_SMOKE

    site = tmp_path / "site"
    code, out, _ = invoke("report", "--store", str(store), "--out", str(site))
    assert code == 0
    html = (site / "index.html").read_text()
    for name in FCN_SMOKE:
        assert name in html
    assert "fake" in html and "4 runs" in out


def test_end_to_end_benchmark_filter(project, tmp_path):
    store = tmp_path / "store"
    code, _, err = run_fcn(store, "--benchmark", "fcn8", "--repeats", "1")
    assert code == 0, err
    records = list(Store(store).records())
    assert sorted(r.benchmark for r in records) == ["fcn8-infer", "fcn8-train"]
    assert all(len(r.repeats) == 1 for r in records)


def test_end_to_end_failures_exit_1_and_are_recorded(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "raise")
    store = tmp_path / "store"
    code, _, err = run_fcn(store)
    assert code == 1
    assert "4 of 4 runs did not complete" in err
    assert "fake failure while building the network" in err
    records = list(Store(store).records())
    assert sorted(r.benchmark for r in records) == FCN_SMOKE
    assert all(r.status == "failed" and "fake failure" in r.reason for r in records)
    code, out, _ = invoke("results", "--store", str(store), "--format", "json")
    assert code == 0 and {r["status"] for r in json.loads(out)} == {"failed"}
    # a report of failed runs is still a report
    code, _, _ = invoke("report", "--store", str(store), "--out", str(tmp_path / "site"))
    assert code == 0 and "fake failure while building the network" in (tmp_path / "site" / "index.html").read_text()


def test_end_to_end_skipped_runs_exit_0(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "skip")
    store = tmp_path / "store"
    code, _, err = run_fcn(store, "--benchmark", "fcn5-train")
    assert code == 0, err
    assert [r.status for r in Store(store).records()] == ["skipped"]


def test_results_reports_unreadable_records_and_goes_on(project, tmp_path):
    store = tmp_path / "store"
    assert run_fcn(store, "--benchmark", "fcn5-train", "--repeats", "1")[0] == 0
    bad = store / "runs" / "00000000T000000Z-broken000000.json"
    bad.write_text("{truncated")
    code, out, err = invoke("results", "--store", str(store), "--format", "json")
    assert code == 0
    assert [r["benchmark"] for r in json.loads(out)] == ["fcn5-train"]
    assert "skipped" in err and bad.name in err.replace(" ", "")


def test_suite_all_runs_every_shipped_suite(project, tmp_path):
    store = tmp_path / "store"
    code, _, err = invoke("run", "--no-check", "--suite", "all", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--store", str(store), "--threads", "1", "--repeats", "1")
    assert code == 0, err
    catalog = SuiteCatalog(ROOT / "suites")
    expected = sorted(b.name for s in catalog.suite_names()
                      for b in catalog.load_suite(catalog.suite_path(s), "smoke", "cpu").benchmarks)
    # one run per network: smoke trains each network of every suite once (the seed suites: eight)
    assert len(expected) == len({b.split("-")[0] for b in expected}) >= 8
    assert sorted(r.benchmark for r in Store(store).records()) == expected


def test_check_steps_with_each_networks_suite_hyperparameters(project, tmp_path, monkeypatch):
    import dlbench.execution.equivalence as equivalence

    seen = {}

    def fake_check(summary, envs, device, timeout, learning_rate, momentum, precision):
        seen[summary.name] = (learning_rate, momentum, precision)
        return []

    monkeypatch.setattr(equivalence, "check_network", fake_check)
    code, _, err = invoke("check", "--framework", "fake", "--env", "current", "--network", "resnet50",
                          "--network", "fcn5", "--network", "lstm32", "--store", str(tmp_path / "s"))
    assert code == 0, err
    assert seen == {"resnet50": (0.01, 0.9, "float64"), "fcn5": (0.05, 0.9, "float64"), "lstm32": (0.1, 0.9, "float64")}
    seen.clear()
    code, _, err = invoke("check", "--framework", "fake", "--env", "current", "--network", "fcn5",
                          "--precision", "fp32", "--store", str(tmp_path / "s"))
    assert code == 0 and seen == {"fcn5": (0.05, 0.9, "fp32")}, err


def test_check_at_a_sequence_length_and_says_dropout_is_off(project, tmp_path, monkeypatch):
    import dlbench.execution.equivalence as equivalence

    seen = {}

    def fake_check(summary, envs, device, timeout, learning_rate, momentum, precision):
        seen[summary.name] = (summary.resolved["input"].get("sequence_length"), summary.params)
        return []

    monkeypatch.setattr(equivalence, "check_network", fake_check)
    code, out, err = invoke("check", "--framework", "fake", "--env", "current", "--network", "gpt2_small",
                            "--network", "bert_base", "--network", "fcn5", "--network", "transformer_tiny",
                            "--sequence-length", "64", "--store", str(tmp_path / "s"))
    assert code == 0, err
    # transformer_tiny's own context, 32, is shorter: it is checked at 32
    assert seen == {"gpt2_small": (64, 124_439_808), "bert_base": (64, 110_106_428), "fcn5": (None, 14_205_962),
                    "transformer_tiny": (32, 134_912)}
    # gpt2_small and bert_base have dropout 0.1; the check's step is deterministic and says so
    assert "dropout forced to 0" in out and "gpt2_small, bert_base" in out and "fcn5" not in out.split("forced")[1]
    seen.clear()  # a length beyond a network's context leaves it at its context
    code, _, err = invoke("check", "--framework", "fake", "--env", "current", "--network", "gpt2_small",
                          "--sequence-length", "4096", "--store", str(tmp_path / "s"))
    assert code == 0 and seen == {"gpt2_small": (1024, 124_439_808)}, err


def test_check_refuses_an_unknown_precision(project, tmp_path):
    code, _, err = invoke("check", "--framework", "fake", "--env", "current", "--precision", "bf16",
                          "--store", str(tmp_path / "s"))
    assert code == 2 and ("Invalid value for '--precision': unknown precision 'bf16'; valid precisions: fp32, tf32, "
                          "amp_bf16, amp_fp16, float64") in err
    assert not (tmp_path / "s" / "checks").exists()


def test_run_leaves_the_row_index_current(project, tmp_path, monkeypatch):
    """`run` updates the index as it finishes, so the next `results` parses no record."""
    from dlbench.store.index import read_rows

    code, _, err = run_fcn(tmp_path / "store", "--repeats", "1", modes=())
    assert code == 0, err
    parsed: list[str] = []
    original = Store.read
    monkeypatch.setattr(Store, "read", lambda self, path: parsed.append(path) or original(self, path))
    rows = read_rows(Store(tmp_path / "store")).rows
    assert len(rows) == 2 and parsed == []


def test_precision_and_compile_axes_run_every_combination_and_record_it(project, tmp_path):
    store = tmp_path / "axes"
    code, _, err = run_fcn(store, "--repeats", "1", "--benchmark", "fcn5-train", "--precision", "all",
                           "--compile", "all", modes=())
    # tf32 is skipped by the fake runner (no tensor cores): a skip is not a failure
    assert code == 0, err
    records = list(Store(store).records())
    got = {(r.workload.precision, r.workload.compile): r for r in records}
    assert set(got) == {(p, c) for p in ("fp32", "tf32", "amp_bf16", "amp_fp16") for c in ("eager", "compiled")}
    for (p, c), r in got.items():
        assert r.status == ("skipped" if p == "tf32" else "ok"), (p, c, r.reason)
        if r.status != "ok":
            assert "tensor cores" in r.reason
            continue
        assert r.settings.runner["precision"] == p and r.settings.runner["compile"] == c
        assert r.workload.compile_mode == ("default" if c == "compiled" else None)
        assert r.repeats[0].memory == {"unavailable": "the fake runner allocates nothing"}
        assert (r.repeats[0].compile is not None) == (c == "compiled")
        assert r.summary.compile_s is not None
    # the fake's compiled first step takes 20 steps: the compile time shows it, eager's does not
    assert got[("fp32", "compiled")].summary.compile_s > 5 * max(got[("fp32", "eager")].summary.compile_s, 0.0005)
    rows = {(row["precision"], row["compile"]) for row in map(run_row, records)}
    assert rows == set(got)


def test_compile_default_is_the_runners_own_and_runs_once(project, tmp_path):
    store = tmp_path / "default"
    code, _, err = run_fcn(store, "--repeats", "1", "--benchmark", "fcn5-train", "--compile", "default,eager",
                           modes=())
    assert code == 0, err
    assert [r.workload.compile for r in Store(store).records()] == ["eager"]  # the fake runner's default


@pytest.mark.parametrize("option,value,words", [
    ("--precision", "float32", "Invalid value for '--precision': unknown precision 'float32'; valid precisions: fp32, "
                               "tf32, amp_bf16, amp_fp16, all"),
    ("--precision", "fp32,bf16", "Invalid value for '--precision': unknown precision 'bf16'"),
    ("--compile", "jit", "Invalid value for '--compile': unknown compile mode 'jit'; valid compile modes: eager, "
                         "compiled, default, all"),
    ("--compile-mode", "reduce-overhead", "unknown torch.compile mode 'reduce-overhead'"),  # torch's, not an axis
])
def test_unknown_precision_or_compile_values_are_refused(project, tmp_path, option, value, words):
    code, _, err = run_fcn(tmp_path / "s", "--repeats", "1", option, value, modes=())
    assert code == 2 and words in err
    assert not (tmp_path / "s" / "runs").exists() or not list((tmp_path / "s" / "runs").iterdir())


def axis_options():
    """(command, option, what its values are called) for every option of every command named after a
    request axis (precision, compile, mode, scenario)."""
    from runners.common.contract import REQUEST_AXES
    from typer.main import get_command

    def walk(group, path):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])
            else:
                yield [*path, name], command

    found = []
    for path, command in walk(get_command(app), []):
        for param in command.params:
            # compression's values carry a parameter (topk:0.01), so it is a plain option parsed
            # by the plan, not an Enum: test_compression.py checks its refusals
            if param.name in REQUEST_AXES and param.name != "compression":
                found.append((" ".join(path), param.opts[0], REQUEST_AXES[param.name].noun))
    return found


def test_the_axis_options_are_found():
    assert {(c, o) for c, o, _ in axis_options()} == {
        ("run", "--mode"), ("run", "--precision"), ("run", "--compile"), ("run", "--scenario"), ("run", "--parallelism"),
        ("check", "--precision"), ("check", "--mode"), ("predict", "--precision"), ("predict", "--mode"),
        ("calibrate", "--precision")}


@pytest.mark.parametrize("command, option, kind", axis_options())
def test_every_axis_option_refuses_an_unknown_value_alike(tmp_path, command, option, kind):
    """Each is typed by its axis (dlbench.axes): the same error, naming the option, the value and
    the values it takes, before anything runs."""
    needed = {"run": ["--suite", "fcn"]}.get(command, [])
    code, out, err = invoke(*command.split(), *needed, option, "fp32,nosuch", "--store", str(tmp_path / "s"))
    assert code == 2 and out == ""
    assert f"Invalid value for '{option}': unknown {kind} " in err and f"valid {kind}s: " in err
    assert not (tmp_path / "s").exists()
