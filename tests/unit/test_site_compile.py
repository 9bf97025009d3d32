"""Precision and compile mode as axes of the site (record schema 6): separate leaderboard entries
and history series, the precision x compile grid of a benchmark page, the compiled-over-eager
speedup, compile time and allocator peak on a run page, and a store with one precision and one
compile mode keyed and labelled as before. No framework: records from the test builders."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser

import pytest
from store_records import T0, make_record, record_from_times
from typer.testing import CliRunner

from dlbench.store.intervals import reported_interval
from dlbench.cli import app
from dlbench.cli import results as results_cli
from dlbench.cli import tables
from dlbench.reporting import charts, history_view, pages, site
from dlbench.reporting import model as site_model
from dlbench.reporting.model import build_model, run_view
from dlbench.store.record import Record
from dlbench.store.store import Store

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)
VARIANTS = [("fp32", "eager"), ("fp32", "compiled"), ("amp_bf16", "eager"), ("amp_bf16", "compiled")]


def variant(r: Record, precision: str, compile_: str, requested: str | None = None) -> Record:
    """The same run at another precision and compile mode (nothing else differs), asked for by
    name (`--compile eager,compiled`) unless `requested` says otherwise ("default")."""
    workload = r.workload.model_copy(update={"precision": precision, "compile": compile_,
                                             "compile_requested": requested or compile_,
                                             "compile_mode": "default" if compile_ == "compiled" else None})
    return r.model_copy(update={"workload": workload})


def with_memory(r: Record, memory: dict) -> Record:
    return r.model_copy(update={"repeats": [rep.model_copy(update={"memory": memory}) for rep in r.repeats]})


def views(records: list[Record]) -> list[site_model.RunView]:
    return [run_view(r) for r in records]


def model_of(records: list[Record]) -> site_model.SiteModel:
    return build_model(views(records), [], NOW, "0")


class Tables(HTMLParser):
    """Every <table>'s class and its rows: per row, the cells' attributes and text."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[tuple[str, list[dict]]] = []
        self._row: dict | None = None
        self._cell: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append((a.get("class") or "", []))
        elif tag == "tr" and self.tables:
            self._row = {"attrs": a, "cells": []}
            self.tables[-1][1].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = {"attrs": a, "text": "", "titles": []}
            self._row["cells"].append(self._cell)
        elif self._cell is not None and "title" in a:
            self._cell["titles"].append(a["title"])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def table(self, cls: str) -> list[dict]:
        (rows,) = [rows for c, rows in self.tables if cls in c.split()]
        return rows


def build(records: list[Record], tmp_path) -> dict[str, str]:
    st = Store(tmp_path / "store")
    for r in records:
        st.write(r)
    site.build_site(st.root, tmp_path / "out", workers=1, now=NOW)
    return {p.relative_to(tmp_path / "out").as_posix(): p.read_text() for p in (tmp_path / "out").rglob("*.html")}


# ------------------------------------------------------------------ boards and history


def test_records_differing_only_in_precision_and_compile_are_separate_entries_and_series(monkeypatch):
    base = [make_record(framework=fw, started=T0 + timedelta(hours=i)) for i, fw in enumerate(("torch", "jax"))]
    records = [variant(r, p, c) for r in base for p, c in VARIANTS]
    m = model_of(records)
    (board,) = m.boards
    assert [(e.benchmark, e.batch_size, e.precision, e.compile) for e in board.entries] == [
        ("fcn5-train", 16, p, c) for p, c in VARIANTS]  # fp32 before amp_bf16, eager before compiled
    assert all(sorted(r.framework for r in e.rows) == ["jax", "torch"] for e in board.entries)
    assert board.precisions == ["amp_bf16", "fp32"] and board.compiles == ["eager", "compiled"]

    assert sorted((s.key[4], s.key[7], s.key[5]) for s in m.history) == sorted(
        (p, c, fw) for fw in ("torch", "jax") for p, c in VARIANTS)
    assert len({s.anchor for s in m.history}) == 8
    # the benchmark has series of both modes: each label names its mode
    torch_compiled = next(s for s in m.history if s.key[5] == "torch" and s.key[4:8:3] == ("fp32", "compiled"))
    assert torch_compiled.label == "fcn5-train · batch 16 · fp32 · compiled · torch · host hostA"
    (page,) = m.benchmarks
    assert set(page.latest) == {(fw, 16, p, c) for fw in ("torch", "jax") for p, c in VARIANTS}

    # the change-point analysis is asked per series with the compile mode in its key
    seen = []
    monkeypatch.setattr(history_view, "MIN_RUNS", 1)
    monkeypatch.setattr(history_view, "analyse", lambda key, points: seen.append(key) or type("A", (), {"steps": []})())
    history_view.attach_change_points(m)
    assert sorted((k.framework, k.precision, k.compile) for k in seen) == sorted(
        (fw, p, c) for fw in ("torch", "jax") for p, c in VARIANTS)


