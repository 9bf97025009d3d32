"""The planner's inputs (src/dlbench/planning/cluster.py, trace.py, readers.py): the cluster file and
dlbench's trace validated with one error naming the file and the field, traces bounded, and Gavel's
and Slurm's formats read from samples (Gavel's: excerpts of its repository, tests/fixtures/gavel/;
Slurm's: written here by hand in `sacct --parsable2`'s form)."""

from pathlib import Path

import pytest

from dlbench.definitions.loader import DefinitionError
from dlbench.planning.cluster import load_cluster
from dlbench.planning.readers import gavel_family, read_gavel, read_gavel_throughputs, read_sacct
from dlbench.planning.trace import MAX_JOBS, load_trace

ROOT = Path(__file__).resolve().parents[2]
GAVEL = ROOT / "tests" / "fixtures" / "gavel"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


CLUSTER = """name: two
preemption_s: 5
network: {alpha_us: 10, gb_per_s: 25}
types:
  fast: {machine: h100, nodes: 1, gpus_per_node: 8, price_per_hour: 3}
  slow: {machine: l4, nodes: 2, gpus_per_node: 4, price_per_hour: 0.8, link: {alpha_us: 5, gb_per_s: 16}}
"""


def test_a_cluster_file_is_read_with_its_devices_links_and_prices(tmp_path):
    cluster = load_cluster(write(tmp_path, "c.yaml", CLUSTER))
    assert cluster.names == ["fast", "slow"]
    assert [t.count for t in cluster.types] == [8, 8] and cluster.devices == 16
    assert cluster.type("slow").link.beta_s_per_byte == pytest.approx(1 / 16e9)
    assert cluster.network.alpha_s == pytest.approx(10e-6) and cluster.preemption_s == 5


@pytest.mark.parametrize("edit,field,reason", [
    (lambda t: t.replace("nodes: 1,", "nodes: 0,").replace("nodes: 2,", "nodes: 0,"), "types", "no devices"),
    (lambda t: t.replace("price_per_hour: 3}", "price_per_hour: -3}"), "types.fast.price_per_hour", "greater than or equal"),
    (lambda t: t.replace("gb_per_s: 25", "gb_per_s: 0"), "network.gb_per_s", "greater than 0"),
    (lambda t: t.replace("nodes: 1,", "nodes: 1, colour: red,"), "types.fast.colour", "unknown field"),
    (lambda t: t.replace("  fast:", "  Fast!:"), "types.Fast!", ""),
])
def test_a_bad_cluster_file_is_one_error_naming_the_file_and_field(tmp_path, edit, field, reason):
    path = write(tmp_path, "c.yaml", edit(CLUSTER))
    with pytest.raises(DefinitionError) as e:
        load_cluster(path)
    assert e.value.path == str(path) and e.value.field.startswith(field) and reason in e.value.reason


TRACE = """jobs:
  - {id: a, arrival_s: 0, network: resnet50, framework: any, precision: any, batch: 64, workers: 4, iterations: 100}
  - {arrival_s: 5, network: fcn5, framework: torch, batch: 50, workers: 2, epochs: 2, samples_per_epoch: 1000}
  - {arrival_s: 9, network: lstm32, framework: jax, batch: 8, seconds: 3600, seconds_on: fast}
"""


def test_a_trace_gives_each_job_its_work_in_iterations_or_seconds(tmp_path):
    trace = load_trace(write(tmp_path, "t.yaml", TRACE))
    a, b, c = trace.jobs
    assert (a.id, a.workers, a.work.iterations, a.framework, a.precision) == ("a", 4, 100, "any", "any")
    assert b.id == "1" and b.work.iterations == 20  # 2 epochs x 1000 samples / (50 x 2 workers)
    assert (c.work.seconds, c.work.on, c.work.iterations) == (3600, "fast", None)


def test_the_same_trace_as_csv_reads_the_same(tmp_path):
    csv = ("id,arrival_s,network,framework,precision,batch,workers,iterations,epochs,samples_per_epoch\n"
           "a,0,resnet50,any,any,64,4,100,,\n"
           "1,5,fcn5,torch,fp32,50,2,,2,1000\n")
    jobs = load_trace(write(tmp_path, "t.csv", csv)).jobs
    assert [(j.id, j.network, j.work.iterations) for j in jobs] == [("a", "resnet50", 100), ("1", "fcn5", 20)]


@pytest.mark.parametrize("edit,field,reason", [
    (lambda t: t.replace("iterations: 100", "iterations: 100, epochs: 2"), "jobs[0]", "exactly one of"),
    (lambda t: t.replace("batch: 64", "batch: 0"), "jobs[0].batch", "greater than 0"),
    (lambda t: t.replace("framework: jax", "framework: jax, precision: any"), "jobs[2]", "goes with framework: any"),
    (lambda t: t.replace("precision: any, batch: 64", "precision: fp8, batch: 64"), "jobs[0]", "unknown precision"),
    (lambda t: t.replace("seconds_on: fast", "colour: red"), "jobs[2]", ""),
])
def test_a_bad_job_is_one_error_naming_the_file_and_field(tmp_path, edit, field, reason):
    path = write(tmp_path, "t.yaml", edit(TRACE))
    with pytest.raises(DefinitionError) as e:
        load_trace(path)
    assert e.value.path == str(path) and e.value.field.startswith(field) and reason in e.value.reason


