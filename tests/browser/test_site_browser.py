"""The site in a real browser (headless Chromium): every page kind loads without a console error,
every page is reachable from the index, the leaderboard says what the store says, the charts are
drawn, tables sort and filter with scripts and are whole without, and hostile strings run nothing.
A screenshot of each page kind is written to the artefact folder (see conftest.py)."""

from __future__ import annotations

import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urldefrag

import pytest

from dlbench.reporting import site
from dlbench.reporting.model import run_page_name
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import site_store  # noqa: E402

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("browser-site")
    records = site_store.build(work / "store", hostile=True)
    site.build_site(work / "store", work / "site", ("framework=torch,version=2.13.0", "framework=torch,version=2.14.0"),
                    workers=1, now=NOW)
    return work / "site", records


class Visit:
    """A page with everything it said on the console, every error it threw and every dialog it opened."""

    def __init__(self, browser, path: Path, scripts: bool = True, width: int = 1280):
        self.context = browser.new_context(viewport={"width": width, "height": 900}, java_script_enabled=scripts)
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def close(self):
        self.context.close()


def page_kinds(site_dir: Path, records) -> dict[str, Path]:
    gpu_throttled = next(r for r in records if r.workload.device == "cuda" and r.benchmark == "resnet56-train"
                         and r.framework["name"] == "torch" and r.status == "ok")
    cpu = next(r for r in records if r.workload.device == "cpu" and r.status == "ok" and r.benchmark == "fcn5-train")
    failed = next(r for r in records if r.status == "failed" and "OOM" in (r.reason or ""))
    benchmark = next(p for p in (site_dir / "benchmarks").glob("*.html") if "fcn5-train" in p.name and "h100" in p.name)
    return {
        "index": site_dir / "index.html",
        "benchmark": benchmark,
        "run-gpu": site_dir / run_page_name(gpu_throttled.run_id),
        "run-cpu": site_dir / run_page_name(cpu.run_id),
        "run-failed": site_dir / run_page_name(failed.run_id),
        "history": site_dir / "history.html",
        "runs": site_dir / "runs.html",
        "compare": site_dir / "compare.html",
    }


CHART_MARKS = "rect.bar, polyline, path.line, circle, rect.box"  # what draws data


def test_every_page_kind_loads_cleanly_with_its_charts_drawn(browser, built, artifacts):
    site_dir, records = built
    for kind, path in page_kinds(site_dir, records).items():
        visit = Visit(browser, path)
        try:
            assert visit.console == [], f"{kind}: {visit.console}"
            charts = visit.page.locator("svg.chart:not(.empty)")
            if kind == "run-failed":  # nothing was measured: the page leads with why
                assert "OOM when allocating" in visit.page.locator("div.failure").inner_text()
            elif kind != "runs":
                assert charts.count() > 0, f"{kind}: no chart"
            for i in range(charts.count()):
                chart = charts.nth(i)
                box = chart.bounding_box()
                assert box and box["width"] > 200 and box["height"] > 30, f"{kind}: chart {i} not laid out: {box}"
                assert chart.locator(CHART_MARKS).count() > 0, f"{kind}: chart {i} draws nothing"
            # the stylesheet and the table script loaded (the CSP lets them, and only them, in)
            assert visit.page.evaluate("getComputedStyle(document.querySelector('nav.site')).display") == "flex"
            if visit.page.locator("table.filterable").count():
                assert visit.page.locator("input.table-filter").count() > 0
            visit.page.screenshot(path=str(artifacts / f"{kind}.png"), full_page=True)
        finally:
            visit.close()
    assert all((artifacts / f"{kind}.png").stat().st_size > 10_000 for kind in page_kinds(site_dir, records))


def test_every_page_is_reachable_from_the_index_by_links(browser, built):
    site_dir, _ = built
    root = site_dir.resolve().as_uri() + "/"
    visit = Visit(browser, site_dir / "index.html")
    seen, todo, problems = set(), [site_dir.resolve().joinpath("index.html").as_uri()], []
    try:
        while todo:
            url = todo.pop()
            if url in seen:
                continue
            seen.add(url)
            visit.console.clear()
            response = visit.page.goto(url)
            assert response is None or response.ok, url
            problems += [f"{url}: {m}" for m in visit.console]
            for href in visit.page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)"):
                target, _ = urldefrag(href)
                assert target.startswith(root), f"{url} links off the site: {href}"
                if target.endswith(".html"):
                    todo.append(target)
                else:  # a network definition (JSON): it must exist
                    assert Path(target[len("file://"):]).is_file(), f"{url}: broken link {href}"
    finally:
        visit.close()
    assert problems == []
    pages = {p.resolve().as_uri() for p in site_dir.rglob("*.html")}
    assert seen == pages, f"not reachable: {sorted(pages - seen)[:5]}"


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    return float(text) if re.fullmatch(r"[0-9.]+", text) else None


