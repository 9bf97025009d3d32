"""Mode generate without a framework: which networks generate and at what sizes (suite loading),
the harness's request timing, the worker result's generation times, the record's distributions,
`dlbench run --mode generate` and `dlbench check --mode generate` with the fake runner."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dlbench.analysis.generation import distribution, summarise_generation
from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.generation import context_problem, decoder_problem
from dlbench.definitions.loader import DefinitionError, load_network
from dlbench.execution import equivalence
from dlbench.execution.environments import Environment
from dlbench.execution.launcher import WorkerOutcome
from dlbench.execution.registry import RunnerRegistry
from dlbench.execution.worker_result import ResultError, parse_result
from dlbench.store.checks import CheckStore
from dlbench.store.record import Repeat
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
NETWORKS = ROOT / "suites" / "networks"
sys.path.insert(0, str(ROOT / "runners" / "common"))

from runners.common import contract  # noqa: E402
from runners.common import harness  # noqa: E402
from runners.common.protocol import Skip  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


# --------------------------------------------------------------------------- which networks generate


@pytest.mark.parametrize("path", sorted(NETWORKS.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_controller_and_the_runners_agree_on_which_networks_generate(path):
    resolved = load_network(path).resolved
    why = decoder_problem(resolved)
    try:
        contract.DecoderLayout(resolved)
        runners_refuse = False
    except Skip:
        runners_refuse = True
    assert (why is not None) == runners_refuse
    llama = ("llama32_1b", "llama_tiny", "mixtral_8x7b", "moe_tiny", "smollm2_135m")
    assert (why is None) == (path.stem in ("gpt2_small", "transformer_tiny", *llama))


def test_decoder_layout_finds_the_parts():
    layout = contract.DecoderLayout(load_network(NETWORKS / "transformer_tiny.yaml").resolved)
    assert (layout.embedding, layout.position, layout.blocks, layout.norm, layout.head) == (0, 1, [3, 4], 5, 6)
    assert layout.max_length == 32
    with pytest.raises(Skip, match="bert_base"):
        contract.DecoderLayout(load_network(NETWORKS / "bert_base.yaml").resolved)


def test_context_must_hold_prompt_and_new_tokens():
    tiny = load_network(NETWORKS / "transformer_tiny.yaml").resolved
    assert context_problem(tiny, 16, 16) is None
    assert "33 positions" in context_problem(tiny, 17, 16) and "has 32" in context_problem(tiny, 17, 16)
    assert "at least 2" in context_problem(tiny, 8, 1)


# --------------------------------------------------------------------------- suites


def test_transformer_suite_generates_its_decoders_at_the_profiles_sizes():
    catalog = SuiteCatalog(ROOT / "suites")
    path = ROOT / "suites" / "transformer.yaml"
    smoke = {b.name: b for b in catalog.load_suite(path, "smoke", "cpu", ("generate",)).benchmarks}
    assert sorted(smoke) == ["gpt2_small-generate", "transformer_tiny-generate"]
    tiny = smoke["transformer_tiny-generate"]
    assert (tiny.generation.prompt_length, tiny.generation.new_tokens, tiny.batch_sizes) == (8, 8, (2,))
    gpu = {b.name: b for b in catalog.load_suite(path, "default", "cuda", ("generate",)).benchmarks}
    gpt2 = gpu["gpt2_small-generate"]
    assert (gpt2.generation.prompt_length, gpt2.generation.new_tokens, gpt2.batch_sizes) == (512, 128, (1, 16))
    # smoke runs train only unless asked; the train benchmarks keep the entry's own batch sizes
    default = catalog.load_suite(path, "smoke", "cpu")
    assert all(b.mode == "train" and b.generation is None for b in default.benchmarks)
    assert {b.name: b.batch_sizes for b in default.benchmarks}["transformer_tiny-train"] == (4,)


def write_suite(tmp_path: Path, entry: dict) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "benchmarks": [entry]}))
    return path


SIZES = {"smoke": [1], "default": [1], "paper": [1]}
GENERATION = {"prompt_length": {"smoke": 4, "default": 8, "paper": 8},
              "new_tokens": {"smoke": 4, "default": 8, "paper": 8}}


@pytest.mark.parametrize("entry,field,words", [
    ({"network": "fcn5", "modes": ["generate"], "batch_sizes": SIZES, "generation": GENERATION},
     "benchmarks[0].modes", "not tokens"),
    ({"network": "lstm32", "modes": ["train", "generate"], "batch_sizes": SIZES, "generation": GENERATION},
     "benchmarks[0].modes", "not a decoder"),
    ({"network": "transformer_tiny", "modes": ["generate"], "batch_sizes": SIZES},
     "benchmarks[0].generation", "prompt_length and new_tokens"),
    ({"network": "transformer_tiny", "modes": ["generate"], "batch_sizes": SIZES,
      "generation": {**GENERATION, "new_tokens": {"smoke": 40, "default": 8, "paper": 8}}},
     "benchmarks[0].generation", "44 positions"),
    ({"network": "transformer_tiny", "modes": ["train"], "batch_sizes": SIZES, "generation": GENERATION},
     "benchmarks[0].generation", "do not list"),
])
def test_a_suite_that_cannot_generate_is_one_error_naming_file_and_field(tmp_path, entry, field, words):
    path = write_suite(tmp_path, entry)
    with pytest.raises(DefinitionError) as e:
        SuiteCatalog(ROOT / "suites").load_suite(path, "smoke", "cpu")
    assert str(path) in str(e.value) and field in str(e.value) and words in str(e.value)


# --------------------------------------------------------------------------- the harness's timing


class Clock:
    """perf_counter_ns stand-in: each prefill takes 5 ms, each decode 1 ms; the clock moves only then."""

    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def test_measure_generation_times_prefill_and_each_decode_between_synchronisations():
    clock = Clock()
    calls = []

    def prefill():
        calls.append("prefill")
        clock.now += 5_000_000

    def decode():
        calls.append("decode")
        clock.now += 1_000_000

    gen = contract.Generator(prefill, decode, lambda: calls.append("sync"), 10, {})
    out = harness.measure_generation(gen, {"min_iters": 1, "max_iters": 2, "max_time_s": 5, "window": 1,
                                           "tolerance": 0.5},
                                     {"min_iters": 5, "min_time_s": 0.0, "max_iters": 50}, 4, clock=clock)
    assert out["iter_s"] == [pytest.approx(0.008)] * 5  # 5 ms + 3 decodes of 1 ms
    assert out["generation"]["ttft_s"] == [pytest.approx(0.005)] * 5
    assert out["generation"]["tpot_s"] == [pytest.approx(0.001)] * 5
    assert out["generation"]["first_ttft_s"] == pytest.approx(0.005) and out["generation"]["new_tokens"] == 4
    # every prefill and decode is followed by a synchronisation, and a request is 1 prefill + 3 decodes
    first = calls.index("prefill")
    assert calls[first:first + 8] == ["prefill", "sync", "decode", "sync", "decode", "sync", "decode", "sync"]
    assert calls.count("prefill") == 1 + len(out["warmup_iter_s"]) + 5
    assert calls.count("decode") == 3 * calls.count("prefill")


def test_a_runner_without_generation_skips_naming_itself():
    class Old:
        name = "old"

        def configure_threads(self, n):
            return {}

        def framework_info(self, device):
            return {"name": "old", "version": "1"}

        def device_available(self, device):
            return None

    result = harness.run_request(Old(), {"action": "benchmark", "mode": "generate", "device": "cpu",
                                         "generation": {"prompt_length": 2, "new_tokens": 2}})
    assert result["status"] == "skipped" and "old runner does not generate" in result["reason"]


# --------------------------------------------------------------------------- the worker's result


def result(**generation) -> str:
    body = {"status": "ok", "framework": {"name": "x"}, "iter_s": [0.1, 0.2], "window_monotonic_ns": [1, 2]}
    if generation:
        body["generation"] = generation
    return json.dumps(body)


def test_generation_times_are_validated_at_the_boundary():
    ok = parse_result(result(new_tokens=4, first_ttft_s=0.5, ttft_s=[0.05, 0.06], tpot_s=[0.01, 0.02]),
                      mode="generate")
    assert ok.generation.ttft_s == [0.05, 0.06]
    with pytest.raises(ResultError, match="generation.tpot_s.*1 requests, iter_s has 2"):
        parse_result(result(new_tokens=4, first_ttft_s=0.5, ttft_s=[0.05, 0.06], tpot_s=[0.01]), mode="generate")
    with pytest.raises(ResultError, match="generation.ttft_s"):
        parse_result(result(new_tokens=4, first_ttft_s=0.5, ttft_s=[0.05, -1.0], tpot_s=[0.01, 0.02]))
    with pytest.raises(ResultError, match="'generation'.*no generation times"):
        parse_result(result(), mode="generate")
    assert parse_result(result(), mode="infer").generation is None


# --------------------------------------------------------------------------- the record's figures


def test_distributions_pool_the_ok_repeats_requests():
    reps = [Repeat(index=0, status="ok", iter_s=[0.1, 0.2, 0.4],
                   generation={"new_tokens": 5, "first_ttft_s": 1.0, "ttft_s": [0.01, 0.02, 0.03],
                               "tpot_s": [0.002, 0.004, 0.006]}),
            Repeat(index=1, status="contended", iter_s=[9.0],
                   generation={"new_tokens": 5, "first_ttft_s": 9.0, "ttft_s": [9.0], "tpot_s": [9.0]}),
            Repeat(index=2, status="ok", iter_s=[0.2],
                   generation={"new_tokens": 5, "first_ttft_s": 3.0, "ttft_s": [0.05], "tpot_s": [0.008]})]
    g = summarise_generation(reps, prompt_length=7, new_tokens=5, batch_size=2)
    assert (g.prompt_length, g.new_tokens, g.batch_size) == (7, 5, 2)
    assert g.ttft.requests == 4 and g.ttft.median == pytest.approx(0.025) and g.ttft.max == 0.05
    assert g.ttft.repeat_medians == [0.02, 0.05]
    assert g.tpot.median == pytest.approx(0.005) and g.tpot.p99 == pytest.approx(np.percentile([2, 4, 6, 8], 99) / 1e3)
    # tokens/s per request: batch x new tokens / the request's time
    assert sorted(g.tokens_per_s.repeat_medians) == [pytest.approx(50.0), pytest.approx(50.0)]
    assert g.tokens_per_s.max == pytest.approx(100.0) and g.tokens_per_s.min == pytest.approx(25.0)
    assert g.first_ttft_s == pytest.approx(2.0)
    assert distribution([], "s") is None


# --------------------------------------------------------------------------- end to end with the fake runner


def run_generate(store: Path, suite: str = "transformer", *extra: str):
    return invoke("run", "--no-check", "--replace-contended", "0", "--suite", suite, "--framework", "all",
                  "--profile", "smoke", "--device", "cpu", "--env", "current", "--store", str(store),
                  "--threads", "1", "--mode", "generate", "--repeats", "2", *extra)


@pytest.fixture
def quiet_fake(monkeypatch, tmp_path):
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.002")
    monkeypatch.chdir(tmp_path)


def test_run_mode_generate_records_ttft_and_tpot(project, quiet_fake, tmp_path):
    store = tmp_path / "store"
    code, out, err = run_generate(store)
    assert code == 0, err
    records = sorted(Store(store).records(), key=lambda r: r.benchmark)
    assert [r.benchmark for r in records] == ["gpt2_small-generate", "transformer_tiny-generate"]
    for r in records:
        assert r.status == "ok" and r.workload.mode == "generate" and r.prediction is None
        g = r.generation
        assert g.ttft.requests == sum(len(rep.iter_s) for rep in r.repeats) and len(g.ttft.repeat_medians) == 2
        # the fake's prefill sleeps 2 ms and each decode 0.5 ms: the request is TTFT + (N - 1) TPOT
        assert g.ttft.median >= 0.002 and g.tpot.median >= 0.0005 and g.tpot.median < g.ttft.median
        for rep in r.repeats:
            for total, ttft, tpot in zip(rep.iter_s, rep.generation["ttft_s"], rep.generation["tpot_s"]):
                assert total == pytest.approx(ttft + (g.new_tokens - 1) * tpot, rel=1e-6)
    tiny = records[1].generation
    assert (tiny.prompt_length, tiny.new_tokens, tiny.batch_size) == (8, 8, 2)
    assert "generation" in out and "TTFT ms" in out and "TPOT ms" in out and "transformer_tiny-generate" in out

    code, out, _ = invoke("results", "--store", str(store), "--format", "json")
    rows = {r["benchmark"]: r for r in json.loads(out)}
    row = rows["transformer_tiny-generate"]
    assert row["mode"] == "generate" and row["prompt_tokens"] == 8 and row["new_tokens"] == 8
    assert row["ttft_ms"] == pytest.approx(tiny.ttft.median * 1e3) and row["tpot_p99_ms"] == pytest.approx(
        tiny.tpot.p99 * 1e3)
    # tokens/s of a generate run: batch x new tokens per median request
    assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 8)

    code, out, _ = invoke("results", "--store", str(store))
    assert code == 0 and "generation (per request" in out and "TTFT p99" in out

    site = tmp_path / "site"
    code, _, err = invoke("report", "--store", str(store), "--out", str(site))
    assert code == 0, err
    page = (site / "runs" / f"{records[1].run_id}.html").read_text()
    assert "<h2>Generation</h2>" in page and "time to first token (ms)" in page and "time per output token" in page
    assert f"{tiny.ttft.median * 1e3:.4g}" in page
    benchmark_pages = [p.read_text() for p in (site / "benchmarks").glob("*.html")]
    tiny_page = next(p for p in benchmark_pages if "transformer_tiny-generate" in p)
    assert "<h2>Generation</h2>" in tiny_page and "TTFT p99 ms" in tiny_page
    assert not any("<h2>Generation</h2>" in p for p in benchmark_pages if "generate" not in p)


def test_mode_generate_on_a_suite_without_decoders_is_refused_naming_them(project, quiet_fake, tmp_path):
    code, _, err = run_generate(tmp_path / "s", "fcn")
    assert code == 2
    assert "--mode generate: suite 'fcn' has no benchmark that generates" in err
    assert "transformer: transformer_tiny, gpt2_small" in err
    assert not (tmp_path / "s" / "runs").exists() or not list((tmp_path / "s" / "runs").iterdir())


def test_predict_refuses_mode_generate(quiet_fake):
    code, _, err = invoke("predict", "--network", "transformer_tiny", "--framework", "torch", "--batch", "1",
                          "--mode", "generate")
    assert code == 2 and "generate" in err


# --------------------------------------------------------------------------- check --mode generate


@pytest.fixture(scope="module")
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


def env_for(name: str) -> Environment:
    return Environment(name, "current", "cpu", Path(sys.executable), "test-key")


def test_two_fakes_generate_alike_from_the_canonical_weights(fake, monkeypatch):
    monkeypatch.delenv("DLBENCH_FAKE_CHECK_MISMATCH", raising=False)
    net = load_network(NETWORKS / "transformer_tiny.yaml")
    runners = [(replace(fake, name=n), env_for(n)) for n in ("a", "b")]
    results = equivalence.check_generation(net, runners, 8, 8, timeout_s=60)
    assert [r.status for r in results] == ["reference", "equivalent"], [r.reason for r in results]
    b = results[1]
    assert b.errors == {"first_logits": 0.0, "token_mismatches": 0.0} and b.precision == "generate-fp32"
    assert b.params == net.params and b.reference == "a 0.0"


def test_generated_ids_that_differ_are_a_mismatch_naming_where(fake, monkeypatch, tmp_path):
    net = load_network(NETWORKS / "transformer_tiny.yaml")
    batch, vocabulary = equivalence.check_batch_size(net), net.resolved["input"]["vocabulary"]

    def worker(python, script, request, timeout_s, **kwargs):
        tokens = np.arange(batch * 4).reshape(batch, 4)
        logits = np.ones((batch, vocabulary), np.float32)
        if len(worker.calls) == 1:  # the second framework
            tokens[1, 2] += 1
            logits[0, 0] += 1e-3
        worker.calls.append(request)
        np.savez(request["outputs"], tokens=tokens, first_logits=logits)
        return WorkerOutcome("ok", None, {"framework": {"name": "x", "version": "1"}, "params": net.params}, "", 0, 0.1)

    worker.calls = []
    monkeypatch.setattr(equivalence, "run_worker", worker)
    runners = [(replace(fake, name=n), env_for(n)) for n in ("ref", "other")]
    ref, other = equivalence.check_generation(net, runners, 4, 4)
    assert worker.calls[0]["mode"] == "generate" and worker.calls[0]["generation"] == {"prompt_length": 4,
                                                                                      "new_tokens": 4}
    assert ref.status == "reference" and other.status == "mismatch"
    assert other.errors["token_mismatches"] == 1.0 and other.errors["first_logits"] == pytest.approx(1e-3, rel=1e-3)
    assert "first-step logits differ from ref" in other.reason
    assert f"1 of {batch * 4} generated ids differ from ref's, first at new token 2 of sequence 1 (7 against 6)" in other.reason
    CheckStore(tmp_path).save(other)  # kept beside the train checks, under its own precision
    assert (tmp_path / "checks" / "transformer_tiny--other--1--generate-fp32.json").is_file()


def test_check_mode_generate_through_the_cli(project, quiet_fake, tmp_path, monkeypatch):
    monkeypatch.delenv("DLBENCH_FAKE_CHECK_MISMATCH", raising=False)
    code, out, err = invoke("check", "--mode", "generate", "--framework", "fake", "--env", "current",
                            "--network", "transformer_tiny", "--store", str(tmp_path / "s"))
    assert code == 0, err
    assert "transformer_tiny" in out and "reference" in out and "generate" in out
    code, _, err = invoke("check", "--mode", "generate", "--framework", "fake", "--env", "current",
                          "--network", "fcn5", "--store", str(tmp_path / "s"))
    assert code == 2 and "not tokens" in err and "transformer_tiny" in err
    code, _, err = invoke("check", "--mode", "generate", "--precision", "amp_bf16", "--framework", "fake",
                          "--env", "current", "--store", str(tmp_path / "s"))
    assert code == 2 and "amp_bf16" in err
    code, _, err = invoke("check", "--mode", "generate", "--sequence-length", "8", "--framework", "fake",
                          "--env", "current", "--store", str(tmp_path / "s"))
    assert code == 2 and "--sequence-length is for --mode train" in err