def test_a_bad_csv_row_names_its_line_and_column(tmp_path):
    path = write(tmp_path, "t.csv", "network,batch,iterations\nfcn5,64,10\nfcn5,six,10\n")
    with pytest.raises(DefinitionError, match=r"line 3: batch: not a number: 'six'"):
        load_trace(path)


def test_a_trace_of_a_million_lines_is_refused_at_once_or_cut_where_asked(tmp_path):
    path = tmp_path / "big.csv"
    row = "fcn5,64,10\n"
    path.write_text("network,batch,iterations\n" + row * 1_000_000)
    with pytest.raises(DefinitionError, match=f"more than {MAX_JOBS:,} jobs"):
        load_trace(path)
    taken = load_trace(path, limit=1000)
    assert len(taken.jobs) == 1000 and "first 1,000" in taken.notes[0]
    yaml_path = tmp_path / "big.yaml"  # counted before it is parsed: lines of anything will do
    yaml_path.write_text("jobs:\n" + "#\n" * 1_000_000)
    with pytest.raises(DefinitionError, match="write a larger one as CSV"):
        load_trace(yaml_path)


def test_gavel_traces_of_both_forms_are_read(tmp_path):
    old = read_gavel(GAVEL / "msr_seed0_0e4a51_head40.trace")
    assert len(old.jobs) == 40
    first = old.jobs[0]
    assert (first.network, first.batch, first.workers, first.work.iterations, first.arrival_s) == \
        ("Transformer (batch size 128)", 128, 1, 95121, 0.0)
    assert {j.workers for j in old.jobs} == {1, 4}
    new = read_gavel(GAVEL / "physical_small_test.trace")
    assert len(new.jobs) == 20 and new.jobs[0].work.iterations == 346 and new.jobs[0].workers == 2
    assert gavel_family("ResNet-50 (batch size 64)") == "ResNet-50"


def test_a_gavel_family_without_a_network_is_named_and_left_out():
    trace = read_gavel(GAVEL / "msr_seed0_0e4a51_head40.trace", networks={"ResNet-50": "resnet50"})
    assert {j.network for j in trace.jobs} == {"resnet50"}
    assert any("'CycleGAN' maps to no dlbench network" in n for n in trace.notes)


def test_gavel_throughput_table_gives_each_job_type_alone_per_worker_type():
    table = read_gavel_throughputs(GAVEL / "simulation_throughputs_isolated.json")
    row = table[("ResNet-50 (batch size 64)", 1)]
    assert set(row) == {"v100", "p100", "k80"} and row["v100"] > row["p100"] > row["k80"] > 0


def test_a_malformed_gavel_line_names_its_line(tmp_path):
    with pytest.raises(DefinitionError, match="line 2: 3 tab-separated fields"):
        read_gavel(write(tmp_path, "g.trace", (GAVEL / "physical_small_test.trace").read_text().splitlines()[0]
                         + "\na\tb\tc\n"))


# A Slurm accounting export made by hand in the form `sacct --parsable2 --allocations
# --format=JobID,JobName,Submit,ElapsedRaw,AllocTRES,State` prints (job steps and a pending job among them).
SACCT = """JobID|JobName|Submit|ElapsedRaw|AllocTRES|State
1001|resnet50-train|2026-12-01T08:00:00|3600|billing=8,cpu=8,gres/gpu:h100=4,gres/gpu=4,mem=64G,node=1|COMPLETED
1001.batch|batch|2026-12-01T08:00:00|3600|cpu=8,gres/gpu:h100=4,mem=64G,node=1|COMPLETED
1002|fcn5|2026-12-01T08:10:00|600|cpu=2,gres/gpu=1,mem=8G,node=1|COMPLETED
1003|my-own-model|2026-12-01T08:20:00|60|cpu=2,gres/gpu:l4=1,node=1|COMPLETED
1004|lstm32_lr0.1|2026-12-01T08:30:00|1800|cpu=2,gres/gpu:l4=2,node=1|TIMEOUT
1005|resnet50|2026-12-01T08:40:00|0|cpu=2,gres/gpu:h100=1,node=1|PENDING
1006|preprocess|2026-12-01T08:45:00|120|cpu=16,mem=64G,node=1|COMPLETED
"""


def test_a_hand_made_sacct_export_is_read_mapping_what_it_can_and_naming_the_rest(tmp_path):
    known = {"resnet50", "fcn5", "lstm32"}.__contains__
    trace = read_sacct(write(tmp_path, "sacct.txt", SACCT), known, default_type="l4", batch=16)
    jobs = {j.id: j for j in trace.jobs}
    assert sorted(jobs) == ["1001", "1002", "1004"]
    assert (jobs["1001"].network, jobs["1001"].workers, jobs["1001"].work.seconds, jobs["1001"].work.on) == \
        ("resnet50", 4, 3600, "h100")
    assert jobs["1002"].work.on == "l4" and jobs["1002"].arrival_s == 600  # no GPU type: the default type
    assert jobs["1004"].network == "lstm32" and jobs["1004"].workers == 2 and jobs["1004"].batch == 16
    notes = " ".join(trace.notes)
    assert "batch 16 per GPU" in notes and "1 (job steps)" in notes and "1 (state PENDING)" in notes
    assert "1 (no GPU)" in notes and "my-own-model" in notes


def test_sacct_without_the_columns_it_needs_says_which(tmp_path):
    with pytest.raises(DefinitionError, match="missing column"):
        read_sacct(write(tmp_path, "s.txt", "JobID|State\n1|COMPLETED\n"), lambda n: True)
