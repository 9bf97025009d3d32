"""Ranks the data supports (analysis/ranking.py): frameworks the data does not separate share a rank,
on a board built from a synthetic store; the overall score's interval; rank ranges."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dlbench.analysis.ranking import Contestant, placings, rank_board
from dlbench.reporting import model as site_model
from dlbench.reporting import site
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import site_store  # noqa: E402

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=timezone.utc)


def _overlap(a, b) -> bool:
    return a.shown.sps_low <= b.shown.sps_high and b.shown.sps_low <= a.shown.sps_high


@pytest.fixture(scope="module")
def board_store(tmp_path_factory):
    """fcn5-train on the CPU: torch and jax equally fast (jax's fixture speed undone), tensorflow 15%
    and mxnet 60% slower; fcn8-train: all four at their fixture speeds."""
    benches = site_store._benchmarks()
    root = tmp_path_factory.mktemp("ranks") / "store"
    store = Store(root)
    seed = 1
    for bench, slowdowns in (("fcn5-train", {"jax": 1 / site_store.SPEED["jax"]}), ("fcn8-train", {})):
        for fw in site_store.FRAMEWORKS:
            record = site_store.make_record(benches[bench], fw, 64, False, T0 + timedelta(minutes=seed), seed,
                                            slowdown=slowdowns.get(fw, 1.0))
            store.write(record)
            seed += 1
    return root


def test_frameworks_whose_intervals_overlap_share_a_rank_and_others_do_not(board_store):
    views = [site_model.run_view(r) for r in Store(board_store).records()]
    (board,) = site_model.build_model(views, [], T0, "0").boards
    fcn5 = next(e for e in board.entries if e.benchmark == "fcn5-train")
    rows = {r.framework: r for r in fcn5.rows}
    # the premise, from the runs' own intervals: torch and jax overlap, tensorflow and mxnet stand apart
    assert _overlap(rows["torch"], rows["jax"])
    for fw in ("torch", "jax"):
        assert not _overlap(rows[fw], rows["tensorflow"]) and not _overlap(rows[fw], rows["mxnet"])
    assert not _overlap(rows["tensorflow"], rows["mxnet"])
    assert rows["torch"].rank_label == rows["jax"].rank_label == "1="
    assert (rows["torch"].rank, rows["torch"].rank_high) == (1, 2)
    assert rows["tensorflow"].rank_label == "3" and rows["mxnet"].rank_label == "4"
    # every pair: overlapping intervals share a place, disjoint ones do not
    for a in fcn5.rows:
        for b in fcn5.rows:
            if a is not b:
                shares = a.rank <= b.rank_high and b.rank <= a.rank_high
                assert shares == _overlap(a, b), (a.framework, b.framework)
    assert "Holm" in board.ranking


def test_the_score_has_an_interval_and_the_report_shows_shared_ranks(board_store, tmp_path):
    site.build_site(board_store, tmp_path / "out", workers=1, now=T0 + timedelta(days=1))
    html = (tmp_path / "out" / "index.html").read_text()
    assert 'data-rank="1="' in html and "Ranks are what the data supports" in html and "Holm-adjusted" in html
    views = [site_model.run_view(r) for r in Store(board_store).records()]
    (board,) = site_model.build_model(views, [], T0, "0").boards
    for s in board.scores:
        assert s.low is not None and s.low <= s.score <= s.high
    scores = {s.framework: s for s in board.scores}
    assert scores["mxnet"].high < scores["tensorflow"].low  # far apart: separate ranks
    assert scores["mxnet"].rank_label == "4"


def test_placings_are_ranges_where_separation_is_not_transitive():
    # a apart from c only: a 1-2, b 1-3, c 2-3
    got = placings(["a", "b", "c"], {frozenset("ac")})
    assert [(got[n].low, got[n].high, got[n].label) for n in "abc"] == [(1, 2, "1–2"), (1, 3, "1–3"), (2, 3, "2–3")]
    tied = placings(["a", "b", "c"], {frozenset("ac"), frozenset("bc")})
    assert [tied[n].label for n in "abc"] == ["1=", "1=", "3"]
    assert [placings(["a", "b"], {frozenset("ab")})[n].label for n in "ab"] == ["1", "2"]


def test_holm_over_the_board_ties_differences_that_only_one_test_alone_would_separate():
    # 3 processes a side, 2% apart: Welch's p about 0.015 on its own (separated), but the same
    # difference on 4 benchmarks of the board is 4 chances: Holm multiplies the smallest by 4
    close = [Contestant("a", 102.0, (101.4, 102.0, 102.6)), Contestant("b", 100.0, (99.4, 100.0, 100.6))]
    alone = rank_board([close])
    assert alone.pairs[0][0].p < 0.05 and [alone.entries[0][n].label for n in "ab"] == ["1", "2"]
    board = rank_board([close] * 4)
    assert all(p.p_adjusted >= 0.05 and not p.separated for ps in board.pairs for p in ps)
    assert all([e[n].label for n in "ab"] == ["1=", "1="] for e in board.entries)
    assert board.tests == 4
    # a clear difference on the same board stays separated
    far = [Contestant("x", 200.0, (199.0, 200.0, 201.0)), Contestant("y", 100.0, (99.0, 100.0, 101.0))]
    mixed = rank_board([close] * 4 + [far])
    assert [mixed.entries[-1][n].label for n in "xy"] == ["1", "2"]


def test_a_single_process_pair_is_decided_by_its_intervals():
    a = Contestant("a", 100.0, (100.0,), 98.0, 102.0)
    b = Contestant("b", 99.0, (99.0,), 97.0, 101.0)
    c = Contestant("c", 90.0, (90.0,), 88.0, 92.0)
    ranks = rank_board([[a, b, c]])
    assert [ranks.entries[0][n].label for n in "abc"] == ["1=", "1=", "3"]
    assert all(p.test == "intervals (one process)" and p.p is None for p in ranks.pairs[0])
