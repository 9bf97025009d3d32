"""The planner's throughput matrix (src/dlbench/planning/matrix.py): each cell from the first source
that has it (a stored run, the performance model from a calibrated or datasheet profile, a table),
labelled with that source and its uncertainty; multi-worker cells add the communication over the
placement's link; `framework: any` picks the fastest equivalent framework and precision."""

from pathlib import Path

import pytest

from dlbench.definitions.loader import load_network
from dlbench.performance.datasheet import DatasheetMachines
from dlbench.planning.cluster import Cluster, DeviceType, LinkSpec
from dlbench.planning.matrix import Measured, Sources, ThroughputMatrix, throughput_vectors, work_iterations
from dlbench.planning.trace import Job, Work
from dlbench.workflows import lookup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sources():
    catalog, registry = lookup.catalog(), lookup.registry()
    frameworks = registry.names()
    machines = DatasheetMachines(catalog.machines_dir)
    return Sources(networks={n: load_network(catalog.networks_dir / f"{n}.yaml").resolved for n in ("fcn5", "resnet56")},
                   profiles={"h100": machines.profile("h100", frameworks), "l4": machines.profile("l4", frameworks)},
                   facts={f: lookup.runner(registry, f).model for f in frameworks},
                   precisions=("fp32", "amp_bf16"))


def cluster(network: LinkSpec | None = LinkSpec(alpha_us=10, gb_per_s=25)) -> Cluster:
    return Cluster("t", (DeviceType("h100", "h100", 2, 8, 3.0, None),
                         DeviceType("l4", "l4", 1, 8, 0.8, LinkSpec(alpha_us=5, gb_per_s=16))), network, 0.0, 360.0)


def job(network="resnet56", framework="torch", precision="fp32", workers=1, batch=64):
    return Job("j", 0.0, network, framework, precision, batch, workers, Work(iterations=100))


def test_a_datasheet_cell_is_labelled_as_such_and_unvalidated(sources):
    m = ThroughputMatrix(cluster(), sources)
    fast, slow = (m.cell(job(), "torch", "fp32", t) for t in m.cluster.types)
    assert fast.source == slow.source == "datasheet" and fast.uncertainty is None and "unvalidated" in fast.basis
    assert fast.iterations_per_s > slow.iterations_per_s > 0 and fast.placement == "one"


def test_a_stored_run_beats_the_prediction_and_carries_its_interval(sources):
    measured = Sources(**{**sources.__dict__, "measured": {("resnet56", 64, "fp32", "torch", "l4"): Measured(0.25, 0.04, "run1")},
                          "validation": {"h100": (0.12, 7)}})
    m = ThroughputMatrix(cluster(), measured)
    on_l4 = m.cell(job(), "torch", "fp32", m.cluster.type("l4"))
    assert (on_l4.source, on_l4.iterations_per_s, on_l4.uncertainty) == ("measured", 4.0, 0.04) and "run1" in on_l4.basis
    on_h100 = m.cell(job(), "torch", "fp32", m.cluster.type("h100"))
    assert on_h100.source == "datasheet" and on_h100.uncertainty == 0.12 and "7 stored predictions" in on_h100.basis


def test_more_workers_pay_the_communication_of_their_placement(sources):
    m = ThroughputMatrix(cluster(), sources)
    h100 = m.cluster.type("h100")
    one = m.cell(job(workers=1), "torch", "fp32", h100)
    packed = m.cell(job(workers=8), "torch", "fp32", h100)
    spread = m.cell(job(workers=16), "torch", "fp32", h100)
    assert (packed.placement, spread.placement) == ("packed", "spread")
    # per iteration every worker does one batch: the iteration takes at least the one-worker time
    assert one.iterations_per_s >= packed.iterations_per_s > spread.iterations_per_s > 0
    assert "inside a node" not in packed.note and "between nodes" in spread.note  # the datasheet's node link vs the network
    l4 = m.cluster.type("l4")
    assert "inside a node (16 GB/s" in m.cell(job(workers=4), "torch", "fp32", l4).note
    assert m.cell(job(workers=16), "torch", "fp32", l4).iterations_per_s is None  # 16 workers, 8 L4s
    alone = ThroughputMatrix(cluster(network=None), sources)
    refused = alone.cell(job(workers=16), "torch", "fp32", alone.cluster.type("h100"))
    assert refused.iterations_per_s is None and "gives no network" in refused.note


def test_a_job_that_fits_a_node_has_a_slower_spread_cell_over_the_network(sources):
    """4 workers fit an 8-H100 node: packed they ring over the node's link, spread (no node with room)
    over the network between nodes, slower; the vectors carry both, in the framework chosen packed."""
    m = ThroughputMatrix(cluster(), sources)
    h100 = m.cluster.type("h100")
    packed = m.cell(job(workers=4), "torch", "fp32", h100)
    apart = m.cell(job(workers=4), "torch", "fp32", h100, spread=True)
    assert (packed.placement, apart.placement) == ("packed", "spread") and "between nodes" in apart.note
    assert packed.iterations_per_s > apart.iterations_per_s > 0
    speeds, chosen, spread = throughput_vectors(m, [job(workers=4)], None)
    assert (speeds[0][0], spread[0][0]) == (packed.iterations_per_s, apart.iterations_per_s)
    assert spread[0][1] == m.cell(job(workers=4), "torch", "fp32", m.cluster.type("l4"), spread=True).iterations_per_s


def test_framework_any_takes_the_fastest_equivalent_framework_and_precision(sources):
    m = ThroughputMatrix(cluster(), sources)
    flexible = job(framework="any", precision="any")
    h100 = m.cluster.type("h100")
    cells = [m.cell(flexible, fw, p, h100) for fw, p in m.choices(flexible, None)]
    assert len(cells) == len(sources.facts) * 2
    best = m.best(flexible, h100)
    assert best.iterations_per_s == max(c.iterations_per_s for c in cells if c.iterations_per_s)
    pinned = m.best(flexible, h100, pinned="mxnet")
    mxnet = [c for c in cells if c.framework == "mxnet" and c.iterations_per_s]
    assert pinned.framework == "mxnet" and pinned.iterations_per_s == max(c.iterations_per_s for c in mxnet)
    not_equivalent = ThroughputMatrix(cluster(), Sources(**{**sources.__dict__,
                                                            "not_equivalent": {"resnet56": {best.framework}}}))
    assert not_equivalent.best(flexible, h100).framework != best.framework
    speeds, chosen, spread = throughput_vectors(m, [flexible], "mxnet", aware=True)
    assert speeds[0][0] == best.iterations_per_s and chosen[0][0].framework == best.framework
    assert spread[0][0] == speeds[0][0]  # one worker: nothing to spread


def test_a_table_cell_comes_from_the_table():
    table = {("ResNet-50 (batch size 64)", 1): {"h100": 3.5}}
    m = ThroughputMatrix(cluster(), Sources(table=table))
    j = job(network="ResNet-50 (batch size 64)")
    assert m.best(j, m.cluster.type("h100")).iterations_per_s == 3.5
    missing = m.best(j, m.cluster.type("l4"))
    assert missing.iterations_per_s is None and "no l4 throughput" in missing.note


def test_work_in_seconds_becomes_iterations_at_the_speed_of_the_type_it_ran_on():
    j = Job("s", 0.0, "fcn5", "torch", "fp32", 32, 1, Work(seconds=100, on="l4"))
    assert work_iterations(j, {"l4": 2.5}.get) == 250
    assert work_iterations(j, {"l4": 0.0}.get) is None
