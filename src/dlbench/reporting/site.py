"""Write the store as a static site: one publish step, readable offline from disk.

    OUT/index.html              leaderboards per suite and hardware
    OUT/benchmarks/<key>.html   one page per (suite, hardware, benchmark)
    OUT/runs/<run id>.html      one page per run
    OUT/history.html            every series over time, change points marked
    OUT/runs.html               every run
    OUT/compare.html            with --compare BASELINE CANDIDATE
    OUT/static/                 the stylesheet and the table script (the only things a page loads)

Each record is read once: its page is rendered right away and only its RunView (model.py) is
kept; the aggregate pages are rendered from the RunViews. A large store is read and its run pages
rendered in worker processes, one chunk of record files each.

Every string from a record reaches a page through jinja2's autoescaping or markupsafe's escape (the
SVG charts), and the pages carry a Content-Security-Policy that lets only the site's own stylesheet
and script load: a hostile name or error text shows as text and runs nothing.

The site is built in a sibling folder and swapped in when complete: a failed or interrupted build
leaves the previous site as it was. OUT is only ever replaced if it is empty or a site written by
dlbench (it holds SITE_MARKER): `--out ~` never deletes a home folder.
"""

from __future__ import annotations

import os
import shutil
import webbrowser
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import multiprocessing

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from .. import __version__, paths
from ..store.store import Store, StoreError
from . import charts, pages
from .model import RunView, SiteModel, build_model, run_page_name, slug
from .run_page import network_definition, run_context

SITE_MARKER = ".dlbench-site"
STATIC_FILES = ("style.css", "tables.js")
PARALLEL_FROM = 300  # records; below this, starting worker processes costs more than it saves
CHUNK = 250  # record files per task


class SiteError(Exception):
    """Why no site was written; `code` is the exit status (2: bad input, 1: nothing to report)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class SiteResult:
    index: Path
    runs: int
    problems: list[tuple[str, str]] = field(default_factory=list)
    pages: int = 0


_environment: Environment | None = None


def environment() -> Environment:
    """One per process: templates are compiled once and reused for every page."""
    global _environment
    if _environment is None:
        env = Environment(loader=FileSystemLoader(str(paths.reports_dir() / "templates")),
                          autoescape=select_autoescape(default=True, default_for_string=True),
                          undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        env.filters["fmt"] = charts.fmt
        env.filters["cssclass"] = slug
        _environment = env
    return _environment


def _common(root: str, generated_at: str, has_compare: bool) -> dict:
    return {"root": root, "generated_at": generated_at, "dlbench_version": __version__, "has_compare": has_compare}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_once(path: Path, text: str) -> None:
    """Write a file several worker processes may write with the same content: each writes its own
    temporary file and renames it into place, so a reader never sees a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def render_runs(store_root: str, record_paths: list[str], build_dir: str, generated_at: str,
                has_compare: bool) -> tuple[list[RunView], list[tuple[str, str]]]:
    """Read each record, write its page, return the views of those that rendered and the problems
    of those that did not (a module-level function: it runs in worker processes)."""
    store, env = Store(Path(store_root)), environment()
    template = env.get_template("run.html.j2")
    common = _common("../", generated_at, has_compare)
    views, problems = [], []
    definitions_written: set[str] = set()
    for path in map(Path, record_paths):
        try:
            record = store.read(path)
        except StoreError as e:
            problems.append((str(path), str(e)))
            continue
        page = run_page_name(path.stem)  # file names are unique in runs/; run ids in crafted records may not be
        try:
            context = run_context(record, page)
            html = template.render(**common, **context)
        except Exception as e:  # noqa: BLE001 - one odd record must not cost the whole site
            problems.append((str(path), f"{path}: page not rendered: {type(e).__name__}: {e}"))
            continue
        _write(Path(build_dir) / page, html)
        definition = Path(build_dir) / context["definition_page"]
        if context["definition_page"] not in definitions_written:
            definitions_written.add(context["definition_page"])
            _write_once(definition, network_definition(record))
        views.append(context["view"])
    return views, problems


