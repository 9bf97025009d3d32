"""The report's run pages of multi-worker runs (fake runner): the job's layout and figures, and for
a collective its bandwidth against message size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.distributed import DistributedOptions, DistributedOrchestrator
from dlbench.execution.placement import local_placement
from dlbench.execution.registry import RunnerRegistry
from dlbench.reporting import site
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mw-site")
    mp = pytest.MonkeyPatch()
    mp.setenv("DLBENCH_FAKE_STEP_S", "0.001")
    mp.delenv("DLBENCH_FAKE_DIST", raising=False)
    try:
        fake = RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")
        catalog = SuiteCatalog(ROOT / "suites")
        bench = catalog.load_distributed_suite(ROOT / "suites" / "distributed.yaml", "smoke", "cpu").benchmarks[0]
        comm = catalog.load_distributed_suite(ROOT / "suites" / "comm.yaml", "smoke", "cpu").comm
        orch = DistributedOrchestrator(Store(tmp / "store"), DistributedOptions(
            device="cpu", env_backend="current", placement=local_placement(2, 2), threads=1, scaling="strong",
            timeout_s=60, cache=tmp / "cache", job_root=tmp / "jobs"))
        records = orch.run_distributed(fake, bench) + orch.run_comm(fake, comm)
    finally:
        mp.undo()
    site.build_site(tmp / "store", tmp / "out", workers=1)
    return tmp / "out", {r.benchmark: r for r in records}


def page(out: Path, record) -> str:
    return (out / "runs" / f"{record.run_id}.html").read_text()


def test_a_collectives_page_charts_bandwidth_against_size(built):
    out, records = built
    r = records["all_gather-w2"]
    html = page(out, r)
    assert "all_gather: bandwidth against message size (2 workers)" in html
    assert "message size (bytes, log scale)" in html and "<polyline" in html
    table = html[html.index("per message size"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td>", table)
    assert [int(x) for x in rows] == [s.size_bytes for s in r.comm.sizes]
    assert "not run: 4 B is less than one float32 per rank" in html and html.count(">correct<") == 3
    assert "algorithm bandwidth × 0.500 (nccl-tests" in html


def test_a_training_runs_page_shows_the_job_and_its_efficiency(built):
    out, records = built
    html = page(out, records["fcn5-train-w2"])
    assert "Multi-worker job" in html and "bandwidth against message size" not in html
    assert "scaling.efficiency" in html and records["fcn5-train-w1"].run_id in html  # the baseline, named
    assert "exposed_comm_s" in html
    assert all(p.read_text().count("Multi-worker job") == 1 for p in (out / "runs").glob("*.html"))


def test_a_run_on_a_shaped_link_shows_the_link_on_its_page(tmp_path):
    """The v16 fixture: torch's fcn5 on 2 workers over --link 1gbit."""
    import json
    import shutil

    fixture = ROOT / "tests" / "fixtures" / "records" / "v16.json"
    runs = tmp_path / "store" / "runs"
    runs.mkdir(parents=True)
    shutil.copy(fixture, runs / fixture.name.replace("v16", json.loads(fixture.read_text())["run_id"]))
    site.build_site(tmp_path / "store", tmp_path / "out", workers=1)
    html = (tmp_path / "out" / "runs" / f"{json.loads(fixture.read_text())['run_id']}.html").read_text()
    link = html[html.index("the shaped link (--link)"):]
    link = link[:link.index("</table>")]
    for key in ("asked", "measured.bandwidth_bps", "measured.rtt_s", "wire.sent_per_iter", "wire.ring_allreduce_bytes"):
        assert f">{key}<" in link, key
    assert ">1gbit<" in link and ">56823848.0<" in link
