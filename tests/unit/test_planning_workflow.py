"""`dlbench plan` end to end (workflows/planning.py, cli/plan.py, reporting/plan_page.py): Gavel's trace
excerpt on Gavel's table, a hand-made sacct export on datasheet machines, a trace with `framework: any`,
what-if questions, the report page, and bad input as one error (exit 2) naming the file and field."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.workflows.planning import PlanRequest, plan
from dlbench.workflows.suite_kinds import RequestError

ROOT = Path(__file__).resolve().parents[2]
GAVEL = ROOT / "tests" / "fixtures" / "gavel"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

DATASHEETS = """name: sheets
preemption_s: 10
network: {alpha_us: 10, gb_per_s: 25}
types:
  h100: {machine: h100, nodes: 1, gpus_per_node: 8, price_per_hour: 3.0}
  l4: {machine: l4, nodes: 1, gpus_per_node: 8, price_per_hour: 0.8}
  h200: {machine: h200, nodes: 0, gpus_per_node: 8, price_per_hour: 3.8}
"""
ANY_TRACE = """jobs:
  - {arrival_s: 0, network: fcn5, framework: any, precision: any, batch: 64, workers: 2, iterations: 200000}
  - {arrival_s: 10, network: resnet56, framework: any, precision: any, batch: 64, workers: 1, iterations: 50000}
  - {arrival_s: 20, network: fcn5, framework: torch, batch: 64, workers: 1, iterations: 100000}
  - {arrival_s: 30, network: resnet56, framework: any, batch: 32, workers: 4, iterations: 40000}
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def invoke(*args):
    result = CliRunner().invoke(app, ["plan", *map(str, args)], catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


def gavel(**kw):
    return PlanRequest(cluster=ROOT / "suites" / "clusters" / "gavel-36.yaml", trace=GAVEL / "msr_seed0_0e4a51_head40.trace",
                       trace_format="gavel", throughputs=GAVEL / "simulation_throughputs_isolated.json", **kw)


def test_gavels_trace_on_gavels_table_the_aware_max_min_beats_the_agnostic_one():
    result = plan(gavel(policies=["maxmin_agnostic", "gavel_maxmin"]))
    agnostic, aware = result.summaries
    assert agnostic.finished == aware.finished == 40
    assert aware.average_jct_s < agnostic.average_jct_s  # the direction of Gavel's Figure 8
    assert {c["source"] for c in result.matrix} == {"table"}


def test_framework_aware_gets_at_least_the_pinned_throughput_and_a_what_if_adds_devices(tmp_path):
    cluster = write(tmp_path, "c.yaml", DATASHEETS)
    result = plan(PlanRequest(cluster=cluster, trace=write(tmp_path, "t.yaml", ANY_TRACE),
                              policies=["las", "framework_aware"], what_if=["add 8 h200", "replace l4 with h100"]))
    assert result.pinned in {"torch", "jax", "tensorflow", "mxnet"}
    assert any("run in" in n for n in result.notes)
    las, aware = result.summaries
    assert las.finished == aware.finished == 4
    sources = {c["source"] for c in result.matrix if c["iterations_per_s"]}
    assert sources == {"datasheet"}
    added, replaced = result.what_if
    assert [t.count for t in added.cluster.types] == [8, 8, 8] and [t.count for t in replaced.cluster.types] == [16, 0, 0]
    document = result.to_dict()
    assert document["policies"][1]["policy"] == "framework_aware" and len(document["what_if"]) == 2


def test_a_hand_made_sacct_export_is_simulated(tmp_path):
    sacct = ("JobID|JobName|Submit|ElapsedRaw|AllocTRES|State\n"
             "7|resnet56-cifar|2026-12-01T08:00:00|3600|cpu=8,gres/gpu:h100=4,node=1|COMPLETED\n"
             "8|fcn5|2026-12-01T08:05:00|1200|cpu=2,gres/gpu:l4=1,node=1|COMPLETED\n"
             "9|notebook|2026-12-01T08:06:00|60|cpu=2,gres/gpu:l4=1,node=1|COMPLETED\n")
    result = plan(PlanRequest(cluster=write(tmp_path, "c.yaml", DATASHEETS), trace=write(tmp_path, "s.txt", sacct),
                              trace_format="sacct", policies=["fifo", "srtf"]))
    assert [j.network for j in result.jobs] == ["resnet56", "fcn5"]
    assert all(s.finished == 2 for s in result.summaries)
    assert any("notebook" in n for n in result.trace.notes)


@pytest.mark.parametrize("cluster,trace,field", [
    (DATASHEETS, ANY_TRACE.replace("network: resnet56, framework: any, precision: any", "network: resnet99, framework: any, precision: any"),
     "t.yaml: jobs[1]: network: unknown network 'resnet99'"),
    (DATASHEETS.replace("nodes: 1,", "nodes: 0,"), ANY_TRACE, "c.yaml: types: the cluster has no devices"),
    (DATASHEETS.replace("machine: l4", "machine: l5"), ANY_TRACE, "c.yaml: types.l4.machine: unknown machine 'l5'"),
    (DATASHEETS, ANY_TRACE.replace("workers: 4", "workers: 64"), "no feasible allocation: job 3 (64 workers)"),
    (DATASHEETS, ANY_TRACE.replace("framework: torch", "framework: caffe"), "jobs[2]: framework: unknown framework"),
])
def test_bad_input_is_one_error_naming_it_and_exit_2(tmp_path, cluster, trace, field):
    code, out, err = invoke("--cluster", write(tmp_path, "c.yaml", cluster), "--trace", write(tmp_path, "t.yaml", trace),
                            "--policy", "gavel_maxmin")
    assert code == 2 and out == "" and field in err and err.startswith("error:")


@pytest.mark.parametrize("question,says", [
    ("add 8 a100", "no type 'a100' in the cluster file"),
    ("remove 16 l4", "l4 has only 8 devices"),
    ("double everything", "expected 'add N TYPE'"),
])
def test_a_what_if_that_cannot_apply_is_refused_before_anything_runs(tmp_path, question, says):
    code, out, err = invoke("--cluster", write(tmp_path, "c.yaml", DATASHEETS), "--trace", write(tmp_path, "t.yaml", ANY_TRACE),
                            "--what-if", question)
    assert code == 2 and says in err


def test_the_command_prints_json_and_writes_the_report_page(tmp_path):
    code, out, err = invoke("--cluster", ROOT / "suites" / "clusters" / "gavel-36.yaml", "--trace",
                            GAVEL / "physical_small_test.trace", "--trace-format", "gavel", "--throughputs",
                            GAVEL / "simulation_throughputs_isolated.json", "--policy", "fifo,gavel_makespan",
                            "--format", "json", "--page", tmp_path / "site")
    assert code == 0, err
    document = json.loads(out)
    assert [p["policy"] for p in document["policies"]] == ["fifo", "gavel_makespan"]
    assert document["policies"][1]["lp_solves"] >= 1 and document["trace"]["jobs"] == 20
    page = (tmp_path / "site" / "plan.html").read_text()
    assert page.count("<svg") == 3 and "JCT CDF" in page and "cost against JCT" in page
    assert (tmp_path / "site" / "static" / "style.css").is_file()
    code, out, err = invoke("--cluster", ROOT / "suites" / "clusters" / "gavel-36.yaml", "--trace",
                            GAVEL / "physical_small_test.trace", "--trace-format", "gavel", "--throughputs",
                            GAVEL / "simulation_throughputs_isolated.json", "--policy", "srtf", "--matrix")
    assert code == 0 and "srtf" in out and "throughput matrix" in out and "table" in out


def test_a_trace_naming_a_type_the_table_lacks_is_refused(tmp_path):
    cluster = write(tmp_path, "c.yaml", "name: x\ntypes:\n  a100: {nodes: 1, price_per_hour: 1}\n")
    with pytest.raises(RequestError, match="a100 not in the throughput table"):
        plan(replace(gavel(policies=["fifo"]), cluster=cluster))


def test_a_steady_state_window_measures_only_its_jobs_and_a_window_past_the_trace_is_refused(tmp_path):
    whole = plan(gavel(policies=["srtf"]))
    window = plan(gavel(policies=["srtf"], measure=(10, 19)))
    assert (window.summaries[0].jobs, window.summaries[0].measured) == (10, "jobs 10-19 of the trace")
    ten = [whole.runs[0].simulation.outcomes[j].jct_s for j in range(10, 20)]
    assert window.summaries[0].average_jct_s == pytest.approx(sum(ten) / 10)  # the later jobs do not change them
    code, out, err = invoke("--cluster", ROOT / "suites" / "clusters" / "gavel-36.yaml", "--trace",
                            GAVEL / "msr_seed0_0e4a51_head40.trace", "--trace-format", "gavel", "--throughputs",
                            GAVEL / "simulation_throughputs_isolated.json", "--measure-jobs", "30:50")
    assert code == 2 and "--measure-jobs 30:50: the trace has jobs 0 to" in err
    code, _, err = invoke("--cluster", ROOT / "suites" / "clusters" / "gavel-36.yaml", "--trace",
                          GAVEL / "msr_seed0_0e4a51_head40.trace", "--measure-jobs", "9-5")
    assert code == 2 and "expected FIRST:LAST" in err


def convergence_store(tmp_path) -> Path:
    """A store holding the v11 fixture: the fake runner's runs of task digits_linear (digits_fcn5 at
    batch 32) that reached 90% in 1, 2 and 1 epochs of 44 steps; its score's epochs to target 1.0."""
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    data = json.loads((ROOT / "tests" / "fixtures" / "records" / "v11.json").read_text())
    (store / "runs" / f"{data['run_id']}.json").write_text(json.dumps(data))
    return store


TARGET_TRACE = """jobs:
  - {arrival_s: 0, network: digits_fcn5, framework: any, batch: 32, target: digits_linear}
  - {arrival_s: 0, network: digits_fcn5, framework: torch, batch: 16, workers: 2, target: digits_linear}
"""


def test_a_convergence_target_becomes_the_iterations_the_stored_runs_took(tmp_path):
    """1.0 epochs to target x 44 steps an epoch = 44 iterations, for a job in any framework (the median
    over the one framework with runs) and for one in torch, which has none (an estimate, said)."""
    result = plan(PlanRequest(cluster=write(tmp_path, "c.yaml", DATASHEETS), trace=write(tmp_path, "t.yaml", TARGET_TRACE),
                              policies=["srtf"], store=convergence_store(tmp_path)))
    assert [j.work.iterations for j in result.jobs] == [44.0, 44.0]
    any_job, torch_job = [n for n in result.notes if "convergence task" in n]
    assert any_job == ("1 job(s) train to convergence task digits_linear's target: 44 iterations, from the median "
                       "of fake's runs (fake 1 epochs x 44 steps)")
    assert torch_job.endswith("torch having none: an estimate") and result.summaries[0].finished == 2


@pytest.mark.parametrize("change,says", [
    ("batch: 32, target", "batch: convergence task 'digits_linear' reached its target at a batch of 32; this job's is 2 x 32"),
    ("network: digits_fcn5, framework: torch", "network: convergence task 'digits_linear' trains digits_fcn5, not fcn5"),
    ("target: digits_linear\n", "target: no run of convergence task 'digits_cnn' in the store"),
])
def test_a_target_the_store_cannot_turn_into_work_is_refused(tmp_path, change, says):
    trace = {"batch: 32, target": TARGET_TRACE.replace("batch: 16, workers: 2", "batch: 32, workers: 2"),
             "network: digits_fcn5, framework: torch": TARGET_TRACE.replace("network: digits_fcn5, framework: torch",
                                                                              "network: fcn5, framework: torch"),
             "target: digits_linear\n": TARGET_TRACE.replace("target: digits_linear}\n  - ", "target: digits_cnn}\n  - ")}[change]
    code, out, err = invoke("--cluster", write(tmp_path, "c.yaml", DATASHEETS), "--trace", write(tmp_path, "t.yaml", trace),
                            "--store", convergence_store(tmp_path))
    assert code == 2 and says in err, err