def test_a_runs_series_anchor_on_its_page_is_the_history_series_of_its_compile_mode(tmp_path):
    records = [variant(make_record(), "fp32", c) for c in ("eager", "compiled")]
    written = build(records, tmp_path)
    history = written["history.html"]
    anchors = set()
    for r in records:
        match = re.search(r'href="\.\./history\.html#([^"]+)"', written[f"runs/{r.run_id}.html"])
        anchors.add(match.group(1))
        assert f'id="{match.group(1)}"' in history
    assert len(anchors) == 2


# ------------------------------------------------------------------ the grid


def test_the_benchmark_page_grid_has_a_column_per_combination_and_the_status_of_runs_that_did_not_succeed(tmp_path):
    ok = [variant(make_record(framework="torch", batch_size=b, started=T0 + timedelta(minutes=i)), p, c)
          for b in (16, 32) for i, (p, c) in enumerate(VARIANTS[:3])]
    failed = variant(make_record(framework="torch", batch_size=16, status="failed", started=T0 + timedelta(hours=1)),
                     "amp_bf16", "compiled")
    skipped = variant(make_record(framework="jax", batch_size=16, status="skipped"), "amp_bf16", "compiled")
    skipped = skipped.model_copy(update={"reason": "bf16 autocast is not supported on this CPU"})
    jax_ok = variant(make_record(framework="jax", batch_size=16), "fp32", "compiled")
    records = [*ok, failed, skipped, jax_ok]
    (page,) = model_of(records).benchmarks
    assert page.variants == VARIANTS
    rows = {(row.framework, row.batch_size): row.cells for row in page.grid}
    assert list(rows) == [("jax", 16), ("torch", 16), ("torch", 32)]  # per batch size, frameworks in order
    torch16 = dict(zip(page.variants, rows[("torch", 16)]))
    by_variant = {(r.workload.precision, r.workload.compile): r for r in ok if r.workload.batch_size == 16}
    for v in VARIANTS[:3]:
        assert torch16[v].ok and torch16[v].shown.run_id == by_variant[v].run_id
        assert torch16[v].shown.samples_per_s == by_variant[v].summary.samples_per_s
    assert not torch16[("amp_bf16", "compiled")].ok and torch16[("amp_bf16", "compiled")].shown.status == "failed"
    jax16 = dict(zip(page.variants, rows[("jax", 16)]))
    assert jax16[("fp32", "eager")].shown is None  # never run
    assert jax16[("amp_bf16", "compiled")].shown.status == "skipped"
    assert rows[("torch", 32)][3].shown is None

    written = build(records, tmp_path)
    html = written[page.page]
    grid = Tables(html).table("grid")
    assert [c["text"] for c in grid[0]["cells"]] == ["framework", "batch", "fp32 · eager", "fp32 · compiled",
                                                      "amp_bf16 · eager", "amp_bf16 · compiled"]
    body = {(r["cells"][0]["text"], r["cells"][1]["text"]): r["cells"][2:] for r in grid[1:]}
    cells = dict(zip(VARIANTS, body[("torch", "16")]))
    fp32_eager = by_variant[("fp32", "eager")]
    assert cells[("fp32", "eager")]["attrs"]["data-status"] == "ok"
    assert float(cells[("fp32", "eager")]["attrs"]["data-value"]) == pytest.approx(fp32_eager.summary.samples_per_s)
    low, high = reported_interval(fp32_eager.summary, fp32_eager.workload.batch_size).samples_per_s
    assert f"{charts.fmt(low)}–{charts.fmt(high)}" in cells[("fp32", "eager")]["text"]
    assert cells[("amp_bf16", "compiled")]["attrs"]["data-status"] == "failed"
    assert "it broke" in cells[("amp_bf16", "compiled")]["titles"]  # the reason, as the tooltip
    jax_cells = dict(zip(VARIANTS, body[("jax", "16")]))
    assert jax_cells[("amp_bf16", "compiled")]["attrs"]["data-status"] == "skipped"
    assert "bf16 autocast is not supported on this CPU" in jax_cells[("amp_bf16", "compiled")]["titles"]
    assert jax_cells[("fp32", "eager")]["text"].strip() == "not run"