def _workers(n_records: int) -> int:
    if n_records < PARALLEL_FROM:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8, n_records // CHUNK + 1))


def read_and_render_runs(store: Store, build_dir: Path, generated_at: str, has_compare: bool,
                         workers: int | None = None) -> tuple[list[RunView], list[tuple[str, str]]]:
    record_paths = [str(p) for p in store.paths()]
    workers = workers or _workers(len(record_paths))
    if workers <= 1:
        return render_runs(str(store.root), record_paths, str(build_dir), generated_at, has_compare)
    chunks = [record_paths[i:i + CHUNK] for i in range(0, len(record_paths), CHUNK)]
    views, problems = [], []
    # spawn: a fresh interpreter per worker, whatever threads the caller has running
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for v, p in pool.map(render_runs, [str(store.root)] * len(chunks), chunks, [str(build_dir)] * len(chunks),
                             [generated_at] * len(chunks), [has_compare] * len(chunks)):
            views.extend(v)
            problems.extend(p)
    return views, problems


def render_aggregates(model: SiteModel, build_dir: Path, generated_at: str) -> int:
    env = environment()
    has_compare = model.comparison is not None
    top = _common("", generated_at, has_compare)
    nested = _common("../", generated_at, has_compare)
    written = 0
    _write(build_dir / "index.html", env.get_template("index.html.j2").render(**top, **pages.index_context(model)))
    _write(build_dir / "runs.html", env.get_template("runs.html.j2").render(**top, model=model))
    _write(build_dir / "history.html", env.get_template("history.html.j2").render(**top, **pages.history_context(model)))
    written += 3
    template = env.get_template("benchmark.html.j2")
    for page in model.benchmarks:
        _write(build_dir / page.page, template.render(**nested, **pages.benchmark_context(page, model)))
        written += 1
    if has_compare:
        _write(build_dir / "compare.html", env.get_template("compare.html.j2").render(
            **top, model=model, **pages.compare_context(model.comparison, model)))
        written += 1
    for name in STATIC_FILES:
        static = build_dir / "static" / name
        static.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(paths.reports_dir() / "static" / name, static)
    (build_dir / SITE_MARKER).write_text(f"written by dlbench {__version__} at {generated_at}\n")
    return written


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise SiteError(f"--out {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / SITE_MARKER).exists():
        raise SiteError(f"--out {out_dir}: exists, is not empty and is not a site dlbench wrote "
                        f"(no {SITE_MARKER}); choose another directory or empty it")


def _swap_in(build_dir: Path, out_dir: Path) -> None:
    """Replace out_dir by build_dir; the old site is renamed away first and removed last."""
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if out_dir.exists():
        os.rename(out_dir, old)
    os.rename(build_dir, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def build_site(store_root: Path, out_dir: Path, comparison_args: tuple[str, str] | None = None,
               workers: int | None = None, now: datetime | None = None) -> SiteResult:
    """Build the whole site from the store into out_dir (see the module docstring)."""
    out_dir = Path(out_dir).absolute()
    _check_replaceable(out_dir)
    store = Store(Path(store_root))
    generated = now or datetime.now(timezone.utc)
    generated_at = generated.strftime("%Y-%m-%d %H:%M UTC")
    request = None
    if comparison_args is not None:
        from .comparison_view import parse_request
        request = parse_request(*comparison_args)  # a bad selector fails before any work
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_dir = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir()
    try:
        views, problems = read_and_render_runs(store, build_dir, generated_at, request is not None, workers)
        if not views:
            raise SiteError(f"no records in {store.root}; run `dlbench run` first", 1)
        model = build_model(views, problems, generated, __version__)
        from .history_view import attach_change_points  # here: worker processes need no ruptures
        attach_change_points(model)
        if request is not None:
            from .comparison_view import run_comparison
            model.comparison = run_comparison(store, request)
        written = render_aggregates(model, build_dir, generated_at)
        _swap_in(build_dir, out_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    return SiteResult(out_dir / "index.html", len(views), problems, written + len(views))


def open_in_browser(index: Path) -> bool:
    return webbrowser.open(index.absolute().as_uri())
