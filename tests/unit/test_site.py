"""The site built from a fixture store: every page kind, links, leaderboard against the store,
hostile strings inert, and a build that never loses the previous site or a user's folder."""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.reporting import model as site_model
from dlbench.reporting import site
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import site_store  # noqa: E402

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)


class Page(HTMLParser):
    """Links, scripts, event-handler attributes and leaderboard rows of one page."""

    def __init__(self, text: str):
        super().__init__()
        self.links: list[str] = []
        self.scripts: list[dict] = []
        self.handlers: list[tuple[str, str]] = []
        self.leaderboard_rows: list[dict] = []
        self.svgs = 0
        self._in_leaderboard = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.handlers += [(tag, k) for k in a if k.startswith("on")]
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if tag == "script":
            self.scripts.append(a)
        if tag == "svg" and "chart" in (a.get("class") or ""):
            self.svgs += 1
        if tag == "table":
            self._in_leaderboard = "leaderboard" in (a.get("class") or "").split()
        if tag == "tr" and self._in_leaderboard and "data-run-id" in a:
            self.leaderboard_rows.append(a)

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_leaderboard = False


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture store (with the hostile runs) and its site, built once for the module."""
    work = tmp_path_factory.mktemp("site")
    records = site_store.build(work / "store", hostile=True)
    result = site.build_site(work / "store", work / "out", workers=1, now=NOW)
    return work, records, result


@pytest.fixture
def store_copy(built, tmp_path) -> Path:
    """A copy of the fixture store for a test that changes it or builds into its own folder."""
    shutil.copytree(built[0] / "store", tmp_path / "store")
    return tmp_path / "store"


def pages(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.html")}


def test_every_page_kind_is_written(built):
    work, records, result = built
    out = work / "out"
    written = pages(out)
    assert {"index.html", "history.html", "runs.html"} <= set(written)
    assert len([p for p in written if p.startswith("runs/")]) == len(records)
    # one benchmark page per (suite, hardware, benchmark): 3 benchmarks x 2 hardware + the hostile name
    assert len([p for p in written if p.startswith("benchmarks/")]) == 7
    assert (out / "static" / "style.css").is_file() and (out / "static" / "tables.js").is_file()
    assert result.runs == len(records) and result.problems == []


def test_every_page_is_reachable_from_the_index_and_no_link_is_broken(built):
    out = built[0] / "out"
    written = pages(out)
    seen, todo = set(), ["index.html"]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for href in Page(written[current]).links:
            target, _ = urldefrag(href)
            assert "://" not in target, f"{current} links off the site: {href}"
            resolved = (out / current).parent.joinpath(target).resolve()
            assert resolved.exists(), f"{current}: broken link {href}"
            rel = resolved.relative_to(out.resolve()).as_posix()
            if rel.endswith(".html"):
                todo.append(rel)
    assert seen == set(written)


def test_leaderboard_rows_are_the_latest_successful_run_of_each_benchmark_and_framework(built):
    work, records, _ = built
    # computed here from the store, independently of the view model
    latest: dict[tuple, tuple] = {}
    attempted = set()
    for r in Store(work / "store").records():
        key = (r.suite, r.workload.device, r.benchmark, r.workload.batch_size, r.framework["name"])
        attempted.add(key)
        if r.status == "ok" and (key not in latest or r.started_at > latest[key][0]):
            latest[key] = (r.started_at, r.run_id)
    index = Page((work / "out" / "index.html").read_text())
    shown = {row["data-run-id"] for row in index.leaderboard_rows}
    assert {run_id for _, run_id in latest.values()} <= shown
    assert len(index.leaderboard_rows) == len(attempted)  # one row per benchmark, batch and framework
    failed_only = attempted - set(latest)
    assert len(failed_only) == 2  # the fixture's OOM run and the hostile failed run: shown, unranked


def test_ranks_scores_and_the_latest_failure_beside_an_older_success():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def view(fw, sps, day, status="ok", bench="b1"):
        return site_model.RunView(
            run_id=f"{fw}-{day}", page=f"runs/{fw}-{day}.html", started_at=t0.replace(day=day), suite="s",
            benchmark=bench, network="n", mode="train", framework=fw, framework_version="1", device="cpu",
            batch_size=8, precision="float32", hardware="cpu", hostname="h", machine_id="m", dlbench_version="0",
            profile="p", status=status, reason=None if status == "ok" else "boom", equivalence="unchecked",
            samples_per_s=sps if status == "ok" else None,
            # three processes within 0.5% of each other: far apart frameworks are told apart
            repeat_medians_ms=tuple(8e3 / (sps * f) for f in (0.995, 1.0, 1.005)) if status == "ok" else ())

    views = [view("a", 100, 1), view("b", 50, 1), view("a", 80, 2, bench="b2"), view("b", 80, 2, bench="b2"),
             view("b", None, 3, status="failed"), view("c", 400, 1)]
    m = site_model.build_model(views, [], t0, "0")
    (board,) = m.boards
    b1 = next(e for e in board.entries if e.benchmark == "b1")
    assert [(r.framework, r.rank, r.rank_label) for r in b1.rows] == [("c", 1, "1"), ("a", 2, "2"), ("b", 3, "3")]
    b_row = next(r for r in b1.rows if r.framework == "b")
    assert b_row.shown.run_id == "b-1" and b_row.latest_failed.run_id == "b-3" and b_row.runs == 2
    assert b_row.relative == pytest.approx(50 / 400)
    scores = {s.framework: s for s in board.scores}
    assert scores["a"].score == pytest.approx((100 / 400 * 80 / 80) ** 0.5)
    assert scores["b"].score == pytest.approx((50 / 400 * 80 / 80) ** 0.5)
    # c completed one of two benchmarks: ranked after the frameworks that completed both
    assert [s.framework for s in board.scores] == ["a", "b", "c"]
    assert (scores["c"].completed, scores["c"].total) == (1, 2)


def test_hostile_strings_are_text_on_every_page(built):
    out = built[0] / "out"
    for name, text in pages(out).items():
        page = Page(text)
        assert page.handlers == [], f"{name}: event handler attribute {page.handlers}"
        assert all(s.get("src", "").endswith("static/tables.js") for s in page.scripts), name
        assert "window.__pwned" not in text.replace("window.__pwned", "", 0) or "<script>window" not in text
        assert "<script>window.__pwned" not in text and "<img src=x" not in text and "<svg onload" not in text, name
    index = (out / "index.html").read_text()
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;fcn5-train" in index  # shown, as text
    failed = next(t for n, t in pages(out).items() if n.startswith("runs/") and "not bold" in t)
    assert "&lt;b&gt;not bold&lt;/b&gt;" in failed and "<b>not bold</b>" not in failed


def test_file_names_stay_inside_the_site_whatever_the_names_in_a_record():
    assert site_model.run_page_name("20261101T080000Z-00000000abcd") == "runs/20261101T080000Z-00000000abcd.html"
    crafted = site_model.run_page_name("../../etc/passwd")
    assert crafted.startswith("runs/") and "/" not in crafted[len("runs/"):] and ".." not in crafted
    page = site_model.benchmark_page_name(("s", "<h>", site_store.HOSTILE_BENCHMARK))
    assert page.startswith("benchmarks/") and set(page[len("benchmarks/"):-5]) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


def test_run_pages_show_telemetry_and_say_why_what_is_missing_is_missing(built):
    work, records, _ = built
    out = work / "out"
    gpu = next(r for r in records if r.workload.device == "cuda" and r.status == "ok")
    cpu = next(r for r in records if r.workload.device == "cpu" and r.status == "ok")
    gpu_page = (out / site_model.run_page_name(gpu.run_id)).read_text()
    assert "GPU 0 NVIDIA H100 80GB HBM3" in gpu_page
    for panel in ("power", "clocks", "temperature", "utilisation", "memory used"):
        assert f'class="panel-title">{panel}</text>' in gpu_page
    assert "nvmlDeviceGetFanSpeed" in gpu_page and "Not Supported" in gpu_page
    cpu_page = (out / site_model.run_page_name(cpu.run_id)).read_text()
    assert "utilisation (mean of cores)" in cpu_page and "worker resident" in cpu_page
    assert "no GPU requested" in cpu_page and "Permission denied" in cpu_page  # reasons, not blanks
    assert Page(cpu_page).svgs >= 2  # iteration times; CPU and memory panels in one chart
    throttled = next(r for r in records if r.workload.device == "cuda" and r.benchmark == "resnet56-train"
                     and r.framework["name"] == "torch" and r.status == "ok")
    assert 'class="throttle"' in (out / site_model.run_page_name(throttled.run_id)).read_text()


def test_a_gpu_column_of_another_length_or_kind_costs_only_its_line(built):
    """The GPU columns of a repeat are converted together; one that does not fit (another length,
    not numbers) falls back to one at a time and is left out, as if it had not been sampled."""
    from dlbench.reporting import run_page

    gpu = next(r for r in built[1] if r.workload.device == "cuda" and r.status == "ok")

    def changed(change):
        record = gpu.model_copy(deep=True)
        for rep in record.repeats:
            if rep.telemetry and (rep.telemetry.get("gpu") or {}).get("series"):
                change(rep.telemetry["gpu"]["series"][0])
        return record

    without = run_page.telemetry_section(changed(lambda series: series.pop("temp_c")))
    assert "temperature" not in str(without["gpu_panels"][0].chart) and without["problem"] is None
    for odd in ([41.0], "hot", [[1.0, 2.0]] * 3):
        section = run_page.telemetry_section(changed(lambda series: series.__setitem__("temp_c", odd)))
        assert section["problem"] is None
        assert str(section["gpu_panels"][0].chart) == str(without["gpu_panels"][0].chart)


def test_benchmark_pages_have_every_chart_and_energy_where_measured(built):
    out = built[0] / "out"
    gpu_page = next(t for n, t in pages(out).items() if n.startswith("benchmarks/") and "fcn5-train" in n and "h100" in n)
    for heading in ("Throughput per framework", "Scaling with batch size", "Distribution of iteration times",
                    "First iteration", "Energy per sample"):
        assert heading in gpu_page
    assert Page(gpu_page).svgs >= 6  # 3 batch sizes of throughput, scaling, distribution, first, energy
    assert "J/sample" in gpu_page
    cpu_page = next(t for n, t in pages(out).items() if n.startswith("benchmarks/") and "fcn5-train" in n and "xeon" in n)
    assert "Permission denied" in cpu_page  # energy not measured on the CPU runs: the reason is shown


def test_unreadable_records_are_listed_not_fatal(store_copy, tmp_path):
    broken = tmp_path / "store" / "runs" / "20991231T000000Z-000000000bad.json"
    broken.write_text('{"schema_version": 3, "run_id": ')
    result = site.build_site(tmp_path / "store", tmp_path / "out", workers=1, now=NOW)
    assert [p for p, _ in result.problems] == [str(broken)]
    assert "000000000bad.json" in (tmp_path / "out" / "index.html").read_text()


def test_a_failed_build_keeps_the_previous_site(store_copy, tmp_path, monkeypatch):
    site.build_site(tmp_path / "store", tmp_path / "out", workers=1, now=NOW)
    before = (tmp_path / "out" / "index.html").read_text()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(site, "render_aggregates", boom)
    with pytest.raises(RuntimeError):
        site.build_site(tmp_path / "store", tmp_path / "out", workers=1)
    assert (tmp_path / "out" / "index.html").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "store"]  # no build folder left behind


def test_report_refuses_to_replace_a_folder_it_did_not_write(store_copy, tmp_path):
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    code, output = _invoke("report", "--store", str(tmp_path / "store"), "--out", str(precious))
    assert code == 2 and "not a site dlbench wrote" in output
    assert [p.name for p in precious.iterdir()] == ["thesis.tex"]


def test_report_command_writes_and_rewrites_the_site(store_copy, tmp_path):
    for _ in range(2):  # the second build replaces the first
        code, output = _invoke("report", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "site"))
        assert code == 0, output
        assert "pages" in output
    assert (tmp_path / "site" / site.SITE_MARKER).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_worker_processes_write_the_same_site(built, tmp_path):
    site.build_site(built[0] / "store", tmp_path / "two", workers=2, now=NOW)
    assert pages(built[0] / "out") == pages(tmp_path / "two")


def test_an_error_in_the_child_that_writes_benchmark_pages_fails_the_build(built, tmp_path, monkeypatch):
    """With workers, the history and benchmark pages are written by a forked child: its failure is
    the build's failure, raised here with the child's error, and nothing is left half-built."""
    def boom(*a, **k):
        raise RuntimeError("benchmark page broke")

    children = []
    real = site._start_in_child
    monkeypatch.setattr(site, "_start_in_child", lambda work: children.append(work) or real(work))
    # The build forks only from a single-threaded process; earlier tests in the same session may
    # leave a daemon thread behind, which would take the no-child path and test nothing here.
    monkeypatch.setattr(site, "_can_fork", lambda: True)
    monkeypatch.setattr(site.pages, "benchmark_context", boom)
    with pytest.raises(RuntimeError, match="benchmark page broke"):
        site.build_site(built[0] / "store", tmp_path / "two", workers=2, now=NOW)
    assert len(children) == 1  # the error came from the child's share of the work
    assert not list(tmp_path.iterdir())


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def test_history_marks_the_planted_step_at_the_run_where_it_happened(built):
    work, records, _ = built
    dated = sorted((r for r in records if r.benchmark == "fcn5-train" and r.framework["name"] == "torch"
                    and r.workload.batch_size == 32 and r.workload.device == "cuda"), key=lambda r: r.started_at)
    first_new = next(r for r in dated if r.framework["version"] == "2.14.0")
    history = (work / "out" / "history.html").read_text()
    assert 'class="change"' in history
    assert f"<code>{first_new.run_id}</code>" in history  # the change point is the first run at the new level
    assert "-10.7%" in history  # 1 / 1.12 - 1
    assert history.count('class="change"') == 1  # no step found in any step-free series


def test_compare_page_renders_the_comparison_with_its_significance(store_copy, tmp_path):
    code, output = _invoke("report", "--store", str(store_copy), "--out", str(tmp_path / "site"),
                           "--compare", "framework=torch,version=2.13.0", "framework=torch,version=2.14.0")
    assert code == 0, output
    page = (tmp_path / "site" / "compare.html").read_text()
    assert "fcn5-train" in page and "2.13.0 → 2.14.0" in page
    assert "▼ slower" in page and "-10.7%" in page
    assert 'href="compare.html"' in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.parametrize("selectors, code, message", [
    (("framework=torch,bogus=1", "framework=jax"), 2, "unknown key 'bogus'"),
    (("framework=nothere", "framework=torch"), 1, "matches no completed run"),
])
def test_a_bad_comparison_writes_nothing(store_copy, tmp_path, selectors, code, message):
    got, output = _invoke("report", "--store", str(store_copy), "--out", str(tmp_path / "site"), "--compare", *selectors)
    assert got == code and message in output
    assert not (tmp_path / "site").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_a_rebuild_renders_only_new_or_changed_records(store_copy, tmp_path, monkeypatch):
    rendered: list[str] = []
    real = site.render_runs

    def counting(store_root, record_paths, *rest):
        rendered.extend(Path(p).name for p in record_paths)
        return real(store_root, record_paths, *rest)

    monkeypatch.setattr(site, "render_runs", counting)
    out = tmp_path / "site"
    site.build_site(store_copy, out, workers=1, now=NOW)
    total = len(rendered)
    first = pages(out)
    rendered.clear()
    site.build_site(store_copy, out, workers=1, now=NOW)
    assert rendered == []  # every run page came from the previous site
    assert pages(out) == first

    newest = sorted((store_copy / "runs").glob("*.json"))[-1]
    os.utime(newest, ns=(newest.stat().st_atime_ns, newest.stat().st_mtime_ns + 10**9))  # as if rewritten
    (store_copy / "runs" / "20991231T000000Z-000000000bad.json").write_text("{")
    site.build_site(store_copy, out, workers=1, now=NOW)
    assert sorted(rendered) == sorted([newest.name, "20991231T000000Z-000000000bad.json"])

    rendered.clear()  # another renderer (here: a site with a compare page) renders everything again
    site.build_site(store_copy, out, ("framework=torch,version=2.13.0", "framework=torch,version=2.14.0"),
                    workers=1, now=NOW)
    assert len(rendered) == total + 1


def test_a_damaged_or_crafted_manifest_is_not_trusted(store_copy, tmp_path):
    out = tmp_path / "site"
    site.build_site(store_copy, out, workers=1, now=NOW)
    manifest = json.loads((out / site.SITE_MARKER).read_text())
    name, entry = next(iter(manifest["runs"].items()))
    entry["view"]["page"] = "../../outside.html"
    (out / site.SITE_MARKER).write_text(json.dumps(manifest))
    site.build_site(store_copy, out, workers=1, now=NOW)  # that record is rendered afresh
    assert not (tmp_path.parent / "outside.html").exists()
    assert (out / site_model.run_page_name(Path(name).stem)).is_file()
    (out / site.SITE_MARKER).write_text("not json")
    site.build_site(store_copy, out, workers=1, now=NOW)
    assert json.loads((out / site.SITE_MARKER).read_text())["manifest"] == site.MANIFEST_VERSION


def test_boards_are_per_hardware_and_a_gpu_run_never_lands_on_a_cpu_board(built):
    _, records, _ = built
    gpu = next(r for r in records if r.workload.device == "cuda")
    cpu = next(r for r in records if r.workload.device == "cpu")
    assert site_model.hardware_label(gpu) == "NVIDIA H100 80GB HBM3"
    assert site_model.hardware_label(cpu) == "Intel(R) Xeon(R) Platinum 8480+ · 8 threads"
    unidentified = gpu.model_copy(update={"machine": {**gpu.machine, "gpus": []}})
    assert site_model.hardware_label(unidentified) not in (site_model.hardware_label(cpu), site_model.hardware_label(gpu))