# ------------------------------------------------------------------ speedup


def test_the_compiled_over_eager_speedup_is_the_ratio_of_the_medians(tmp_path):
    eager = variant(record_from_times([[0.020] * 5, [0.020] * 5], framework="torch"), "fp32", "eager")
    compiled = variant(record_from_times([[0.008] * 5, [0.008] * 5], framework="torch",
                                         started=T0 + timedelta(minutes=5)), "fp32", "compiled")
    # jax has only a compiled run: no ratio for it; an older, slower compiled torch run is not the shown one
    jax_only = variant(record_from_times([[0.01] * 5], framework="jax"), "fp32", "compiled")
    older = variant(record_from_times([[0.05] * 5], framework="torch", started=T0 - timedelta(days=1)), "fp32", "compiled")
    assert (eager.summary.median_s, compiled.summary.median_s) == (0.020, 0.008)
    m = model_of([eager, compiled, jax_only, older])
    (page,) = m.benchmarks
    (s,) = page.speedups
    assert (s.framework, s.benchmark, s.batch_size, s.precision) == ("torch", "fcn5-train", 16, "fp32")
    assert (s.eager.run_id, s.compiled.run_id) == (eager.run_id, compiled.run_id)
    assert s.ratio == 0.020 / 0.008 == pytest.approx(2.5, rel=1e-12)
    assert s.ratio == pytest.approx(compiled.summary.samples_per_s / eager.summary.samples_per_s, rel=1e-12)
    (board,) = m.boards
    assert [(b.framework, b.benchmark, b.ratio) for b in board.speedups] == [("torch", "fcn5-train", s.ratio)]

    written = build([eager, compiled, jax_only, older], tmp_path)
    table = Tables(written[page.page]).table("speedups")
    assert "compiled / eager samples/s" in written[page.page]
    (row,) = [r for r in table if "data-ratio" in r["attrs"]]
    assert float(row["attrs"]["data-ratio"]) == pytest.approx(2.5)
    assert row["cells"][5]["text"] == "2.50×"
    summary = Tables(written["index.html"]).table("speedup-summary")
    assert [c["text"] for c in summary[0]["cells"]] == ["framework", "fcn5-train"]
    assert [(r["cells"][0]["text"], r["cells"][1]["text"].strip()) for r in summary[1:]] == [("torch", "2.50×")]
    assert "compiled / eager samples/s" in written["index.html"]


def test_no_speedup_without_both_modes_of_one_batch_and_precision():
    records = [variant(make_record(framework="torch"), "fp32", "eager"),
               variant(make_record(framework="torch"), "amp_bf16", "compiled"),
               variant(make_record(framework="torch", batch_size=32), "fp32", "compiled"),
               variant(make_record(framework="jax", status="failed"), "fp32", "compiled"),
               variant(make_record(framework="jax"), "fp32", "eager")]
    m = model_of(records)
    assert m.speedups == [] and m.benchmarks[0].speedups == []


# ------------------------------------------------------------------ run page


def test_the_run_page_shows_compile_time_and_the_allocator_peak_or_why_not(tmp_path):
    measured = with_memory(variant(make_record(framework="torch"), "fp32", "compiled"),
                           {"peak_allocated_bytes": 123_456_789, "peak_reserved_bytes": 2e8,
                            "source": "torch.cuda.max_memory_allocated"})
    measured = measured.model_copy(update={"repeats": [rep.model_copy(update={"compile": {"graphs": 1, "recompiles": 0}})
                                                       for rep in measured.repeats]})
    unavailable = with_memory(make_record(framework="jax", started=T0 + timedelta(hours=1)),
                              {"unavailable": "the CPU allocator reports no peak"})
    view = run_view(measured)
    assert view.compile == "compiled" and view.compile_mode == "default"
    assert view.compile_ms == pytest.approx(measured.summary.compile_s * 1e3)
    assert view.alloc_peak_mb == pytest.approx(123.456789)
    assert run_view(unavailable).alloc_peak_mb is None
    assert run_view(unavailable).alloc_note == "the CPU allocator reports no peak"

    written = build([measured, unavailable], tmp_path)
    page = written[f"runs/{measured.run_id}.html"]
    assert f"compile time <span class=\"figure\">{charts.fmt(view.compile_ms, 4)} ms" in page
    assert "123.5 MB" in page and "torch.cuda.max_memory_allocated" in page
    assert "compiler counters, repeat 1" in page and "recompiles" in page
    other = written[f"runs/{unavailable.run_id}.html"]
    assert "unavailable: the CPU allocator reports no peak" in other
    bench = written[model_of([measured, unavailable]).benchmarks[0].page]
    latest = Tables(bench).table("latest")
    header = [c["text"] for c in latest[0]["cells"]]
    assert header[3:5] == ["precision", "compile"] and "compile ms" in header and "alloc peak MB" in header


