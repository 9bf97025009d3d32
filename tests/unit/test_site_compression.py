"""The report's compression page (issue 44): each method's speedup over dense against the link's
bandwidth, from data-parallel training runs on shaped links, and beside it the time to accuracy of
the data-parallel convergence runs, each compressed one against dense; a method that did not run
or never reached the target is a row saying why."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from dlbench.reporting import site
from dlbench.store.record import (ConvergenceInfo, ConvergenceRun, DenseComparison, DistributedInfo, LinkInfo,
                                  SeedAgainstDense)
from dlbench.store.store import Store
from store_records import T0, record_from_times

RATES = {"1gbit": 1_000_000_000, "10gbit": 10_000_000_000}


def training(framework: str, link: str, compression: str, iter_s: float, minutes: int, status: str = "ok"):
    r = record_from_times([[iter_s] * 5] * 2, started=T0 + timedelta(minutes=minutes),
                          benchmark=f"fcn5-train-w2@{link}", framework=framework, batch_size=64, status=status)
    r.suite, r.network.name = "distributed", "fcn5"
    r.workload.compression = compression
    r.distributed = DistributedInfo(workers=2, hosts=["10.0.0.1", "10.0.0.2"], placement="local", launch="ranks",
                                    threads_per_worker=1)
    r.link = LinkInfo(asked=link, rate_bps=RATES[link], shaping="tbf", subnet="10.0.0.0/24")
    if status != "ok":
        r.reason = f"{framework} data-parallel runner: compression {compression} is not one it trains in"
    return r


def _seed(seed, time_s):
    return ConvergenceRun(seed=seed, status="ok", reached=time_s is not None, time_to_target_s=time_s, epochs=4,
                          evals=[{"epoch": 4, "accuracy": 0.98 if time_s else 0.93, "time_s": 1.0}])


def convergence(compression: str, times: list, minutes: int, dense=None):
    r = record_from_times([[0.1]], started=T0 + timedelta(minutes=minutes), benchmark="digits_cnn-w2@1gbit",
                          framework="torch", batch_size=32)
    r.suite, r.summary = "convergence", None
    r.workload.mode, r.workload.compression = "convergence", compression
    r.distributed = DistributedInfo(workers=2, hosts=["10.0.0.1", "10.0.0.2"], placement="local",
                                    launch="torchrun", threads_per_worker=1, per_worker_batch=16, global_batch=32)
    r.link = LinkInfo(asked="1gbit", rate_bps=RATES["1gbit"], shaping="tbf", subnet="10.0.0.0/24")
    reached = [t for t in times if t is not None]
    score = sorted(reached)[len(reached) // 2] if len(reached) == len(times) else None
    r.convergence = ConvergenceInfo(
        task="digits_cnn", dataset={"name": "digits"}, metric="top1", target=0.97, optimizer={}, augmentation={},
        batch_size=32, max_epochs=30, eval_every_epochs=1, loader_workers=2, max_init_s=900.0,
        runs=[_seed(i, t) for i, t in enumerate(times)], score_s=score, score_rule="olympic",
        reached=len(reached), reason=None if score else f"{len(times) - len(reached)} of {len(times)} runs did not "
                                                         "reach the target")
    if score is None:
        r.status, r.reason = "failed", r.convergence.reason
    if dense is not None:
        seeds = [SeedAgainstDense(seed=i, dense_s=d.time_to_target_s, time_s=t,
                                  speedup=d.time_to_target_s / t if t else None,
                                  reason=None if t else "this run did not reach the target in 4 epochs")
                 for i, (d, t) in enumerate(zip(dense.convergence.runs, times))]
        r.convergence.against_dense = DenseComparison(
            dense_run_id=dense.run_id, seeds=seeds, score_speedup=dense.convergence.score_s / score if score else None,
            reason=None if score else f"this run has no score ({r.convergence.reason})")
    return r


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compression-site")
    store = Store(tmp / "store")
    records = [
        training("torch", "1gbit", "none", 0.100, 0), training("torch", "1gbit", "topk:0.01", 0.050, 1),
        training("torch", "10gbit", "none", 0.040, 2), training("torch", "10gbit", "topk:0.01", 0.050, 3),
        training("jax", "1gbit", "none", 0.080, 4), training("jax", "1gbit", "powersgd:4", 0.040, 5),
        training("jax", "1gbit", "gtopk:0.01", 0.0, 6, status="skipped"),
        training("torch", "1gbit", "fp16", 0.080, 7), training("torch", "1gbit", "fp16", 0.060, 8),  # latest counts
    ]
    dense = convergence("none", [10.0, 12.0, 11.0], 10)
    records += [dense, convergence("fp16", [5.0, 6.0, 5.5], 11, dense), convergence("topk:0.01", [8.0, None, 9.0], 12,
                                                                                     dense)]
    for r in records:
        store.write(r)
    site.build_site(store.root, tmp / "out", workers=1)
    return (tmp / "out" / "compression.html").read_text(), (tmp / "out" / "index.html").read_text()


def rows(html: str, table: str) -> list[list[str]]:
    body = html[html.index(f'class="sortable filterable {table}"'):]
    body = body[body.index("<tbody>"):body.index("</tbody>")]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_each_method_is_its_throughput_over_dense_on_the_same_link(page):
    html, index = page
    assert 'href="compression.html">Compression</a>' in index
    got = {(r[0], r[5], r[6]): (r[7], r[10], r[11]) for r in rows(html, "speedups")}
    assert got[("torch", "1gbit", "topk:0.01")] == ("ok", "2.00", "")
    assert got[("torch", "10gbit", "topk:0.01")] == ("ok", "0.800", "")
    assert got[("torch", "1gbit", "fp16")] == ("ok", "1.67", "")  # the latest fp16 run, not the first
    assert got[("jax", "1gbit", "powersgd:4")] == ("ok", "2.00", "")
    assert got[("torch", "1gbit", "none")] == ("ok", "1.00", "")
    status, speedup, reason = got[("jax", "1gbit", "gtopk:0.01")]  # not run: a row saying why, no point
    assert status == "skipped" and speedup == "–" and "compression gtopk:0.01 is not one it trains in" in reason
    assert len(got) == 8  # torch: dense, top-k and fp16 on 1gbit, dense and top-k on 10gbit; jax: three on 1gbit


def test_the_chart_draws_a_series_per_framework_and_method_against_link_rate(page):
    html, _ = page
    assert "fcn5, 2 workers, fp32, batch 64: speedup over dense against link bandwidth" in html
    assert "link rate (Gbit/s, log scale)" in html
    chart = html[html.index("<svg"):html.index("</svg>")]
    for name in ("torch topk:0.01", "torch fp16", "jax powersgd:4"):
        assert name in chart
    assert "jax gtopk:0.01" not in chart and "torch none" not in chart
    assert chart.count("<polyline") == 1  # only torch topk has two link rates


def test_time_to_accuracy_sits_beside_with_each_method_against_dense_and_misses_said(page):
    html, _ = page
    assert html.index("<h2>Speedup over dense against link bandwidth") < html.index("<h2>Time to accuracy")
    got = {r[4]: r for r in rows(html, "time-to-accuracy")}
    assert list(got) == ["none", "fp16", "topk:0.01"]  # dense first
    assert got["none"][5] == "ok" and got["none"][6] == "11.0" and got["none"][7] == ""
    assert got["fp16"][6] == "5.50" and got["fp16"][7] == "2.00" and got["fp16"][9] == "3/3"
    miss = got["topk:0.01"]
    assert miss[5] == "failed" and miss[6] == "–" and miss[7] == "–" and miss[9] == "2/3"
    assert miss[10] == "1 of 3 runs did not reach the target"
    assert got["fp16"][3] == "1gbit" and got["fp16"][2] == "2"


def test_a_store_without_such_runs_says_how_to_make_them(tmp_path):
    store = Store(tmp_path / "store")
    store.write(record_from_times([[0.1] * 3]))
    site.build_site(store.root, tmp_path / "out", workers=1)
    html = (tmp_path / "out" / "compression.html").read_text()
    assert "No data-parallel training run on a shaped link" in html and "No data-parallel convergence run" in html
