"""The SVG charts: well-formed, scaled to their data, and every label from a record escaped."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from dlbench.reporting import charts

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def parse(markup) -> ET.Element:
    return ET.fromstring(str(markup))  # raises on anything that is not well-formed XML


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


@pytest.mark.parametrize("lo, hi", [(0, 1), (0, 37.5), (3.2, 1890), (-4, 4), (0.0012, 0.0031), (5, 5)])
def test_nice_ticks_cover_the_range_in_round_steps(lo, hi):
    ticks = charts.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 6) in (1, 2, 5, 10)
    assert 2 <= len(ticks) <= 12


def test_numbers_read_well():
    assert charts.fmt(1434.2) == "1,434"
    assert charts.fmt(0.012345) == "0.0123"
    assert charts.fmt(None) == "–"
    assert charts.fmt_tick(0.2) == "0.2" and charts.fmt_tick(1500.0) == "1,500" and charts.fmt_tick(10.0) == "10"


def test_hostile_labels_are_escaped_in_every_chart_kind():
    now = datetime(2026, 11, 1, tzinfo=timezone.utc)
    made = [
        charts.hbar_chart([charts.Bar(HOSTILE, 3.0, 2.5, 3.5, note=HOSTILE)], HOSTILE, HOSTILE),
        charts.box_chart([charts.Box(HOSTILE, 1, 2, 3, 4, 5, [2.5])], HOSTILE, HOSTILE),
        charts.line_chart([charts.Series(HOSTILE, [charts.Point(8, 10.0, 9, 11), charts.Point(16, 19.0)])],
                          HOSTILE, HOSTILE, HOSTILE, log_x=True),
        charts.time_chart([charts.Segment(HOSTILE, [0.0, 0.1, 0.2], {HOSTILE: [1.0, None, 2.0], "b": [1.0, 2.0, 3.0]},
                                          [(0.05, 0.15)])], HOSTILE, HOSTILE),
        charts.date_chart([charts.DatedPoint(now, 5.0, HOSTILE), charts.DatedPoint(now + timedelta(days=1), 6.0, HOSTILE)],
                          [charts.ChangeMark(now + timedelta(days=1), HOSTILE)], HOSTILE, HOSTILE),
        charts.empty_chart(HOSTILE),
    ]
    for svg in made:
        root = parse(svg)  # the payload did not break out of its text node or attribute
        assert not list(root.iter(f"{SVG}script")) and not list(root.iter("script"))
        assert not any(el.tag.endswith("img") for el in root.iter())
        assert "<script>" not in str(svg) and "&lt;script&gt;" in str(svg)
        assert root.get("aria-label") == HOSTILE  # shown literally, as text


def test_a_repeat_label_with_braces_shows_as_it_is():
    """Parts of a telemetry chart are laid out once as format strings: a label's braces stay text."""
    label = "{top} {0} {{x}} }{"
    svg = parse(charts.time_chart([charts.Segment(label, [0.0, 0.1], {"x": [1.0, 2.0]}),
                                   charts.Segment(label, [0.0, 0.1], {"x": [1.0, 2.0]})], "t", "u"))
    assert [t for t in texts(svg) if "top" in t] == [label, label]


def test_bars_are_proportional_and_whiskers_span_the_interval():
    svg = parse(charts.hbar_chart([charts.Bar("a", 100.0, 90.0, 110.0), charts.Bar("b", 50.0)], "t", "u"))
    bars = [r for r in svg.iter(f"{SVG}rect") if r.get("class") == "bar"]
    widths = [float(r.get("width")) for r in bars]
    assert widths[0] == pytest.approx(2 * widths[1], rel=0.02)
    whiskers = [p for p in svg.iter(f"{SVG}path") if p.get("class") == "whisker"]
    assert len(whiskers) == 1  # only the bar with an interval has one
    assert any(t.startswith("100") for t in texts(svg)) and any(t.startswith("50") for t in texts(svg))


def test_a_wide_spread_of_iteration_times_gets_a_log_axis():
    wide = str(charts.box_chart([charts.Box("a", 1, 2, 3, 4, 5), charts.Box("b", 300, 400, 500, 600, 900)], "t", "ms"))
    narrow = str(charts.box_chart([charts.Box("a", 1, 2, 3, 4, 5), charts.Box("b", 3, 4, 5, 6, 9)], "t", "ms"))
    assert "log scale" in wide and "log scale" not in narrow


def test_time_chart_breaks_its_line_at_gaps_and_shades_windows_and_episodes():
    seg = charts.Segment("repeat 1", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], {"power": [1.0, 2.0, None, 3.0, 4.0, 5.0]},
                         windows=[(0.1, 0.4)], episodes=[(0.2, 0.3)])
    svg = parse(charts.time_chart([seg, seg], "power", "W"))
    (line,) = [p for p in svg.iter(f"{SVG}path") if p.get("class") == "line"]
    strokes = line.get("d").split("M")[1:]
    assert [len(s.split(",")) // 2 for s in strokes] == [2, 3, 2, 3]  # broken at the gap and between repeats
    classes = [r.get("class") for r in svg.iter(f"{SVG}rect")]
    assert classes.count("window") == 2 and classes.count("throttle") == 2
    assert len([l for l in svg.iter(f"{SVG}line") if l.get("class") == "separator"]) == 1


def test_two_lines_share_a_chart_with_a_legend():
    seg = charts.Segment("repeat 1", [0.0, 0.1, 0.2], {"SM": [1980, 1410, 1980], "memory": [2619, 2619, 2619]})
    svg = parse(charts.time_chart([seg], "clocks", "MHz", {"SM": "#111111", "memory": "#222222"}))
    assert {p.get("stroke") for p in svg.iter(f"{SVG}path") if p.get("class") == "line"} == {"#111111", "#222222"}
    assert {"SM", "memory"} <= set(texts(svg))


def test_long_series_are_thinned_but_keep_their_spikes_and_gaps():
    t = np.arange(10_000) * 0.1
    v = np.ones(10_000)
    v[7_777] = 50.0
    v[2_000:2_600] = np.nan
    t2, v2 = charts.thin(t, v, 100)
    assert len(t2) <= 200 and np.all(np.diff(t2) >= 0)
    assert np.nanmax(v2) == 50.0 and np.isnan(v2).any()
    svg = str(charts.time_chart([charts.Segment("r", t.tolist(), {"x": [None if np.isnan(x) else x for x in v]})], "x", "y"))
    assert svg.count(",") < 1500  # at most a few hundred points drawn, not ten thousand


def test_nothing_to_draw_says_so_visibly():
    svg = parse(charts.hbar_chart([], "energy", "J"))
    assert "nothing measured" in " ".join(texts(svg))
    assert "no samples" in " ".join(texts(parse(charts.time_chart([charts.Segment("r", [0.0], {"x": [None]})], "x", "y"))))


def test_colours_are_stable_per_name():
    names = ["torch", "jax", "mxnet"]
    assert charts.colour_for("jax", names) == charts.colour_for("jax", list(reversed(names)))
    assert len({charts.colour_for(n, names) for n in names}) == 3