def test_leaderboard_rows_match_the_store(browser, built):
    site_dir, _ = built
    store = Store(site_dir.parent / "store")
    expected: dict[tuple, object] = {}
    for r in store.records():
        key = (r.benchmark, r.workload.batch_size, r.framework["name"], r.workload.device)
        best = expected.get(key)
        if r.status == "ok" and (best is None or best.status != "ok" or r.started_at > best.started_at):
            expected[key] = r
        elif best is None:
            expected[key] = r
    visit = Visit(browser, site_dir / "index.html")
    try:
        rows = visit.page.eval_on_selector_all(
            "table.leaderboard tbody tr",
            """rows => rows.map(tr => ({run: tr.dataset.runId, benchmark: tr.dataset.benchmark, batch: tr.dataset.batch,
                framework: tr.dataset.framework, figure: tr.querySelector('td.figure').innerText,
                board: tr.closest('section').querySelector('h2').innerText}))""")
    finally:
        visit.close()
    assert len(rows) == len(expected)
    for row in rows:
        device = "cuda" if "H100" in row["board"] else "cpu"
        record = expected[(row["benchmark"], int(row["batch"]), row["framework"], device)]
        assert row["run"] == record.run_id
        shown = _number(row["figure"])
        if record.status == "ok":
            assert shown == pytest.approx(record.summary.samples_per_s, rel=0.006), row  # 3 significant digits
        else:
            assert shown is None, row


def test_tables_sort_and_filter_with_scripts_and_are_whole_without(browser, built):
    site_dir, _ = built
    index = site_dir / "index.html"
    plain = Visit(browser, index, scripts=False)
    try:
        all_rows = plain.page.locator("table.leaderboard tbody tr").count()
        assert all_rows > 20 and plain.page.locator("input.table-filter").count() == 0
        assert plain.page.locator("table.leaderboard tbody tr:visible").count() == all_rows
    finally:
        plain.close()
    visit = Visit(browser, index)
    try:
        board = visit.page.locator("section.board").last  # the GPU board: three batch sizes
        table = board.locator("table.leaderboard")
        board.locator("input.table-filter").fill("mxnet fcn8")
        visible = table.locator("tbody tr:visible")
        assert visible.count() == 3 and all("mxnet" in t and "fcn8" in t for t in visible.all_inner_texts())
        board.locator("input.table-filter").fill("")
        table.locator("th", has_text="samples/s").click()
        values = [v for v in map(_number, table.locator("td.figure").all_inner_texts()) if v is not None]
        assert values == sorted(values) and len(values) > 10
        table.locator("th", has_text="samples/s").click()
        values = [v for v in map(_number, table.locator("td.figure").all_inner_texts()) if v is not None]
        assert values == sorted(values, reverse=True)
        assert visit.console == []
    finally:
        visit.close()


def test_hostile_strings_show_literally_and_run_nothing(browser, built, artifacts):
    site_dir, records = built
    hostile_ok = next(r for r in records if r.benchmark == site_store.HOSTILE_BENCHMARK and r.status == "ok")
    hostile_failed = next(r for r in records if r.reason == site_store.HOSTILE_ERROR)
    benchmark = next(p for p in (site_dir / "benchmarks").glob("*.html")
                     if site_store.HOSTILE_BENCHMARK in p.read_text().replace("&lt;", "<").replace("&gt;", ">")
                     .replace("&#34;", '"').replace("&#39;", "'").replace("&amp;", "&"))
    for path, expected in ((site_dir / "index.html", [site_store.HOSTILE_BENCHMARK, site_store.HOSTILE_ERROR[:60]]),
                           (benchmark, [site_store.HOSTILE_BENCHMARK]),
                           (site_dir / run_page_name(hostile_ok.run_id), [site_store.HOSTILE_BENCHMARK, site_store.HOSTILE_HOST]),
                           (site_dir / run_page_name(hostile_failed.run_id),
                            [site_store.HOSTILE_ERROR, site_store.HOSTILE_VERSION, site_store.HOSTILE_HOST]),
                           (site_dir / "runs.html", [site_store.HOSTILE_BENCHMARK]),
                           (site_dir / "history.html", [site_store.HOSTILE_BENCHMARK])):
        visit = Visit(browser, path)
        try:
            visit.page.wait_for_timeout(300)  # an image error handler would have fired by now
            assert visit.page.evaluate("typeof window.__pwned") == "undefined", path
            assert visit.dialogs == [], path
            assert visit.page.locator("img").count() == 0 and visit.page.locator("main script").count() == 0
            text = visit.page.inner_text("body")
            for literal in expected:
                assert literal in text, f"{path.name}: {literal!r} not shown as text"
            assert visit.console == []  # not even a script the page's CSP had to refuse
            if path.name == run_page_name(hostile_failed.run_id).split("/")[-1]:
                visit.page.screenshot(path=str(artifacts / "hostile-run.png"))
        finally:
            visit.close()
