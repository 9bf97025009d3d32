"""The communication term on a shaped link (performance/link_term.py): a link run predicted as its
loopback run plus the α–β time of its method's exchange at the link as measured, and the crossover
bandwidth below which a compression beats dense, predicted and measured. Records are the v18
fixture (a real 4-worker 1gbit run) made into 2-worker runs of dense and topk:0.01 with set times."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from dlbench.performance.link_term import link_term_checks
from dlbench.store.record import ExchangeInfo, LinkMeasurement, Record
from dlbench.store.store import Store

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "v18.json"
DENSE_BYTES = 56_824_840  # fcn5's float32 gradients
TOPK_PAIRS = 142_065
RTT_S = 40e-6
EXCHANGE = {"none": ExchangeInfo(method="none", payload_bytes=DENSE_BYTES, bytes_per_rank=DENSE_BYTES,
                                 total_bytes=2 * DENSE_BYTES, rounds=2, formula="ring"),
            "topk:0.01": ExchangeInfo(method="topk:0.01", payload_bytes=8 * TOPK_PAIRS, bytes_per_rank=8 * TOPK_PAIRS,
                                      total_bytes=16 * TOPK_PAIRS, rounds=1, formula="all-gather")}
LOOPBACK_S = {"none": 1.0, "topk:0.01": 1.3}  # topk's selection costs 0.3 s more than dense's collective


@pytest.fixture(scope="module")
def template() -> Record:
    data = json.loads(FIXTURE.read_text())
    return Record.model_validate({k: v for k, v in data.items() if k != "checksum"})


def wire_s(method: str, bps: float) -> float:
    """The term by hand: dense is 2(n-1) = 2 ring steps of B/2, top-k n-1 = 1 step of 8K (n = 2)."""
    info = EXCHANGE[method]
    steps, nbytes = (2, DENSE_BYTES) if method == "none" else (1, info.payload_bytes)
    return steps * RTT_S / 2 + nbytes * 8 / bps


LOCAL_S = 0.8  # the step without the exchange, both methods


def run(template: Record, index: int, method: str, bps: float | None, median_s: float) -> Record:
    d = template.distributed.model_copy(update={"workers": 2, "exchange": EXCHANGE[method], "oversubscribed": None,
                                                "local_median_s": LOCAL_S})
    link = None
    name = "fcn5-train-w2"
    if bps is not None:
        asked = f"{bps / 1e6:g}mbit"
        name += f"@{asked}"
        link = template.link.model_copy(update={"asked": asked, "rate_bps": int(bps), "measured": LinkMeasurement(
            bandwidth_bps=bps * 0.95, rtt_s=RTT_S, seconds=1.0, method="test")})
    return template.model_copy(update={
        "run_id": f"20261207T2100{index:02d}Z-{index:012x}", "benchmark": name, "link": link, "distributed": d,
        "started_at": template.started_at + timedelta(seconds=index),
        "workload": template.workload.model_copy(update={"compression": method}),
        "summary": template.summary.model_copy(update={"median_s": median_s})})


def modelled(template: Record, rates: list[float]) -> list[Record]:
    """Loopback runs of both methods, and link runs that take exactly what the model says."""
    out = [run(template, i, m, None, s) for i, (m, s) in enumerate(LOOPBACK_S.items())]
    for bps in rates:
        for m, s in LOOPBACK_S.items():
            out.append(run(template, len(out), m, bps, s + wire_s(m, bps * 0.95)))
    return out


def test_a_link_run_is_its_loopback_run_plus_the_links_term(template):
    checks, _ = link_term_checks(modelled(template, [1e9]))
    dense = next(c for c in checks if c.compression == "none")
    assert dense.loopback_s == 1.0 and dense.bandwidth_bps == 0.95e9
    # 2 start-ups of half the round trip and 56.8 MB at 950 Mbit/s
    assert dense.wire_s == pytest.approx(2 * 20e-6 + DENSE_BYTES * 8 / 0.95e9)
    assert dense.predicted_s == pytest.approx(dense.measured_s) and dense.error == pytest.approx(0, abs=1e-12)
    topk = next(c for c in checks if c.compression == "topk:0.01")
    assert topk.wire_s == pytest.approx(20e-6 + 8 * TOPK_PAIRS * 8 / 0.95e9)
    # overlapped: the collective's loopback CPU work (0.2 s of dense's) and the 0.48 s wire overlap
    assert dense.overlapped_s == pytest.approx(LOCAL_S + dense.wire_s)
    assert topk.overlapped_s == 1.3  # top-k's selection, 0.5 s, outlasts its 9.6 ms on the wire


def test_a_link_run_without_its_loopback_job_says_why_it_is_not_predicted(template):
    lone = run(template, 5, "none", 1e8, 6.0)
    checks, crossovers = link_term_checks([lone])
    assert checks[0].predicted_s is None and "no loopback run of this job" in checks[0].reason
    assert checks[0].wire_s > 4.0 and crossovers == []


def test_the_crossover_predicted_from_loopback_and_measured_between_rates(template):
    _, [crossover] = link_term_checks(modelled(template, [1e8, 1e9, 1e10]))
    assert crossover.compression == "topk:0.01" and crossover.extra_s == pytest.approx(0.3)
    # bytes saved on the longest path over the extra time (less the start-up top-k saves), in bit/s
    saved = DENSE_BYTES - 8 * TOPK_PAIRS
    assert crossover.predicted_bps == pytest.approx(8 * saved / (0.3 - RTT_S / 2))
    assert [s[0] for s in crossover.speedups] == ["100mbit", "1000mbit", "10000mbit"]
    assert [s[2] > 1 for s in crossover.speedups] == [True, True, False]
    assert crossover.measured_side == "between" and 0.95e9 < crossover.measured_bps < 0.95e10
    # interpolated in 1 / bandwidth, where α-β runs' differences are a line: the model's own crossing
    assert crossover.measured_bps == pytest.approx(crossover.predicted_bps, rel=1e-6)
    # overlapped: dense's 0.8 s + wire meets top-k's 1.3 s where dense's wire takes 0.5 s
    assert crossover.overlapped_bps == pytest.approx(8 * DENSE_BYTES / (0.5 - RTT_S), rel=1e-3)


def test_a_crossover_beyond_the_rates_measured_says_on_which_side(template):
    _, [above] = link_term_checks(modelled(template, [1e8, 1e9]))
    assert above.measured_bps is None and above.measured_side == "above"
    _, [below] = link_term_checks(modelled(template, [1e10, 1e11]))
    assert below.measured_bps is None and below.measured_side == "below"


def test_predict_accuracy_shows_the_term_and_the_crossover(template, tmp_path, invoke):
    store = Store(tmp_path / "store")
    for r in modelled(template, [1e8, 1e9, 1e10]):
        store.write(r)
    code, out, err = invoke("predict", "--accuracy", "--store", str(store.root))
    assert code == 0, err
    text = " ".join(out.split())
    assert "communication term on shaped links" in text and "Median |error| per method: none 0.0% (3 runs)" in text
    assert "crossover bandwidth" in text and "topk:0.01" in text
    code, out, _ = invoke("predict", "--accuracy", "--store", str(store.root), "--format", "json")
    data = json.loads(out)
    assert len(data["link_term"]) == 6 and data["crossovers"][0]["measured_side"] == "between"