# ------------------------------------------------------------------ one precision, one mode: as before


def test_a_store_of_fp32_eager_runs_keys_and_labels_its_pages_as_before(tmp_path):
    records = [make_record(framework=fw, network=net, batch_size=b, started=T0 + timedelta(hours=i))
               for i, (fw, net, b) in enumerate((fw, net, b) for fw in ("torch", "jax") for net in ("fcn5", "fcn8")
                                                for b in (16, 32))]
    m = model_of(records)
    (board,) = m.boards
    # the entries as they were keyed before the compile mode: (benchmark, batch, precision), in that order
    assert [(e.benchmark, e.batch_size, e.precision) for e in board.entries] == sorted(
        {(r.benchmark, r.workload.batch_size, r.workload.precision) for r in records})
    assert {e.compile for e in board.entries} == {"default"} and board.compiles == ["eager"]
    assert board.speedups == [] and pages.speedup_matrix(board) is None
    for s in m.history:
        _suite, _hardware, bench, batch, precision, fw, host, mode = s.key
        assert mode == "eager"
        assert s.label == f"{bench} · batch {batch} · {precision} · {fw} · host {host}"
        # the anchor of the seven-field key it had before: links into history.html keep working
        assert s.anchor == f"series-{site_model.slug(bench)}-{site_model.slug(fw, 20)}-{site_model._digest(*s.key[:7])}"
    for page in m.benchmarks:
        assert page.variants == [("fp32", "eager")] and page.speedups == []
        assert {k[3] for k in page.latest} == {"eager"}
        context = pages.benchmark_context(page, m)
        assert not context["show_grid"] and not context["show_compile"] and context["speedup_chart"] is None
        labels = re.findall(r"<text[^>]*>([^<]*)</text>", str(context["distribution"]))
        assert any(label == "torch · batch 16" for label in labels)
        assert not any("eager" in label or "fp32" in label for label in labels)

    written = build(records, tmp_path)
    assert "speedup-summary" not in written["index.html"]
    for page in m.benchmarks:
        html = written[page.page]
        assert 'class="sortable filterable grid"' not in html and "Compiled over eager" not in html


# ------------------------------------------------------------------ dlbench results


def test_results_table_shows_the_compile_mode_beside_the_precision(tmp_path, monkeypatch):
    st = Store(tmp_path / "store")
    for p, c in VARIANTS:
        st.write(variant(make_record(), p, c))
    # less the columns shown only where a run has a value (compression, parallelism, oversubscription): no run here has
    cols = [c for c in results_cli.RESULTS_TABLE_COLUMNS if c not in tables.SOMETIMES_COLUMNS]
    assert cols[cols.index("precision") + 1] == "compile"
    monkeypatch.setattr(results_cli, "RICH_TABLE_MAX_ROWS", 0)  # the plain table: one line per run
    result = CliRunner().invoke(app, ["results", "--store", str(st.root)], catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[1].split() == cols
    i = cols.index("precision")
    assert sorted(tuple(line.split()[i:i + 2]) for line in lines[3:]) == sorted(VARIANTS)


def test_default_runs_rank_every_framework_together_whatever_its_default_mode(monkeypatch):
    """`dlbench run` without --compile: torch runs eager, jax jit-compiled; both are one board entry
    (each framework as it runs by default), each row saying which mode it ran."""
    torch_run = variant(make_record(framework="torch"), "fp32", "eager", requested="default")
    jax_run = variant(make_record(framework="jax"), "fp32", "compiled", requested="default")
    model = model_of([torch_run, jax_run])
    (board,) = model.boards
    assert [(e.benchmark, e.compile) for e in board.entries] == [(torch_run.benchmark, "default")]
    assert {r.shown.framework: r.shown.compile for r in board.entries[0].rows} == {"torch": "eager", "jax": "compiled"}
    explicit = model_of([variant(make_record(framework="torch"), "fp32", "eager"),
                         variant(make_record(framework="jax"), "fp32", "compiled")])
    assert sorted(e.compile for e in explicit.boards[0].entries) == ["compiled", "eager"]
